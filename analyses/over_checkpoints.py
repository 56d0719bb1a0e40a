"""Run any analysis over the checkpoints of a training run, with a per-checkpoint cache.

``over_checkpoints(analysis, run_dir)`` loads every checkpoint (or the chosen epochs),
runs the analysis on it, stores each result in
``run_dir/analyses/<name>/cache/epoch_<epoch>_<key>.json`` where ``key`` hashes the
checkpoint file's bytes, the analysis name, version and config and the data, so a rerun
with the same settings is a cache hit and changing any of them recomputes (an analysis's
``version`` is bumped when its numbers change, so entries of older code are not served).
Each entry carries a digest of its content: an entry that is torn, not JSON, edited or
written without one is recomputed, with a one-line ``note:`` on stderr naming it.
It returns one table with an ``epoch`` column, written as ``<name>.csv`` and plotted as
``<name>.png`` (the run's accuracy curves on top, then the analysis's values on the same
epoch axis). Those names are the full result, over every checkpoint; a subset of the
checkpoints (``epochs=``, ``last=True``) is written as ``<name>_epochs_....csv`` / ``.png``
(:func:`selection_stem`) so it never overwrites the full result.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from interp_toolkit import __version__
from interp_toolkit.checkpoint import load_checkpoint
from interp_toolkit.errors import UserError
from interp_toolkit.io import (
    CheckpointCache,
    config_hash,
)
from interp_toolkit.progress import progress_bar
from interp_toolkit.runs import layout
from interp_toolkit.runs.layout import metrics_path
from interp_toolkit.runs.metrics import read_metrics
from interp_toolkit.runs.trainer import fingerprint, list_checkpoints

from ._common import AnalysisResult, Table, callable_module
from ._keys import callable_key as _callable_key
from ._keys import code_digest
from .ablation import ablation
from .fingerprints import fingerprints
from .gradients import gradient_conflict
from .near_misses import PLOT_FEATURES, near_misses
from .patching import minimal_pair_patching, resample_ablation_damage
from .weights import weight_norms


@dataclass(frozen=True)
class AnalysisSpec:
    """A registered analysis: how to run it and what to plot.

    Attributes:
        name: Registry name (``fingerprints``, ``ablation``, ``patching`` (minimal pairs),
            ``resample_ablation_damage`` (index-paired patching), ``gradients``,
            ``weight_norms``, ``near_misses``).
        fn: ``fn(model, splits, **config) -> AnalysisResult``.
        value_columns: Numeric columns plotted against epoch (one panel each).
        series_columns: Columns whose values identify one line.
        plot_filter: Only rows matching these column values are plotted (a tuple value:
            any of its values).
        version: Part of the cache key: bumped when the analysis's numbers or columns
            change, so cache entries written by earlier code are recomputed, not served.
        value_labels: Axis labels of value columns whose meaning is the analysis's own
            (default: :func:`interp_toolkit.plotting.label` of the column name).
        plot_relative: Plot each series over its value at the first checkpoint (a quantity
            whose relative change is the signal, e.g. weight norms).
        heatmaps: Draw the values as component x position heatmaps at chosen checkpoints
            (:func:`~interp_toolkit.analyses.heatmaps.plot_heatmaps_over_checkpoints`)
            instead of one line per series (patching: too many series for lines).
    """

    name: str
    fn: Callable[..., AnalysisResult]
    value_columns: tuple[str, ...]
    series_columns: tuple[str, ...]
    plot_filter: Mapping[str, Any] = field(default_factory=dict)
    version: int = 1
    value_labels: Mapping[str, str] = field(default_factory=dict)
    plot_relative: bool = False
    heatmaps: bool = False


ANALYSES: dict[str, AnalysisSpec] = {
    "fingerprints": AnalysisSpec("fingerprints", fingerprints,
                                 ("qk_rho", "ov_rho", "ov_data_rho", "first_share"), ("component",)),
    "ablation": AnalysisSpec("ablation", ablation, ("delta",), ("component", "split"),
                             {"metric": "accuracy"}),
    # version 2: a gap column, and normalized is NaN where |gap| is under the patching tolerance;
    # version 3: the raw change in the metric (patched - target), drawn beside normalized
    "patching": AnalysisSpec("patching", minimal_pair_patching, ("change", "normalized"), ("component", "position"),
                             version=3, heatmaps=True, value_labels={
                                 "change": "change in the pair logit difference\n(patched - target)",
                                 "normalized": "minimal-pair patching effect\n(0 none, 1 full)"}),
    "resample_ablation_damage": AnalysisSpec(
        "resample_ablation_damage", resample_ablation_damage, ("change", "normalized"), ("component", "position"),
        version=3, heatmaps=True, value_labels={
            "change": "change in the metric\n(patched - target)",
            "normalized": "resample-ablation damage:\nmetric shift toward source (0 none, 1 full)"}),
    "gradients": AnalysisSpec("gradients", gradient_conflict,
                              ("conflict_cos", "minority_amplification", "amplification", "anti_cos_mean"),
                              ("group",), version=2),  # 2: minority / minority_amplification columns
    "weight_norms": AnalysisSpec("weight_norms", weight_norms, ("norm",), ("group",), plot_relative=True),
    "near_misses": AnalysisSpec("near_misses", near_misses, ("accuracy", "n_wrong"), ("split", "feature", "value"),
                                {"split": "adv", "feature": PLOT_FEATURES}),
}


@dataclass
class CheckpointsResult:
    """What :func:`over_checkpoints` returns.

    Attributes:
        table: Every row of every checkpoint's result, with ``epoch`` first.
        csv_path, png_path: Files written (``png_path``, the figure in the chosen format, is
            None when ``plot=False``).
        computed, cache_hits: Epochs computed now and epochs read from the cache.
    """

    table: Table
    csv_path: Path | None
    png_path: Path | None
    computed: list[int]
    cache_hits: list[int]

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.table.rows

    def to_csv(self, path: str | Path) -> Path:
        return self.table.to_csv(path)

    def to_pandas(self) -> Any:
        """The table (one row per checkpoint and measured quantity) as a pandas DataFrame."""
        return self.table.to_pandas()


def splits_from_run(run_dir: str | Path) -> dict[str, Any]:
    """Rebuild a run's splits from ``run.json`` (``run_info["task"]``: an MPSP task or a
    custom task's factory and settings) and check that they are the data the run was
    trained on (same fingerprints)."""
    from interp_toolkit.runs.record import read_record, record_path, task_config
    from interp_toolkit.tasks.custom import task_splits

    record = read_record(run_dir)
    splits = dict(task_splits(task_config(run_dir)))
    expected = record.get("identity", {}).get("data", {})
    for name, split in splits.items():
        if name in expected and expected[name] != fingerprint(split):
            raise UserError(f"split {name!r} rebuilt from {record_path(run_dir)} does not match the run's data "
                             f"(fingerprint {fingerprint(split)} vs {expected[name]}); pass splits explicitly")
    return splits


def check_checkpoints_belong_to_run(run_dir: str | Path, checkpoints: Sequence[tuple[int, Path]]) -> None:
    """UserError if a checkpoint is not the run's (e.g. a mod-3 checkpoint copied beside a
    parity run's record, in either checkpoint format: its analysis would run on the wrong
    task's data); :func:`interp_toolkit.runs.record.check_checkpoint_belongs` per file."""
    from interp_toolkit.runs.record import check_checkpoint_belongs

    for _, path in checkpoints:
        check_checkpoint_belongs(path, run_dir)


