"""``bif`` says (and records) when it uses fewer rows than asked, and refuses a single chain."""

from __future__ import annotations

import json

import pytest
import torch

from interp_toolkit.checkpoint import save_checkpoint
from interp_toolkit.cli import main
from interp_toolkit.model import ModelConfig, build_model
from interp_toolkit.tasks.mpsp import MPSPConfig


@pytest.fixture
def checkpoint(tmp_path):
    task = MPSPConfig(seq_len=4, n_values=5, r=0.75, n_train=64, n_eval=16)
    torch.manual_seed(0)
    model = build_model(ModelConfig(n_layers=1, n_heads=1, d_model=16, d_mlp=16, **task.model_dims()))
    (tmp_path / "task.json").write_text(json.dumps(task.to_dict()))
    return save_checkpoint(model, tmp_path / "epoch_000010.safetensors", {"epoch": 10})


def test_bif_refuses_a_single_chain(checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["bif", str(checkpoint), "--task-config", str(tmp_path / "task.json"), "--out", str(out),
                 "--chains", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--chains 1: a BIF needs at least 2 chains" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_bif_records_the_rows_it_used(checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["bif", str(checkpoint), "--task-config", str(tmp_path / "task.json"), "--out", str(out),
                 "--n-attribution", "100000", "--n-query", "100000", "--no-adaptive", "--chains", "2", "--draws", "2",
                 "--burn-in", "1", "--batch-size", "32", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "note: --n-attribution 100000 exceeds the 64 examples of the task's train split; using 64" in err
    assert "note: --n-query 100000 exceeds the 16 examples of the task's adv split; using 16" in err
    (summary_path,) = out.glob("bif_*/summary.json")
    summary = json.loads(summary_path.read_text())
    assert (summary["command_config"]["n_attribution"], summary["command_config"]["n_query"]) == (64, 16)
    assert summary["clipped_from"] == {"n_attribution": 100000, "n_query": 100000}
