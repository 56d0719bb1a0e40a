"""Phase labels for draws, and the between-phase share of the BIF next to its null.

Two ways to label draws:

* **By solution** (:func:`threshold_phases`, :func:`observable_phase_fn`): each draw is
  classified by an observable of its weights against thresholds, e.g. which data modes a
  deep linear network has learned (its map projected on the data's singular modes against
  half their strength; :func:`interp_toolkit.studies.bif.dln.mode_phase_fn`). This is the
  paper's notion of a phase: the solution a draw sits in.
* **By clustering** (:func:`cluster_phases`): 1-D k-means of a per-draw scalar. Beware:
  splitting *any* unimodal distribution in two produces a large between-phase term. For a
  single Gaussian posterior a 2-means split of the training loss gives weights 0.5/0.5
  and a between-phase share of the loss-loss covariance of ``2/pi ~ 0.64`` (the squared
  mean of a half-normal). Such a share says nothing about phases unless it exceeds its null.

:func:`phase_share_with_null` reports every between-phase share next to its null: the same
split procedure applied to draws from a Gaussian with the draws' mean and covariance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from interp_toolkit.errors import UserError

from .estimator import compute_bif
from .results import Draws

__all__ = [
    "PhaseShare",
    "between_share",
    "cluster_phases",
    "gaussian_null_draws",
    "observable_phase_fn",
    "phase_share_with_null",
    "threshold_phases",
]


def cluster_phases(statistic: Float[Tensor, "chains draws"], k: int, iterations: int = 100) -> Int[Tensor, "chains "
                                                                                                           "draws"]:
    """Automatic phase labels: 1-D k-means of a per-draw statistic (pooled over chains).

    Deterministic (initialized at quantiles). Labels are ordered by cluster centre
    (0 = lowest statistic). This splits any distribution, phases or not: on a single
    Gaussian, ``k = 2`` gives a between-phase share of about ``2/pi`` of the statistic's
    covariances (see the module docstring); compare with :func:`phase_share_with_null`.

    Args:
        statistic: Scalar per draw, e.g. ``Draws.statistic`` (mean training loss).
        k: Number of phases (>= 1).
        iterations: Lloyd iterations.

    Returns:
        Integer labels of the same shape.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise UserError(f"number of phases k must be an integer >= 1, got {k!r}")
    values = statistic.detach().double().reshape(-1)
    if values.numel() < k:
        raise UserError(f"cannot split {values.numel()} draws into {k} phases")
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


def _thresholds(thresholds: float | Sequence[float] | Tensor, k: int) -> Tensor:
    out = torch.as_tensor(thresholds, dtype=torch.float64).reshape(-1)
    if out.numel() == 1:
        out = out.expand(k)
    if out.numel() != k:
        raise UserError(f"got {out.numel()} thresholds for an observable with {k} values; give 1 or {k}")
    if not torch.isfinite(out).all():
        raise UserError(f"thresholds must be finite, got {out.tolist()}")
    return out


def threshold_phases(
    values: Float[Tensor, "*batch k"], thresholds: float | Sequence[float] | Tensor
) -> Int[Tensor, "*batch"]:
    """Phase label of each draw from ``k`` observable values: which of them exceed their thresholds.

    ``label = sum_m 2^m [values_m > thresholds_m]`` (0: none exceeded; ``2^k - 1``: all).
    For mode strengths against half their targets, the label says which modes are learned.

    Args:
        values: ``[..., k]`` observable values per draw (``k <= 62``).
        thresholds: One threshold, or one per value.

    Returns:
        Integer labels ``[...]``.
    """
    if values.ndim == 0:
        raise UserError("values must have a last axis of observables")
    k = values.shape[-1]
    if not 1 <= k <= 62:
        raise UserError(f"threshold_phases takes 1 to 62 observable values per draw, got {k}")
    cut = _thresholds(thresholds, k).to(values.device)
    bits = (values.double() > cut).long()
    return (bits * (2 ** torch.arange(k, device=values.device))).sum(-1)


def observable_phase_fn(
    observable: Callable[[nn.Module], Tensor], thresholds: float | Sequence[float] | Tensor
) -> Callable[[nn.Module], int]:
    """A ``phase_fn`` for :func:`bif`: the draw's solution, from any observable of its weights.

    Args:
        observable: ``model -> Tensor[k]`` (flattened), e.g. mode strengths.
        thresholds: One threshold, or one per value (see :func:`threshold_phases`).

    Returns:
        ``model -> int`` label (:func:`threshold_phases` of the observable).
    """

    def phase_fn(model: nn.Module) -> int:
        with torch.no_grad():
            values = observable(model).detach().reshape(-1)
        return int(threshold_phases(values, thresholds))

    phase_fn.__qualname__ = f"observable_phase_fn({getattr(observable, '__qualname__', repr(observable))})"
    return phase_fn


def between_share(
    between: Float[Tensor, "n_a n_b"], total: Float[Tensor, "n_a n_b"], index: tuple[int, int] | None = None
) -> float:
    """Between-phase share of the BIF: ``between[i, j] / total[i, j]`` for one ``index``,
    otherwise the projection ``<between, total> / <total, total>`` over all entries."""
    if index is not None:
        value = float(total[index])
        return float(between[index]) / value if value != 0 else float("nan")
    norm = float((total.double() ** 2).sum())
    return float((between.double() * total.double()).sum()) / norm if norm > 0 else float("nan")