def _resolve(analysis: str | Callable[..., AnalysisResult], name: str | None) -> tuple[str, AnalysisSpec]:
    if isinstance(analysis, str):
        if analysis not in ANALYSES:
            raise UserError(f"unknown analysis {analysis!r}; expected one of {sorted(ANALYSES)} or a callable")
        spec = ANALYSES[analysis]
        return name or spec.name, spec
    if not callable(analysis):
        raise UserError(f"analysis must be a name in {sorted(ANALYSES)} or a callable, got {analysis!r}")
    base = analysis.func if isinstance(analysis, functools.partial) else analysis
    for spec in ANALYSES.values():
        if spec.fn is base:
            label = name or spec.name
            return label, AnalysisSpec(label, analysis, spec.value_columns, spec.series_columns, spec.plot_filter,
                                       spec.version)
    label = name or str(getattr(base, "__name__", "analysis"))
    return label, AnalysisSpec(label, analysis, (), ())


def _check_config(label: str, fn: Callable[..., Any], config: Mapping[str, Any]) -> None:
    """ValueError naming config keys the analysis does not accept (before any work)."""
    import inspect

    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins or exotic callables: let the call decide
        return
    params = list(signature.parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    accepted = [p.name for p in params[2:] if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                          inspect.Parameter.KEYWORD_ONLY)]
    unknown = sorted(set(config) - set(accepted))
    if unknown:
        raise UserError(f"analysis {label!r} does not accept config keys {unknown}; expected a subset of {accepted}")


