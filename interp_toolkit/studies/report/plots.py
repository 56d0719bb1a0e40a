"""The report's figures: generalization rate vs r per architecture (the headline figure) and
every seed's learning curves, a panel per cell."""

from __future__ import annotations

import math
import textwrap
from typing import Any, Mapping, Sequence

from interp_toolkit.errors import UserError
from interp_toolkit.runs.metrics import read_run_metrics
from interp_toolkit.studies.common.statistics import wilson_interval
from interp_toolkit.studies.grid.cells import (
    cell_fields,
    cell_key,
    format_setting,
    hashable,
    sort_key,
    varying_fields,
)
from interp_toolkit.studies.report.tables import ReferenceRate


def _arch_label(row: Mapping[str, Any], vary_task: bool, vary_wd: bool) -> str:
    label = f"{row.get('n_layers')}L {row.get('n_heads')}H"
    if vary_wd:
        label += f" wd {format_setting('weight_decay', row.get('weight_decay'))}"
    if vary_task:
        label = f"{row.get('task')} {label}"
    return label


def _regime_label(row: Mapping[str, Any], fields: Sequence[str]) -> str:
    return ", ".join(f"{k} {format_setting(k, row.get(k))}" for k in fields)


#: Marker shapes of the regimes in the rate plot (colour is the architecture).
_REGIME_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


RATE_AXES = ("full", "categorical")
RATE_LAYOUTS = ("auto", "markers", "forest")


