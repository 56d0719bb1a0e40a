"""Statistics of generalization rates: Wilson intervals of one rate, Newcombe intervals and
Fisher exact tests of two, and Holm's correction of a family of p-values.
"""

from __future__ import annotations

import math
from typing import Sequence


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95% for the default ``z``).

    Args:
        successes: Number of successes, ``0 <= successes <= n``.
        n: Number of trials (>= 1).
        z: Normal quantile.

    Returns:
        ``(low, high)`` within [0, 1].
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"wilson_interval needs n >= 1 trials, got {n!r}")
    if isinstance(successes, bool) or not isinstance(successes, int) or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval successes must be an integer in [0, {n}], got {successes!r}")
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # At k = 0 (k = n) the bound is exactly 0 (1); float rounding alone can put it a hair
    # inside, above the rate itself, which plots as a negative error bar.
    low = 0.0 if successes == 0 else max(0.0, center - half)
    high = 1.0 if successes == n else min(1.0, center + half)
    return low, high


def newcombe_interval(k_a: int, n_a: int, k_b: int, n_b: int,
                      z: float = 1.959963984540054) -> tuple[float, float, float]:
    """Difference of two independent proportions with Newcombe's hybrid score interval.

    Method 10 of Newcombe (1998, Statistics in Medicine 17:873-890): the Wilson score
    intervals ``(l_a, u_a)`` and ``(l_b, u_b)`` of each proportion combine into
    ``d - sqrt((p_a - l_a)^2 + (u_b - p_b)^2)`` and ``d + sqrt((u_a - p_a)^2 + (p_b - l_b)^2)``
    with ``d = p_a - p_b`` (95% for the default ``z``).

    Returns:
        ``(difference, low, high)``.
    """
    l_a, u_a = wilson_interval(k_a, n_a, z)
    l_b, u_b = wilson_interval(k_b, n_b, z)
    p_a, p_b = k_a / n_a, k_b / n_b
    diff = p_a - p_b
    low = diff - math.sqrt((p_a - l_a) ** 2 + (u_b - p_b) ** 2)
    high = diff + math.sqrt((u_a - p_a) ** 2 + (p_b - l_b) ** 2)
    return diff, max(-1.0, low), min(1.0, high)


def fisher_exact_p(k_a: int, n_a: int, k_b: int, n_b: int) -> float:
    """Two-sided Fisher exact p-value of ``k_a/n_a`` vs ``k_b/n_b`` (``scipy.stats.fisher_exact``)."""
    from scipy.stats import fisher_exact

    for k, n in ((k_a, n_a), (k_b, n_b)):
        wilson_interval(k, n)  # validates k and n, naming the bad value
    return float(fisher_exact([[k_a, n_a - k_a], [k_b, n_b - k_b]], alternative="two-sided").pvalue)


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values of a family of tests, in the order given.

    The i-th smallest of ``m`` p-values is multiplied by ``m - i`` (i from 0), then made
    monotone (never below an adjusted smaller p) and capped at 1 (Holm 1979, Scandinavian
    Journal of Statistics 6:65-70). Rejecting every hypothesis whose adjusted p is below
    ``alpha`` controls the family-wise error rate at ``alpha``.

    Args:
        p_values: p-values, each in [0, 1].

    Returns:
        The adjusted p-values, one per input, in the input's order.

    Raises:
        ValueError: a p-value that is not a number in [0, 1] (named with its position).
    """
    values = list(p_values)
    for i, p in enumerate(values):
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ValueError(f"holm_adjust p-value {i} must be a number in [0, 1], got {p!r}")
    m = len(values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(sorted(range(m), key=lambda i: values[i])):
        running = max(running, min(1.0, (m - rank) * values[index]))
        adjusted[index] = running
    return adjusted


__all__ = ["fisher_exact_p", "holm_adjust", "newcombe_interval", "wilson_interval"]
