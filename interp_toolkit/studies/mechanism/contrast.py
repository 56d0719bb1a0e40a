"""Mechanism with controls: the paper's gradient quantities in runs that generalize against
runs that do not, over the same epochs.

One run's mechanism figure (:mod:`interp_toolkit.studies.mechanism.measure`) shows gradient conflict
and the minority's amplification; it cannot show that they *distinguish* the runs that leave
the shortcut from those that stay. This module sets the two kinds of run side by side:

* every run is sorted by its outcome (:func:`~interp_toolkit.studies.common.outcomes.compute_outcome`
  of its ``metrics.jsonl``) under each grouping of ``by`` (default: both): ``generalized``
  uses the paper's criterion (100% on the split the training bias misleads), ``phase2`` the
  looser "a phase-2 onset was seen" (a run that rose toward the rule but stopped short of
  100% counts as leaving); a grouping that leaves fewer than 2 runs of a kind is reported as
  not computed;
* the gradient analysis (:func:`interp_toolkit.analyses.gradients.gradient_conflict`, the
  mechanism's, sharing its per-checkpoint cache) gives each run's series of ``grad_cos``
  (cosine of the consistent and anti-shortcut mean gradients), ``minority_amplification``
  (the paper's minority / majority per-example gradient norm) and ``amplification`` (anti /
  consistent) at the checkpoint epochs every run has;
* per epoch: each kind's mean and run-to-run standard deviation, and the difference of the
  means with a 95% Welch interval;
* per window of epochs (default: the *shortcut phase*, from the last run's shortcut epoch to
  the first onset of phase 2 among the leaving runs, when every run is on the shortcut and
  none has begun to leave, or, where no checkpoint falls in that, from the first run's
  shortcut epoch to that onset, or from the first epoch where runs have no shortcut (r =
  1/m); and *phase 2 on* (at r = 1/m *from the first onset*), from that onset to the end; the whole run where a leaving
  run has
  no onset): each run's median over the window, the difference of the kinds' means with a
  95% Welch interval, a two-sided permutation p (exact for small groups), Holm-corrected over
  every grouping, window and quantity computed (one family: no grouping can be quoted for
  being the significant one), and a verdict: ``distinguishes``, ``does not
  distinguish``, or ``too few runs`` when the group sizes cannot reach the level at all.

A contrast is of outcomes only when the runs share every setting but their seeds
(:func:`~.contrast_data.run_settings`: task, r, n, model, training settings): runs that differ in more are
refused, naming the setting, unless ``allow_differing`` names it, and the result then lists
it as a confounder (:attr:`ContrastResult.confounders`, first line of the verdicts). The
JSON summary is strict (NaN as null) and carries a digest of its content, so an edited
value is refused on read, never redrawn.

Two levels, as elsewhere: :func:`contrast_runs` on run directories (computes what is not
cached), :func:`compute_contrast` on stored series (:class:`~.contrast_data.RunSeries`, no
torch); what a contrast is (config, series, result) is :mod:`.contrast_data`.
:func:`write_contrast` saves the figure (:func:`~interp_toolkit.studies.mechanism.contrast_plot.plot_contrast`: per
quantity, every run and
each kind's mean with its spread above, the difference with its interval below, the windows
shaded), the tables and a JSON of settings, runs and verdicts into one folder, whose file
names are :data:`FILES`.

    result = contrast_runs(["runs/sweeps/my_study"], ContrastConfig())
    write_contrast(result, "docs/contrast")

Command line: ``interp-toolkit mechanism-contrast RUN_OR_STUDY... --out DIR``.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Sequence

from interp_toolkit.errors import UserError
from interp_toolkit.studies.mechanism.contrast_data import (
    FILES,
    KINDS,
    ContrastConfig,
    ContrastResult,
    RunSeries,
    differing_settings,
    parse_window,
    run_settings,
    window_label,
)

# --------------------------------------------------------------------------- runs


def expand_sources(sources: Sequence[str | Path]) -> list[Path]:
    """Run directories of ``sources``: a study directory (written by ``sweep``) stands for its
    runs, a run directory for itself. A path that is neither is a user error."""
    from interp_toolkit.runs.layout import RECORD
    from interp_toolkit.studies.grid.study import is_study_dir, runs_dir

    if not sources:
        raise UserError("mechanism-contrast needs run directories or study directories (none given)")
    out: list[Path] = []
    for source in sources:
        path = Path(source)
        if is_study_dir(path):
            found = sorted(p for p in runs_dir(path).iterdir() if (p / RECORD).is_file()) \
                if runs_dir(path).is_dir() else []
            if not found:
                raise UserError(f"study directory {path} holds no runs (expected {runs_dir(path)}/<run>/{RECORD})")
            out.extend(found)
        elif (path / RECORD).is_file():
            out.append(path)
        else:
            raise UserError(f"{path} is neither a run directory (with {RECORD}) nor a study directory written by "
                            "`interp-toolkit sweep`")
    duplicates = sorted({str(p) for p in out if out.count(p) > 1})
    if duplicates:
        raise UserError(f"run directories given twice: {', '.join(duplicates)}")
    return out


def _described(run_dir: Path) -> RunSeries:
    """A run's outcome, r, layers and checkpoint epochs, from its files (no torch), with no
    values yet."""
    from interp_toolkit.runs.record import task_config
    from interp_toolkit.studies.common.outcomes import compute_outcome
    from interp_toolkit.studies.mechanism.measure import check_run_dir

    record, checkpoints, metrics = check_run_dir(run_dir)
    task = task_config(run_dir)
    outcome = compute_outcome(metrics, task.r, task.modulus)
    n_layers = int((record.get("model_config") or {}).get("n_layers", 0))
    return RunSeries(run_dir, outcome, float(task.r), n_layers, [epoch for epoch, _ in checkpoints],
                     settings=run_settings(record))


def contrast_runs(
    sources: Sequence[str | Path],
    config: ContrastConfig | None = None,
    device: Any = None,
    progress: bool = False,
    n_threads: int | None = None,
) -> ContrastResult:
    """Sort runs by outcome, measure their gradient quantities, and compare the two kinds.

    Everything that can be checked from the run files (both kinds present with at least 2
    runs each, a shared checkpoint epoch, a minority at every run's r when
    ``minority_amplification`` is asked for, the windows) is checked before any gradient is
    computed.

    Args:
        sources: Run directories and/or study directories (their runs).
        config: The settings (default :class:`ContrastConfig`).
        device: Where checkpoints are loaded (default CPU).
        progress: Show one progress bar per run.
        n_threads: Torch CPU threads while measuring (None: leave as is).

    Returns:
        :class:`ContrastResult`.
    """
    config = ContrastConfig() if config is None else config
    if not isinstance(config, ContrastConfig):
        raise UserError(f"config must be a ContrastConfig, got {type(config).__name__}")
    shells = [_described(run_dir) for run_dir in expand_sources(sources)]
    epochs = check_contrast_inputs(shells, config)

    from interp_toolkit.analyses.over_checkpoints import over_checkpoints, splits_from_run
    from interp_toolkit.devices import resolve_device
    from interp_toolkit.studies.mechanism.measure import (
        analysis_dir,
        gradient_quantities,
        gradient_settings,
        minority_of,
    )
    from interp_toolkit.threads import torch_threads

    device = resolve_device(device if device is not None else "cpu")
    load_on = None if device.type == "cpu" else str(device)
    series = []
    with torch_threads(n_threads):
        for shell in shells:
            # the mechanism's gradient analysis, settings and folder: one cache for both
            result = over_checkpoints("gradients", shell.run_dir, splits=splits_from_run(shell.run_dir),
                                      epochs=epochs, name="gradients",
                                      config=gradient_settings(config.grad_n, config.grad_chunk_size),
                                      out_dir=analysis_dir(shell.run_dir, "gradients"), plot=False,
                                      progress=progress, device=load_on)
            minority = minority_of(shell.r)
            measured = {int(row["epoch"]): gradient_quantities(row, minority)
                        for row in result.table.rows if row["group"] == "all"}
            values = {q: [measured[epoch][q] for epoch in epochs] for q in config.quantities}
            series.append(RunSeries(shell.run_dir, shell.outcome, shell.r, shell.n_layers, list(epochs), values,
                                    settings=shell.settings))
    return compute_contrast(series, config)


def check_contrast_inputs(runs: Sequence[RunSeries], config: ContrastConfig) -> list[int]:
    """The epochs every run has; a user error for a contrast that cannot be made.

    Raises:
        UserError: Fewer than 2 runs of either kind under every grouping (naming the
            counts), runs that differ in a setting not allowed to differ, no shared
            checkpoint epoch, ``minority_amplification`` asked of a run at r = 0.5, or a
            window holding none of the shared epochs.
    """
    differ = differing_settings(runs)
    refused = {name: values for name, values in differ.items() if name not in config.allow_differing}
    if refused:
        detail = "; ".join(f"{name}: {', '.join(repr(v) for v in values)}" for name, values in refused.items())
        raise UserError(f"the runs differ in more than their seeds ({detail}): a contrast of them would compare "
                        f"settings, not outcomes; give runs of one setting, or name what may differ with "
                        f"--allow-differing {' '.join(refused)} (recorded as confounders)")
    formable_groupings(runs, config)
    if "minority_amplification" in config.quantities:
        balanced = [str(run.run_dir) for run in runs if run.r == 0.5]
        if balanced:
            raise UserError(f"minority_amplification is undefined at r = 0.5 (no minority) in {', '.join(balanced)}; "
                            "compare --quantities grad_cos amplification instead")
    shared = set(runs[0].epochs)
    for run in runs[1:]:
        shared &= set(run.epochs)
    if not shared:
        raise UserError("the runs share no checkpoint epoch: "
                        + "; ".join(f"{run.run_dir}: {run.epochs[:3]}..{run.epochs[-1:]}" for run in runs))
    epochs = sorted(shared)
    if config.windows is not None:
        for text in config.windows:
            start, end = parse_window(text)
            if not any(start <= e and (end is None or e < end) for e in epochs):
                raise UserError(f"window {text} holds none of the runs' shared checkpoint epochs {epochs}")
    return epochs


def formable_groupings(runs: Sequence[RunSeries], config: ContrastConfig) -> tuple[tuple[str, ...], dict[str, str]]:
    """The groupings of ``config.by`` that leave at least 2 runs of each kind and sort them
    unlike an earlier grouping, and why each other one is not computed.

    Raises:
        UserError: When none can (naming the counts under each).
    """
    usable: list[str] = []
    skipped: dict[str, str] = {}
    counts: list[str] = []
    for by in config.by:
        leaving, staying = KINDS[by]
        n_left = sum(run.left(by) for run in runs)
        n_stayed = len(runs) - n_left
        counts.append(f"by {by!r} {n_left} {leaving} and {n_stayed} {staying}")
        same = [other for other in usable if all(run.left(other) == run.left(by) for run in runs)]
        if n_left < 2 or n_stayed < 2:
            skipped[by] = f"{n_left} {leaving} and {n_stayed} {staying}; a contrast needs at least 2 of each"
        elif same:
            # the same partition twice would be the same tests twice: Holm would pay for both
            skipped[by] = f"it sorts the runs exactly as by {same[0]!r}; its tests would repeat those"
        else:
            usable.append(by)
    if not usable:
        others = [b for b in KINDS if b not in config.by]
        hint = f"add runs, or try --by {' '.join(others)}" if others else "add runs"
        raise UserError(f"a contrast needs at least 2 runs of each kind; these {len(runs)} runs are "
                        f"{'; '.join(counts)} ({hint})")
    return tuple(usable), skipped


def default_windows(runs: Sequence[RunSeries], epochs: Sequence[int],
                    by: str) -> list[tuple[str, int, int | None]]:
    """The shortcut phase and phase 2 on (see the module docstring), or the whole run.

    The shortcut phase starts at the latest shortcut epoch of any run and ends before the
    earliest phase-2 onset of the leaving runs (their generalization epoch where no onset
    was detected). Where no shared checkpoint falls in it (some runs learn the shortcut
    after others leave it), the first window runs from the earliest shortcut epoch to that
    onset instead, named so, and failing that (or where runs have no shortcut, at r = 1/m)
    from the first epoch. A window that would hold no shared epoch is left out.
    """
    shortcut = [run.outcome.get("shortcut_epoch") for run in runs]
    starts = [run.outcome.get("phase2_onset_epoch") if run.outcome.get("phase2_onset_epoch") is not None
              else run.outcome.get("first_generalized_epoch") for run in runs if run.left(by)]
    whole: list[tuple[str, int, int | None]] = [("whole run", epochs[0], None)]
    if not starts or any(s is None for s in starts):
        return whole
    split = min(s for s in starts if s is not None)
    first_window: list[tuple[str, int]] = []
    has_shortcut = all(s is not None for s in shortcut)  # at r = 1/m there is no shortcut, so no phase 2
    if has_shortcut:
        first_window += [("shortcut phase", max(s for s in shortcut if s is not None)),
                         ("first shortcut to first onset", min(s for s in shortcut if s is not None))]
    first_window.append(("before the first onset", epochs[0]))
    windows: list[tuple[str, int, int | None]] = []
    for name, begin in first_window:
        if any(begin <= e < split for e in epochs):
            windows.append((name, int(begin), int(split)))
            break
    if any(e >= split for e in epochs):
        windows.append(("phase 2 on" if has_shortcut else "from the first onset", int(split), None))
    return windows or whole


def _stats(values: Sequence[float]) -> tuple[float, float, int]:
    """``(mean, sd, n)`` of the finite values (sd NaN below 2 of them)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return math.nan, math.nan, 0
    return statistics.fmean(finite), statistics.stdev(finite) if len(finite) > 1 else math.nan, len(finite)