def plot_rate_vs_r(table: Sequence[Mapping[str, Any]], ax: Any = None, x_axis: str = "full",
                   references: Sequence[ReferenceRate] = (), layout: str = "auto") -> Any:
    """Generalization rate vs r, one marker series per architecture, with Wilson intervals.

    Only the r values that were run are drawn, as markers with their 95% Wilson interval:
    no line joins two r values (nothing was measured in between). One colour per
    architecture (layers x heads, and task / weight decay when they vary); when regime
    settings vary (sequence length, n_train, epochs, ...) each regime has its own marker
    shape. A dashed vertical line marks chance, r = 1/m for a task modulo m, where the
    shortcut carries no information about the label (the generalization split flips there).

    Args:
        table: Rows of ``table.csv`` (:func:`rate_table`, or ``Table.from_csv`` of it; rows
            of older tables without the regime columns work too).
        ax: Optional axes to draw into.
        x_axis: ``"full"``: the r axis is [0, 1] to scale, with a chance line for every task
            modulus in the data; ``"categorical"``: the measured r values evenly spaced, with
            the chance line only where 1/m is one of them.
        references: Published rates (e.g. :data:`PAPER_HEADLINE_RATES`): each one whose cell
            is in the table is drawn beside it as a hollow marker with its Wilson interval, in
            the architecture's colour.
        layout: ``"markers"``: the plot above; ``"forest"``: a row per cell (architecture and
            regime), the rate on x (:func:`~interp_toolkit.studies.report.forest.plot_rate_forest`),
            which stays readable with dozens of regimes; ``"auto"``: the forest when there are more
            regimes than marker shapes and no single ``ax`` was passed, the markers otherwise.

    A cell with near misses (``n_near_misses``: runs within 1 point of the criterion, which
    the rate does not count) gets a larger hollow marker at (generalized + near misses) /
    seeds labelled ``+k near``, so it reads apart from a cell whose runs never left the
    shortcut.

    Returns:
        The :class:`matplotlib.figure.Figure` drawn on.
    """
    from interp_toolkit.plotting import PALETTE, new_figure, style
    from interp_toolkit.tasks.mpsp import TASKS, task_modulus

    if x_axis not in RATE_AXES:
        raise UserError(f"plot_rate_vs_r x_axis must be one of {RATE_AXES}, got {x_axis!r}")
    if layout not in RATE_LAYOUTS:
        raise UserError(f"plot_rate_vs_r layout must be one of {RATE_LAYOUTS}, got {layout!r}")
    if not table:
        raise UserError("plot_rate_vs_r needs at least one table row, got none")
    vary_task = len({row.get("task") for row in table}) > 1
    vary_wd = len({hashable(row.get("weight_decay")) for row in table}) > 1
    regime_fields = varying_fields(table)
    series: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in table:
        key = (_arch_label(row, vary_task, vary_wd), _regime_label(row, regime_fields))
        series.setdefault(key, []).append(row)
    archs = sorted({arch for arch, _ in series})
    regimes = sorted({regime for _, regime in series})
    # Published rates: per reference, one row per architecture whose cell it matches.
    published_rows: dict[str, list[Mapping[str, Any]]] = {}
    for ref in references:
        arch_rows = {_arch_label(row, vary_task, vary_wd): row for row in table if ref.matches(row)}
        for arch, row in sorted(arch_rows.items()):
            low, high = wilson_interval(ref.k, ref.n)
            published_rows.setdefault(arch, []).append(
                {"r": row["r"], "rate": ref.k / ref.n, "wilson_low": low, "wilson_high": high, "n_seeds": ref.n,
                 "n_generalized": ref.k})
    if layout == "forest" or (layout == "auto" and ax is None and len(regimes) > len(_REGIME_MARKERS)):
        from interp_toolkit.studies.report.forest import plot_rate_forest

        return plot_rate_forest(series, ax=ax, published=published_rows)
    # The published rates: one more series per architecture, beside the measured ones at its r.
    published = "\uffffpublished"  # sorts after every regime label: drawn right of the measured
    for arch, rows in published_rows.items():
        series[arch, published] = rows
    colors = {arch: PALETTE[i % len(PALETTE)] for i, arch in enumerate(archs)}
    markers = {regime: _REGIME_MARKERS[i % len(_REGIME_MARKERS)] for i, regime in enumerate(regimes)}
    def r_key(r: float) -> float:
        return round(float(r), 9)  # one key per r, whatever its float spelling in the table

    r_values = sorted({r_key(row["r"]) for row in table})
    position = {r: float(i) for i, r in enumerate(r_values)}

    def x_of(r: float) -> float:
        return position[r_key(r)] if x_axis == "categorical" else float(r)

    # Side-by-side offsets keep overlapping intervals visible, within a fixed total width; the
    # series measured at one r are centred on it, whichever other r values they lack.
    keys_at: dict[float, list[tuple[str, str]]] = {}
    for key in sorted(series):
        for row in series[key]:
            keys_at.setdefault(r_key(row["r"]), []).append(key)
    most = max(len(keys) for keys in keys_at.values())
    width = 0.6 if x_axis == "categorical" else 0.06
    step = min(width / 4, width / max(most - 1, 1))

    def offset_of(key: tuple[str, str], r: float) -> float:
        keys = keys_at[r_key(r)]
        return (keys.index(key) - (len(keys) - 1) / 2) * step

    with style():
        from matplotlib.lines import Line2D

        own_figure = ax is None
        fig, ax = new_figure(ax, figsize=(8.0, 3.8))
        handles = []
        near_drawn = False
        moduli = sorted({task_modulus(row["task"]) for row in table if row.get("task") in TASKS})
        for modulus in moduli:
            chance = 1.0 / modulus
            if x_axis == "categorical":
                hits = [r for r in r_values if abs(r - chance) < 1e-6]
                if not hits:
                    continue
                chance = position[hits[0]]
            handles.append(ax.axvline(chance, color="grey", lw=0.9, ls="--", zorder=0,
                                      label=f"chance r = 1/{modulus}: shortcut\nuncorrelated with the label"))
        for (arch, regime), rows in sorted(series.items()):
            rows = sorted(rows, key=lambda row: row["r"])
            xs = [x_of(row["r"]) + offset_of((arch, regime), row["r"]) for row in rows]
            ys = [row["rate"] for row in rows]
            lower = [row["rate"] - row["wilson_low"] for row in rows]
            upper = [row["wilson_high"] - row["rate"] for row in rows]
            if regime == published:
                ax.errorbar(xs, ys, yerr=[lower, upper], marker="h", ls="none", capsize=4, color=colors[arch],
                            markerfacecolor="white", elinewidth=0.9, label=f"{arch} (published)")
                continue
            ax.errorbar(xs, ys, yerr=[lower, upper], marker=markers[regime], ls="none", capsize=4,
                        color=colors[arch], label=f"{arch} ({regime})" if regime else arch)
            # Near misses (within 1 point of the criterion, not counted in the rate): a hollow
            # marker at (generalized + near misses) / seeds, labelled with their count, so a
            # cell of near misses reads apart from one whose runs never left the shortcut.
            for x, row in zip(xs, rows, strict=True):
                near = int(row.get("n_near_misses") or 0)
                if near:
                    y = (row["n_generalized"] + near) / row["n_seeds"]
                    ax.plot([x], [y], marker=markers[regime], ls="none", color=colors[arch],
                            markerfacecolor="none", markersize=9, zorder=3)
                    ax.annotate(f"+{near} near", (x, y), xytext=(4, 3), textcoords="offset points",
                                fontsize="x-small", color=colors[arch])
                    near_drawn = True
        # The legend names each colour (architecture) once and each marker shape (regime)
        # once, so it stays short however many regimes there are.
        for arch in archs:
            seeds = sorted({int(row["n_seeds"]) for (a, regime), rows in series.items()
                            if a == arch and regime != published for row in rows})
            n_text = f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
            handles.append(Line2D([], [], color=colors[arch], marker="o" if len(regimes) > 1 else markers[regimes[0]],
                                  ls="none", label=f"{arch}: n = {n_text} seeds per r"))
        if len(regimes) > 1:
            handles += [Line2D([], [], color="black", marker=markers[regime], ls="none",
                               label=textwrap.fill(regime, 36)) for regime in regimes]
        if near_drawn:
            handles.append(Line2D([], [], color="black", marker="o", markerfacecolor="none", markersize=9, ls="none",
                                  label=textwrap.fill("+k near: runs within 1% of the criterion (not in the rate), "
                                                      "drawn at (generalized + k) / n", 36)))
        # published rates: one key entry per architecture, in the colour its markers are drawn in
        for arch in archs:
            if (arch, published) not in series:
                continue
            counts = ", ".join(f"{round(row['rate'] * row['n_seeds'])}/{row['n_seeds']} at r = {row['r']:g}"
                               for row in sorted(series[arch, published], key=lambda row: row["r"]))
            handles.append(Line2D([], [], color=colors[arch], marker="h", markerfacecolor="white", ls="none",
                                  label=textwrap.fill(f"{arch}: published rate, beside its cell ({counts})", 36)))
        ax.set(xlabel="spurious ratio r (training)", ylabel="fraction of seeds that generalized",
               ylim=(-0.03, 1.03), title="MPSP generalization rate (95% Wilson intervals)")
        if x_axis == "categorical":
            ax.set_xlim(-0.6, len(r_values) - 0.4)
            ax.set_xticks([position[r] for r in r_values], [f"{r:.3g}" for r in r_values])
        else:
            ax.set_xlim(0.0, 1.0)
            ax.set_xticks(sorted({0.0, 1.0, *r_values}))
            ax.set_xticklabels([f"{t:.3g}" for t in sorted({0.0, 1.0, *r_values})])
        ax.grid(axis="x", visible=False)
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")  # beside the data
        if own_figure:
            # a key of many regimes is taller than 3.8 in; the figure grows with it (~0.2 in per
            # line of small text) so that constrained layout does not squash the axes to fit
            key_lines = sum(handle.get_label().count("\n") + 1 for handle in handles)
            fig.set_size_inches(8.0, max(3.8, 0.2 * key_lines + 1.0))
    return fig


