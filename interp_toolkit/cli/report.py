"""``interp-toolkit report``: generalization-rate table and plots of studies and outcome CSVs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, Sequence

import tyro

from interp_toolkit.config import Config, parse_config
from interp_toolkit.errors import UserError

DESCRIPTION = ("Merge the runs of every SOURCE (study directories written by `sweep`, re-scored from each run's "
               "metrics.jsonl, and outcomes.csv files of earlier reports; a run found twice counts once, and copies "
               "of one run with different outcomes are refused unless --prefer SOURCE picks the winner), then "
               "write outcomes.csv (every run's task and training settings and outcome), table.csv and table.md "
               "(paper rate and rule-learned rate per cell with 95% Wilson intervals; cells keyed by every "
               "setting, so regimes never pool), contrasts.csv (r pairs per architecture: difference, 95% "
               "Newcombe interval, Fisher exact p), the rate figure and (for runs with metrics) the curves "
               "figure, and print them.")


@dataclass
class ReportCommandConfig(Config):
    """Settings of ``interp-toolkit report``.

    Attributes:
        sources: Study directories written by `sweep` and/or outcomes.csv files, in any mix.
        out: Where to write the report (default with one study directory: that directory;
            with one outcomes.csv: its folder; required with several sources).
        compare: Pairs of cells: rate difference a - b with a 95% Newcombe interval and Fisher
            exact p; cells as KEY=VALUE lists, e.g. --compare L=2,r=0.9,seq_len=8
            L=2,r=0.5,seq_len=8 (keys: task, study, L, H, wd, r, seq_len, n_values, n_train, n_eval,
            data_seed, d_model, d_mlp, lr, epochs, batch_size, eval_every, early_stop,
            threshold, and SECTION.FIELD for any other task, model or train setting, e.g.
            train.seed; an even number of values, taken two by two).
        format: Figure file format (png, svg or pdf).
        rate_axis: r axis of the rate figure: full (0 to 1, to scale) or categorical (the
            measured r values evenly spaced).
        against_paper: Compare every cell that has a published headline rate (the source
            paper's 1L/2L x r 0.5/0.9 max-parity cells, 30 seeds each) with it: difference, 95%
            Newcombe interval and Fisher exact p, in paper_comparison.csv and table.md, and the
            published rate drawn beside its cell (hollow) in the rate figure.
        where: Report only the runs matching a cell spec (the keys of --compare; every key of one
            spec must match), e.g. --where study=reproduce,seq_len=8,epochs=1000; several specs
            keep runs matching any (a key given twice in one spec is refused: pass two specs for
            either value). Everything written, outcomes.csv included, holds those runs only.
        prefer: The source whose copy of a run wins when sources hold copies of one run with
            different outcomes (without it such conflicting copies are refused, naming the run
            and its sources; identical copies merge silently).
        clock: Also write rate_vs_clock.csv and rate_vs_clock.<format>: per setting (a cell
            without study, epochs and eval_every, so one setting's runs of different stages and
            horizons pool), the fraction of runs that reached 100% adversarial by each decay
            clock (steps x lr x wd) and the fraction still in their basin there, among the runs
            that trained that far.
    """

    sources: tyro.conf.Positional[tuple[Path, ...]] = ()
    out: Optional[Path] = None  # noqa: UP007 - tyro reads the annotation
    compare: Optional[tuple[str, ...]] = None  # noqa: UP007
    format: Literal["png", "svg", "pdf"] = "png"
    rate_axis: Literal["full", "categorical"] = "full"
    against_paper: bool = False
    where: Optional[tuple[str, ...]] = None  # noqa: UP007
    prefer: Optional[Path] = None  # noqa: UP007
    clock: bool = False

    def __post_init__(self) -> None:
        self.check("format", self.format in ("png", "svg", "pdf"), "one of png, svg, pdf")
        self.check("rate_axis", self.rate_axis in ("full", "categorical"), "one of full, categorical")
        self.sources = tuple(Path(source) for source in self.sources)
        if self.compare is not None:
            self.compare = tuple(self.compare)
            self.check("compare", len(self.compare) % 2 == 0,
                       "an even number of cells (pairs CELL_A CELL_B)")
        if self.where is not None:
            self.where = tuple(self.where)


def parse(argv: Sequence[str], prog: str = "interp-toolkit report") -> ReportCommandConfig:
    """``argv`` (after ``report``) -> a :class:`ReportCommandConfig`."""
    config = parse_config(ReportCommandConfig, argv, prog=prog, description=DESCRIPTION)
    if not config.sources:
        raise UserError("report needs at least one SOURCE: a study directory written by `sweep` or an outcomes.csv")
    if len(config.sources) > 1 and config.out is None:
        names = " ".join(str(source) for source in config.sources)
        raise UserError(f"report of several sources ({names}) needs --out DIR (where the merged report goes)")
    return config


def run_config(args: ReportCommandConfig) -> int:
    """``interp-toolkit report SOURCE [SOURCE ...]``."""
    from interp_toolkit.studies.report.write import write_report, write_report_sources

    pairs = list(zip(args.compare[::2], args.compare[1::2])) if args.compare else []
    where = args.where or ()
    if len(args.sources) == 1:
        write_report(args.sources[0], out_dir=args.out, print_table=True, compare=pairs, figure_format=args.format,
                     rate_axis=args.rate_axis, against_paper=args.against_paper, where=where,
                     prefer=args.prefer, clock=args.clock)
    else:
        assert args.out is not None  # parse() requires --out for several sources
        write_report_sources(args.sources, args.out, print_table=True, compare=pairs, figure_format=args.format,
                             rate_axis=args.rate_axis, against_paper=args.against_paper, where=where,
                             prefer=args.prefer, clock=args.clock)
    return 0


__all__ = ["DESCRIPTION", "ReportCommandConfig", "parse", "run_config"]
