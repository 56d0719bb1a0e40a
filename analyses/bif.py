"""Bayesian influence functions (BIF) from SGLD draws of a localized posterior.

The Bayesian influence of a training example ``z_i`` on an observable ``phi`` is

    BIF(z_i, phi) = -Cov_{p(w | D)}(loss_i(w), phi(w)),

the first-order change of the posterior expectation of ``phi`` when ``z_i`` is up-weighted
(``d/d eps E[phi]`` under ``p(w) * exp(-eps * loss_i(w))``). For a loss observable a
*negative* BIF therefore means "training on z_i lowers the query loss" (helpful).
It needs no Hessian inverse and is defined at every checkpoint of a run.

The posterior is localized at a checkpoint ``w*`` and tempered:

    p(w) ∝ exp(-n·beta · L_n(w) - gamma/2 · ||w - w*||^2),

and sampled by SGLD (:func:`sample_sgld`)::

    w <- w - (eps/2) (n·beta · grad L_batch(w) + gamma (w - w*)) + N(0, eps).

Two levels of API:

* :func:`bif` (high level): sample, record per-example losses of an attribution set and any
  observables at every draw, accumulate means and co-moments on the fly (memory
  ``O(chains x n_train x n_query)``, independent of the number of draws), return a
  :class:`BIFResult`; optionally cached by config hash under ``cache_dir``.
* :func:`compute_bif` (low level): the same estimator on stored draws (:class:`Draws`).

Every covariance here is the population covariance over draws (divide by the number of
draws, not minus one), so that the phase decomposition (within-phase + between-phase)
adds up *exactly* to the total. The standard error of each entry is the standard deviation
across chains of the per-chain estimates divided by ``sqrt(chains)`` (NaN with one chain).

Generic by design (token-level BIF for language models builds on it): the model is any
``torch.nn.Module``; the data is a tensor, a tuple/list of tensors or a dict of tensors
indexed along dim 0; ``loss_fn(model, batch)`` returns per-example losses (any trailing
dims, e.g. per token, are flattened when recorded and averaged for the SGLD gradient);
observables are callables ``model -> tensor`` (flattened).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, Union

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from tqdm.auto import tqdm

from interp_toolkit.config import reject_unknown_keys
from interp_toolkit.io import atomic_write_bytes, atomic_write_json, config_hash

DataLike = Union[Tensor, Sequence[Tensor], Mapping[str, Tensor]]
LossFn = Callable[[nn.Module, Any], Tensor]
Observable = Callable[[nn.Module], Tensor]

__all__ = [
    "BIFResult",
    "CoMoments",
    "Draws",
    "PhaseDecomposition",
    "SamplerConfig",
    "SamplerDiagnostics",
    "SamplerDivergenceError",
    "bif",
    "cluster_phases",
    "compute_bif",
    "data_length",
    "index_data",
    "per_example_losses",
    "plot_bif",
    "sample_sgld",
]


class SamplerDivergenceError(ValueError):
    """SGLD produced a non-finite or exploding loss: the step size is too large."""


# --------------------------------------------------------------------------- config


@dataclass
class SamplerConfig:
    """Validated SGLD settings for sampling a localized tempered posterior.

    Attributes:
        eps: Step size (> 0). The injected noise has variance ``eps``.
        gamma: Localization strength (>= 0) pulling draws back to the checkpoint ``w*``.
        n_beta: ``n * beta``, the inverse temperature times the number of examples (> 0).
            ``None``: ``n / log(n)`` with ``n`` the number of training examples (beta =
            1/log n, the WBIC temperature).
        chains: Independent chains, all started at ``w*`` (>= 1; >= 2 for standard errors).
        draws: Recorded draws per chain (>= 1).
        burn_in: SGLD steps per chain before the first draw (>= 0).
        steps_between_draws: SGLD steps between consecutive draws (>= 1).
        batch_size: Minibatch size of the SGLD gradient; ``None`` for full batch.
        seed: Seed of the noise and minibatch order (same seed, same draws).
        param_patterns: Restrict sampling to parameters whose ``named_parameters`` name
            matches one of these ``fnmatch`` patterns (others stay at ``w*``); ``None``: all.
        eval_batch_size: Batch size used to record per-example losses (>= 1).
        divergence_factor: Raise :class:`SamplerDivergenceError` if the minibatch loss
            exceeds ``divergence_factor * (|initial loss| + 1)`` (> 1).
        keep_draws: Also keep every recorded draw (memory grows with draws).
        pearson: Normalize to ``-Corr`` instead of ``-Cov``.
        progress: Show a tqdm bar.
    """

    eps: float = 1e-4
    gamma: float = 100.0
    n_beta: float | None = None
    chains: int = 4
    draws: int = 100
    burn_in: int = 100
    steps_between_draws: int = 1
    batch_size: int | None = None
    seed: int = 0
    param_patterns: tuple[str, ...] | None = None
    eval_batch_size: int = 1024
    divergence_factor: float = 1e4
    keep_draws: bool = False
    pearson: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        def positive_number(name: str, allow_zero: bool = False) -> None:
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            ok = ok and (value >= 0 if allow_zero else value > 0)
            if not ok:
                bound = ">= 0" if allow_zero else "> 0"
                raise ValueError(f"SamplerConfig.{name} must be a finite number {bound}, got {value!r}")

        def integer(name: str, minimum: int, optional: bool = False) -> None:
            value = getattr(self, name)
            if optional and value is None:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                extra = " or None" if optional else ""
                raise ValueError(f"SamplerConfig.{name} must be an integer >= {minimum}{extra}, got {value!r}")

        positive_number("eps")
        positive_number("gamma", allow_zero=True)
        if self.n_beta is not None:
            positive_number("n_beta")
        integer("chains", 1)
        integer("draws", 1)
        integer("burn_in", 0)
        integer("steps_between_draws", 1)
        integer("batch_size", 1, optional=True)
        integer("seed", 0)
        integer("eval_batch_size", 1)
        positive_number("divergence_factor")
        if self.divergence_factor <= 1:
            raise ValueError(f"SamplerConfig.divergence_factor must be > 1, got {self.divergence_factor!r}")
        if self.param_patterns is not None:
            if isinstance(self.param_patterns, str):
                self.param_patterns = (self.param_patterns,)
            self.param_patterns = tuple(self.param_patterns)
            if not self.param_patterns or not all(isinstance(p, str) and p for p in self.param_patterns):
                raise ValueError(
                    f"SamplerConfig.param_patterns must be None or non-empty strings, got {self.param_patterns!r}"
                )
        for name in ("keep_draws", "pearson", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"SamplerConfig.{name} must be a bool, got {getattr(self, name)!r}")

    @property
    def total_steps(self) -> int:
        """SGLD steps per chain."""
        return self.burn_in + self.draws * self.steps_between_draws

    def resolved_n_beta(self, n_train: int) -> float:
        """``n_beta``, or its default ``n / log(n)`` for ``n`` training examples."""
        if self.n_beta is not None:
            return float(self.n_beta)
        return float(n_train) / math.log(n_train) if n_train > 2 else 1.0

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["param_patterns"] = list(self.param_patterns) if self.param_patterns else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SamplerConfig":
        reject_unknown_keys(cls, data)
        data = dict(data)
        if data.get("param_patterns") is not None:
            data["param_patterns"] = tuple(data["param_patterns"])
        return cls(**data)


# --------------------------------------------------------------------------- data helpers


def data_length(data: DataLike) -> int:
    """Number of examples (size of dim 0) of a tensor, tuple/list or dict of tensors."""
    if isinstance(data, Tensor):
        return int(data.shape[0])
    if isinstance(data, Mapping):
        lengths = {int(v.shape[0]) for v in data.values()}
    elif isinstance(data, (tuple, list)):
        lengths = {int(v.shape[0]) for v in data}
    else:
        raise TypeError(f"data must be a tensor, a tuple/list or a dict of tensors, got {type(data).__name__}")
    if len(lengths) != 1:
        raise ValueError(f"all tensors of a dataset must have the same length along dim 0, got {sorted(lengths)}")
    return lengths.pop()


def index_data(data: DataLike, index: Int[Tensor, " k"] | slice) -> DataLike:
    """Select examples ``index`` (along dim 0) of every tensor of ``data``."""
    if isinstance(data, Tensor):
        return data[index]
    if isinstance(data, Mapping):
        return {k: v[index] for k, v in data.items()}
    return type(data)(v[index] for v in data)


def _data_fingerprint(data: DataLike | None) -> str | None:
    if data is None:
        return None
    digest = hashlib.sha256()
    items = (
        [data]
        if isinstance(data, Tensor)
        else [data[k] for k in sorted(data)]
        if isinstance(data, Mapping)
        else list(data)
    )
    for tensor in items:
        t = tensor.detach().to("cpu").contiguous()
        digest.update(f"{tuple(t.shape)}{t.dtype}".encode())
        digest.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
    return digest.hexdigest()[:16]


def _model_fingerprint(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        digest.update(name.encode())
        digest.update(f"{tuple(t.shape)}{t.dtype}".encode())
        digest.update(t.float().numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes())
    return digest.hexdigest()[:16]


def per_example_losses(loss_fn: LossFn, data: DataLike, batch_size: int = 1024) -> Observable:
    """An observable: the per-example losses of ``data`` (flattened), evaluated in batches.

    Args:
        loss_fn: ``loss_fn(model, batch) -> Float[Tensor, "batch ..."]`` per-example losses.
        data: Examples to evaluate.
        batch_size: Examples per forward pass.

    Returns:
        A callable ``model -> Float[Tensor, " n_values"]`` (``n_values`` = examples x
        trailing loss dims).
    """
    n = data_length(data)

    def observable(model: nn.Module) -> Tensor:
        parts = []
        for start in range(0, n, batch_size):
            batch = index_data(data, slice(start, min(n, start + batch_size)))
            parts.append(loss_fn(model, batch).reshape(-1))
        return torch.cat(parts)

    observable.__qualname__ = f"per_example_losses({getattr(loss_fn, '__qualname__', repr(loss_fn))})"
    return observable


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
    """

    loss_trace: Float[Tensor, "chains steps"]
    initial_loss: float
    n_beta: float
    burn_in_drift: Float[Tensor, " chains"]
    sampling_drift: Float[Tensor, " chains"]
    sampled_parameters: list[str]
    warnings: list[str] = field(default_factory=list)


