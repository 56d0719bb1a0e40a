"""Generalization rate and basin retention along the optimization clock, per setting.

A sweep's cells differ in lr, weight decay, batch size and horizon, so their epochs are not
comparable; their decay clocks are (``steps x lr x wd``, AdamW's decoupled-decay timescale:
:func:`~interp_toolkit.studies.grid.cells.optimizer_clock`). :func:`clock_table` turns outcome
rows (``outcomes.csv``, or :func:`~interp_toolkit.studies.grid.study.collect_runs`) into two step
functions of the clock ``c`` per *setting*: a cell without the fields that only say how long
or how often it ran (``study``, ``epochs``, ``eval_every``), so runs of one setting trained in
different stages to different horizons pool:

* ``observed(c)``: runs that trained at least to clock ``c`` (a shorter run is censored
  there, not counted as a failure);
* ``reached(c)``: of those, runs that met the paper's criterion (100% on the generalization
  split) at or before ``c``: ``reached_rate`` is the paper's any-time rate had the runs
  stopped at ``c``;
* ``held(c)``: of those, runs still in their basin at ``c``: generalized and not yet out
  of it (``left_epoch``, the start of the first fall below ``transient_tolerance`` that lasts
  ``transient_min_span`` evaluations: :mod:`~interp_toolkit.studies.common.outcomes`). ``held_rate``
  is basin retention: a hot regime whose runs touch 100% and fall back has a high
  ``reached_rate`` and a low ``held_rate``; a stable one keeps them together.

``reached_low`` and ``reached_high`` bound ``reached_rate`` (95% Wilson interval over the
``n_observed`` runs), so a setting's rate at its last clock reads as a table cell does.

Only outcome columns are read (``first_generalized_epoch``, ``left_epoch``, ``final_epoch``
and the clock's inputs), so a report regenerates the table and its figure from a committed
``outcomes.csv`` alone.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from interp_toolkit.errors import UserError
from interp_toolkit.studies.common.statistics import wilson_interval
from interp_toolkit.studies.grid.cells import (
    SHORT_NAMES,
    cell_fields,
    cell_key,
    format_setting,
    hashable,
    optimizer_clock,
    sort_key,
)

#: Cell fields that say how long or how often a setting ran, not what it is.
HORIZON_FIELDS = ("study", "epochs", "eval_every")

#: Columns of :func:`clock_table` after the setting's own fields.
CLOCK_STATS = ("setting", "studies", "decay_clocks", "n_observed", "n_reached", "n_held", "reached_rate", "reached_low",
               "reached_high", "held_rate")


def setting_fields(rows: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The fields a setting is keyed by: :func:`~interp_toolkit.studies.grid.cells.cell_fields`
    without :data:`HORIZON_FIELDS` (``r`` included: each r is a setting of its own)."""
    return tuple(k for k in cell_fields(rows) if k not in HORIZON_FIELDS)


def _clock(row: Mapping[str, Any], epoch: Any) -> float | None:
    if epoch is None:
        return None
    return optimizer_clock(row.get("n_train"), row.get("batch_size"), row.get("lr"), row.get("weight_decay"),
                           epoch, schedule=row, planned_epochs=row.get("epochs"))["decay_clocks"]


def setting_label(row: Mapping[str, Any], fields: Sequence[str]) -> str:
    """``"lr 0.001, wd 1, batch 512, r 0.9"``: the ``fields`` of ``row`` as text (the
    dotted settings by their last part: ``init``, ``betas``)."""
    names = {**SHORT_NAMES, "batch_size": "batch"}
    return ", ".join(f"{names.get(k, k.rsplit('.', 1)[-1])} {format_setting(k, row.get(k))}" for k in fields)


def clock_table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Reached and held rates of every setting at every clock where one of them changes.

    Args:
        rows: Outcome rows, each with its settings, ``final_epoch`` (how far it trained),
            ``first_generalized_epoch`` and ``left_epoch`` (None where they did not happen).
            Rows without a known clock (no lr, weight decay or ``n_train``) or without an
            evaluation (``final_epoch`` missing or 0) are left out.

    Returns:
        One dict per (setting, clock), settings in sorted order and clocks ascending: the
        setting's fields (:func:`setting_fields`), ``setting`` (a label of the fields other
        than r that vary among the settings: the settings of one label differ only in r),
        ``studies`` (the studies whose runs the setting pools, sorted and ``"; "``-joined;
        empty for rows without a ``study``), ``decay_clocks`` and the counts and rates of the
        module docstring. A setting's first clock is its first run's first change (the
        curves start at 0 before it), its last its longest run's end.

    Raises:
        ValueError: A row whose ``first_generalized_epoch`` or ``left_epoch`` lies after
            its ``final_epoch`` (not what an outcome record holds).
    """
    fields = setting_fields(rows)
    groups: dict[tuple[Any, ...], list[tuple[float, float | None, float | None]]] = {}
    studies: dict[tuple[Any, ...], set[str]] = {}
    firsts: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for row in rows:
        end = _clock(row, row.get("final_epoch"))
        if not end:
            continue
        reached_at, left_at = _clock(row, row.get("first_generalized_epoch")), _clock(row, row.get("left_epoch"))
        for name, value in (("first_generalized_epoch", reached_at), ("left_epoch", left_at)):
            if value is not None and value > end:
                raise UserError(f"run {row.get('run_dir') or row.get('seed')}: {name} {row.get(name)} is after "
                                 f"its final_epoch {row.get('final_epoch')}; expected an epoch it trained")
        key = tuple(hashable(value) for value in cell_key(row, fields))
        groups.setdefault(key, []).append((end, reached_at, left_at))
        firsts.setdefault(key, row)
        if row.get("study") not in (None, ""):
            studies.setdefault(key, set()).add(str(row["study"]))
    keys = sorted(groups, key=sort_key)
    shown = [k for i, k in enumerate(fields) if k != "r" and len({key[i] for key in keys}) > 1]
    table = []
    for key in keys:
        runs = groups[key]
        clocks = sorted({c for run in runs for c in run if c is not None})
        label = setting_label(firsts[key], shown)
        pooled = "; ".join(sorted(studies.get(key, ())))
        for clock in clocks:
            observed = [run for run in runs if run[0] >= clock]
            reached = [run for run in observed if run[1] is not None and run[1] <= clock]
            held = [run for run in reached if run[2] is None or clock < run[2]]
            n = len(observed)
            low, high = wilson_interval(len(reached), n)
            table.append({**dict(zip(fields, key, strict=True)), "setting": label, "studies": pooled,
                          "decay_clocks": clock, "n_observed": n, "n_reached": len(reached), "n_held": len(held),
                          "reached_rate": len(reached) / n, "reached_low": low, "reached_high": high,
                          "held_rate": len(held) / n})
    return table


def clock_fields(table: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """Column order of a :func:`clock_table` CSV."""
    if not table:
        return CLOCK_STATS
    return tuple(k for k in table[0] if k not in CLOCK_STATS) + CLOCK_STATS


__all__ = ["CLOCK_STATS", "HORIZON_FIELDS", "clock_fields", "clock_table", "setting_fields", "setting_label"]
