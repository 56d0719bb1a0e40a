"""Token-level BIF estimated from stored per-token draws (:func:`compute_lm_bif`, ours or
another library's) and the naive full-matrix reference (:func:`naive_token_bif`).
"""

from __future__ import annotations

from typing import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from interp_toolkit.analyses.bif.diagnostics import (
    jackknife_stderr_streamed,
)
from interp_toolkit.analyses.bif.engine import pick_stderr
from interp_toolkit.analyses.bif.estimator import BIFEstimate, estimate_from_moments
from interp_toolkit.analyses.bif.lm_tokens import (
    DEFAULT_REDUCTIONS,
    PEARSON_CONVENTIONS,
    STDERR_METHODS,
    ReducedBIF,
    TokenSet,
    group_ids,
)
from interp_toolkit.analyses.bif.moments import CoMoments
from interp_toolkit.errors import UserError


def _group_means_of_draws(values: Tensor, ids: Tensor, k: int) -> Tensor:
    """``[..., n] -> [..., k]``: mean over each group of the last axis."""
    counts = torch.bincount(ids, minlength=k).to(torch.float64)
    out = torch.zeros(*values.shape[:-1], k, dtype=torch.float64)
    return out.index_add_(-1, ids, values.to(torch.float64)) / counts


def _estimate_from_draws(a: Tensor, b: Tensor, pearson: bool) -> BIFEstimate:
    """The engine's estimator (:func:`~.estimator.estimate_from_moments`: pooled ``-Cov`` or
    ``-Corr``, per-chain estimates, jackknife and per-chain errors) on draws ``[chains, draws, k]``;
    the chains' co-moments are the rows of the per-chain output (no second ``chains x k_a x k_b``)."""
    chains = a.shape[0]
    per_chain = torch.zeros(chains, a.shape[2], b.shape[2], dtype=torch.float64)
    accumulators = {}
    for c in range(chains):
        acc = accumulators[(c, 0)] = CoMoments(a.shape[2], b.shape[2], out=per_chain[c])
        acc.update_batch(a[c], b[c])
    return estimate_from_moments(accumulators, chains, pearson, False, per_chain_out=per_chain)


def _standardize(draws: Tensor) -> Tensor:
    """``(x - mean) / std`` over the draw axis (population std), ``[draws, n]``."""
    centred = draws - draws.mean(0)
    return centred / centred.pow(2).mean(0).sqrt()


