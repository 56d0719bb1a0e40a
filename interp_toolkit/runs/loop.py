"""The one training loop: K >= 1 members trained together on one split, a single run is K = 1.

:func:`interp_toolkit.train` (one model, any ``TransformerBridge``) and
:func:`interp_toolkit.runs.batched.train_batched` (K seeds of one architecture, stacked) both
run :class:`TrainingLoop`; what differs is the :class:`Members` they hand it (how gradients
are taken and the optimizer steps: ``trainer.ModelMember``, ``batched.StackedMembers``).
Everything a run directory sees is done here, once: resume or clear each member's folder,
write its record, draw the epoch's minibatches, schedule the learning rate by the global
step, clip, refuse a non-finite loss or evaluation, log every evaluation, save checkpoints
and the resume state (then tell the callbacks), stop members early, finish their records,
and pause: when :func:`interp_toolkit.runs.pause.requested` says so (a campaign's budget or
SIGTERM), the loop saves the resume state of the last finished epoch and raises
:class:`~interp_toolkit.runs.pause.TrainingPaused`, so the run continues from there byte-identically.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

import torch
from torch import Tensor

from interp_toolkit.callbacks import dispatch
from interp_toolkit.checkpoint import save_checkpoint
from interp_toolkit.io import append_jsonl, atomic_write_bytes
from interp_toolkit.progress import progress_bar
from interp_toolkit.runs import pause
from interp_toolkit.runs.config import TrainConfig
from interp_toolkit.runs.extend import carried_fields, clear_run_outputs, keep_final_state
from interp_toolkit.runs.layout import METRICS, curves_path
from interp_toolkit.runs.metrics import read_metrics
from interp_toolkit.runs.record import finish_record, new_training_record, write_record
from interp_toolkit.runs.resume import RESUME_NAME, RunDirState, checkpoint_path, save_resume_state

#: ``stop_rule(metrics) -> True`` ends a member's training after that evaluation.
StopRule = Callable[[dict[str, Any]], bool]


class Members(Protocol):
    """What :class:`TrainingLoop` trains: ``size`` members that share data and settings."""

    @property
    def size(self) -> int:
        """How many members are still trained."""

    def load(self, index: int, saved: Mapping[str, Any]) -> None:
        """Member ``index``'s weights and optimizer state from a resume state."""

    def gradients(self, tokens: Tensor, labels: Tensor) -> Tensor:
        """Take every member's gradient of its mean loss on one batch; ``[size]`` losses."""

    def update(self, lr: float | None, clip: float | None) -> None:
        """One optimizer step from the last gradients (``lr``: the scheduled rate or None for
        the configured one; ``clip``: each member's gradient-norm bound or None)."""

    def evaluate(self, splits: Mapping[str, Any]) -> list[dict[str, float]]:
        """Every member's loss and accuracy on every split, in member order."""

    def member_model(self, index: int) -> Any:
        """A model holding member ``index``'s weights (for its checkpoint)."""

    def optimizer_state(self, index: int) -> dict[Any, Any]:
        """Member ``index``'s optimizer state as ``torch.optim.AdamW.state_dict()["state"]``."""

    def select(self, keep: Tensor) -> None:
        """Keep only the members indexed by ``keep`` (the others stopped early)."""

    def finish(self) -> None:
        """Training is over (e.g. back to eval mode)."""


def epoch_minibatches(n: int, batch_size: int | None, shuffle_gen: torch.Generator,
                      device: torch.device | str) -> Iterator[Tensor | slice]:
    """Indices of one epoch's minibatches of an ``n``-example training split.

    Shared by every trainer, so that runs trained alone and together see the same batches:
    ``batch_size`` None is full-batch training (one ``slice(None)``, the generator is not
    drawn from); otherwise a fresh permutation from ``shuffle_gen`` cut into pieces of
    ``batch_size`` (the last may be smaller).
    """
    if batch_size is None:
        yield slice(None)
        return
    order = torch.randperm(n, generator=shuffle_gen).to(device)
    for start in range(0, n, batch_size):
        yield order[start : start + batch_size]


