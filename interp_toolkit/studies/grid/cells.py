"""The vocabulary of study cells: the settings a cell is keyed by, their labels, and the cell
specs of ``report --compare`` / ``--where`` (``"L=2,r=0.9,seq_len=8"``).

A cell is every setting of a run but its seed (:data:`CELL_FIELDS`), so runs of different
regimes never pool into one rate; :func:`run_settings` reads them from a run's ``run.json``.

Beyond :data:`CELL_FIELDS`, any field of a run's task, model or train config that differs from
its default (or that the base configs do not know: a subclass's own field) is a setting of its
own, named ``"SECTION.FIELD"`` (``"train.label_smoothing"``): a cell key, a column of the
outcome tables and a key of cell specs, with no edit here. Rows without such a column (an
older outcomes.csv) read as its default, so they pool with runs at the default, and tables of
rows that have none are exactly the tables of earlier versions. A few train fields choose
only how or how often to record (:data:`NOT_CELL_SETTINGS`) and are never cell keys.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence

from interp_toolkit.config import _plain
from interp_toolkit.errors import UserError
from interp_toolkit.runs.config import lr_steps, steps_per_epoch
from interp_toolkit.runs.record import task_dict
from interp_toolkit.studies.common.outcomes import OutcomeThresholds
from interp_toolkit.studies.grid.config import FLAT_NAMES, PER_RUN, SECTIONS, SweepConfig

#: Settings that tell regimes apart beyond the architecture (the study's name, so a
#: calibration study and the final study never pool even at equal settings; task size and difficulty,
#: widths, optimizer budget, evaluation cadence, early stop, the outcome threshold): cells
#: are keyed by them too, so runs of different regimes never pool into one rate.
REGIME_FIELDS = ("study", "seq_len", "n_values", "n_train", "n_eval", "data_seed", "d_model", "d_mlp", "lr", "epochs",
                 "batch_size", "eval_every", "early_stop", "threshold")


#: A cell: task, regime, architecture (layers, heads), weight decay, r. Sorted in this order.
CELL_FIELDS = (
    "task", "study", "seq_len", "n_values", "n_train", "n_eval", "data_seed", "n_layers", "n_heads", "d_model", "d_mlp",
    "weight_decay", "lr", "epochs", "batch_size", "eval_every", "early_stop", "threshold", "r",
)


#: The ``data_seed`` of a run whose data seed is its model seed (a study with
#: ``data_seeds="model"``): a fresh dataset per seed is a seed of the cell, so such runs
#: pool into one cell instead of one cell per dataset.
TIED_DATA_SEED = "seed"


#: A cell without its r: the group within which contrasts compare r values.
ARCH_FIELDS = tuple(k for k in CELL_FIELDS if k != "r")


#: Cell-spec keys accepted by :func:`find_cell` (short names first), mapped to cell fields.
_SPEC_KEYS = {"task": "task", "L": "n_layers", "layers": "n_layers", "H": "n_heads", "heads": "n_heads",
              "wd": "weight_decay", **{k: k for k in CELL_FIELDS}}


_INT_FIELDS = ("seq_len", "n_values", "n_train", "n_eval", "data_seed", "n_layers", "n_heads", "d_model", "d_mlp",
               "epochs", "batch_size", "eval_every")


#: Short names of cell fields in printed tables and labels.
SHORT_NAMES = {"n_layers": "L", "n_heads": "H", "weight_decay": "wd"}


#: Config fields that choose how or how often a run is recorded or computed, not what it
#: learns: never cell settings (checkpoints add evaluations but change no training step).
NOT_CELL_SETTINGS = {"task": ("name",), "model": (),
                     "train": ("checkpoint_every", "checkpoint_log_spaced", "progress", "eval_batch_size", "engine",
                               "device")}


def is_extra_setting(name: Any) -> bool:
    """Whether a row key names a ``"SECTION.FIELD"`` setting (a config field beyond :data:`CELL_FIELDS`)."""
    return isinstance(name, str) and "." in name and name.partition(".")[0] in SECTIONS


def extra_fields(rows: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The ``"SECTION.FIELD"`` settings any of ``rows`` has, sorted."""
    return tuple(sorted({key for row in rows for key in row if is_extra_setting(key)}))


