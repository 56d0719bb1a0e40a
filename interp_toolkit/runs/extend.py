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

A shorter run that stopped early (it generalized) is the longer run too: the same stop
rule stops the same trajectory at the same epoch. Its history is copied and the longer run
is recorded finished. In a sweep the stop rule is part of every run's identity.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from interp_toolkit.errors import UserError
from interp_toolkit.io import atomic_write_bytes, read_jsonl
from interp_toolkit.runs.record import (
    has_record,
    is_finished,
    new_training_record,
    read_record,
    write_record,
)
from interp_toolkit.runs.resume import (
    RESUME_NAME,
    list_checkpoints,
    load_resume_state,
    save_resume_state,
)

#: The last state of a finished run, kept so that a longer run can continue from it.
FINAL_STATE_NAME = "final_state.safetensors"

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


def check_extension_source(source_dir: str | os.PathLike, identity: Mapping[str, Any]) -> dict[str, Any]:
    """The record of ``source_dir`` if the run ``identity`` can continue from it.

    Raises:
        ExtensionError: Naming why not: no record, not finished, a field other than
            ``train.epochs`` differs, not fewer epochs, or (for a run that ran its full
            horizon) no final state.
    """
    source_dir = Path(source_dir)
    if not has_record(source_dir):
        raise ExtensionError(f"cannot extend from {source_dir}: it is not a run directory (no run.json)")
    record = read_record(source_dir)
    if not is_finished(record):
        raise ExtensionError(f"cannot extend from {source_dir}: the run is not finished "
                             f"(status {record.get('status')!r}); finish it first (rerun it) or extend another")
    source_identity = record.get("identity")
    if not isinstance(source_identity, Mapping):
        raise ExtensionError(f"cannot extend from {source_dir}: its run.json records no identity")
    differing = identity_differences(source_identity, identity)
    if differing:
        raise ExtensionError(f"cannot extend from {source_dir}: it is another run, not this run at fewer "
                             f"epochs (fields that differ: {', '.join(differing)})")
    have = int(source_identity["train"]["epochs"])
    want = int(identity["train"]["epochs"])
    if have >= want:
        raise ExtensionError(f"cannot extend from {source_dir}: it trains {have} epochs and this run {want}; "
                             f"a run extends only a run of fewer epochs")
    if record.get("stopped_early_at") is None and not (source_dir / FINAL_STATE_NAME).is_file():
        raise ExtensionError(f"cannot extend from {source_dir}: it has no {FINAL_STATE_NAME} (runs finished "
                             f"before interp_toolkit kept final states cannot be continued exactly); train "
                             f"this run from scratch")
    return record


