"""The rows of an outcome table (``outcomes.csv``): their columns, reading and checking them,
and merging the copies of one run found in several sources.

A row is one run: its settings (:mod:`interp_toolkit.studies.grid.cells`) with its optimization
clock, seed, status, outcome record (:mod:`interp_toolkit.studies.common.outcomes`), near-miss view
(:mod:`interp_toolkit.studies.common.near_miss`) and directory. :func:`read_outcomes_csv` reads a file
back typed as written and refuses values no report writes (naming file, line and column);
:func:`merge_runs` pools sources, counting a run found in several once and refusing copies
whose outcomes disagree unless the user names the source that wins. The study directory
(:mod:`interp_toolkit.studies.grid.study`) names the files.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from interp_toolkit.errors import UserError
from interp_toolkit.studies.common.near_miss import NEAR_MISS_FIELDS
from interp_toolkit.studies.common.outcomes import OUTCOME_FIELDS
from interp_toolkit.studies.grid.cells import (
    _INT_FIELDS as _INT_SETTING_FIELDS,
)
from interp_toolkit.studies.grid.cells import (
    CELL_FIELDS,
    CLOCK_FIELDS,
    TIED_DATA_SEED,
    cell_fields,
    cell_key,
    is_extra_setting,
    optimizer_clock,
    parse_setting_text,
    sort_key,
    with_clock,
)

#: Columns of ``outcomes.csv``: every run's settings with its optimization clock after
#: ``epochs`` (:data:`~interp_toolkit.studies.grid.cells.CLOCK_FIELDS`: the steps it took), seed,
#: status, outcome record, near-miss view
#: (:data:`~interp_toolkit.studies.common.near_miss.NEAR_MISS_FIELDS`), directory.
RUN_FIELDS = with_clock(CELL_FIELDS) + ("seed", "status") + OUTCOME_FIELDS + NEAR_MISS_FIELDS + ("run_dir",)


def run_fields(rows: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """Columns of ``outcomes.csv`` for these rows: :data:`RUN_FIELDS` with the rows' extra
    settings (``"SECTION.FIELD"``) among the cell fields, before ``r``."""
    return with_clock(cell_fields(rows)) + RUN_FIELDS[len(CELL_FIELDS) + len(CLOCK_FIELDS):]


def run_clock(row: Mapping[str, Any]) -> dict[str, Any]:
    """A run's optimization clock (:func:`~interp_toolkit.studies.grid.cells.optimizer_clock`) over
    the epochs it actually trained: its ``final_epoch`` (an early-stopped run took fewer steps
    than its ``epochs`` budget; a run still training, the steps so far), from its ``n_train``,
    ``batch_size`` (None: full batch), ``lr`` and ``weight_decay``. Unknown inputs give None."""
    return optimizer_clock(row.get("n_train"), row.get("batch_size"), row.get("lr"), row.get("weight_decay"),
                           row.get("final_epoch"), schedule=row, planned_epochs=row.get("epochs"))


#: outcomes.csv columns read back as text and as booleans (every other column is a number).
_TEXT_FIELDS = ("task", "study", "status", "run_dir", "favored_split", "generalization_split", "near_miss_groups")


_BOOL_FIELDS = ("early_stop", "generalized", "rule_learned", "transient", "within_1pct")


#: Columns an outcomes.csv needs for the rate table (older files lack the regime columns:
#: those are read as empty).
_REQUIRED_CSV_FIELDS = ("task", "n_layers", "n_heads", "weight_decay", "r", "seed", "generalized",
                        "rule_learned", "transient", "first_generalized_epoch", "final_adv_acc", "final_val_acc")



#: outcomes.csv columns that hold a share or an accuracy: read back only within [0, 1].
_UNIT_FIELDS = ("r", "threshold", "basin_fraction", "min_acc_after", "max_adv_acc", "max_val_acc",
                "final_adv_acc", "final_val_acc")
#: outcomes.csv columns that hold counts, sizes, seeds or epochs: read back only as integers >= 0.
_COUNT_FIELDS = _INT_SETTING_FIELDS + (
    "seed", "first_generalized_epoch", "first_rule_learned_epoch", "left_epoch", "shortcut_epoch",
    "phase2_onset_epoch", "modulus", "final_epoch", "n_evaluations", "transient_min_span")
#: outcomes.csv columns of non-negative settings (any finite number >= 0).
_NON_NEGATIVE_FIELDS = ("weight_decay", "lr", "transient_tolerance")


def _parse_csv_value(path: Path, line: int, field: str, text: str) -> Any:
    if text == "":
        return None
    if field in _TEXT_FIELDS:
        return text
    if is_extra_setting(field):
        return parse_setting_text(text)
    where = f"{path} line {line}: column {field} holds {text!r}"
    if field in _BOOL_FIELDS:
        if text not in ("True", "False"):
            raise UserError(f"{where}; expected True or False")
        return text == "True"
    if field == "data_seed" and text == TIED_DATA_SEED:
        return text
    if field in _COUNT_FIELDS:
        try:
            count = int(text)
        except ValueError:
            count = -1
        if count < 0:
            raise UserError(f"{where}; expected a whole number >= 0")
        return count
    for kind in (int, float):
        try:
            number = kind(text)
            break
        except ValueError:
            pass
    else:
        if field not in RUN_FIELDS:
            return text  # a column of the user's own (a note, say): kept as written
        raise UserError(f"{where}; expected a number")
    if field in _UNIT_FIELDS and not 0 <= number <= 1:  # nan included
        raise UserError(f"{where}; expected a number in [0, 1]")
    if field in _NON_NEGATIVE_FIELDS and not (math.isfinite(number) and number >= 0):
        raise UserError(f"{where}; expected a finite number >= 0")
    return number


def read_outcomes_csv(path: str | Path) -> list[dict[str, Any]]:
    """The run rows of an ``outcomes.csv`` written by :func:`write_report` (typed as written).

    Columns an older file lacks (the regime settings, the near-miss view) are read as
    ``None``; its optimization clock (``steps``, ``lr_x_wd``, ``decay_clocks``), where not
    written, is derived from its columns as :func:`run_clock` does (steps over the run's
    ``final_epoch``: the steps it took). Each row also gets ``source`` (the file) and
    ``has_metrics`` (False: a CSV holds no learning curves).

    Raises:
        UserError: the file lacks a column the rate table needs, or holds a malformed value
            (naming the file, line and column).
    """
    path = Path(path)
    try:
        return _read_outcomes_csv(path)
    except UnicodeDecodeError as err:
        raise UserError(f"{path} is not UTF-8 text (byte {err.start}: {err.reason}); expected an outcomes.csv "
                        "written by `interp-toolkit report`") from err
    except csv.Error as err:
        raise UserError(f"{path} is not a readable CSV ({err}); expected an outcomes.csv written by "
                        "`interp-toolkit report`") from err


def _read_outcomes_csv(path: Path) -> list[dict[str, Any]]:
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        missing = [k for k in _REQUIRED_CSV_FIELDS if k not in header]
        if missing:
            raise UserError(f"{path} lacks the columns {missing}; expected an outcomes.csv written by "
                            "`interp-toolkit report`")
        rows: list[dict[str, Any]] = []
        for line, raw in enumerate(reader, start=2):
            row = {k: None for k in RUN_FIELDS}
            row.update({k: _parse_csv_value(path, line, k, v or "") for k, v in raw.items() if k is not None})
            if row["r"] is None:
                raise UserError(f"{path} line {line}: column r is empty; every run needs its ratio r")
            _check_text_cells(path, line, row)
            row["r"] = float(row["r"])
            derived = run_clock(row)
            row.update({k: derived[k] for k in CLOCK_FIELDS if row.get(k) is None})
            rows.append({**row, "source": str(path), "has_metrics": False})
    return rows


#: Leading characters a spreadsheet reads as a formula (CSV injection): never in a text cell.
_FORMULA_STARTS = ("=", "+", "@", "\t", "\r")


def _check_text_cells(path: Path, line: int, row: Mapping[str, Any]) -> None:
    """Refuse a row whose task is not a known MPSP task, or whose text cell starts as a
    spreadsheet formula would: such a row was not written by ``report``, and it would be
    copied verbatim into the tables this report writes."""
    from interp_toolkit.tasks.mpsp import TASKS

    task = row.get("task")
    if task not in TASKS:
        raise UserError(f"{path} line {line}: column task is {task!r}, expected one of {', '.join(sorted(TASKS))}; "
                        "the row was not written by `interp-toolkit report`")
    for name in _TEXT_FIELDS:
        value = row.get(name)
        if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
            raise UserError(f"{path} line {line}: column {name} is {value!r}, which a spreadsheet would run as a "
                            "formula; the row was not written by `interp-toolkit report`")


def _run_identity(row: Mapping[str, Any]) -> tuple[Any, ...] | None:
    # A sweep names run directories by a hash of every config, so the same name with the same
    # settings and seed is the same run (a copy, or a CSV of it), wherever it was found.
    if not row.get("run_dir"):
        return None
    return (Path(str(row["run_dir"])).name, *cell_key(row), row.get("seed"))


def _copy_rank(row: Mapping[str, Any]) -> tuple[bool, bool, int]:
    """Which of two copies of one run to keep: read from its directory, finished, more evaluations."""
    return bool(row.get("has_metrics")), row.get("status") == "finished", row.get("n_evaluations") or 0


#: Outcome columns two finished copies of one run must agree on: booleans and epochs, so a
#: CSV's rounding of the accuracies never reads as a conflict.
_CONFLICT_FIELDS = ("generalized", "rule_learned", "transient", "first_generalized_epoch",
                    "first_rule_learned_epoch", "final_epoch")


def _same_source(row: Mapping[str, Any], source: Path) -> bool:
    return Path(str(row.get("source"))).resolve() == source


def _conflicts(copies: Sequence[Mapping[str, Any]]) -> list[str]:
    """The :data:`_CONFLICT_FIELDS` on which finished copies of one run disagree."""
    finished = [row for row in copies if row.get("status") == "finished"]
    return [field for field in _CONFLICT_FIELDS
            if len({row.get(field) for row in finished if row.get(field) is not None}) > 1]


def _conflict_error(copies: Sequence[Mapping[str, Any]], fields: Sequence[str], prefer: Path | None) -> UserError:
    name = Path(str(copies[0]["run_dir"])).name
    described = "; ".join(
        f"{row.get('source')}: " + ", ".join(f"{field}={row.get(field)}" for field in fields)
        for row in copies if row.get("status") == "finished")
    if prefer is None:
        advice = "choose the source that wins with --prefer SOURCE"
    elif not any(_same_source(row, prefer) for row in copies):
        advice = f"--prefer {prefer} holds no copy of it; prefer a source that does"
    else:
        advice = f"--prefer {prefer} itself holds conflicting copies; fix or drop that source"
    return UserError(f"run {name} has conflicting copies (outcomes differ) in: {described}; {advice}")


def merge_runs(row_lists: Sequence[Sequence[Mapping[str, Any]]],
               prefer: str | Path | None = None) -> tuple[list[dict[str, Any]], int]:
    """Rows of several sources as one list, each run once; sorted by cell, seed, directory.

    Two rows are the same run when their run directories have the same name and they agree
    on every cell setting and the seed (a sweep names a run's directory by a hash of its
    configs). Of the copies, the one read from a run directory (fresh metrics) is kept over
    one from a CSV, then a finished one, then the one with more evaluations. Finished copies
    whose outcomes differ (:data:`_CONFLICT_FIELDS`) are conflicting: the merge refuses
    them unless ``prefer`` names the source whose copy wins (identical copies merge silently).

    Args:
        row_lists: Each source's rows (every row names its ``source``).
        prefer: The source (a path among the rows' ``source``) whose copy wins a conflict.

    Returns:
        ``(rows, n_duplicates_dropped)``.

    Raises:
        UserError: Conflicting copies of a run that ``prefer`` does not settle (naming the
            run, its sources and the differing outcomes).
    """
    preferred = None if prefer is None else Path(prefer).resolve()
    copies: dict[Any, list[dict[str, Any]]] = {}
    for rows in row_lists:
        for row in rows:
            key = _run_identity(row)
            if key is None:  # no directory named: nothing to match it with
                key = ("unnamed", id(row))
            copies.setdefault(key, []).append(dict(row))
    kept = []
    for group in copies.values():
        candidates = group
        fields = _conflicts(group)
        if fields:
            candidates = [row for row in group if preferred is not None and _same_source(row, preferred)]
            if not candidates or _conflicts(candidates):
                raise _conflict_error(group, fields, preferred)
        best = candidates[0]
        for row in candidates[1:]:
            if _copy_rank(row) > _copy_rank(best):
                best = row
        kept.append(best)
    dropped = sum(len(group) - 1 for group in copies.values())
    merged = sorted(kept, key=lambda r: (sort_key(cell_key(r)), sort_key([r.get("seed")]),
                                         str(r.get("run_dir") or "")))
    return merged, dropped