def _select_parameters(model: nn.Module, patterns: tuple[str, ...] | None) -> list[tuple[str, nn.Parameter]]:
    named = [(n, p) for n, p in model.named_parameters()]
    if patterns is None:
        selected = named
    else:
        selected = [(n, p) for n, p in named if any(fnmatch.fnmatchcase(n, pat) for pat in patterns)]
    if not selected:
        raise ValueError(
            f"SamplerConfig.param_patterns {patterns!r} match no parameter; names look like "
            f"{[n for n, _ in named[:6]]}"
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
) -> SamplerDiagnostics:
    """Run SGLD chains around the model's current weights ``w*``, calling back at each draw.

    The model is modified in place while sampling and restored to ``w*`` (and its
    train/eval mode) afterwards, also on error. The model is put in eval mode while sampling.

    Args:
        model: Any module; its current parameters are the localization centre ``w*``.
        train_data: Examples defining ``L_n`` (tensor, tuple/list or dict of tensors).
        loss_fn: ``loss_fn(model, batch) -> Float[Tensor, "batch ..."]`` per-example losses.
        config: Sampler settings.
        recorders: Observables evaluated (under ``torch.no_grad``) at every draw.
        on_draw: ``on_draw(chain, draw, values)`` with ``values[name]`` the flattened
            float tensor of each recorder.

    Returns:
        Diagnostics (loss traces, drift checks).

    Raises:
        SamplerDivergenceError: A loss or recorded value became NaN/inf or exploded.
    """
    recorders = dict(recorders or {})
    n_train = data_length(train_data)
    if n_train < 1:
        raise ValueError("train_data has no examples")
    if config.batch_size is not None and config.batch_size > n_train:
        raise ValueError(f"SamplerConfig.batch_size {config.batch_size} exceeds the {n_train} training examples")
    n_beta = config.resolved_n_beta(n_train)
    params = _select_parameters(model, config.param_patterns)
    param_ids = {id(p) for _, p in params}
    all_params = list(model.parameters())
    saved_requires_grad = [p.requires_grad for p in all_params]
    centre = [p.detach().clone() for _, p in params]
    was_training = model.training
    device = centre[0].device

    full_loss = per_example_losses(loss_fn, train_data, config.eval_batch_size)
    with torch.no_grad():
        initial_loss = float(full_loss(model).float().mean())
    if not math.isfinite(initial_loss):
        raise SamplerDivergenceError(f"the training loss at the checkpoint is already {initial_loss}")
    limit = config.divergence_factor * (abs(initial_loss) + 1.0)
    sqrt_eps = math.sqrt(config.eps)
    steps = config.total_steps
    trace = torch.empty(config.chains, steps, dtype=torch.float64)
    bar = tqdm(total=config.chains * steps, desc="SGLD", disable=not config.progress, leave=False)
    try:
        model.eval()
        for p in all_params:
            p.requires_grad_(id(p) in param_ids)
        for chain in range(config.chains):
            with torch.no_grad():
                for (_, p), p0 in zip(params, centre, strict=True):
                    p.copy_(p0)
            cpu_gen = torch.Generator().manual_seed(_chain_seed(config.seed, chain))
            noise_gen = (
                cpu_gen if device.type == "cpu" else torch.Generator(device=device).manual_seed(_chain_seed(config.seed, chain) + 1)
            )
            order = torch.randperm(n_train, generator=cpu_gen)
            cursor = 0
            draw = 0
            for step in range(steps):
                if config.batch_size is None:
                    batch = train_data
                else:
                    if cursor + config.batch_size > n_train:
                        order = torch.randperm(n_train, generator=cpu_gen)
                        cursor = 0
                    index = order[cursor : cursor + config.batch_size]
                    cursor += config.batch_size
                    batch = index_data(train_data, index.to(_data_device(train_data)))
                model.zero_grad(set_to_none=True)
                loss = loss_fn(model, batch).mean()
                loss_value = float(loss.detach())
                trace[chain, step] = loss_value
                if not math.isfinite(loss_value) or loss_value > limit:
                    raise SamplerDivergenceError(
                        f"SGLD diverged: chain {chain}, step {step}: minibatch loss {loss_value:.4g} "
                        f"(checkpoint loss {initial_loss:.4g}, limit {limit:.4g}). Lower eps "
                        f"(now {config.eps:g}) or raise gamma (now {config.gamma:g})."
                    )
                loss.backward()
                with torch.no_grad():
                    for (_, p), p0 in zip(params, centre, strict=True):
                        grad = p.grad if p.grad is not None else torch.zeros_like(p)
                        drift = grad.mul(n_beta).add_(p - p0, alpha=config.gamma)
                        noise = torch.randn(p.shape, generator=noise_gen, device=device, dtype=p.dtype)
                        p.add_(drift, alpha=-config.eps / 2).add_(noise, alpha=sqrt_eps)
                bar.update(1)
                if step >= config.burn_in and (step - config.burn_in + 1) % config.steps_between_draws == 0:
                    if recorders:
                        with torch.no_grad():
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
                    draw += 1
            with torch.no_grad():
                if not all(torch.isfinite(p).all() for _, p in params):
                    raise SamplerDivergenceError(f"SGLD diverged: chain {chain} ended with non-finite weights")
    finally:
        bar.close()
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
    )