def compute_lm_bif(
    train_draws: Float[Tensor, "chains draws n_a"],
    query_draws: Float[Tensor, "chains draws n_b"] | None,
    train: TokenSet,
    query: TokenSet | None,
    reductions: Sequence[str] = DEFAULT_REDUCTIONS,
    *,
    pearson: bool = False,
    pearson_convention: str = "token_mean",
    stderr_method: str = "jackknife",
) -> dict[str, ReducedBIF]:
    """Every reduction of the token-level BIF from stored per-token draws (low level).

    Args:
        train_draws: Per-token losses of the recorded training tokens at every draw
            (row-major over ``train.tokens``' losses).
        query_draws: Same for the query tokens; ``None``: the query is the training set.
        train, query: The token sets (groupings); ``query=None``: ``train``.
        reductions: ``"<train grouping>:<query grouping>"`` entries.
        pearson: ``-Corr`` instead of ``-Cov``.
        pearson_convention: ``"token_mean"`` (devinterp) or ``"group_means"``.
        stderr_method: ``"jackknife"`` (leave one chain out) or ``"per_chain"`` (std
            across chains / sqrt(chains)).

    Returns:
        ``reduction -> ReducedBIF`` (pooled estimate over all chains' draws, per-chain
        estimates, stderr of the pooled estimate).
    """
    if pearson_convention not in PEARSON_CONVENTIONS:
        raise UserError(f"pearson_convention must be one of {PEARSON_CONVENTIONS}, got {pearson_convention!r}")
    if stderr_method not in STDERR_METHODS:
        raise UserError(f"stderr_method must be one of {STDERR_METHODS}, got {stderr_method!r}")
    if stderr_method == "jackknife" and train_draws.shape[0] > 1 and pearson and pearson_convention == "token_mean":
        # each token's standardization depends on the chains used: the estimates, then each
        # leave-one-chain-out estimate (same code on fewer chains) into the one jackknife
        out = compute_lm_bif(train_draws, query_draws, train, query, reductions, pearson=pearson,
                             pearson_convention=pearson_convention, stderr_method="per_chain")
        chains = train_draws.shape[0]
        for name, red in out.items():
            red.stderr = jackknife_stderr_streamed(
                compute_lm_bif(
                    train_draws[[c for c in range(chains) if c != left_out]],
                    None if query_draws is None else query_draws[[c for c in range(chains) if c != left_out]], train,
                    query, (name,), pearson=pearson, pearson_convention=pearson_convention, stderr_method="per_chain",
                )[name].bif
                for left_out in range(chains)
            )
        return out
    query = train if query is None else query
    query_draws = train_draws if query_draws is None else query_draws
    if train_draws.ndim != 3 or query_draws.ndim != 3 or train_draws.shape[:2] != query_draws.shape[:2]:
        raise UserError(f"draws must be [chains, draws, n] with equal chains/draws, got {tuple(train_draws.shape)} "
                         f"and {tuple(query_draws.shape)}")
    if train_draws.shape[-1] != train.n_tokens or query_draws.shape[-1] != query.n_tokens:
        raise UserError(f"draws have {train_draws.shape[-1]} / {query_draws.shape[-1]} tokens, token sets "
                         f"{train.n_tokens} / {query.n_tokens}")
    chains = train_draws.shape[0]
    standardized = pearson and pearson_convention == "token_mean"
    a_all, b_all = train_draws, query_draws
    if standardized:
        a_all, b_all = a_all.double(), b_all.double()
        # per chain (per-chain estimates) and pooled (the estimate) standardizations
        a_chain = torch.stack([_standardize(c) for c in a_all])
        b_chain = torch.stack([_standardize(c) for c in b_all])
        a_pool = _standardize(a_all.reshape(-1, a_all.shape[-1]))
        b_pool = _standardize(b_all.reshape(-1, b_all.shape[-1]))
    out = {}
    for reduction in reductions:
        g_a, g_b = reduction.split(":")
        ids_a, labels_a = group_ids(train, g_a)
        ids_b, labels_b = group_ids(query, g_b)
        k_a, k_b = len(labels_a), len(labels_b)
        def means(draws: Tensor, grouping: str, ids: Tensor, k: int) -> Tensor:
            return draws if grouping == "token" else _group_means_of_draws(draws, ids, k)

        if standardized:
            # per-chain estimates from per-chain standardization, the estimate from the pooled one
            pooled = CoMoments.from_batch(means(a_pool, g_a, ids_a, k_a), means(b_pool, g_b, ids_b, k_b))
            total = pooled.comoment.div(-pooled.count)
            estimate = _estimate_from_draws(means(a_chain, g_a, ids_a, k_a), means(b_chain, g_b, ids_b, k_b), False)
            per_chain, stderr = estimate.per_chain, pick_stderr(estimate, "per_chain")
        else:
            estimate = _estimate_from_draws(means(a_all, g_a, ids_a, k_a), means(b_all, g_b, ids_b, k_b), pearson)
            total, stderr, per_chain = estimate.bif, pick_stderr(estimate, stderr_method), estimate.per_chain
        out[reduction] = ReducedBIF(total, stderr, per_chain, labels_a, labels_b)
    return out


def naive_token_bif(
    train_draws: Float[Tensor, "chains draws n_a"], query_draws: Float[Tensor, "chains draws n_b"]
) -> Float[Tensor, "n_a n_b"]:
    """Reference: ``-Cov`` over all pooled draws, by explicit double loop-free formula.

    ``-(1/N) sum_k (a_k - mean a)(b_k - mean b)^T`` over the ``N = chains x draws`` draws.
    """
    a = train_draws.reshape(-1, train_draws.shape[-1]).double()
    b = query_draws.reshape(-1, query_draws.shape[-1]).double()
    n = a.shape[0]
    out = torch.zeros(a.shape[1], b.shape[1], dtype=torch.float64)
    mean_a, mean_b = a.mean(0), b.mean(0)
    for k in range(n):
        out += torch.outer(a[k] - mean_a, b[k] - mean_b)
    return -out / n


__all__ = ["compute_lm_bif", "naive_token_bif"]
