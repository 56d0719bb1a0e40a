"""Pickle-free resume state, and what a run directory already holds.

Resume state (``RUN_DIR/resume.safetensors``) holds the model weights, the AdamW moments
and step counts, and the shuffling generator's state as tensors, and the epoch, run key,
the :func:`~interp_toolkit.io.tensor_digest` of every tensor and a digest over that header
in the safetensors JSON header; every read verifies all of them, so a flipped bit is a
:class:`ResumeStateError` naming the file, never a silently different continuation. Where
a checkpoint of the same epoch exists, the state's model weights must be that checkpoint's
(compared by digest, :func:`check_state_matches_checkpoint`). Reading it parses JSON and raw tensor bytes only, so a
file received from someone else cannot run code (``torch.load`` of a pickle can); nothing in
a run directory is ever unpickled. A resume file of any other format is refused, naming it.

:func:`inspect_run_dir` says whose files a directory holds (by the ``run_key`` in
``run.json``, the resume state and every checkpoint's metadata), so a trainer never clears
files of another run, and a directory copied without its ``run.json`` keeps its files.
:func:`run_dir_state` says where a run directory stands for one run (finished, resumable or
fresh); every trainer (:func:`interp_toolkit.train`, :func:`interp_toolkit.runs.batched.train_batched`)
decides what to do from it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from interp_toolkit.errors import CheckpointError, UserError
from interp_toolkit.io import (
    atomic_write_bytes,
    tensor_digest,
    verify_digests,
    verify_header_digest,
    with_header_digest,
)
from interp_toolkit.runs.layout import (
    CHECKPOINTS,
    METRICS,
    RESUME_STATE,
    checkpoint_path,
    checkpoints_dir,
    list_checkpoints,
    metrics_path,
)
from interp_toolkit.runs.record import is_finished

RESUME_NAME = RESUME_STATE
#: "2": tensor and header digests (an unverified earlier format is refused, naming it).
RESUME_FORMAT = "2"
_HEADER_KEY = "interp_toolkit.resume"


class ResumeStateError(UserError):
    """A resume file is unreadable, truncated, of another format, or of another run."""


class ForeignRunDirectoryError(UserError):
    """A directory holds files of another run (or files whose run cannot be told)."""


def save_resume_state(
    path: str | os.PathLike,
    epoch: int,
    run_key: str,
    model_state: Mapping[str, Tensor],
    optimizer_state: Mapping[int, Mapping[str, Tensor]],
    shuffle_rng: Tensor,
) -> Path:
    """Atomically write one member's resume state (no pickle).

    Args:
        path: Destination (``RUN_DIR/resume.safetensors``).
        epoch: The epoch this state ends.
        run_key: The run's key (a state of another run is refused on load).
        model_state: The model's ``state_dict()``.
        optimizer_state: ``torch.optim.AdamW.state_dict()["state"]``: per parameter index
            ``{"step", "exp_avg", "exp_avg_sq"}`` tensors.
        shuffle_rng: ``torch.Generator.get_state()`` of the shuffling generator.
    """
    from safetensors.torch import save

    tensors: dict[str, Tensor] = {}
    for name, value in model_state.items():
        tensors[f"model/{name}"] = value.detach().to("cpu").contiguous().clone()
    for index, state in optimizer_state.items():
        for name, value in state.items():
            value = value if isinstance(value, Tensor) else torch.tensor(float(value))
            tensors[f"optimizer/{int(index)}/{name}"] = value.detach().to("cpu").contiguous().clone()
    tensors["shuffle_rng"] = shuffle_rng.detach().to("cpu").contiguous().clone()
    info = with_header_digest({"format": RESUME_FORMAT, "epoch": int(epoch), "run_key": run_key,
                               "digests": {name: tensor_digest(t) for name, t in tensors.items()}})
    header = {_HEADER_KEY: json.dumps(info, sort_keys=True)}
    return atomic_write_bytes(path, save(tensors, metadata=header))


def load_resume_state(path: str | os.PathLike, run_key: str | None = None) -> dict[str, Any]:
    """Read a resume file written by :func:`save_resume_state`.

    Returns:
        ``{"epoch", "run_key", "model": state_dict, "optimizer_state": {index: {...}},
        "shuffle_rng"}``.

    Raises:
        ResumeStateError: If the file is missing, truncated, not a resume file, or (with
            ``run_key``) belongs to another run. The message names the file.
    """
    from safetensors.torch import load

    path = Path(path)
    way_out = (f"delete {path} to restart the run from epoch 0, or rerun with --overwrite to move the "
               f"directory's files aside")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ResumeStateError(f"cannot read resume file {path}: {err.strerror or err}") from err
    try:
        tensors = load(raw)
        header_len = int.from_bytes(raw[:8], "little")
        meta = json.loads(raw[8 : 8 + header_len].decode("utf-8")).get("__metadata__") or {}
        info = json.loads(meta[_HEADER_KEY])
        epoch = int(info["epoch"])
        stored_key = str(info["run_key"])
    except Exception as err:  # safetensors and json raise several types for bad bytes
        raise ResumeStateError(f"resume file {path} is truncated or corrupted ({err}); {way_out}") from err
    if info.get("format") != RESUME_FORMAT:
        raise ResumeStateError(f"resume file {path} has format {info.get('format')!r}, expected {RESUME_FORMAT}; "
                               f"{way_out}")
    try:
        verify_header_digest(path, info)
        verify_digests(path, tensors, info.get("digests") or {})
    except CheckpointError as err:
        raise ResumeStateError(f"resume file {err}; {way_out}") from err
    if run_key is not None and stored_key != run_key:
        raise ResumeStateError(
            f"resume file {path} belongs to run {stored_key}, not to this run ({run_key}); {way_out}")
    model: dict[str, Tensor] = {}
    optimizer: dict[int, dict[str, Tensor]] = {}
    for name, value in tensors.items():
        if name.startswith("model/"):
            model[name[len("model/"):]] = value
        elif name.startswith("optimizer/"):
            _, index, key = name.split("/", 2)
            optimizer.setdefault(int(index), {})[key] = value
    if "shuffle_rng" not in tensors:
        raise ResumeStateError(f"resume file {path} has no shuffle_rng tensor; {way_out}")
    return {"epoch": epoch, "run_key": stored_key, "model": model,
            "optimizer_state": dict(sorted(optimizer.items())), "shuffle_rng": tensors["shuffle_rng"]}


def check_state_matches_checkpoint(path: str | os.PathLike, state: Mapping[str, Any],
                                   run_dir: str | os.PathLike) -> None:
    """Refuse a resume or final state whose model weights are not those of the run's own
    checkpoint of the same epoch (when there is one that records digests): both files are
    digest-verified on their own, so a mismatch means one of them was replaced or edited.

    Args:
        path: The state file (named in the error).
        state: What :func:`load_resume_state` read from it.
        run_dir: The run whose ``checkpoints/`` are compared against.

    Raises:
        ResumeStateError: Naming both files and the first tensor that differs.
    """
    from interp_toolkit.checkpoint import recorded_digests

    checkpoint = checkpoint_path(run_dir, int(state["epoch"]))
    if not checkpoint.is_file():
        return
    try:
        expected = recorded_digests(checkpoint)
    except CheckpointError as err:
        raise ResumeStateError(str(err)) from err
    if expected is None:
        return
    model = state["model"]
    if sorted(expected) != sorted(model):
        raise ResumeStateError(f"{path} holds other tensors than checkpoint {checkpoint} of the same epoch "
                               f"{state['epoch']}; the state is not this run's")
    for name in sorted(model):
        if tensor_digest(model[name]) != expected[name]:
            raise ResumeStateError(
                f"{path}: tensor {name} differs from checkpoint {checkpoint} of the same epoch {state['epoch']}; "
                f"the state does not continue this run's history (delete {Path(path).name} to restart from "
                f"epoch 0, or rerun with --overwrite)")


def saved_epoch(run_dir: str | os.PathLike) -> int | None:
    """Epoch of the resume state in ``run_dir`` (header only; None if there is none)."""
    path = Path(run_dir) / RESUME_NAME
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            return int(json.loads((handle.metadata() or {})[_HEADER_KEY])["epoch"])
    except Exception:  # noqa: BLE001 - no (readable) resume state
        return None


def checkpoint_run_key(path: str | os.PathLike) -> str | None:
    """The ``run_key`` recorded in a checkpoint's metadata (None if it records none).

    Reads the safetensors header only (no tensor bytes).
    """
    from interp_toolkit.checkpoint import CheckpointError, read_checkpoint

    path = Path(path)
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            header = handle.metadata() or {}
        if "interp_toolkit.metadata" in header:
            return json.loads(header["interp_toolkit.metadata"]).get("run_key")
    except Exception:  # noqa: BLE001 - fall back to the full reader, which names the problem
        pass
    try:
        _, _, metadata = read_checkpoint(path)
    except CheckpointError:
        raise
    except Exception as err:  # noqa: BLE001
        raise UserError(f"cannot read checkpoint {path}: {err}") from err
    return metadata.get("run_key")


@dataclass
class RunDirContents:
    """What a run directory holds, and whose it is.

    Attributes:
        run_dir: The directory.
        record: Its ``run.json`` (None if absent).
        checkpoint_keys: ``run_key`` of every checkpoint, by file (None: none recorded).
        resume_key: ``run_key`` of the resume file (None if absent or unreadable).
        has_metrics: A ``metrics.jsonl`` is present.
        entries: Names of everything in the directory but the lock file.
    """

    run_dir: Path
    record: dict[str, Any] | None
    checkpoint_keys: dict[Path, str | None] = field(default_factory=dict)
    resume_key: str | None = None
    has_metrics: bool = False
    entries: list[str] = field(default_factory=list)

    def foreign_reason(self, key: str) -> str | None:
        """Why the files here are not the run ``key``'s (None: they are, or there are none)."""
        if self.record is not None:
            if self.record.get("key") != key:
                return (f"its run.json records run {self.record.get('key')}, and this run's key is {key}")
            return None
        others = sorted({k for k in self.checkpoint_keys.values() if k is not None and k != key})
        if others:
            return f"its checkpoints belong to run(s) {others}, and this run's key is {key}"
        if self.resume_key is not None and self.resume_key != key:
            return f"its resume file belongs to run {self.resume_key}, and this run's key is {key}"
        if self.checkpoint_keys and all(k is None for k in self.checkpoint_keys.values()):
            return "it has checkpoints that record no run key, so they may be another run's"
        if self.has_metrics and not self.checkpoint_keys and self.resume_key is None:
            return "it has a metrics.jsonl but no run.json, checkpoints or resume file to tell whose it is"
        own = [name for name in self.entries if not name.startswith(".")]
        if own and not self.has_metrics and not self.checkpoint_keys and self.resume_key is None \
                and not (self.run_dir / RESUME_NAME).exists():
            shown = ", ".join(own[:5]) + (f" and {len(own) - 5} more" if len(own) > 5 else "")
            return f"it holds files that are no run's ({shown}): a folder of other files, not a run directory"
        return None