def gaussian_null_draws(draws: Draws, generator: torch.Generator | None = None) -> Draws:
    """Draws of the same shape from a Gaussian with the draws' mean and covariance.

    The covariance is the pooled empirical one (all chains). With fewer recorded values
    ``d`` than draws ``N`` it is factorized (``d x d``); otherwise it is sampled without
    forming it, as ``mean + G X_c / sqrt(N)`` with ``X_c`` the centred draws and ``G``
    standard normal ``[N, N]``. ``statistic`` is recomputed from the null draws.
    """
    attribution, observables = draws.attribution.double(), draws.observables.double()
    chains, n_draws, n_a = attribution.shape
    joined = torch.cat([attribution, observables], -1).reshape(chains * n_draws, -1)
    mean = joined.mean(0)
    centred = joined - mean
    n, d = centred.shape
    if d <= n:
        eigenvalues, eigenvectors = torch.linalg.eigh(centred.T @ centred / n)
        factor = eigenvectors * eigenvalues.clamp_min(0).sqrt()
        null = mean + torch.randn(n, d, generator=generator, dtype=torch.float64) @ factor.T
    else:
        null = mean + torch.randn(n, n, generator=generator, dtype=torch.float64) @ centred / math.sqrt(n)
    null = null.reshape(chains, n_draws, -1)
    return Draws(null[..., :n_a], null[..., n_a:], dict(draws.observable_slices))


@dataclass
class PhaseShare:
    """A between-phase share next to its null.

    Attributes:
        labels: Phase label per draw.
        weights: Fraction of draws per phase, in the order of ``phase_ids``.
        phase_ids: The labels that occur.
        between, total: ``-Cov`` between-phase part and total (covariance units).
        share: :func:`between_share` of the draws (for ``index`` if given).
        null_share: Mean share over the Gaussian null repeats.
        null_std: Std of the null share over repeats (``nan`` for one repeat).
        null_shares: Every null repeat's share.
        index: The ``(i, j)`` entry the shares are about, or ``None`` (all entries).
    """

    labels: Int[Tensor, "chains draws"]
    weights: Float[Tensor, " k"]
    phase_ids: list[int]
    between: Float[Tensor, "n_a n_b"]
    total: Float[Tensor, "n_a n_b"]
    share: float
    null_share: float
    null_std: float
    null_shares: list[float]
    index: tuple[int, int] | None = None

    def to_dict(self) -> dict:
        return {
            "phase_ids": self.phase_ids,
            "weights": self.weights.tolist(),
            "share": self.share,
            "null_share": self.null_share,
            "null_std": self.null_std,
            "index": list(self.index) if self.index is not None else None,
        }


def phase_share_with_null(
    draws: Draws,
    split: Callable[[Draws], Tensor],
    index: tuple[int, int] | None = None,
    null_repeats: int = 20,
    seed: int = 0,
    observable: str | None = None,
) -> PhaseShare:
    """Split the draws into phases and report the between-phase share with its Gaussian null.

    Args:
        draws: Stored draws (``keep_draws=True``). Observables used by ``split`` (e.g. mode
            strengths recorded with ``observables={"modes": ...}``) must be among them.
        split: The split procedure, ``Draws -> labels [chains, draws]``, e.g.
            ``lambda d: threshold_phases(d.observables[..., a:b], 0.5)`` or
            ``lambda d: cluster_phases(d.statistic, 2)``. It is applied to the draws and,
            unchanged, to Gaussian draws with their mean and covariance.
        index: ``(i, j)`` entry of the BIF to report the share of; ``None``: all entries
            (:func:`between_share`). Column ``j`` counts within ``observable`` if given.
        observable: Restrict the shares (and ``between``/``total``) to this observable's
            columns (a name in ``draws.observable_slices``); default all columns.
        null_repeats: Gaussian null samples (>= 1).
        seed: Seed of the null.

    Returns:
        The :class:`PhaseShare`.
    """
    if isinstance(null_repeats, bool) or not isinstance(null_repeats, int) or null_repeats < 1:
        raise UserError(f"null_repeats must be an integer >= 1, got {null_repeats!r}")
    if observable is not None and observable not in draws.observable_slices:
        raise UserError(f"no observable {observable!r} in the draws; have {sorted(draws.observable_slices)}")
    columns = slice(*draws.observable_slices[observable]) if observable is not None else slice(None)
    labels = split(draws)
    decomposition = compute_bif(draws, phases=labels).phases
    assert decomposition is not None  # compute_bif decomposes whenever given phases
    between, total = decomposition.between[:, columns], decomposition.total[:, columns]
    share = between_share(between, total, index)
    generator = torch.Generator().manual_seed(seed)
    null_shares = []
    for _ in range(null_repeats):
        null = gaussian_null_draws(draws, generator)
        null_decomposition = compute_bif(null, phases=split(null)).phases
        assert null_decomposition is not None
        null_shares.append(
            between_share(null_decomposition.between[:, columns], null_decomposition.total[:, columns], index)
        )
    values = torch.tensor(null_shares, dtype=torch.float64)
    return PhaseShare(
        labels=labels,
        weights=decomposition.weights,
        phase_ids=list(decomposition.labels),
        between=between,
        total=total,
        share=share,
        null_share=float(values.nanmean()),
        null_std=float(values.std()) if null_repeats > 1 else float("nan"),
        null_shares=null_shares,
        index=index,
    )
