"""Phase labels for draws."""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor


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


