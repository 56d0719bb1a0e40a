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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from interp_toolkit.callbacks import as_callbacks
from interp_toolkit.devices import resolve_device
from interp_toolkit.errors import UserError
from interp_toolkit.io import (
    config_hash,
)
from interp_toolkit.model import ModelConfig, build_model
from interp_toolkit.runs.cost import batched_train_threads
from interp_toolkit.runs.engine import (
    engine_spec,
    member_eval_sums,
    param_key_map,
    stacked_grads,
    stacked_logits,
    warn_fallback_once,
)
from interp_toolkit.runs.extend import (
    check_extension_source,
    continue_from,
    starts_fresh,
)
from interp_toolkit.runs.lock import DirectoryLock
from interp_toolkit.runs.loop import StopRule, TrainingLoop
from interp_toolkit.runs.optim import StackedAdamW, clip_member_grads_
from interp_toolkit.runs.record import (
    read_record,
    write_recovered_record,
)
from interp_toolkit.runs.resume import (
    RunDirState,
    move_aside,
    run_dir_state,
    saved_epoch,
)
from interp_toolkit.runs.trainer import (
    Split,
    TrainConfig,
    clear_killed_writes,
    run_identity,
    validate_splits,
    with_split_task,
)
from interp_toolkit.threads import with_threads


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
            loss_sum, hits = member_eval_sums(logits, labels)
            total_loss += loss_sum
            correct += hits
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
            clear_killed_writes(Path(run_dir))
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
    """Train members that all start at ``start_epoch`` (one :class:`~interp_toolkit.runs.loop.TrainingLoop`);
    returns early-stop epochs by global id."""
    members = StackedMembers(model_cfgs, cfg, device, chunk_size)
    loop = TrainingLoop(members, splits, cfg, states, start_epoch, callbacks=callbacks, stop_rule=stop_rule,
                        description=f"train x{len(states)} {states[0].run_dir.name}")
    loop.prepare(identities, [m.to_dict() for m in model_cfgs], infos, trainer="batched", mark_resumed=True)
    stopped = loop.run(device)
    return {global_ids[i]: epoch for i, epoch in stopped.items()}


class StackedMembers:
    """K stacked members as the training loop's :class:`~interp_toolkit.runs.loop.Members`:
    gradients from :func:`batched_readout_loss`, :class:`~interp_toolkit.runs.optim.StackedAdamW`
    (``torch.optim.AdamW``'s update on the stacked tensors), per-member clipping."""

    def __init__(self, model_cfgs: Sequence[ModelConfig], cfg: TrainConfig, device: str | torch.device,
                 chunk_size: int | None = None) -> None:
        self.cfg, self.chunk_size = cfg, chunk_size
        self.stacked = StackedModel(model_cfgs, device=device, engine=cfg.engine)
        self.optimizer = StackedAdamW(self.stacked.params, cfg.lr, cfg.betas, cfg.weight_decay)
        self.param_groups = torch.optim.AdamW(self.stacked.template.parameters(), lr=cfg.lr, betas=cfg.betas,
                                              weight_decay=cfg.weight_decay).state_dict()["param_groups"]
        self.grads: dict[str, Tensor] = {}

    @property
    def size(self) -> int:
        return self.stacked.size

    def load(self, index: int, saved: Mapping[str, Any]) -> None:
        self.stacked.load_member(index, saved["model"])
        opt_state = saved["optimizer_state"]
        for j, name in enumerate(self.stacked.param_names):
            if j in opt_state:  # empty before the first step (a state saved at epoch 0)
                self.optimizer.exp_avg[name][index].copy_(opt_state[j]["exp_avg"])
                self.optimizer.exp_avg_sq[name][index].copy_(opt_state[j]["exp_avg_sq"])
        self.optimizer.step_count = int(float(opt_state[0]["step"])) if opt_state else 0

    def gradients(self, tokens: Tensor, labels: Tensor) -> Tensor:
        self.grads, losses = batched_readout_loss(self.stacked, tokens, labels, self.cfg.readout_position,
                                                  self.chunk_size)
        return losses

    def update(self, lr: float | None, clip: float | None) -> None:
        if clip is not None:
            clip_member_grads_(self.grads, clip)
        self.optimizer.step(self.stacked.params, self.grads, lr=lr)

    def evaluate(self, splits: Mapping[str, Any]) -> list[dict[str, float]]:
        return evaluate_batched(self.stacked, splits, self.cfg.readout_position, self.cfg.eval_batch_size)

    def member_model(self, index: int) -> Any:
        return self.stacked.member_model(index)

    def optimizer_state(self, index: int) -> dict[Any, Any]:
        return self.optimizer.member_state_dict(index, self.stacked.param_names, self.param_groups)["state"]

    def select(self, keep: Tensor) -> None:
        self.stacked.select(keep, [self.stacked.model_cfgs[j] for j in keep.tolist()])
        self.optimizer.select(keep)

    def finish(self) -> None:
        self.grads = {}


__all__ = [
    "BatchedResult", "StackedMembers", "StackedModel", "evaluate_batched", "train_batched", "batched_readout_loss",
]