def inspect_run_dir(run_dir: str | os.PathLike) -> RunDirContents:
    """Read ``run.json``, the resume file's key and every checkpoint's key (headers only).

    Raises:
        UserError: If ``run_dir`` is a file, or ``run.json`` is not valid JSON.
    """
    from interp_toolkit.runs.lock import LOCK_NAME

    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"run directory {run_dir} exists and is not a directory")
    if not run_dir.exists():
        return RunDirContents(run_dir, None)
    from interp_toolkit.runs.record import has_record, read_record

    record = read_record(run_dir) if has_record(run_dir) else None
    checkpoint_keys: dict[Path, str | None] = {}
    for path in sorted((run_dir / CHECKPOINTS).glob("epoch_*.safetensors")):
        try:
            checkpoint_keys[path] = checkpoint_run_key(path)
        except UserError:
            checkpoint_keys[path] = None  # unreadable: whose it is cannot be told
    resume_key = None
    resume_path = run_dir / RESUME_NAME
    if resume_path.exists():
        try:
            from safetensors import safe_open

            with safe_open(str(resume_path), framework="pt") as handle:
                resume_key = json.loads((handle.metadata() or {})[_HEADER_KEY]).get("run_key")
        except Exception:  # noqa: BLE001 - an unreadable resume file is reported when it is loaded
            resume_key = None
    entries = sorted(p.name for p in run_dir.iterdir() if p.name != LOCK_NAME)
    return RunDirContents(run_dir, record, checkpoint_keys, resume_key, (run_dir / METRICS).exists(),
                          entries)