def over_checkpoints(
    analysis: str | Callable[..., AnalysisResult],
    run_dir: str | Path,
    splits: Mapping[str, Any] | None = None,
    epochs: Sequence[int] | None = None,
    config: Mapping[str, Any] | None = None,
    name: str | None = None,
    out_dir: str | Path | None = None,
    plot: bool = True,
    progress: bool = True,
    device: str | None = None,
    figure_format: str = "png",
    version: int | None = None,
    last: bool = False,
) -> CheckpointsResult:
    """Run ``analysis`` on every checkpoint of ``run_dir`` (or the given ``epochs``).

    Args:
        analysis: A registered name (``fingerprints``, ``ablation``, ``patching``,
            ``resample_ablation_damage``, ``gradients``, ``weight_norms``, ``near_misses``) or a callable
            ``fn(model, splits, **config) -> AnalysisResult``.
        run_dir: A run directory written by :func:`interp_toolkit.train`.
        splits: The data (default: rebuilt from the run's ``run.json``).
        epochs: Checkpoint epochs to analyse (default: all).
        config: Keyword arguments of the analysis (JSON-able; part of the cache key).
        name: Name of the outputs (default: the analysis name).
        out_dir: Where the cache, CSV and PNG go (default ``run_dir/analyses/<name>``). Every
            checkpoint of the run gives ``<name>.csv`` and ``<name>.png``; a subset (``epochs``,
            ``last``) gives ``<name>_epochs_...`` beside them (:func:`selection_stem`), never
            overwriting the full result. Per-checkpoint cache entries are shared by both.
        plot: Also write the PNG.
        progress: Show a progress bar (plain lines where stderr is not a terminal) over checkpoints.
        device: Where to load each checkpoint (default CPU); not part of the cache key.
        figure_format: ``png``, ``svg`` or ``pdf`` (the figure's file suffix).
        version: The analysis's version, a positive int in the cache key (default: the
            registered analysis's ``AnalysisSpec.version``, 1 for a callable). Bump it when
            you change a callable's code, so its cached results are recomputed.
        last: Only the run's last checkpoint (not with ``epochs``).

    Returns:
        :class:`CheckpointsResult`.
    """
    from interp_toolkit.plotting import check_format, save_figure

    figure_format = check_format(figure_format)
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
        raise UserError(f"version must be a positive int (the analysis's cache version), got {version!r}")
    label, spec = _resolve(analysis, name)
    if version is not None:
        spec = dataclasses.replace(spec, version=version)
    if last and epochs is not None:
        raise UserError(f"last and epochs ({list(epochs)}) are exclusive: the last checkpoint or the given epochs")
    run_dir = Path(run_dir)
    config = dict(config or {})
    try:
        json.dumps(config)
    except TypeError as err:
        raise UserError(f"analysis config must be JSON-serializable (it is part of the cache key): {err}") from err
    _check_config(label, spec.fn, config)
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        raise UserError(f"{run_dir} has no checkpoints (expected {run_dir}/checkpoints/epoch_*.safetensors)")
    if epochs is not None:
        available = dict(checkpoints)
        missing = [e for e in epochs if e not in available]
        if missing:
            raise UserError(f"no checkpoint for epochs {missing} in {run_dir}; available epochs: {sorted(available)}")
        checkpoints = [(e, available[e]) for e in sorted(set(epochs))]
    all_epochs = [epoch for epoch, _ in list_checkpoints(run_dir)]
    if last:
        checkpoints = checkpoints[-1:]
    stem = selection_stem(label, [epoch for epoch, _ in checkpoints], all_epochs)
    check_checkpoints_belong_to_run(run_dir, checkpoints)
    if splits is None:
        splits = splits_from_run(run_dir)
    data_key = {split_name: fingerprint(split) for split_name, split in sorted(splits.items())}
    fn_key = _callable_key(spec.fn)
    base = spec.fn
    while isinstance(base, functools.partial):
        base = base.func
    if not any(registered.fn is base for registered in ANALYSES.values()):
        fn_key["code"] = code_digest(base)  # your own analysis: an edit to it recomputes, never serves stale
    out_dir = Path(out_dir) if out_dir is not None else run_dir / layout.ANALYSES / label
    cache = CheckpointCache(out_dir / "cache", label)
    settings = {"analysis": label, "version": spec.version, "fn": fn_key, "config": config, "data": data_key}

    rows: list[dict[str, Any]] = []
    computed, hits = [], []
    for epoch, path in progress_bar(checkpoints, desc=f"{label} over checkpoints", disable=not progress):
        cache_path = cache.path(epoch, path, settings)
        entry = cache.read(cache_path, epoch)
        cached = entry.get("rows") if entry is not None else None
        if entry is not None and not isinstance(cached, list):
            cache.rejected.append(f"epoch {epoch} (not a cache entry)")
        # an entry written before the analysis gained a value column is stale, not a hit
        if isinstance(cached, list) and all(column in row for row in cached for column in spec.value_columns):
            epoch_rows = _in_column_order(cached, entry.get("columns") if entry is not None else None)
            hits.append(epoch)
        else:
            model, _ = load_checkpoint(path, device=device)
            result = spec.fn(model, splits, **config)
            epoch_rows = [{"epoch": epoch, **row} for row in result.rows]
            # JSON objects are written with sorted keys: the column order is kept beside the rows
            cache.write(cache_path, {
                "epoch": epoch, "checkpoint": path.name, "analysis": label, "version": spec.version,
                "written_by": f"interp-toolkit {__version__}", "config": config,
                "columns": Table(epoch_rows).columns, "rows": epoch_rows})
            computed.append(epoch)
        rows.extend(epoch_rows)
    cache.report()
    table = Table(rows)
    csv_path = table.to_csv(out_dir / f"{stem}.csv")
    png_path = None
    if plot:
        png_path = save_figure(plot_over_checkpoints(table, run_dir, spec), out_dir / f"{stem}.{figure_format}")
    return CheckpointsResult(table, csv_path, png_path, computed, hits)


