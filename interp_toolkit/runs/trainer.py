"""Training with evaluation, checkpoints on a schedule, exact resume and run records.

Run directory layout (written by :func:`train`)::

    run_dir/
      run.json            every config, seeds, data fingerprints, library versions, status
      metrics.jsonl       one JSON line per evaluation: {"epoch", "<split>_loss", "<split>_acc"}
      checkpoints/
        epoch_000000.safetensors   self-describing (see interp_toolkit.checkpoint)
        ...
      resume.safetensors  optimizer + RNG state of the last saved epoch, no pickle
      final_state.safetensors  the same at the run's end (what a longer run extends from)
      .lock               held (fcntl.flock) by the process writing the run: one writer at a time
      curves.png          loss/accuracy curves per split
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from interp_toolkit.callbacks import as_callbacks
from interp_toolkit.checkpoint import load_checkpoint
from interp_toolkit.devices import resolve_device
from interp_toolkit.errors import UserError
from interp_toolkit.io import (
    config_hash,
    tensor_digest,
)
from interp_toolkit.model import model_config_of, move_model
from interp_toolkit.runs.config import TrainConfig
from interp_toolkit.runs.cost import train_threads
from interp_toolkit.runs.engine import member_eval_sums
from interp_toolkit.runs.extend import (
    clear_run_outputs,
    start_from_shorter_run,
)
from interp_toolkit.runs.forward import ReadoutForward
from interp_toolkit.runs.layout import METRICS
from interp_toolkit.runs.lock import DirectoryLock
from interp_toolkit.runs.loop import (  # noqa: F401  (the loop's helpers stay importable from here)
    TrainingLoop,
    check_finite_evaluation,
    diverged,
    epoch_minibatches,
    plot_curves,
    plot_training_curves,
    truncate_metrics,
)
from interp_toolkit.runs.metrics import read_metrics
from interp_toolkit.runs.record import (
    library_versions,
    read_run_record,
    write_record,
    write_recovered_record,
)
from interp_toolkit.runs.resume import (
    checkpoint_path,
    list_checkpoints,
    move_aside,
    run_dir_state,
)
from interp_toolkit.threads import with_threads


class Split(Protocol):
    """Anything with model inputs and integer class labels (e.g. an ``MPSPSplit``)."""

    tokens: Int[Tensor, "n pos"]
    labels: Int[Tensor, " n"]


# Fields that change how a run is displayed or computed (engine, device: equal up to float
# rounding), not what it computes: outside the run key, so a run resumes on another device.
_NON_SEMANTIC = ("progress", "eval_batch_size", "engine", "device")


@dataclass
class TrainResult:
    """What :func:`train` returns."""

    model: Any
    run_dir: Path
    metrics: list[dict[str, Any]]
    final: dict[str, Any]
    resumed_from: int | None = None
    already_finished: bool = False
    history_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def fingerprint(split: Split) -> str:
    """Hash of a split's tokens and labels: reruns only match on identical data."""
    return tensor_digest([split.tokens, split.labels])


def readout_loss(
    logits: Float[Tensor, "batch pos vocab"], labels: Int[Tensor, " batch"], position: int = -1
) -> Float[Tensor, ""]:
    """Mean cross-entropy of the logits at ``position`` against ``labels``."""
    return F.cross_entropy(logits[:, position, :], labels)


