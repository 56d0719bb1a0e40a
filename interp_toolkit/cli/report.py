"""``interp-toolkit report``: generalization-rate table and plots of a study directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import tyro

from interp_toolkit.config import Config, parse_config
from interp_toolkit.errors import UserError

HELP = "generalization-rate table and plots of a study directory"
DESCRIPTION = ("Write table.csv (rate per cell, n seeds, 95% Wilson interval), outcomes.csv and PNG plots "
               "beside them, and print the table.")


@dataclass
class ReportCommandConfig(Config):
    """Settings of ``interp-toolkit report``.

    Attributes:
        study_dir: A study directory written by `sweep`.
        out: Where to write the report (default: the study directory).
    """

    study_dir: tyro.conf.Positional[Optional[Path]] = None  # noqa: UP007 - tyro reads the annotation
    out: Optional[Path] = None  # noqa: UP007


def parse(argv: Sequence[str], prog: str = "interp-toolkit report") -> ReportCommandConfig:
    """``argv`` (after ``report``) -> a :class:`ReportCommandConfig`."""
    config = parse_config(ReportCommandConfig, argv, prog=prog, description=DESCRIPTION)
    if config.study_dir is None:
        raise UserError("report needs a STUDY_DIR (a study directory written by `sweep`)")
    return config


def run_config(args: ReportCommandConfig) -> int:
    """``interp-toolkit report STUDY_DIR``."""
    from interp_toolkit.studies.report import write_report

    write_report(args.study_dir, out_dir=args.out, print_table=True)
    return 0


__all__ = ["DESCRIPTION", "HELP", "ReportCommandConfig", "parse", "run_config"]
