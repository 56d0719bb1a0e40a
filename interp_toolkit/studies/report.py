"""Generalization-rate report of a study directory: tables (CSV, printed) and PNG plots.

Files written (beside each other, in the study directory by default):

* ``outcomes.csv``: one row per run (cell, seed, outcome record);
* ``table.csv``: per cell: seeds; ``rate`` (the paper's criterion, ``generalized``) and
  ``rule_learned_rate`` (both splits at 100% at one evaluation), each with its 95% Wilson
  interval; transient count, median first-generalization epoch, mean final adv/val accuracy;
* ``contrasts.csv``: for every pair of r values within one architecture (task, layers,
  heads, weight decay): the difference in rates with a 95% Newcombe (Wilson score, method
  10) interval and a two-sided Fisher exact p-value;
* ``generalization_rate.png``: rate vs r per architecture with Wilson intervals (the
  headline figure; dotted line at chance r = 1/m);
* ``curves_by_cell.png``: adversarial (solid) and validation (dashed) accuracy of every
  seed, one panel per cell.

A run is any ``runs/*/`` directory with ``run.json`` and ``metrics.jsonl``. Its outcome is
always derived from ``metrics.jsonl`` with the study's ``outcome_thresholds`` (from
``study.json``; defaults otherwise), and ``outcome.json`` is rewritten as a cache, so old
study directories are re-scored under the current definitions without retraining.
"""

from __future__ import annotations

import csv
import io as _io
import itertools
import json
import math
import statistics
from pathlib import Path
from typing import Any, Mapping, Sequence

from interp_toolkit.io import atomic_write_json, atomic_write_text, read_jsonl
from interp_toolkit.runs.record import has_record, read_record, task_dict
from interp_toolkit.studies.outcomes import OUTCOME_FIELDS, OutcomeThresholds, compute_outcome

CELL_FIELDS = ("task", "n_layers", "n_heads", "weight_decay", "r")
ARCH_FIELDS = ("task", "n_layers", "n_heads", "weight_decay")
TABLE_FIELDS = CELL_FIELDS + (
    "n_seeds", "n_generalized", "rate", "wilson_low", "wilson_high",
    "n_rule_learned", "rule_learned_rate", "rule_learned_wilson_low", "rule_learned_wilson_high",
    "n_transient", "median_first_generalized_epoch", "mean_final_adv_acc", "mean_final_val_acc",
)
CONTRAST_FIELDS = ARCH_FIELDS + (
    "r_a", "r_b", "k_a", "n_a", "k_b", "n_b", "rate_a", "rate_b", "difference", "newcombe_low",
    "newcombe_high", "fisher_p",
)
#: Cell-spec keys accepted by :func:`find_cell` (short names first).
_SPEC_KEYS = {"task": "task", "L": "n_layers", "layers": "n_layers", "n_layers": "n_layers", "H": "n_heads",
              "heads": "n_heads", "n_heads": "n_heads", "wd": "weight_decay", "weight_decay": "weight_decay",
              "r": "r"}
#: Carried over from an existing outcome.json when it is rewritten (training facts, not outcomes).
_CACHE_EXTRA_KEYS = ("resumed_from", "stopped_early_at")


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


def newcombe_interval(k_a: int, n_a: int, k_b: int, n_b: int,
                      z: float = 1.959963984540054) -> tuple[float, float, float]:
    """Difference of two independent proportions with Newcombe's hybrid score interval.

    Method 10 of Newcombe (1998, Statistics in Medicine 17:873-890): the Wilson score
    intervals ``(l_a, u_a)`` and ``(l_b, u_b)`` of each proportion combine into
    ``d - sqrt((p_a - l_a)^2 + (u_b - p_b)^2)`` and ``d + sqrt((u_a - p_a)^2 + (p_b - l_b)^2)``
    with ``d = p_a - p_b`` (95% for the default ``z``).

    Returns:
        ``(difference, low, high)``.
    """
    l_a, u_a = wilson_interval(k_a, n_a, z)
    l_b, u_b = wilson_interval(k_b, n_b, z)
    p_a, p_b = k_a / n_a, k_b / n_b
    diff = p_a - p_b
    low = diff - math.sqrt((p_a - l_a) ** 2 + (u_b - p_b) ** 2)
    high = diff + math.sqrt((u_a - p_a) ** 2 + (p_b - l_b) ** 2)
    return diff, max(-1.0, low), min(1.0, high)


