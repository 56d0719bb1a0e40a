"""The demo study: a small MPSP run that learns the max-parity shortcut, then the rule.

What ``interp-toolkit demo`` does below its command line: :func:`run_demo` trains one
1-layer run in the demo's regime (:data:`DEMO_TASK`, model seed :data:`DEMO_SEED`), finds its
phases (:func:`~interp_toolkit.studies.common.outcomes.compute_outcome`), draws them, and writes
``summary.json`` beside the run's files.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # importing this module loads no torch
    from interp_toolkit.runs.trainer import TrainResult

DEMO_OUT = "runs/demo"

#: The demo's regime (measured on 2 cores, see docs/reproduction.md): at length 5, values
#: 0..9, 4,096 examples and r = 0.9, a 1-layer model learns the max-parity shortcut within
#: ~50 epochs, and model seed 3 then leaves it for the sum-parity rule (adversarial
#: accuracy 100% at epoch ~330-370, by thread count); other seeds stay on the shortcut longer.
DEMO_TASK: dict[str, Any] = dict(seq_len=5, n_values=10, r=0.9, n_eval=1024)
DEMO_SEED = 3


@dataclass
class DemoResult:
    """What :func:`run_demo` did.

    Attributes:
        run_dir: The run directory.
        result: The trainer's result (``already_finished`` when nothing was retrained).
        summary: The contents of ``summary.json`` (configs, final metrics, phase epochs, the
            phases in words, the near miss of a run short of 100% (empty otherwise), the
            figures' paths).
        summary_path: Where ``summary.json`` was written.
        seconds: Training time, or None when the run was already finished.
    """

    run_dir: Path
    result: TrainResult
    summary: dict[str, Any]
    summary_path: Path
    seconds: float | None


def run_demo(out: str | Path = DEMO_OUT, epochs: int = 500, n_train: int = 4096, seed: int = DEMO_SEED,
             figure_format: str = "png") -> DemoResult:
    """Train the demo run (resuming; a finished one is not retrained) and describe its phases.

    Args:
        out: Run directory.
        epochs: Epochs.
        n_train: Training examples.
        seed: Model seed (:data:`DEMO_SEED` shows both phases within 500 epochs).
        figure_format: png, svg or pdf, of the phases figure and the training curves.

    Returns:
        The run, its summary (also written to ``OUT/summary.json``) and the training time.
    """
    from interp_toolkit.io import atomic_write_json
    from interp_toolkit.model import ModelConfig
    from interp_toolkit.plotting import check_format, save_figure
    from interp_toolkit.runs.config import TrainConfig
    from interp_toolkit.runs.layout import curves_path
    from interp_toolkit.runs.mpsp import train_mpsp, write_curves
    from interp_toolkit.studies.common.outcomes import compute_outcome, describe_phases, plot_phases
    from interp_toolkit.tasks.mpsp import MPSPConfig, task_modulus

    figure_format = check_format(figure_format)
    task_cfg = MPSPConfig(n_train=n_train, **DEMO_TASK)
    model_cfg = ModelConfig(n_layers=1, n_heads=2, seed=seed, **task_cfg.model_dims())
    train_cfg = TrainConfig(epochs=epochs, eval_every=10, checkpoint_every=100)
    run_dir = Path(out)
    started = time.perf_counter()
    result = train_mpsp(task_cfg, model_cfg, train_cfg, run_dir)
    seconds = None if result.already_finished else time.perf_counter() - started
    metrics = result.metrics
    outcome = compute_outcome(metrics, task_cfg.r, task_modulus(task_cfg.name))
    phases = describe_phases(outcome, metrics)
    near_miss: dict[str, Any] = {}
    if not outcome["generalized"]:  # which examples stand between the run and 100%
        from interp_toolkit.studies.common.near_miss import near_miss_of_run

        split = outcome["generalization_split"] if outcome["generalization_split"] in ("adv", "val") else "adv"
        near = near_miss_of_run(run_dir, split=split)
        near_miss = {**near.fields(), "text": near.describe()}
        phases.append(f"short of 100%: {near_miss['text']}")
    phases_path = run_dir / f"phases.{figure_format}"
    save_figure(plot_phases(metrics, outcome), phases_path)
    summary = {
        "run_dir": str(run_dir),
        "task": task_cfg.to_dict(),
        "model": model_cfg.to_dict(),
        "final": result.final,
        "shortcut_epoch": outcome["shortcut_epoch"],
        "phase2_onset_epoch": outcome["phase2_onset_epoch"],
        "first_generalized_epoch": outcome["first_generalized_epoch"],
        "max_adv_acc": outcome["max_adv_acc"],
        "phases": phases,
        "near_miss": near_miss,
        "seconds": seconds,
        "curves_png": str(curves_path(run_dir)),
        "curves": str(write_curves(result, run_dir, figure_format)),
        "phases_figure": str(phases_path),
    }
    summary_path = run_dir / "summary.json"
    atomic_write_json(summary_path, summary)
    return DemoResult(run_dir, result, summary, summary_path, seconds)


__all__ = ["DEMO_OUT", "DEMO_SEED", "DEMO_TASK", "DemoResult", "run_demo"]
