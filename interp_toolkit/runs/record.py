"""The run record (``run.json``): the only code that writes, reads and checks it.

A run directory's ``run.json`` says what the run is and how far it got:

- ``key``: hash of the run's identity (configs + data fingerprints + task); two runs with
  the same key are the same computation, and a directory never holds two keys;
- ``status``: ``"running"`` while training, ``"finished"`` after it (``"done"`` for DLN
  runs written before this module existed is read as finished);
- ``model_config``, ``train_config``, ``seeds``, ``split_sizes``;
- ``run_info``: free JSON description; ``run_info["task"]`` is the task config the data
  was built from (for MPSP runs an ``MPSPConfig`` dict plus its ``name``);
- ``versions``: library versions at write time; ``final``: the last evaluation.

Every trainer (:mod:`interp_toolkit.runs.trainer`, :mod:`interp_toolkit.runs.batched`,
:mod:`interp_toolkit.studies.bif.dln`, the DLN trainer) writes records through :func:`write_record`, and every
reader (CLI ``info``/``bif``/``analyze``, reports, sweeps) goes through :func:`read_record`
or :func:`task_config`, so a missing or foreign record fails the same way everywhere.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, Mapping

from interp_toolkit.errors import UserError
from interp_toolkit.io import atomic_write_json
from interp_toolkit.runs.layout import RECORD

RECORD_NAME = RECORD
FINISHED = ("finished", "done")


class RunRecordError(UserError):
    """A run record is missing, unreadable, foreign to the run, or names other data."""


def record_path(run_dir: str | Path) -> Path:
    """Where ``run_dir``'s record lives."""
    return Path(run_dir) / RECORD_NAME


