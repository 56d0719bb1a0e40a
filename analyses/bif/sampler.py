"""SGLD on the localized, tempered posterior around a checkpoint."""

from __future__ import annotations

import fnmatch
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
from jaxtyping import Float
from torch import Tensor, nn

from interp_toolkit.callbacks import as_callbacks, dispatch
from interp_toolkit.errors import UserError
from interp_toolkit.progress import progress_bar

from .config import SamplerConfig, SamplerDivergenceError, check_memory
from .data import DataLike, LossFn, Observable, data_length, index_data, per_example_losses
from .sgld import SGLD

# --------------------------------------------------------------------------- sampler


@dataclass
class SamplerDiagnostics:
    """Health of an SGLD run.

    Attributes:
        loss_trace: Minibatch loss before every SGLD step, per chain.
        initial_loss: Full training loss at the checkpoint ``w*``.
        n_beta: The ``n * beta`` actually used.
        burn_in_drift: Per chain, mean loss over the last quarter of burn-in minus the mean
            over its first quarter (0 without burn-in).
        sampling_drift: Per chain, mean loss over the second half of the sampling phase
            minus the mean over its first half, in units of the sampling-phase loss std.
        sampled_parameters: Names of the sampled parameters.
        warnings: Human-readable health warnings (also issued as ``warnings.warn``).
        distance_trace: ``||w - w*||`` over the sampled parameters before every SGLD step, per
            chain (it should level off at the localized posterior's width; still growing: the
            chain has not reached it).
        draw_loss: The loss on the posterior data at every draw's weights, per chain: the
            SGLD loss of the step after the draw (the same weights; the full loss with full
            batches, an unbiased minibatch estimate otherwise). What locality reads.
        draw_distance: ``||w - w*||`` at every draw, per chain.
        draw_accuracy: The posterior data's accuracy at every draw (same batches as
            ``draw_loss``), when the sampler was given an ``accuracy_fn``.
        initial_accuracy: The posterior data's accuracy at ``w*`` (with an ``accuracy_fn``).
        n_parameters: The number of sampled parameters ``d``.
    """

    loss_trace: Float[Tensor, "chains steps"]
    initial_loss: float
    n_beta: float
    burn_in_drift: Float[Tensor, " chains"]
    sampling_drift: Float[Tensor, " chains"]
    sampled_parameters: list[str]
    warnings: list[str] = field(default_factory=list)
    distance_trace: Float[Tensor, "chains steps"] | None = None
    draw_loss: Float[Tensor, "chains draws"] | None = None
    draw_distance: Float[Tensor, "chains draws"] | None = None
    draw_accuracy: Float[Tensor, "chains draws"] | None = None
    initial_accuracy: float | None = None
    n_parameters: int | None = None


def _checkpoint_names(model: nn.Module) -> dict[int, str]:
    """Parameter (by identity) -> its name in the model's ``state_dict`` (a bridge's
    TransformerLens-style ``blocks.0.attn.q.weight``, the names a checkpoint holds), where
    that differs from the module path ``named_parameters`` gives."""
    try:
        state = model.state_dict(keep_vars=True)
    except Exception:  # noqa: BLE001 - a module whose state_dict cannot keep vars: module paths only
        return {}
    return {id(value): name for name, value in state.items() if isinstance(value, nn.Parameter)}


def _select_parameters(model: nn.Module, patterns: tuple[str, ...] | None) -> list[tuple[str, nn.Parameter]]:
    """Parameters whose module path or checkpoint (``state_dict``) name matches a pattern."""
    named = [(n, p) for n, p in model.named_parameters()]
    if patterns is None:
        return named
    aliases = _checkpoint_names(model)
    selected = [(n, p) for n, p in named
                if any(fnmatch.fnmatchcase(n, pat) or fnmatch.fnmatchcase(aliases.get(id(p), n), pat)
                       for pat in patterns)]
    if not selected:
        shown = [aliases.get(id(p), n) for n, p in named]
        raise UserError(
            f"SamplerConfig.param_patterns {list(patterns)!r} match no parameter of the model; its parameters are "
            f"{', '.join(shown[:12])}{f' and {len(shown) - 12} more' if len(shown) > 12 else ''} (fnmatch "
            f"patterns, e.g. 'blocks.0.*')"
        )
    return selected


def _chain_seed(seed: int, chain: int) -> int:
    return (seed * 1_000_003 + chain * 7_919 + 12_345) % (2**62)


