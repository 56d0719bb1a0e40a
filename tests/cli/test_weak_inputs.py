"""Data and user errors of ``train`` are user errors (exit 2, one ``error:`` line naming the
value or file), found before any work where they can be: none is an "internal error", and
none leaves a half-started run directory or a non-finite line in ``metrics.jsonl``."""

from __future__ import annotations

import json
import math

import pytest

from interp_toolkit.cli import main

from ..runs.test_integrity import TINY, train_args


def _fails_cleanly(argv, capsys, *named):
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: ") and "internal error" not in err, err
    for text in named:
        assert text in lines[-1], lines[-1]
    return lines[-1]


@pytest.mark.parametrize("flag, value, named", [
    ("--model.d-vocab", "5", "--model.d-vocab 5"),
    ("--model.n-ctx", "3", "--model.n-ctx 3"),
    ("--model.d-vocab-out", "1", "--model.d-vocab-out 1"),
    ("--task.label", "sum_parity", "--task-name max_mod3_sum_mod3"),
])
def test_settings_that_conflict_with_the_task_are_refused(tmp_path, capsys, flag, value, named):
    extra = ["--task-name", "max_mod3_sum_mod3"] if flag == "--task.label" else []
    _fails_cleanly([*train_args(tmp_path / "run"), *extra, flag, value], capsys, named)
    assert not (tmp_path / "run").exists()


def test_settings_that_agree_with_the_task_are_accepted(tmp_path):
    from interp_toolkit.cli.train import parse

    cfg = parse([*TINY, "--model.d-vocab", "11", "--model.n-ctx", "6", "--task-name", "max_mod3_sum_mod3",
                 "--task.label", "sum_mod3", "--run-dir", str(tmp_path / "run")])
    assert (cfg.model.d_vocab, cfg.model.n_ctx, cfg.model.d_vocab_out, cfg.task.label) == (11, 6, 3, "sum_mod3")


def test_conflicting_model_size_in_a_config_file_is_refused(tmp_path, capsys):
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"model": {"d_vocab_out": 1}}))
    _fails_cleanly([*train_args(tmp_path / "run"), "--config", str(config)], capsys,
                   "model.d_vocab_out in the config file")


@pytest.mark.parametrize("config", [{"run_dir": 5}, {"run_dir": ""}, {"extend_from": 3.5}])
def test_non_path_in_a_config_file_is_a_user_error(tmp_path, capsys, config, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(config))
    name, value = next(iter(config.items()))
    _fails_cleanly(["train", "--config", str(path), *TINY], capsys, "cfg.json", name, repr(value))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.json"]


@pytest.mark.parametrize("argv", [["--run-dir", ""], ["--run-dir="], ["--extend-from", " "]])
def test_empty_path_flag_is_refused(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    _fails_cleanly(["train", *TINY, *argv], capsys, argv[0].rstrip("="), "empty value")
    assert list(tmp_path.iterdir()) == []  # nothing written into the current directory


def test_model_far_too_large_is_refused_at_once(tmp_path, capsys):
    _fails_cleanly([*train_args(tmp_path / "run"), "--model.n-layers", "99999"], capsys, "n_layers", "99999")
    assert not (tmp_path / "run").exists()


def test_model_larger_than_memory_is_refused_before_building(tmp_path, capsys, monkeypatch):
    import interp_toolkit.model as model

    monkeypatch.setattr(model, "available_memory", lambda device: 1_000_000)  # 1 MB free
    _fails_cleanly([*train_args(tmp_path / "run"), "--model.d-model", "256", "--model.d-mlp", "1024"], capsys,
                   "n_layers 1, d_model 256", "parameters", "available on cpu")
    assert not (tmp_path / "run").exists()


def test_diverging_lr_is_a_user_error_without_non_finite_lines(tmp_path, capsys):
    run_dir = tmp_path / "run"
    _fails_cleanly([*train_args(run_dir), "--train.lr", "1e30"], capsys, "diverged", "lr 1e+30")
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines and all(math.isfinite(v) for row in lines for k, v in row.items() if k != "epoch")


def test_wandb_online_without_an_api_key_is_refused_before_the_run_starts(tmp_path, capsys, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    _fails_cleanly([*train_args(tmp_path / "run"), "--wandb", "online"], capsys, "WANDB_API_KEY", "wandb login")
    assert not (tmp_path / "run").exists()


def test_extend_from_the_run_directory_itself_is_refused(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(train_args(run_dir, 3)) == 0
    before = sorted(p.name for p in run_dir.rglob("*"))
    _fails_cleanly([*train_args(run_dir, 6), "--extend-from", str(run_dir)], capsys, "into itself", str(run_dir))
    assert sorted(p.name for p in run_dir.rglob("*")) == before