def recover_finished_record(run_dir: str | os.PathLike, key: str, epochs: int) -> dict[str, Any] | None:
    """The record of a finished run whose ``run.json`` is missing (e.g. a copied directory):
    its checkpoint of the last epoch carries this run's key and its metrics reach that epoch.
    None otherwise (the run is then trained again, rewriting its own files identically)."""
    from interp_toolkit.runs.metrics import read_metrics

    run_dir = Path(run_dir)
    last = checkpoints_dir(run_dir) / f"epoch_{epochs:06d}.safetensors"
    metrics = read_metrics(metrics_path(run_dir))
    if not last.is_file() or not metrics or metrics[-1].get("epoch") != epochs:
        return None
    try:
        if checkpoint_run_key(last) != key:
            return None
    except UserError:
        return None
    return {"key": key, "status": "finished", "final": metrics[-1],
            "recovered": "run.json was missing; rebuilt from this run's checkpoints and metrics.jsonl"}


@dataclass
class RunDirState:
    """Where a run directory stands before training, for one run.

    Attributes:
        run_dir: The directory.
        key: The run's key.
        status: ``"finished"`` (nothing to train), ``"resume"`` (a resume state of this run
            is there) or ``"fresh"`` (train from epoch 0).
        start_epoch: The epoch the resume state ends (0 unless ``"resume"``).
        record: The run's record: its ``run.json``, or (when ``recovered``) the record of a
            finished run rebuilt from its checkpoints and metrics. None if neither.
        recovered: ``record`` was rebuilt because ``run.json`` is missing; the trainer
            writes it back (:func:`interp_toolkit.runs.record.write_recovered_record`).
        resume_state: The loaded resume state (:func:`load_resume_state`) when ``"resume"``.
    """

    run_dir: Path
    key: str
    status: str
    start_epoch: int = 0
    record: dict[str, Any] | None = None
    recovered: bool = False
    resume_state: dict[str, Any] | None = field(default=None, repr=False)