def truncate_metrics(run_dir: str | Path, epoch: int, evaluation_epochs: Sequence[int] = ()) -> None:
    """Resume step shared by every trainer: keep the evaluation history up to ``epoch`` (the
    saved state); later lines, a torn line and bad lines are dropped and recomputed
    identically, scheduled evaluations (``evaluation_epochs``) missing before ``epoch`` are
    restored from the run's checkpoints, and a one-line notice on stderr says how many
    lines were dropped or restored (:func:`interp_toolkit.runs.metrics.repair_for_resume`).
    """
    from interp_toolkit.errors import notice
    from interp_toolkit.runs.metrics import repair_for_resume

    metrics_path = Path(run_dir) / METRICS
    kept, message = repair_for_resume(run_dir, epoch, evaluation_epochs)
    if message is not None:
        notice(message)
        atomic_write_bytes(metrics_path, "".join(json.dumps(m, sort_keys=True) + "\n" for m in kept).encode())


def diverged(what: str, lr: float, run_dir: str | Path) -> Exception:
    """The :class:`~interp_toolkit.errors.TrainingDivergedError` of a run whose training
    became non-finite (``what``), naming the learning rate and where the run stands."""
    from interp_toolkit.errors import TrainingDivergedError
    from interp_toolkit.runs.resume import saved_epoch

    saved = saved_epoch(run_dir)
    kept = f"{run_dir} keeps its state at epoch {saved}" if saved is not None else f"{run_dir} holds no saved state"
    return TrainingDivergedError(f"{what}: training diverged with lr {lr:g}; lower --train.lr ({kept}; rerun with "
                                 f"--overwrite and a lower lr)")


def check_finite_evaluation(metrics: Mapping[str, Any], lr: float, run_dir: str | Path) -> None:
    """Raise :func:`diverged` if an evaluation has a non-finite loss (checked before the line
    is logged, so ``metrics.jsonl`` never holds one)."""
    bad = {k: v for k, v in metrics.items() if k != "epoch" and isinstance(v, float) and not math.isfinite(v)}
    if bad:
        detail = ", ".join(f"{k} {v}" for k, v in sorted(bad.items()))
        raise diverged(f"evaluation at epoch {metrics.get('epoch')} gave {detail}", lr, run_dir)


def plot_training_curves(metrics: Sequence[Mapping[str, Any]], ax: Any = None) -> Any:
    """Loss (log scale) and accuracy of every split against epochs (log scale).

    Each split has its colour and line style (:data:`interp_toolkit.plotting.SPLIT_LINESTYLES`);
    one legend, right of the accuracy panel.

    Args:
        metrics: Lines of a ``metrics.jsonl`` (``epoch``, ``<split>_loss``, ``<split>_acc``).
        ax: Optional two axes ``(loss_ax, accuracy_ax)`` to draw into.

    Returns:
        The :class:`matplotlib.figure.Figure` drawn on.
    """
    from interp_toolkit.plotting import (
        epoch_axis,
        label,
        legend_outside,
        new_panels,
        split_colors,
        split_linestyle,
        style,
    )

    with style():
        fig, (ax_loss, ax_acc) = new_panels(2, ax, ncols=2, figsize=(9.5, 3.4))
        if not metrics:
            return fig
        epochs = [m["epoch"] for m in metrics]
        colors = split_colors()
        for axis, suffix in ((ax_loss, "_loss"), (ax_acc, "_acc")):
            for key in sorted(k for k in metrics[0] if k.endswith(suffix)):
                split = key[: -len(suffix)]
                axis.plot(epochs, [m[key] for m in metrics], label=label(split), color=colors.get(split),
                          ls=split_linestyle(split))
            epoch_axis(axis, epochs)
        legend_outside(ax_acc)  # the same splits in both panels: one legend, beside the data
        ax_loss.set(ylabel="cross-entropy loss", yscale="log")
        ax_acc.set(ylabel="accuracy", ylim=(-0.02, 1.02))
    return fig


def plot_curves(metrics: list[dict[str, Any]], path: Path) -> None:
    """Write :func:`plot_training_curves` of ``metrics`` to ``path`` (nothing when empty)."""
    from interp_toolkit.plotting import save_figure

    if metrics:
        save_figure(plot_training_curves(metrics), path)


