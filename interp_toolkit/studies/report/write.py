"""Generalization-rate report of studies: tables (CSV, markdown, printed) and figures.

Sources are study directories and ``outcomes.csv`` files, in any mix
(:func:`write_report_sources`; :func:`write_report` for one). Files written:

* ``outcomes.csv``: one row per run: its task and training settings (task, seq_len,
  n_values, n_train, n_eval, data_seed, n_layers, n_heads, d_model, d_mlp, weight_decay, lr,
  epochs, batch_size, eval_every, early_stop, outcome threshold, ``train.betas`` and any other
  ``SECTION.FIELD`` setting, r), its optimization clock after ``epochs`` (``steps`` it took,
  ``lr_x_wd``, ``decay_clocks``: :func:`~interp_toolkit.studies.grid.outcome_table.run_clock`), seed,
  status, outcome record, near-miss view (:func:`~interp_toolkit.studies.grid.study.run_near_miss`)
  and run directory. A report regenerates every table and the rate figure from it;
* ``table.csv``: per cell: its clock at its epoch budget; seeds; ``rate`` (the paper's
  criterion, ``generalized``) and ``rule_learned_rate`` (both splits at 100% at one
  evaluation), each with its 95% Wilson interval; near misses (``n_near_misses`` of
  ``n_near_miss_known``: runs within 1 point of the criterion); transient count, median
  first-generalization epoch, mean final adv/val accuracy. A cell is every setting above but
  the seed
  (:data:`~interp_toolkit.studies.grid.cells.CELL_FIELDS`), so runs of different regimes (a
  calibration and a final study) never pool;
* ``table.md``: the table, contrasts and requested comparisons as markdown;
* ``contrasts.csv``: for every pair of r values within one architecture and regime: the
  difference in rates with a 95% Newcombe (Wilson score, method 10) interval and a two-sided
  Fisher exact p-value;
* ``generalization_rate.<fmt>``: rate vs r per architecture with Wilson intervals, markers
  only (the headline figure; dashed line at chance r = 1/m; near misses as ``+k near``);
* ``curves_by_cell.<fmt>``: adversarial (solid) and validation (dashed) accuracy of every
  seed, one panel per cell (runs read from run directories only: a CSV has no curves).
* ``rate_vs_clock.csv`` and ``rate_vs_clock.<fmt>`` (with ``clock``): per setting (a cell
  without its horizon), the share of runs that reached the paper's criterion by each decay
  clock and the share still in their basin there
  (:func:`~interp_toolkit.studies.report.clock.clock_table`,
  :func:`~interp_toolkit.studies.report.plots.plot_rate_vs_clock`);
* ``paper_comparison.csv`` (with ``against_paper``): every cell that has a published headline
  rate (:data:`~interp_toolkit.studies.report.tables.PAPER_HEADLINE_RATES`) against it: difference,
  95% Newcombe interval, Fisher p.

This module orchestrates: the statistics are :mod:`~interp_toolkit.studies.common.statistics`'s, the
tables :mod:`~interp_toolkit.studies.report.tables`'s, the text :mod:`~interp_toolkit.studies.report.format`'s,
the figures :mod:`~interp_toolkit.studies.report.plots`'s, and reading runs and outcome tables
:mod:`~interp_toolkit.studies.grid.study`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from interp_toolkit.errors import UserError
from interp_toolkit.io import atomic_write_text
from interp_toolkit.studies.grid.cells import (
    complete_settings,
    find_cell,
    parse_cell_spec,
    select_runs,
    spec_list,
    varying_fields,
)
from interp_toolkit.studies.grid.outcome_table import (
    merge_runs,
    read_outcomes_csv,
    run_fields,
)
from interp_toolkit.studies.grid.study import (
    RECORDED_OUTCOMES,
    collect_runs,
    report_paths,
    source_kind,
)
from interp_toolkit.studies.report.clock import clock_fields, clock_table
from interp_toolkit.studies.report.format import (
    csv_text,
    format_contrasts,
    format_markdown,
    format_reference_comparison,
    format_table,
    shared_settings,
)
from interp_toolkit.studies.report.plots import (
    RATE_AXES,
    plot_curves_by_cell,
    plot_rate_vs_clock,
    plot_rate_vs_r,
)
from interp_toolkit.studies.report.tables import (
    PAPER_HEADLINE_RATES,
    compare_cells,
    contrast_fields,
    contrasts_table,
    rate_table,
    reference_comparison,
    reference_fields,
    row_finished,
    small_cell_warning,
    table_fields,
)


def portable_run_dir(run_dir: Any, study_dir: Any = None) -> Any:
    """A run folder as an outcomes table stores it: relative to its study (``runs/NAME``).

    A path under ``study_dir`` is made relative to it; another absolute path (a table written
    before tables stored relative paths) keeps its part from the last ``runs/`` folder on, the
    study layout's; anything else is kept as given.
    """
    if not run_dir:
        return run_dir
    path = Path(str(run_dir))
    if study_dir:
        try:
            return path.relative_to(Path(str(study_dir))).as_posix()
        except ValueError:
            pass
    if path.is_absolute():
        parts = path.parts
        if "runs" in parts:
            last = len(parts) - 1 - parts[::-1].index("runs")
            return Path(*parts[last:]).as_posix()
    return str(run_dir)


def write_report_sources(sources: Sequence[str | Path], out_dir: str | Path, print_table: bool = True,
                         compare: Sequence[tuple[str, str]] = (), max_printed_contrasts: int = 20,
                         figure_format: str = "png", rate_axis: str = "full",
                         against_paper: bool = False, where: str | Sequence[str] = (),
                         prefer: str | Path | None = None, clock: bool = False) -> dict[str, Any]:
    """The report of the runs of several sources merged: study directories and outcome CSVs.

    Every source is checked before anything is read or written. Study directories are
    re-scored from their runs' ``metrics.jsonl``; ``outcomes.csv`` files (as this function
    writes them) give their rows as recorded. A run found in several sources is counted once
    (:func:`merge_runs`); finished copies of it whose outcomes differ are refused unless
    ``prefer`` names the source that wins. Writes into ``out_dir``: ``outcomes.csv`` (every run's settings and
    outcome), ``table.csv``, ``table.md`` (the table, contrasts and comparisons as markdown),
    ``contrasts.csv``, ``generalization_rate.<fmt>`` and, for the runs read from run
    directories, ``curves_by_cell.<fmt>`` (learning curves need ``metrics.jsonl``, which a CSV
    does not hold; skipped, and said so, when no run comes from a directory).

    Args:
        sources: Study directories (``runs/*/run.json`` + ``metrics.jsonl`` inside) and/or
            outcome CSV files.
        out_dir: Where to write.
        print_table: Print the rate table (and contrasts) to stdout.
        compare: Pairs of cell specs (see :func:`find_cell`, e.g. ``("L=2,r=0.9", "L=2,r=0.5")``)
            compared a - b on both rates; validated before anything is written.
        max_printed_contrasts: Print the automatic contrasts only up to this many rows
            (they are all in ``contrasts.csv``).
        figure_format: ``png``, ``svg`` or ``pdf`` (file suffix of the figures).
        rate_axis: ``full`` or ``categorical`` r axis of the rate figure (:func:`plot_rate_vs_r`).
        against_paper: Also compare every cell that has a published headline rate
            (:data:`PAPER_HEADLINE_RATES`) with it (:func:`reference_comparison`): written to
            ``paper_comparison.csv`` and ``table.md``, printed, and drawn beside the cell in the
            rate figure. Cells much smaller than the paper's (:func:`small_cell_warning`) get one
            ``warning:`` line on stderr.
        where: Cell specs (see :func:`select_runs`; one may be a string): report only the runs
            matching any of them, e.g. ``["study=reproduce,seq_len=8,epochs=1000"]``; everything written,
            ``outcomes.csv`` included, holds those runs only. Validated before anything is read.
        prefer: One of ``sources``: its copy of a run wins when copies conflict.
        clock: Also write ``rate_vs_clock.csv`` and its figure: every setting's reached rate and
            basin retention against decay clocks (:func:`clock_table`), for sweeps whose
            cells differ in lr, weight decay, batch size or horizon.

    Returns:
        ``{"rows", "table", "contrasts", "comparisons", "references", "paths", "n_duplicates",
        "paper_warning", "clock"}`` (the warning's text, or None; the clock table, empty
        without ``clock``);
        ``paths["curves_png"]`` is ``None`` when the curves figure was skipped, and
        ``paths["rate_png"]`` when no run has finished yet (no rates: the table is empty).
    """
    from interp_toolkit.plotting import check_format, save_figure

    figure_format = check_format(figure_format)
    if rate_axis not in RATE_AXES:
        raise UserError(f"rate axis must be one of {RATE_AXES}, got {rate_axis!r}")
    sources = [Path(source) for source in sources]
    if not sources:
        raise UserError("report needs at least one source: a study directory or an outcomes.csv")
    kinds = [source_kind(source) for source in sources]  # every path checked before any work
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise UserError(f"report --out {out_dir} is an existing file; expected a directory (existing or new)")
    if prefer is not None and Path(prefer).resolve() not in [Path(source).resolve() for source in sources]:
        raise UserError(f"--prefer {prefer} is not one of the report's sources "
                        f"({', '.join(str(source) for source in sources)})")
    where = spec_list(where)
    for spec in where:
        parse_cell_spec(spec)  # a bad selection fails before any run is read
    row_lists = [collect_runs(source) if kind == "study" else read_outcomes_csv(source)
                 for source, kind in zip(sources, kinds, strict=True)]
    rows, n_duplicates = merge_runs(row_lists, prefer=prefer)
    rows = complete_settings(rows)  # a run without an extra setting others have ran at its default
    if not rows:
        names = ", ".join(str(source) for source in sources)
        raise UserError(f"no runs with evaluations yet in {names}")
    n_merged = len(rows)
    rows = select_runs(rows, where)
    table = rate_table(rows)
    shown = varying_fields(table)
    comparisons = []
    failed = sum(row.get("status") == "failed" for row in rows)
    unfinished = sum(not row_finished(row) for row in rows) - failed
    for spec_a, spec_b in compare:
        try:
            cell_a, cell_b = find_cell(table, spec_a), find_cell(table, spec_b)
        except (ValueError, UserError) as err:
            if unfinished and "matches no cell" in str(err):
                raise UserError(f"{err} (runs still training: {unfinished}; a cell has a rate once one "
                                 "of its runs has finished)") from err
            raise
        if cell_a is cell_b:
            raise UserError(f"--compare {spec_a} {spec_b}: both specs name the same cell, so its difference is 0 by "
                            "construction; name two different cells")
        comparisons += [compare_cells(cell_a, cell_b, "generalized", shown),
                        compare_cells(cell_a, cell_b, "rule_learned", shown)]
    contrasts = contrasts_table(table)
    reference_rates = PAPER_HEADLINE_RATES if against_paper else ()
    references = reference_comparison(table, reference_rates)
    paper_warning = small_cell_warning(references) if against_paper else None
    if paper_warning:
        import sys

        print(f"warning: {paper_warning}", file=sys.stderr, flush=True)
    with_metrics = [row for row in rows if row.get("has_metrics")]
    written = report_paths(out_dir, figure_format)
    paths: dict[str, Path | None] = {
        **written,
        "rate_png": written["rate_png"] if table else None,
        "curves_png": written["curves_png"] if with_metrics else None,
        "paper_csv": written["paper_csv"] if against_paper else None,
    }
    clocks = clock_table(rows) if clock else []
    if clock and not clocks:
        raise UserError("report --clock: no run has a known clock and an evaluation (each needs lr, weight_decay, "
                         "n_train and a final_epoch above 0)")
    if not clock:
        paths["clock_csv"] = paths["clock_png"] = None
    # a table's run folders are relative to their study, never a path of the machine that wrote it
    portable = [{**row, "run_dir": portable_run_dir(row.get("run_dir"), row.get("source"))} for row in rows]
    atomic_write_text(written["outcomes_csv"], csv_text(portable, run_fields(rows)))
    atomic_write_text(written["table_csv"], csv_text(table, table_fields(table)))
    atomic_write_text(written["table_md"], format_markdown(table, contrasts, comparisons, references))
    atomic_write_text(written["contrasts_csv"], csv_text(contrasts, contrast_fields(table)))
    if against_paper:
        atomic_write_text(written["paper_csv"], csv_text(references, reference_fields(table)))
    if table:  # no finished run yet: no rates to plot (the curves show the progress)
        save_figure(plot_rate_vs_r(table, x_axis=rate_axis, references=reference_rates), written["rate_png"])
    if with_metrics:
        save_figure(plot_curves_by_cell(with_metrics), written["curves_png"])
    if clock:
        atomic_write_text(written["clock_csv"], csv_text(clocks, clock_fields(clocks)))
        save_figure(plot_rate_vs_clock(clocks), written["clock_png"])
    if print_table:
        if where:
            print(f"(selected {len(rows)} of {n_merged} runs: {' or '.join(where)})")
        if table:
            print(format_table(table))
        else:
            print(f"no run has finished yet ({unfinished} training): no rates until one does")
        shared = shared_settings(table)
        if shared:
            print(f"(every cell: {shared})")
        if failed:
            print(f"({failed} runs failed (their sweep job raised or its worker died; failure.json in the run "
                  "says why) and are not counted in the rates; rerun the sweep to resume them)")
        if unfinished and table:
            print(f"({unfinished} runs still training are not counted in the rates (column running): a run's "
                  "outcome is known once it finishes)")
        if n_duplicates:
            print(f"({n_duplicates} runs found in more than one source were counted once)")
        if contrasts and len(contrasts) <= max_printed_contrasts:
            print("\ncontrasts of the paper rate within each architecture (a - b):")
            print(format_contrasts(contrasts))
        for column in ("generalized", "rule_learned"):
            chosen = [c for c in comparisons if c["column"] == column]
            if chosen:
                print(f"\nrequested comparisons ({'paper rate' if column == 'generalized' else 'rule-learned rate'}"
                      ", a - b):")
                print(format_contrasts(chosen))
        if against_paper:
            if references:
                print("\nagainst the published rates (here - published):")
                print(format_reference_comparison(references))
            else:
                cells = ", ".join(f"{ref.task} L={ref.n_layers} r={ref.r:g}"
                                  + ("" if ref.weight_decay is None else f" wd={ref.weight_decay:g}")
                                  for ref in reference_rates)
                print(f"\nagainst the published rates: no cell here has one (they are {cells})")
        print(f"outcomes: {paths['outcomes_csv']}\ntable: {paths['table_csv']} (markdown: {paths['table_md']})\n"
              f"contrasts: {paths['contrasts_csv']}\nheadline plot: {paths['rate_png'] or 'skipped (no rates yet)'}")
        csv_only = len(rows) - len(with_metrics)
        if not with_metrics:
            print(f"curves: skipped (all {len(rows)} runs come from outcomes CSVs, which hold no learning curves; "
                  "pass the study directories to draw them)")
        else:
            note = (f" ({csv_only} runs from outcomes CSVs have no learning curves and are not drawn)"
                    if csv_only else "")
            print(f"curves: {paths['curves_png']}{note}")
        if clock:
            print(f"rates against decay clocks: {paths['clock_csv']} (figure: {paths['clock_png']})")
    return {"rows": rows, "table": table, "contrasts": contrasts, "comparisons": comparisons,
            "references": references, "paths": paths, "n_duplicates": n_duplicates, "paper_warning": paper_warning,
            "clock": clocks}


def write_report(study_dir: str | Path, out_dir: str | Path | None = None, print_table: bool = True,
                 compare: Sequence[tuple[str, str]] = (), max_printed_contrasts: int = 20,
                 figure_format: str = "png", rate_axis: str = "full", against_paper: bool = False,
                 where: str | Sequence[str] = (), prefer: str | Path | None = None,
                 clock: bool = False) -> dict[str, Any]:
    """The report of one study directory (or one outcomes CSV): :func:`write_report_sources`.

    Args:
        study_dir: A study directory (``runs/*/run.json`` + ``metrics.jsonl`` inside, and the
            ``recorded_outcomes.csv`` of runs taken from earlier tables, if any) or an
            ``outcomes.csv``.
        out_dir: Where to write (default: the study directory; for a CSV, its folder).
        print_table, compare, max_printed_contrasts, figure_format, rate_axis, against_paper, where, prefer, clock:
            See :func:`write_report_sources`.

    Returns:
        ``{"rows", "table", "contrasts", "comparisons", "references", "paths", "n_duplicates",
        "paper_warning", "clock"}``.
    """
    study_dir = Path(study_dir)
    if out_dir is None:
        out_dir = study_dir.parent if study_dir.is_file() else study_dir
    source_kind(study_dir)  # a missing, foreign or special path is named before any work
    sources = [study_dir]
    recorded = study_dir / RECORDED_OUTCOMES
    if study_dir.is_dir() and recorded.is_file():
        sources.append(recorded)  # runs of this grid taken from earlier invocations' tables
    return write_report_sources(sources, out_dir, print_table=print_table, compare=compare,
                                max_printed_contrasts=max_printed_contrasts, figure_format=figure_format,
                                rate_axis=rate_axis, against_paper=against_paper, where=where, prefer=prefer,
                                clock=clock)


__all__ = ["write_report", "write_report_sources"]
