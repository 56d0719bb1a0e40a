"""Generalization-rate report of studies: tables (CSV, markdown, printed) and figures.

Sources are study directories and ``outcomes.csv`` files, in any mix
(:func:`write_report_sources`; :func:`write_report` for one). Files written:

* ``outcomes.csv``: one row per run: its task and training settings (task, seq_len,
  n_values, n_train, n_eval, data_seed, n_layers, n_heads, d_model, d_mlp, weight_decay, lr,
  epochs, batch_size, eval_every, early_stop, outcome threshold, r), seed, status, outcome
  record and run directory. A report regenerates every table and the rate figure from it;
* ``table.csv``: per cell: seeds; ``rate`` (the paper's criterion, ``generalized``) and
  ``rule_learned_rate`` (both splits at 100% at one evaluation), each with its 95% Wilson
  interval; transient count, median first-generalization epoch, mean final adv/val
  accuracy. A cell is every setting above but the seed (:data:`CELL_FIELDS`), so runs of
  different regimes (a calibration and a final study) never pool;
* ``table.md``: the table, contrasts and requested comparisons as markdown;
* ``contrasts.csv``: for every pair of r values within one architecture and regime: the
  difference in rates with a 95% Newcombe (Wilson score, method 10) interval and a two-sided
  Fisher exact p-value;
* ``generalization_rate.<fmt>``: rate vs r per architecture with Wilson intervals, markers
  only (the headline figure; dashed line at chance r = 1/m);
* ``curves_by_cell.<fmt>``: adversarial (solid) and validation (dashed) accuracy of every
  seed, one panel per cell (runs read from run directories only: a CSV has no curves).
* ``paper_comparison.csv`` (with ``against_paper``): every cell that has a published headline
  rate (:data:`PAPER_HEADLINE_RATES`) against it: difference, 95% Newcombe interval, Fisher p.

A run of a study directory is any ``runs/*/`` directory with ``run.json`` and
``metrics.jsonl``. Its outcome is always derived from ``metrics.jsonl`` with the study's
``outcome_thresholds`` (from ``study.json``; defaults otherwise), and ``outcome.json`` is
rewritten as a cache, so old study directories are re-scored under the current definitions
without retraining. Rows of an ``outcomes.csv`` are taken as recorded.
"""

from __future__ import annotations

import csv
import io as _io
import itertools
import json
import math
import statistics
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from interp_toolkit.errors import UserError
from interp_toolkit.io import atomic_write_json, atomic_write_text, read_jsonl
from interp_toolkit.runs.record import FINISHED, has_record, read_record, task_dict
from interp_toolkit.studies.outcomes import OUTCOME_FIELDS, OutcomeThresholds, compute_outcome

#: Settings that tell regimes apart beyond the architecture (the study's name, so a
#: calibration study and the final study never pool even at equal settings; task size and difficulty,
#: widths, optimizer budget, evaluation cadence, early stop, the outcome threshold): cells
#: are keyed by them too, so runs of different regimes never pool into one rate.
REGIME_FIELDS = ("study", "seq_len", "n_values", "n_train", "n_eval", "data_seed", "d_model", "d_mlp", "lr", "epochs",
                 "batch_size", "eval_every", "early_stop", "threshold")
#: A cell: task, regime, architecture (layers, heads), weight decay, r. Sorted in this order.
CELL_FIELDS = ("task", "study", "seq_len", "n_values", "n_train", "n_eval", "data_seed", "n_layers", "n_heads", "d_model",
               "d_mlp", "weight_decay", "lr", "epochs", "batch_size", "eval_every", "early_stop", "threshold", "r")
#: A cell without its r: the group within which contrasts compare r values.
ARCH_FIELDS = tuple(k for k in CELL_FIELDS if k != "r")
#: Columns of ``outcomes.csv``: every run's settings, seed, status, outcome record, directory.
RUN_FIELDS = CELL_FIELDS + ("seed", "status") + OUTCOME_FIELDS + ("run_dir",)
TABLE_FIELDS = CELL_FIELDS + (
    "n_seeds", "n_generalized", "rate", "wilson_low", "wilson_high",
    "n_rule_learned", "rule_learned_rate", "rule_learned_wilson_low", "rule_learned_wilson_high",
    "n_transient", "median_first_generalized_epoch", "mean_final_adv_acc", "mean_final_val_acc", "n_running",
)
CONTRAST_FIELDS = ARCH_FIELDS + (
    "r_a", "r_b", "k_a", "n_a", "k_b", "n_b", "rate_a", "rate_b", "difference", "newcombe_low",
    "newcombe_high", "fisher_p",
)
#: Cell-spec keys accepted by :func:`find_cell` (short names first), mapped to cell fields.
_SPEC_KEYS = {"task": "task", "L": "n_layers", "layers": "n_layers", "H": "n_heads", "heads": "n_heads",
              "wd": "weight_decay", **{k: k for k in CELL_FIELDS}}
_INT_FIELDS = ("seq_len", "n_values", "n_train", "n_eval", "data_seed", "n_layers", "n_heads", "d_model", "d_mlp",
               "epochs", "batch_size", "eval_every")
