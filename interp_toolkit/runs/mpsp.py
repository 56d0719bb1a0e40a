"""One MPSP run end to end: data and model from their configs, the trainer, the curves.

What ``interp-toolkit train`` and ``interp-toolkit demo`` do below their command lines:
:func:`train_mpsp` builds the splits of an :class:`~interp_toolkit.tasks.mpsp.MPSPConfig`
and the model of a :class:`~interp_toolkit.model.ModelConfig` and trains it with
:func:`~interp_toolkit.runs.trainer.train` (resuming, or recomputing nothing when finished);
:func:`run_mpsp` adds the default run directory, the curves figure in the chosen format and
where an extended run came from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:  # importing this module loads no torch
    from interp_toolkit.model import ModelConfig
    from interp_toolkit.runs.config import TrainConfig
    from interp_toolkit.runs.trainer import TrainResult
    from interp_toolkit.tasks.mpsp import MPSPConfig


def default_run_dir(task_cfg: MPSPConfig, model_cfg: ModelConfig, train_cfg: TrainConfig) -> Path:
    """``runs/<task>_<L>L<H>H_r<r>_s<seed>_<key>``: distinct configs, distinct directories.

    Where and with which engine a run trains (``train.device``, ``train.engine``) changes how,
    not what, it computes: not part of the name.
    """
    from interp_toolkit.io import config_hash
    from interp_toolkit.tasks.custom import CustomTask

    train = {k: v for k, v in train_cfg.to_dict().items() if k not in ("device", "engine")}
    key = config_hash({"task": task_cfg.to_dict(), "model": model_cfg.to_dict(), "train": train}, 8)
    if isinstance(task_cfg, CustomTask):  # its r is a property of its data, not a setting
        return Path(f"runs/{task_cfg.name}_{model_cfg.n_layers}L{model_cfg.n_heads}H_s{model_cfg.seed}_{key}")
    return Path(f"runs/{task_cfg.name}_{model_cfg.n_layers}L{model_cfg.n_heads}H_r{task_cfg.r:g}"
                f"_s{model_cfg.seed}_{key}")


def train_mpsp(task_cfg: MPSPConfig, model_cfg: ModelConfig, train_cfg: TrainConfig, run_dir: str | Path,
               device: str | None = None, overwrite: bool = False, callbacks: Sequence[Any] | None = None,
               extend_from: str | Path | None = None) -> TrainResult:
    """Build the splits and model for a run and train it (resuming if possible).

    Args:
        task_cfg: The data: an ``MPSPConfig`` or a
            :class:`~interp_toolkit.tasks.custom.CustomTask` (recorded either way, so the
            commands that read the run rebuild its splits).
        model_cfg: The architecture (its vocabulary and context sizes must fit the task).
        train_cfg: Optimization and bookkeeping.
        run_dir: Run directory.
        device: Where the model is built and trained (default ``train_cfg.device``, else the
            CPU); it becomes ``train_cfg.device``.
        overwrite, callbacks, extend_from: See :func:`~interp_toolkit.runs.trainer.train`.

    Returns:
        The trainer's result.
    """
    from interp_toolkit.devices import resolve_device
    from interp_toolkit.model import build_model
    from interp_toolkit.runs.trainer import train
    from interp_toolkit.tasks.custom import task_splits

    device = device if device is not None else (train_cfg.device or "cpu")
    resolved = resolve_device(device)  # a bad or unavailable device fails before any work
    if train_cfg.device != device:
        train_cfg = dataclasses.replace(train_cfg, device=device)
    splits = task_splits(task_cfg)
    model = build_model(model_cfg, device=resolved)
    return train(model, splits, train_cfg, run_dir, run_info={"task": {"name": task_cfg.name, **task_cfg.to_dict()}},
                 overwrite=overwrite, callbacks=callbacks, extend_from=extend_from)


def write_curves(result: TrainResult, run_dir: str | Path, figure_format: str) -> Path:
    """The run's training-curves figure in ``figure_format`` (``curves.png`` is written by
    ``train`` itself; svg/pdf are added beside it). Returns its path."""
    from interp_toolkit.plotting import check_format, save_figure
    from interp_toolkit.runs.trainer import plot_training_curves

    figure_format = check_format(figure_format)
    path = Path(run_dir) / f"curves.{figure_format}"
    if figure_format != "png" and result.metrics:
        save_figure(plot_training_curves(result.metrics), path)
    return path


def last_logged_epoch(run_dir: str | Path) -> int | None:
    """The epoch of a run's last logged evaluation (where an interrupted run resumes), if any."""
    from interp_toolkit.runs.metrics import read_run_metrics

    metrics = read_run_metrics(run_dir)
    return int(metrics[-1]["epoch"]) if metrics else None


@dataclass
class MPSPRun:
    """What :func:`run_mpsp` did.

    Attributes:
        run_dir: The run directory.
        result: The trainer's result.
        curves: The training-curves figure in the requested format.
        extended_from: The ``extended_from`` entry of ``run.json`` (the shorter run this one
            continued), or None.
    """

    run_dir: Path
    result: TrainResult
    curves: Path
    extended_from: dict[str, Any] | None


def run_mpsp(task_cfg: MPSPConfig, model_cfg: ModelConfig, train_cfg: TrainConfig,
             run_dir: str | Path | None = None, *, overwrite: bool = False,
             callbacks: Sequence[Any] | None = None, extend_from: str | Path | None = None,
             figure_format: str = "png") -> MPSPRun:
    """Train one MPSP run (:func:`train_mpsp`) and write its curves in ``figure_format``.

    Args:
        task_cfg, model_cfg, train_cfg: The run's configs.
        run_dir: Run directory (default :func:`default_run_dir`).
        overwrite, callbacks, extend_from: See :func:`~interp_toolkit.runs.trainer.train`.
        figure_format: png, svg or pdf (``curves.png`` is always written).

    Returns:
        The run directory, the trainer's result, the curves figure and the run's origin.
    """
    from interp_toolkit.runs.record import read_record

    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(task_cfg, model_cfg, train_cfg)
    result = train_mpsp(task_cfg, model_cfg, train_cfg, run_dir, overwrite=overwrite, callbacks=callbacks,
                        extend_from=extend_from)
    curves = write_curves(result, run_dir, figure_format)
    origin = read_record(run_dir).get("extended_from") if result.resumed_from is not None else None
    return MPSPRun(run_dir, result, curves, origin if isinstance(origin, dict) else None)


def format_metrics(metrics: Mapping[str, Any]) -> str:
    """One line of a metrics row: its epoch, then accuracies (4 decimals), then losses."""
    parts = [f"epoch {metrics.get('epoch', '?')}"]
    for key in sorted(metrics):
        if key.endswith("_acc"):
            parts.append(f"{key} {metrics[key]:.4f}")
    for key in sorted(metrics):
        if key.endswith("_loss"):
            parts.append(f"{key} {metrics[key]:.4g}")
    return "  ".join(parts)


#: The same functions under task-neutral names (they train MPSP and custom tasks alike).
train_task = train_mpsp
run_task = run_mpsp

__all__ = ["MPSPRun", "default_run_dir", "format_metrics", "last_logged_epoch", "run_mpsp", "run_task",
           "train_mpsp", "train_task", "write_curves"]