def plot_curves_by_cell(rows: Sequence[Mapping[str, Any]], ax: Any = None) -> Any:
    """Adversarial (solid) and validation (dashed) accuracy of every seed, a panel per cell.

    A seed has the same colour in every panel; the epoch axis is log-scaled.

    Args:
        rows: Outcome rows (:func:`collect_runs`); each names its ``run_dir``, whose
            ``metrics.jsonl`` is read.
        ax: Optional sequence of one axes per cell (cells in sorted order).

    Returns:
        The :class:`matplotlib.figure.Figure` drawn on.
    """
    from matplotlib.lines import Line2D

    from interp_toolkit.plotting import (
        component_colors,
        epoch_axis,
        legend_outside,
        mpsp_split_label,
        new_panels,
        note_not_shown,
        split_linestyle,
        style,
    )

    cells: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    fields = cell_fields(rows)
    for row in rows:
        cells.setdefault(cell_key(row, fields), []).append(row)
    keys = sorted(cells, key=sort_key)
    regime_fields = varying_fields(rows)
    ncols = min(4, len(keys))
    seed_colors = component_colors(f"seed {row['seed']}" for row in rows)
    with style():
        fig, axes = new_panels(len(keys), ax, ncols=ncols,
                               figsize=(3.4 * ncols, 2.7 * math.ceil(len(keys) / ncols)))
        empty: list[str] = []
        for panel, key in zip(axes, keys, strict=True):
            cell = dict(zip(fields, key, strict=True))
            epochs_seen: list[float] = []
            for row in sorted(cells[key], key=lambda r: sort_key([r.get("seed")])):
                metrics = read_run_metrics(row["run_dir"])
                epochs = [m["epoch"] for m in metrics]
                epochs_seen += epochs
                color = seed_colors[f"seed {row['seed']}"]
                panel.plot(epochs, [m["adv_acc"] for m in metrics], color=color, lw=1, ls=split_linestyle("adv"))
                panel.plot(epochs, [m["val_acc"] for m in metrics], color=color, lw=0.8, ls=split_linestyle("val"),
                           alpha=0.6)
            title = (f"{cell['n_layers']}L{cell['n_heads']}H r={cell['r']:g} "
                     f"wd={format_setting('weight_decay', cell['weight_decay'])}")
            # Wrapped to the panel's width (36 characters of 8-point text fit a 3.4-inch panel; 44
            # ran into the next panel's title): long study names otherwise overlap.
            regime = "\n".join(textwrap.wrap(" ".join(f"{k}={format_setting(k, cell[k])}" for k in regime_fields),
                                             width=36))
            panel.set_title(f"{title}\n{regime}" if regime else title, fontsize=8 if regime else None)
            panel.set_ylim(-0.03, 1.03)
            epoch_axis(panel, epochs_seen)
            if not epochs_seen:  # runs that have not evaluated yet: say so, not an empty frame
                panel.text(0.5, 0.5, "no evaluations yet", transform=panel.transAxes, ha="center", va="center")
                empty.append(title)
        axes[0].set_ylabel("accuracy (adversarial solid,\nvalidation dashed)")
        # one key for the figure, right of the first row: line style = split, colour = seed
        legend_key = [Line2D([], [], color="black", ls=split_linestyle(split), label=mpsp_split_label(split))
                      for split in ("adv", "val")]
        legend_key += [Line2D([], [], color=color, label=seed) for seed, color in seed_colors.items()]
        legend_outside(axes[min(ncols, len(axes)) - 1], handles=legend_key, ncol=1 if len(legend_key) <= 14 else 2)
        note_not_shown(fig, empty, "no evaluations yet (still training)")
    return fig