#: outcomes.csv columns read back as text and as booleans (every other column is a number).
_TEXT_FIELDS = ("task", "study", "status", "run_dir", "favored_split", "generalization_split")
_BOOL_FIELDS = ("early_stop", "generalized", "rule_learned", "transient")
#: Columns an outcomes.csv needs for the rate table (older files lack the regime columns:
#: those are read as empty).
_REQUIRED_CSV_FIELDS = ("task", "n_layers", "n_heads", "weight_decay", "r", "seed", "generalized",
                        "rule_learned", "transient", "first_generalized_epoch", "final_adv_acc", "final_val_acc")
#: Short names of cell fields in printed tables and labels.
_SHORT = {"n_layers": "L", "n_heads": "H", "weight_decay": "wd"}
#: Carried over from an existing outcome.json when it is rewritten (training facts, not outcomes).
_CACHE_EXTRA_KEYS = ("resumed_from", "stopped_early_at")


def _sort_key(values: Sequence[Any]) -> tuple[Any, ...]:
    """Sort key of settings tuples that may hold ``None`` (a setting an older record lacks)."""
    return tuple((value is None, "" if value is None else value) for value in values)


def _cell_key(row: Mapping[str, Any], fields: Sequence[str] = CELL_FIELDS) -> tuple[Any, ...]:
    return tuple(row.get(k) for k in fields)


def varying_fields(rows: Sequence[Mapping[str, Any]], fields: Sequence[str] = REGIME_FIELDS) -> list[str]:
    """The ``fields`` that take more than one value among ``rows`` (in ``fields`` order)."""
    return [k for k in fields if len({_hashable(row.get(k)) for row in rows}) > 1]


def _hashable(value: Any) -> Any:
    # 0.1 and 0.1000000001 are one setting; ints and floats of one value are too
    return round(value, 12) if isinstance(value, float) else value


def _format_setting(field: str, value: Any) -> str:
    if value is None:
        return "full" if field == "batch_size" else "?"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


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
    # At k = 0 (k = n) the bound is exactly 0 (1); float rounding alone can put it a hair
    # inside, above the rate itself, which plots as a negative error bar.
    low = 0.0 if successes == 0 else max(0.0, center - half)
    high = 1.0 if successes == n else min(1.0, center + half)
    return low, high


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
        raise ValueError(f"compare_cells column must be 'generalized' or 'rule_learned', got {column!r}")
    k_a, n_a, k_b, n_b = row_a[f"n_{column}"], row_a["n_seeds"], row_b[f"n_{column}"], row_b["n_seeds"]
    diff, low, high = newcombe_interval(k_a, n_a, k_b, n_b)
    shown = [k for k in REGIME_FIELDS if k in label_fields or k in varying_fields([row_a, row_b])]
    return {
        **{k: row_a.get(k) for k in ARCH_FIELDS}, "r_a": row_a["r"], "r_b": row_b["r"],
        "cell_a": cell_label(row_a, shown), "cell_b": cell_label(row_b, shown), "column": column,
        "k_a": k_a, "n_a": n_a, "k_b": k_b, "n_b": n_b, "rate_a": k_a / n_a, "rate_b": k_b / n_b,
        "difference": diff, "newcombe_low": low, "newcombe_high": high,
        "fisher_p": fisher_exact_p(k_a, n_a, k_b, n_b),
    }


def contrasts_table(table: Sequence[Mapping[str, Any]], column: str = "generalized") -> list[dict[str, Any]]:
    """:func:`compare_cells` for every pair of r values within each group of ``ARCH_FIELDS``
    (task, regime, layers, heads, weight decay; higher r first)."""
    by_arch: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for row in table:
        by_arch.setdefault(_cell_key(row, ARCH_FIELDS), []).append(row)
    label_fields = varying_fields(table)
    out = []
    for arch in sorted(by_arch, key=_sort_key):
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
            raise ValueError(f"ReferenceRate r must be in [0, 1], got {self.r!r}")

    def matches(self, row: Mapping[str, Any]) -> bool:
        """Whether a rate-table row is this reference's cell (task, layers, r; heads and
        weight decay where the reference names them), compared as :func:`find_cell` does."""
        wanted = {"task": self.task, "n_layers": self.n_layers, "r": float(self.r), "n_heads": self.n_heads,
                  "weight_decay": None if self.weight_decay is None else float(self.weight_decay)}
        return _matches(row, {field: value for field, value in wanted.items() if value is not None})


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
REFERENCE_FIELDS = CELL_FIELDS + (
    "k", "n", "rate", "reference_k", "reference_n", "reference_rate", "difference", "newcombe_low",
    "newcombe_high", "fisher_p", "reference_source",
)


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
            out.append({**{f: row.get(f) for f in CELL_FIELDS}, "cell": cell_label(row, shown),
                        "k": k, "n": n, "rate": k / n, "reference_k": ref.k, "reference_n": ref.n,
                        "reference_rate": ref.k / ref.n, "difference": diff, "newcombe_low": low,
                        "newcombe_high": high, "fisher_p": fisher_exact_p(k, n, ref.k, ref.n),
                        "reference_source": ref.source})
    return out


def format_reference_comparison(rows: Sequence[Mapping[str, Any]]) -> str:
    """:func:`reference_comparison` as aligned text."""
    lines = [["cell", "k/n here", "k/n published", "difference", "95% Newcombe", "Fisher p"]]
    for row in rows:
        lines.append([row["cell"], f"{row['k']}/{row['n']}", f"{row['reference_k']}/{row['reference_n']}",
                      f"{row['difference']:+.2f}", f"[{row['newcombe_low']:+.2f}, {row['newcombe_high']:+.2f}]",
                      f"{row['fisher_p']:.3g}"])
    return _align(lines)