def _data_device(data: DataLike) -> torch.device:
    if isinstance(data, Tensor):
        return data.device
    first = next(iter(data.values())) if isinstance(data, Mapping) else data[0]
    return first.device


def _drift_checks(trace: Tensor, config: SamplerConfig) -> tuple[Tensor, Tensor, list[str]]:
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
    for note in notes:
        warnings.warn(note, stacklevel=3)
    return burn_drift, sampling_drift, notes


# --------------------------------------------------------------------------- accumulation


class CoMoments:
    """Streaming means and cross co-moments of two vectors (Welford / Chan et al. merging).

    Keeps ``count``, ``mean_a``, ``mean_b``, the sums of squared deviations ``m2_a``,
    ``m2_b`` and the co-moment matrix ``comoment = sum (a - mean_a)(b - mean_b)^T`` in
    float64. Memory is ``O(n_a x n_b)`` whatever the number of updates.
    """

    def __init__(self, n_a: int, n_b: int, device: str | torch.device = "cpu") -> None:
        self.count = 0
        self.mean_a = torch.zeros(n_a, dtype=torch.float64, device=device)
        self.mean_b = torch.zeros(n_b, dtype=torch.float64, device=device)
        self.m2_a = torch.zeros(n_a, dtype=torch.float64, device=device)
        self.m2_b = torch.zeros(n_b, dtype=torch.float64, device=device)
        self.comoment = torch.zeros(n_a, n_b, dtype=torch.float64, device=device)

    def update(self, a: Float[Tensor, " n_a"], b: Float[Tensor, " n_b"]) -> None:
        """Add one draw (Welford's update)."""
        a = a.to(self.mean_a.device, torch.float64)
        b = b.to(self.mean_b.device, torch.float64)
        self.count += 1
        delta_a = a - self.mean_a
        self.mean_a += delta_a / self.count
        delta_b_old = b - self.mean_b
        self.mean_b += delta_b_old / self.count
        delta_b_new = b - self.mean_b
        self.m2_a += delta_a * (a - self.mean_a)
        self.m2_b += delta_b_old * delta_b_new
        self.comoment.addr_(delta_a, delta_b_new)  # in place: no n_a x n_b temporary

    def update_batch(self, a: Float[Tensor, "k n_a"], b: Float[Tensor, "k n_b"]) -> None:
        """Add ``k`` draws at once (batch moments merged in)."""
        if a.shape[0] == 0:
            return
        self.merge_(CoMoments.from_batch(a, b, device=self.mean_a.device))

    @classmethod
    def from_batch(cls, a: Float[Tensor, "k n_a"], b: Float[Tensor, "k n_b"], device: str | torch.device = "cpu") -> "CoMoments":
        """Moments of a batch of draws, computed directly."""
        a = a.to(device, torch.float64)
        b = b.to(device, torch.float64)
        out = cls(a.shape[1], b.shape[1], device=device)
        out.count = a.shape[0]
        out.mean_a = a.mean(0)
        out.mean_b = b.mean(0)
        ca = a - out.mean_a
        cb = b - out.mean_b
        out.m2_a = (ca * ca).sum(0)
        out.m2_b = (cb * cb).sum(0)
        out.comoment = ca.T @ cb
        return out

    def merge_(self, other: "CoMoments") -> "CoMoments":
        """Merge ``other`` into ``self`` (Chan et al. parallel update); returns ``self``."""
        if other.count == 0:
            return self
        if self.count == 0:
            self.count = other.count
            for name in ("mean_a", "mean_b", "m2_a", "m2_b", "comoment"):
                setattr(self, name, getattr(other, name).clone())
            return self
        n1, n2 = self.count, other.count
        n = n1 + n2
        delta_a = other.mean_a - self.mean_a
        delta_b = other.mean_b - self.mean_b
        factor = n1 * n2 / n
        self.comoment.add_(other.comoment).addr_(delta_a, delta_b, alpha=factor)
        self.m2_a += other.m2_a + delta_a * delta_a * factor
        self.m2_b += other.m2_b + delta_b * delta_b * factor
        self.mean_a += delta_a * (n2 / n)
        self.mean_b += delta_b * (n2 / n)
        self.count = n
        return self

    @staticmethod
    def merged(parts: Sequence["CoMoments"]) -> "CoMoments":
        """An accumulator holding all of ``parts`` (the part itself if there is only one:
        do not modify the result in place then)."""
        if len(parts) == 1:
            return parts[0]
        out = CoMoments(parts[0].mean_a.shape[0], parts[0].mean_b.shape[0], device=parts[0].mean_a.device)
        for part in parts:
            out.merge_(part)
        return out

    def covariance(self) -> Float[Tensor, "n_a n_b"]:
        """Population cross-covariance ``comoment / count``."""
        if self.count == 0:
            raise ValueError("no draws accumulated")
        return self.comoment / self.count

    def correlation(self) -> Float[Tensor, "n_a n_b"]:
        """Pearson cross-correlation (0 where a variance is 0)."""
        denom = torch.sqrt(torch.outer(self.m2_a, self.m2_b))
        return torch.where(denom > 0, self.comoment / denom.clamp_min(1e-300), torch.zeros_like(denom))