def extend_run(source_dir: str | os.PathLike, run_dir: str | os.PathLike, *, key: str,
               identity: Mapping[str, Any], train_config: Mapping[str, Any],
               checkpoint_epochs: list[int], evaluation_epochs: list[int]) -> str:
    """Start ``run_dir`` (the run ``key``) from the finished shorter run at ``source_dir``.

    ``run_dir`` must be empty or absent; the caller holds its lock. Checkpoints are rewritten
    with the new run's key, so the directory is the new run's own.

    Args:
        source_dir: A finished run of the same identity at fewer epochs.
        run_dir: The new run's directory.
        key, identity, train_config: The new run's key, identity and ``TrainConfig.to_dict()``.
        checkpoint_epochs, evaluation_epochs: The new run's schedules
            (``TrainConfig.checkpoint_epochs()``, ``.evaluation_epochs()``).

    Returns:
        ``"resume"``: ``run_dir`` holds the new run's state at the source's last epoch, to be
        trained on; ``"finished"``: the source stopped early, and so does the new run.

    Raises:
        ExtensionError: As :func:`check_extension_source`, or if ``run_dir`` is not empty.
    """
    from interp_toolkit.checkpoint import KIND, read_checkpoint
    from interp_toolkit.io import save_artifact

    source_dir, run_dir = Path(source_dir), Path(run_dir)
    record = check_extension_source(source_dir, identity)
    if not holds_nothing(run_dir):
        raise ExtensionError(f"cannot extend into {run_dir}: it is not empty")
    stopped_at = record.get("stopped_early_at")
    metrics = read_jsonl(source_dir / "metrics.jsonl")
    if not metrics:
        raise ExtensionError(f"cannot extend from {source_dir}: its metrics.jsonl is empty")
    last_epoch = int(metrics[-1]["epoch"])
    # The new run's schedules, up to where the source ends (its stop epoch is always kept).
    keep_eval = set(evaluation_epochs) | ({last_epoch} if stopped_at is not None else set())
    keep_ckpt = set(checkpoint_epochs) | ({last_epoch} if stopped_at is not None else set())

    run_dir.mkdir(parents=True, exist_ok=True)
    for epoch, path in list_checkpoints(source_dir):
        if epoch not in keep_ckpt or epoch > last_epoch:
            continue
        cfg, tensors, metadata = read_checkpoint(path)
        save_artifact(run_dir / "checkpoints" / path.name, tensors,
                      {"model_config": cfg.to_dict(), "metadata": {**metadata, "run_key": key}}, kind=KIND)
    kept = [m for m in metrics if int(m["epoch"]) in keep_eval]
    atomic_write_bytes(run_dir / "metrics.jsonl",
                       "".join(json.dumps(m, sort_keys=True) + "\n" for m in kept).encode())
    origin = {"run_dir": str(source_dir), "key": record.get("key"),
              "epochs": int(record["identity"]["train"]["epochs"]), "epoch": last_epoch}
    new = new_training_record(key=key, identity=identity, model_config=record.get("model_config", {}),
                              train_config=train_config, split_sizes=record.get("split_sizes", {}),
                              run_info=record.get("run_info"), extended_from=origin,
                              **({"trainer": record["trainer"]} if "trainer" in record else {}))
    final_state = source_dir / FINAL_STATE_NAME
    if final_state.is_file():
        state = load_resume_state(final_state, record.get("key"))
        target = run_dir / (FINAL_STATE_NAME if stopped_at is not None else RESUME_NAME)
        save_resume_state(target, state["epoch"], key, state["model"], state["optimizer_state"],
                          state["shuffle_rng"])
    if stopped_at is None:
        write_record(run_dir, new)
        return "resume"
    if (source_dir / "curves.png").is_file():
        atomic_write_bytes(run_dir / "curves.png", (source_dir / "curves.png").read_bytes())
    # train_seconds: the training that produced this history (the source's).
    new.update(status="finished", final=kept[-1], train_seconds=record.get("train_seconds", 0.0),
               stopped_early_at=stopped_at)
    write_record(run_dir, new)
    return "finished"


def holds_nothing(run_dir: str | os.PathLike) -> bool:
    """Whether ``run_dir`` is absent or holds nothing but its lock file."""
    from interp_toolkit.runs.lock import LOCK_NAME

    run_dir = Path(run_dir)
    return not run_dir.exists() or all(p.name == LOCK_NAME for p in run_dir.iterdir())


def start_from_shorter_run(run_dir: str | os.PathLike, source_dir: str | os.PathLike | None, key: str,
                           identity: Mapping[str, Any], cfg: Any) -> str | None:
    """What a trainer does with ``extend_from``: :func:`extend_run` into ``run_dir`` if it holds
    nothing yet. None (nothing done) without a source, or when ``run_dir`` already holds files
    (this run's, from an earlier start: the trainer resumes or returns them as usual).

    Args:
        cfg: The new run's ``TrainConfig``.
    """
    if source_dir is None or not holds_nothing(run_dir):
        return None
    return extend_run(source_dir, run_dir, key=key, identity=identity, train_config=cfg.to_dict(),
                      checkpoint_epochs=cfg.checkpoint_epochs(), evaluation_epochs=cfg.evaluation_epochs())


__all__ = ["CARRIED_RECORD_FIELDS", "ExtensionError", "FINAL_STATE_NAME", "carried_fields",
           "check_extension_source", "extend_run", "holds_nothing", "identity_differences", "keep_final_state",
           "start_from_shorter_run"]