def selection_stem(label: str, selected: Sequence[int], all_epochs: Sequence[int]) -> str:
    """The file name (without suffix) of an analysis over the ``selected`` checkpoint epochs:
    ``<label>`` for every checkpoint of the run, else ``<label>_epochs_<e1>_<e2>...`` (up to
    four epochs) or ``<label>_epochs_<first>-<last>_<n>_<hash>`` (more), so that an analysis
    of a subset never overwrites the full one (nor one of another subset)."""
    selected = sorted(set(selected))
    if selected == sorted(set(all_epochs)):
        return label
    if len(selected) <= 4:
        return f"{label}_epochs_{'_'.join(str(epoch) for epoch in selected)}"
    return f"{label}_epochs_{selected[0]}-{selected[-1]}_{len(selected)}_{config_hash(selected)[:8]}"


def _in_column_order(rows: list[dict[str, Any]], columns: Sequence[str] | None) -> list[dict[str, Any]]:
    """Cached rows with their columns in the order the analysis returned them (``columns``
    stored with the entry); entries written without it get ``epoch`` first."""
    order = list(columns) if columns else ["epoch"]
    return [{**{c: row[c] for c in order if c in row}, **row} for row in rows]


def series_key(row: Mapping[str, Any], spec: AnalysisSpec, column: str) -> str:
    """The name of the line a row belongs to: its ``series_columns`` values joined by spaces
    (the column's name when the analysis has none). :func:`plot_over_checkpoints` tags each
    line it draws with ``"<column>:<key>"`` (:func:`interp_toolkit.plotting.drawn_series`)."""
    return " ".join(str(row.get(c)) for c in spec.series_columns) or column


