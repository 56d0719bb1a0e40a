"""The ``mechanism-contrast`` subcommand: the paper's gradient quantities in runs that
generalize against runs that do not, over the same epochs.

``interp-toolkit mechanism-contrast RUN_OR_STUDY... --out DIR`` sorts the runs by outcome,
measures gradient cosine and the minority's amplification at every checkpoint they share
(cached with the ``mechanism`` command's gradient analysis), and writes the figure, the
per-epoch, per-window and per-run tables and a JSON into DIR
(:func:`interp_toolkit.studies.mechanism.contrast_plot.write_contrast`); ``--from-summary
DIR/contrast.json`` redraws them from that JSON alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Optional, Sequence

import tyro

from interp_toolkit.config import Config, parse_config
from interp_toolkit.errors import UserError
from interp_toolkit.studies.mechanism.contrast_data import ContrastConfig

DESCRIPTION = ("Mechanism with controls: sort MPSP runs (run or study directories) into those that left the "
               "shortcut and those that did not (by generalizing and by a phase-2 onset, unless --by names one), "
               "measure gradient cosine and the minority's amplification at every "
               "checkpoint epoch they share, and compare the two kinds per epoch (means, run-to-run spread, "
               "difference with a 95% Welch interval) and per window of epochs (each run's median; difference, "
               "permutation p, Holm-corrected over every grouping, window and quantity computed, and a verdict: "
               "distinguishes / does not distinguish / too few runs). "
               "Runs that differ in anything but their seeds (task, r, n, model, training settings) are refused, "
               "naming the setting, unless --allow-differing names it (then recorded as a confounder). "
               "Writes contrast.png, by_epoch.csv, windows.csv, runs.csv and contrast.json (strict JSON with a "
               "content digest, checked when --from-summary reads it back) into --out.")


@dataclass
class ContrastCommandConfig(Config):
    """Settings of ``interp-toolkit mechanism-contrast`` (every field is a flag).

    Attributes:
        sources: Run directories and/or study directories written by `sweep` (their runs).
        out: Folder for the figure, tables and JSON (required).
        from_summary: Redraw from a contrast.json written before (no runs needed; the
            settings come from that file).
        device: cpu, cuda, cuda:N or auto (where checkpoints are loaded).
        threads: Torch CPU threads.
        progress: Show progress bars.
        settings: What is compared and how.
    """

    sources: Annotated[tuple[Path, ...], tyro.conf.Positional, tyro.conf.arg(metavar="RUN_OR_STUDY")] = ()
    out: Optional[Path] = None  # noqa: UP007 - tyro reads the annotation
    from_summary: Optional[Path] = None  # noqa: UP007
    device: str = "cpu"
    threads: int = 1
    progress: bool = True
    settings: ContrastConfig = field(default_factory=ContrastConfig)

    def __post_init__(self) -> None:
        self.sources = tuple(Path(source) for source in self.sources)
        self.check("threads", not isinstance(self.threads, bool) and isinstance(self.threads, int)
                   and self.threads >= 1, "a positive integer")

    def check_required(self) -> Path:
        """The --out folder; a user error when --out or the inputs are missing or clash."""
        if self.out is None:
            raise UserError("mechanism-contrast needs --out DIR (the folder for its figure, tables and JSON)")
        if self.from_summary is not None and self.sources:
            raise UserError("give either run/study directories or --from-summary, not both")
        if self.from_summary is None and not self.sources:
            raise UserError("mechanism-contrast needs run directories or study directories (or --from-summary)")
        return self.out


def parse(argv: Sequence[str], prog: str = "interp-toolkit mechanism-contrast") -> ContrastCommandConfig:
    """``argv`` (after ``mechanism-contrast``) -> a validated :class:`ContrastCommandConfig`."""
    config = parse_config(ContrastCommandConfig, argv, prog=prog, description=DESCRIPTION)
    config.check_required()
    return config


def run_config(args: ContrastCommandConfig) -> int:
    """Run the subcommand; returns 0 (bad input raises a user error: exit 2 in ``main``)."""
    from interp_toolkit.studies.mechanism.contrast import contrast_runs, read_contrast
    from interp_toolkit.studies.mechanism.contrast_plot import write_contrast

    out = args.check_required()
    if args.from_summary is not None:
        result = read_contrast(args.from_summary)
    else:
        result = contrast_runs(args.sources, args.settings, device=args.device, progress=args.progress,
                               n_threads=args.threads)
    written = write_contrast(result, out)
    print(f"{len(result.runs)} runs; {len(result.epochs)} shared checkpoint epochs "
          f"({result.epochs[0]}-{result.epochs[-1]})")
    for line in result.counts():
        print(line)
    for line in result.verdicts():
        print(line)
    for name, path in written.items():
        print(f"{name + ':':10s}{path}")
    return 0


__all__ = ["DESCRIPTION", "ContrastCommandConfig", "parse", "run_config"]
