"""Rate tables of studies: per-cell generalization rates with Wilson intervals, contrasts of
r values within an architecture, requested comparisons, and cells against published rates.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from interp_toolkit.errors import UserError
from interp_toolkit.runs.record import FINISHED
from interp_toolkit.studies.common.statistics import (
    fisher_exact_p,
    newcombe_interval,
    wilson_interval,
)
from interp_toolkit.studies.grid.cells import (
    ARCH_FIELDS,
    CELL_FIELDS,
    arch_fields,
    cell_fields,
    cell_key,
    cell_label,
    matches_spec,
    optimizer_clock,
    regime_fields,
    sort_key,
    varying_fields,
    with_clock,
)

_TABLE_STATS = (
    "n_seeds", "n_generalized", "rate", "wilson_low", "wilson_high",
    "n_rule_learned", "rule_learned_rate", "rule_learned_wilson_low", "rule_learned_wilson_high",
    "n_transient", "median_first_generalized_epoch", "mean_final_adv_acc", "mean_final_val_acc",
    "n_near_misses", "n_near_miss_known", "n_running",
)
#: Columns of ``table.csv`` (cells without extra settings; see :func:`table_fields`): the cell's
#: settings with its clock after ``epochs``, then the rates.
TABLE_FIELDS = with_clock(CELL_FIELDS) + _TABLE_STATS
_CONTRAST_STATS = (
    "r_a", "r_b", "k_a", "n_a", "k_b", "n_b", "rate_a", "rate_b", "difference", "newcombe_low",
    "newcombe_high", "fisher_p",
)
#: Columns of ``contrasts.csv`` (cells without extra settings; see :func:`contrast_fields`).
CONTRAST_FIELDS = with_clock(ARCH_FIELDS) + _CONTRAST_STATS


def table_fields(table: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """Columns of ``table.csv`` for these rows: their cell fields (the clock after ``epochs``),
    then the rates."""
    return with_clock(cell_fields(table)) + _TABLE_STATS


def contrast_fields(table: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """Columns of ``contrasts.csv`` for the contrasts of this table (the clock after ``epochs``)."""
    return with_clock(arch_fields(table)) + _CONTRAST_STATS


def compare_cells(row_a: Mapping[str, Any], row_b: Mapping[str, Any], column: str = "generalized",
                  label_fields: Sequence[str] = ()) -> dict[str, Any]:
    """Rate difference of two table rows (a - b), its Newcombe interval and Fisher p.

    Args:
        row_a, row_b: Rows of :func:`rate_table`.
        column: ``"generalized"`` (the paper's rate) or ``"rule_learned"``.
        label_fields: Regime fields named in the ``cell_a`` / ``cell_b`` labels (see
            :func:`cell_label`); the fields that differ between the two rows are always named.
    """
    if column not in ("generalized", "rule_learned"):
        raise UserError(f"compare_cells column must be 'generalized' or 'rule_learned', got {column!r}")
    k_a, n_a, k_b, n_b = row_a[f"n_{column}"], row_a["n_seeds"], row_b[f"n_{column}"], row_b["n_seeds"]
    diff, low, high = newcombe_interval(k_a, n_a, k_b, n_b)
    shown = [k for k in regime_fields([row_a, row_b]) if k in label_fields or k in varying_fields([row_a, row_b])]
    return {
        **{k: row_a.get(k) for k in with_clock(arch_fields([row_a, row_b]))}, "r_a": row_a["r"], "r_b": row_b["r"],
        "cell_a": cell_label(row_a, shown), "cell_b": cell_label(row_b, shown), "column": column,
        "k_a": k_a, "n_a": n_a, "k_b": k_b, "n_b": n_b, "rate_a": k_a / n_a, "rate_b": k_b / n_b,
        "difference": diff, "newcombe_low": low, "newcombe_high": high,
        "fisher_p": fisher_exact_p(k_a, n_a, k_b, n_b),
    }


def contrasts_table(table: Sequence[Mapping[str, Any]], column: str = "generalized") -> list[dict[str, Any]]:
    """:func:`compare_cells` for every pair of r values within each group of ``ARCH_FIELDS``
    (task, regime, layers, heads, weight decay; higher r first)."""
    by_arch: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    fields = arch_fields(table)
    for row in table:
        by_arch.setdefault(cell_key(row, fields), []).append(row)
    label_fields = varying_fields(table)
    out = []
    for arch in sorted(by_arch, key=sort_key):
        rows = sorted(by_arch[arch], key=lambda row: row["r"], reverse=True)
        for row_a, row_b in itertools.combinations(rows, 2):
            out.append(compare_cells(row_a, row_b, column, label_fields))
    return out


@dataclass(frozen=True)
class ReferenceRate:
    """A published generalization rate: ``k`` of ``n`` seeds generalized in one cell.

    Attributes:
        task: MPSP task name.
        n_layers: Layers.
        r: Training spurious ratio.
        k: Seeds that generalized (the paper's criterion: 100% adversarial accuracy).
        n: Seeds run.
        source: Where the number comes from (printed beside it).
        n_heads: Heads, or None where the source does not say (matches any).
        weight_decay: AdamW weight decay, or None where the source does not say (matches any).
    """

    task: str
    n_layers: int
    r: float
    k: int
    n: int
    source: str
    n_heads: int | None = None
    weight_decay: float | None = None

    def __post_init__(self) -> None:
        wilson_interval(self.k, self.n)  # validates k and n, naming the bad value
        if not 0.0 <= self.r <= 1.0:
            raise UserError(f"ReferenceRate r must be in [0, 1], got {self.r!r}")

    def matches(self, row: Mapping[str, Any]) -> bool:
        """Whether a rate-table row is this reference's cell (task, layers, r; heads and
        weight decay where the reference names them), compared as :func:`find_cell` does."""
        wanted = {"task": self.task, "n_layers": self.n_layers, "r": float(self.r), "n_heads": self.n_heads,
                  "weight_decay": None if self.weight_decay is None else float(self.weight_decay)}
        return matches_spec(row, {field: value for field, value in wanted.items() if value is not None})


_PAPER_SOURCE = ("the shortcut-saturation paper's headline, 30 seeds per cell, counts from its rounded "
                 "percentages: 77% = 23/30, 33% = 10/30")


#: The source paper's headline rates (max parity / sum parity, 15,000 epochs, its undisclosed
#: sequence length and value range; weight decay 0.1, its main arm; heads not stated for the
#: headline): 2-layer models 0% at r = 0.5 and 77% at r = 0.9, 1-layer models 33% at r = 0.5
#: and 0% at r = 0.9, of 30 seeds.
PAPER_HEADLINE_RATES: tuple[ReferenceRate, ...] = tuple(
    ReferenceRate("max_parity_sum_parity", layers, r, k, 30, _PAPER_SOURCE, weight_decay=0.1)
    for layers, r, k in ((2, 0.5, 0), (2, 0.9, 23), (1, 0.5, 10), (1, 0.9, 0))
)


#: What the shortcut-saturation paper states of its headline cells' size: 16,384 training
#: sequences, 15,000 epochs.
PAPER_N_TRAIN = 16_384
PAPER_EPOCHS = 15_000
#: A compared cell is "much smaller" than the paper's below these shares of its n_train and
#: of its epochs: its rate is another measurement than the published one.
SMALL_CELL_SHARES = {"n_train": 0.25, "epochs": 0.1}


def small_cell_warning(references: Sequence[Mapping[str, Any]]) -> str | None:
    """One line warning that cells compared with the published rates are much smaller than
    the paper's (fewer than a quarter of its 16,384 training sequences or a tenth of its
    15,000 epochs, :data:`SMALL_CELL_SHARES`), naming their sizes; None when none is.

    Args:
        references: Rows of :func:`reference_comparison` (their ``n_train`` and ``epochs``).
    """
    paper = {"n_train": PAPER_N_TRAIN, "epochs": PAPER_EPOCHS}
    sizes: dict[str, set[int]] = {"n_train": set(), "epochs": set()}
    small_cells = set()
    for row in references:
        for name, value in paper.items():
            size = row.get(name)
            if isinstance(size, (int, float)) and not isinstance(size, bool) and size < SMALL_CELL_SHARES[name] * value:
                sizes[name].add(int(size))
                small_cells.add(row.get("cell"))
    if not small_cells:
        return None
    found = "; ".join(f"{name} {', '.join(f'{v:,}' for v in sorted(values))}" for name, values in sizes.items()
                      if values)
    return (f"{len(small_cells)} of the {len({row.get('cell') for row in references})} cells compared with the "
            f"published rates are much smaller than the paper's ({PAPER_N_TRAIN:,} training sequences, "
            f"{PAPER_EPOCHS:,} epochs): {found}; their rates measure another regime, not the paper's")


_REFERENCE_STATS = (
    "k", "n", "rate", "reference_k", "reference_n", "reference_rate", "difference", "newcombe_low",
    "newcombe_high", "fisher_p", "reference_source",
)
#: Columns of ``paper_comparison.csv`` (cells without extra settings; see :func:`reference_fields`).
REFERENCE_FIELDS = with_clock(CELL_FIELDS) + _REFERENCE_STATS


def reference_fields(table: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """Columns of ``paper_comparison.csv`` for the cells of this table (the clock after ``epochs``)."""
    return with_clock(cell_fields(table)) + _REFERENCE_STATS


def reference_comparison(table: Sequence[Mapping[str, Any]],
                         references: Sequence[ReferenceRate] = PAPER_HEADLINE_RATES) -> list[dict[str, Any]]:
    """Each table cell against the published rate of its cell (this study - reference).

    A cell matches a reference by task, layers and r (and heads and weight decay where the
    reference names them), whatever its regime (sequence length, epochs, ...): the point is to see how far a
    regime's rate lies from the published one. The difference has a 95% Newcombe interval and
    a two-sided Fisher exact p, as the contrasts do (the reference counted as ``k`` of ``n``
    seeds). Cells without a reference are left out.

    Args:
        table: Rows of :func:`rate_table`.
        references: Published rates (default: :data:`PAPER_HEADLINE_RATES`).
    """
    shown = varying_fields(table)
    out = []
    for row in table:
        for ref in references:
            if not ref.matches(row):
                continue
            k, n = row["n_generalized"], row["n_seeds"]
            diff, low, high = newcombe_interval(k, n, ref.k, ref.n)
            out.append({**{f: row.get(f) for f in with_clock(cell_fields(table))}, "cell": cell_label(row, shown),
                        "k": k, "n": n, "rate": k / n, "reference_k": ref.k, "reference_n": ref.n,
                        "reference_rate": ref.k / ref.n, "difference": diff, "newcombe_low": low,
                        "newcombe_high": high, "fisher_p": fisher_exact_p(k, n, ref.k, ref.n),
                        "reference_source": ref.source})
    return out


def row_finished(row: Mapping[str, Any]) -> bool:
    """Whether a run row has its outcome: it finished (or stopped early, decided). Rows of
    outcome tables that predate the status column count as finished."""
    return row.get("status") is None or row.get("status") in FINISHED


def rate_table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per-cell rates (paper criterion and rule learned), Wilson intervals and summaries.

    Cells are keyed by every field of :data:`CELL_FIELDS` and the rows' extra settings
    (:func:`~interp_toolkit.studies.grid.cells.cell_fields`; a setting a row lacks counts as ``None``), so runs of
    different regimes never pool. Only finished runs are counted: a
    run still training has no outcome yet (counting it as failed would bias a rate down, and
    a study's early-stopped successes finish first). ``n_running`` counts the others; a cell
    with no finished run has no row.

    Beside the settings, each cell's optimization clock at its ``epochs`` budget
    (``steps``, ``lr_x_wd``, ``decay_clocks``:
    :func:`~interp_toolkit.studies.grid.cells.optimizer_clock`; an early-stopped run took fewer
    steps, its own are in ``outcomes.csv``). Beside the paper's rate, the near misses:
    ``n_near_misses`` runs short of the criterion by at most 1 point (``within_1pct``) of the
    ``n_near_miss_known`` runs whose near-miss view is known (rows of an outcomes.csv
    without it are not).
    """
    cells: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    fields = cell_fields(rows)
    for row in rows:
        cells.setdefault(cell_key(row, fields), []).append(row)
    table = []
    for key in sorted(cells, key=sort_key):
        members = [m for m in cells[key] if row_finished(m)]
        n_running = len(cells[key]) - len(members)
        if not members:
            continue
        n = len(members)
        k = sum(bool(m["generalized"]) for m in members)
        k_rule = sum(bool(m["rule_learned"]) for m in members)
        low, high = wilson_interval(k, n)
        rule_low, rule_high = wilson_interval(k_rule, n)
        firsts = [m["first_generalized_epoch"] for m in members if m["first_generalized_epoch"] is not None]
        cell = dict(zip(fields, key, strict=True))
        known = [m for m in members if m.get("within_1pct") is not None]
        table.append({
            **cell,
            **optimizer_clock(cell.get("n_train"), cell.get("batch_size"), cell.get("lr"), cell.get("weight_decay"),
                              cell.get("epochs"), schedule=cell),
            "n_seeds": n, "n_generalized": k, "rate": k / n, "wilson_low": low, "wilson_high": high,
            "n_rule_learned": k_rule, "rule_learned_rate": k_rule / n, "rule_learned_wilson_low": rule_low,
            "rule_learned_wilson_high": rule_high,
            "n_transient": sum(bool(m["transient"]) for m in members),
            "median_first_generalized_epoch": statistics.median(firsts) if firsts else None,
            "mean_final_adv_acc": statistics.fmean(m["final_adv_acc"] for m in members),
            "mean_final_val_acc": statistics.fmean(m["final_val_acc"] for m in members),
            "n_near_misses": sum(bool(m["within_1pct"]) for m in known), "n_near_miss_known": len(known),
            "n_running": n_running,
        })
    return table


__all__ = ["CONTRAST_FIELDS", "PAPER_EPOCHS", "PAPER_HEADLINE_RATES", "PAPER_N_TRAIN", "REFERENCE_FIELDS",
           "SMALL_CELL_SHARES", "ReferenceRate", "small_cell_warning",
           "TABLE_FIELDS", "compare_cells", "contrast_fields", "contrasts_table", "rate_table",
           "reference_comparison", "reference_fields", "row_finished", "table_fields"]
