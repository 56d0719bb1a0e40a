"""``interp-toolkit report``: generalization-rate table and plots of a study directory."""

from __future__ import annotations

import argparse

HELP = "generalization-rate table and plots of a study directory"
DESCRIPTION = ("Write table.csv (rate per cell, n seeds, 95% Wilson interval), outcomes.csv and PNG plots "
               "beside them, and print the table.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("study_dir", help="a study directory written by `sweep`")
    p.add_argument("--out", help="where to write the report (default: the study directory)")


def run(args: argparse.Namespace) -> int:
    """``interp-toolkit report STUDY_DIR``."""
    from interp_toolkit.studies.report import write_report

    write_report(args.study_dir, out_dir=args.out, print_table=True)
    return 0


__all__ = ["DESCRIPTION", "HELP", "add_arguments", "run"]