def cell_label(row: Mapping[str, Any], regime_fields: Sequence[str] = ()) -> str:
    """``task [seq_len=.. ...] L=.. H=.. wd=.. r=..`` of a table row.

    Args:
        row: A table (or outcome) row.
        regime_fields: Regime fields to name too (e.g. :func:`varying_fields` of the table),
            as ``KEY=VALUE`` in the spelling :func:`find_cell` accepts.
    """
    regime = "".join(f" {k}={_format_setting(k, row.get(k))}" for k in REGIME_FIELDS if k in regime_fields)
    wd = row.get("weight_decay")
    return (f"{row.get('task')}{regime} L={row.get('n_layers')} H={row.get('n_heads')} "
            f"wd={_format_setting('weight_decay', wd)} r={row['r']:g}")


def _parse_spec_value(spec: str, key: str, field: str, value: str) -> Any:
    value = value.strip()
    if field in ("task", "study"):
        return value
    if field == "early_stop":
        lowered = value.lower()
        if lowered not in ("true", "false", "yes", "no", "1", "0"):
            raise ValueError(f"cell spec {spec!r}: {key}={value!r} is not a boolean (true/false)")
        return lowered in ("true", "yes", "1")
    if field == "batch_size" and value.lower() in ("full", "none"):
        return None
    try:
        return int(value) if field in _INT_FIELDS else float(value)
    except ValueError as err:
        kind = "an integer" if field in _INT_FIELDS else "a number"
        raise ValueError(f"cell spec {spec!r}: {key}={value!r} is not {kind}") from err