def run_dir_state(run_dir: str | os.PathLike, key: str, epochs: int | None = None) -> RunDirState:
    """Classify a run directory as finished, resumable or fresh for the run ``key``.

    The one place that decides what a trainer does with a directory: a finished run is not
    retrained, a resume state of this run is resumed from, anything else starts fresh.
    With ``epochs`` (the run's last epoch), a directory copied without its ``run.json``
    whose checkpoints and metrics show this run finished counts as finished
    (:func:`recover_finished_record`).

    Raises:
        ForeignRunDirectoryError: If ``run_dir`` holds files of a different run (a
            ``UserError``; two runs never share a directory).
        ResumeStateError: If its resume file is unreadable, truncated, or of another run.
        UserError: If it is recorded finished but holds no checkpoint.
    """
    run_dir = Path(run_dir)
    contents = inspect_run_dir(run_dir)
    refuse_foreign(contents, key, epochs)
    record = contents.record
    resume_path = run_dir / RESUME_NAME
    recovered = False
    if record is None and epochs is not None and not resume_path.exists():
        record = recover_finished_record(run_dir, key, epochs)  # copied without run.json
        recovered = record is not None
    if record is not None and is_finished(record):
        if not list_checkpoints(run_dir):
            raise UserError(f"run {run_dir} is recorded finished, but {run_dir / CHECKPOINTS} holds no "
                            f"checkpoint; rerun with --overwrite (overwrite=True) to move its files aside "
                            f"and train it again")
        check_finished_record(run_dir, record)
        return RunDirState(run_dir, key, "finished", record=record, recovered=recovered)
    if resume_path.exists():  # also when run.json is missing: the state carries the run key
        state = load_resume_state(resume_path, key)
        check_state_matches_checkpoint(resume_path, state, run_dir)
        return RunDirState(run_dir, key, "resume", int(state["epoch"]), record, resume_state=state)
    return RunDirState(run_dir, key, "fresh", record=record)


