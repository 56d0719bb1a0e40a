"""``interp-toolkit info``: a checkpoint's config, metadata and accuracies, or a run's record."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from interp_toolkit.cli.train import format_metrics
from interp_toolkit.errors import UserError

HELP = "print a checkpoint's config, metadata and accuracies"
DESCRIPTION = ("Print the model config, metadata and logged accuracies of a checkpoint file (and the task "
               "of the run it belongs to), or the record of a run directory.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a .safetensors checkpoint or a run directory")


def run(args: argparse.Namespace) -> int:
    """``interp-toolkit info``; a missing or unreadable target raises a user error (exit 2)."""
    from interp_toolkit.checkpoint import read_checkpoint
    from interp_toolkit.runs.record import find_run_dir, read_record, task_dict
    from interp_toolkit.runs.trainer import list_checkpoints

    target = Path(args.checkpoint)
    if not target.exists():
        raise UserError(f"{target} does not exist (expected a .safetensors checkpoint or a run directory)")
    if target.is_dir():
        record = read_record(target)
        print(f"run {target}  status {record.get('status')}  key {record.get('key')}")
        print("task:  " + json.dumps(task_dict(record) or {}, sort_keys=True))
        print("model: " + json.dumps(record.get("model_config"), sort_keys=True))
        print("train: " + json.dumps(record.get("train_config"), sort_keys=True))
        print("versions: " + json.dumps(record.get("versions"), sort_keys=True))
        checkpoints = list_checkpoints(target)
        print(f"checkpoints: {len(checkpoints)} (epochs {[e for e, _ in checkpoints]})")
        if record.get("final"):
            print("final: " + format_metrics(record["final"]))
        return 0
    cfg, tensors, metadata = read_checkpoint(target)
    n_params = sum(t.numel() for t in tensors.values())
    print(f"checkpoint {target}")
    print(f"model: {json.dumps(cfg.to_dict(), sort_keys=True)}")
    print(f"parameters: {n_params:,} in {len(tensors)} tensors")
    metrics = metadata.get("metrics")
    other = {k: v for k, v in metadata.items() if k != "metrics"}
    print(f"metadata: {json.dumps(other, sort_keys=True)}")
    run_dir = find_run_dir(target)
    if run_dir is not None:
        print(f"run {run_dir}  task: " + json.dumps(task_dict(read_record(run_dir)) or {}, sort_keys=True))
    if metrics:
        print("accuracies: " + format_metrics(metrics))
    return 0


__all__ = ["DESCRIPTION", "HELP", "add_arguments", "run"]
