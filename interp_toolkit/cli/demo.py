"""``interp-toolkit demo``: the embedded default job, a small MPSP run with curves and a summary."""

from __future__ import annotations

import argparse
from pathlib import Path

from interp_toolkit.cli.train import format_metrics, train_mpsp

HELP = "train a small MPSP model and write its curves and a summary"
DESCRIPTION = HELP
DEMO_OUT = "runs/demo"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=DEMO_OUT, help=f"run directory (default {DEMO_OUT})")
    p.add_argument("--epochs", type=int, default=300, help="epochs (default 300)")
    p.add_argument("--n-train", type=int, default=4096, help="training examples (default 4096)")


def run(args: argparse.Namespace) -> int:
    """Small MPSP run on the embedded defaults, then a summary beside its curves."""
    from interp_toolkit.io import atomic_write_json
    from interp_toolkit.model import ModelConfig
    from interp_toolkit.runs.trainer import TrainConfig
    from interp_toolkit.tasks.mpsp import MPSPConfig

    task_cfg = MPSPConfig(r=0.9, n_train=args.n_train, n_eval=1024)
    model_cfg = ModelConfig(n_layers=1, n_heads=2, **task_cfg.model_dims())
    train_cfg = TrainConfig(epochs=args.epochs, eval_every=10, checkpoint_every=50)
    run_dir = Path(args.out)
    result = train_mpsp(task_cfg, model_cfg, train_cfg, run_dir)
    metrics = result.metrics
    first = lambda key, thr: next((m["epoch"] for m in metrics if m[key] >= thr), None)  # noqa: E731
    summary = {
        "run_dir": str(run_dir),
        "task": task_cfg.to_dict(),
        "model": model_cfg.to_dict(),
        "final": result.final,
        "epoch_val_acc_0.99": first("val_acc", 0.99),
        "epoch_adv_acc_1.0": first("adv_acc", 1.0),
        "max_adv_acc": max(m["adv_acc"] for m in metrics),
        "curves_png": str(run_dir / "curves.png"),
    }
    atomic_write_json(run_dir / "summary.json", summary)
    print(f"demo run: {run_dir}  ({'cached' if result.already_finished else 'trained'})")
    print("final: " + format_metrics(result.final))
    print(f"shortcut (val >= 99%) first at epoch {summary['epoch_val_acc_0.99']}; "
          f"adversarial 100% first at epoch {summary['epoch_adv_acc_1.0']}; max adv {summary['max_adv_acc']:.3f}")
    print(f"curves: {summary['curves_png']}  summary: {run_dir / 'summary.json'}")
    return 0


__all__ = ["DEMO_OUT", "DESCRIPTION", "HELP", "add_arguments", "run"]