def has_record(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a run record."""
    return record_path(run_dir).is_file()


def read_record(run_dir: str | Path) -> dict[str, Any]:
    """The record of ``run_dir``.

    Raises:
        RunRecordError: If there is no ``run.json`` or it is not a JSON object.
    """
    path = record_path(run_dir)
    if not path.is_file():
        raise RunRecordError(f"{run_dir} is not a run directory (no {RECORD_NAME})")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RunRecordError(f"{path} is not a readable run record ({err}); move the directory aside or "
                             f"rerun with --overwrite") from err
    if not isinstance(record, dict):
        raise RunRecordError(f"{path} must hold a JSON object, got {type(record).__name__}")
    return record


def read_run_record(run_dir: str | Path, key: str) -> dict[str, Any] | None:
    """The record of ``run_dir`` if it belongs to the run ``key``; None if there is none.

    Raises:
        RunRecordError: If ``run_dir`` holds a different run (two runs never share a directory).
    """
    if not has_record(run_dir):
        return None
    record = read_record(run_dir)
    if record.get("key") != key:
        raise RunRecordError(
            f"run directory {run_dir} holds a different run (key {record.get('key')}, this "
            f"run's key {key}); choose another run_dir"
        )
    return record


def write_record(run_dir: str | Path, record: Mapping[str, Any]) -> Path:
    """Write ``record`` as ``run_dir``'s ``run.json`` atomically (needs a ``key``)."""
    if "key" not in record:
        raise UserError("a run record needs a 'key'")
    return atomic_write_json(record_path(run_dir), dict(record))


def is_finished(record: Mapping[str, Any] | None) -> bool:
    """Whether a record says its run finished."""
    return record is not None and record.get("status") in FINISHED


def library_versions() -> dict[str, str]:
    """Versions recorded in every run record."""
    from importlib.metadata import PackageNotFoundError, version

    import numpy
    import torch

    from interp_toolkit import __version__

    try:
        tl_version = version("transformer-lens")
    except PackageNotFoundError:  # pragma: no cover - an unusual install
        tl_version = "unknown"
    return {
        "interp_toolkit": __version__,
        "torch": torch.__version__,
        "transformer_lens": tl_version,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
    }


def new_training_record(
    *, key: str, identity: Mapping[str, Any], model_config: Mapping[str, Any],
    train_config: Mapping[str, Any], split_sizes: Mapping[str, int],
    run_info: Mapping[str, Any] | None, **extra: Any,
) -> dict[str, Any]:
    """The record a trainer writes when a run starts (status ``running``)."""
    record = {
        "key": key,
        "status": "running",
        "identity": dict(identity),
        "train_config": dict(train_config),
        "model_config": dict(model_config),
        "seeds": {"model": model_config.get("seed"), "shuffle": train_config.get("seed")},
        "split_sizes": dict(split_sizes),
        "versions": library_versions(),
        "run_info": dict(run_info or {}),
    }
    record.update(extra)
    return record


def finish_record(run_dir: str | Path, record: dict[str, Any], final: Mapping[str, Any],
                  seconds: float, **extra: Any) -> dict[str, Any]:
    """Mark ``record`` finished with its last evaluation and write it."""
    record.update(status="finished", final=dict(final), train_seconds=seconds, **extra)
    write_record(run_dir, record)
    return record


def write_recovered_record(
    run_dir: str | Path, recovered: Mapping[str, Any], *, identity: Mapping[str, Any],
    model_config: Mapping[str, Any], train_config: Mapping[str, Any], run_info: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """Write back the record of a finished run whose ``run.json`` was missing.

    ``recovered`` is the record rebuilt from the run's own files
    (:func:`interp_toolkit.runs.resume.recover_finished_record`: key, status, final
    evaluation); the run's configs and the library versions complete it, as a trainer writes
    them. Returns the record written.
    """
    record = {**recovered, "identity": dict(identity), "train_config": dict(train_config),
              "model_config": dict(model_config), "run_info": dict(run_info or {}),
              "versions": library_versions()}
    write_record(run_dir, record)
    return record


def task_dict(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The task config stored in a record (``run_info.task``), or None."""
    task = (record.get("run_info") or {}).get("task")
    return dict(task) if isinstance(task, dict) else None


def find_run_dir(checkpoint: str | Path) -> Path | None:
    """The run directory holding ``checkpoint`` (``RUN/checkpoints/x.safetensors``), if any."""
    checkpoint = Path(checkpoint)
    for folder in (checkpoint.parent, checkpoint.parent.parent):
        if has_record(folder):
            return folder
    return None


def task_config(run_dir: str | Path) -> Any:
    """The task a run was trained on, read from its record: an ``MPSPConfig``, or a
    :class:`~interp_toolkit.tasks.custom.CustomTask` for a run of a task factory.

    Raises:
        RunRecordError: If the record is missing or names no task (saying how a run gets one).
    """
    from interp_toolkit.tasks.custom import CustomTask, is_custom_record
    from interp_toolkit.tasks.mpsp import MPSPConfig

    record = read_record(run_dir)
    task = task_dict(record)
    if not task:
        raise RunRecordError(
            f"{record_path(run_dir)} records no task (run_info.task), so its data cannot be rebuilt: pass the "
            "splits to the library function (splits=...), or train with a task the run records "
            "(an MPSP task, or --task-factory / CustomTask for your own: see docs/custom_tasks.md)")
    if is_custom_record(task):
        try:
            return CustomTask.from_dict(task)
        except (TypeError, ValueError, UserError) as err:
            raise RunRecordError(f"{record_path(run_dir)} holds a custom task that cannot be read: {err}") from err
    task.pop("name", None)
    try:
        return MPSPConfig.from_dict(task)
    except (TypeError, ValueError, UserError) as err:
        raise RunRecordError(f"{record_path(run_dir)} holds a task that is not an MPSP config: {err}") from err


def mpsp_task_config(run_dir: str | Path, needed_by: str) -> Any:
    """The run's ``MPSPConfig``; RunRecordError naming ``needed_by`` (what needs MPSP data)
    for a run of a custom task."""
    from interp_toolkit.tasks.custom import CustomTask

    task = task_config(run_dir)
    if isinstance(task, CustomTask):
        raise RunRecordError(f"{needed_by} needs an MPSP task (its sequence values and features), but the run at "
                             f"{run_dir} was trained on the custom task {task.name!r} ({task.factory})")
    return task


def check_task_matches(run_dir: str | Path, requested: Any) -> None:
    """Refuse data of another task than the one the run at ``run_dir`` was trained on.

    Args:
        run_dir: A run directory with a record.
        requested: The ``MPSPConfig`` the caller is about to use with the run's checkpoints.

    Raises:
        RunRecordError: Naming every field that differs (task, seq_len, r, ...).
    """
    recorded = task_config(run_dir).to_dict()
    wanted = requested.to_dict()
    differ = {k: (recorded.get(k), wanted.get(k)) for k in sorted(set(recorded) | set(wanted))
              if recorded.get(k) != wanted.get(k)}
    if differ:
        detail = ", ".join(f"{k} {r!r} (requested {w!r})" for k, (r, w) in differ.items())
        raise RunRecordError(f"the run at {run_dir} was trained on other data: its record has {detail}; "
                             "drop the task config to use the run's own, or pass a checkpoint of that task")


def _named_epoch(path: Path) -> int | None:
    """The epoch a checkpoint's file name (``epoch_NNNNNN.safetensors``) says (None: no such name)."""
    stem = path.stem
    if not stem.startswith("epoch_"):
        return None
    try:
        return int(stem[len("epoch_"):])
    except ValueError:
        return None


def checkpoint_epochs_of_record(record: Mapping[str, Any]) -> set[int] | None:
    """Every epoch at which the run of ``record`` saves a checkpoint: its training config's
    schedule, an early stop and the last epoch of the run it was extended from (None when
    the record's training config does not state its schedule)."""
    from interp_toolkit.runs.config import TrainConfig

    train = record.get("train_config")
    # a schedule is told only by a record that states it, not filled in from the defaults
    if not isinstance(train, Mapping) or not {"epochs", "checkpoint_every", "checkpoint_log_spaced"} <= set(train):
        return None
    try:
        epochs = set(TrainConfig.from_dict(dict(train)).checkpoint_epochs())
    except (ValueError, UserError, TypeError):  # a record of another version: its schedule cannot be told
        return None
    for value in (record.get("stopped_early_at"), (record.get("extended_from") or {}).get("epochs")
                  if isinstance(record.get("extended_from"), Mapping) else None):
        if isinstance(value, int) and not isinstance(value, bool):
            epochs.add(value)
    return epochs


def check_checkpoint_epoch(path: str | os.PathLike, metadata: Mapping[str, Any],
                           record: Mapping[str, Any] | None = None) -> None:
    """Refuse a checkpoint whose header epoch is not the epoch of its file name, or (with the
    run's ``record``) not an epoch the run saves a checkpoint at.

    Raises:
        CheckpointError: Naming the file, both epochs or the run's schedule.
    """
    from interp_toolkit.checkpoint import CheckpointError

    path = Path(path)
    named = _named_epoch(path)
    stored = metadata.get("epoch")
    if named is None or stored is None:
        return  # a checkpoint outside a run's naming, or one that records no epoch
    if isinstance(stored, bool) or not isinstance(stored, int) or stored != named:
        raise CheckpointError(f"checkpoint {path} is named epoch {named} but its header records epoch {stored!r}: "
                              f"it is another epoch's checkpoint copied or renamed; restore the run's own file")
    if record is None:
        return
    scheduled = checkpoint_epochs_of_record(record)
    if scheduled is not None and named not in scheduled:
        shown = sorted(scheduled)
        listing = ", ".join(map(str, shown)) if len(shown) <= 12 else \
            f"{', '.join(map(str, shown[:6]))}, ..., {', '.join(map(str, shown[-3:]))}"
        raise CheckpointError(f"checkpoint {path} is of epoch {named}, which is not on the schedule of the run it "
                              f"sits in ({listing}): the run never saved it, so it is not this run's checkpoint")


def check_checkpoint_belongs(path: str | os.PathLike, run_dir: str | os.PathLike) -> None:
    """Refuse a checkpoint that is not the run's at ``run_dir``, whatever its format.

    Four checks, from the header alone: the run key it records (current checkpoints) is the
    run's; the epoch it records is the one its file name says and one the run saves a
    checkpoint at (its schedule, an early stop or the end of the run it was extended from),
    so a checkpoint copied under another epoch's name is never read as that epoch; its model
    config is the one the run record holds; and its vocabulary, context and output sizes
    are those the run's task needs (a format-1 checkpoint records no run key, so the last
    two are what tells a mod-3 model in a parity run). Checks whose
    information a file or record lacks are skipped. Shared by every reader of a run's
    checkpoints (``analyze``, ``mechanism``, :func:`~interp_toolkit.analyses.over_checkpoints`).

    Raises:
        CheckpointError: Naming the checkpoint, the run record and what differs.
    """
    from interp_toolkit.checkpoint import CheckpointError, read_checkpoint_header

    path, run_dir = Path(path), Path(run_dir)
    if not has_record(run_dir):
        return
    record = read_record(run_dir)
    config, metadata = read_checkpoint_header(path)
    source = record_path(run_dir)
    key = metadata.get("run_key")
    if key is not None and record.get("key") and key != record.get("key"):
        raise CheckpointError(f"checkpoint {path} belongs to run {key}, but {source} records run "
                              f"{record.get('key')}: it was trained on another task or config, so this run's "
                              f"data does not fit it")
    check_checkpoint_epoch(path, metadata, record)
    recorded = record.get("model_config")
    if isinstance(recorded, dict):
        differ = sorted(k for k in set(config) & set(recorded) if config[k] != recorded[k])
        if differ:
            detail = ", ".join(f"{k} {config[k]!r} (run: {recorded[k]!r})" for k in differ)
            raise CheckpointError(f"checkpoint {path} is of another model than the run at {run_dir}: {detail}; "
                                  f"it is not this run's checkpoint")
    from interp_toolkit.tasks.custom import is_custom_record

    if is_custom_record(task_dict(record)):
        return  # a custom task's sizes follow its data: the fingerprints check it (building it here would not)
    try:
        dims = task_config(run_dir).model_dims()
    except RunRecordError:
        return  # a record without an MPSP task: nothing to check the sizes against
    wrong = {k: (config.get(k), v) for k, v in dims.items() if k in config and config[k] != v}
    if wrong:
        detail = ", ".join(f"{k} {m} (task needs {t})" for k, (m, t) in wrong.items())
        raise CheckpointError(f"checkpoint {path} was built for another task than the one {source} records: "
                              f"{detail}")


__all__ = [
    "check_checkpoint_belongs", "check_checkpoint_epoch", "checkpoint_epochs_of_record", "RECORD_NAME",
    "RunRecordError", "check_task_matches", "find_run_dir", "finish_record", "mpsp_task_config", "has_record",
    "is_finished", "library_versions", "new_training_record", "read_record", "read_run_record", "record_path",
    "task_config", "task_dict", "write_record", "write_recovered_record",
]
