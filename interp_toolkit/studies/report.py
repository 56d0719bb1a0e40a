"""Generalization-rate report of a study directory: tables (CSV, printed) and PNG plots.

Files written (beside each other, in the study directory by default):

* ``outcomes.csv``: one row per run (cell, seed, outcome record);
* ``table.csv``: per cell: seeds, generalized count, rate and its 95% Wilson interval,
  transient count, median first-generalization epoch, mean final adv/val accuracy;
* ``generalization_rate.png``: rate vs r per architecture with Wilson intervals (the
  headline figure);
* ``curves_by_cell.png``: adversarial (solid) and validation (dashed) accuracy of every
  seed, one panel per cell.

A run is any ``runs/*/`` directory with ``run.json`` and ``metrics.jsonl``; its outcome is
read from ``outcome.json`` or computed from the metrics (so hand-made or ``train``-made run
directories are reported too).
"""

from __future__ import annotations

import csv
import io as _io
import json
import math
import statistics
from pathlib import Path
from typing import Any, Sequence

from interp_toolkit.io import atomic_write_text, read_jsonl
from interp_toolkit.studies.outcomes import OUTCOME_FIELDS, compute_outcome

CELL_FIELDS = ("task", "n_layers", "n_heads", "weight_decay", "r")
TABLE_FIELDS = CELL_FIELDS + (
    "n_seeds", "n_generalized", "rate", "wilson_low", "wilson_high", "n_transient",
    "median_first_generalized_epoch", "mean_final_adv_acc", "mean_final_val_acc",
)


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95% for the default ``z``).

    Args:
        successes: Number of successes, ``0 <= successes <= n``.
        n: Number of trials (>= 1).
        z: Normal quantile.

    Returns:
        ``(low, high)`` within [0, 1].
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"wilson_interval needs n >= 1 trials, got {n!r}")
    if isinstance(successes, bool) or not isinstance(successes, int) or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval successes must be an integer in [0, {n}], got {successes!r}")
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


def collect_runs(study_dir: str | Path) -> list[dict[str, Any]]:
    """One row per run directory under ``study_dir/runs``: cell fields, seed, outcome."""
    study_dir = Path(study_dir)
    runs_root = study_dir / "runs"
    if not runs_root.is_dir():
        raise ValueError(f"{study_dir} is not a study directory (no runs/ folder inside)")
    threshold = 1.0
    study_path = study_dir / "study.json"
    if study_path.exists():
        threshold = json.loads(study_path.read_text()).get("config", {}).get("threshold", 1.0)
    rows = []
    for run_dir in sorted(p for p in runs_root.iterdir() if p.is_dir()):
        record_path = run_dir / "run.json"
        if not record_path.exists():
            continue
        record = json.loads(record_path.read_text())
        task = record.get("run_info", {}).get("task", {})
        model = record.get("model_config", {})
        train = record.get("train_config", {})
        if "r" not in task:
            raise ValueError(f"run {run_dir} has no task ratio r in run.json run_info.task")
        outcome_path = run_dir / "outcome.json"
        if outcome_path.exists():
            outcome = json.loads(outcome_path.read_text())
        else:
            metrics = read_jsonl(run_dir / "metrics.jsonl")
            if not metrics:
                continue
            outcome = compute_outcome(metrics, task["r"], threshold=threshold)
        rows.append({
            "task": task.get("name", "?"), "n_layers": model.get("n_layers"), "n_heads": model.get("n_heads"),
            "weight_decay": train.get("weight_decay"), "r": float(task["r"]), "seed": model.get("seed"),
            "status": record.get("status"), "run_dir": str(run_dir),
            **{k: outcome.get(k) for k in OUTCOME_FIELDS},
        })
    return rows