def plotted_series(table: Table, spec: AnalysisSpec, column: str) -> dict[str, tuple[list[int], list[float]]]:
    """Every series of ``column`` the figure is meant to show: rows passing ``plot_filter``
    with a numeric value, grouped by :func:`series_key` (NaN values kept: they break a line)."""
    lines: dict[str, tuple[list[int], list[float]]] = {}
    for row in table.rows:
        if any((row.get(k) not in v) if isinstance(v, tuple) else (row.get(k) != v)
               for k, v in spec.plot_filter.items()):
            continue
        value = row.get(column)
        if not isinstance(value, (int, float)):
            continue
        xs, ys = lines.setdefault(series_key(row, spec, column), ([], []))
        xs.append(row["epoch"])
        ys.append(float(value))  # NaN stays: the line breaks there instead of bridging a blank value
    return lines


#: Most lines in one panel: beyond it a panel is split in parts, so colours never repeat.
MAX_LINES_PER_PANEL = 20
#: Most panels of one figure (besides the accuracy panel); series beyond are named in the
#: figure as not shown.
MAX_PANELS = 24


#: Panel titles of the component kinds (:func:`interp_toolkit.plotting.component_kind`).
PANEL_TITLES = {"head": "attention heads", "attn": "attention layers", "mlp": "MLPs", "embed": "embeddings",
                "model": "whole model and other groups", "resid_pre": "residual stream", "resid": "residual stream"}


@dataclass
class _Panel:
    column: str
    kind: str
    title: str
    lines: list[tuple[str, list[int], list[float]]] = field(default_factory=list)


def _panels(table: Table, spec: AnalysisSpec, columns: Sequence[str]) -> tuple[list[_Panel], list[str]]:
    """Lines grouped into panels, one per (value column, component kind[, position]), split
    into parts of :data:`MAX_LINES_PER_PANEL`; and the series blank at every checkpoint."""
    from interp_toolkit.plotting import component_kind

    kind_of: dict[str, str] = {}
    position_of: dict[str, str] = {}
    for row in table.rows:
        name = str(row.get(spec.series_columns[0])) if spec.series_columns else ""
        key = " ".join(str(row.get(c)) for c in spec.series_columns)
        kind_of[key] = str(row["kind"]) if "kind" in row and row["kind"] else component_kind(name)
        if "position" in spec.series_columns:
            position_of[key] = str(row.get("position"))
    many_positions = len(set(position_of.values())) > 1
    panels: list[_Panel] = []
    blank: list[str] = []
    for column in columns:
        groups: dict[tuple[str, str], list[tuple[str, list[int], list[float]]]] = {}
        for key, (xs, ys) in plotted_series(table, spec, column).items():
            if all(math.isnan(y) for y in ys):
                blank.append(f"{column}:{key}")
                continue
            group = (kind_of.get(key, "model"), position_of.get(key, "") if many_positions else "")
            groups.setdefault(group, []).append((key, xs, ys))
        for (kind, position), lines in groups.items():
            parts = [lines[i:i + MAX_LINES_PER_PANEL] for i in range(0, len(lines), MAX_LINES_PER_PANEL)]
            for number, part in enumerate(parts, start=1):
                title = PANEL_TITLES.get(kind, kind)
                if position:
                    title += f", position {position}"
                if len(parts) > 1:
                    title += f" (part {number} of {len(parts)})"
                panels.append(_Panel(column, kind, title, part))
    return panels, blank