def sample_sgld(
    model: nn.Module,
    train_data: DataLike,
    loss_fn: LossFn,
    config: SamplerConfig,
    recorders: Mapping[str, Observable] | None = None,
    on_draw: Callable[[int, int, dict[str, Tensor]], None] | None = None,
    callbacks: Sequence[Any] | None = None,
    accuracy_fn: LossFn | None = None,
) -> SamplerDiagnostics:
    """Run SGLD chains around the model's current weights ``w*``, calling back at each draw.

    The model is modified in place while sampling and restored to ``w*`` (and its
    train/eval mode) afterwards, also on error. The model is put in eval mode while sampling.
    While sampling, each sampled parameter's ``.data`` is a view of one flat buffer (its own
    tensor is put back afterwards): observables must read parameters through the module
    (``model.w``), not through a tensor taken from it beforehand.

    Args:
        model: Any module; its current parameters are the localization centre ``w*``.
        train_data: Examples defining ``L_n`` (tensor, tuple/list or dict of tensors).
        loss_fn: ``loss_fn(model, batch) -> Float[Tensor, "batch ..."]`` per-example losses.
        config: Sampler settings.
        recorders: Observables evaluated (under ``torch.no_grad``) at every draw.
        on_draw: ``on_draw(chain, draw, values)`` with ``values[name]`` the flattened
            float tensor of each recorder.
        callbacks: :class:`interp_toolkit.callbacks.Callback` objects told of every draw
            (``on_draw(chain, draw, {"step", "loss"})``) and chain end
            (``on_chain_end(chain, diagnostics)``), e.g. a TensorBoard logger.
        accuracy_fn: ``accuracy_fn(model, batch) -> Tensor[batch]`` per-example correctness
            (1 correct, 0 not), for classifiers: evaluated at ``w*`` over the posterior data
            and at every draw on the batch its ``draw_loss`` is measured on (one forward each).

    Returns:
        Diagnostics (loss traces, drift checks).

    Raises:
        SamplerDivergenceError: A loss or recorded value became NaN/inf or exploded.
    """
    recorders = dict(recorders or {})
    callbacks = as_callbacks(callbacks)
    n_train = data_length(train_data)
    if n_train < 1:
        raise UserError("train_data has no examples")
    if config.batch_size is not None and config.batch_size > n_train:
        raise UserError(f"SamplerConfig.batch_size {config.batch_size} exceeds the {n_train} training examples")
    check_memory(config)  # a chain length that cannot be held is refused before any forward pass
    n_beta = config.resolved_n_beta(n_train)
    params = _select_parameters(model, config.param_patterns)
    param_ids = {id(p) for _, p in params}
    all_params: list[Tensor] = list(model.parameters())
    saved_requires_grad = [p.requires_grad for p in all_params]
    centre = [p.detach().clone() for _, p in params]
    tensors: list[Tensor] = [p for _, p in params]
    sizes = [p.numel() for p in tensors]
    noise_dtype = tensors[0].dtype
    if any(p.dtype != noise_dtype for p in tensors):
        raise UserError(f"sampled parameters must share one dtype, got {sorted({str(p.dtype) for p in tensors})}")
    was_training = model.training
    device = centre[0].device
    # While sampling, the sampled parameters (and their gradients) are views of one flat
    # buffer each, so an SGLD step is a handful of whole-buffer operations instead of
    # per-tensor ones (the same arithmetic, element by element). Their own storage is put
    # back afterwards. Parameters that are not contiguous or share storage keep the
    # per-tensor (foreach) update.
    flat = device.type != "meta" and all(p.is_contiguous() for p in tensors) and (
        len({p.untyped_storage().data_ptr() for p in tensors}) == len(tensors)
    )
    own_storage = [p.data for p in tensors] if flat else []
    flat_centre = torch.cat([c.reshape(-1) for c in centre]) if flat else None

    full_loss = per_example_losses(loss_fn, train_data, config.eval_batch_size)
    with torch.no_grad():
        initial_loss = float(full_loss(model).float().mean())
        initial_accuracy = (None if accuracy_fn is None else
                            float(per_example_losses(accuracy_fn, train_data, config.eval_batch_size)(model)
                                  .float().mean()))
    if not math.isfinite(initial_loss):
        raise SamplerDivergenceError(f"the training loss at the checkpoint is already {initial_loss}")
    limit = config.divergence_factor * (abs(initial_loss) + 1.0)
    steps = config.total_steps
    trace = torch.empty(config.chains, steps, dtype=torch.float64)
    distance = torch.empty(config.chains, steps, dtype=torch.float64)
    # locality (.locality) reads the posterior loss, distance and accuracy at the draws
    draw_loss = torch.full((config.chains, config.draws), float("nan"), dtype=torch.float64)
    draw_distance = torch.full((config.chains, config.draws), float("nan"), dtype=torch.float64)
    draw_accuracy = (None if accuracy_fn is None
                     else torch.full((config.chains, config.draws), float("nan"), dtype=torch.float64))
    # quiet lines, not a redrawn bar, where stderr is a log (interp_toolkit.progress)
    bar = progress_bar(total=config.chains * steps, desc="SGLD", disable=not config.progress, leave=False)
    try:
        model.eval()
        for p in all_params:
            p.requires_grad_(id(p) in param_ids)
        if flat:
            assert flat_centre is not None  # built above whenever flat
            flat_weights = flat_centre.clone()
            flat_grads = torch.zeros_like(flat_weights)
            for p, w, g in zip(tensors, flat_weights.split(sizes), flat_grads.split(sizes), strict=True):
                p.data = w.view_as(p)
                p.grad = g.view_as(p)  # backward accumulates into it; zeroed before each step
        for chain in range(config.chains):
            with torch.no_grad():
                if flat:
                    assert flat_centre is not None
                    flat_weights.copy_(flat_centre)
                else:
                    for (_, p), p0 in zip(params, centre, strict=True):
                        p.copy_(p0)
            cpu_gen = torch.Generator().manual_seed(_chain_seed(config.seed, chain))
            noise_gen = (
                cpu_gen
                if device.type == "cpu"
                else torch.Generator(device=device).manual_seed(_chain_seed(config.seed, chain) + 1)
            )
            # the update itself (sgld.SGLD): on the one flat buffer, or tensor by tensor
            sgld = (SGLD([flat_weights], [flat_centre], grads=[flat_grads], eps=config.eps, gamma=config.gamma,
                         n_beta=n_beta, generator=noise_gen)
                    if flat and flat_centre is not None else
                    SGLD(tensors, centre, eps=config.eps, gamma=config.gamma, n_beta=n_beta, generator=noise_gen))
            order = torch.randperm(n_train, generator=cpu_gen)
            cursor = 0
            draw = 0
            pending: int | None = None  # a draw whose loss the next step's forward measures

            def next_batch(gen: torch.Generator = cpu_gen) -> DataLike:
                nonlocal order, cursor
                if config.batch_size is None:
                    return train_data
                if cursor + config.batch_size > n_train:
                    order = torch.randperm(n_train, generator=gen)
                    cursor = 0
                index = order[cursor : cursor + config.batch_size]
                cursor += config.batch_size
                return index_data(train_data, index.to(_data_device(train_data)))

            for step in range(steps):
                batch = next_batch()
                if flat:
                    flat_grads.zero_()
                else:
                    for p in tensors:  # only these require grad while sampling
                        p.grad = None
                loss = loss_fn(model, batch).mean()
                loss_value = float(loss.detach())
                trace[chain, step] = loss_value
                if pending is not None:  # the weights have not moved since that draw
                    _record_draw(draw_loss, draw_accuracy, chain, pending, loss_value, accuracy_fn, model, batch)
                    pending = None
                if not math.isfinite(loss_value) or loss_value > limit:
                    raise SamplerDivergenceError(
                        f"SGLD diverged: chain {chain}, step {step}: minibatch loss {loss_value:.4g} "
                        f"(checkpoint loss {initial_loss:.4g}, limit {limit:.4g}). Lower eps "
                        f"(now {config.eps:g}) or raise gamma (now {config.gamma:g})."
                    )
                loss.backward()
                distance[chain, step] = sgld.step()
                bar.update(1)
                if step >= config.burn_in and (step - config.burn_in + 1) % config.steps_between_draws == 0:
                    if recorders:
                        with torch.inference_mode():  # cheaper than no_grad; values are only read
                            values = {k: fn(model).detach().reshape(-1) for k, fn in recorders.items()}
                        for key, value in values.items():
                            if not torch.isfinite(value).all():
                                raise SamplerDivergenceError(
                                    f"SGLD diverged: chain {chain}, draw {draw}: recorded {key!r} has "
                                    f"non-finite values. Lower eps (now {config.eps:g})."
                                )
                        if on_draw is not None:
                            on_draw(chain, draw, values)
                    elif on_draw is not None:
                        on_draw(chain, draw, {})
                    dispatch(callbacks, "on_draw", chain, draw, {"step": step, "loss": loss_value})
                    draw_distance[chain, draw] = _distance(flat_weights, flat_centre) if flat else _distance(
                        torch.cat([p.detach().reshape(-1) for _, p in params]),
                        torch.cat([c.reshape(-1) for c in centre]))
                    pending = draw
                    draw += 1
            if pending is not None:  # the chain's last draw: one more forward, no step
                batch = next_batch()
                with torch.inference_mode():
                    last_loss = float(loss_fn(model, batch).mean())
                _record_draw(draw_loss, draw_accuracy, chain, pending, last_loss, accuracy_fn, model, batch)
            with torch.no_grad():
                if not all(torch.isfinite(p).all() for _, p in params):
                    raise SamplerDivergenceError(f"SGLD diverged: chain {chain} ended with non-finite weights")
            if callbacks:
                chain_drift, chain_sampling_drift, _ = _drift_checks(trace[chain : chain + 1], config,
                                                                     warn=False)
                dispatch(callbacks, "on_chain_end", chain, {
                    "initial_loss": initial_loss, "n_beta": n_beta,
                    "mean_loss": float(trace[chain].mean()), "final_loss": float(trace[chain, -1]),
                    "burn_in_drift": float(chain_drift[0]),
                    "sampling_drift": float(chain_sampling_drift[0]),
                })
    finally:
        bar.close()
        for p, storage in zip(tensors if flat else [], own_storage, strict=True):
            p.data = storage  # the parameter's own tensor again (restored to w* below)
        with torch.no_grad():
            for (_, p), p0 in zip(params, centre, strict=True):
                p.copy_(p0)
        for p, flag in zip(all_params, saved_requires_grad, strict=True):
            p.requires_grad_(flag)
            p.grad = None
        model.train(was_training)

    burn_drift, sampling_drift, notes = _drift_checks(trace, config)
    return SamplerDiagnostics(
        loss_trace=trace,
        initial_loss=initial_loss,
        n_beta=n_beta,
        burn_in_drift=burn_drift,
        sampling_drift=sampling_drift,
        sampled_parameters=[n for n, _ in params],
        warnings=notes,
        distance_trace=distance,
        draw_loss=draw_loss,
        draw_distance=draw_distance,
        draw_accuracy=draw_accuracy,
        initial_accuracy=initial_accuracy,
        n_parameters=sum(sizes),
    )