def check_finished_record(run_dir: str | os.PathLike, record: Mapping[str, Any]) -> None:
    """Refuse a ``run.json`` recorded finished that the run's own files contradict: a
    finished run records its last evaluation (``final``), which is the last line of its
    ``metrics.jsonl``, and has a checkpoint of that epoch. A record set to ``"finished"`` by
    hand while the run was still training fails here instead of being served as a result.

    Raises:
        UserError: Naming ``run.json`` and what contradicts it.
    """
    from interp_toolkit.runs.metrics import read_metrics
    from interp_toolkit.runs.record import record_path

    run_dir = Path(run_dir)
    path = record_path(run_dir)
    way_out = ("rerun with --overwrite (overwrite=True) to move its files aside and train it again, or restore "
               "the run's own run.json")
    final = record.get("final")
    if not isinstance(final, Mapping) or isinstance(final.get("epoch"), bool) \
            or not isinstance(final.get("epoch"), int):
        raise UserError(f"{path} says the run finished but records no final evaluation (final.epoch); it was not "
                        f"written by a trainer that finished the run; {way_out}")
    epoch = final["epoch"]
    metrics = read_metrics(metrics_path(run_dir))
    if not metrics or metrics[-1] != dict(final):
        last = metrics[-1].get("epoch") if metrics else None
        raise UserError(f"{path} says the run finished at epoch {epoch}, but its metrics.jsonl ends "
                        f"{'empty' if last is None else f'at epoch {last}'} with another evaluation; {way_out}")
    if not checkpoint_path(run_dir, epoch).is_file():
        raise UserError(f"{path} says the run finished at epoch {epoch}, but there is no checkpoint of that epoch "
                        f"({checkpoint_path(run_dir, epoch)}); {way_out}")


def move_aside(run_dir: str | os.PathLike, keep: Sequence[str] = ()) -> Path | None:
    """Move everything in ``run_dir`` (but ``keep`` and the lock file) to
    ``RUN_DIR.old-TIMESTAMP``; nothing is deleted. Returns the new folder (None if empty)."""
    from interp_toolkit.runs.lock import LOCK_NAME

    run_dir = Path(run_dir).resolve()  # "." has no name to derive the folder aside from
    if not run_dir.is_dir():
        return None
    entries = [p for p in run_dir.iterdir() if p.name != LOCK_NAME and p.name not in keep]
    if not entries:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = run_dir.with_name(f"{run_dir.name}.old-{stamp}")
    suffix = 1
    while target.exists():
        target = run_dir.with_name(f"{run_dir.name}.old-{stamp}-{suffix}")
        suffix += 1
    target.mkdir(parents=True)
    for entry in entries:
        os.replace(entry, target / entry.name)
    return target


def refuse_foreign(contents: RunDirContents, key: str, epochs: int | None = None) -> None:
    """Raise :class:`ForeignRunDirectoryError` if ``contents`` are another run's files; when
    they are a finished run of other ``epochs`` (the same run trained longer, most often),
    the error says how to continue it with ``--extend-from``."""
    reason = contents.foreign_reason(key)
    if reason is not None:
        hint = ""
        record = contents.record or {}
        trained = ((record.get("identity") or {}).get("train") or {}).get("epochs")
        if epochs is not None and isinstance(trained, int) and trained != epochs and is_finished(record):
            hint = (f" It holds a finished run of {trained} epochs: to continue it to {epochs}, train into a new "
                    f"run directory with --extend-from {contents.run_dir} (extend_from=).")
        raise ForeignRunDirectoryError(
            f"run directory {contents.run_dir} holds a different run's files ({reason}); nothing was changed. "
            f"Choose another run directory, or rerun with --overwrite (overwrite=True) to move its "
            f"files aside to {contents.run_dir.resolve().name}.old-TIMESTAMP.{hint}"
        )


__all__ = [
    "RESUME_NAME", "ForeignRunDirectoryError", "ResumeStateError", "RunDirContents", "RunDirState",
    "check_finished_record", "check_state_matches_checkpoint", "checkpoint_path", "checkpoint_run_key",
    "inspect_run_dir", "list_checkpoints", "load_resume_state", "move_aside", "recover_finished_record",
    "refuse_foreign", "run_dir_state", "save_resume_state", "saved_epoch",
]