def _matches(row: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    for field, value in wanted.items():
        have = row.get(field)
        if isinstance(value, float) and not isinstance(have, bool) and isinstance(have, (int, float)):
            if abs(have - value) >= 1e-9:
                return False
        elif have != value:
            return False
    return True


def parse_cell_spec(spec: str) -> dict[str, Any]:
    """A cell spec like ``"L=2,r=0.9,seq_len=8"`` as ``{cell field: typed value}``.

    Keys are those :func:`find_cell` accepts; values are typed as the fields are (integers,
    numbers, ``true``/``false`` for ``early_stop``, ``full`` for a full batch).

    Raises:
        ValueError: an empty spec, an unknown key or a value of the wrong type, named.
    """
    wanted: dict[str, Any] = {}
    for part in (p.strip() for p in str(spec).split(",") if p.strip()):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in _SPEC_KEYS:
            raise ValueError(f"cell spec {spec!r}: expected comma-separated KEY=VALUE with KEY in "
                             f"task, L, H, wd, r or a setting ({', '.join(REGIME_FIELDS)}); got {part!r}")
        field = _SPEC_KEYS[key.strip()]
        wanted[field] = _parse_spec_value(spec, key.strip(), field, value)
    if not wanted:
        raise ValueError(f"cell spec {spec!r} is empty; expected e.g. 'L=2,r=0.9'")
    return wanted


def _spec_list(specs: str | Sequence[str]) -> list[str]:
    """Cell specs as a list (one spec may come as a string, not to be iterated by character)."""
    return [specs] if isinstance(specs, str) else [str(spec) for spec in specs]


def select_runs(rows: Sequence[Mapping[str, Any]], specs: str | Sequence[str]) -> list[dict[str, Any]]:
    """The runs whose settings match any of ``specs`` (cell specs, see :func:`find_cell`).

    One spec may be passed as a string. Within a spec every key must match
    (``"study=reproduce,epochs=1000"``); across specs any one may (``["L=1,r=0.5", "L=2"]``).
    Used to report one study or regime out of an ``outcomes.csv`` that holds several.

    Raises:
        ValueError: a malformed spec, or specs that match no run (naming the values each of
            their keys takes among the runs).
    """
    specs = _spec_list(specs)
    wanted = [parse_cell_spec(spec) for spec in specs]
    if not wanted:
        return [dict(row) for row in rows]
    kept = [dict(row) for row in rows if any(_matches(row, w) for w in wanted)]
    if not kept:
        fields = list(dict.fromkeys(field for w in wanted for field in w))
        present = "; ".join(
            f"{_SHORT.get(field, field)}: "
            + ", ".join(_format_setting(field, v) for v in sorted({_hashable(row.get(field)) for row in rows},
                                                                   key=lambda v: _sort_key([v])))
            for field in fields)
        raise ValueError(f"selection {' '.join(repr(spec) for spec in specs)} matches none of the {len(rows)} runs; "
                         f"values among them: {present}")
    return kept


def find_cell(table: Sequence[Mapping[str, Any]], spec: str) -> Mapping[str, Any]:
    """The one table row matching a spec like ``"L=2,r=0.9,seq_len=8"``.

    Keys: ``task``, ``study`` (the sweep's name), ``L`` (``layers``), ``H`` (``heads``),
    ``wd``, ``r`` and every cell field by its name (``seq_len``, ``n_values``, ``n_train``, ``n_eval``, ``data_seed``,
    ``d_model``, ``d_mlp``, ``lr``, ``epochs``, ``batch_size`` (``full``: full batch),
    ``eval_every``, ``early_stop`` (true/false), ``threshold``).

    Raises:
        ValueError: a malformed spec, or one matching no cell or several (naming them and
            the settings that tell them apart).
    """
    wanted = parse_cell_spec(spec)
    found = [row for row in table if _matches(row, wanted)]
    if len(found) == 1:
        return found[0]
    shown = varying_fields(table)
    if not found:
        cells = "; ".join(cell_label(row, shown) for row in table)
        raise ValueError(f"cell spec {spec!r} matches no cell; cells: {cells}")
    choices = []
    for field in varying_fields(found, CELL_FIELDS):
        values = sorted({row.get(field) for row in found}, key=lambda v: _sort_key([v]))
        choices.append(f"{_SHORT.get(field, field)} ({', '.join(_format_setting(field, v) for v in values)})")
    cells = "; ".join(cell_label(row, shown) for row in found)
    raise ValueError(f"cell spec {spec!r} is ambiguous: it matches {len(found)} cells ({cells}); add a key that "
                     f"tells them apart: {', '.join(choices)}")


def _read_study_record(study_dir: str | Path) -> dict[str, Any]:
    """``study.json`` of a study directory as a dict (empty when there is none)."""
    study_path = Path(study_dir) / "study.json"
    return json.loads(study_path.read_text()) if study_path.exists() else {}


def read_study_name(study_dir: str | Path) -> str | None:
    """The study's name (``SweepConfig.name`` in ``study.json``), ``None`` without one."""
    return (_read_study_record(study_dir).get("config") or {}).get("name")


def read_thresholds(study_dir: str | Path) -> OutcomeThresholds:
    """The study's outcome thresholds: ``study.json``'s ``outcome_thresholds`` if recorded,
    else its config's ``threshold`` (older studies), else the defaults."""
    study = _read_study_record(study_dir)
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


def run_settings(record: Mapping[str, Any], thresholds: OutcomeThresholds | None = None) -> dict[str, Any]:
    """Every setting of a run that :data:`CELL_FIELDS` keys on, plus its seed, from ``run.json``.

    Settings an older record lacks are ``None``. ``early_stop`` is whether the run was
    trained with early stopping (``run_info.early_stop``, written by the sweep).
    """
    task = task_dict(record) or {}
    model = record.get("model_config") or {}
    train = record.get("train_config") or {}
    run_info = record.get("run_info") or {}
    thresholds = OutcomeThresholds() if thresholds is None else thresholds
    return {
        "task": task.get("name", "?"), "seq_len": task.get("seq_len"), "n_values": task.get("n_values"),
        "n_train": task.get("n_train"), "n_eval": task.get("n_eval"), "data_seed": task.get("seed"),
        "n_layers": model.get("n_layers"), "n_heads": model.get("n_heads"), "d_model": model.get("d_model"),
        "d_mlp": model.get("d_mlp"), "weight_decay": train.get("weight_decay"), "lr": train.get("lr"),
        "epochs": train.get("epochs"), "batch_size": train.get("batch_size"), "eval_every": train.get("eval_every"),
        "early_stop": bool(run_info.get("early_stop")), "threshold": thresholds.threshold,
        "r": float(task["r"]) if "r" in task else None, "seed": model.get("seed"),
    }


def collect_runs(study_dir: str | Path, thresholds: OutcomeThresholds | None = None,
                 rewrite_cache: bool = True) -> list[dict[str, Any]]:
    """One row per run directory under ``study_dir/runs``: settings, seed, outcome.

    The outcome is derived from the run's ``metrics.jsonl`` every time (never read from
    ``outcome.json``, which is rewritten as a cache when ``rewrite_cache``). Each row holds
    :data:`RUN_FIELDS` plus ``source`` (the study directory) and ``has_metrics`` (True).

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
    study_name = read_study_name(study_dir)
    rows = []
    for run_dir in sorted(p for p in runs_root.iterdir() if p.is_dir()):
        if not has_record(run_dir):
            continue
        record = read_record(run_dir)
        task = task_dict(record) or {}
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
            **run_settings(record, thresholds), "study": study_name, "status": record.get("status"),
            "run_dir": str(run_dir),
            **{k: outcome.get(k) for k in OUTCOME_FIELDS}, "source": str(study_dir), "has_metrics": True,
        })
    return rows


def _parse_csv_value(path: Path, line: int, field: str, text: str) -> Any:
    if text == "":
        return None
    if field in _TEXT_FIELDS:
        return text
    if field in _BOOL_FIELDS:
        if text not in ("True", "False"):
            raise UserError(f"{path} line {line}: column {field} holds {text!r}; expected True or False")
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if field not in RUN_FIELDS:
        return text  # a column of the user's own (a note, say): kept as written
    raise UserError(f"{path} line {line}: column {field} holds {text!r}; expected a number")


def read_outcomes_csv(path: str | Path) -> list[dict[str, Any]]:
    """The run rows of an ``outcomes.csv`` written by :func:`write_report` (typed as written).

    Columns an older file lacks (the regime settings) are read as ``None``. Each row also
    gets ``source`` (the file) and ``has_metrics`` (False: a CSV holds no learning curves).

    Raises:
        UserError: the file lacks a column the rate table needs, or holds a malformed value
            (naming the file, line and column).
    """
    path = Path(path)
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        missing = [k for k in _REQUIRED_CSV_FIELDS if k not in header]
        if missing:
            raise UserError(f"{path} lacks the columns {missing}; expected an outcomes.csv written by "
                            "`interp-toolkit report`")
        rows = []
        for line, raw in enumerate(reader, start=2):
            row = {k: None for k in RUN_FIELDS}
            row.update({k: _parse_csv_value(path, line, k, v or "") for k, v in raw.items() if k is not None})
            if row["r"] is None:
                raise UserError(f"{path} line {line}: column r is empty; every run needs its ratio r")
            row["r"] = float(row["r"])
            rows.append({**row, "source": str(path), "has_metrics": False})
    return rows


def source_kind(path: str | Path) -> str:
    """``"study"`` for a study directory, ``"csv"`` for an outcomes CSV file.

    Raises:
        UserError: the path does not exist or is neither.
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"report source {path} does not exist; expected a study directory or an outcomes.csv")
    if path.is_dir():
        if (path / "runs").is_dir():
            return "study"
        raise UserError(f"report source {path} is not a study directory (no runs/ folder inside); expected a "
                        "study directory written by `sweep` or an outcomes.csv file (a report folder's "
                        "outcomes.csv is one)")
    if path.suffix.lower() == ".csv":
        return "csv"
    raise UserError(f"report source {path} is neither a study directory nor a .csv file of run outcomes")