def fisher_exact_p(k_a: int, n_a: int, k_b: int, n_b: int) -> float:
    """Two-sided Fisher exact p-value of ``k_a/n_a`` vs ``k_b/n_b`` (``scipy.stats.fisher_exact``)."""
    from scipy.stats import fisher_exact

    for k, n in ((k_a, n_a), (k_b, n_b)):
        wilson_interval(k, n)  # validates k and n, naming the bad value
    return float(fisher_exact([[k_a, n_a - k_a], [k_b, n_b - k_b]], alternative="two-sided").pvalue)


def compare_cells(row_a: Mapping[str, Any], row_b: Mapping[str, Any], column: str = "generalized") -> dict[str, Any]:
    """Rate difference of two table rows (a - b), its Newcombe interval and Fisher p.

    Args:
        row_a, row_b: Rows of :func:`rate_table`.
        column: ``"generalized"`` (the paper's rate) or ``"rule_learned"``.
    """
    if column not in ("generalized", "rule_learned"):
        raise ValueError(f"compare_cells column must be 'generalized' or 'rule_learned', got {column!r}")
    k_a, n_a, k_b, n_b = row_a[f"n_{column}"], row_a["n_seeds"], row_b[f"n_{column}"], row_b["n_seeds"]
    diff, low, high = newcombe_interval(k_a, n_a, k_b, n_b)
    return {
        **{k: row_a[k] for k in ARCH_FIELDS}, "r_a": row_a["r"], "r_b": row_b["r"],
        "cell_a": cell_label(row_a), "cell_b": cell_label(row_b), "column": column,
        "k_a": k_a, "n_a": n_a, "k_b": k_b, "n_b": n_b, "rate_a": k_a / n_a, "rate_b": k_b / n_b,
        "difference": diff, "newcombe_low": low, "newcombe_high": high,
        "fisher_p": fisher_exact_p(k_a, n_a, k_b, n_b),
    }


def contrasts_table(table: Sequence[Mapping[str, Any]], column: str = "generalized") -> list[dict[str, Any]]:
    """:func:`compare_cells` for every pair of r values within each architecture (higher r first)."""
    by_arch: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for row in table:
        by_arch.setdefault(tuple(row[k] for k in ARCH_FIELDS), []).append(row)
    out = []
    for arch in sorted(by_arch):
        rows = sorted(by_arch[arch], key=lambda row: row["r"], reverse=True)
        for row_a, row_b in itertools.combinations(rows, 2):
            out.append(compare_cells(row_a, row_b, column))
    return out


def cell_label(row: Mapping[str, Any]) -> str:
    """``task L=.. H=.. wd=.. r=..`` of a table row."""
    return (f"{row['task']} L={row['n_layers']} H={row['n_heads']} wd={row['weight_decay']:g} "
            f"r={row['r']:g}")


def find_cell(table: Sequence[Mapping[str, Any]], spec: str) -> Mapping[str, Any]:
    """The one table row matching a spec like ``"L=2,r=0.9"`` (keys: task, L, H, wd, r).

    Raises:
        ValueError: a malformed spec, or one matching no cell or several (naming them).
    """
    wanted: dict[str, Any] = {}
    for part in (p.strip() for p in str(spec).split(",") if p.strip()):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in _SPEC_KEYS:
            raise ValueError(f"cell spec {spec!r}: expected comma-separated KEY=VALUE with KEY in "
                             f"task, L, H, wd, r; got {part!r}")
        field = _SPEC_KEYS[key.strip()]
        try:
            wanted[field] = value.strip() if field == "task" else (
                int(value) if field in ("n_layers", "n_heads") else float(value))
        except ValueError as err:
            raise ValueError(f"cell spec {spec!r}: {key}={value!r} is not a number") from err
    if not wanted:
        raise ValueError(f"cell spec {spec!r} is empty; expected e.g. 'L=2,r=0.9'")

    def matches(row: Mapping[str, Any]) -> bool:
        return all(abs(row[k] - v) < 1e-9 if isinstance(v, float) else row[k] == v for k, v in wanted.items())

    found = [row for row in table if matches(row)]
    if len(found) != 1:
        cells = "; ".join(cell_label(row) for row in (found or table))
        what = "matches no cell" if not found else f"matches {len(found)} cells"
        raise ValueError(f"cell spec {spec!r} {what}; cells: {cells}")
    return found[0]