class TrainingLoop:
    """Train ``members`` (all starting at ``start_epoch``) in their run directories.

    Args:
        members: What is trained (:class:`Members`), ``len(states)`` of them, in order.
        splits: The named splits (``cfg.train_split`` is trained on, every split evaluated).
        cfg: The settings every member shares.
        states: Each member's run directory as found (:func:`~interp_toolkit.runs.resume.run_dir_state`;
            status ``resume`` or ``fresh``), its folder locked by the caller.
        start_epoch: The epoch every member starts from (its resume state's, or 0).
        callbacks: Told of every evaluation, checkpoint and end, after the state is saved.
        stop_rule: Optional early stop per member (called after every evaluation).
        description: The progress bar's label.
    """

    def __init__(self, members: Members, splits: Mapping[str, Any], cfg: TrainConfig,
                 states: Sequence[RunDirState], start_epoch: int, *, callbacks: Sequence[Any] = (),
                 stop_rule: StopRule | None = None, description: str = "train") -> None:
        self.members, self.splits, self.cfg = members, splits, cfg
        self.states, self.start_epoch = list(states), start_epoch
        self.callbacks, self.stop_rule, self.description = callbacks, stop_rule, description
        self.shuffle_gen = torch.Generator().manual_seed(cfg.seed)
        self.records: list[dict[str, Any]] = []
        # active[j]: the position in ``states`` of the j-th member still trained
        self.active = list(range(len(self.states)))
        self.stopped: dict[int, int | None] = {}
        self.started = time.perf_counter()

    def prepare(self, identities: Sequence[Mapping[str, Any]], model_configs: Sequence[Mapping[str, Any]],
                run_infos: Sequence[Mapping[str, Any] | None], *, mark_resumed: bool = False,
                **record_extra: Any) -> None:
        """Resume each member from its saved state (its metrics cut back to that epoch) or
        clear its folder's outputs, then write its record (``record_extra``: fields the
        trainer adds, e.g. ``trainer="batched"``; ``mark_resumed=True`` records
        ``resumed_from``)."""
        split_sizes = {name: len(split.labels) for name, split in self.splits.items()}
        for i, state in enumerate(self.states):
            if state.status == "resume":
                saved = state.resume_state
                assert saved is not None  # status "resume" carries the state
                self.members.load(i, saved)
                self.shuffle_gen.set_state(saved["shuffle_rng"])  # identical across members (same cfg.seed)
                # evaluations logged after the saved state are dropped; they are recomputed identically
                truncate_metrics(state.run_dir, self.start_epoch, self.cfg.evaluation_epochs())
            else:
                clear_run_outputs(state.run_dir)
            record = new_training_record(
                key=state.key, identity=identities[i], model_config=model_configs[i],
                train_config=self.cfg.to_dict(), split_sizes=split_sizes, run_info=run_infos[i],
                **record_extra, **carried_fields(state.record))
            if mark_resumed and state.status == "resume":
                record["resumed_from"] = self.start_epoch
            write_record(state.run_dir, record)
            self.records.append(record)

    # ------------------------------------------------------------------ saving

    def _save(self, j: int, epoch: int, metrics: dict[str, Any], force_checkpoint: bool = False) -> None:
        state = self.states[self.active[j]]
        model = self.members.member_model(j)
        if epoch in self._ckpt_epochs or force_checkpoint:
            save_checkpoint(model, checkpoint_path(state.run_dir, epoch),
                            metadata={"epoch": epoch, "metrics": metrics, "run_key": state.key})
        save_resume_state(state.run_dir / RESUME_NAME, epoch, state.key, model.state_dict(),
                          self.members.optimizer_state(j), self.shuffle_gen.get_state())
        if force_checkpoint:  # scheduled checkpoints are reported by _log_evaluation
            dispatch(self.callbacks, "on_checkpoint", state.run_dir, checkpoint_path(state.run_dir, epoch), epoch)

    def _finish(self, j: int, stopped_at: int | None) -> None:
        i = self.active[j]
        run_dir = self.states[i].run_dir
        metrics = read_metrics(run_dir / METRICS)
        plot_curves(metrics, curves_path(run_dir))
        extra = {"stopped_early_at": stopped_at} if stopped_at is not None else {}
        finish_record(run_dir, self.records[i], metrics[-1] if metrics else {}, time.perf_counter() - self.started,
                      **extra)
        keep_final_state(run_dir)
        self.stopped[i] = stopped_at
        dispatch(self.callbacks, "on_run_end", run_dir, self.records[i]["final"])

    def _log_evaluation(self, epoch: int, logged_before: frozenset[int] = frozenset()) -> list[dict[str, Any]]:
        """Evaluate every active member at ``epoch``, log and save it; members in
        ``logged_before`` (positions in ``active``) already hold this evaluation and state."""
        results = [{"epoch": epoch, **metrics} for metrics in self.members.evaluate(self.splits)]
        for j, metrics in enumerate(results):  # all checked before any line is logged
            check_finite_evaluation(metrics, self.cfg.lr, self.states[self.active[j]].run_dir)
        for j, metrics in enumerate(results):
            if j not in logged_before:
                append_jsonl(self.states[self.active[j]].run_dir / METRICS, metrics)
                self._save(j, epoch, metrics)
        # After every member's state is saved: a callback that raises leaves all resumable.
        for j, metrics in enumerate(results):
            if j in logged_before:
                continue
            run_dir = self.states[self.active[j]].run_dir
            dispatch(self.callbacks, "on_evaluation", run_dir, metrics)
            if epoch in self._ckpt_epochs:
                dispatch(self.callbacks, "on_checkpoint", run_dir, checkpoint_path(run_dir, epoch), epoch)
        return results

    def _pause(self, epoch: int, reason: str, eval_epochs: set[int]) -> None:
        """Save every active member's resume state at ``epoch`` (an evaluation epoch's is saved
        already) and raise :class:`~interp_toolkit.runs.pause.TrainingPaused`."""
        if epoch not in eval_epochs:  # not a checkpoint epoch either: the resume state alone
            for j in range(len(self.active)):
                self._save(j, epoch, {})
        self.members.finish()
        raise pause.TrainingPaused(epoch, reason)

    # ------------------------------------------------------------------ training

    def run(self, device: torch.device | str) -> dict[int, int | None]:
        """Train to ``cfg.epochs`` (or each member's early stop); returns the epoch each member
        stopped early at (None: ran to the end), by position in ``states``."""
        cfg, members = self.cfg, self.members
        self._ckpt_epochs = set(cfg.checkpoint_epochs())
        eval_epochs = set(cfg.evaluation_epochs())
        train_split = self.splits[cfg.train_split]
        tokens, labels = train_split.tokens.to(device), train_split.labels.to(device)
        if self.start_epoch == 0:
            # A member resuming from a state saved at epoch 0 (killed right after its first
            # evaluation) keeps that evaluation and state; logging them again would write a
            # second epoch-0 line, a history no uninterrupted run has.
            resumed = frozenset(i for i, state in enumerate(self.states) if state.status == "resume")
            if len(resumed) < len(self.states):
                self._log_evaluation(0, resumed)
        self.started = time.perf_counter()
        bar = progress_bar(range(self.start_epoch + 1, cfg.epochs + 1), desc=self.description, disable=not cfg.progress,
                   initial=self.start_epoch, total=cfg.epochs, leave=False)
        # the learning rate is a function of the global step, so a resumed run follows the
        # schedule exactly; clipping bounds each member's own gradient norm
        per_epoch = cfg.steps_per_epoch(len(labels))
        total_steps = cfg.epochs * per_epoch
        for epoch in bar:
            if epoch > self.start_epoch + 1 and (reason := pause.requested()) is not None:
                bar.close()
                self._pause(epoch - 1, reason, eval_epochs)
            for batch, idx in enumerate(epoch_minibatches(len(labels), cfg.batch_size, self.shuffle_gen, device)):
                losses = members.gradients(tokens[idx], labels[idx])
                if not bool(torch.isfinite(losses).all()):
                    values = losses.tolist()
                    first = next(j for j, value in enumerate(values) if not math.isfinite(value))
                    shown = values[0] if len(self.states) == 1 else values
                    raise diverged(f"training loss became {shown} at epoch {epoch}", cfg.lr,
                                   self.states[self.active[first]].run_dir)
                lr = cfg.lr_at((epoch - 1) * per_epoch + batch + 1, total_steps) if cfg.schedules_lr else None
                members.update(lr, cfg.grad_clip)
            if epoch not in eval_epochs:
                continue
            logged = self._log_evaluation(epoch)
            bar.set_postfix({k: f"{v:.3f}" for k, v in logged[0].items() if k.endswith("_acc")})
            if self.stop_rule is None or epoch == cfg.epochs:
                continue
            done = [j for j, metrics in enumerate(logged) if self.stop_rule(metrics)]
            if not done:
                continue
            for j in done:
                if epoch not in self._ckpt_epochs:  # the last state is always a checkpoint
                    self._save(j, epoch, logged[j], force_checkpoint=True)
                self._finish(j, epoch)
            keep = [j for j in range(len(self.active)) if j not in done]
            if not keep:
                break
            members.select(torch.tensor(keep, dtype=torch.long, device=tokens.device))
            self.active = [self.active[j] for j in keep]
        bar.close()
        members.finish()
        if self.active and members.size == len(self.active):
            for j in range(len(self.active)):
                if self.active[j] not in self.stopped:
                    self._finish(j, None)
        return self.stopped


__all__ = ["Members", "StopRule", "TrainingLoop", "check_finite_evaluation", "diverged", "epoch_minibatches",
           "plot_curves", "plot_training_curves", "truncate_metrics"]