def _value_label(spec: AnalysisSpec, column: str, relative: bool) -> str:
    from interp_toolkit.plotting import label

    text = spec.value_labels.get(column, label(column))
    return f"{text}\n/ its value at the first checkpoint" if relative else text


def plot_over_checkpoints(table: Table, run_dir: str | Path, spec: AnalysisSpec, ax: Any = None) -> Any:
    """Accuracy curves of the run on top, then the analysis's values, on a shared epoch axis
    (an analysis with ``spec.heatmaps``, without ``ax``: component x position heatmaps at
    chosen checkpoints instead).

    Every series of the table is drawn: one panel per value column and component kind
    (heads, attention layers, MLPs, whole model ...; per position when the rows vary in
    position), a panel of more than :data:`MAX_LINES_PER_PANEL` lines split in parts, so
    no colour repeats within a panel. A new figure has one row per value column with its
    kinds side by side (:data:`MAX_COLUMNS`), under the accuracies. Colour names the
    component, line style the split (:data:`interp_toolkit.plotting.SPLIT_LINESTYLES`) or a
    head's QK (solid) / OV (dashed) group; legends sit outside the data (above a panel,
    right of the accuracies). Whatever is not drawn (series blank at every
    checkpoint, panels beyond :data:`MAX_PANELS`) is named in the figure. An analysis with
    ``AnalysisSpec.plot_relative`` (weight norms) shows each series over its first value.

    Args:
        table: Rows of :func:`over_checkpoints` (an ``epoch`` column plus the analysis's).
        run_dir: The run (its ``metrics.jsonl`` gives the accuracy panel).
        spec: Which columns to plot and how to group rows into lines.
        ax: Optional sequence of axes to draw into, one for the accuracies and one per panel
            (:func:`over_checkpoints_panel_count`).

    Returns:
        The :class:`matplotlib.figure.Figure` drawn on.
    """
    if spec.heatmaps and ax is None:
        from .heatmaps import plot_heatmaps_over_checkpoints

        return plot_heatmaps_over_checkpoints(table, run_dir, spec)
    from interp_toolkit.plotting import (
        component_colors,
        epoch_axis,
        legend_outside,
        new_panels,
        note_not_shown,
        plot_accuracies,
        split_linestyle,
        style,
        tag_series,
    )

    columns = _plot_columns(table, spec)
    metrics = read_metrics(metrics_path(run_dir))
    panels, blank = _panels(table, spec, columns)
    left_out = [f"{panel.column}:{key}" for panel in panels[MAX_PANELS:] for key, _, _ in panel.lines]
    panels = panels[:MAX_PANELS]

    def base(key: str) -> str:
        return key.split(" ")[0].split(".")[0]

    def linestyle(key: str) -> str:
        if "split" in spec.series_columns:
            return split_linestyle(key.split(" ")[spec.series_columns.index("split")])
        return "--" if key.split(" ")[0].endswith(".OV") else "-"

    colors = component_colors(base(key) for panel in panels for key, _, _ in panel.lines)
    with style():
        if ax is None:
            fig, axes, below = _grid_figure(panels)
        else:
            fig, axes = new_panels(len(panels) + 1, ax)
            below = {i: i < len(panels) for i in range(len(panels) + 1)}  # one column: each panel above the next
        top = axes[0]
        epochs_seen: list[float] = plot_accuracies(top, metrics)
        top.set_title(f"{spec.name} over checkpoints: {Path(run_dir).name}")
        zero_start: list[str] = []  # no relative change to show: named in the figure, not dropped silently
        for panel, info in zip(axes[1:], panels, strict=True):
            for key, xs, ys in info.lines:
                if spec.plot_relative:
                    first = next(y for y in ys if not math.isnan(y))
                    if first == 0:
                        zero_start.append(f"{info.column}:{key}")
                        continue
                    ys = [y / first for y in ys]
                epochs_seen += xs
                tag_series(panel.plot(xs, ys, marker=".", markersize=3, label=key, color=colors[base(key)],
                                      ls=linestyle(key))[0], f"{info.column}:{key}")
            panel.set_ylabel(_value_label(spec, info.column, spec.plot_relative))
            if spec.plot_relative:
                panel.axhline(1, color="grey", lw=0.5)
            elif info.column.endswith("_rho") or info.column.endswith("_cos"):
                panel.axhline(0, color="grey", lw=0.5)
        legend_outside(top)
        shown: dict[str, list[str]] = {}  # per panel title: the legend entries drawn last
        for panel, info in zip(axes[1:], panels, strict=True):
            labels = panel.get_legend_handles_labels()[1]
            if labels and shown.get(info.title) != labels:
                # above the panel, outside the data; a panel showing the same lines as the one
                # before it of its kind names only its kind
                panel.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=min(4, len(labels)),
                             frameon=False, fontsize="x-small", title=info.title, title_fontsize="small",
                             alignment="left", borderaxespad=0.2, handlelength=2.0, columnspacing=1.0)
                shown[info.title] = labels
            else:
                panel.set_title(info.title, fontsize="small", loc="left")
        for index, panel in enumerate(axes):
            epoch_axis(panel, epochs_seen)
            if below[index]:
                panel.set_xlabel("")
        note_not_shown(fig, blank, "blank (NaN) at every checkpoint")
        note_not_shown(fig, zero_start, "0 at the first checkpoint, so no relative change (read them in the CSV)")
        note_not_shown(fig, left_out, f"beyond the figure's {MAX_PANELS} panels (read them in the CSV)")
    return fig


