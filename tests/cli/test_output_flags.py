"""The issue-15 output flags as fields of the command configs: --format and the loggers."""

from __future__ import annotations

import pytest

from interp_toolkit.cli import main


@pytest.mark.parametrize("module, argv", [
    ("analyze", ["RUN", "--analysis", "fingerprints"]),
    ("report", ["STUDY"]),
    ("bif", ["ckpt.safetensors"]),
    ("bif_lm", ["ckpt"]),
])
def test_format_flag_is_a_config_field(module, argv):
    import importlib

    command = importlib.import_module(f"interp_toolkit.cli.{module}")
    assert command.parse(argv).format == "png"
    assert command.parse([*argv, "--format", "svg"]).format == "svg"


def test_bad_format_is_refused_before_any_work(tmp_path, capsys):
    study = tmp_path / "study"
    assert main(["report", str(study), "--format", "gif"]) == 2
    err = capsys.readouterr().err
    assert "gif" in err and not study.exists()


def test_logger_flags_on_train_and_sweep():
    from interp_toolkit.cli import sweep, train
    from interp_toolkit.loggers import TensorBoardLogger, WandbLogger, loggers_from_flags

    assert loggers_from_flags(sweep.parse([])) == []
    parsed = sweep.parse(["--tensorboard", "--wandb", "offline"])
    assert (parsed.tensorboard, parsed.wandb) == (True, "offline")
    kinds = [type(logger) for logger in loggers_from_flags(parsed)]
    assert kinds == [TensorBoardLogger, WandbLogger]
    parsed = train.parse(["--tensorboard"])
    assert parsed.tensorboard and parsed.wandb is None


def test_train_format_writes_the_curves_in_that_format(tmp_path, capsys):
    from interp_toolkit.cli import main

    run_dir = tmp_path / "run"
    argv = ["train", "--seq-len", "4", "--n-values", "6", "--n-train", "64", "--n-eval", "32", "--d-model", "16",
            "--d-mlp", "32", "--epochs", "3", "--quiet", "--run-dir", str(run_dir), "--format", "svg"]
    assert main(argv) == 0
    assert (run_dir / "curves.png").is_file()
    assert (run_dir / "curves.svg").read_text().lstrip().startswith("<?xml")
    assert f"curves: {run_dir / 'curves.svg'}" in capsys.readouterr().out
    assert main([*argv[:-1], "pdf"]) == 0  # a finished run: only the figure is added
    assert (run_dir / "curves.pdf").read_bytes().startswith(b"%PDF")
    assert main([*argv[:-1], "gif"]) == 2