@torch.no_grad()
def evaluate(model: Any, splits: Mapping[str, Split], position: int = -1,
             batch_size: int = 8_192, engine: str = "fast") -> dict[str, float]:
    """Loss and accuracy at the readout position on every named split.

    ``engine`` chooses the forward (see ``TrainConfig.engine``); ``train`` evaluates with
    the engine it trains with.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    forward = ReadoutForward(model, position, engine)
    out: dict[str, float] = {}
    for name, split in splits.items():
        total_loss = torch.zeros(1, dtype=torch.float64)
        correct = torch.zeros(1, dtype=torch.long)
        n = len(split.labels)
        for start in range(0, n, batch_size):
            tokens = split.tokens[start : start + batch_size].to(device)
            labels = split.labels[start : start + batch_size].to(device)
            # the reduction of evaluate_batched: a sweep's run and train()'s are the same bytes
            loss_sum, hits = member_eval_sums(forward(tokens).unsqueeze(0), labels)
            total_loss += loss_sum
            correct += hits
        out[f"{name}_loss"] = float(total_loss[0]) / n
        out[f"{name}_acc"] = int(correct[0]) / n
    model.train(was_training)
    return out


def check_token_ids(name: str, tokens: Tensor, d_vocab: int) -> None:
    """UserError naming the split and the offending id unless ``0 <= tokens < d_vocab``."""

    if tokens.numel() == 0:
        return
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= d_vocab:
        bad = low if low < 0 else high
        raise UserError(f"split {name!r} has token id {bad}, outside the model's vocabulary 0..{d_vocab - 1} "
                        f"(d_vocab {d_vocab}); the data and the model do not belong together")


def check_label_ids(name: str, labels: Tensor, n_classes: int) -> None:
    """UserError naming the split and the offending label unless ``0 <= labels < n_classes``."""

    if labels.numel() == 0:
        return
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= n_classes:
        bad = low if low < 0 else high
        raise UserError(f"split {name!r} has label {bad}, outside the model's outputs 0..{n_classes - 1} "
                        f"(d_vocab_out {n_classes})")


def validate_splits(splits: Mapping[str, Split], cfg: TrainConfig, model_cfg: Any = None) -> None:
    if cfg.train_split not in splits:
        raise UserError(f"splits has no {cfg.train_split!r} split to train on; got {sorted(splits)}")
    for name, split in splits.items():
        if not hasattr(split, "tokens") or not hasattr(split, "labels"):
            raise UserError(f"split {name!r} needs .tokens and .labels tensors")
        if split.tokens.ndim != 2 or split.labels.ndim != 1 or split.tokens.shape[0] != split.labels.shape[0]:
            raise UserError(
                f"split {name!r}: tokens must be [n, pos] and labels [n] with the same n; got "
                f"{tuple(split.tokens.shape)} and {tuple(split.labels.shape)}"
            )
        if len(split.labels) == 0:
            raise UserError(f"split {name!r} is empty")
        if model_cfg is not None:  # out-of-vocabulary ids would fail deep inside the model
            check_token_ids(name, split.tokens, model_cfg.d_vocab)
            check_label_ids(name, split.labels, model_cfg.d_vocab_out or model_cfg.d_vocab)
    total = cfg.epochs * cfg.steps_per_epoch(len(splits[cfg.train_split].labels))
    if cfg.warmup_steps and cfg.warmup_steps >= total:
        # the learning rate would never reach lr: refused, not warned (the run is not the one asked)
        raise UserError(f"--train.warmup-steps {cfg.warmup_steps:,} is not below the run's {total:,} optimizer steps "
                        f"({cfg.epochs:,} epochs x {cfg.steps_per_epoch(len(splits[cfg.train_split].labels)):,} "
                        "steps): the learning rate would never reach --lr; shorten the warmup or train longer")


def given_model_config(model: Any, model_config: Any) -> Any:
    """``model_config`` checked against ``model``: a :class:`~interp_toolkit.model.ModelConfig`
    whose :func:`~interp_toolkit.model.build_model` makes the model's parameters.

    Raises:
        TypeError: ``model_config`` is not a ``ModelConfig``.
        ValueError: It does not describe ``model`` (names the first differing parameter).
    """
    from interp_toolkit.model import ModelConfig, build_model

    if not isinstance(model_config, ModelConfig):
        raise TypeError(f"train's model_config must be a ModelConfig, got {type(model_config).__name__}")
    own = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    rebuilt = {name: tuple(t.shape) for name, t in build_model(model_config, device="meta").state_dict().items()}
    if own != rebuilt:
        differing = sorted(set(own) ^ set(rebuilt)) or sorted(n for n in own if own[n] != rebuilt[n])
        name = differing[0]
        raise UserError(
            f"model_config does not describe the model: parameter {name!r} is "
            f"{own.get(name, 'absent')} in the model but {rebuilt.get(name, 'absent')} in "
            f"build_model(model_config)")
    return model_config


def split_task(splits: Mapping[str, Split]) -> dict[str, Any] | None:
    """The task config the splits carry (``split.task`` of
    :func:`~interp_toolkit.tasks.mpsp.make_splits`' splits) as ``train_mpsp`` records it
    (``{"name": ..., **task.to_dict()}``), or ``None`` when a split carries none or they differ."""
    from interp_toolkit.tasks.mpsp import MPSPConfig

    tasks = [getattr(split, "task", None) for split in splits.values()]
    first = tasks[0] if tasks else None
    if not isinstance(first, MPSPConfig) or any(task != first for task in tasks):
        return None
    return {"name": first.name, **first.to_dict()}


def with_split_task(run_info: Mapping[str, Any] | None, splits: Mapping[str, Split]) -> dict[str, Any] | None:
    """``run_info`` with ``task`` filled from the splits when it names none (see :func:`split_task`)."""
    if run_info is not None and "task" in run_info:
        return dict(run_info)
    task = split_task(splits)
    if task is None:
        return None if run_info is None else dict(run_info)
    return {**(run_info or {}), "task": task}


def run_identity(model_cfg: dict[str, Any], train_cfg: TrainConfig, splits: Mapping[str, Split],
                 run_info: Mapping[str, Any] | None) -> dict[str, Any]:
    """The part of a run record that decides whether two runs are the same computation."""
    train = {k: v for k, v in train_cfg.to_dict().items() if k not in _NON_SEMANTIC}
    return {
        "model": model_cfg,
        "train": train,
        "data": {name: fingerprint(split) for name, split in sorted(splits.items())},
        "info": dict(run_info or {}),
    }


@with_threads(train_threads)  # 1 torch thread for tiny work; the caller's count is restored
def train(
    model: Any,
    splits: Mapping[str, Split],
    cfg: TrainConfig,
    run_dir: str | Path,
    run_info: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    callbacks: Sequence[Any] | None = None,
    extend_from: str | Path | None = None,
    model_config: Any = None,
) -> TrainResult:
    """Train ``model`` on ``splits[cfg.train_split]`` with AdamW, logging every split.

    Cross-entropy is taken at ``cfg.readout_position``. If ``run_dir`` holds an unfinished
    run with the same configs and data, training resumes from its last saved state and
    ends with the same weights as an uninterrupted run; if it holds a finished one, the
    stored result is returned and nothing is retrained. A directory holding files of a
    different run (by the run key in ``run.json``, the resume file or any checkpoint) is
    never cleared: it raises ``ForeignRunDirectoryError`` (a ``UserError``) unless
    ``overwrite``, which moves its files aside to ``RUN_DIR.old-TIMESTAMP``. A directory
    copied without its ``run.json`` whose checkpoints carry this run's key keeps its files.

    The directory is locked while training (:class:`~interp_toolkit.runs.lock.DirectoryLock`):
    a second writer is refused at once naming this process's PID. Ctrl-C raises
    :class:`~interp_toolkit.errors.TrainingInterrupted` carrying the epoch a rerun resumes from.

    Args:
        model: A model from :func:`interp_toolkit.build_model`, or any ``TransformerBridge``
            whose ``ModelConfig`` can be derived from its own config or is given as
            ``model_config`` (modified in place; it gets ``interp_config``).
        splits: Named splits with ``.tokens`` [n, pos] and ``.labels`` [n]. Splits from
            :func:`interp_toolkit.tasks.mpsp.make_splits` carry their task: it is recorded
            as ``run_info["task"]`` (as :func:`~interp_toolkit.runs.mpsp.train_mpsp` records
            it) unless ``run_info`` names one, so ``analyze``, ``mechanism`` and ``bif`` work
            on the run. The run key is computed from ``run_info`` as given.
        cfg: Optimization and bookkeeping settings.
        run_dir: Where the run record, metrics and checkpoints go.
        run_info: Extra JSON-able description stored in ``run.json`` (e.g. the task config).
        overwrite: Move whatever ``run_dir`` holds aside (never deleted) and start fresh.
        callbacks: :class:`interp_toolkit.callbacks.Callback` objects told of every
            evaluation, checkpoint and the run's end (e.g. the loggers of
            :mod:`interp_toolkit.loggers`). They run after the state is saved: one that
            raises stops training with the run resumable.
        extend_from: A finished run of this run at fewer epochs (same configs and data but
            ``cfg.epochs``): when this run has not started in ``run_dir``, training continues from that
            run's final state instead of epoch 0, and ends as training from scratch would
            (:mod:`interp_toolkit.runs.extend`; ``run.json`` records ``extended_from``).
            Anything else raises :class:`~interp_toolkit.runs.extend.ExtensionError`.
        model_config: The model's :class:`~interp_toolkit.model.ModelConfig`, for a model that
            does not carry one; :func:`~interp_toolkit.model.build_model` of it must make the
            model's parameters (names and shapes).

    Returns:
        A :class:`TrainResult` with the trained model and the metrics history.
    """
    callbacks = as_callbacks(callbacks)
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"train expects a TrainConfig, got {type(cfg).__name__}")
    model_cfg = given_model_config(model, model_config) if model_config is not None else model_config_of(model)
    model.interp_config = model_cfg  # checkpoints describe themselves with it
    validate_splits(splits, cfg, model_cfg)
    # A bad or absent device fails here, before the directory is locked or created.
    target_device = resolve_device(cfg.device) if cfg.device is not None else None
    lock = DirectoryLock(run_dir, "run directory").acquire()
    clear_killed_writes(Path(run_dir))
    try:
        return _train_locked(model, splits, cfg, Path(run_dir), run_info, overwrite, model_cfg, callbacks,
                             target_device, extend_from)
    except KeyboardInterrupt as err:
        raise interrupted(err, run_dir) from None
    finally:
        lock.release()


def clear_killed_writes(run_dir: Path) -> None:
    """The temp files of a writer killed mid-write (the run's lock is held: no writer is live),
    so a resumed run's folder holds what an uninterrupted one does."""
    from interp_toolkit.io import remove_orphan_temps
    from interp_toolkit.runs.layout import CHECKPOINTS

    for folder in (run_dir, run_dir / CHECKPOINTS):
        remove_orphan_temps(folder)


def interrupted(err: KeyboardInterrupt, run_dir: str | Path) -> KeyboardInterrupt:
    """``err`` as a :class:`~interp_toolkit.errors.TrainingInterrupted` carrying the epoch a
    rerun resumes from (read from the resume file: every saved state is complete)."""
    from interp_toolkit.errors import TrainingInterrupted
    from interp_toolkit.runs.resume import saved_epoch

    if isinstance(err, TrainingInterrupted):
        return err
    return TrainingInterrupted(run_dir, saved_epoch(run_dir))


def _train_locked(model: Any, splits: Mapping[str, Split], cfg: TrainConfig, run_dir: Path,
                  run_info: Mapping[str, Any] | None, overwrite: bool, model_cfg: Any,
                  callbacks: Sequence[Any], target_device: torch.device | None = None,
                  extend_from: str | Path | None = None) -> TrainResult:
    """:func:`train` once ``run_dir`` is locked by this process (``target_device``: where to
    move the model first; ``None``: train where it is)."""
    # The key stays that of the caller's run_info: runs made before the task was recorded
    # automatically keep theirs (the data fingerprints already identify the task).
    identity = run_identity(model_cfg.to_dict(), cfg, splits, run_info)
    key = config_hash(identity)
    run_info = with_split_task(run_info, splits)
    metrics_path = run_dir / METRICS

    if overwrite:
        move_aside(run_dir)
    start_from_shorter_run(run_dir, extend_from, key, identity, cfg)
    # Whose files are here decides what may be touched: another run's are never cleared.
    state = run_dir_state(run_dir, key, cfg.epochs)
    if state.status == "finished":
        finished_model, _ = load_checkpoint(list_checkpoints(run_dir)[-1][1])
        model.load_state_dict(finished_model.state_dict())
        record = state.record or {}
        if state.recovered:  # copied without run.json: write the whole record back
            record = write_recovered_record(run_dir, record, identity=identity, model_config=model_cfg.to_dict(),
                                            train_config=cfg.to_dict(), run_info=run_info)
        elif run_info and "task" in run_info and "task" not in (record.get("run_info") or {}):
            # finished before train() recorded the splits' task: add it (the key is unchanged)
            record = {**record, "run_info": {**(record.get("run_info") or {}), "task": run_info["task"]}}
            write_record(run_dir, record)
        return TrainResult(model, run_dir, read_metrics(metrics_path), record.get("final", {}),
                           already_finished=True)
    run_dir.mkdir(parents=True, exist_ok=True)

    if target_device is not None:
        move_model(model, target_device)
    device = next(model.parameters()).device
    member = ModelMember(model, cfg)
    resumed_from = state.start_epoch if state.status == "resume" else None
    start_epoch = resumed_from if resumed_from is not None else 0
    model.train()
    loop = TrainingLoop(member, splits, cfg, [state], start_epoch, callbacks=callbacks,
                        description=f"train {run_dir.name}")
    loop.prepare([identity], [model_cfg.to_dict()], [run_info])
    loop.run(device)
    record = loop.records[0]
    metrics = read_metrics(metrics_path)
    final = record.get("final", {})
    return TrainResult(model, run_dir, metrics, final, resumed_from=resumed_from,
                       history_seconds=record["train_seconds"])


class ModelMember:
    """One model as the training loop's :class:`~interp_toolkit.runs.loop.Members` (K = 1):
    ``torch.optim.AdamW`` over its parameters, gradients from the lean readout forward
    (:class:`~interp_toolkit.runs.forward.ReadoutForward`) or the bridge, evaluation by
    :func:`evaluate` with the same engine."""

    size = 1

    def __init__(self, model: Any, cfg: TrainConfig) -> None:
        self.model, self.cfg = model, cfg
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas,
                                           weight_decay=cfg.weight_decay)
        self.forward = ReadoutForward(model, cfg.readout_position, cfg.engine)
        self.clipped = [p for p in model.parameters() if p.requires_grad] if cfg.grad_clip is not None else []

    def load(self, index: int, saved: Mapping[str, Any]) -> None:
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict({"state": saved["optimizer_state"],
                                        "param_groups": self.optimizer.state_dict()["param_groups"]})

    def gradients(self, tokens: Tensor, labels: Tensor) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        return self.forward.backward(tokens, labels).reshape(1)  # gradients into .grad, in cache-sized passes

    def update(self, lr: float | None, clip: float | None) -> None:
        if lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(self.clipped, clip)
        self.optimizer.step()

    def evaluate(self, splits: Mapping[str, Any]) -> list[dict[str, float]]:
        return [evaluate(self.model, splits, self.cfg.readout_position, self.cfg.eval_batch_size, self.cfg.engine)]

    def member_model(self, index: int) -> Any:
        return self.model

    def optimizer_state(self, index: int) -> dict[Any, Any]:
        return self.optimizer.state_dict()["state"]

    def select(self, keep: Tensor) -> None:
        raise NotImplementedError("a single run has no early stop")  # train() passes no stop_rule

    def finish(self) -> None:
        self.model.eval()


__all__ = ["TrainConfig", "TrainResult", "train", "evaluate", "readout_loss", "list_checkpoints",
           "checkpoint_path", "clear_run_outputs", "epoch_minibatches", "fingerprint", "truncate_metrics",
           "library_versions",
           "read_run_record", "run_identity", "check_token_ids", "check_label_ids", "validate_splits",
           "plot_training_curves", "plot_curves"]
