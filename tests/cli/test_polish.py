"""Command-line polish, each through ``interp_toolkit.cli.main``: positional arguments read as
their names in ``--help``, and loading checkpoints prints no TransformerLens device lines."""

from __future__ import annotations

import pytest

from interp_toolkit.cli import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(("command", "name"), [("info", "CHECKPOINT"), ("mechanism", "RUN_DIR")])
def test_required_positional_is_shown_by_name(capsys, command, name):
    code, out, err = run_cli(capsys, command, "--help")
    assert code == 0, err
    usage = out.splitlines()[0]
    assert usage.endswith(f" {name}"), usage
    assert "{None}|PATH" not in usage
    positional = out.split("positional arguments", 1)[1].split("options", 1)[0]
    assert name in positional and "(required)" in positional
    assert "(default: None)" not in positional


@pytest.mark.parametrize(("command", "name"), [("info", "CHECKPOINT"), ("mechanism", "RUN_DIR")])
def test_missing_positional_is_one_user_error(capsys, command, name):
    code, out, err = run_cli(capsys, command)
    assert code == 2
    assert [line for line in err.splitlines() if line.startswith("error:")] == [err.strip()]
    assert name in err


def test_loading_checkpoints_prints_no_device_lines(capsys, tiny_run):
    """``analyze`` loads every checkpoint of the run (six here) onto the CPU; TransformerLens
    would print "Moving model to device: cpu" for each."""
    run_dir, _ = tiny_run
    code, out, err = run_cli(capsys, "analyze", run_dir, "--analysis", "fingerprints", "--device", "cpu",
                             "--no-progress")
    assert code == 0, err
    assert any(path.suffix == ".csv" for path in run_dir.rglob("*fingerprints*"))
    assert "Moving model" not in out + err


def test_move_model_moves_without_printing(capsys, small_model_cfg):
    import torch

    from interp_toolkit.model import build_model, move_model

    model = build_model(small_model_cfg)
    capsys.readouterr()
    moved = move_model(model, torch.device("cpu"))
    assert capsys.readouterr().out == ""
    assert moved is model and next(model.parameters()).device.type == "cpu"
    plain = move_model(torch.nn.Linear(2, 2), "cpu")
    assert isinstance(plain, torch.nn.Linear)
