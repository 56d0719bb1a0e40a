"""``interp-toolkit info``: a checkpoint's config, metadata and accuracies, or a run's record."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional, Sequence

import tyro

from interp_toolkit.config import Config, parse_config, required_positional
from interp_toolkit.errors import UserError
from interp_toolkit.runs.mpsp import format_metrics

DESCRIPTION = ("Print the model config, metadata and logged accuracies of a checkpoint file (and the task "
               "of the run it belongs to), or the record of a run directory.")


@dataclass
class InfoCommandConfig(Config):
    """Settings of ``interp-toolkit info``.

    Attributes:
        checkpoint: A .safetensors checkpoint or a run directory.
    """

    checkpoint: Annotated[Optional[Path], tyro.conf.Positional, required_positional("CHECKPOINT")] = None  # noqa: UP007

    def target(self) -> Path:
        """The checkpoint or run directory; a user error if none was given."""
        if self.checkpoint is None:
            raise UserError("info needs a CHECKPOINT (a .safetensors file or a run directory)")
        return Path(self.checkpoint)


def parse(argv: Sequence[str], prog: str = "interp-toolkit info") -> InfoCommandConfig:
    """``argv`` (after ``info``) -> an :class:`InfoCommandConfig`."""
    config = parse_config(InfoCommandConfig, argv, prog=prog, description=DESCRIPTION)
    config.target()
    return config


def run_config(args: InfoCommandConfig) -> int:
    """``interp-toolkit info``; a missing or unreadable target raises a user error (exit 2)."""
    from interp_toolkit.checkpoint import read_checkpoint
    from interp_toolkit.runs.record import find_run_dir, read_record, task_dict
    from interp_toolkit.runs.trainer import list_checkpoints

    target = args.target()
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
        origin = record.get("extended_from")
        if isinstance(origin, dict):
            print(f"extended from: {origin.get('run_dir')} (key {origin.get('key')}, {origin.get('epochs')} "
                  f"epochs), continued from epoch {origin.get('epoch')}")
        if record.get("stopped_early_at") is not None:
            print(f"stopped early at epoch {record['stopped_early_at']}")
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
        from interp_toolkit.errors import CheckpointError
        from interp_toolkit.runs.record import check_checkpoint_belongs

        try:
            check_checkpoint_belongs(target, run_dir)
        except CheckpointError as err:  # a planted or renamed file: never shown beside the run's task
            print(f"run {run_dir}: this checkpoint does not belong to it ({' '.join(str(err).split())})")
        else:
            print(f"run {run_dir}  task: " + json.dumps(task_dict(read_record(run_dir)) or {}, sort_keys=True))
    if metrics:
        print("accuracies: " + format_metrics(metrics))
    return 0


__all__ = ["DESCRIPTION", "InfoCommandConfig", "parse", "run_config"]
