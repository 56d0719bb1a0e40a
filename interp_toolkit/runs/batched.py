"""Many seeds of one architecture trained together in one process.

``train_batched`` trains K models that share an architecture, a training config and the
data, and differ only in their initialization seed. Their parameters are stacked with
``torch.func.stack_module_state``. By default (``TrainConfig.engine == "fast"``) the
gradients come from :mod:`interp_toolkit.runs.engine` (batched matmuls over the member
dimension; each member bit-identical to ``train()`` when a step is one pass); otherwise one
``vmap(grad_and_value(loss))`` over
``functional_call`` of a meta-device copy of the ``TransformerBridge`` gives every
member's gradient in one pass, and AdamW is applied functionally to the stacked tensors
with exactly the update rule of ``torch.optim.AdamW`` (decoupled weight decay, bias
correction, ``eps`` added after the square root). The trajectories match training each
member alone with :func:`interp_toolkit.train` to float tolerance (see
``tests/test_batched.py``).

Every member gets a run directory with the layout :func:`interp_toolkit.train` writes
(``run.json`` with the same key, ``metrics.jsonl``, ``checkpoints/epoch_*.safetensors``,
``resume.safetensors`` in ``train``'s pickle-free format, ``curves.png``), locked while
training and guarded against clearing another run's files as ``train`` does, so a directory written here is a
cache hit for ``train`` and every analysis that reads run directories works on it.
"""

from __future__ import annotations

import contextlib
import copy
import io as _io
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from interp_toolkit.callbacks import as_callbacks, dispatch
from interp_toolkit.checkpoint import save_checkpoint
from interp_toolkit.devices import resolve_device
from interp_toolkit.errors import UserError
from interp_toolkit.io import (
    append_jsonl,
    config_hash,
)
from interp_toolkit.model import ModelConfig, build_model
from interp_toolkit.runs.cost import batched_train_threads
from interp_toolkit.runs.engine import (
    engine_spec,
    param_key_map,
    stacked_grads,
    stacked_logits,
    warn_fallback_once,
)
from interp_toolkit.runs.extend import (
    carried_fields,
    check_extension_source,
    clear_run_outputs,
    continue_from,
    keep_final_state,
    starts_fresh,
)
from interp_toolkit.runs.layout import METRICS, curves_path, metrics_path
from interp_toolkit.runs.lock import DirectoryLock
from interp_toolkit.runs.metrics import read_metrics
from interp_toolkit.runs.optim import StackedAdamW, clip_member_grads_
from interp_toolkit.runs.record import (
    finish_record,
    new_training_record,
    read_record,
    write_record,
    write_recovered_record,
)
from interp_toolkit.runs.resume import (
    RESUME_NAME,
    RunDirState,
    checkpoint_path,
    move_aside,
    run_dir_state,
    save_resume_state,
    saved_epoch,
)
from interp_toolkit.runs.trainer import (
    Split,
    TrainConfig,
    check_finite_evaluation,
    diverged,
    epoch_minibatches,
    plot_curves,
    run_identity,
    truncate_metrics,
    validate_splits,
    with_split_task,
)
from interp_toolkit.threads import with_threads

#: ``stop_rule(metrics) -> True`` ends a member's training after that evaluation.
StopRule = Callable[[dict[str, Any]], bool]


@dataclass
class BatchedResult:
    """What :func:`train_batched` returns: one entry per member, in input order."""

    run_dirs: list[Path]
    finals: list[dict[str, Any]]
    already_finished: list[bool]
    resumed_from: list[int | None]
    stopped_early_at: list[int | None]
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def _check_same_architecture(model_cfgs: Sequence[ModelConfig]) -> None:
    if not model_cfgs:
        raise UserError("train_batched needs at least one ModelConfig, got an empty list")
    for cfg in model_cfgs:
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"train_batched expects ModelConfig items, got {type(cfg).__name__}")
    reference = {k: v for k, v in model_cfgs[0].to_dict().items() if k != "seed"}
    for cfg in model_cfgs[1:]:
        other = {k: v for k, v in cfg.to_dict().items() if k != "seed"}
        if other != reference:
            diff = sorted(k for k in reference if reference[k] != other[k])
            raise UserError(
                f"train_batched members must share one architecture (only the seed may differ); "
                f"fields {diff} differ"
            )