def read_thresholds(study_dir: str | Path) -> OutcomeThresholds:
    """The study's outcome thresholds: ``study.json``'s ``outcome_thresholds`` if recorded,
    else its config's ``threshold`` (older studies), else the defaults."""
    study_path = Path(study_dir) / "study.json"
    if not study_path.exists():
        return OutcomeThresholds()
    study = json.loads(study_path.read_text())
    if "outcome_thresholds" in study:
        return OutcomeThresholds.from_dict(study["outcome_thresholds"])
    return OutcomeThresholds.from_dict(study.get("config", {}))


def _task_modulus(task: Mapping[str, Any], run_dir: Path) -> int:
    from interp_toolkit.tasks.mpsp import LABELS, task_modulus

    if task.get("label") in LABELS:
        return LABELS[task["label"]]
    if "name" in task:
        return task_modulus(task["name"])
    raise ValueError(f"run {run_dir} records neither a task name nor a label in run.json run_info.task")


def collect_runs(study_dir: str | Path, thresholds: OutcomeThresholds | None = None,
                 rewrite_cache: bool = True) -> list[dict[str, Any]]:
    """One row per run directory under ``study_dir/runs``: cell fields, seed, outcome.

    The outcome is derived from the run's ``metrics.jsonl`` every time (never read from
    ``outcome.json``, which is rewritten as a cache when ``rewrite_cache``).

    Args:
        study_dir: The study directory.
        thresholds: Outcome settings (default: :func:`read_thresholds` of the study).
        rewrite_cache: Rewrite each finished run's ``outcome.json`` when its content changed
            (unfinished runs never get one: a sweep reads it as "this run is done").
    """
    study_dir = Path(study_dir)
    runs_root = study_dir / "runs"
    if not runs_root.is_dir():
        raise ValueError(f"{study_dir} is not a study directory (no runs/ folder inside)")
    thresholds = read_thresholds(study_dir) if thresholds is None else thresholds
    rows = []
    for run_dir in sorted(p for p in runs_root.iterdir() if p.is_dir()):
        if not has_record(run_dir):
            continue
        record = read_record(run_dir)
        task = task_dict(record) or {}
        model = record.get("model_config", {})
        train = record.get("train_config", {})
        if "r" not in task:
            raise ValueError(f"run {run_dir} has no task ratio r in run.json run_info.task")
        metrics = read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
        if not metrics:
            continue
        outcome = compute_outcome(metrics, float(task["r"]), _task_modulus(task, run_dir), thresholds)
        outcome_path = run_dir / "outcome.json"
        # Only finished runs get a cache: a sweep takes outcome.json as "this run is done".
        if rewrite_cache and record.get("status") == "finished":
            cached = json.loads(outcome_path.read_text()) if outcome_path.exists() else {}
            fresh = {**outcome, **{k: cached[k] for k in _CACHE_EXTRA_KEYS if k in cached}}
            if fresh != cached:
                atomic_write_json(outcome_path, fresh)
        rows.append({
            "task": task.get("name", "?"), "n_layers": model.get("n_layers"), "n_heads": model.get("n_heads"),
            "weight_decay": train.get("weight_decay"), "r": float(task["r"]), "seed": model.get("seed"),
            "status": record.get("status"), "run_dir": str(run_dir),
            **{k: outcome.get(k) for k in OUTCOME_FIELDS},
        })
    return rows


