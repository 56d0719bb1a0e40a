"""Training settings (:class:`TrainConfig`), importable without torch.

Command-line parsing (``interp-toolkit train --help``, config files) builds these configs;
keeping them free of torch keeps ``--help`` instant. The trainer that uses them is
:mod:`interp_toolkit.runs.trainer`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from interp_toolkit.config import Config, check_seed
from interp_toolkit.devices import check_device_name
from interp_toolkit.errors import UserError

#: Training forwards: the lean readout-only engine (:mod:`interp_toolkit.runs.engine`) or
#: the TransformerBridge's full forward.
ENGINES = ("fast", "bridge")
#: Learning-rate schedules after the warmup (:meth:`TrainConfig.lr_at`).
LR_SCHEDULES = ("constant", "cosine", "linear")
#: Fields added after run keys (which hash ``to_dict()``) were first issued: left out of the
#: dict at their defaults, so every earlier run keeps its key and folder name.
_LATER_FIELDS = {"warmup_steps": 0, "lr_schedule": "constant", "min_lr_ratio": 0.0, "grad_clip": None}


def steps_per_epoch(n_train: int, batch_size: int | None) -> int:
    """Optimizer steps in one epoch: 1 at full batch (``batch_size`` None), else
    ``ceil(n_train / batch_size)`` (the trainers' ``epoch_minibatches`` cut a permutation into
    pieces of ``batch_size``, the last one smaller when it does not divide)."""
    if batch_size is None:
        return 1
    return -(-int(n_train) // int(batch_size))


def lr_factor(step: int, total_steps: int, warmup_steps: int = 0, lr_schedule: str = "constant",
              min_lr_ratio: float = 0.0) -> float:
    """The learning rate of optimizer step ``step`` (1-based) of ``total_steps`` as a fraction
    of the peak lr (:meth:`TrainConfig.lr_at` divided by ``lr``; see it for the formula)."""
    if step <= warmup_steps:
        return step / warmup_steps
    if lr_schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup_steps)
    t = min(1.0, (step - warmup_steps - 1) / decay_steps)
    shape = (1.0 + math.cos(math.pi * t)) / 2.0 if lr_schedule == "cosine" else 1.0 - t
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape


def lr_steps(steps: int, total_steps: int, warmup_steps: int = 0, lr_schedule: str = "constant",
             min_lr_ratio: float = 0.0) -> float:
    """The learning rate summed over the first ``steps`` steps of ``total_steps``, in units of
    the peak lr: ``steps`` itself without a warmup or a decay; the quantity decoupled weight
    decay integrates (it shrinks weights by ``lr_t x wd`` per step)."""
    if warmup_steps == 0 and lr_schedule == "constant":
        return float(steps)
    return math.fsum(lr_factor(step, total_steps, warmup_steps, lr_schedule, min_lr_ratio)
                     for step in range(1, steps + 1))


def check_engine_name(engine: str) -> None:
    """Raise ``ValueError`` naming ``engine`` unless it is one of :data:`ENGINES`."""
    if engine not in ENGINES:
        raise UserError(f"engine must be one of {ENGINES}, got {engine!r}")


@dataclass
class TrainConfig(Config):
    """Validated optimization and bookkeeping settings.

    Attributes:
        epochs: Passes over the training split.
        lr, betas, weight_decay: AdamW settings (defaults follow grokking-style setups:
            lr 1e-3, betas (0.9, 0.98), weight decay 0.1).
        batch_size: ``None`` for full-batch training, else minibatch size (reshuffled
            each epoch from ``seed``).
        eval_every: Evaluate every named split every this many epochs (and at the end).
        checkpoint_every: Save a checkpoint every this many epochs (``None``: never on a
            linear schedule).
        checkpoint_log_spaced: Also save at epochs 1, 2, 4, 8, ... (Pythia-style early
            checkpoints). Epoch 0 and the last epoch are always saved.
        readout_position: Sequence position whose logits are trained and scored.
        train_split: Name of the split to train on.
        eval_batch_size: Batch size of evaluation passes.
        seed: Seed of minibatch shuffling.
        progress: Show a tqdm bar.
        engine: ``"fast"``: the lean readout-only forward of :mod:`interp_toolkit.runs.engine`
            where it can express the model exactly (else the bridge's forward, with a
            warning); ``"bridge"``: always the TransformerBridge's full forward. Same results
            up to float rounding, so not part of a run's identity. Rounding can still decide a
            chaotic run's outcome (whether one seed leaves a shortcut; docs/reproduction.md,
            "rounding"): compare rates over seeds, not single seeds, across engines.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA if available); the
            model is moved there before training. ``None``: train where the model is.
        warmup_steps: Optimizer steps of linear warmup from lr / warmup_steps to lr (0: none).
        lr_schedule: After the warmup: constant, cosine or linear decay to min_lr_ratio x lr
            at the last step.
        min_lr_ratio: The schedule's floor as a fraction of lr, in [0, 1].
        grad_clip: Clip the gradient's global norm to this before each step (None: no clipping).
    """

    epochs: int = 2_000
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.1
    batch_size: int | None = None
    eval_every: int = 10
    checkpoint_every: int | None = 100
    checkpoint_log_spaced: bool = True
    readout_position: int = -1
    train_split: str = "train"
    eval_batch_size: int = 8_192
    seed: int = 0
    progress: bool = True
    engine: str = "fast"
    device: str | None = None
    warmup_steps: int = 0
    lr_schedule: str = "constant"
    min_lr_ratio: float = 0.0
    grad_clip: float | None = None

    def __post_init__(self) -> None:
        check_seed("TrainConfig.seed", self.seed, "the shuffling seed")
        betas = tuple(float(b) for b in self.betas)  # JSON gives lists
        self.betas = betas  # type: ignore[assignment]  # its length is checked below, by name
        check_engine_name(self.engine)
        check_device_name(self.device)
        for name in ("epochs", "eval_every", "eval_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"TrainConfig.{name} must be a positive integer, got {value!r}")
        for name in ("batch_size", "checkpoint_every"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise UserError(f"TrainConfig.{name} must be a positive integer or None, got {value!r}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise UserError(f"TrainConfig.lr must be a positive number, got {self.lr!r}")
        if not (isinstance(self.weight_decay, (int, float)) and not isinstance(self.weight_decay, bool)
                and math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise UserError(f"TrainConfig.weight_decay must be a finite number >= 0, "
                             f"got {self.weight_decay!r}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise UserError(f"TrainConfig.betas must be two numbers in [0, 1), got {self.betas!r}")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise UserError(f"TrainConfig.warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise UserError(f"TrainConfig.lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if not (isinstance(self.min_lr_ratio, (int, float)) and not isinstance(self.min_lr_ratio, bool)
                and 0.0 <= self.min_lr_ratio <= 1.0):
            raise UserError(f"TrainConfig.min_lr_ratio must be a number in [0, 1], got {self.min_lr_ratio!r}")
        if self.min_lr_ratio and self.lr_schedule == "constant":
            raise UserError(f"TrainConfig.min_lr_ratio {self.min_lr_ratio!r} is the floor of a decaying schedule; "
                             "set lr_schedule to cosine or linear (or leave min_lr_ratio at 0)")
        if self.grad_clip is not None and not (isinstance(self.grad_clip, (int, float))
                                               and not isinstance(self.grad_clip, bool)
                                               and math.isfinite(self.grad_clip) and self.grad_clip > 0):
            raise UserError(f"TrainConfig.grad_clip must be a positive number or None, got {self.grad_clip!r}")

    def to_dict(self) -> dict[str, Any]:
        """Every field, except the warmup, schedule and clipping fields at their defaults: they
        were added after run keys (which hash this dict) were first issued."""
        data = super().to_dict()
        for name, default in _LATER_FIELDS.items():
            if data[name] == default:
                del data[name]
        return data

    @property
    def schedules_lr(self) -> bool:
        """Whether the learning rate changes over training (warmup or a decaying schedule)."""
        return self.warmup_steps > 0 or self.lr_schedule != "constant"

    def steps_per_epoch(self, n_train: int) -> int:
        """Optimizer steps per epoch on ``n_train`` examples (1 at full batch): :func:`steps_per_epoch`."""
        return steps_per_epoch(n_train, self.batch_size)

    def lr_at(self, step: int, total_steps: int) -> float:
        """The learning rate of optimizer step ``step`` (1-based) of ``total_steps``.

        Linear warmup ``lr * step / warmup_steps`` for the first ``warmup_steps`` steps, then
        the schedule over the remaining steps: constant ``lr``; cosine
        ``lr * (m + (1 - m) * (1 + cos(pi * t)) / 2)``; linear ``lr * (m + (1 - m) * (1 - t))``,
        with ``m = min_lr_ratio`` and ``t`` the fraction of the post-warmup steps done before
        this one (0 at the first, reaching ``(n - 1) / n`` at the last).
        """
        if step <= self.warmup_steps:  # lr * step / warmup, in this order: the rounding every run trained with
            return self.lr * step / self.warmup_steps
        return self.lr * lr_factor(step, total_steps, self.warmup_steps, self.lr_schedule, self.min_lr_ratio)

    def checkpoint_epochs(self) -> list[int]:
        """Every epoch at which a checkpoint is saved, sorted."""
        epochs = {0, self.epochs}
        if self.checkpoint_every:
            epochs.update(range(0, self.epochs + 1, self.checkpoint_every))
        if self.checkpoint_log_spaced:
            power = 1
            while power <= self.epochs:
                epochs.add(power)
                power *= 2
        return sorted(epochs)

    def evaluation_epochs(self) -> list[int]:
        """Every epoch at which :func:`interp_toolkit.runs.trainer.train` evaluates (and logs a
        ``metrics.jsonl`` line)."""
        epochs = set(range(0, self.epochs + 1, self.eval_every)) | set(self.checkpoint_epochs())
        return sorted(epochs)


__all__ = ["ENGINES", "LR_SCHEDULES", "TrainConfig", "check_engine_name", "lr_factor", "lr_steps", "steps_per_epoch"]
