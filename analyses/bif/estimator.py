"""The BIF estimator: -Cov (or -Corr) with per-chain standard errors, and its phase decomposition."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .moments import CoMoments
from .results import BIFResult, Draws, PhaseDecomposition


def _stderr(per_chain: Tensor) -> Tensor:
    """Std across chains / sqrt(chains); the only new n_a x n_b tensor is the result (the
    scratch is a block of rows)."""
    chains = per_chain.shape[0]
    if chains < 2:
        return torch.full_like(per_chain[0], float("nan"))
    total = torch.zeros_like(per_chain[0])
    rows = max(1, (1 << 18) // max(1, total[0].numel()))  # ~256k entries of scratch
    for start in range(0, total.shape[0], rows):
        block = per_chain[:, start : start + rows]
        mean = block.mean(0)
        out = total[start : start + rows]
        for chain in range(chains):
            scratch = block[chain] - mean
            out.addcmul_(scratch, scratch)
    return total.div_(chains - 1).sqrt_().div_(math.sqrt(chains))


def _pooled_comoment(parts: list[CoMoments]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, int]:
    """Pooled co-moment (one new n_a x n_b matrix), means and squared deviations of ``parts``."""
    n = sum(p.count for p in parts)
    mean_a = sum(p.mean_a * p.count for p in parts) / n
    mean_b = sum(p.mean_b * p.count for p in parts) / n
    dtype = parts[0].comoment.dtype
    comoment = parts[0].comoment.clone()
    for part in parts[1:]:
        comoment.add_(part.comoment)
    m2_a = torch.zeros_like(mean_a)
    m2_b = torch.zeros_like(mean_b)
    for part in parts:
        delta_a, delta_b = part.mean_a - mean_a, part.mean_b - mean_b
        comoment.addr_(delta_a.to(dtype), delta_b.to(dtype), alpha=part.count)
        m2_a += part.m2_a + part.count * delta_a * delta_a
        m2_b += part.m2_b + part.count * delta_b * delta_b
    return comoment, mean_a, mean_b, m2_a, m2_b, n


def _estimate_(comoment: Tensor, count: int, m2_a: Tensor, m2_b: Tensor, pearson: bool) -> Tensor:
    """``-Cov`` (or ``-Corr``) from a co-moment, in place."""
    if not pearson:
        return comoment.div_(-count)
    denom = torch.sqrt(torch.outer(m2_a, m2_b)).to(comoment.dtype)
    zero = denom == 0
    comoment.div_(denom.clamp_min_(torch.finfo(comoment.dtype).tiny)).neg_()
    return comoment.masked_fill_(zero, 0.0)


@dataclass
class BIFEstimate:
    """What the estimator gives from streamed co-moments (see :func:`estimate_from_moments`).

    Attributes:
        bif: ``-Cov`` (or ``-Corr``) pooled over chains, ``n_a x n_b``.
        stderr: Standard error per entry across chains (NaN for one chain).
        per_chain: The estimate of each chain alone.
        attribution_mean, observable_mean: Posterior means of the recorded values.
        phases: The within/between decomposition, if phases were accumulated separately.
    """

    bif: Float[Tensor, "n_a n_b"]
    stderr: Float[Tensor, "n_a n_b"]
    per_chain: Float[Tensor, "chains n_a n_b"]
    attribution_mean: Float[Tensor, " n_a"]
    observable_mean: Float[Tensor, " n_b"]
    phases: PhaseDecomposition | None = None


def estimate_from_moments(
    accumulators: Mapping[tuple[int, int], CoMoments],
    chains: int,
    pearson: bool,
    with_phases: bool,
    per_chain_out: Float[Tensor, "chains n_a n_b"] | None = None,
) -> BIFEstimate:
    """The BIF estimate from per-(chain, phase) co-moment accumulators.

    Args:
        accumulators: ``(chain, phase label) -> CoMoments`` of (attribution, observable).
        chains: Number of chains (each must have draws).
        pearson: ``-Corr`` instead of ``-Cov``.
        with_phases: Also compute the :class:`PhaseDecomposition`.
        per_chain_out: Where to write the per-chain estimates (default: a new tensor). It may
            hold the accumulators' own co-moments (chain ``c``'s single accumulator using
            ``per_chain_out[c]``): they are then turned into the estimates in place and the
            accumulators are consumed.

        Memory beyond the accumulators: the pooled matrix, the per-chain estimates (none
        with ``per_chain_out``) and the standard error (each ``n_a x n_b`` in the
        accumulators' dtype); without ``per_chain_out`` the accumulators are not modified.
    """
    per_chain_acc = []
    for chain in range(chains):
        parts = [acc for (c, _), acc in accumulators.items() if c == chain and acc.count > 0]
        if not parts:
            raise ValueError(f"chain {chain} has no draws")
        per_chain_acc.append(parts if len(parts) > 1 else parts[0])
    everything = [p for parts in per_chain_acc for p in (parts if isinstance(parts, list) else [parts])]
    comoment, mean_a, mean_b, m2_a, m2_b, n = _pooled_comoment(everything)
    total = _estimate_(comoment, n, m2_a, m2_b, pearson)
    if per_chain_out is None:
        per_chain = torch.empty(chains, *total.shape, dtype=total.dtype)
    else:
        if tuple(per_chain_out.shape) != (chains, *total.shape) or per_chain_out.dtype != total.dtype:
            raise ValueError(
                f"per_chain_out must be a {total.dtype} tensor of shape {(chains, *total.shape)}, "
                f"got {per_chain_out.dtype} {tuple(per_chain_out.shape)}"
            )
        per_chain = per_chain_out
    for chain, acc in enumerate(per_chain_acc):
        if isinstance(acc, list):
            chain_comoment, _, _, chain_m2_a, chain_m2_b, count = _pooled_comoment(acc)
            per_chain[chain] = _estimate_(chain_comoment, count, chain_m2_a, chain_m2_b, pearson)
            del chain_comoment
        else:
            if acc.comoment.data_ptr() != per_chain[chain].data_ptr():  # else: already in place
                per_chain[chain].copy_(acc.comoment)
            _estimate_(per_chain[chain], acc.count, acc.m2_a, acc.m2_b, pearson)
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
    return BIFEstimate(total, _stderr(per_chain), per_chain, mean_a, mean_b, phases)


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
    estimate = estimate_from_moments(accumulators, chains, pearson, with_phases=phases is not None)
    return BIFResult(
        bif=estimate.bif,
        stderr=estimate.stderr,
        per_chain=estimate.per_chain,
        pearson=pearson,
        chains=chains,
        draws_per_chain=n_draws,
        attribution_mean=estimate.attribution_mean,
        observable_mean=estimate.observable_mean,
        observable_slices=dict(draws.observable_slices),
        phases=estimate.phases,
        draws=draws,
    )

