"""Assertion helpers and test callbacks shared by tests."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
from pathlib import Path
from typing import Any

import torch


def assert_fields_equal(a: Any, b: Any, path: str = "result") -> None:
    """``a`` and ``b`` are equal field by field: dataclass fields, dict entries, list items,
    and tensors with the same dtype, shape and values (NaN equal to NaN, in floats too)."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
        for f in dataclasses.fields(a):
            assert_fields_equal(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{path}: tensor vs {type(b).__name__}"
        torch.testing.assert_close(b.cpu(), a.cpu(), rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{path}: {m}")
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), f"{path}: keys {sorted(a)} vs {sorted(b)}"
        for key in a:
            assert_fields_equal(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{path}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_fields_equal(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        assert math.isnan(b), f"{path}: nan vs {b!r}"
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


class KillWorkerOnce:
    """A training callback that kills its own worker process (SIGKILL) at epoch 20 of the run
    whose directory name contains ``run_part``, the first time only: ``marker`` (on storage the
    workers share) remembers that it happened, so a retried job trains through."""

    def __init__(self, marker: Path, run_part: str) -> None:
        self.marker, self.run_part = marker, run_part

    def on_evaluation(self, run_dir: Any, metrics: dict[str, Any]) -> None:
        if self.run_part in Path(run_dir).name and metrics["epoch"] >= 20 and not self.marker.exists():
            self.marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)


class KillProcessGroupAt:
    """A training callback that kills its whole process group with SIGKILL (a ``kill -9`` of
    a sweep's driver, whose workers die with it) at a chosen point of the first run to reach it:
    ``"first_evaluation"`` (right after the epoch-0 evaluation and state are written),
    ``"mid_run"`` (after the evaluation of epoch ``mid_epoch``) or ``"run_end"`` (after a run's
    record says finished, before its outcome is written)."""

    def __init__(self, stage: str, mid_epoch: int = 20) -> None:
        if stage not in ("first_evaluation", "mid_run", "run_end"):
            raise ValueError(f"unknown stage {stage!r}")
        self.stage, self.mid_epoch = stage, mid_epoch

    def _kill(self) -> None:
        os.killpg(os.getpgid(0), signal.SIGKILL)

    def on_evaluation(self, run_dir: Any, metrics: dict[str, Any]) -> None:
        if (self.stage == "first_evaluation" and metrics["epoch"] == 0) or \
                (self.stage == "mid_run" and metrics["epoch"] == self.mid_epoch):
            self._kill()

    def on_run_end(self, run_dir: Any, final: dict[str, Any]) -> None:
        if self.stage == "run_end":
            self._kill()


class KillWorkerAlways:
    """A training callback that kills its own worker process (SIGKILL) at epoch 20 of every
    run whose directory name contains ``run_part``, every time: a job that always dies (as one
    that runs out of memory does)."""

    def __init__(self, run_part: str) -> None:
        self.run_part = run_part

    def on_evaluation(self, run_dir: Any, metrics: dict[str, Any]) -> None:
        if self.run_part in Path(run_dir).name and metrics["epoch"] >= 20:
            os.kill(os.getpid(), signal.SIGKILL)