def _distance(weights: Tensor, centre: Tensor | None) -> float:
    assert centre is not None
    return float((weights.detach() - centre).double().norm())


def _record_draw(draw_loss: Tensor, draw_accuracy: Tensor | None, chain: int, draw: int, loss: float,
                 accuracy_fn: LossFn | None, model: nn.Module, batch: DataLike) -> None:
    draw_loss[chain, draw] = loss
    if accuracy_fn is not None and draw_accuracy is not None:
        with torch.inference_mode():
            draw_accuracy[chain, draw] = float(accuracy_fn(model, batch).float().mean())


def _data_device(data: DataLike) -> torch.device:
    if isinstance(data, Tensor):
        return data.device
    first = next(iter(data.values())) if isinstance(data, Mapping) else data[0]
    return first.device


def _drift_checks(trace: Tensor, config: SamplerConfig,
                  warn: bool = True) -> tuple[Tensor, Tensor, list[str]]:
    chains = trace.shape[0]
    burn = trace[:, : config.burn_in]
    sampling = trace[:, config.burn_in :]
    burn_drift = torch.zeros(chains, dtype=torch.float64)
    if config.burn_in >= 4:
        q = config.burn_in // 4
        burn_drift = burn[:, -q:].mean(1) - burn[:, :q].mean(1)
    sampling_drift = torch.zeros(chains, dtype=torch.float64)
    notes: list[str] = []
    if sampling.shape[1] >= 4:
        half = sampling.shape[1] // 2
        std = sampling.std(1).clamp_min(1e-12)
        sampling_drift = (sampling[:, half:].mean(1) - sampling[:, :half].mean(1)) / std
        for chain, value in enumerate(sampling_drift.tolist()):
            if abs(value) > 2.0:
                notes.append(
                    f"chain {chain}: mean loss still drifting while drawing ({value:+.2f} std between "
                    "halves); lengthen burn_in, raise gamma or lower eps"
                )
    for note in notes if warn else ():
        warnings.warn(note, stacklevel=3)
    return burn_drift, sampling_drift, notes


