"""Longer horizons without retraining: a run continues from the same run at fewer epochs.

A run's trajectory up to epoch E does not depend on how many epochs it will train for
(no schedule depends on ``epochs``), so a run of 3,000 epochs is the run of 1,000 epochs
continued. When a run finishes, its trainer keeps its last state (weights, AdamW moments,
shuffling generator) as ``RUN_DIR/final_state.safetensors`` (the resume format of
:mod:`interp_toolkit.runs.resume`). :func:`extend_run` starts a new, longer run's directory
from such a finished run: the evaluations and checkpoints the longer run's own schedule
would have written up to the shorter run's last epoch (re-keyed to the longer run), its
state as the longer run's resume state, and ``run.json`` naming where it came from
(``extended_from``). A trainer then resumes it as an interrupted run, so the directory ends
as an uninterrupted run of the longer horizon would (``tests/runs/test_extend.py`` checks
this against training from scratch).

An early stop is decided by the longer run's own stop rule, applied to the shorter run's
history: if it fires first at the shorter run's last evaluation (a sweep's runs stopped once
generalized, under the same rule, which is part of their identity), the longer run stops
there too and is recorded finished, a copy; if it never fires, the longer run trains on; if
it fires earlier, the run cannot be continued (:class:`ExtensionError`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from interp_toolkit.errors import UserError
from interp_toolkit.io import atomic_write_bytes
from interp_toolkit.runs.layout import (
    CHECKPOINTS,
    CURVES,
    FINAL_STATE,
    METRICS,
    RECORD,
    metrics_path,
)
from interp_toolkit.runs.metrics import read_metrics
from interp_toolkit.runs.record import (
    has_record,
    is_finished,
    new_training_record,
    read_record,
    write_record,
)
from interp_toolkit.runs.resume import (
    RESUME_NAME,
    check_finished_record,
    list_checkpoints,
    load_resume_state,
    save_resume_state,
)

#: The last state of a finished run, kept so that a longer run can continue from it.
FINAL_STATE_NAME = FINAL_STATE

#: Record fields a trainer carries from the record it finds into the one it writes.
CARRIED_RECORD_FIELDS = ("extended_from",)


class ExtensionError(UserError):
    """A run cannot be continued from the given shorter run (not finished, not the same
    run at fewer epochs, or without its final state)."""


def keep_final_state(run_dir: str | os.PathLike) -> None:
    """At a run's end: its resume state becomes its final state (what :func:`extend_run` reads)."""
    run_dir = Path(run_dir)
    resume = run_dir / RESUME_NAME
    if resume.exists():
        os.replace(resume, run_dir / FINAL_STATE_NAME)


def carried_fields(record: Mapping[str, Any] | None) -> dict[str, Any]:
    """The fields of ``record`` a trainer keeps when it rewrites the record (:data:`CARRIED_RECORD_FIELDS`)."""
    return {k: record[k] for k in CARRIED_RECORD_FIELDS if record and k in record}


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: value}


def identity_differences(source: Mapping[str, Any], target: Mapping[str, Any],
                         ignore: tuple[str, ...] = ("train.epochs",)) -> list[str]:
    """Dotted names of the identity fields where two runs differ, outside ``ignore``
    (a name in ``ignore`` also covers the fields under it, e.g. ``"data"``)."""
    a = json.loads(json.dumps(dict(source), default=str))  # tuples as lists, as records store them
    b = json.loads(json.dumps(dict(target), default=str))
    flat_a, flat_b = _flatten(a), _flatten(b)

    def ignored(name: str) -> bool:
        return any(name == skip or name.startswith(skip + ".") for skip in ignore)

    return sorted(k for k in set(flat_a) | set(flat_b) if not ignored(k) and flat_a.get(k) != flat_b.get(k))


@dataclass
class ExtensionPlan:
    """What continuing a run from a shorter one means (:func:`check_extension_source`).

    Attributes:
        source_dir: The shorter run.
        record: Its ``run.json``.
        metrics: Its ``metrics.jsonl`` lines.
        action: ``"resume"`` (train on from ``epoch``) or ``"finished"`` (the longer run stops
            at ``epoch`` too: its stop rule fires there, the source's last evaluation).
        epoch: The source's last evaluated epoch.
    """

    source_dir: Path
    record: dict[str, Any]
    metrics: list[dict[str, Any]] = field(repr=False)
    action: str
    epoch: int


