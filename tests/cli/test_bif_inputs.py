"""``bif`` says (and records) when it uses fewer rows than asked, and refuses a single chain."""

from __future__ import annotations

import json

import pytest
import torch

from interp_toolkit.checkpoint import save_checkpoint
from interp_toolkit.cli import main
from interp_toolkit.errors import UserError
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


def test_the_library_call_is_the_command_without_its_flags(checkpoint, tmp_path, capsys):
    """``compute_bif_summary(checkpoint, CheckpointBIFConfig(...))`` measures what ``bif`` with the
    same flags measures: the same cached result, the same settings recorded."""
    from interp_toolkit.analyses.bif.adaptive import AdaptiveConfig
    from interp_toolkit.analyses.bif.config import SamplerConfig
    from interp_toolkit.cli.bif import BIFCommandConfig, parse
    from interp_toolkit.studies.bif.checkpoint import CheckpointBIFConfig, compute_bif_summary

    flags = ["--n-attribution", "16", "--n-query", "8", "--no-adaptive", "--chains", "2", "--draws", "3",
             "--burn-in", "1", "--batch-size", "32", "--no-progress"]
    assert main(["bif", str(checkpoint), "--task-config", str(tmp_path / "task.json"), "--out",
                 str(tmp_path / "cli"), *flags]) == 0
    parsed = parse([str(checkpoint), *flags])
    assert isinstance(parsed, BIFCommandConfig) and parsed.settings() == CheckpointBIFConfig(
        n_attribution=16, n_query=8, sampler=parsed.sampler, convergence=parsed.convergence)
    config = CheckpointBIFConfig(n_attribution=16, n_query=8, convergence=AdaptiveConfig(adaptive=False),
                                 sampler=SamplerConfig(eps=1e-3, chains=2, draws=3, burn_in=1, batch_size=32,
                                                       progress=False))
    summary = compute_bif_summary(checkpoint, config, task_config=tmp_path / "task.json", out=tmp_path / "lib")
    (cli_path,) = (tmp_path / "cli").glob("bif_*/summary.json")
    from_cli = json.loads(cli_path.read_text())
    assert summary["cache_key"] == from_cli["cache_key"]
    assert summary["mean_bif_on_query_loss"] == from_cli["mean_bif_on_query_loss"]
    same = {k: v for k, v in from_cli["command_config"].items() if k != "out"}
    assert {k: v for k, v in summary["command_config"].items() if k != "out"} == same
    with pytest.raises(UserError, match="at least 2 chains"):
        CheckpointBIFConfig(sampler=SamplerConfig(chains=1))


def test_the_library_refuses_a_bad_figure_format_before_any_sampling(checkpoint, tmp_path):
    from interp_toolkit.studies.bif.checkpoint import CheckpointBIFConfig, calibrate_checkpoint, compute_bif_summary

    for call in (compute_bif_summary, calibrate_checkpoint):
        with pytest.raises(UserError, match=r"figure format must be one of \['png', 'svg', 'pdf'\], got 'gif'"):
            call(checkpoint, CheckpointBIFConfig(), task_config=tmp_path / "task.json", out=tmp_path / "out",
                 format="gif")
    assert not (tmp_path / "out").exists()