# --------------------------------------------------------------------------- results


@dataclass
class Draws:
    """Stored draws: what :func:`compute_bif` needs.

    Attributes:
        attribution: Recorded attribution values (per-example training losses) per draw.
        observables: Recorded observable values per draw (concatenated).
        observable_slices: ``name -> (start, stop)`` columns of each observable.
        statistic: Optional scalar per draw (e.g. for :func:`cluster_phases`); by default
            the mean attribution loss at the draw.
        phase_labels: Phase label per draw if a ``phase_fn`` was used while sampling
            (``compute_bif(draws, phases=draws.phase_labels)`` reproduces the split).
    """

    attribution: Float[Tensor, "chains draws n_train"]
    observables: Float[Tensor, "chains draws n_query"]
    observable_slices: dict[str, tuple[int, int]] = field(default_factory=dict)
    statistic: Float[Tensor, "chains draws"] | None = None
    phase_labels: Int[Tensor, "chains draws"] | None = None

    def __post_init__(self) -> None:
        if self.attribution.ndim != 3 or self.observables.ndim != 3:
            raise ValueError(
                "Draws.attribution and Draws.observables must be [chains, draws, values], got shapes "
                f"{tuple(self.attribution.shape)} and {tuple(self.observables.shape)}"
            )
        if self.attribution.shape[:2] != self.observables.shape[:2]:
            raise ValueError(
                f"Draws: attribution has {tuple(self.attribution.shape[:2])} (chains, draws) but "
                f"observables has {tuple(self.observables.shape[:2])}"
            )
        if not self.observable_slices:
            self.observable_slices = {"observable": (0, int(self.observables.shape[2]))}
        if self.statistic is None:
            self.statistic = self.attribution.double().mean(-1)