class StackedModel:
    """K members of one TransformerBridge architecture as stacked tensors.

    Args:
        model_cfgs: One config per member; only ``seed`` may differ.
        device: Where the stacked tensors live.
        engine: ``"fast"``: gradients and logits from :mod:`interp_toolkit.runs.engine`
            where it can express the model (else vmap over the bridge, with a warning);
            ``"bridge"``: always vmap over the bridge's forward.
    """

    def __init__(self, model_cfgs: Sequence[ModelConfig], device: str | torch.device = "cpu",
                 engine: str = "fast") -> None:
        _check_same_architecture(model_cfgs)
        self.model_cfgs = list(model_cfgs)
        members = [build_model(cfg, device=device) for cfg in model_cfgs]
        self.template = members[0]
        params, buffers = torch.func.stack_module_state(members)
        self.params: dict[str, Tensor] = {k: v.detach().clone() for k, v in params.items()}
        self.buffers: dict[str, Tensor] = {k: v.detach().clone() for k, v in buffers.items()}
        self.param_names = [name for name, _ in self.template.named_parameters()]
        with contextlib.redirect_stdout(_io.StringIO()):  # TransformerLens prints the move
            self.base = copy.deepcopy(self.template).to("meta")
        del members
        # The fast engine addresses tensors by state-dict key.
        self.spec = None
        if engine == "fast":
            self.spec, reason = engine_spec(self.model_cfgs[0], self.template.cfg)
            if self.spec is None:
                warn_fallback_once(reason or "unknown")
        self.state_keys = param_key_map(self.template)

    def engine_tensors(self) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """``(params, constants)`` by state-dict key, for the fast engine."""
        params = {self.state_keys[k]: v for k, v in self.params.items()}
        constants = {self.state_keys[k]: v for k, v in self.buffers.items() if k in self.state_keys}
        return params, constants

    @property
    def size(self) -> int:
        """Number of members currently stacked."""
        return next(iter(self.params.values())).shape[0]

    def logits(self, params: Mapping[str, Tensor], buffers: Mapping[str, Tensor],
               tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos vocab"]:
        """One member's forward pass (the function that is vmapped)."""
        return torch.func.functional_call(self.base, (dict(params), dict(buffers)), (tokens,))

    def load_member(self, index: int, state_dict: Mapping[str, Tensor]) -> None:
        """Overwrite member ``index`` with a ``state_dict`` (TransformerLens-style keys)."""
        self.template.load_state_dict(dict(state_dict))
        with torch.no_grad():
            for name, param in self.template.named_parameters():
                self.params[name][index].copy_(param)
            for name, buffer in self.template.named_buffers():
                if name in self.buffers:
                    self.buffers[name][index].copy_(buffer)

    def member_model(self, index: int) -> Any:
        """The shared template model holding member ``index``'s weights (overwritten per call)."""
        with torch.no_grad():
            for name, param in self.template.named_parameters():
                param.copy_(self.params[name][index])
            for name, buffer in self.template.named_buffers():
                if name in self.buffers:
                    buffer.copy_(self.buffers[name][index])
        self.template.interp_config = self.model_cfgs[index]
        return self.template

    def select(self, keep: Tensor, kept_cfgs: Sequence[ModelConfig]) -> None:
        """Keep only the members indexed by ``keep``."""
        self.params = {k: v[keep].contiguous() for k, v in self.params.items()}
        self.buffers = {k: v[keep].contiguous() for k, v in self.buffers.items()}
        self.model_cfgs = list(kept_cfgs)


#: Member-examples per vmapped pass. On CPU the stacked activations of K members over a
#: full batch overflow the caches and make the step memory-bound (measured 2.3x slower than
#: K sequential steps at K = 8, n = 2,048); passes of ~2,048 member-examples recover it.
#: The gradient is accumulated over the passes (same value as one pass, up to rounding).
MEMBER_EXAMPLES_PER_PASS = 2_048


def default_chunk_size(n_members: int) -> int:
    """Examples per vmapped pass for ``n_members`` stacked members."""
    return max(32, MEMBER_EXAMPLES_PER_PASS // max(1, n_members))


def batched_readout_loss(
    stacked: StackedModel,
    tokens: Int[Tensor, "batch pos"],
    labels: Int[Tensor, " batch"],
    position: int,
    chunk_size: int | None = None,
) -> tuple[dict[str, Tensor], Float[Tensor, " member"]]:
    """Gradients (stacked) and mean cross-entropy of every member on one batch.

    Args:
        stacked: The members.
        tokens: The batch's inputs, shared by all members.
        labels: The batch's labels.
        position: Readout position.
        chunk_size: Examples per vmapped pass (default :func:`default_chunk_size`); the
            gradient of the batch mean is accumulated over the passes.

    Returns:
        ``(grads, losses)``: ``grads[name]`` is ``[member, ...]``, ``losses`` is ``[member]``.
    """
    if stacked.spec is not None:  # the fast engine
        params, constants = stacked.engine_tensors()
        grads_by_key, fast_losses = stacked_grads(stacked.spec, params, constants, tokens, labels, position,
                                                  chunk_size)
        return ({name: grads_by_key[key] for name, key in stacked.state_keys.items() if name in stacked.params},
                fast_losses)
    n = labels.shape[0]
    chunk = chunk_size or default_chunk_size(stacked.size)

    def loss_fn(params: dict[str, Tensor], buffers: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        logits = stacked.logits(params, buffers, x)[:, position, :]
        return F.cross_entropy(logits, y, reduction="sum") / n

    grad_fn = torch.func.vmap(torch.func.grad_and_value(loss_fn), in_dims=(0, 0, None, None))
    grads: dict[str, Tensor] | None = None
    losses: Tensor | None = None
    for start in range(0, n, chunk):
        part_grads, part_loss = grad_fn(stacked.params, stacked.buffers, tokens[start : start + chunk],
                                        labels[start : start + chunk])
        if grads is None or losses is None:
            grads, losses = part_grads, part_loss
        else:
            for name, grad in part_grads.items():
                grads[name].add_(grad)
            losses = losses + part_loss
    assert grads is not None and losses is not None
    return grads, losses


@torch.no_grad()
def evaluate_batched(stacked: StackedModel, splits: Mapping[str, Split], position: int = -1,
                     batch_size: int = 8_192) -> list[dict[str, float]]:
    """Loss and accuracy of every member on every split (the metrics of ``evaluate``)."""
    forward = torch.func.vmap(lambda p, b, x: stacked.logits(p, b, x)[:, position, :], in_dims=(0, 0, None))
    device = next(iter(stacked.params.values())).device
    k = stacked.size
    engine_params, engine_constants = stacked.engine_tensors()
    out: list[dict[str, float]] = [{} for _ in range(k)]
    for name, split in splits.items():
        total_loss = torch.zeros(k, dtype=torch.float64)
        correct = torch.zeros(k, dtype=torch.long)
        n = len(split.labels)
        for start in range(0, n, batch_size):
            tokens = split.tokens[start : start + batch_size].to(device)
            labels = split.labels[start : start + batch_size].to(device)
            if stacked.spec is not None:  # the fast engine
                logits = stacked_logits(stacked.spec, {**engine_params, **engine_constants}, tokens, position)
            else:
                logits = forward(stacked.params, stacked.buffers, tokens)  # [k, b, vocab]
            losses = F.cross_entropy(logits.flatten(0, 1), labels.repeat(k), reduction="none")
            total_loss += losses.view(k, -1).sum(-1).double().cpu()
            correct += (logits.argmax(-1) == labels).sum(-1).cpu()
        for i in range(k):
            out[i][f"{name}_loss"] = float(total_loss[i]) / n
            out[i][f"{name}_acc"] = int(correct[i]) / n
    return out


@with_threads(batched_train_threads)  # 1 torch thread for tiny work; the caller's count is restored
def train_batched(
    model_cfgs: Sequence[ModelConfig],
    splits: Mapping[str, Split],
    cfg: TrainConfig,
    run_dirs: Sequence[str | Path],
    run_infos: Sequence[Mapping[str, Any] | None] | None = None,
    stop_rule: StopRule | None = None,
    device: str | torch.device | None = None,
    chunk_size: int | None = None,
    overwrite: bool = False,
    callbacks: Sequence[Any] | None = None,
    extend_from: Sequence[str | Path | None] | None = None,
) -> BatchedResult:
    """Train K seeds of one architecture together; each gets a ``train``-style run directory.

    Finished members are skipped (cache hit); members with a resume file resume from it
    (members saved at different epochs are trained in groups, one per start epoch); a
    directory holding a different run's files raises ``ForeignRunDirectoryError`` (a
    ``UserError``) unless ``overwrite``. Every run directory is locked while training.

    Args:
        model_cfgs: One config per member; only ``seed`` may differ between them.
        splits: Named splits shared by all members (``cfg.train_split`` is trained on).
        cfg: Optimization and bookkeeping settings, shared by all members.
        run_dirs: One distinct run directory per member.
        run_infos: Optional ``run_info`` per member, stored in ``run.json`` as ``train`` does.
        stop_rule: Optional early stop: called with a member's metrics after every
            evaluation; True finishes that member there (recorded as ``stopped_early_at``).
        device: Torch device of the stacked parameters (``None``: ``cfg.device``, else CPU).
        chunk_size: Examples per vmapped pass (default :func:`default_chunk_size`).
        overwrite: Move whatever each run directory holds aside (to ``RUN_DIR.old-TIMESTAMP``,
            never deleted) and start fresh.
        callbacks: :class:`interp_toolkit.callbacks.Callback` objects told of every
            member's evaluations, checkpoints and end, with that member's run directory
            (called after the state is saved, as :func:`interp_toolkit.train` does).
        extend_from: Optional per member: a finished run of that member at fewer epochs
            (or None), continued from its final state when the member has not started in its
            directory (``train``'s ``extend_from``; every source is checked before any
            directory is written). If ``stop_rule`` fires first at a source's last evaluation
            (a source that stopped early under the same rule), the member is finished there.

    Returns:
        A :class:`BatchedResult` (final metrics per member, in input order).
    """
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
                                   or chunk_size < 1):
        raise UserError(f"train_batched chunk_size must be a positive integer or None, got {chunk_size!r}")
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"train_batched expects a TrainConfig, got {type(cfg).__name__}")
    _check_same_architecture(model_cfgs)
    validate_splits(splits, cfg, model_cfgs[0])
    device = resolve_device(device if device is not None else (cfg.device or "cpu"))
    callbacks = as_callbacks(callbacks)
    dirs = [Path(d) for d in run_dirs]
    if len(dirs) != len(model_cfgs):
        raise UserError(f"train_batched got {len(model_cfgs)} model configs but {len(dirs)} run_dirs")
    if len({d.resolve() for d in dirs}) != len(dirs):
        raise UserError("train_batched run_dirs must be distinct (two runs never share a directory)")
    infos: list[Mapping[str, Any] | None] = list(run_infos) if run_infos is not None else [None] * len(model_cfgs)
    if len(infos) != len(model_cfgs):
        raise UserError(f"train_batched got {len(model_cfgs)} model configs but {len(infos)} run_infos")

    identities = [run_identity(m.to_dict(), cfg, splits, info) for m, info in zip(model_cfgs, infos, strict=True)]
    # Keys stay those of the callers' run_infos; the records get the splits' task as train() records it.
    infos = [with_split_task(info, splits) for info in infos]
    sources = list(extend_from) if extend_from is not None else [None] * len(model_cfgs)
    if len(sources) != len(model_cfgs):
        raise UserError(f"train_batched got {len(model_cfgs)} model configs but {len(sources)} extend_from entries")
    locks: list[DirectoryLock] = []
    try:
        for run_dir in dirs:
            locks.append(DirectoryLock(run_dir, "run directory").acquire())
        if overwrite:
            for run_dir in dirs:
                move_aside(run_dir)
        # Every source to be used is checked before any directory is written.
        plans = {i: check_extension_source(source, identities[i], stop_rule, cfg.evaluation_epochs())
                 for i, source in enumerate(sources)
                 if source is not None and starts_fresh(dirs[i], config_hash(identities[i]), cfg.epochs)}
        for i, plan in plans.items():
            continue_from(plan, dirs[i], config_hash(identities[i]), identities[i], cfg)
        return _train_members(model_cfgs, splits, cfg, dirs, infos, identities, stop_rule, device,
                              chunk_size, callbacks)
    except KeyboardInterrupt as err:
        from interp_toolkit.errors import TrainingInterrupted

        if isinstance(err, TrainingInterrupted):
            raise
        epochs = [e for e in (saved_epoch(d) for d in dirs) if e is not None]
        raise TrainingInterrupted(dirs[0].parent if len(dirs) > 1 else dirs[0],
                                  min(epochs) if epochs else None) from None
    finally:
        for lock in reversed(locks):
            lock.release()


def _train_members(model_cfgs: Sequence[ModelConfig], splits: Mapping[str, Split], cfg: TrainConfig,
                   run_dirs: list[Path], infos: list[Any], identities: list[dict[str, Any]],
                   stop_rule: StopRule | None, device: str | torch.device,
                   chunk_size: int | None, callbacks: Sequence[Any]) -> BatchedResult:
    """:func:`train_batched` once every run directory is locked by this process."""
    states = [run_dir_state(d, config_hash(ident), cfg.epochs) for d, ident in zip(run_dirs, identities, strict=True)]
    for state, identity, model_cfg, info in zip(states, identities, model_cfgs, infos, strict=True):
        if state.recovered:  # copied without run.json: write the whole record back
            write_recovered_record(state.run_dir, state.record or {}, identity=identity,
                                   model_config=model_cfg.to_dict(), train_config=cfg.to_dict(), run_info=info)

    started = time.perf_counter()
    groups: dict[int, list[int]] = {}
    for i, state in enumerate(states):
        if state.status != "finished":
            groups.setdefault(state.start_epoch, []).append(i)
    stopped: dict[int, int | None] = {}
    for start_epoch, members in sorted(groups.items()):
        stopped.update(_train_group(
            [model_cfgs[i] for i in members], splits, cfg, [states[i] for i in members],
            [identities[i] for i in members], [infos[i] for i in members], start_epoch,
            stop_rule, device, members, chunk_size, callbacks,
        ))

    finals, resumed = [], []
    for state in states:
        record = read_record(state.run_dir)
        finals.append(record.get("final", {}))
        resumed.append(state.start_epoch if state.status == "resume" else None)
    return BatchedResult(
        run_dirs=run_dirs,
        finals=finals,
        already_finished=[s.status == "finished" for s in states],
        resumed_from=resumed,
        stopped_early_at=[stopped.get(i) for i in range(len(states))],
        seconds=time.perf_counter() - started,
    )


def _train_group(
    model_cfgs: list[ModelConfig], splits: Mapping[str, Split], cfg: TrainConfig,
    states: list[RunDirState], identities: list[dict[str, Any]], infos: list[Any],
    start_epoch: int, stop_rule: StopRule | None, device: str | torch.device, global_ids: list[int],
    chunk_size: int | None = None, callbacks: Sequence[Any] = (),
) -> dict[int, int | None]:
    """Train members that all start at ``start_epoch``; returns early-stop epochs by global id."""
    stacked = StackedModel(model_cfgs, device=device, engine=cfg.engine)
    optimizer = StackedAdamW(stacked.params, cfg.lr, cfg.betas, cfg.weight_decay)
    param_groups = torch.optim.AdamW(stacked.template.parameters(), lr=cfg.lr, betas=cfg.betas,
                                     weight_decay=cfg.weight_decay).state_dict()["param_groups"]
    shuffle_gen = torch.Generator().manual_seed(cfg.seed)
    records: list[dict[str, Any]] = []

    for i, state in enumerate(states):
        if state.status == "resume":
            saved = state.resume_state
            assert saved is not None  # status "resume" carries the state
            stacked.load_member(i, saved["model"])
            opt_state = saved["optimizer_state"]
            for j, name in enumerate(stacked.param_names):
                if j in opt_state:  # empty before the first step (a state saved at epoch 0)
                    optimizer.exp_avg[name][i].copy_(opt_state[j]["exp_avg"])
                    optimizer.exp_avg_sq[name][i].copy_(opt_state[j]["exp_avg_sq"])
            optimizer.step_count = int(float(opt_state[0]["step"])) if opt_state else 0
            shuffle_gen.set_state(saved["shuffle_rng"])  # identical across members (same cfg.seed)
            truncate_metrics(state.run_dir, start_epoch, cfg.evaluation_epochs())
        else:
            clear_run_outputs(state.run_dir)
        record = new_training_record(
            key=state.key, identity=identities[i], model_config=model_cfgs[i].to_dict(),
            train_config=cfg.to_dict(), split_sizes={name: len(split.labels) for name, split in splits.items()},
            run_info=infos[i], trainer="batched", **carried_fields(state.record))
        if state.status == "resume":
            record["resumed_from"] = start_epoch
        write_record(state.run_dir, record)
        records.append(record)

    train_split = splits[cfg.train_split]
    tokens = train_split.tokens.to(device)
    labels = train_split.labels.to(device)
    ckpt_epochs = set(cfg.checkpoint_epochs())
    eval_epochs = set(cfg.evaluation_epochs())
    # active[j] = position in this group's lists of the j-th stacked member
    active = list(range(len(states)))
    stopped: dict[int, int | None] = {}

    def save_member(j: int, epoch: int, metrics: dict[str, Any], force_checkpoint: bool = False) -> None:
        i = active[j]
        run_dir = states[i].run_dir
        model = stacked.member_model(j)
        if epoch in ckpt_epochs or force_checkpoint:
            save_checkpoint(model, checkpoint_path(run_dir, epoch),
                            metadata={"epoch": epoch, "metrics": metrics, "run_key": states[i].key})
        save_resume_state(run_dir / RESUME_NAME, epoch, states[i].key, model.state_dict(),
                          optimizer.member_state_dict(j, stacked.param_names, param_groups)["state"],
                          shuffle_gen.get_state())
        if force_checkpoint:  # scheduled checkpoints are reported by log_evaluation
            dispatch(callbacks, "on_checkpoint", run_dir, checkpoint_path(run_dir, epoch), epoch)

    def finish_member(j: int, seconds: float, stopped_at: int | None) -> None:
        i = active[j]
        run_dir = states[i].run_dir
        metrics = read_metrics(metrics_path(run_dir))
        plot_curves(metrics, curves_path(run_dir))
        extra = {"stopped_early_at": stopped_at} if stopped_at is not None else {}
        finish_record(run_dir, records[i], metrics[-1] if metrics else {}, seconds, **extra)
        keep_final_state(run_dir)
        stopped[global_ids[i]] = stopped_at
        dispatch(callbacks, "on_run_end", run_dir, records[i]["final"])

    def log_evaluation(epoch: int, logged_before: frozenset[int] = frozenset()) -> list[dict[str, Any]]:
        """Evaluate every active member at ``epoch``, log and save it; members in
        ``logged_before`` (positions in ``active``) already hold this evaluation and state."""
        results = evaluate_batched(stacked, splits, cfg.readout_position, cfg.eval_batch_size)
        logged = []
        for j, metrics in enumerate(results):  # all checked before any line is logged
            check_finite_evaluation({"epoch": epoch, **metrics}, cfg.lr, states[active[j]].run_dir)
        for j, metrics in enumerate(results):
            metrics = {"epoch": epoch, **metrics}
            if j not in logged_before:
                append_jsonl(states[active[j]].run_dir / METRICS, metrics)
                save_member(j, epoch, metrics)
            logged.append(metrics)
        # After every member's state is saved: a callback that raises leaves all resumable.
        for j, metrics in enumerate(logged):
            if j in logged_before:
                continue
            run_dir = states[active[j]].run_dir
            dispatch(callbacks, "on_evaluation", run_dir, metrics)
            if epoch in ckpt_epochs:
                dispatch(callbacks, "on_checkpoint", run_dir, checkpoint_path(run_dir, epoch), epoch)
        return logged

    if start_epoch == 0:
        # A member resuming from a state saved at epoch 0 (killed right after its first
        # evaluation) keeps that evaluation and state; logging them again would write a
        # second epoch-0 line, a history no uninterrupted run has.
        log_evaluation(0, frozenset(i for i, state in enumerate(states) if state.status == "resume"))

    started = time.perf_counter()
    bar = tqdm(range(start_epoch + 1, cfg.epochs + 1), desc=f"train x{len(states)} {states[0].run_dir.name}",
               disable=not cfg.progress, initial=start_epoch, total=cfg.epochs, leave=False)
    # the learning rate is a function of the global step (as in train), so a resumed group
    # follows the schedule exactly; clipping is per member, as train clips its one model
    per_epoch = cfg.steps_per_epoch(len(labels))
    total_steps = cfg.epochs * per_epoch
    for epoch in bar:
        for batch, idx in enumerate(epoch_minibatches(len(labels), cfg.batch_size, shuffle_gen, device)):
            grads, losses = batched_readout_loss(stacked, tokens[idx], labels[idx], cfg.readout_position,
                                                 chunk_size)
            if not bool(torch.isfinite(losses).all()):
                first = next(j for j, value in enumerate(losses.tolist()) if not math.isfinite(value))
                raise diverged(f"training loss became {losses.tolist()} at epoch {epoch}", cfg.lr,
                               states[active[first]].run_dir)
            if cfg.grad_clip is not None:
                clip_member_grads_(grads, cfg.grad_clip)
            lr = cfg.lr_at((epoch - 1) * per_epoch + batch + 1, total_steps) if cfg.schedules_lr else None
            optimizer.step(stacked.params, grads, lr=lr)
        if epoch not in eval_epochs:
            continue
        logged = log_evaluation(epoch)
        bar.set_postfix({k: f"{v:.3f}" for k, v in logged[0].items() if k.endswith("_acc")})
        if stop_rule is None or epoch == cfg.epochs:
            continue
        done = [j for j, metrics in enumerate(logged) if stop_rule(metrics)]
        if not done:
            continue
        for j in done:
            if epoch not in ckpt_epochs:  # the last state is always a checkpoint
                save_member(j, epoch, logged[j], force_checkpoint=True)
            finish_member(j, time.perf_counter() - started, epoch)
        keep = [j for j in range(len(active)) if j not in done]
        if not keep:
            break
        keep_index = torch.tensor(keep, dtype=torch.long, device=tokens.device)
        stacked.select(keep_index, [stacked.model_cfgs[j] for j in keep])
        optimizer.select(keep_index)
        active = [active[j] for j in keep]
    bar.close()
    if active and stacked.size == len(active):
        for j in range(len(active)):
            if global_ids[active[j]] not in stopped:
                finish_member(j, time.perf_counter() - started, None)
    return stopped


__all__ = ["BatchedResult", "StackedModel", "evaluate_batched", "train_batched", "batched_readout_loss"]