def _run_identity(row: Mapping[str, Any]) -> tuple[Any, ...] | None:
    # A sweep names run directories by a hash of every config, so the same name with the same
    # settings and seed is the same run (a copy, or a CSV of it), wherever it was found.
    if not row.get("run_dir"):
        return None
    return (Path(str(row["run_dir"])).name, *_cell_key(row), row.get("seed"))


def _copy_rank(row: Mapping[str, Any]) -> tuple[bool, bool, int]:
    """Which of two copies of one run to keep: read from its directory, finished, more evaluations."""
    return bool(row.get("has_metrics")), row.get("status") == "finished", row.get("n_evaluations") or 0


def merge_runs(row_lists: Sequence[Sequence[Mapping[str, Any]]]) -> tuple[list[dict[str, Any]], int]:
    """Rows of several sources as one list, each run once; sorted by cell, seed, directory.

    Two rows are the same run when their run directories have the same name and they agree
    on every cell setting and the seed (a sweep names a run's directory by a hash of its
    configs). Of the copies, the one read from a run directory (fresh metrics) is kept over
    one from a CSV, then a finished one, then the one with more evaluations.

    Returns:
        ``(rows, n_duplicates_dropped)``.
    """
    kept: dict[Any, dict[str, Any]] = {}
    dropped = 0
    for rows in row_lists:
        for row in rows:
            key = _run_identity(row)
            if key is None:  # no directory named: nothing to match it with
                key = ("unnamed", id(row))
            if key in kept:
                dropped += 1
                if _copy_rank(row) <= _copy_rank(kept[key]):
                    continue
            kept[key] = dict(row)
    merged = sorted(kept.values(), key=lambda r: (_sort_key(_cell_key(r)), _sort_key([r.get("seed")]),
                                                  str(r.get("run_dir") or "")))
    return merged, dropped


def row_finished(row: Mapping[str, Any]) -> bool:
    """Whether a run row has its outcome: it finished (or stopped early, decided). Rows of
    outcome tables that predate the status column count as finished."""
    return row.get("status") is None or row.get("status") in FINISHED


