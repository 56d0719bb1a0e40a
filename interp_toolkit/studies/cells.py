"""The vocabulary of study cells: the settings a cell is keyed by, their labels, and the cell
specs of ``report --compare`` / ``--where`` (``"L=2,r=0.9,seq_len=8"``).

A cell is every setting of a run but its seed (:data:`CELL_FIELDS`), so runs of different
regimes never pool into one rate; :func:`run_settings` reads them from a run's ``run.json``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from interp_toolkit.runs.record import task_dict
from interp_toolkit.studies.outcomes import OutcomeThresholds

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


#: Cell-spec keys accepted by :func:`find_cell` (short names first), mapped to cell fields.
_SPEC_KEYS = {"task": "task", "L": "n_layers", "layers": "n_layers", "H": "n_heads", "heads": "n_heads",
              "wd": "weight_decay", **{k: k for k in CELL_FIELDS}}


_INT_FIELDS = ("seq_len", "n_values", "n_train", "n_eval", "data_seed", "n_layers", "n_heads", "d_model", "d_mlp",
               "epochs", "batch_size", "eval_every")


#: Short names of cell fields in printed tables and labels.
SHORT_NAMES = {"n_layers": "L", "n_heads": "H", "weight_decay": "wd"}


def sort_key(values: Sequence[Any]) -> tuple[Any, ...]:
    """Sort key of settings tuples that may hold ``None`` (a setting an older record lacks)."""
    return tuple((value is None, "" if value is None else value) for value in values)


def cell_key(row: Mapping[str, Any], fields: Sequence[str] = CELL_FIELDS) -> tuple[Any, ...]:
    return tuple(row.get(k) for k in fields)


def varying_fields(rows: Sequence[Mapping[str, Any]], fields: Sequence[str] = REGIME_FIELDS) -> list[str]:
    """The ``fields`` that take more than one value among ``rows`` (in ``fields`` order)."""
    return [k for k in fields if len({hashable(row.get(k)) for row in rows}) > 1]


def hashable(value: Any) -> Any:
    # 0.1 and 0.1000000001 are one setting; ints and floats of one value are too
    return round(value, 12) if isinstance(value, float) else value


def format_setting(field: str, value: Any) -> str:
    if value is None:
        return "full" if field == "batch_size" else "?"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def cell_label(row: Mapping[str, Any], regime_fields: Sequence[str] = ()) -> str:
    """``task [seq_len=.. ...] L=.. H=.. wd=.. r=..`` of a table row.

    Args:
        row: A table (or outcome) row.
        regime_fields: Regime fields to name too (e.g. :func:`varying_fields` of the table),
            as ``KEY=VALUE`` in the spelling :func:`find_cell` accepts.
    """
    regime = "".join(f" {k}={format_setting(k, row.get(k))}" for k in REGIME_FIELDS if k in regime_fields)
    wd = row.get("weight_decay")
    return (f"{row.get('task')}{regime} L={row.get('n_layers')} H={row.get('n_heads')} "
            f"wd={format_setting('weight_decay', wd)} r={row['r']:g}")


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


def matches_spec(row: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
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


def spec_list(specs: str | Sequence[str]) -> list[str]:
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
    specs = spec_list(specs)
    wanted = [parse_cell_spec(spec) for spec in specs]
    if not wanted:
        return [dict(row) for row in rows]
    kept = [dict(row) for row in rows if any(matches_spec(row, w) for w in wanted)]
    if not kept:
        fields = list(dict.fromkeys(field for w in wanted for field in w))
        present = "; ".join(
            f"{SHORT_NAMES.get(field, field)}: "
            + ", ".join(format_setting(field, v) for v in sorted({hashable(row.get(field)) for row in rows},
                                                                   key=lambda v: sort_key([v])))
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
    found = [row for row in table if matches_spec(row, wanted)]
    if len(found) == 1:
        return found[0]
    shown = varying_fields(table)
    if not found:
        cells = "; ".join(cell_label(row, shown) for row in table)
        raise ValueError(f"cell spec {spec!r} matches no cell; cells: {cells}")
    choices = []
    for field in varying_fields(found, CELL_FIELDS):
        values = sorted({row.get(field) for row in found}, key=lambda v: sort_key([v]))
        choices.append(f"{SHORT_NAMES.get(field, field)} ({', '.join(format_setting(field, v) for v in values)})")
    cells = "; ".join(cell_label(row, shown) for row in found)
    raise ValueError(f"cell spec {spec!r} is ambiguous: it matches {len(found)} cells ({cells}); add a key that "
                     f"tells them apart: {', '.join(choices)}")


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


__all__ = ['ARCH_FIELDS', 'CELL_FIELDS', 'REGIME_FIELDS', 'SHORT_NAMES', 'cell_key', 'cell_label', 'find_cell', 'format_setting', 'matches_spec', 'parse_cell_spec', 'run_settings', 'select_runs', 'sort_key', 'spec_list', 'varying_fields']