def cell_fields(rows: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The fields ``rows``' cells are keyed by: :data:`CELL_FIELDS` with their extra settings
    before ``r`` (:data:`CELL_FIELDS` itself when they have none)."""
    return CELL_FIELDS[:-1] + extra_fields(rows) + CELL_FIELDS[-1:]


def arch_fields(rows: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """:func:`cell_fields` without r: the groups within which contrasts compare r values."""
    return tuple(k for k in cell_fields(rows) if k != "r")


def regime_fields(rows: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """:data:`REGIME_FIELDS` plus ``rows``' extra settings."""
    return REGIME_FIELDS + extra_fields(rows)


def setting_default(name: str) -> Any:
    """The default of a ``"SECTION.FIELD"`` setting (its base config's; None if it has none)."""
    section, _, field = name.partition(".")
    return _hashable_value(SweepConfig.section_defaults(section).get(field)) if section in SECTIONS else None


#: The ``"train.*"`` settings that shape the learning rate over training, read by
#: :func:`optimizer_clock` (absent: their :func:`setting_default`).
SCHEDULE_SETTINGS = ("train.warmup_steps", "train.lr_schedule", "train.min_lr_ratio")

#: Extra settings every report names, at their default too: the optimizer's betas, its
#: warmup, learning-rate schedule (and floor) and gradient clipping (none stated by the paper,
#: so every outcome table says which were used; runs recorded before the schedule options
#: existed trained at their defaults: no warmup, a constant lr, no clipping).
ALWAYS_REPORTED = ("train.betas", *SCHEDULE_SETTINGS, "train.grad_clip")


def complete_settings(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with every extra setting any of them has and every :data:`ALWAYS_REPORTED`
    one: a row without one (a run recorded before it existed, or at its default) gets its
    default.

    An outcomes.csv without a ``train.betas`` column therefore reads as betas (0.9, 0.98),
    ``TrainConfig``'s default since the first version of this project (no version had
    another); the committed docs/reproduction/outcomes.csv was checked against git history
    (every run of it used that default).
    """
    extras = tuple(sorted(set(extra_fields(rows)) | set(ALWAYS_REPORTED))) if rows else ()
    return [{**{name: setting_default(name) for name in extras if name not in row}, **row} for row in rows]


def _hashable_value(value: Any) -> Any:
    return tuple(_hashable_value(v) for v in value) if isinstance(value, (list, tuple)) else value


def parse_setting_text(text: str) -> Any:
    """An extra setting's value as written in an outcomes.csv or a cell spec: JSON (numbers,
    lists, true/false, null), ``True``/``False``, ``none``, or else the text itself."""
    text = text.strip()
    if text in ("True", "False"):
        return text == "True"
    if text.lower() in ("none", "full"):
        return None
    try:
        return _hashable_value(json.loads(text))
    except ValueError:
        return text


def extra_settings(record: Mapping[str, Any]) -> dict[str, Any]:
    """A run's ``"SECTION.FIELD"`` settings from its ``run.json``: every task, model and train
    field beyond :data:`CELL_FIELDS` (and :data:`NOT_CELL_SETTINGS`) whose value differs from
    its default, or that the base configs lack."""
    sections = {"task": task_dict(record) or {}, "model": record.get("model_config") or {},
                "train": record.get("train_config") or {}}
    known = _cell_known()
    out = {}
    for section, values in sections.items():
        baseline = _baseline(section, values)
        for name, value in values.items():
            if (section, name) in known or name in NOT_CELL_SETTINGS[section]:
                continue
            if name not in baseline or _plain(value) != baseline[name]:
                out[f"{section}.{name}"] = _hashable_value(value)
    return out


def _cell_known() -> set[tuple[str, str]]:
    """The config fields that :data:`CELL_FIELDS` and the seed already hold, or that a sweep
    sets per run (``(section, field)`` pairs)."""
    return ({where for flat, where in FLAT_NAMES.items() if flat in CELL_FIELDS}
            | {(section, name) for section, names in PER_RUN.items() for name in names})


def _baseline(section: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """What a run's ``section`` holds when nothing beyond the cell fields was set: the config
    built from those fields alone (so derived fields, e.g. ``d_head``, match), else the defaults."""
    cls = SweepConfig.config_classes()[section]
    given = {name for known_section, name in _cell_known() if known_section == section}
    try:
        return cls(**{k: v for k, v in values.items() if k in given}).to_dict()
    except (TypeError, ValueError, UserError):
        return SweepConfig.section_defaults(section)


def sort_key(values: Sequence[Any]) -> tuple[Any, ...]:
    """Sort key of settings tuples that may hold ``None`` (a setting an older record lacks)."""
    # a text value (a tied data seed) sorts after the numbers of its column, never against them
    return tuple((value is None, isinstance(value, str), "" if value is None else value) for value in values)


def cell_key(row: Mapping[str, Any], fields: Sequence[str] = CELL_FIELDS) -> tuple[Any, ...]:
    return tuple(row.get(k) for k in fields)


def varying_fields(rows: Sequence[Mapping[str, Any]], fields: Sequence[str] | None = None) -> list[str]:
    """The ``fields`` (default: :func:`regime_fields` of ``rows``) that take more than one
    value among ``rows`` (in ``fields`` order)."""
    fields = regime_fields(rows) if fields is None else fields
    return [k for k in fields if len({hashable(row.get(k)) for row in rows}) > 1]


def hashable(value: Any) -> Any:
    # 0.1 and 0.1000000001 are one setting; ints and floats of one value are too; a list
    # setting (betas from a row built in Python) keys as the tuple of its values
    if isinstance(value, (list, tuple)):
        return tuple(hashable(item) for item in value)
    return round(value, 12) if isinstance(value, float) else value


def format_setting(field: str, value: Any) -> str:
    if value is None:
        return "full" if field == "batch_size" else "?"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "/".join(format_setting(field, v) for v in value)
    return str(value)


def cell_label(row: Mapping[str, Any], regime_fields: Sequence[str] = ()) -> str:
    """``task [seq_len=.. ...] L=.. H=.. wd=.. r=..`` of a table row.

    Args:
        row: A table (or outcome) row.
        regime_fields: Regime fields to name too (e.g. :func:`varying_fields` of the table),
            as ``KEY=VALUE`` in the spelling :func:`find_cell` accepts.
    """
    named = (*REGIME_FIELDS, *(k for k in regime_fields if is_extra_setting(k)))
    regime = "".join(f" {k}={format_setting(k, row.get(k))}" for k in named if k in regime_fields)
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
            raise UserError(f"cell spec {spec!r}: {key}={value!r} is not a boolean (true/false)")
        return lowered in ("true", "yes", "1")
    if field == "batch_size" and value.lower() in ("full", "none"):
        return None
    if field == "data_seed" and value == TIED_DATA_SEED:
        return value
    try:
        number = int(value) if field in _INT_FIELDS else float(value)
    except ValueError as err:
        kind = "an integer" if field in _INT_FIELDS else "a number"
        raise UserError(f"cell spec {spec!r}: {key}={value!r} is not {kind}") from err
    if not math.isfinite(number):  # nan would match every run (no comparison with it is false)
        raise UserError(f"cell spec {spec!r}: {key}={value!r} is not a finite number")
    return number


def matches_spec(row: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    for field, value in wanted.items():
        have = row.get(field)
        if isinstance(value, float) and not isinstance(have, bool) and isinstance(have, (int, float)):
            if abs(have - value) >= 1e-9:
                return False
        elif have != value:
            return False
    return True


def _refuse_repeated(spec: str, key: str, field: str, wanted: Mapping[str, Any]) -> None:
    # Every key of one spec must match, so a key given twice could only mean "either" or a
    # typo; "either" is written as two specs (--where r=0.5 r=0.9), so a repeat is refused.
    if field in wanted:
        raise UserError(f"cell spec {spec!r} sets {key} twice; every key of one spec must match, so give "
                         f"each key once (for runs matching either value, pass two specs, e.g. "
                         f"--where {key}=A {key}=B)")


def parse_cell_spec(spec: str) -> dict[str, Any]:
    """A cell spec like ``"L=2,r=0.9,seq_len=8"`` as ``{cell field: typed value}``.

    Keys are those :func:`find_cell` accepts, and any ``SECTION.FIELD`` setting
    (``train.label_smoothing=0.1``); values are typed as the fields are (integers, numbers,
    ``true``/``false`` for ``early_stop``, ``full`` for a full batch; a ``SECTION.FIELD``
    value as :func:`parse_setting_text` reads it).

    Raises:
        ValueError: an empty spec, an unknown key, a key given twice (its runs matching
            either value are two specs), a value of the wrong type or not finite (``nan``), named.
    """
    wanted: dict[str, Any] = {}
    for part in (p.strip() for p in str(spec).split(",") if p.strip()):
        key, sep, value = part.partition("=")
        if sep and is_extra_setting(key.strip()):
            _refuse_repeated(spec, key.strip(), key.strip(), wanted)
            wanted[key.strip()] = parse_setting_text(value)
            continue
        if not sep or key.strip() not in _SPEC_KEYS:
            raise UserError(f"cell spec {spec!r}: expected comma-separated KEY=VALUE with KEY in "
                             f"task, L, H, wd, r or a setting ({', '.join(REGIME_FIELDS)}, or SECTION.FIELD with "
                             f"SECTION in {', '.join(SECTIONS)}); got {part!r}")
        field = _SPEC_KEYS[key.strip()]
        _refuse_repeated(spec, key.strip(), field, wanted)
        wanted[field] = _parse_spec_value(spec, key.strip(), field, value)
    if not wanted:
        raise UserError(f"cell spec {spec!r} is empty; expected e.g. 'L=2,r=0.9'")
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
        raise UserError(f"selection {' '.join(repr(spec) for spec in specs)} matches none of the {len(rows)} runs; "
                         f"values among them: {present}")
    return kept


def find_cell(table: Sequence[Mapping[str, Any]], spec: str) -> Mapping[str, Any]:
    """The one table row matching a spec like ``"L=2,r=0.9,seq_len=8"``.

    Keys: ``task``, ``study`` (the sweep's name), ``L`` (``layers``), ``H`` (``heads``),
    ``wd``, ``r`` and every cell field by its name (``seq_len``, ``n_values``, ``n_train``, ``n_eval``, ``data_seed``,
    ``d_model``, ``d_mlp``, ``lr``, ``epochs``, ``batch_size`` (``full``: full batch),
    ``eval_every``, ``early_stop`` (true/false), ``threshold``) and every ``SECTION.FIELD`` setting
    (``train.label_smoothing``).

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
        raise UserError(f"cell spec {spec!r} matches no cell; cells: {cells}")
    choices = []
    for field in varying_fields(found, cell_fields(found)):
        values = sorted({row.get(field) for row in found}, key=lambda v: sort_key([v]))
        choices.append(f"{SHORT_NAMES.get(field, field)} ({', '.join(format_setting(field, v) for v in values)})")
    cells = "; ".join(cell_label(row, shown) for row in found)
    raise UserError(f"cell spec {spec!r} is ambiguous: it matches {len(found)} cells ({cells}); add a key that "
                     f"tells them apart: {', '.join(choices)}")


#: The optimization clock of a run or cell (see :func:`optimizer_clock`), next to ``epochs``
#: in every outcome table.
CLOCK_FIELDS = ("steps", "lr_x_wd", "decay_clocks")


def with_clock(fields: Sequence[str]) -> tuple[str, ...]:
    """``fields`` with :data:`CLOCK_FIELDS` inserted right after ``epochs``."""
    fields = tuple(fields)
    at = fields.index("epochs") + 1
    return fields[:at] + CLOCK_FIELDS + fields[at:]


def _rounded(value: float) -> float:
    return float(f"{value:.12g}")  # 0.001 x 0.1 reads 0.0001, not 0.00010000000000000002


def schedule_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """``{"warmup_steps", "lr_schedule", "min_lr_ratio"}`` of a run or cell row (its
    :data:`SCHEDULE_SETTINGS`, text as written in an outcomes.csv parsed; absent or empty: the
    default)."""
    out: dict[str, Any] = {}
    for name in SCHEDULE_SETTINGS:
        value = row.get(name)
        if isinstance(value, str):
            value = parse_setting_text(value) if value.strip() else None
        out[name.partition(".")[2]] = setting_default(name) if value is None else value
    return {"warmup_steps": int(out["warmup_steps"]), "lr_schedule": str(out["lr_schedule"]),
            "min_lr_ratio": float(out["min_lr_ratio"])}


def optimizer_clock(n_train: Any, batch_size: Any, lr: Any, weight_decay: Any, epochs: Any,
                    schedule: Mapping[str, Any] | None = None, planned_epochs: Any = None) -> dict[str, Any]:
    """``{"steps", "lr_x_wd", "decay_clocks"}`` of ``epochs`` epochs: optimizer steps
    (``epochs`` x :func:`~interp_toolkit.runs.config.steps_per_epoch`), ``lr x weight_decay`` at
    the peak lr (AdamW's decoupled decay shrinks weights by ``lr_t x wd`` per step) and ``decay_clocks``, that
    shrinkage summed over the steps: ``steps x lr x wd`` at a constant lr, ``lr x wd`` times
    :func:`~interp_toolkit.runs.config.lr_steps` under a warmup or a decaying ``schedule`` (a
    row with :data:`SCHEDULE_SETTINGS`; the schedule spans ``planned_epochs``, default
    ``epochs``, so an early-stopped run's clock counts the lr it actually had). A value whose
    inputs are unknown (None) is None; ``batch_size`` None is full batch."""
    lr_x_wd = None if lr is None or weight_decay is None else _rounded(float(lr) * float(weight_decay))
    steps = None if n_train is None or epochs is None else int(epochs) * steps_per_epoch(n_train, batch_size)
    shape = schedule_of(schedule or {})
    if steps is None or lr_x_wd is None:
        clocks = None
    elif shape["warmup_steps"] == 0 and shape["lr_schedule"] == "constant":
        clocks = _rounded(steps * float(lr) * float(weight_decay))  # the committed tables' arithmetic
    else:
        planned = int(planned_epochs if planned_epochs is not None else epochs) * steps_per_epoch(n_train, batch_size)
        clocks = _rounded(lr_steps(steps, planned, **shape) * float(lr) * float(weight_decay))
    return {"steps": steps, "lr_x_wd": lr_x_wd, "decay_clocks": clocks}


def run_settings(record: Mapping[str, Any], thresholds: OutcomeThresholds | None = None) -> dict[str, Any]:
    """Every setting of a run that :data:`CELL_FIELDS` keys on, plus its seed, from ``run.json``.

    Settings an older record lacks are ``None``. ``early_stop`` is whether the run was
    trained with early stopping (``run_info.early_stop``, written by the sweep). Config
    fields beyond those that differ from their defaults come as ``"SECTION.FIELD"`` keys
    (:func:`extra_settings`).
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
        "r": float(task["r"]) if "r" in task else None, "seed": model.get("seed"), **extra_settings(record),
    }


__all__ = ["ALWAYS_REPORTED", "ARCH_FIELDS", "CELL_FIELDS", "CLOCK_FIELDS", "NOT_CELL_SETTINGS",
           "REGIME_FIELDS", "SCHEDULE_SETTINGS", "SHORT_NAMES", "TIED_DATA_SEED",
           "arch_fields", "cell_fields", "cell_key", "cell_label", "complete_settings",
           "extra_fields", "extra_settings", "find_cell", "format_setting", "hashable",
           "is_extra_setting", "matches_spec", "optimizer_clock", "parse_cell_spec",
           "parse_setting_text", "schedule_of",
           "regime_fields", "run_settings", "select_runs", "setting_default", "sort_key",
           "spec_list", "varying_fields", "with_clock"]