#: Line styles of the r values in the clock figure (colour is the setting).
_R_LINESTYLES = ("-", "--", ":", "-.")


def _two_and_five(value: float, _pos: Any = None) -> str:
    """A log axis' minor tick label: the value at 2 and 5 times a power of ten, else none."""
    mantissa = value / 10 ** math.floor(math.log10(value)) if value > 0 else 0.0
    return f"{value:g}" if any(abs(mantissa - m) < 1e-6 for m in (2.0, 5.0)) else ""


def plot_rate_vs_clock(clock_rows: Sequence[Mapping[str, Any]], ax: Any = None) -> Any:
    """Reached rate (left) and basin retention (right) against decay clocks, a line per setting.

    Left: the share of a setting's runs that have met the paper's criterion by clock ``c``
    (``reached_rate``); right: the share still in their basin at ``c`` (``held_rate``),
    both among the runs that trained to ``c`` (:func:`~interp_toolkit.studies.report.clock.clock_table`).
    A hot regime, whose runs touch 100% and fall back, rises on the left and not on the
    right. Colour is the setting (lr, weight decay, batch size, ... where they vary), line
    style is r; each line is a step function from zero, drawn to its longest run's end and
    labelled with its run count there. Lines are lifted by up to 0.025 each (their order in
    the key) so that lines at one rate stay visible; the CSV holds the exact rates.

    Args:
        clock_rows: Rows of :func:`~interp_toolkit.studies.report.clock.clock_table` (or its CSV).
        ax: Optional two axes to draw into.

    Returns:
        The :class:`matplotlib.figure.Figure` drawn on.
    """
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    from interp_toolkit.plotting import PALETTE, legend_outside, new_panels, style, tag_series

    if not clock_rows:
        raise UserError("plot_rate_vs_clock needs at least one clock-table row, got none")
    series: dict[tuple[str, float], list[Mapping[str, Any]]] = {}
    for row in clock_rows:
        series.setdefault((str(row["setting"]), float(row["r"])), []).append(row)
    settings = sorted({setting for setting, _ in series})
    r_values = sorted({r for _, r in series}, reverse=True)
    colors = {setting: PALETTE[i % len(PALETTE)] for i, setting in enumerate(settings)}
    # beyond the palette, settings repeat a colour with another marker so no two lines look alike
    markers = {setting: (None if i < len(PALETTE) else _REGIME_MARKERS[(i // len(PALETTE)) % len(_REGIME_MARKERS)])
               for i, setting in enumerate(settings)}
    styles = {r: _R_LINESTYLES[i % len(_R_LINESTYLES)] for i, r in enumerate(r_values)}
    start = min(float(row["decay_clocks"]) for row in clock_rows) / 2  # the curves' zero, left of every event
    # Lines at one rate (most often 0) would hide each other: each series is lifted by a small
    # offset of its own, well below one run's share of any cell.
    keys = sorted(series)
    lift = {key: (i - (len(keys) - 1) / 2) * min(0.01, 0.05 / max(len(keys) - 1, 1)) for i, key in enumerate(keys)}
    with style():
        # the key sits below both panels (settings' labels are long), so the panels keep their width
        ncol = 3 if len(settings) > 4 else 2
        key_rows = -(-(len(settings) + len(r_values)) // ncol)
        fig, axes = new_panels(2, ax, ncols=2, figsize=(11.0, 3.9 + 0.42 * key_rows))
        for panel, column, ylabel in ((axes[0], "reached_rate", "fraction of runs that reached 100%\n"
                                       "adversarial by clock c (paper's criterion)"),
                                      (axes[1], "held_rate", "fraction of runs in their basin at clock c\n"
                                       "(reached 100%, not yet fallen below 99%)")):
            for (setting, r), rows in sorted(series.items()):
                rows = sorted(rows, key=lambda row: float(row["decay_clocks"]))
                xs = [start] + [float(row["decay_clocks"]) for row in rows]
                ys = [lift[setting, r] + y for y in [0.0] + [float(row[column]) for row in rows]]
                (line,) = panel.plot(xs, ys, drawstyle="steps-post", color=colors[setting], ls=styles[r], lw=1.4,
                                     marker=markers[setting], markevery=[len(xs) - 1], markersize=5)
                tag_series(line, f"{column}|{setting}|r={r:g}")
                panel.annotate(f"n={rows[-1]['n_observed']}", (xs[-1], ys[-1]), xytext=(3, 2),
                               textcoords="offset points", fontsize="xx-small", color=colors[setting])
            panel.set_xscale("log")
            panel.xaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
            # plain numbers, not powers of ten: the clocks span a decade or two, so 2 and 5 between
            panel.xaxis.set_minor_formatter(FuncFormatter(_two_and_five))
            panel.set(xlabel="decay clocks c = steps x lr x wd", ylabel=ylabel, ylim=(-0.03, 1.03))
        axes[0].set_title("reached (any time up to c)", fontsize="medium")
        axes[1].set_title("basin retention (at c)", fontsize="medium")
        handles = [Line2D([], [], color=colors[setting], marker=markers[setting], lw=1.4,
                          label=textwrap.fill(setting or "all runs", 34)) for setting in settings]
        if len(r_values) > 1:
            handles += [Line2D([], [], color="black", ls=styles[r], label=f"r = {r:g}") for r in r_values]
        else:
            handles.append(Line2D([], [], color="none", label=f"r = {r_values[0]:g}"))
        if ax is None:
            fig.legend(handles=handles, loc="outside lower center", ncol=ncol, fontsize="small")
        else:
            legend_outside(axes[1], handles=handles)
    return fig


__all__ = ["RATE_AXES", "plot_curves_by_cell", "plot_rate_vs_clock", "plot_rate_vs_r"]