def check_extension_source(source_dir: str | os.PathLike, identity: Mapping[str, Any],
                           stop_rule: Callable[[dict[str, Any]], bool] | None = None,
                           evaluation_epochs: Sequence[int] | None = None,
                           ignore: tuple[str, ...] = ("train.epochs",)) -> ExtensionPlan:
    """Whether, and how, the run ``identity`` (stopped early by ``stop_rule``, if any) can
    continue from ``source_dir``.

    The stop rule decides: if it fires first at the source's last evaluation, the longer run
    ends there too (finished, a copy); if it never fires in the source's history, the longer
    run trains on from the source's final state (also when the source itself stopped early
    under another rule); if it fires earlier, the longer run would have ended inside that
    history, at an epoch with no saved state, and it cannot be continued. The rule is applied
    only where the longer run evaluates (``evaluation_epochs``, its
    ``TrainConfig.evaluation_epochs()``; None: every evaluation of the source): a source's
    last epoch off that schedule is not one where the longer run could stop. ``ignore``: the
    identity fields allowed to differ (:func:`identity_differences`; a sweep planning runs
    before it has built their data also leaves out ``"data"``).

    Raises:
        ExtensionError: Naming why not: no record, not finished, a field other than
            ``train.epochs`` differs, not fewer epochs, the stop rule fires inside the
            source's history, or no final state to train on from.
    """
    source_dir = Path(source_dir)
    if not has_record(source_dir):
        raise ExtensionError(f"cannot extend from {source_dir}: it is not a run directory (no run.json)")
    record = read_record(source_dir)
    if not is_finished(record):
        raise ExtensionError(f"cannot extend from {source_dir}: the run is not finished "
                             f"(status {record.get('status')!r}); finish it first (rerun it) or extend another")
    check_finished_record(source_dir, record)  # a record set to "finished" mid-run is not a finished run
    source_identity = record.get("identity")
    if not isinstance(source_identity, Mapping):
        raise ExtensionError(f"cannot extend from {source_dir}: its run.json records no identity")
    differing = identity_differences(source_identity, identity, ignore)
    if differing:
        raise ExtensionError(f"cannot extend from {source_dir}: it is another run, not this run at fewer "
                             f"epochs (fields that differ: {', '.join(differing)})")
    schedule = (identity.get("train") or {}).get("lr_schedule", "constant")
    if schedule != "constant":
        raise ExtensionError(f"cannot extend from {source_dir}: with lr_schedule {schedule!r} the learning rate "
                             "at every step depends on the run's length, so a longer run is not the shorter "
                             "one continued; train this run from scratch")
    have = int(source_identity["train"]["epochs"])
    want = int(identity["train"]["epochs"])
    if have >= want:
        raise ExtensionError(f"cannot extend from {source_dir}: it trains {have} epochs and this run {want}; "
                             f"a run extends only a run of fewer epochs")
    metrics = read_metrics(metrics_path(source_dir))
    if not metrics:
        raise ExtensionError(f"cannot extend from {source_dir}: its metrics.jsonl is empty")
    last = int(metrics[-1]["epoch"])
    # Trainers apply a stop rule after every evaluation but epoch 0's.
    evaluated = set(evaluation_epochs) if evaluation_epochs is not None else {int(m["epoch"]) for m in metrics}
    fired = next((int(m["epoch"]) for m in metrics
                  if int(m["epoch"]) >= 1 and int(m["epoch"]) in evaluated and stop_rule(m)), None) \
        if stop_rule is not None else None
    if fired is not None and fired != last:
        raise ExtensionError(f"cannot extend from {source_dir}: this run's stop rule ends it at epoch {fired}, "
                             f"inside that run's history (it ran to epoch {last}), where no state was kept; "
                             f"train this run from scratch")
    action = "finished" if fired is not None else "resume"
    if action == "resume" and not (source_dir / FINAL_STATE_NAME).is_file():
        raise ExtensionError(f"cannot extend from {source_dir}: it has no {FINAL_STATE_NAME} (runs finished "
                             f"before interp_toolkit kept final states cannot be continued exactly); train "
                             f"this run from scratch")
    return ExtensionPlan(source_dir, record, metrics, action, last)


def extend_run(source_dir: str | os.PathLike, run_dir: str | os.PathLike, *, key: str,
               identity: Mapping[str, Any], train_config: Mapping[str, Any],
               checkpoint_epochs: list[int], evaluation_epochs: list[int],
               stop_rule: Callable[[dict[str, Any]], bool] | None = None) -> str:
    """Start ``run_dir`` (the run ``key``) from the finished shorter run at ``source_dir``.

    ``run_dir`` must be empty or absent; the caller holds its lock. The evaluations and
    checkpoints of the new run's own schedules up to the source's last epoch are copied,
    checkpoints rewritten with the new run's key, so the directory is the new run's own.

    Args:
        source_dir: A finished run of the same identity at fewer epochs.
        run_dir: The new run's directory.
        key, identity, train_config: The new run's key, identity and ``TrainConfig.to_dict()``.
        checkpoint_epochs, evaluation_epochs: The new run's schedules
            (``TrainConfig.checkpoint_epochs()``, ``.evaluation_epochs()``).
        stop_rule: The new run's early stop (as ``train_batched`` takes it), or None.

    Returns:
        ``"resume"``: ``run_dir`` holds the new run's state at the source's last epoch, to be
        trained on; ``"finished"``: the new run stops where the source ends (a copy).

    Raises:
        ExtensionError: As :func:`check_extension_source`, or if ``run_dir`` is not empty.
    """
    plan = check_extension_source(source_dir, identity, stop_rule, evaluation_epochs)
    return _write_extension(plan, Path(run_dir), key=key, identity=identity, train_config=train_config,
                            checkpoint_epochs=checkpoint_epochs, evaluation_epochs=evaluation_epochs)


