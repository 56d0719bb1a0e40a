"""``interp-toolkit report``: generalization-rate table and plots of a study directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, Sequence

import tyro

from interp_toolkit.config import Config, parse_config
from interp_toolkit.errors import UserError

HELP = "generalization-rate table and plots of a study directory"
DESCRIPTION = ("Re-score every run from its metrics.jsonl (outcome.json is a cache), write table.csv (paper "
               "rate and rule-learned rate per cell with 95% Wilson intervals), contrasts.csv (r pairs per "
               "architecture: difference, 95% Newcombe interval, Fisher exact p), outcomes.csv and two figures, "
               "and print them.")


@dataclass
class ReportCommandConfig(Config):
    """Settings of ``interp-toolkit report``.

    Attributes:
        study_dir: A study directory written by `sweep`.
        out: Where to write the report (default: the study directory).
        compare: Pairs of cells: rate difference a - b with a 95% Newcombe interval and Fisher
            exact p; cells as KEY=VALUE lists, e.g. --compare L=2,r=0.9 L=2,r=0.5 (an even
            number of values, taken two by two).
        format: Figure file format (png, svg or pdf).
    """

    study_dir: tyro.conf.Positional[Optional[Path]] = None  # noqa: UP007 - tyro reads the annotation
    out: Optional[Path] = None  # noqa: UP007
    compare: Optional[tuple[str, ...]] = None  # noqa: UP007
    format: Literal["png", "svg", "pdf"] = "png"

    def __post_init__(self) -> None:
        self.check("format", self.format in ("png", "svg", "pdf"), "one of png, svg, pdf")
        if self.compare is not None:
            self.compare = tuple(self.compare)
            self.check("compare", len(self.compare) % 2 == 0,
                       "an even number of cells (pairs CELL_A CELL_B)")


def parse(argv: Sequence[str], prog: str = "interp-toolkit report") -> ReportCommandConfig:
    """``argv`` (after ``report``) -> a :class:`ReportCommandConfig`."""
    config = parse_config(ReportCommandConfig, argv, prog=prog, description=DESCRIPTION)
    if config.study_dir is None:
        raise UserError("report needs a STUDY_DIR (a study directory written by `sweep`)")
    return config


def run_config(args: ReportCommandConfig) -> int:
    """``interp-toolkit report STUDY_DIR``."""
    from interp_toolkit.studies.report import write_report

    pairs = list(zip(args.compare[::2], args.compare[1::2])) if args.compare else []
    write_report(args.study_dir, out_dir=args.out, print_table=True, compare=pairs,
                 figure_format=args.format)
    return 0


__all__ = ["DESCRIPTION", "HELP", "ReportCommandConfig", "parse", "run_config"]
