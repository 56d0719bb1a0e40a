"""Holm's correction of a family of p-values (the rate statistics are tested in test_report.py)."""

from __future__ import annotations

import itertools

import pytest

from interp_toolkit.studies.statistics import holm_adjust


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
    with pytest.raises(ValueError, match="p-value"):
        holm_adjust(bad)
