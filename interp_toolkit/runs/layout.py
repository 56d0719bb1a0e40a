"""The files of a run directory: every name once, with the paths and readers built on them.

A run directory (``interp_toolkit.train``, ``train_batched``, a sweep's ``runs/<name>/``) holds::

    RUN_DIR/
      run.json                  the run record (interp_toolkit.runs.record reads and writes it)
      metrics.jsonl             one JSON line per evaluation (epoch, losses, accuracies)
      checkpoints/epoch_NNNNNN.safetensors   weights at the checkpoint epochs
      resume.safetensors        the state an interrupted run resumes from (interp_toolkit.runs.resume)
      final_state.safetensors   a finished run's last resume state, kept so it can be extended
      curves.png                the run's learning curves
      .lock                     held by the process writing to the directory (interp_toolkit.runs.lock)
      outcome.json              a study's outcome record of the run (interp_toolkit.studies.grid.study)
      analyses/                 analysis outputs over the run's checkpoints

The modules that own a file's format (record, resume, lock, extend) keep their readers and
writers; this module only names the files, so that no other module spells them.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The run record (:mod:`interp_toolkit.runs.record`).
RECORD = "run.json"
#: One JSON line per evaluation.
METRICS = "metrics.jsonl"
#: Folder of the checkpoints (``epoch_NNNNNN.safetensors``).
CHECKPOINTS = "checkpoints"
#: Resume state of an interrupted run (:mod:`interp_toolkit.runs.resume`).
RESUME_STATE = "resume.safetensors"
#: A finished run's last resume state, kept for extending it (:mod:`interp_toolkit.runs.extend`).
FINAL_STATE = "final_state.safetensors"
#: The learning-curve figure of a run.
CURVES = "curves.png"
#: Lock file of the process writing to a directory (:mod:`interp_toolkit.runs.lock`).
LOCK = ".lock"
#: Folder of analysis outputs over a run's checkpoints.
ANALYSES = "analyses"


def metrics_path(run_dir: str | os.PathLike) -> Path:
    """Where ``run_dir``'s evaluations are logged."""
    return Path(run_dir) / METRICS


def checkpoints_dir(run_dir: str | os.PathLike) -> Path:
    """The folder of ``run_dir``'s checkpoints."""
    return Path(run_dir) / CHECKPOINTS


def checkpoint_path(run_dir: str | os.PathLike, epoch: int) -> Path:
    """Where a run saves its checkpoint of ``epoch``."""
    return Path(run_dir) / CHECKPOINTS / f"epoch_{epoch:06d}.safetensors"


def list_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(epoch, path)`` of every checkpoint of a run, by epoch (no torch import: a cached
    analysis can list them without loading anything)."""
    found = []
    for path in sorted((Path(run_dir) / CHECKPOINTS).glob("epoch_*.safetensors")):
        try:
            found.append((int(path.stem.split("_")[1]), path))
        except (IndexError, ValueError):
            continue
    return sorted(found)


def curves_path(run_dir: str | os.PathLike) -> Path:
    """Where ``run_dir``'s learning-curve figure is written."""
    return Path(run_dir) / CURVES


__all__ = ["ANALYSES", "CHECKPOINTS", "CURVES", "list_checkpoints", "FINAL_STATE", "LOCK", "METRICS", "RECORD",
           "RESUME_STATE", "checkpoint_path", "checkpoints_dir", "curves_path", "metrics_path"]
