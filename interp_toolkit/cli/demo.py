"""``interp-toolkit demo``: the embedded default job, a small MPSP run with curves and a summary."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

from interp_toolkit.cli import COMMANDS
from interp_toolkit.config import Config, parse_config
from interp_toolkit.studies.demo import DEMO_OUT, DEMO_SEED

DESCRIPTION = COMMANDS["demo"][1]


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
    from interp_toolkit.runs.mpsp import format_metrics
    from interp_toolkit.studies.demo import run_demo

    demo = run_demo(args.out, epochs=args.epochs, n_train=args.n_train, seed=args.seed,
                    figure_format=args.format)
    task, summary = demo.summary["task"], demo.summary
    took = "cached" if demo.seconds is None else f"trained in {demo.seconds:.0f} s"
    print(f"demo run: {demo.run_dir}  ({took}): sum parity of {task['seq_len']} values in 0..{task['n_values'] - 1}, "
          f"max-parity shortcut agreeing with the label on r = {task['r']:g} of {task['n_train']} training "
          f"examples; 1 layer, 2 heads, seed {args.seed}")
    for line in summary["phases"]:
        print("  " + line)
    print("final: " + format_metrics(demo.result.final))
    print(f"figure: {summary['phases_figure']}  curves: {summary['curves']}  summary: {demo.summary_path}")
    return 0


__all__ = ["DESCRIPTION", "DemoCommandConfig", "parse", "run_config"]
