"""The rate plot of many regimes: a row per cell, the rate on x.

:func:`~interp_toolkit.studies.report.plots.plot_rate_vs_r` tells regimes apart by marker
shape, which stops working past a handful of regimes (the shapes repeat, and a key of long
regime names grows taller than any page). A report over a whole ``outcomes.csv`` holds dozens,
so there the rates are drawn as a forest: one row per cell (architecture and regime), its name on
the y axis, the rate on the x axis with its 95% Wilson interval, a colour per r, and the count
``k/n`` beside each marker.
"""

from __future__ import annotations

import textwrap
from typing import Any, Mapping, Sequence

from interp_toolkit.errors import UserError

#: Characters per line of a row's name on the y axis.
LABEL_WIDTH = 120
#: Height of one line of a row's name, and the vertical spacing of the r values in a row, in inches.
_LINE_INCHES = 0.11


def plot_rate_forest(series: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]], ax: Any = None,
                     published: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> Any:
    """Draw rates as a forest: a row per cell (architecture and regime), the rate on x.

    Args:
        series: ``{(architecture, regime): table rows}``, the rows of one architecture in one
            regime (each with ``r``, ``rate``, ``wilson_low``, ``wilson_high``, ``n_seeds``,
            ``n_generalized`` and optionally ``n_near_misses``): a row of the plot each,
            ordered by regime, then architecture.
        ax: Optional axes to draw into.
        published: ``{architecture: rows of the same form}`` of published rates, a row each at
            the top, hollow markers.

    Returns:
        The :class:`matplotlib.figure.Figure` drawn on.
    """
    from interp_toolkit.plotting import PALETTE, new_figure, style

    published = dict(published or {})
    if not series and not published:
        raise UserError("plot_rate_forest needs at least one cell or published rate, got none")
    r_values = sorted({round(float(row["r"]), 9)
                       for rows in (*series.values(), *published.values()) for row in rows})
    colors = {r: PALETTE[i % len(PALETTE)] for i, r in enumerate(r_values)}
    named: list[tuple[str, Sequence[Mapping[str, Any]], bool]] = [
        (f"{arch}: published", rows, True) for arch, rows in sorted(published.items())]
    named += [(f"{arch} | {regime}" if regime else arch, series[arch, regime], False)
              for arch, regime in sorted(series, key=lambda key: (key[1], key[0]))]
    labels = [textwrap.fill(name, LABEL_WIDTH) for name, _, _ in named]
    # a row is as tall as its wrapped name or its r values (one above the other), whichever is more
    heights = [max(label.count("\n") + 1, len(rows)) * _LINE_INCHES + 0.06
               for label, (_, rows, _) in zip(labels, named, strict=True)]
    centres, top = [], 0.0
    for height in heights:
        centres.append(top + height / 2)
        top += height
    with style():
        from matplotlib.lines import Line2D

        own_figure = ax is None
        fig, ax = new_figure(ax, figsize=(11.0, top + 1.2))
        for (_, rows, hollow), centre in zip(named, centres, strict=True):
            for slot, row in enumerate(sorted(rows, key=lambda row: float(row["r"]))):
                r = round(float(row["r"]), 9)
                y = centre + (slot - (len(rows) - 1) / 2) * _LINE_INCHES
                ax.errorbar([row["rate"]], [y], xerr=[[row["rate"] - row["wilson_low"]],
                                                      [row["wilson_high"] - row["rate"]]],
                            marker="h" if hollow else "o", markersize=3, ls="none", capsize=1.5, elinewidth=0.7,
                            color=colors[r], markerfacecolor="white" if hollow else colors[r])
                near = int(row.get("n_near_misses") or 0)
                text = f"{row['n_generalized']}/{row['n_seeds']}" + (f" +{near} near" if near else "")
                ax.annotate(text, (row["wilson_high"], y), xytext=(3, 0), textcoords="offset points", va="center",
                            fontsize=6, color=colors[r])
        for edge in [sum(heights[:i]) for i in range(1, len(heights))]:
            ax.axhline(edge, color="0.88", lw=0.4, zorder=0)
        ax.set_ylim(top, 0.0)
        ax.set_xlim(-0.03, 1.2)
        ax.set_xticks([0.0, 0.25, 0.5, 0.75, 1.0])
        ax.set_yticks(centres, labels, fontsize=6)
        ax.grid(axis="y", visible=False)
        ax.set_xlabel("fraction of seeds that generalized (k/n beside each marker; 95% Wilson interval)")
        ax.set_title("MPSP generalization rate, a row per cell", fontsize="medium")
        handles = [Line2D([], [], color=colors[r], marker="o", ls="none", label=f"r = {r:g}") for r in r_values]
        if published:
            handles.append(Line2D([], [], color="black", marker="h", markerfacecolor="white", ls="none",
                                  label="published rate"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small",
                  title="training r")
        if own_figure:
            fig.set_size_inches(11.0, max(3.0, top + 1.2))
    return fig