def _median(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if finite else math.nan


def compute_contrast(runs: Sequence[RunSeries], config: ContrastConfig | None = None) -> ContrastResult:
    """Compare stored series of runs that left the shortcut with those that did not.

    Args:
        runs: Every run's :class:`RunSeries` holding ``config.quantities``.
        config: The settings (default :class:`ContrastConfig`).

    Returns:
        :class:`ContrastResult` (see the module docstring for what is computed).
    """
    from interp_toolkit.studies.common.statistics import holm_adjust, permutation_p, welch_interval

    config = ContrastConfig() if config is None else config
    runs = list(runs)
    missing = [f"{run.run_dir}: {q}" for run in runs for q in config.quantities if q not in run.values]
    if missing:
        raise UserError(f"series lack the quantities asked for: {', '.join(missing)}")
    epochs = check_contrast_inputs(runs, config)
    groupings, skipped = formable_groupings(runs, config)

    def value(run: RunSeries, quantity: str, epoch: int) -> float:
        return run.values[quantity][run.epochs.index(epoch)]

    def interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
        a, b = [v for v in a if math.isfinite(v)], [v for v in b if math.isfinite(v)]
        if len(a) < 2 or len(b) < 2:
            return math.nan, math.nan, math.nan
        return welch_interval(a, b)

    def medians(run: RunSeries, quantity: str, start: int, end: int | None) -> float:
        return _median([value(run, quantity, e) for e in epochs if start <= e and (end is None or e < end)])

    windows: dict[str, list[tuple[str, int, int | None]]] = {}
    by_epoch: list[dict[str, Any]] = []
    window_rows: list[dict[str, Any]] = []
    for by in groupings:
        left = [run for run in runs if run.left(by)]
        stayed = [run for run in runs if not run.left(by)]
        for quantity in config.quantities:
            for epoch in epochs:
                a = [value(run, quantity, epoch) for run in left]
                b = [value(run, quantity, epoch) for run in stayed]
                (mean_a, sd_a, n_a), (mean_b, sd_b, n_b) = _stats(a), _stats(b)
                diff, low, high = interval(a, b)
                by_epoch.append({"grouping": by, "epoch": epoch, "quantity": quantity, "mean_leaving": mean_a,
                                 "sd_leaving": sd_a, "n_leaving": n_a, "mean_staying": mean_b, "sd_staying": sd_b,
                                 "n_staying": n_b, "difference": diff, "ci_low": low, "ci_high": high})
        if config.windows is not None:
            windows[by] = []
            for text in config.windows:
                start, end = parse_window(text)
                windows[by].append((f"epochs {window_label(start, end)}", start, end))
        else:
            windows[by] = default_windows(runs, epochs, by)
        for quantity in config.quantities:
            for name, start, end in windows[by]:
                a = [medians(run, quantity, start, end) for run in left]
                b = [medians(run, quantity, start, end) for run in stayed]
                a, b = [v for v in a if math.isfinite(v)], [v for v in b if math.isfinite(v)]
                (mean_a, sd_a, n_a), (mean_b, sd_b, n_b) = _stats(a), _stats(b)
                diff, low, high = interval(a, b)
                p, smallest = permutation_p(a, b) if n_a >= 2 and n_b >= 2 else (math.nan, math.nan)
                window_rows.append({"grouping": by, "quantity": quantity, "window": name, "start": start, "end": end,
                                    "n_leaving": n_a, "n_staying": n_b, "mean_leaving": mean_a,
                                    "sd_leaving": sd_a, "mean_staying": mean_b, "sd_staying": sd_b,
                                    "difference": diff, "ci_low": low, "ci_high": high, "p": p,
                                    "smallest_p": smallest})
    # one family: every grouping, window and quantity computed is read together, so no
    # grouping can be quoted for being the one that came out significant
    testable = [i for i, row in enumerate(window_rows) if math.isfinite(row["p"])]
    adjusted = holm_adjust([window_rows[i]["p"] for i in testable]) if testable else []
    for tested in window_rows:
        tested["p_holm"] = math.nan
    for i, p_holm in zip(testable, adjusted, strict=True):
        window_rows[i]["p_holm"] = p_holm
    for tested in window_rows:
        # Holm rejects nothing unless the family's smallest p is below alpha / m; a test whose
        # group sizes cannot get there has no verdict either way
        if not math.isfinite(tested["p"]) or tested["smallest_p"] * max(1, len(testable)) >= config.alpha:
            tested["verdict"] = "too few runs"
        else:
            tested["verdict"] = "distinguishes" if tested["p_holm"] < config.alpha else "does not distinguish"

    kinds = {by: KINDS[by] for by in groupings}
    run_rows = []
    for run in runs:
        row: dict[str, Any] = {"run_dir": str(run.run_dir)}
        for by in groupings:
            row[f"kind_{by}"] = kinds[by][0] if run.left(by) else kinds[by][1]
        row.update({"r": run.r, "n_layers": run.n_layers, "shortcut_epoch": run.outcome.get("shortcut_epoch"),
                    "phase2_onset_epoch": run.outcome.get("phase2_onset_epoch"),
                    "first_generalized_epoch": run.outcome.get("first_generalized_epoch"),
                    "max_adv_acc": run.outcome.get("max_adv_acc")})
        for by in groupings:
            for quantity in config.quantities:
                for name, start, end in windows[by]:
                    row[f"{quantity}@{by}:{name}"] = medians(run, quantity, start, end)
        run_rows.append(row)
    return ContrastResult(config=config, runs=runs, groupings=groupings, skipped=skipped, kinds=kinds,
                          epochs=epochs, windows=windows, by_epoch=by_epoch, window_rows=window_rows,
                          run_rows=run_rows)


# --------------------------------------------------------------------------- files


def read_contrast(path: str | Path) -> ContrastResult:
    """Recompute a contrast from the JSON summary :func:`write_contrast` wrote (its series
    and settings), so the figure and tables regenerate without the runs.

    Raises:
        UserError: Naming the file when it is missing, not UTF-8 JSON, not a contrast
            summary (e.g. a run.json), fails the digest written with it (an edited value), or
            holds series that cannot have been written (a list of another length).
    """
    from interp_toolkit.io import read_digested_json

    path = Path(path)
    if path.is_dir():
        path = path / FILES["summary"]
    expected = f"the {FILES['summary']} of interp-toolkit mechanism-contrast"
    if not path.is_file():
        raise UserError(f"{path} does not exist (expected {expected})")
    data = read_digested_json(path, expected)
    if not isinstance(data.get("runs"), list) or not isinstance(data.get("config"), dict):
        raise UserError(f"{path} is not {expected}: it has no runs and config (keys: {', '.join(sorted(data))})")
    try:
        runs = [RunSeries.from_dict(run) for run in data["runs"]]
    except (KeyError, TypeError, ValueError, UserError, AttributeError) as err:
        raise UserError(f"{path} holds a run series that mechanism-contrast cannot have written ({err!s}); "
                        f"it is not {expected} as written") from err
    return compute_contrast(runs, ContrastConfig.from_dict(data["config"]))


__all__ = ["check_contrast_inputs", "compute_contrast", "contrast_runs", "default_windows", "formable_groupings",
           "expand_sources", "read_contrast"]
