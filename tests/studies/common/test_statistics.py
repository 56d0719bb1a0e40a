"""Wilson, Newcombe and Fisher against published tables and scipy; Holm's correction; Welch's
interval and the permutation test against scipy and a brute-force count."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import binomtest, fisher_exact, permutation_test, ttest_ind

from interp_toolkit.errors import UserError
from interp_toolkit.studies.common.statistics import (
    EXACT_PERMUTATIONS,
    fisher_exact_p,
    holm_adjust,
    newcombe_interval,
    permutation_p,
    welch_interval,
    wilson_interval,
)


def _holm_rejects(p_values, alpha):
    """Holm's step-down procedure as the paper states it: walk the sorted p-values, reject
    while p_(i) <= alpha / (m - i), stop at the first that is not."""
    m = len(p_values)
    rejected = set()
    for rank, index in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        if p_values[index] > alpha / (m - rank):
            break
        rejected.add(index)
    return rejected


def test_holm_adjusted_p_values_by_hand():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> kept at 0.06
    assert holm_adjust([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm_adjust([0.6, 0.9]) == [1.0, 1.0]  # capped at 1
    assert holm_adjust([]) == []


@pytest.mark.parametrize("p_values", [[0.001, 0.02, 0.03, 0.2, 0.04], [0.05, 0.05, 0.01], [0.5, 0.0125, 0.0126, 0.3]])
def test_holm_adjusted_p_values_reject_what_the_step_down_procedure_rejects(p_values):
    adjusted = holm_adjust(p_values)
    for alpha in (0.01, 0.025, 0.05, 0.1):
        assert {i for i, p in enumerate(adjusted) if p <= alpha} == _holm_rejects(p_values, alpha)
    for a, b in itertools.combinations(range(len(p_values)), 2):  # order-preserving
        if p_values[a] <= p_values[b]:
            assert adjusted[a] <= adjusted[b]


@pytest.mark.parametrize("bad", [[0.1, 1.5], [-0.1], [True], ["0.1"]])
def test_holm_adjust_names_a_bad_p_value(bad):
    with pytest.raises(UserError, match="p-value"):
        holm_adjust(bad)


@pytest.mark.parametrize("k, n", [(0, 5), (2, 5), (5, 5), (7, 30), (1, 1)])
def test_wilson_matches_scipy(k, n):
    ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    low, high = wilson_interval(k, n)
    assert low == pytest.approx(ref.low, abs=1e-9) and high == pytest.approx(ref.high, abs=1e-9)


def test_wilson_bounds_are_exact_at_zero_and_all():
    """k = 0 gives a lower bound of exactly 0 and k = n an upper bound of exactly 1 (at n = 7,
    float rounding once gave 1e-17 > 0, a negative error bar that crashed the rate plot)."""
    for n in range(1, 300):
        assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0
        low, high = wilson_interval(0, n)
        assert low <= 0.0 <= high


def test_wilson_validates():
    with pytest.raises(UserError, match="n >= 1"):
        wilson_interval(0, 0)
    with pytest.raises(UserError, match=r"\[0, 3\]"):
        wilson_interval(4, 3)


# Newcombe (1998), Statistics in Medicine 17:873-890, Table II, method 10 (score interval
# without continuity correction), to 4 decimals.
NEWCOMBE_TABLE_II = [
    ((56, 70, 48, 80), (0.0524, 0.3339)),
    ((9, 10, 3, 10), (0.1705, 0.8090)),
    ((6, 7, 2, 7), (0.0582, 0.8062)),
    ((5, 56, 0, 29), (-0.0381, 0.1926)),
    ((0, 10, 0, 20), (-0.1611, 0.2775)),
    ((0, 10, 0, 10), (-0.2775, 0.2775)),
    ((10, 10, 0, 20), (0.6791, 1.0000)),
    ((10, 10, 0, 10), (0.6075, 1.0000)),
]


@pytest.mark.parametrize("counts, interval", NEWCOMBE_TABLE_II)
def test_newcombe_matches_published_table(counts, interval):
    diff, low, high = newcombe_interval(*counts)
    k_a, n_a, k_b, n_b = counts
    assert diff == pytest.approx(k_a / n_a - k_b / n_b)
    assert (low, high) == pytest.approx(interval, abs=6e-5)


def _fisher_two_sided_by_hand(k_a, n_a, k_b, n_b):
    # hypergeometric tables with the same margins, at most as likely as the observed one
    total_k, total = k_a + k_b, n_a + n_b

    def prob(x):
        return math.comb(n_a, x) * math.comb(n_b, total_k - x) / math.comb(total, total_k)

    observed = prob(k_a)
    lo, hi = max(0, total_k - n_b), min(n_a, total_k)
    return sum(prob(x) for x in range(lo, hi + 1) if prob(x) <= observed * (1 + 1e-7))


@pytest.mark.parametrize("counts", [(3, 4, 1, 4), (10, 16, 2, 16), (0, 8, 8, 8), (5, 9, 5, 9), (13, 16, 0, 16)])
def test_fisher_matches_scipy_and_hand_count(counts):
    p = fisher_exact_p(*counts)
    k_a, n_a, k_b, n_b = counts
    assert p == pytest.approx(fisher_exact([[k_a, n_a - k_a], [k_b, n_b - k_b]]).pvalue, rel=1e-12)
    assert p == pytest.approx(_fisher_two_sided_by_hand(*counts), rel=1e-9)


def test_fisher_tea_tasting():
    assert fisher_exact_p(3, 4, 1, 4) == pytest.approx(17 / 35)  # Fisher's lady tasting tea


# ----------------------------------------------------------------------------- Welch, permutation

SAMPLES = [([1.0, 2.0, 3.5], [0.0, 0.5, 1.0, 0.2]),
           ([-0.99, -0.98, -0.97, -0.99, -0.95], [-0.2, 0.1, -0.5, -0.96]),
           ([8.1, 9.4, 7.7, 8.8, 9.0, 8.5], [8.0, 9.1, 8.6, 7.9, 9.3, 8.4])]


@pytest.mark.parametrize("a, b", SAMPLES)
@pytest.mark.parametrize("level", [0.95, 0.9])
def test_welch_interval_matches_scipy(a, b, level):
    diff, low, high = welch_interval(a, b, level)
    ci = ttest_ind(a, b, equal_var=False).confidence_interval(confidence_level=level)
    assert diff == pytest.approx(np.mean(a) - np.mean(b))
    assert (low, high) == pytest.approx((ci.low, ci.high), rel=1e-9)


def test_welch_interval_without_spread_is_the_difference():
    assert welch_interval([2.0, 2.0], [1.0, 1.0, 1.0]) == (1.0, 1.0, 1.0)


@pytest.mark.parametrize("a, b, needle", [
    ([1.0], [1.0, 2.0], "at least 2 values"),
    ([1.0, float("nan")], [1.0, 2.0], "value 1 must be a finite number"),
    ([1.0, 2.0], [1.0, "x"], "value 1 must be a finite number"),
])
def test_welch_and_permutation_name_bad_samples(a, b, needle):
    for fn in (welch_interval, permutation_p):
        with pytest.raises(UserError, match=needle):
            fn(a, b)
    with pytest.raises(UserError, match="level must be in"):
        welch_interval([1.0, 2.0], [1.0, 2.0], 1.0)


def _brute_force_p(a, b):
    """Every assignment of the pooled values to group a, counted by hand."""
    pooled, n_a = list(a) + list(b), len(a)
    observed = abs(np.mean(a) - np.mean(b))
    hits = total = 0
    for idx in itertools.combinations(range(len(pooled)), n_a):
        rest = [v for i, v in enumerate(pooled) if i not in idx]
        hits += abs(np.mean([pooled[i] for i in idx]) - np.mean(rest)) >= observed - 1e-12
        total += 1
    return hits / total


@pytest.mark.parametrize("a, b", SAMPLES)
def test_exact_permutation_p_matches_a_brute_force_count(a, b):
    assert permutation_p(a, b)[0] == pytest.approx(_brute_force_p(a, b))


# not SAMPLES[2]: its subset sums tie in exact arithmetic, and scipy's tie tolerance (relative
# to the observed difference) splits some of those ties
@pytest.mark.parametrize("a, b", SAMPLES[:2])
def test_exact_permutation_p_matches_scipy(a, b):
    p, _ = permutation_p(a, b)
    reference = permutation_test((a, b), lambda x, y, axis: np.abs(np.mean(x, axis=axis) - np.mean(y, axis=axis)),
                                 permutation_type="independent", alternative="greater", n_resamples=np.inf,
                                 vectorized=True)
    assert p == pytest.approx(reference.pvalue)


@pytest.mark.parametrize("n_a, n_b, smallest", [(3, 4, 1 / 35), (3, 3, 2 / 20), (5, 5, 2 / 252), (2, 2, 1.0 * 2 / 6)])
def test_smallest_p_is_reached_by_fully_separated_groups(n_a, n_b, smallest):
    a, b = [10.0 + i for i in range(n_a)], [float(i) / 10 for i in range(n_b)]
    p, floor = permutation_p(a, b)
    assert floor == pytest.approx(smallest)
    assert p == pytest.approx(smallest)


def test_sampled_permutation_p_is_close_to_exact_and_never_zero():
    rng = np.random.default_rng(1)
    a, b = list(rng.normal(0.4, 1, 12)), list(rng.normal(0, 1, 11))
    assert math.comb(23, 12) > EXACT_PERMUTATIONS  # so the sampled branch runs
    p, floor = permutation_p(a, b, n_resamples=4000, seed=3)
    reference = permutation_test((a, b), lambda x, y, axis: np.abs(np.mean(x, axis=axis) - np.mean(y, axis=axis)),
                                 permutation_type="independent", alternative="greater", n_resamples=20000,
                                 vectorized=True, random_state=0).pvalue
    assert abs(p - reference) < 0.03
    assert floor == pytest.approx(1 / 4001)
    separated, _ = permutation_p([100.0 + i for i in range(12)], [float(i) for i in range(11)], n_resamples=500)
    assert separated == pytest.approx(1 / 501)


def test_combined_p_is_fishers_method_by_hand():
    from scipy.stats import chi2

    from interp_toolkit.studies.common.statistics import combined_p

    # three causal-window p-values: X = -2 (ln 0.06 + ln 0.52 + ln 0.07) = 12.253, 6 degrees of
    # freedom: exp(-6.1266) (1 + 6.1266 + 6.1266^2 / 2) = 0.0566
    assert combined_p([0.06, 0.52, 0.07]) == pytest.approx(0.05660, abs=5e-5)
    x = -2 * sum(math.log(p) for p in (0.06, 0.52, 0.07))
    assert combined_p([0.06, 0.52, 0.07]) == pytest.approx(float(chi2.sf(x, 6)), rel=1e-12)
    assert combined_p([0.3]) == pytest.approx(0.3)  # one test: its own p
    assert combined_p([1.0, 1.0]) == 1.0
    assert combined_p([0.01] * 6) < 1e-6 < combined_p([0.5] * 6)


@pytest.mark.parametrize("bad", [[], [0.0], [1.5], [0.2, -0.1]])
def test_combined_p_names_bad_input(bad):
    from interp_toolkit.studies.common.statistics import combined_p

    with pytest.raises(UserError, match="p-value"):
        combined_p(bad)