def rate_table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per-cell rates (paper criterion and rule learned), Wilson intervals and summaries.

    Cells are keyed by every field of :data:`CELL_FIELDS` (a setting a row lacks counts as
    ``None``), so runs of different regimes never pool. Only finished runs are counted: a
    run still training has no outcome yet (counting it as failed would bias a rate down, and
    a study's early-stopped successes finish first). ``n_running`` counts the others; a cell
    with no finished run has no row.
    """
    cells: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        cells.setdefault(_cell_key(row), []).append(row)
    table = []
    for cell_key in sorted(cells, key=_sort_key):
        members = [m for m in cells[cell_key] if row_finished(m)]
        n_running = len(cells[cell_key]) - len(members)
        if not members:
            continue
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
            "n_running": n_running,
        })
    return table


def _csv_text(rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> str:
    buffer = _io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(fields), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in fields})
    return buffer.getvalue()


def _setting_columns(table: Sequence[Mapping[str, Any]]) -> list[str]:
    """Cell fields shown as columns: task, L, H, wd and r always; regime fields when they vary."""
    shown = set(varying_fields(table))
    return [k for k in CELL_FIELDS if k in ("task", "n_layers", "n_heads", "weight_decay", "r") or k in shown]


def shared_settings(table: Sequence[Mapping[str, Any]]) -> str:
    """The regime settings every row shares, as ``"seq_len 8, n_values 10, ..."`` (empty if none)."""
    if not table:
        return ""
    varying = set(varying_fields(table))
    # A None batch_size is full-batch training; any other None is a setting an older record lacks.
    known = [k for k in REGIME_FIELDS if k not in varying and (table[0].get(k) is not None
                                                         or (k == "batch_size" and table[0].get("epochs") is not None))]
    return ", ".join(f"{k} {_format_setting(k, table[0].get(k))}" for k in known)


def format_table(table: Sequence[Mapping[str, Any]]) -> str:
    """The rate table as aligned text (``rate``: paper criterion; ``rule``: both splits).

    Regime columns (``seq_len``, ``n_train``, ``epochs``, ...) are printed only when they vary.
    """
    settings = _setting_columns(table)
    running = any(row.get("n_running") for row in table)
    header = [_SHORT.get(k, k) for k in settings] + [
        "seeds", "gen", "rate", "95% Wilson", "rule", "rule rate", "95% Wilson (rule)", "transient", "med. epoch",
        "adv", "val"] + (["running"] if running else [])
    lines = [header]
    for row in table:
        median = row["median_first_generalized_epoch"]
        lines.append([_format_setting(k, row.get(k)) for k in settings] + [
            str(row["n_seeds"]), str(row["n_generalized"]), f"{row['rate']:.2f}",
            f"[{row['wilson_low']:.2f}, {row['wilson_high']:.2f}]", str(row["n_rule_learned"]),
            f"{row['rule_learned_rate']:.2f}",
            f"[{row['rule_learned_wilson_low']:.2f}, {row['rule_learned_wilson_high']:.2f}]",
            str(row["n_transient"]), "-" if median is None else f"{median:g}", f"{row['mean_final_adv_acc']:.3f}",
            f"{row['mean_final_val_acc']:.3f}",
        ] + ([str(row.get("n_running") or 0)] if running else []))
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


def format_markdown(table: Sequence[Mapping[str, Any]], contrasts: Sequence[Mapping[str, Any]] = (),
                    comparisons: Sequence[Mapping[str, Any]] = (),
                    references: Sequence[Mapping[str, Any]] = ()) -> str:
    """The rate table (cell, k/n, rate, 95% Wilson; the same for the rule-learned rate),
    the contrasts (difference, 95% Newcombe, Fisher p) and, when given, the cells against
    published rates (:func:`reference_comparison`) as markdown tables, after a line naming
    the settings every cell shares (those that vary are in the cell labels)."""
    shown = varying_fields(table)
    shared = shared_settings(table)
    lines = [f"Settings of every cell: {shared}.", ""] if shared else []
    running = any(row.get("n_running") for row in table)  # a column only while some run trains
    lines += ["| cell | generalized k/n | rate | 95% Wilson | rule learned k/n | rule-learned rate | 95% Wilson "
             "(rule) | transient | median first epoch | final adv | final val |" + (" running |" if running else ""),
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if running else "")]
    for row in table:
        median = row["median_first_generalized_epoch"]
        lines.append(
            f"| {cell_label(row, shown)} | {row['n_generalized']}/{row['n_seeds']} | {row['rate']:.2f} | "
            f"[{row['wilson_low']:.2f}, {row['wilson_high']:.2f}] | {row['n_rule_learned']}/{row['n_seeds']} | "
            f"{row['rule_learned_rate']:.2f} | [{row['rule_learned_wilson_low']:.2f}, "
            f"{row['rule_learned_wilson_high']:.2f}] | {row['n_transient']} | "
            f"{'-' if median is None else f'{median:g}'} | {row['mean_final_adv_acc']:.3f} | "
            f"{row['mean_final_val_acc']:.3f} |" + (f" {row.get('n_running') or 0} |" if running else ""))
    for title, rows in (("Contrasts of the paper rate within each architecture (a - b)", contrasts),
                        ("Requested comparisons (a - b)", comparisons)):
        if not rows:
            continue
        lines += ["", f"{title}:", "",
                  "| cell a | cell b | rate | k/n a | k/n b | difference | 95% Newcombe | Fisher p |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for row in rows:
            rate = "paper" if row.get("column", "generalized") == "generalized" else "rule learned"
            lines.append(
                f"| {row['cell_a']} | {row['cell_b']} | {rate} | {row['k_a']}/{row['n_a']} | {row['k_b']}/{row['n_b']} | "
                f"{row['difference']:+.2f} | [{row['newcombe_low']:+.2f}, {row['newcombe_high']:+.2f}] | "
                f"{row['fisher_p']:.3g} |")
    if references:
        sources = sorted({row["reference_source"] for row in references})
        lines += ["", "Against the published rates (here - published; " + "; ".join(sources) + "):", "",
                  "| cell | k/n here | k/n published | difference | 95% Newcombe | Fisher p |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for row in references:
            lines.append(
                f"| {row['cell']} | {row['k']}/{row['n']} | {row['reference_k']}/{row['reference_n']} | "
                f"{row['difference']:+.2f} | [{row['newcombe_low']:+.2f}, {row['newcombe_high']:+.2f}] | "
                f"{row['fisher_p']:.3g} |")
    return "\n".join(lines) + "\n"


def _align(lines: Sequence[Sequence[str]]) -> str:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)


def _arch_label(row: Mapping[str, Any], vary_task: bool, vary_wd: bool) -> str:
    label = f"{row.get('n_layers')}L {row.get('n_heads')}H"
    if vary_wd:
        label += f" wd {_format_setting('weight_decay', row.get('weight_decay'))}"
    if vary_task:
        label = f"{row.get('task')} {label}"
    return label


def _regime_label(row: Mapping[str, Any], fields: Sequence[str]) -> str:
    return ", ".join(f"{k} {_format_setting(k, row.get(k))}" for k in fields)


#: Marker shapes of the regimes in the rate plot (colour is the architecture).
_REGIME_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
RATE_AXES = ("full", "categorical")


def plot_rate_vs_r(table: Sequence[Mapping[str, Any]], ax: Any = None, x_axis: str = "full",
                   references: Sequence[ReferenceRate] = ()) -> Any:
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

    Returns:
        The :class:`matplotlib.figure.Figure` drawn on.
    """
    from interp_toolkit.plotting import PALETTE, new_figure, style
    from interp_toolkit.tasks.mpsp import TASKS, task_modulus

    if x_axis not in RATE_AXES:
        raise ValueError(f"plot_rate_vs_r x_axis must be one of {RATE_AXES}, got {x_axis!r}")
    if not table:
        raise ValueError("plot_rate_vs_r needs at least one table row, got none")
    vary_task = len({row.get("task") for row in table}) > 1
    vary_wd = len({_hashable(row.get("weight_decay")) for row in table}) > 1
    regime_fields = varying_fields(table)
    series: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in table:
        key = (_arch_label(row, vary_task, vary_wd), _regime_label(row, regime_fields))
        series.setdefault(key, []).append(row)
    archs = sorted({arch for arch, _ in series})
    regimes = sorted({regime for _, regime in series})
    # Published rates: one more series per architecture, beside the measured ones at its r.
    published = "\uffffpublished"  # sorts after every regime label: drawn right of the measured
    for ref in references:
        arch_rows = {_arch_label(row, vary_task, vary_wd): row for row in table if ref.matches(row)}
        for arch, row in sorted(arch_rows.items()):
            low, high = wilson_interval(ref.k, ref.n)
            series.setdefault((arch, published), []).append(
                {"r": row["r"], "rate": ref.k / ref.n, "wilson_low": low, "wilson_high": high, "n_seeds": ref.n})
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

        fig, ax = new_figure(ax, figsize=(8.0, 3.8))
        handles = []
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
        drawn = sorted({(ref.k, ref.n) for ref in references if any(ref.matches(row) for row in table)})
        if drawn:
            counts = ", ".join(f"{k}/{n}" for k, n in drawn)
            handles.append(Line2D([], [], color="black", marker="h", markerfacecolor="white", ls="none",
                                  label=textwrap.fill(f"published rate, beside its cell ({counts})", 36)))
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
    from interp_toolkit.plotting import component_colors, epoch_axis, new_panels, style

    cells: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        cells.setdefault(_cell_key(row), []).append(row)
    keys = sorted(cells, key=_sort_key)
    regime_fields = varying_fields(rows)
    ncols = min(4, len(keys))
    seed_colors = component_colors(f"seed {row['seed']}" for row in rows)
    with style():
        fig, axes = new_panels(len(keys), ax, ncols=ncols,
                               figsize=(3.4 * ncols, 2.7 * math.ceil(len(keys) / ncols)))
        for panel, key in zip(axes, keys, strict=True):
            cell = dict(zip(CELL_FIELDS, key, strict=True))
            epochs_seen: list[float] = []
            for row in sorted(cells[key], key=lambda r: _sort_key([r.get("seed")])):
                metrics = read_jsonl(Path(row["run_dir"]) / "metrics.jsonl")
                epochs = [m["epoch"] for m in metrics]
                epochs_seen += epochs
                color = seed_colors[f"seed {row['seed']}"]
                panel.plot(epochs, [m["adv_acc"] for m in metrics], color=color, lw=1)
                panel.plot(epochs, [m["val_acc"] for m in metrics], color=color, lw=0.8, ls="--", alpha=0.6)
            title = (f"{cell['n_layers']}L{cell['n_heads']}H r={cell['r']:g} "
                     f"wd={_format_setting('weight_decay', cell['weight_decay'])}")
            # Wrapped to the panel's width: long study names otherwise run into the next panel.
            regime = "\n".join(textwrap.wrap(" ".join(f"{k}={_format_setting(k, cell[k])}" for k in regime_fields),
                                             width=44))
            panel.set_title(f"{title}\n{regime}" if regime else title, fontsize=8 if regime else None)
            panel.set_ylim(-0.03, 1.03)
            epoch_axis(panel, epochs_seen)
        axes[0].set_ylabel("accuracy (adversarial solid,\nvalidation dashed)")
    return fig


def write_report_sources(sources: Sequence[str | Path], out_dir: str | Path, print_table: bool = True,
                         compare: Sequence[tuple[str, str]] = (), max_printed_contrasts: int = 20,
                         figure_format: str = "png", rate_axis: str = "full",
                         against_paper: bool = False, where: str | Sequence[str] = ()) -> dict[str, Any]:
    """The report of the runs of several sources merged: study directories and outcome CSVs.

    Every source is checked before anything is read or written. Study directories are
    re-scored from their runs' ``metrics.jsonl``; ``outcomes.csv`` files (as this function
    writes them) give their rows as recorded. A run found in several sources is counted once
    (:func:`merge_runs`). Writes into ``out_dir``: ``outcomes.csv`` (every run's settings and
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
            rate figure.
        where: Cell specs (see :func:`select_runs`; one may be a string): report only the runs
            matching any of them, e.g. ``["study=reproduce,seq_len=8,epochs=1000"]``; everything written,
            ``outcomes.csv`` included, holds those runs only. Validated before anything is read.

    Returns:
        ``{"rows", "table", "contrasts", "comparisons", "references", "paths", "n_duplicates"}``;
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
    where = _spec_list(where)
    for spec in where:
        parse_cell_spec(spec)  # a bad selection fails before any run is read
    out = Path(out_dir)
    row_lists = [collect_runs(source) if kind == "study" else read_outcomes_csv(source)
                 for source, kind in zip(sources, kinds, strict=True)]
    rows, n_duplicates = merge_runs(row_lists)
    if not rows:
        names = ", ".join(str(source) for source in sources)
        raise ValueError(f"no runs with evaluations yet in {names}")
    n_merged = len(rows)
    rows = select_runs(rows, where)
    table = rate_table(rows)
    shown = varying_fields(table)
    comparisons = []
    unfinished = sum(not row_finished(row) for row in rows)
    for spec_a, spec_b in compare:
        try:
            cell_a, cell_b = find_cell(table, spec_a), find_cell(table, spec_b)
        except ValueError as err:
            if unfinished and "matches no cell" in str(err):
                raise ValueError(f"{err} (runs still training: {unfinished}; a cell has a rate once one "
                                 "of its runs has finished)") from err
            raise
        comparisons += [compare_cells(cell_a, cell_b, "generalized", shown),
                        compare_cells(cell_a, cell_b, "rule_learned", shown)]
    contrasts = contrasts_table(table)
    reference_rates = PAPER_HEADLINE_RATES if against_paper else ()
    references = reference_comparison(table, reference_rates)
    with_metrics = [row for row in rows if row.get("has_metrics")]
    paths: dict[str, Path | None] = {
        "outcomes_csv": out / "outcomes.csv",
        "table_csv": out / "table.csv",
        "table_md": out / "table.md",
        "contrasts_csv": out / "contrasts.csv",
        "rate_png": out / f"generalization_rate.{figure_format}" if table else None,
        "curves_png": out / f"curves_by_cell.{figure_format}" if with_metrics else None,
        "paper_csv": out / "paper_comparison.csv" if against_paper else None,
    }
    atomic_write_text(paths["outcomes_csv"], _csv_text(rows, RUN_FIELDS))
    atomic_write_text(paths["table_csv"], _csv_text(table, TABLE_FIELDS))
    atomic_write_text(paths["table_md"], format_markdown(table, contrasts, comparisons, references))
    atomic_write_text(paths["contrasts_csv"], _csv_text(contrasts, CONTRAST_FIELDS))
    if against_paper:
        atomic_write_text(paths["paper_csv"], _csv_text(references, REFERENCE_FIELDS))
    if table:  # no finished run yet: no rates to plot (the curves show the progress)
        save_figure(plot_rate_vs_r(table, x_axis=rate_axis, references=reference_rates), paths["rate_png"])
    if with_metrics:
        save_figure(plot_curves_by_cell(with_metrics), paths["curves_png"])
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
    return {"rows": rows, "table": table, "contrasts": contrasts, "comparisons": comparisons,
            "references": references, "paths": paths, "n_duplicates": n_duplicates}


def write_report(study_dir: str | Path, out_dir: str | Path | None = None, print_table: bool = True,
                 compare: Sequence[tuple[str, str]] = (), max_printed_contrasts: int = 20,
                 figure_format: str = "png", rate_axis: str = "full", against_paper: bool = False,
                 where: str | Sequence[str] = ()) -> dict[str, Any]:
    """The report of one study directory (or one outcomes CSV): :func:`write_report_sources`.

    Args:
        study_dir: A study directory (``runs/*/run.json`` + ``metrics.jsonl`` inside, and the
            ``recorded_outcomes.csv`` of runs taken from earlier tables, if any) or an
            ``outcomes.csv``.
        out_dir: Where to write (default: the study directory; for a CSV, its folder).
        print_table, compare, max_printed_contrasts, figure_format, rate_axis, against_paper, where:
            See :func:`write_report_sources`.

    Returns:
        ``{"rows", "table", "contrasts", "comparisons", "references", "paths", "n_duplicates"}``.
    """
    study_dir = Path(study_dir)
    if out_dir is None:
        out_dir = study_dir.parent if study_dir.is_file() else study_dir
    if study_dir.is_dir() and not (study_dir / "runs").is_dir():
        raise UserError(f"{study_dir} is not a study directory (no runs/ folder inside)")
    sources = [study_dir]
    recorded = study_dir / "recorded_outcomes.csv"  # studies.sweep.RECORDED_OUTCOMES
    if study_dir.is_dir() and recorded.is_file():
        sources.append(recorded)  # runs of this grid taken from earlier sittings' tables
    return write_report_sources(sources, out_dir, print_table=print_table, compare=compare,
                                max_printed_contrasts=max_printed_contrasts, figure_format=figure_format,
                                rate_axis=rate_axis, against_paper=against_paper, where=where)


__all__ = ["ARCH_FIELDS", "CELL_FIELDS", "CONTRAST_FIELDS", "PAPER_HEADLINE_RATES", "RATE_AXES", "REFERENCE_FIELDS",
           "REGIME_FIELDS", "RUN_FIELDS", "TABLE_FIELDS", "ReferenceRate", "format_reference_comparison",
           "reference_comparison",
           "cell_label", "collect_runs", "compare_cells", "contrasts_table", "find_cell", "fisher_exact_p",
           "format_contrasts", "format_markdown", "format_table", "merge_runs", "newcombe_interval", "parse_cell_spec",
           "plot_curves_by_cell", "plot_rate_vs_r", "rate_table", "read_outcomes_csv", "read_study_name", "read_thresholds",
           "run_settings", "select_runs", "shared_settings", "source_kind", "varying_fields", "wilson_interval", "write_report",
           "write_report_sources"]