def _write_extension(plan: ExtensionPlan, run_dir: Path, *, key: str, identity: Mapping[str, Any],
                     train_config: Mapping[str, Any], checkpoint_epochs: Sequence[int],
                     evaluation_epochs: Sequence[int]) -> str:
    """:func:`extend_run` once its source is checked (``plan``)."""
    from interp_toolkit.checkpoint import KIND, read_checkpoint
    from interp_toolkit.io import save_artifact

    source_dir, record, last_epoch = plan.source_dir, plan.record, plan.epoch
    if not holds_nothing(run_dir):
        raise ExtensionError(f"cannot extend into {run_dir}: it is not empty")
    finished = plan.action == "finished"
    # Verified before anything is written: a bad final state leaves run_dir untouched.
    final_state = source_dir / FINAL_STATE_NAME
    state = read_final_state(source_dir, record.get("key"), last_epoch) if final_state.is_file() else None
    # The new run's schedules up to the source's end; a run that stops checkpoints its last epoch.
    keep_eval = set(evaluation_epochs) | ({last_epoch} if finished else set())
    keep_ckpt = set(checkpoint_epochs) | ({last_epoch} if finished else set())

    run_dir.mkdir(parents=True, exist_ok=True)
    for epoch, path in list_checkpoints(source_dir):
        if epoch not in keep_ckpt or epoch > last_epoch:
            continue
        cfg, tensors, metadata = read_checkpoint(path)
        save_artifact(run_dir / CHECKPOINTS / path.name, tensors,
                      {"model_config": cfg.to_dict(), "metadata": {**metadata, "run_key": key}}, kind=KIND)
    kept = [m for m in plan.metrics if int(m["epoch"]) in keep_eval]
    atomic_write_bytes(run_dir / METRICS,
                       "".join(json.dumps(m, sort_keys=True) + "\n" for m in kept).encode())
    origin = {"run_dir": str(source_dir), "key": record.get("key"),
              "epochs": int(record["identity"]["train"]["epochs"]), "epoch": last_epoch}
    new = new_training_record(key=key, identity=identity, model_config=record.get("model_config", {}),
                              train_config=train_config, split_sizes=record.get("split_sizes", {}),
                              run_info=record.get("run_info"), extended_from=origin,
                              **({"trainer": record["trainer"]} if "trainer" in record else {}))
    # Written in an order that a kill at any point leaves a directory the trainer reads right:
    # without the state that makes it resumable (or finished) it counts as fresh and is redone.
    if not finished:
        if state is None:
            raise ExtensionError(f"{source_dir} has no {FINAL_STATE_NAME} to continue from; it cannot be extended")
        write_record(run_dir, new)  # status running: without the resume state, a fresh start
        save_resume_state(run_dir / RESUME_NAME, state["epoch"], key, state["model"],
                          state["optimizer_state"], state["shuffle_rng"])
        return "resume"
    if state is not None:  # so the copy can be continued in turn
        save_resume_state(run_dir / FINAL_STATE_NAME, state["epoch"], key, state["model"],
                          state["optimizer_state"], state["shuffle_rng"])
    if (source_dir / CURVES).is_file():
        atomic_write_bytes(run_dir / CURVES, (source_dir / CURVES).read_bytes())
    # train_seconds: the training that produced this history (the source's).
    new.update(status="finished", final=kept[-1], train_seconds=record.get("train_seconds", 0.0),
               stopped_early_at=last_epoch)
    write_record(run_dir, new)
    return "finished"


def read_final_state(source_dir: str | os.PathLike, key: str | None, last_epoch: int) -> dict[str, Any]:
    """The final state of the finished run at ``source_dir``, verified: its digests
    (:func:`~interp_toolkit.runs.resume.load_resume_state`), its epoch against the run's last
    evaluation, and its weights against the run's own checkpoint of that epoch.

    Raises:
        ExtensionError: Naming the file when any of these fails.
    """
    from interp_toolkit.runs.resume import ResumeStateError, check_state_matches_checkpoint

    path = Path(source_dir) / FINAL_STATE_NAME
    try:
        state = load_resume_state(path, key)
        check_state_matches_checkpoint(path, state, source_dir)
    except ResumeStateError as err:
        raise ExtensionError(f"cannot extend from {source_dir}: {err}") from err
    if int(state["epoch"]) != last_epoch:
        raise ExtensionError(f"cannot extend from {source_dir}: {path} ends epoch {state['epoch']}, but the run's "
                             f"metrics.jsonl ends at epoch {last_epoch}; the state is not this run's last")
    return state


