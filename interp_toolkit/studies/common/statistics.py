"""Statistics of generalization rates: Wilson intervals of one rate, Newcombe intervals and
Fisher exact tests of two, and Holm's correction of a family of p-values; and of a quantity
measured once per run in two groups of runs: Welch's interval of the difference of their
means and the two-sample permutation test.
"""

from __future__ import annotations

import math
from typing import Sequence

from interp_toolkit.errors import UserError


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
        raise UserError(f"wilson_interval needs n >= 1 trials, got {n!r}")
    if isinstance(successes, bool) or not isinstance(successes, int) or not 0 <= successes <= n:
        raise UserError(f"wilson_interval successes must be an integer in [0, {n}], got {successes!r}")
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
            raise UserError(f"holm_adjust p-value {i} must be a number in [0, 1], got {p!r}")
    m = len(values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(sorted(range(m), key=lambda i: values[i])):
        running = max(running, min(1.0, (m - rank) * values[index]))
        adjusted[index] = running
    return adjusted


def _finite_sample(name: str, values: Sequence[float]) -> list[float]:
    sample = list(values)
    for i, v in enumerate(sample):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise UserError(f"{name} value {i} must be a finite number, got {v!r}")
    if len(sample) < 2:
        raise UserError(f"{name} needs at least 2 values (a spread), got {len(sample)}")
    return sample


def welch_interval(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Difference of two means, ``mean(a) - mean(b)``, with Welch's t interval.

    Welch (1947, Biometrika 34:28-35): standard error ``sqrt(s_a^2/n_a + s_b^2/n_b)`` from the
    two sample variances, unequal variances allowed, and Welch-Satterthwaite degrees of
    freedom. When both samples have no spread the interval is the difference itself.

    Args:
        a: One group's values (>= 2, finite).
        b: The other group's values (>= 2, finite).
        level: Coverage of the interval, in (0, 1).

    Returns:
        ``(difference, low, high)``.

    Raises:
        ValueError: a group with fewer than 2 values, a value that is not finite, or a level
            outside (0, 1).
    """
    from scipy.stats import t as student_t

    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0.0 < level < 1.0:
        raise UserError(f"welch_interval level must be in (0, 1), got {level!r}")
    xa, xb = _finite_sample("welch_interval a", a), _finite_sample("welch_interval b", b)
    n_a, n_b = len(xa), len(xb)
    mean_a, mean_b = sum(xa) / n_a, sum(xb) / n_b
    var_a = sum((x - mean_a) ** 2 for x in xa) / (n_a - 1)
    var_b = sum((x - mean_b) ** 2 for x in xb) / (n_b - 1)
    diff = mean_a - mean_b
    se2 = var_a / n_a + var_b / n_b
    if se2 == 0:
        return diff, diff, diff
    df = se2 ** 2 / ((var_a / n_a) ** 2 / (n_a - 1) + (var_b / n_b) ** 2 / (n_b - 1))
    half = float(student_t.ppf(0.5 + level / 2, df)) * math.sqrt(se2)
    return diff, diff - half, diff + half


#: Above this many relabellings :func:`permutation_p` samples them instead of listing them all.
EXACT_PERMUTATIONS = 100_000


def permutation_p(a: Sequence[float], b: Sequence[float], n_resamples: int = 20_000,
                  seed: int = 0) -> tuple[float, float]:
    """Two-sided permutation test of ``mean(a) - mean(b)``, and the smallest p it can give.

    Every way of relabelling the pooled values into groups of ``len(a)`` and ``len(b)`` is
    listed when there are at most :data:`EXACT_PERMUTATIONS` of them (exact), else
    ``n_resamples`` random relabellings are drawn (seeded; p then counts the observed one
    too, so it is never 0). p is the fraction of relabellings whose difference of means is at
    least as far from 0 as the observed one. No distribution is assumed, so with few runs
    it is honest about how little they can show: with 3 runs against 4 the exact test can never
    go below 1/35 = 0.029, with 3 against 3 never below 2/20 = 0.1.

    Args:
        a: One group's values (>= 2, finite).
        b: The other group's values (>= 2, finite).
        n_resamples: Relabellings drawn when the exact list is too long.
        seed: Seed of those draws.

    Returns:
        ``(p, smallest_p)``: the p-value, and the smallest p-value any data could give with
        these group sizes: exact, ``1 / C(n_a + n_b, n_a)`` (``2 / ...`` for equal sizes,
        where a relabelling and its mirror image always tie); sampled, ``1 / (n_resamples + 1)``.
    """
    import itertools

    import numpy as np

    xa, xb = _finite_sample("permutation_p a", a), _finite_sample("permutation_p b", b)
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, int) or n_resamples < 1:
        raise UserError(f"permutation_p n_resamples must be a positive integer, got {n_resamples!r}")
    pooled = np.asarray(xa + xb, dtype=float)
    n_a, n = len(xa), len(xa) + len(xb)
    total = pooled.sum()
    observed = abs(float(np.mean(xa) - np.mean(xb)))
    tolerance = 1e-12 * max(1.0, float(np.abs(pooled).max()))
    count = math.comb(n, n_a)
    if count <= EXACT_PERMUTATIONS:
        sums = np.fromiter((pooled[list(idx)].sum() for idx in itertools.combinations(range(n), n_a)),
                           dtype=float, count=count)
        diffs = np.abs(sums / n_a - (total - sums) / (n - n_a))
        p = float(np.mean(diffs >= observed - tolerance))
        # the observed labelling always counts; its mirror image (groups swapped) gives the
        # same |difference| only when the groups are of equal size
        smallest = min(1.0, (2 if 2 * n_a == n else 1) / count)
        return p, smallest
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(n_resamples):
        chosen = rng.permutation(n)[:n_a]
        s = pooled[chosen].sum()
        hits += abs(s / n_a - (total - s) / (n - n_a)) >= observed - tolerance
    return (hits + 1) / (n_resamples + 1), min(1.0, 1 / (n_resamples + 1))


def combined_p(p_values: Sequence[float]) -> float:
    """Fisher's method: one p for "some of these independent tests' nulls are false", from
    ``X = -2 sum(ln p_i)``, which is chi-squared with ``2k`` degrees of freedom under the
    joint null (closed form for even degrees of freedom: ``exp(-X/2) sum_{i<k} (X/2)^i / i!``).

    Permutation p-values (at least ``1 / (resamples + 1)``) make it slightly conservative.

    Raises:
        ValueError: No p-values, or one outside (0, 1].
    """
    values = [float(p) for p in p_values]
    if not values:
        raise UserError("combined_p needs at least one p-value")
    bad = [p for p in values if not (0.0 < p <= 1.0)]
    if bad:
        raise UserError(f"p-values must be in (0, 1], got {bad}")
    half = -sum(math.log(p) for p in values)  # X / 2
    term, total = 1.0, 1.0
    for i in range(1, len(values)):
        term *= half / i
        total += term
    return min(1.0, math.exp(-half) * total)


__all__ = ["EXACT_PERMUTATIONS", "combined_p", "fisher_exact_p", "holm_adjust", "newcombe_interval", "permutation_p",
           "welch_interval", "wilson_interval"]
