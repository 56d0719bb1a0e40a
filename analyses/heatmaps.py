"""Small multiples of component x position heatmaps over a run's checkpoints.

Patching measures one value per (component, position) pair: 110 series for a 2-layer,
2-head model over 11 positions, far more than lines on a page can show. This figure draws
them all: the run's accuracies across the top, then one row per value column (the raw
change in the metric, then the normalized effect) and one heatmap per chosen checkpoint
(all of them up to :data:`MAX_EPOCHS`, else log-spaced from the first to the last), each
row on one symmetric colour scale centred on 0 with its colour bar. Blank (NaN) cells are
grey, and a heatmap blank everywhere says why in its title.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from interp_toolkit.runs.layout import metrics_path
from interp_toolkit.runs.metrics import read_metrics

from ._common import Table

#: Most checkpoints drawn side by side (chosen log-spaced when a run has more).
MAX_EPOCHS = 6


def chosen_epochs(epochs: Sequence[int], limit: int = MAX_EPOCHS) -> list[int]:
    """``epochs`` (sorted, distinct) if at most ``limit``, else ``limit`` of them spread
    evenly in log(1 + epoch) from the first to the last."""
    epochs = sorted(set(int(e) for e in epochs))
    if len(epochs) <= limit:
        return epochs
    low, high = math.log1p(epochs[0]), math.log1p(epochs[-1])
    chosen: list[int] = []
    for i in range(limit):
        target = low + (high - low) * i / (limit - 1)
        best = min((e for e in epochs if e not in chosen), key=lambda e: (abs(math.log1p(e) - target), e))
        chosen.append(best)
    return sorted(chosen)


def _grid(table: Table, column: str, epoch: int, components: Sequence[str],
          positions: Sequence[int]) -> list[list[float]]:
    cells = {(str(r["component"]), int(r["position"])): float(r[column]) for r in table.rows
             if r["epoch"] == epoch and isinstance(r.get(column), (int, float))}
    return [[cells.get((c, p), math.nan) for p in positions] for c in components]


def plot_heatmaps_over_checkpoints(table: Table, run_dir: str | Path, spec: Any) -> Any:
    """The figure of the module docstring.

    Args:
        table: Rows of :func:`~interp_toolkit.analyses.over_checkpoints.over_checkpoints`
            with ``epoch``, ``component``, ``position`` and ``spec.value_columns``.
        run_dir: The run (its ``metrics.jsonl`` gives the accuracy panel).
        spec: The analysis, an :class:`~interp_toolkit.analyses.over_checkpoints.AnalysisSpec`
            (its name, value columns and their labels; typed loosely: that module imports this one).

    Returns:
        The :class:`matplotlib.figure.Figure`; ``fig.heatmap_epochs`` lists the checkpoints drawn.
    """
    import matplotlib
    import numpy as np

    from interp_toolkit.plotting import figure, label, plot_accuracies, style

    components = list(dict.fromkeys(str(r["component"]) for r in table.rows))
    positions = sorted({int(r["position"]) for r in table.rows})
    epochs = chosen_epochs([int(r["epoch"]) for r in table.rows])
    columns = list(spec.value_columns)
    metrics = read_metrics(metrics_path(run_dir))
    with style():
        ncols = max(1, len(epochs))
        cell_h = max(1.6, 0.22 * len(components) + 0.8)
        fig = figure(figsize=(min(2.3 * ncols + 1.8, 16.0), 1.9 + cell_h * len(columns)), layout="constrained")
        grid = fig.add_gridspec(1 + len(columns), ncols + 1, width_ratios=[1] * ncols + [0.06],
                                height_ratios=[1.5] + [cell_h] * len(columns))
        top = fig.add_subplot(grid[0, :ncols])
        plot_accuracies(top, metrics)
        for epoch in epochs:
            top.axvline(epoch, color="0.6", lw=0.8, ls=":")
        top.set(xlabel="epoch (dotted: the checkpoints drawn below)",
                title=f"{spec.name} over checkpoints: {Path(run_dir).name}")
        if metrics and max(m["epoch"] for m in metrics) > 10:
            top.set_xscale("symlog", linthresh=1)
        if metrics:
            top.set_xlim(0, max(m["epoch"] for m in metrics))
        top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
        cmap = matplotlib.colormaps["RdBu_r"].copy()
        cmap.set_bad("0.85")
        for row, column in enumerate(columns, start=1):
            grids = {e: np.array(_grid(table, column, e, components, positions)) for e in epochs}
            finite = np.concatenate([g[np.isfinite(g)] for g in grids.values()] or [np.zeros(0)])
            limit = float(np.abs(finite).max()) if finite.size else 1.0
            limit = limit if limit > 0 else 1.0
            image = None
            for j, epoch in enumerate(epochs):
                ax = fig.add_subplot(grid[row, j])
                values = np.ma.masked_invalid(grids[epoch])
                image = ax.imshow(values, cmap=cmap, vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest")
                ax.grid(False)
                blank = bool(np.ma.getmaskarray(values).all())
                why = "\n(blank: |gap| under the tolerance)" if column == "normalized" else "\n(blank)"
                ax.set_title(f"epoch {epoch}" + (why if blank else ""), fontsize=8)
                ax.set_xticks(range(len(positions)), [str(p) for p in positions], fontsize=6)
                if j == 0:
                    ax.set_yticks(range(len(components)), components, fontsize=6)
                    ax.set_ylabel(spec.value_labels.get(column, label(column)), fontsize=8)
                else:
                    ax.set_yticks([])
                if row == len(columns):
                    ax.set_xlabel("position", fontsize=7)
            bar = fig.add_subplot(grid[row, ncols])
            if image is not None:
                fig.colorbar(image, cax=bar)
            bar.tick_params(labelsize=6)
    fig.heatmap_epochs = epochs
    return fig


__all__ = ["MAX_EPOCHS", "chosen_epochs", "plot_heatmaps_over_checkpoints"]