@dataclass
class PhaseDecomposition:
    """Split of ``-Cov`` into within-phase and between-phase parts (exact: they add up).

    With phase weights ``pi_k`` (fraction of draws), phase means ``mu_k`` / ``nu_k`` and
    phase covariances ``Cov_k``:

    * ``within = -sum_k pi_k Cov_k``
    * ``between = -sum_k pi_k (mu_k - mu)(nu_k - nu)^T``
    * ``within + between == total == -Cov`` (population covariances over all draws).

    Attributes:
        labels: Phase labels, in the order of the other tensors' first axis.
        weights: ``pi_k``.
        within, between, total: ``n_train x n_query`` matrices (always covariance units).
        per_phase: ``-Cov_k`` for each phase.
        within_stderr, between_stderr: Standard errors across chains (NaN for one chain).
    """

    labels: list[int]
    weights: Float[Tensor, " k"]
    within: Float[Tensor, "n_train n_query"]
    between: Float[Tensor, "n_train n_query"]
    total: Float[Tensor, "n_train n_query"]
    per_phase: Float[Tensor, "k n_train n_query"]
    within_stderr: Float[Tensor, "n_train n_query"]
    between_stderr: Float[Tensor, "n_train n_query"]


@dataclass
class BIFResult:
    """Bayesian influence matrix with its uncertainty.

    Attributes:
        bif: ``-Cov(loss_i, phi_j)`` (or ``-Corr`` if ``pearson``), ``n_train x n_query``.
        stderr: Standard error per entry (std across chains / sqrt(chains); NaN for 1 chain).
        per_chain: The estimate from each chain alone.
        pearson: Whether ``bif`` is correlation-normalized.
        chains, draws_per_chain: Draw counts.
        attribution_mean, observable_mean: Posterior means of the recorded values.
        observable_slices: ``name -> (start, stop)`` columns of each observable.
        phases: Within/between decomposition, if phases were given.
        diagnostics: Sampler health (``None`` for :func:`compute_bif`).
        draws: The raw draws if kept.
        config: The sampler config as a dict (``None`` for :func:`compute_bif`).
        cache_key: Config hash under which it was cached.
    """

    bif: Float[Tensor, "n_train n_query"]
    stderr: Float[Tensor, "n_train n_query"]
    per_chain: Float[Tensor, "chains n_train n_query"]
    pearson: bool
    chains: int
    draws_per_chain: int
    attribution_mean: Float[Tensor, " n_train"]
    observable_mean: Float[Tensor, " n_query"]
    observable_slices: dict[str, tuple[int, int]]
    phases: PhaseDecomposition | None = None
    diagnostics: SamplerDiagnostics | None = None
    draws: Draws | None = None
    config: dict[str, Any] | None = None
    cache_key: str | None = None

    def observable(self, name: str) -> Float[Tensor, "n_train k"]:
        """Columns of ``bif`` belonging to observable ``name``."""
        if name not in self.observable_slices:
            raise KeyError(f"no observable {name!r}; have {sorted(self.observable_slices)}")
        start, stop = self.observable_slices[name]
        return self.bif[:, start:stop]

    def save(self, directory: str | Path) -> Path:
        """Write tensors (``bif.safetensors``) and metadata (``bif.json``) atomically."""
        from safetensors.torch import save

        directory = Path(directory)
        tensors: dict[str, Tensor] = {
            "bif": self.bif,
            "stderr": self.stderr,
            "per_chain": self.per_chain,
            "attribution_mean": self.attribution_mean,
            "observable_mean": self.observable_mean,
        }
        if self.phases is not None:
            for name in ("weights", "within", "between", "total", "per_phase", "within_stderr", "between_stderr"):
                tensors[f"phases.{name}"] = getattr(self.phases, name)
        if self.diagnostics is not None:
            tensors["diagnostics.loss_trace"] = self.diagnostics.loss_trace
            tensors["diagnostics.burn_in_drift"] = self.diagnostics.burn_in_drift
            tensors["diagnostics.sampling_drift"] = self.diagnostics.sampling_drift
        if self.draws is not None:
            tensors["draws.attribution"] = self.draws.attribution
            tensors["draws.observables"] = self.draws.observables
            tensors["draws.statistic"] = self.draws.statistic
            if self.draws.phase_labels is not None:
                tensors["draws.phase_labels"] = self.draws.phase_labels
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
        meta = {
            "pearson": self.pearson,
            "chains": self.chains,
            "draws_per_chain": self.draws_per_chain,
            "observable_slices": {k: list(v) for k, v in self.observable_slices.items()},
            "phase_labels": self.phases.labels if self.phases is not None else None,
            "config": self.config,
            "cache_key": self.cache_key,
            "diagnostics": None
            if self.diagnostics is None
            else {
                "initial_loss": self.diagnostics.initial_loss,
                "n_beta": self.diagnostics.n_beta,
                "sampled_parameters": self.diagnostics.sampled_parameters,
                "warnings": self.diagnostics.warnings,
            },
        }
        atomic_write_bytes(directory / "bif.safetensors", save(tensors))
        atomic_write_json(directory / "bif.json", meta)
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> "BIFResult":
        """Read a result written by :meth:`save`."""
        from safetensors.torch import load_file

        directory = Path(directory)
        meta = json.loads((directory / "bif.json").read_text())
        t = load_file(str(directory / "bif.safetensors"))
        phases = None
        if meta["phase_labels"] is not None:
            phases = PhaseDecomposition(
                labels=list(meta["phase_labels"]),
                **{n: t[f"phases.{n}"] for n in ("weights", "within", "between", "total", "per_phase", "within_stderr", "between_stderr")},
            )
        diagnostics = None
        if meta["diagnostics"] is not None:
            d = meta["diagnostics"]
            diagnostics = SamplerDiagnostics(
                loss_trace=t["diagnostics.loss_trace"],
                initial_loss=d["initial_loss"],
                n_beta=d["n_beta"],
                burn_in_drift=t["diagnostics.burn_in_drift"],
                sampling_drift=t["diagnostics.sampling_drift"],
                sampled_parameters=d["sampled_parameters"],
                warnings=d["warnings"],
            )
        slices = {k: (int(v[0]), int(v[1])) for k, v in meta["observable_slices"].items()}
        draws = None
        if "draws.attribution" in t:
            draws = Draws(t["draws.attribution"], t["draws.observables"], slices, t["draws.statistic"],
                          t.get("draws.phase_labels"))
        return cls(
            bif=t["bif"],
            stderr=t["stderr"],
            per_chain=t["per_chain"],
            pearson=meta["pearson"],
            chains=meta["chains"],
            draws_per_chain=meta["draws_per_chain"],
            attribution_mean=t["attribution_mean"],
            observable_mean=t["observable_mean"],
            observable_slices=slices,
            phases=phases,
            diagnostics=diagnostics,
            draws=draws,
            config=meta["config"],
            cache_key=meta["cache_key"],
        )