def holds_nothing(run_dir: str | os.PathLike) -> bool:
    """Whether ``run_dir`` is absent or holds nothing but its lock file."""
    from interp_toolkit.runs.lock import LOCK_NAME

    run_dir = Path(run_dir)
    return not run_dir.exists() or all(p.name == LOCK_NAME for p in run_dir.iterdir())


def starts_fresh(run_dir: str | os.PathLike, key: str, epochs: int) -> bool:
    """Whether the run ``key`` would start from epoch 0 in ``run_dir`` (nothing resumable or
    finished of it there), i.e. whether an ``extend_from`` source is used.

    Raises:
        ForeignRunDirectoryError, ResumeStateError: As
            :func:`~interp_toolkit.runs.resume.run_dir_state` (another run's files are never touched).
    """
    from interp_toolkit.runs.resume import run_dir_state

    return run_dir_state(run_dir, key, epochs).status == "fresh"


def clear_run_outputs(run_dir: str | os.PathLike) -> None:
    """Fresh-start step shared by every trainer: create ``run_dir`` and remove the metrics and
    checkpoints a run with the same key left before it could save a resumable state."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics_path(run_dir).unlink(missing_ok=True)
    for _, stale in list_checkpoints(run_dir):
        stale.unlink()


#: What a start of this run killed before its first saved state leaves besides the metrics
#: and checkpoints a trainer's fresh start clears.
_PARTIAL_START = (RECORD, CURVES, FINAL_STATE_NAME)


def clear_partial_start(run_dir: str | os.PathLike) -> None:
    """Remove the leftovers of a start that never saved a state (of a run :func:`starts_fresh`
    in ``run_dir``, so none of another run): its record, metrics and checkpoints."""
    run_dir = Path(run_dir)
    clear_run_outputs(run_dir)
    for name in _PARTIAL_START:
        (run_dir / name).unlink(missing_ok=True)
    folder = run_dir / CHECKPOINTS
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def start_from_shorter_run(run_dir: str | os.PathLike, source_dir: str | os.PathLike | None, key: str,
                           identity: Mapping[str, Any], cfg: Any,
                           stop_rule: Callable[[dict[str, Any]], bool] | None = None) -> str | None:
    """What a trainer does with ``extend_from``: :func:`extend_run` into ``run_dir`` if this run
    has not started there (:func:`starts_fresh`; the leftovers of a start killed before its
    first saved state are cleared first, as a trainer clears them). None (nothing done)
    without a source, or when ``run_dir`` holds this run resumable or finished (the trainer
    resumes or returns it as usual).

    Args:
        cfg: The new run's ``TrainConfig``.
        stop_rule: The new run's early stop, or None.
    """
    if source_dir is None:
        return None
    if Path(source_dir).resolve() == Path(run_dir).resolve():
        raise ExtensionError(f"cannot extend from {source_dir} into itself: a longer run is a new run with its own "
                             f"directory; give another --run-dir (or leave it out for the default)")
    if not starts_fresh(run_dir, key, cfg.epochs):
        return None
    plan = check_extension_source(source_dir, identity, stop_rule, cfg.evaluation_epochs())
    return continue_from(plan, run_dir, key, identity, cfg)


def continue_from(plan: ExtensionPlan, run_dir: str | os.PathLike, key: str, identity: Mapping[str, Any],
                  cfg: Any) -> str:
    """Start ``run_dir`` (a run that :func:`starts_fresh` there) from a checked source: clear a
    killed start's leftovers, then write the extension (:func:`extend_run`'s return value).

    Args:
        plan: From :func:`check_extension_source` for this run.
        cfg: The new run's ``TrainConfig``.
    """
    clear_partial_start(run_dir)
    return _write_extension(plan, Path(run_dir), key=key, identity=identity, train_config=cfg.to_dict(),
                            checkpoint_epochs=cfg.checkpoint_epochs(), evaluation_epochs=cfg.evaluation_epochs())


__all__ = [
    "CARRIED_RECORD_FIELDS", "ExtensionError", "ExtensionPlan", "FINAL_STATE_NAME", "carried_fields",
    "check_extension_source", "clear_partial_start", "clear_run_outputs", "continue_from", "extend_run",
    "holds_nothing", "identity_differences", "keep_final_state", "read_final_state", "start_from_shorter_run",
    "starts_fresh",
]
