"""The figure of a mechanism contrast (:func:`plot_contrast`: each quantity's per-run curves
by group with the windows the contrast compares) and the contrast's files
(:func:`write_contrast`: the figure, the per-epoch, per-window and per-run tables and the JSON
summary), drawn from a
:class:`~interp_toolkit.studies.mechanism.contrast_data.ContrastResult` alone (computed, or read back
by :func:`~interp_toolkit.studies.mechanism.contrast.read_contrast`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from interp_toolkit.errors import UserError
from interp_toolkit.studies.mechanism.contrast_data import (
    FILES,
    LABELS,
    RATIO_QUANTITIES,
    ContrastResult,
    window_label,
)


def plot_contrast(result: ContrastResult) -> Any:
    """Per quantity a column and per grouping two rows of panels on one log-scaled epoch
    axis: every run (thin) and each kind's mean with its run-to-run spread (band: +-1 sd)
    above; the difference of the means with its 95% Welch interval below (for ratios that
    differ by more than 10, on a symmetric log axis; else y limits hold every difference and
    the interval's typical width, so one epoch's very wide interval runs off the panel); the
    windows shaded and lettered, each with its verdict (Holm over the whole family)."""
    from matplotlib.transforms import blended_transform_factory

    from interp_toolkit.plotting import PALETTE, epoch_axis, figure

    quantities = result.config.quantities
    groupings = result.groupings
    fig = figure(figsize=(4.6 * len(quantities), 6.4 * len(groupings)), layout="constrained")
    axes = fig.subplots(2 * len(groupings), len(quantities), sharex=True, squeeze=False,
                        height_ratios=(3, 2) * len(groupings))
    shades = ("#eeeeee", "#dddddd")
    for g, by in enumerate(groupings):
        kinds = result.kinds[by]
        colors = {kinds[0]: PALETTE[0], kinds[1]: PALETTE[1]}
        for column, quantity in enumerate(quantities):
            top, bottom = axes[2 * g][column], axes[2 * g + 1][column]
            for i, (_, start, end) in enumerate(result.windows[by]):
                for panel in (top, bottom):
                    panel.axvspan(start, end if end is not None else result.epochs[-1], color=shades[i % 2],
                                  zorder=0, lw=0)
                top.text(start, 1.0 - 0.05 * (i + 1), f" {chr(ord('a') + i)}",
                         transform=blended_transform_factory(top.transData, top.transAxes), fontsize=8,
                         va="bottom", ha="left", color="dimgrey")
            for run in result.runs:
                kind = kinds[0] if run.left(by) else kinds[1]
                top.plot(run.epochs, run.values[quantity], color=colors[kind], lw=0.7, alpha=0.35)
            rows = [row for row in result.by_epoch if row["quantity"] == quantity and row["grouping"] == by]
            epochs = [row["epoch"] for row in rows]
            for kind, key in zip(kinds, ("leaving", "staying"), strict=True):
                mean = [row[f"mean_{key}"] for row in rows]
                sd = [row[f"sd_{key}"] for row in rows]
                n = max(row[f"n_{key}"] for row in rows)
                top.plot(epochs, mean, color=colors[kind], lw=2, label=f"{kind} (n={n})")
                top.fill_between(epochs, [m - s for m, s in zip(mean, sd, strict=True)],
                                 [m + s for m, s in zip(mean, sd, strict=True)], color=colors[kind], alpha=0.15,
                                 lw=0)
            differences = [row["difference"] for row in rows]
            bottom.plot(epochs, differences, color="black", lw=1.5)
            bottom.fill_between(epochs, [row["ci_low"] for row in rows], [row["ci_high"] for row in rows],
                                color="black", alpha=0.15, lw=0, label="95% Welch interval")
            bottom.axhline(0, color="grey", lw=0.8, ls="--")
            if quantity in RATIO_QUANTITIES and max((abs(d) for d in differences if math.isfinite(d)),
                                                    default=0) > 10:
                # one run's ratio can spike a hundredfold as its majority's gradient vanishes
                bottom.set_yscale("symlog", linthresh=1.0)
            else:
                _limit_to_typical(bottom, differences,
                                  [row["ci_low"] for row in rows] + [row["ci_high"] for row in rows])
            if quantity in RATIO_QUANTITIES:
                top.set_yscale("log")
            top.set_title(f"{LABELS[quantity]}\nby {by}", fontsize=10, pad=14)
            top.set_ylabel(quantity)
            bottom.set_ylabel(f"{kinds[0]} - {kinds[1]}")
            lines = [f"{chr(ord('a') + i)}: {row['window']}, epochs {window_label(row['start'], row['end'])}: "
                     f"{row['verdict']} (p {row['p']:.2g}, Holm {row['p_holm']:.2g})"
                     for i, row in enumerate(r for r in result.window_rows
                                             if r["quantity"] == quantity and r["grouping"] == by)]
            bottom.text(0.02, 0.03, "\n".join(lines), transform=bottom.transAxes, fontsize=7, va="bottom")
            epoch_axis(bottom, result.epochs)
            top.legend(fontsize=8, loc="best")
    tested = sum(math.isfinite(row["p"]) for row in result.window_rows)
    confounded = [line for line in result.verdicts() if line.startswith("confounded")]
    fig.suptitle("\n".join(confounded + [f"Holm over the whole family of {tested} tests"])
                 + "".join(f"; by {by} not computed: {why.split(';')[0]}" for by, why in result.skipped.items()),
                 fontsize=9)
    return fig


def _limit_to_typical(panel: Any, values: Sequence[float], bounds: Sequence[float]) -> None:
    """y limits that hold every difference and the interval where it is typical: with 2 runs
    of a kind the t interval is tens of times wider than the data and would flatten it."""
    finite = [v for v in values if math.isfinite(v)]
    edges = sorted(b for b in bounds if math.isfinite(b))
    if not finite or not edges:
        return
    low = min(min(finite), edges[len(edges) // 10], 0.0)
    high = max(max(finite), edges[(len(edges) * 9) // 10], 0.0)
    pad = 0.08 * (high - low) if high > low else 1.0
    panel.set_ylim(low - pad, high + pad)


def _write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    from interp_toolkit.table import Table

    return Table([{k: _cell(v) for k, v in row.items()} for row in rows]).to_csv(path)


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return "" if value is None else value


def write_contrast(result: ContrastResult, out_dir: str | Path) -> dict[str, Path]:
    """Write the figure, the per-epoch, per-window and per-run tables and the JSON summary
    into ``out_dir`` (names: :data:`FILES`), each atomically.

    Returns:
        ``{name: path}`` for the keys of :data:`FILES`.
    """
    from interp_toolkit.io import atomic_write_json, strict_json, with_header_digest
    from interp_toolkit.plotting import save_figure

    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir} is a file; expected a folder for the contrast's files")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {name: out_dir / filename for name, filename in FILES.items()}
    save_figure(plot_contrast(result), paths["figure"])
    _write_csv(paths["by_epoch"], result.by_epoch)
    _write_csv(paths["windows"], result.window_rows)
    _write_csv(paths["runs"], result.run_rows)
    atomic_write_json(paths["summary"], with_header_digest(strict_json(result.summary())))
    return paths


__all__ = ["plot_contrast", "write_contrast"]