def rate_table(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-cell generalization rate, Wilson interval and summaries, sorted by cell."""
    cells: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        cells.setdefault(tuple(row[k] for k in CELL_FIELDS), []).append(row)
    table = []
    for cell_key in sorted(cells):
        members = cells[cell_key]
        n = len(members)
        k = sum(bool(m["generalized"]) for m in members)
        low, high = wilson_interval(k, n)
        firsts = [m["first_generalized_epoch"] for m in members if m["first_generalized_epoch"] is not None]
        table.append({
            **dict(zip(CELL_FIELDS, cell_key, strict=True)),
            "n_seeds": n, "n_generalized": k, "rate": k / n, "wilson_low": low, "wilson_high": high,
            "n_transient": sum(bool(m["transient"]) for m in members),
            "median_first_generalized_epoch": statistics.median(firsts) if firsts else None,
            "mean_final_adv_acc": statistics.fmean(m["final_adv_acc"] for m in members),
            "mean_final_val_acc": statistics.fmean(m["final_val_acc"] for m in members),
        })
    return table


def _csv_text(rows: Sequence[dict[str, Any]], fields: Sequence[str]) -> str:
    buffer = _io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(fields), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in fields})
    return buffer.getvalue()


def format_table(table: Sequence[dict[str, Any]]) -> str:
    """The rate table as aligned text."""
    header = ["task", "L", "H", "wd", "r", "seeds", "gen", "rate", "95% Wilson", "transient",
              "med. epoch", "adv", "val"]
    lines = [header]
    for row in table:
        median = row["median_first_generalized_epoch"]
        lines.append([
            row["task"], str(row["n_layers"]), str(row["n_heads"]), f"{row['weight_decay']:g}", f"{row['r']:g}",
            str(row["n_seeds"]), str(row["n_generalized"]), f"{row['rate']:.2f}",
            f"[{row['wilson_low']:.2f}, {row['wilson_high']:.2f}]", str(row["n_transient"]),
            "-" if median is None else f"{median:g}", f"{row['mean_final_adv_acc']:.3f}",
            f"{row['mean_final_val_acc']:.3f}",
        ])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in lines)


def _arch_label(row: dict[str, Any], vary_task: bool, vary_wd: bool) -> str:
    label = f"{row['n_layers']}L {row['n_heads']}H"
    if vary_wd:
        label += f" wd {row['weight_decay']:g}"
    if vary_task:
        label = f"{row['task']} {label}"
    return label


#: The reference line of the rate plot and what it means.
BALANCED_R = 0.5
BALANCED_R_NOTE = "r = 0.5: shortcut uncorrelated with the label"


def plot_rate_vs_r(table: Sequence[dict[str, Any]], ax: Any = None) -> Any:
    """Generalization rate vs r, one marker series per architecture, with Wilson intervals.

    Only the r values that were run are drawn (no lines between them: nothing was measured
    in between) on the full r axis [0, 1] and the full rate axis [0, 1]. The dotted line
    marks r = 0.5, where the shortcut carries no information about the label.

    Args:
        table: Rows of ``table.csv`` (:func:`rate_table`, or ``Table.from_csv`` of it).
        ax: Optional axes to draw into.

    Returns:
        The :class:`matplotlib.figure.Figure` drawn on.
    """
    from interp_toolkit.plotting import component_colors, new_figure, style

    vary_task = len({row["task"] for row in table}) > 1
    vary_wd = len({row["weight_decay"] for row in table}) > 1
    series: dict[str, list[dict[str, Any]]] = {}
    for row in table:
        series.setdefault(_arch_label(row, vary_task, vary_wd), []).append(row)
    colors = component_colors(series)
    r_values = sorted({float(row["r"]) for row in table})
    with style():
        fig, ax = new_figure(ax, figsize=(8.0, 3.8))
        ax.axvline(BALANCED_R, color="grey", lw=0.9, ls=":", label=BALANCED_R_NOTE)
        n_series = len(series)
        for index, (label, rows) in enumerate(sorted(series.items())):
            rows = sorted(rows, key=lambda r: r["r"])
            offset = (index - (n_series - 1) / 2) * 0.015  # keep overlapping intervals visible
            xs = [r["r"] + offset for r in rows]
            ys = [r["rate"] for r in rows]
            lower = [r["rate"] - r["wilson_low"] for r in rows]
            upper = [r["wilson_high"] - r["rate"] for r in rows]
            ax.errorbar(xs, ys, yerr=[lower, upper], marker="o", ls="none", capsize=4, color=colors[label],
                        label=f"{label} (n = {min(r['n_seeds'] for r in rows)} seeds per r)")
        ax.set(xlabel="spurious ratio r (training)", ylabel="fraction of seeds that generalized",
               xlim=(0.0, 1.0), ylim=(-0.03, 1.03), title="MPSP generalization rate (95% Wilson intervals)")
        ax.set_xticks(sorted({0.0, 1.0, *r_values}))
        ax.grid(axis="x", visible=False)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the data, never on it
    return fig


def plot_curves_by_cell(rows: Sequence[dict[str, Any]], ax: Any = None) -> Any:
    """Adversarial (solid) and validation (dashed) accuracy of every seed, a panel per cell.

    A seed has the same colour in every panel; the epoch axis is log-scaled.

    Args:
        rows: Outcome rows (:func:`collect_runs`); each names its ``run_dir``.
        ax: Optional sequence of one axes per cell (cells in sorted order).

    Returns:
        The :class:`matplotlib.figure.Figure` drawn on.
    """
    from interp_toolkit.plotting import component_colors, epoch_axis, new_panels, style

    cells: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        cells.setdefault(tuple(row[k] for k in CELL_FIELDS), []).append(row)
    keys = sorted(cells)
    ncols = min(4, len(keys))
    seed_colors = component_colors(f"seed {row['seed']}" for row in rows)
    with style():
        fig, axes = new_panels(len(keys), ax, ncols=ncols,
                               figsize=(3.4 * ncols, 2.7 * math.ceil(len(keys) / ncols)))
        for panel, key in zip(axes, keys, strict=True):
            cell = dict(zip(CELL_FIELDS, key, strict=True))
            epochs_seen: list[float] = []
            for row in sorted(cells[key], key=lambda r: r["seed"]):
                metrics = read_jsonl(Path(row["run_dir"]) / "metrics.jsonl")
                epochs = [m["epoch"] for m in metrics]
                epochs_seen += epochs
                color = seed_colors[f"seed {row['seed']}"]
                panel.plot(epochs, [m["adv_acc"] for m in metrics], color=color, lw=1)
                panel.plot(epochs, [m["val_acc"] for m in metrics], color=color, lw=0.8, ls="--", alpha=0.6)
            panel.set_title(f"{cell['n_layers']}L{cell['n_heads']}H r={cell['r']:g} wd={cell['weight_decay']:g}")
            panel.set_ylim(-0.03, 1.03)
            epoch_axis(panel, epochs_seen)
        axes[0].set_ylabel("accuracy (adversarial solid,\nvalidation dashed)")
    return fig


def write_report(study_dir: str | Path, out_dir: str | Path | None = None,
                 print_table: bool = True, figure_format: str = "png") -> dict[str, Any]:
    """Write ``outcomes.csv``, ``table.csv`` and the PNG plots of a study; print the table.

    Args:
        study_dir: A study directory (``runs/*/run.json`` + ``metrics.jsonl`` inside).
        out_dir: Where to write (default ``study_dir``).
        print_table: Print the rate table to stdout.
        figure_format: ``png``, ``svg`` or ``pdf`` (file suffix of the two figures).

    Returns:
        ``{"rows", "table", "paths"}``.
    """
    from interp_toolkit.plotting import check_format, save_figure

    figure_format = check_format(figure_format)
    study_dir = Path(study_dir)
    out = Path(out_dir) if out_dir is not None else study_dir
    rows = collect_runs(study_dir)
    if not rows:
        raise ValueError(f"study directory {study_dir} has no runs with evaluations yet")
    table = rate_table(rows)
    paths = {
        "outcomes_csv": out / "outcomes.csv",
        "table_csv": out / "table.csv",
        "rate_png": out / f"generalization_rate.{figure_format}",
        "curves_png": out / f"curves_by_cell.{figure_format}",
    }
    run_fields = CELL_FIELDS + ("seed", "status") + OUTCOME_FIELDS + ("run_dir",)
    atomic_write_text(paths["outcomes_csv"], _csv_text(rows, run_fields))
    atomic_write_text(paths["table_csv"], _csv_text(table, TABLE_FIELDS))
    save_figure(plot_rate_vs_r(table), paths["rate_png"])
    save_figure(plot_curves_by_cell(rows), paths["curves_png"])
    if print_table:
        unfinished = sum(row["status"] != "finished" for row in rows)
        print(format_table(table))
        if unfinished:
            print(f"({unfinished} runs not finished yet: their outcome so far is counted)")
        print(f"table: {paths['table_csv']}\nheadline plot: {paths['rate_png']}\ncurves: {paths['curves_png']}")
    return {"rows": rows, "table": table, "paths": paths}


__all__ = ["CELL_FIELDS", "TABLE_FIELDS", "collect_runs", "format_table", "plot_curves_by_cell",
           "plot_rate_vs_r", "rate_table", "wilson_interval", "write_report"]
