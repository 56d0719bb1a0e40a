"""Test of the ``bif`` subcommand on a tiny MPSP checkpoint."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from interp_toolkit.checkpoint import save_checkpoint
from interp_toolkit.cli.bif import add_bif_parser, main
from interp_toolkit.model import ModelConfig, build_model
from interp_toolkit.tasks.mpsp import MPSPConfig

torch.set_num_threads(1)


def test_bif_subcommand_on_mpsp_checkpoint(tmp_path):
    task = MPSPConfig(seq_len=4, n_values=5, r=0.75, n_train=64, n_eval=16)
    model = build_model(ModelConfig(n_layers=1, n_heads=1, d_model=16, d_mlp=16, **task.model_dims()))
    checkpoint = save_checkpoint(model, tmp_path / "epoch_000010.safetensors", {"epoch": 10})
    (tmp_path / "task.json").write_text(json.dumps(task.to_dict()))
    args = [str(checkpoint), "--task-config", str(tmp_path / "task.json"), "--out", str(tmp_path / "out"),
            "--n-attribution", "16", "--n-query", "8", "--chains", "2", "--draws", "5", "--burn-in", "5",
            "--batch-size", "32", "--eps", "1e-4", "--gamma", "100", "--no-progress"]
    summary = main(args)
    folder = tmp_path / "out" / f"bif_{summary['cache_key']}"
    assert (folder / "bif.png").exists() and (folder / "summary.json").exists()
    means = summary["mean_bif_on_query_loss"]
    assert means["shortcut_consistent_train_examples"] is not None
    assert summary["checkpoint_metadata"] == {"epoch": 10}
    # --format pdf: the rerun is a cache hit and adds the figure in the asked format
    assert main([*args, "--format", "pdf"])["cache_key"] == summary["cache_key"]
    assert (folder / "bif.pdf").read_bytes()[:4] == b"%PDF"
    with pytest.raises(ValueError, match="task config"):
        main([str(checkpoint), "--out", str(tmp_path / "o2")])
    parser = argparse.ArgumentParser()
    add_bif_parser(parser.add_subparsers())
    assert parser.parse_args(["bif", str(checkpoint)]).func.__name__ == "run_bif_command"