def _stderr(per_chain: Tensor) -> Tensor:
    chains = per_chain.shape[0]
    if chains < 2:
        return torch.full_like(per_chain[0], float("nan"))
    return per_chain.std(0, unbiased=True) / math.sqrt(chains)


def _finalize(
    accumulators: Mapping[tuple[int, int], CoMoments],
    chains: int,
    pearson: bool,
    with_phases: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, PhaseDecomposition | None]:
    """Estimates from per-(chain, phase) accumulators."""
    per_chain_acc = []
    for chain in range(chains):
        parts = [acc for (c, _), acc in accumulators.items() if c == chain and acc.count > 0]
        if not parts:
            raise ValueError(f"chain {chain} has no draws")
        per_chain_acc.append(CoMoments.merged(parts))
    pooled = CoMoments.merged(per_chain_acc)

    def estimate(acc: CoMoments) -> Tensor:
        return acc.correlation().neg_() if pearson else acc.comoment.div(-acc.count)

    total = estimate(pooled)
    per_chain = torch.empty(chains, *total.shape, dtype=total.dtype)
    for chain, acc in enumerate(per_chain_acc):
        per_chain[chain] = estimate(acc)
    phases = None
    if with_phases:
        labels = sorted({k for (_, k), acc in accumulators.items() if acc.count > 0})

        def decompose(parts_by_label: dict[int, CoMoments]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
            everything = CoMoments.merged(list(parts_by_label.values()))
            n = everything.count
            within = torch.zeros_like(everything.comoment)
            between = torch.zeros_like(everything.comoment)
            weights = torch.zeros(len(labels), dtype=torch.float64)
            per_phase = torch.zeros(len(labels), *everything.comoment.shape, dtype=torch.float64)
            for i, label in enumerate(labels):
                acc = parts_by_label.get(label)
                if acc is None or acc.count == 0:
                    continue
                weight = acc.count / n
                weights[i] = weight
                per_phase[i] = -acc.covariance()
                within -= weight * acc.covariance()
                between -= weight * torch.outer(acc.mean_a - everything.mean_a, acc.mean_b - everything.mean_b)
            return weights, within, between, -everything.covariance(), per_phase

        pooled_by_label = {
            label: CoMoments.merged([acc for (_, k), acc in accumulators.items() if k == label]) for label in labels
        }
        weights, within, between, total_cov, per_phase = decompose(pooled_by_label)
        chain_within, chain_between = [], []
        for chain in range(chains):
            by_label = {k: acc for (c, k), acc in accumulators.items() if c == chain and acc.count > 0}
            _, w, b, _, _ = decompose(by_label)
            chain_within.append(w)
            chain_between.append(b)
        phases = PhaseDecomposition(
            labels=labels,
            weights=weights,
            within=within,
            between=between,
            total=total_cov,
            per_phase=per_phase,
            within_stderr=_stderr(torch.stack(chain_within)),
            between_stderr=_stderr(torch.stack(chain_between)),
        )
    return total, _stderr(per_chain), per_chain, pooled.mean_a, pooled.mean_b, phases


def compute_bif(
    draws: Draws,
    pearson: bool = False,
    phases: Int[Tensor, "chains draws"] | None = None,
) -> BIFResult:
    """The BIF estimator on stored draws.

    Args:
        draws: Recorded attribution and observable values per chain and draw.
        pearson: Return ``-Corr`` instead of ``-Cov``.
        phases: Optional integer phase label per draw (e.g. from :func:`cluster_phases`);
            adds a :class:`PhaseDecomposition` (in covariance units).

    Returns:
        The :class:`BIFResult` (no diagnostics, no config).
    """
    chains, n_draws = draws.attribution.shape[:2]
    if phases is not None and tuple(phases.shape) != (chains, n_draws):
        raise ValueError(f"phases must have shape (chains, draws) = {(chains, n_draws)}, got {tuple(phases.shape)}")
    accumulators: dict[tuple[int, int], CoMoments] = {}
    for chain in range(chains):
        labels = [0] if phases is None else sorted(set(phases[chain].tolist()))
        for label in labels:
            mask = slice(None) if phases is None else phases[chain] == label
            accumulators[(chain, int(label))] = CoMoments.from_batch(
                draws.attribution[chain][mask], draws.observables[chain][mask]
            )
    total, stderr, per_chain, mean_a, mean_b, decomposition = _finalize(
        accumulators, chains, pearson, with_phases=phases is not None
    )
    return BIFResult(
        bif=total,
        stderr=stderr,
        per_chain=per_chain,
        pearson=pearson,
        chains=chains,
        draws_per_chain=n_draws,
        attribution_mean=mean_a,
        observable_mean=mean_b,
        observable_slices=dict(draws.observable_slices),
        phases=decomposition,
        draws=draws,
    )


def cluster_phases(statistic: Float[Tensor, "chains draws"], k: int, iterations: int = 100) -> Int[Tensor, "chains draws"]:
    """Automatic phase labels: 1-D k-means of a per-draw statistic (pooled over chains).

    Deterministic (initialized at quantiles). Labels are ordered by cluster centre
    (0 = lowest statistic).

    Args:
        statistic: Scalar per draw, e.g. ``Draws.statistic`` (mean training loss).
        k: Number of phases (>= 1).
        iterations: Lloyd iterations.

    Returns:
        Integer labels of the same shape.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"number of phases k must be an integer >= 1, got {k!r}")
    values = statistic.detach().double().reshape(-1)
    if values.numel() < k:
        raise ValueError(f"cannot split {values.numel()} draws into {k} phases")
    centres = torch.quantile(values, torch.linspace(0, 1, k + 2, dtype=torch.float64)[1:-1])
    labels = torch.zeros_like(values, dtype=torch.long)
    for _ in range(iterations):
        labels = (values[:, None] - centres[None, :]).abs().argmin(1)
        new = torch.stack([values[labels == j].mean() if (labels == j).any() else centres[j] for j in range(k)])
        if torch.allclose(new, centres):
            break
        centres = new
    rank = torch.argsort(torch.argsort(centres))
    return rank[labels].reshape(statistic.shape)


# --------------------------------------------------------------------------- high level


def bif(
    model: nn.Module,
    train_data: DataLike,
    query_data: DataLike | None,
    loss_fn: LossFn,
    config: SamplerConfig,
    *,
    attribution_data: DataLike | None = None,
    attribution_fn: Observable | None = None,
    observables: Mapping[str, Observable] | None = None,
    phase_fn: Callable[[nn.Module], int] | None = None,
    cache_dir: str | Path | None = None,
    cache_tag: str | None = None,
) -> BIFResult:
    """Bayesian influence of training examples on observables at the model's checkpoint.

    Args:
        model: Any module; its current weights are the localization centre ``w*``
            (restored afterwards).
        train_data: Examples defining the posterior (``L_n``); by default also the
            attribution set.
        query_data: Examples whose per-example losses are the default observables
            (``"query_loss"``); may be ``None`` if ``observables`` is given.
        loss_fn: ``loss_fn(model, batch) -> Float[Tensor, "batch ..."]`` per-example losses.
        config: Sampler settings (also ``keep_draws`` and ``pearson``).
        attribution_data: Attribution set (rows of the result); default ``train_data``.
        attribution_fn: Override the attribution values per draw (``model -> tensor``),
            e.g. per-token losses; default: per-example losses of ``attribution_data``.
        observables: Extra ``name -> (model -> tensor)`` observables (columns), after
            ``"query_loss"`` if ``query_data`` is given.
        phase_fn: ``model -> int`` phase label evaluated at every draw; adds a streaming
            :class:`PhaseDecomposition`. For an automatic split use ``keep_draws=True`` and
            ``compute_bif(result.draws, phases=cluster_phases(result.draws.statistic, k))``.
        cache_dir: If given, results are stored under ``cache_dir/bif_<hash>/`` keyed by
            the config, model weights, data, loss/observable names and ``cache_tag``; a
            rerun with the same key loads the stored result. PNG figures are written beside.
        cache_tag: Extra cache-key text (the bodies of callables are not hashed; change the
            tag when you change a loss or observable function but keep its name).

    Returns:
        The :class:`BIFResult` with diagnostics.
    """
    if not isinstance(config, SamplerConfig):
        raise TypeError(f"config must be a SamplerConfig, got {type(config).__name__}")
    if query_data is None and not observables:
        raise ValueError("give query_data or at least one observable")
    attribution_data = train_data if attribution_data is None else attribution_data
    recorders: dict[str, Observable] = {}
    # Query set == attribution set (same object): record the losses once per draw.
    query_is_attribution = query_data is not None and query_data is attribution_data and attribution_fn is None
    if query_data is not None:
        recorders["query_loss"] = per_example_losses(loss_fn, query_data, config.eval_batch_size)
    for name, fn in (observables or {}).items():
        if name in recorders or name == "__attribution__":
            raise ValueError(f"observable name {name!r} is reserved or duplicated")
        recorders[name] = fn
    attribution = attribution_fn or per_example_losses(loss_fn, attribution_data, config.eval_batch_size)

    key = None
    if cache_dir is not None:
        identity = {
            "sampler": {k: v for k, v in config.to_dict().items() if k != "progress"},
            "model": _model_fingerprint(model),
            "train": _data_fingerprint(train_data),
            "query": _data_fingerprint(query_data),
            "attribution": _data_fingerprint(attribution_data) if attribution_fn is None else _qualname(attribution_fn),
            "loss_fn": _qualname(loss_fn),
            "observables": {k: _qualname(v) for k, v in (observables or {}).items()},
            "phase_fn": _qualname(phase_fn) if phase_fn is not None else None,
            "tag": cache_tag,
        }
        key = config_hash(identity)
        out_dir = Path(cache_dir) / f"bif_{key}"
        if (out_dir / "bif.json").exists() and (out_dir / "bif.safetensors").exists():
            return BIFResult.load(out_dir)

    with torch.no_grad():
        n_a = int(attribution(model).numel())
        sizes = {k: int(fn(model).numel()) for k, fn in recorders.items()}
    slices, start = {}, 0
    for name, size in sizes.items():
        slices[name] = (start, start + size)
        start += size
    n_b = start
    accumulators: dict[tuple[int, int], CoMoments] = {}
    # Raw draws keep the recorded dtype (float64 stays float64, so compute_bif on them
    # reproduces the streamed estimate to rounding).
    with torch.no_grad():
        kept_dtype = torch.float64 if attribution(model).dtype == torch.float64 else torch.float32
    kept_a = torch.zeros(config.chains, config.draws, n_a, dtype=kept_dtype) if config.keep_draws else None
    kept_b = torch.zeros(config.chains, config.draws, n_b, dtype=kept_dtype) if config.keep_draws else None
    kept_labels = (
        torch.zeros(config.chains, config.draws, dtype=torch.long) if config.keep_draws and phase_fn else None
    )
    all_recorders = {"__attribution__": attribution, **recorders}
    if query_is_attribution:
        del all_recorders["query_loss"]

    def on_draw(chain: int, draw: int, values: dict[str, Tensor]) -> None:
        a = values["__attribution__"]
        if query_is_attribution:
            values["query_loss"] = a
        b = torch.cat([values[name] for name in recorders])
        if a.numel() != n_a or b.numel() != n_b:
            raise ValueError(f"recorded sizes changed between draws: {a.numel()}/{n_a}, {b.numel()}/{n_b}")
        label = 0 if phase_fn is None else int(phase_fn(model))
        acc = accumulators.get((chain, label))
        if acc is None:
            acc = accumulators[(chain, label)] = CoMoments(n_a, n_b)
        acc.update(a, b)
        if kept_a is not None:
            kept_a[chain, draw] = a.to("cpu", kept_dtype)
            kept_b[chain, draw] = b.to("cpu", kept_dtype)
        if kept_labels is not None:
            kept_labels[chain, draw] = label

    diagnostics = sample_sgld(model, train_data, loss_fn, config, all_recorders, on_draw)
    total, stderr, per_chain, mean_a, mean_b, phases = _finalize(
        accumulators, config.chains, config.pearson, with_phases=phase_fn is not None
    )
    result = BIFResult(
        bif=total,
        stderr=stderr,
        per_chain=per_chain,
        pearson=config.pearson,
        chains=config.chains,
        draws_per_chain=config.draws,
        attribution_mean=mean_a,
        observable_mean=mean_b,
        observable_slices=slices,
        phases=phases,
        diagnostics=diagnostics,
        draws=Draws(kept_a, kept_b, dict(slices), phase_labels=kept_labels) if kept_a is not None else None,
        config=config.to_dict(),
        cache_key=key,
    )
    if cache_dir is not None:
        out_dir = Path(cache_dir) / f"bif_{key}"
        plot_bif(result, out_dir / "bif.png")
        result.save(out_dir)
    return result


def _qualname(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def plot_bif(result: BIFResult, path: str | Path) -> Path:
    """Save a PNG: the BIF matrix, its standard error, and the SGLD loss traces."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    panels = 3 if result.diagnostics is not None else 2
    fig, axes = plt.subplots(1, panels, figsize=(4.5 * panels, 4))
    matrix = result.bif.double().numpy()
    bound = float(np.nanmax(np.abs(matrix))) or 1.0
    im = axes[0].imshow(matrix, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto")
    axes[0].set(title="-Corr" if result.pearson else "BIF = -Cov", xlabel="observable", ylabel="training example")
    fig.colorbar(im, ax=axes[0])
    im = axes[1].imshow(result.stderr.double().numpy(), cmap="viridis", aspect="auto")
    axes[1].set(title="standard error", xlabel="observable")
    fig.colorbar(im, ax=axes[1])
    if result.diagnostics is not None:
        for chain, trace in enumerate(result.diagnostics.loss_trace.numpy()):
            axes[2].plot(trace, lw=0.6, label=f"chain {chain}")
        burn = (result.config or {}).get("burn_in", 0)
        axes[2].axvline(burn, color="k", ls="--", lw=0.8)
        axes[2].set(title="SGLD minibatch loss", xlabel="step")
    fig.tight_layout()
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
    return path
