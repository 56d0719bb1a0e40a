"""``interp-toolkit demo``: the embedded default job, a small MPSP run with curves and a summary."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

from interp_toolkit.cli.train import format_metrics, train_mpsp, write_curves
from interp_toolkit.config import Config, parse_config

HELP = "train a small MPSP model and write its curves and a summary"
DESCRIPTION = HELP
DEMO_OUT = "runs/demo"


@dataclass
class DemoCommandConfig(Config):
    """Settings of ``interp-toolkit demo`` (every field is a flag; ``--config FILE`` sets them too).

    Attributes:
        out: Run directory.
        epochs: Epochs.
        n_train: Training examples.
        format: File format of the training curves (png, svg or pdf).
    """

    out: Path = Path(DEMO_OUT)
    epochs: int = 300
    n_train: int = 4096
    format: Literal["png", "svg", "pdf"] = "png"

    def __post_init__(self) -> None:
        for name in ("epochs", "n_train"):
            value = getattr(self, name)
            self.check(name, isinstance(value, int) and not isinstance(value, bool) and value >= 1, "an integer >= 1")
        self.check("format", self.format in ("png", "svg", "pdf"), "one of png, svg, pdf")
        self.out = Path(self.out)


def parse(argv: Sequence[str], prog: str = "interp-toolkit demo") -> DemoCommandConfig:
    """``argv`` (after ``demo``) -> a validated :class:`DemoCommandConfig`."""
    return parse_config(DemoCommandConfig, argv, prog=prog, description=DESCRIPTION)


def run_config(args: DemoCommandConfig) -> int:
    """Small MPSP run on the embedded defaults, then a summary beside its curves."""
    from interp_toolkit.io import atomic_write_json
    from interp_toolkit.model import ModelConfig
    from interp_toolkit.runs.config import TrainConfig
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
        "curves": str(write_curves(result, run_dir, args.format)),
    }
    atomic_write_json(run_dir / "summary.json", summary)
    print(f"demo run: {run_dir}  ({'cached' if result.already_finished else 'trained'})")
    print("final: " + format_metrics(result.final))
    print(f"shortcut (val >= 99%) first at epoch {summary['epoch_val_acc_0.99']}; "
          f"adversarial 100% first at epoch {summary['epoch_adv_acc_1.0']}; max adv {summary['max_adv_acc']:.3f}")
    print(f"curves: {summary['curves']}  summary: {run_dir / 'summary.json'}")
    return 0


__all__ = ["DEMO_OUT", "DESCRIPTION", "DemoCommandConfig", "HELP", "parse", "run_config"]
