"""Tests of the leave-one-out / causal-window validation helpers on the DLN."""

from __future__ import annotations

import math

import pytest
import torch

from interp_toolkit.analyses.bif import SamplerConfig, bif
from interp_toolkit.analyses.bif.validation import (
    batched_gradient_descent,
    causal_window_effects,
    compare_windows,
    local_continuation_effects,
    pearson,
    retrain_leave_one_out_effects,
    spearman,
)
from interp_toolkit.errors import UserError
from interp_toolkit.tasks.dln import (
    DeepLinearNetwork,
    DLNConfig,
    dln_per_example_loss,
    gradient_descent,
)
from interp_toolkit.tasks.hierarchical import living_things

torch.set_num_threads(1)
LR = 0.05
DATA = living_things()
X, Y = DATA.inputs, DATA.targets


def _model(steps: int) -> DeepLinearNetwork:
    model = DeepLinearNetwork(DLNConfig(8, 16, 30, init_scale=1e-3, seed=0))
    gradient_descent(model, X, Y, LR, steps)
    return model


def test_batched_gd_matches_autograd_gd_with_weights():
    model = _model(150)
    weights = torch.ones(8)
    weights[3] = 0.0
    W1, W2 = batched_gradient_descent(model.W1.weight[None], model.W2.weight[None], X, Y, LR, 40, weights[None])
    gradient_descent(model, X, Y, LR, 40, example_weights=weights)
    assert torch.allclose(W1[0].float(), model.W1.weight, atol=1e-5)
    assert torch.allclose(W2[0].float(), model.W2.weight, atol=1e-5)


def test_batched_and_autograd_gd_share_the_step_schedule_of_a_window():
    """Both trainers take ``c`` per step from ``weighted_steps``: a window given as a
    function of the step counter (from ``start_step``) is applied at the same steps."""
    model = _model(100)
    drop = torch.ones(8)
    drop[5] = 0.0

    def window(step: int) -> torch.Tensor:  # example 5 removed during steps 110 .. 119
        return drop if 110 <= step < 120 else torch.ones(8)

    W1, W2 = batched_gradient_descent(model.W1.weight[None], model.W2.weight[None], X, Y, LR, 30,
                                      lambda step: window(step)[None], start_step=100)
    gradient_descent(model, X, Y, LR, 30, example_weights=window, start_step=100)
    assert torch.allclose(W1[0].float(), model.W1.weight, atol=1e-5)
    assert torch.allclose(W2[0].float(), model.W2.weight, atol=1e-5)
    unwindowed = batched_gradient_descent(_model(100).W1.weight[None], _model(100).W2.weight[None], X, Y, LR, 30)
    assert not torch.allclose(unwindowed[0], W1, atol=1e-5)  # the window changed the run


def test_window_end_effect_equals_leave_one_out_from_window_start():
    start, length = 200, 30
    loo = local_continuation_effects(_model(start), X, Y, LR, length)
    windows = causal_window_effects(
        _model(0), X, Y, LR, [(start, start + length)], horizon=400, measure_at="window_end"
    )
    assert torch.allclose(windows.inclusion_effect[0], loo, atol=1e-6)
    assert local_continuation_effects(_model(start), X, Y, LR, 0).abs().max() == 0
    # Including an example lowers its own loss.
    assert (torch.diagonal(loo) < 0).all()
    with pytest.raises(UserError, match="window"):
        causal_window_effects(_model(0), X, Y, LR, [(50, 20)], horizon=100)


def test_bif_correlates_with_leave_one_out_on_dln():
    model = _model(313)
    config = SamplerConfig(eps=2e-5, gamma=100.0, n_beta=400.0, chains=4, draws=100, burn_in=100,
                           steps_between_draws=2, progress=False)
    result = bif(model, (X, Y), (X, Y), dln_per_example_loss, config)
    measured = local_continuation_effects(model, X, Y, LR, 50)
    assert pearson(result.bif, measured) > 0.4
    assert spearman(result.bif, measured) > 0.4


def test_compare_windows_peak_agreement():
    effect = torch.zeros(4, 2, 2)
    effect[2] = 1.0
    same = compare_windows(effect * 3, effect)
    assert same["peak_agreement"] == 1.0 and same["chance"] == 0.25
    shifted = compare_windows(torch.roll(effect, 1, 0), effect)
    assert shifted["peak_agreement"] == 0.0 and shifted["peak_within_one"] == 1.0


def test_spearman_averages_ties_like_scipy():
    from scipy.stats import spearmanr

    x = torch.tensor([1.0, 1.0, 1.0, 2.0, 3.0, 3.0])
    y = torch.tensor([4.0, 1.0, 2.0, 3.0, 6.0, 5.0])
    # average ranks of x: 2, 2, 2, 4, 5.5, 5.5 -> Pearson of ranks; double argsort would
    # break the ties by position instead (0.600 here vs 0.802 with averaged ranks)
    rx = torch.tensor([2.0, 2.0, 2.0, 4.0, 5.5, 5.5])
    ry = torch.tensor([4.0, 1.0, 2.0, 3.0, 6.0, 5.0])
    expected = float(torch.corrcoef(torch.stack([rx, ry]))[0, 1])
    assert spearman(x, y) == pytest.approx(expected)
    assert spearman(x, y) == pytest.approx(spearmanr(x.numpy(), y.numpy()).statistic)
    assert math.isnan(spearman(torch.ones(5), torch.arange(5.0)))


def test_retraining_leave_one_out_equals_independent_retrain():
    steps = [300, 0, 120]
    effects = retrain_leave_one_out_effects(_model(0), X, Y, LR, steps)
    assert effects.shape == (3, 8, 8)
    assert effects[1].abs().max() == 0
    baseline = _model(120)
    for i in (0, 5):
        weights = torch.ones(8)
        weights[i] = 0.0
        without = _model(0)
        gradient_descent(without, X, Y, LR, 120, example_weights=weights)
        with torch.no_grad():
            expected = dln_per_example_loss(baseline, (X, Y)) - dln_per_example_loss(without, (X, Y))
        assert torch.allclose(effects[2, i].float(), expected, atol=1e-5)
    # Removing an item from the start raises its own loss by the end.
    assert (torch.diagonal(effects[0]) < 0).all()
    # The causal window covering the whole run is the retraining leave-one-out.
    window = causal_window_effects(_model(0), X, Y, LR, [(0, 300)], horizon=300)
    assert torch.allclose(window.inclusion_effect[0], effects[0], atol=1e-9)
    with pytest.raises(UserError, match="steps"):
        retrain_leave_one_out_effects(_model(0), X, Y, LR, [-1])