def rate_table(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-cell rates (paper criterion and rule learned), Wilson intervals and summaries."""
    cells: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        cells.setdefault(tuple(row[k] for k in CELL_FIELDS), []).append(row)
    table = []
    for cell_key in sorted(cells):
        members = cells[cell_key]
        n = len(members)
        k = sum(bool(m["generalized"]) for m in members)
        k_rule = sum(bool(m["rule_learned"]) for m in members)
        low, high = wilson_interval(k, n)
        rule_low, rule_high = wilson_interval(k_rule, n)
        firsts = [m["first_generalized_epoch"] for m in members if m["first_generalized_epoch"] is not None]
        table.append({
            **dict(zip(CELL_FIELDS, cell_key, strict=True)),
            "n_seeds": n, "n_generalized": k, "rate": k / n, "wilson_low": low, "wilson_high": high,
            "n_rule_learned": k_rule, "rule_learned_rate": k_rule / n, "rule_learned_wilson_low": rule_low,
            "rule_learned_wilson_high": rule_high,
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
    """The rate table as aligned text (``rate``: paper criterion; ``rule``: both splits)."""
    header = ["task", "L", "H", "wd", "r", "seeds", "gen", "rate", "95% Wilson", "rule", "rule rate",
              "95% Wilson (rule)", "transient", "med. epoch", "adv", "val"]
    lines = [header]
    for row in table:
        median = row["median_first_generalized_epoch"]
        lines.append([
            row["task"], str(row["n_layers"]), str(row["n_heads"]), f"{row['weight_decay']:g}", f"{row['r']:g}",
            str(row["n_seeds"]), str(row["n_generalized"]), f"{row['rate']:.2f}",
            f"[{row['wilson_low']:.2f}, {row['wilson_high']:.2f}]", str(row["n_rule_learned"]),
            f"{row['rule_learned_rate']:.2f}",
            f"[{row['rule_learned_wilson_low']:.2f}, {row['rule_learned_wilson_high']:.2f}]",
            str(row["n_transient"]), "-" if median is None else f"{median:g}", f"{row['mean_final_adv_acc']:.3f}",
            f"{row['mean_final_val_acc']:.3f}",
        ])
    return _align(lines)


def format_contrasts(contrasts: Sequence[Mapping[str, Any]]) -> str:
    """Contrasts (a - b) as aligned text: difference, 95% Newcombe interval, Fisher p."""
    lines = [["cell a", "cell b", "k/n a", "k/n b", "difference", "95% Newcombe", "Fisher p"]]
    for row in contrasts:
        lines.append([
            row["cell_a"], row["cell_b"], f"{row['k_a']}/{row['n_a']}", f"{row['k_b']}/{row['n_b']}",
            f"{row['difference']:+.2f}", f"[{row['newcombe_low']:+.2f}, {row['newcombe_high']:+.2f}]",
            f"{row['fisher_p']:.3g}",
        ])
    return _align(lines)


def _align(lines: Sequence[Sequence[str]]) -> str:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)


def _arch_label(row: dict[str, Any], vary_task: bool, vary_wd: bool) -> str:
    label = f"{row['n_layers']}L {row['n_heads']}H"
    if vary_wd:
        label += f" wd {row['weight_decay']:g}"
    if vary_task:
        label = f"{row['task']} {label}"
    return label


#: The reference line of the rate plot and what it means.


def plot_rate_vs_r(table: Sequence[dict[str, Any]], ax: Any = None) -> Any:
    """Generalization rate vs r, one marker series per architecture, with Wilson intervals.

    Only the r values that were run are drawn (no lines between them: nothing was measured
    in between) on the full r axis [0, 1] and the full rate axis [0, 1]. A dotted line marks
    chance, r = 1/m for a task modulo m, where the shortcut carries no information about the
    label (the generalization split flips there).

    Args:
        table: Rows of ``table.csv`` (:func:`rate_table`, or ``Table.from_csv`` of it).
        ax: Optional axes to draw into.

    Returns:
        The :class:`matplotlib.figure.Figure` drawn on.
    """
    from interp_toolkit.plotting import component_colors, new_figure, style
    from interp_toolkit.tasks.mpsp import TASKS, task_modulus

    vary_task = len({row["task"] for row in table}) > 1
    vary_wd = len({row["weight_decay"] for row in table}) > 1
    series: dict[str, list[dict[str, Any]]] = {}
    for row in table:
        series.setdefault(_arch_label(row, vary_task, vary_wd), []).append(row)
    colors = component_colors(series)
    r_values = sorted({float(row["r"]) for row in table})
    with style():
        fig, ax = new_figure(ax, figsize=(8.0, 3.8))
        for modulus in sorted({task_modulus(row["task"]) for row in table if row["task"] in TASKS}):
            ax.axvline(1 / modulus, color="grey", lw=0.9, ls=":", label=f"chance r = 1/{modulus}: shortcut "
                       "uncorrelated with the label")
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


def write_report(study_dir: str | Path, out_dir: str | Path | None = None, print_table: bool = True,
                 compare: Sequence[tuple[str, str]] = (), max_printed_contrasts: int = 20,
                 figure_format: str = "png") -> dict[str, Any]:
    """Write ``outcomes.csv``, ``table.csv``, ``contrasts.csv`` and the two figures; print tables.

    Args:
        study_dir: A study directory (``runs/*/run.json`` + ``metrics.jsonl`` inside).
        out_dir: Where to write (default ``study_dir``).
        print_table: Print the rate table (and contrasts) to stdout.
        compare: Pairs of cell specs (see :func:`find_cell`, e.g. ``("L=2,r=0.9", "L=2,r=0.5")``)
            compared a - b on both rates; validated before anything is written.
        max_printed_contrasts: Print the automatic contrasts only up to this many rows
            (they are all in ``contrasts.csv``).
        figure_format: ``png``, ``svg`` or ``pdf`` (file suffix of the two figures).

    Returns:
        ``{"rows", "table", "contrasts", "comparisons", "paths"}``.
    """
    from interp_toolkit.plotting import check_format, save_figure

    figure_format = check_format(figure_format)
    study_dir = Path(study_dir)
    out = Path(out_dir) if out_dir is not None else study_dir
    rows = collect_runs(study_dir)
    if not rows:
        raise ValueError(f"study directory {study_dir} has no runs with evaluations yet")
    table = rate_table(rows)
    comparisons = []
    for spec_a, spec_b in compare:
        cell_a, cell_b = find_cell(table, spec_a), find_cell(table, spec_b)
        comparisons += [compare_cells(cell_a, cell_b, "generalized"), compare_cells(cell_a, cell_b, "rule_learned")]
    contrasts = contrasts_table(table)
    paths = {
        "outcomes_csv": out / "outcomes.csv",
        "table_csv": out / "table.csv",
        "contrasts_csv": out / "contrasts.csv",
        "rate_png": out / f"generalization_rate.{figure_format}",
        "curves_png": out / f"curves_by_cell.{figure_format}",
    }
    run_fields = CELL_FIELDS + ("seed", "status") + OUTCOME_FIELDS + ("run_dir",)
    atomic_write_text(paths["outcomes_csv"], _csv_text(rows, run_fields))
    atomic_write_text(paths["table_csv"], _csv_text(table, TABLE_FIELDS))
    atomic_write_text(paths["contrasts_csv"], _csv_text(contrasts, CONTRAST_FIELDS))
    save_figure(plot_rate_vs_r(table), paths["rate_png"])
    save_figure(plot_curves_by_cell(rows), paths["curves_png"])
    if print_table:
        unfinished = sum(row["status"] != "finished" for row in rows)
        print(format_table(table))
        if unfinished:
            print(f"({unfinished} runs not finished yet: their outcome so far is counted)")
        if contrasts and len(contrasts) <= max_printed_contrasts:
            print("\ncontrasts of the paper rate within each architecture (a - b):")
            print(format_contrasts(contrasts))
        for column in ("generalized", "rule_learned"):
            chosen = [c for c in comparisons if c["column"] == column]
            if chosen:
                print(f"\nrequested comparisons ({'paper rate' if column == 'generalized' else 'rule-learned rate'}"
                      ", a - b):")
                print(format_contrasts(chosen))
        print(f"table: {paths['table_csv']}\ncontrasts: {paths['contrasts_csv']}\n"
              f"headline plot: {paths['rate_png']}\ncurves: {paths['curves_png']}")
    return {"rows": rows, "table": table, "contrasts": contrasts, "comparisons": comparisons, "paths": paths}


__all__ = ["ARCH_FIELDS", "CELL_FIELDS", "CONTRAST_FIELDS", "TABLE_FIELDS", "cell_label", "collect_runs",
           "compare_cells", "contrasts_table", "find_cell", "fisher_exact_p", "format_contrasts", "format_table",
           "newcombe_interval", "plot_curves_by_cell", "plot_rate_vs_r", "rate_table", "read_thresholds",
           "wilson_interval", "write_report"]
