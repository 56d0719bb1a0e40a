"""The BIF estimator: -Cov (or -Corr) with its leave-one-chain-out jackknife standard error
(and the per-chain spread under its own name), and its phase decomposition."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_toolkit.errors import UserError

from .diagnostics import (
    convergence_diagnostics,
    jackknife_stderr,
    jackknife_stderr_streamed,
    tracked_indices,
)
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
    mean_a, mean_b = _chain_means(parts)
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
        stderr: Leave-one-chain-out jackknife standard error of ``bif`` (NaN for one chain):
            it sees the between-chain part of the pooled covariance.
        per_chain: The estimate of each chain alone.
        per_chain_stderr: Std of the chains' own estimates / sqrt(chains) (NaN for one
            chain); blind to chains that sit at different places.
        attribution_mean, observable_mean: Posterior means of the recorded values.
        phases: The within/between decomposition, if phases were accumulated separately.
    """

    bif: Float[Tensor, "n_a n_b"]
    stderr: Float[Tensor, "n_a n_b"]
    per_chain: Float[Tensor, "chains n_a n_b"]
    attribution_mean: Float[Tensor, " n_a"]
    observable_mean: Float[Tensor, " n_b"]
    phases: PhaseDecomposition | None = None
    per_chain_stderr: Float[Tensor, "n_a n_b"] | None = None


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
        with ``per_chain_out``), the two standard errors and, while the jackknife runs, two
        scratch matrices (each ``n_a x n_b`` in the accumulators' dtype); without
        ``per_chain_out`` the accumulators are not modified.
    """
    per_chain_acc = []
    for chain in range(chains):
        parts = [acc for (c, _), acc in accumulators.items() if c == chain and acc.count > 0]
        if not parts:
            raise UserError(f"chain {chain} has no draws")
        per_chain_acc.append(parts if len(parts) > 1 else parts[0])
    everything = [p for parts in per_chain_acc for p in (parts if isinstance(parts, list) else [parts])]
    comoment, mean_a, mean_b, m2_a, m2_b, n = _pooled_comoment(everything)
    total = _estimate_(comoment, n, m2_a, m2_b, pearson)
    chain_means = [_chain_means(acc if isinstance(acc, list) else [acc]) for acc in per_chain_acc]
    # -Corr (or unequal draws per chain) re-pools the accumulators: before they may become
    # the per-chain estimates in place below
    stderr = None if not pearson and _equal_counts(per_chain_acc) else _jackknife(
        total, None, chain_means, per_chain_acc, pearson)
    if per_chain_out is None:
        per_chain = torch.empty(chains, *total.shape, dtype=total.dtype)
    else:
        if tuple(per_chain_out.shape) != (chains, *total.shape) or per_chain_out.dtype != total.dtype:
            raise UserError(
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
    if stderr is None:
        stderr = _jackknife(total, per_chain, chain_means, per_chain_acc, pearson)
    return BIFEstimate(total, stderr, per_chain, mean_a, mean_b, phases, per_chain_stderr=_stderr(per_chain))


def _chain_means(parts: list[CoMoments]) -> tuple[Tensor, Tensor]:
    """Count-weighted means of ``mean_a`` and ``mean_b`` over ``parts`` (at least one)."""
    n = sum(p.count for p in parts)
    mean_a = sum(p.mean_a * p.count for p in parts) / n
    mean_b = sum(p.mean_b * p.count for p in parts) / n
    # sum() starts from the int 0, so its static type is Tensor | float; with a part it is a Tensor.
    assert isinstance(mean_a, Tensor) and isinstance(mean_b, Tensor)
    return mean_a, mean_b


def _equal_counts(per_chain_acc: list) -> bool:
    return len({sum(p.count for p in (acc if isinstance(acc, list) else [acc])) for acc in per_chain_acc}) == 1


def _jackknife(total: Tensor, per_chain: Tensor | None, chain_means: list[tuple[Tensor, Tensor]],
               per_chain_acc: list, pearson: bool) -> Tensor:
    """Leave-one-chain-out jackknife standard error of the pooled estimate.

    For ``-Cov`` with equal draws per chain, the estimate without chain ``k`` is formed from
    the pooled one, chain ``k``'s own estimate and the chains' means (two low-rank terms), so
    no accumulator is revisited: ``theta_-k = (C total - per_chain[k]) / (C - 1) + (sum_c dA_c
    dB_c^T - sum_{c != k} dA'_c dB'_c^T) / (C - 1)``, with ``d`` the chain means' deviations from
    the mean over all chains (unprimed) or over the other chains (primed). Without
    ``per_chain`` (for ``-Corr`` or unequal draws) the other chains' accumulators are pooled
    again. Deviations from the mean of the leave-one-out estimates are formed before squaring
    (float32 stays accurate); with ``per_chain`` the work runs in row blocks (scratch:
    ``chains`` blocks of ~256k entries), else scratch is two matrices.
    """
    chains = len(per_chain_acc)
    if chains < 2:
        return torch.full_like(total, float("nan"))
    dtype = total.dtype
    means_a = torch.stack([m[0] for m in chain_means])
    means_b = torch.stack([m[1] for m in chain_means])
    if per_chain is not None:
        stderr = torch.empty_like(total)
        # -Cov from the pooled estimate and low-rank terms, in row blocks (no full-size scratch)
        da_all, db_all = means_a - means_a.mean(0), means_b - means_b.mean(0)
        terms = []
        for k in range(chains):
            keep = [c for c in range(chains) if c != k]
            da, db = means_a[keep] - means_a[keep].mean(0), means_b[keep] - means_b[keep].mean(0)
            terms.append((torch.cat([da_all, da]).T.to(dtype), torch.cat([db_all, -db]).to(dtype)))
        rows = max(1, (1 << 18) // max(1, total[0].numel()))
        for start in range(0, total.shape[0], rows):
            stop = min(start + rows, total.shape[0])
            block = torch.empty(chains, stop - start, total.shape[1], dtype=dtype)
            for k, (left, right) in enumerate(terms):
                torch.mul(total[start:stop], chains, out=block[k]).sub_(per_chain[k, start:stop])
                block[k].addmm_(left[start:stop], right).div_(chains - 1)
            stderr[start:stop] = jackknife_stderr(block)
        return stderr
    # pools the other chains' accumulators again (-Corr, or unequal draws per chain), one
    # leave-one-out estimate at a time into the streamed jackknife (two float64 matrices)
    def leave_out(k: int) -> Tensor:
        keep = [c for c in range(chains) if c != k]
        parts = [
            p for c in keep for p in (per_chain_acc[c] if isinstance(per_chain_acc[c], list) else [per_chain_acc[c]])
        ]
        comoment, _, _, m2_a, m2_b, n = _pooled_comoment(parts)
        return _estimate_(comoment, n, m2_a, m2_b, pearson)

    return jackknife_stderr_streamed(leave_out(k) for k in range(chains)).to(dtype)


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
        The :class:`BIFResult` (no sampler diagnostics, no config; convergence diagnostics
        of up to 16 x 16 evenly spaced entries). Does not warn: read ``result.convergence``.
    """
    chains, n_draws = draws.attribution.shape[:2]
    if phases is not None and tuple(phases.shape) != (chains, n_draws):
        raise UserError(f"phases must have shape (chains, draws) = {(chains, n_draws)}, got {tuple(phases.shape)}")
    accumulators: dict[tuple[int, int], CoMoments] = {}
    for chain in range(chains):
        labels = [0] if phases is None else sorted(set(phases[chain].tolist()))
        for label in labels:
            mask = slice(None) if phases is None else phases[chain] == label
            accumulators[(chain, int(label))] = CoMoments.from_batch(
                draws.attribution[chain][mask], draws.observables[chain][mask]
            )
    estimate = estimate_from_moments(accumulators, chains, pearson, with_phases=phases is not None)
    rows, cols = tracked_indices(draws.attribution.shape[2]), tracked_indices(draws.observables.shape[2])
    convergence = convergence_diagnostics(
        draws.attribution[..., rows], draws.observables[..., cols], rows, cols,
        per_chain=estimate.per_chain[:, rows][:, :, cols],
        scalars={"mean attribution loss": draws.attribution.double().mean(-1),
                 **{f"mean {k}": draws.observables[..., a:b].double().mean(-1)
                    for k, (a, b) in draws.observable_slices.items()}})
    return BIFResult(
        bif=estimate.bif,
        stderr=estimate.stderr,
        per_chain=estimate.per_chain,
        per_chain_stderr=estimate.per_chain_stderr,
        convergence=convergence,
        pearson=pearson,
        chains=chains,
        draws_per_chain=n_draws,
        attribution_mean=estimate.attribution_mean,
        observable_mean=estimate.observable_mean,
        observable_slices=dict(draws.observable_slices),
        phases=estimate.phases,
        draws=draws,
    )