#: Most panels side by side in one row of the over-checkpoints figure.
MAX_COLUMNS = 4


def _grid_figure(panels: Sequence[_Panel]) -> tuple[Any, list[Any], dict[int, bool]]:
    """A new figure: the accuracies across the top, then one row per value column with its
    kinds side by side (at most :data:`MAX_COLUMNS`, wrapping), all on one epoch axis.
    Returns ``(figure, axes, below)``, ``below[i]``: another panel sits under axes ``i``."""
    from interp_toolkit.plotting import figure

    by_column: dict[str, int] = {}
    for info in panels:
        by_column[info.column] = by_column.get(info.column, 0) + 1
    ncols = max(1, min(MAX_COLUMNS, max(by_column.values(), default=1)))
    slots: list[tuple[int, int]] = []
    row = 1
    for count in by_column.values():
        slots += [(row + i // ncols, i % ncols) for i in range(count)]
        row += -(-count // ncols)
    fig = figure(figsize=(3.6 * ncols + 1.6, 1.4 + 2.6 * row), layout="constrained")
    grid = fig.add_gridspec(row, ncols)
    top = fig.add_subplot(grid[0, :])
    axes = [top] + [fig.add_subplot(grid[r, c], sharex=top) for r, c in slots]
    occupied = set(slots)
    below = {0: bool(slots)}
    below.update({i + 1: any((r2, c) in occupied for r2 in range(r + 1, row)) for i, (r, c) in enumerate(slots)})
    return fig, axes, below


def _plot_columns(table: Table, spec: AnalysisSpec) -> list[str]:
    return list(spec.value_columns) or [
        c for c in table.columns if c != "epoch" and all(isinstance(v, (int, float)) for v in table.column(c))][:3]


def over_checkpoints_panel_count(table: Table, spec: AnalysisSpec) -> int:
    """How many axes :func:`plot_over_checkpoints` draws for ``table`` (accuracy panel
    included), e.g. to pass your own ``ax``."""
    return 1 + min(MAX_PANELS, len(_panels(table, spec, _plot_columns(table, spec))[0]))


__all__ = ["ANALYSES", "MAX_COLUMNS", "MAX_LINES_PER_PANEL", "MAX_PANELS", "AnalysisResult", "AnalysisSpec",
           "CheckpointsResult", "Table", "check_checkpoints_belong_to_run", "code_digest", "over_checkpoints",
           "over_checkpoints_panel_count", "plot_over_checkpoints", "plotted_series", "series_key",
           "splits_from_run"]

callable_module(__name__)  # ``from interp_toolkit.analyses import over_checkpoints`` is callable either way
