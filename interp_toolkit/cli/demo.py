"""``interp-toolkit demo``: the embedded default job, a small MPSP run with curves and a summary."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

from interp_toolkit.cli.train import format_metrics, train_mpsp, write_curves
from interp_toolkit.config import Config, parse_config
from interp_toolkit.runs.layout import CURVES

HELP = "train a small MPSP model that learns the shortcut, then the rule; name its two phases"
DESCRIPTION = HELP
DEMO_OUT = "runs/demo"


#: The demo's regime (measured on 2 cores, see docs/reproduction.md): at length 5, values
#: 0..9, 4,096 examples and r = 0.9, a 1-layer model learns the max-parity shortcut within
#: ~50 epochs, and model seed 3 then leaves it for the sum-parity rule (adversarial
#: accuracy 100% at epoch ~330-370, by thread count); other seeds stay on the shortcut longer.
DEMO_TASK = dict(seq_len=5, n_values=10, r=0.9, n_eval=1024)
DEMO_SEED = 3


@dataclass
class DemoCommandConfig(Config):
    """Settings of ``interp-toolkit demo`` (every field is a flag; ``--config FILE`` sets them too).

    Attributes:
        out: Run directory.
        epochs: Epochs.
        n_train: Training examples.
        seed: Model seed (3 shows both phases within the default epochs; see DEMO_SEED).
        format: File format of the training curves and the phases figure (png, svg or pdf).
    """

    out: Path = Path(DEMO_OUT)
    epochs: int = 500
    n_train: int = 4096
    seed: int = DEMO_SEED
    format: Literal["png", "svg", "pdf"] = "png"

    def __post_init__(self) -> None:
        for name in ("epochs", "n_train"):
            value = getattr(self, name)
            self.check(name, isinstance(value, int) and not isinstance(value, bool) and value >= 1, "an integer >= 1")
        self.check("seed", isinstance(self.seed, int) and not isinstance(self.seed, bool), "an integer")
        self.check("format", self.format in ("png", "svg", "pdf"), "one of png, svg, pdf")
        self.out = Path(self.out)


def parse(argv: Sequence[str], prog: str = "interp-toolkit demo") -> DemoCommandConfig:
    """``argv`` (after ``demo``) -> a validated :class:`DemoCommandConfig`."""
    return parse_config(DemoCommandConfig, argv, prog=prog, description=DESCRIPTION)


def run_config(args: DemoCommandConfig) -> int:
    """A small MPSP run that learns the shortcut, then the rule; its two phases in words and a figure."""
    import time

    from interp_toolkit.io import atomic_write_json
    from interp_toolkit.model import ModelConfig
    from interp_toolkit.plotting import save_figure
    from interp_toolkit.runs.config import TrainConfig
    from interp_toolkit.studies.outcomes import compute_outcome, describe_phases, plot_phases
    from interp_toolkit.tasks.mpsp import MPSPConfig, task_modulus

    task_cfg = MPSPConfig(n_train=args.n_train, **DEMO_TASK)
    model_cfg = ModelConfig(n_layers=1, n_heads=2, seed=args.seed, **task_cfg.model_dims())
    train_cfg = TrainConfig(epochs=args.epochs, eval_every=10, checkpoint_every=100)
    run_dir = Path(args.out)
    started = time.perf_counter()
    result = train_mpsp(task_cfg, model_cfg, train_cfg, run_dir)
    seconds = time.perf_counter() - started
    metrics = result.metrics
    outcome = compute_outcome(metrics, task_cfg.r, task_modulus(task_cfg.name))
    phases = describe_phases(outcome, metrics)
    phases_path = run_dir / f"phases.{args.format}"
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
        "seconds": None if result.already_finished else seconds,
        "curves_png": str(run_dir / CURVES),
        "curves": str(write_curves(result, run_dir, args.format)),
        "phases_figure": str(phases_path),
    }
    atomic_write_json(run_dir / "summary.json", summary)
    took = "cached" if result.already_finished else f"trained in {seconds:.0f} s"
    print(f"demo run: {run_dir}  ({took}): sum parity of {task_cfg.seq_len} values in 0..{task_cfg.n_values - 1}, "
          f"max-parity shortcut agreeing with the label on r = {task_cfg.r:g} of {task_cfg.n_train} training "
          f"examples; 1 layer, 2 heads, seed {args.seed}")
    for line in phases:
        print("  " + line)
    print("final: " + format_metrics(result.final))
    print(f"figure: {phases_path}  curves: {summary['curves']}  summary: {run_dir / 'summary.json'}")
    return 0


__all__ = ["DEMO_OUT", "DEMO_SEED", "DEMO_TASK", "DESCRIPTION", "DemoCommandConfig", "HELP", "parse", "run_config"]
