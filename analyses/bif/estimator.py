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
    chains = per_chain.shape[0]
    if chains < 2:
        return torch.full_like(per_chain[0], float("nan"))
    return per_chain.std(0, unbiased=True) / math.sqrt(chains)


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
) -> BIFEstimate:
    """The BIF estimate from per-(chain, phase) co-moment accumulators.

    Args:
        accumulators: ``(chain, phase label) -> CoMoments`` of (attribution, observable).
        chains: Number of chains (each must have draws).
        pearson: ``-Corr`` instead of ``-Cov``.
        with_phases: Also compute the :class:`PhaseDecomposition`.
    """
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
    return BIFEstimate(total, _stderr(per_chain), per_chain, pooled.mean_a, pooled.mean_b, phases)


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

