"""Phases by solution, between-phase shares and their Gaussian null (issue 12 proofs)."""

from __future__ import annotations

import math

import pytest
import torch

from interp_toolkit.analyses.bif import (
    Draws,
    SamplerConfig,
    bif,
    cluster_phases,
    compute_bif,
    observable_phase_fn,
    phase_share_with_null,
    threshold_phases,
)
from interp_toolkit.errors import UserError
from interp_toolkit.studies.bif.dln import (
    DeepLinearNetwork,
    DLNConfig,
    dln_per_example_loss,
    gradient_descent,
    mode_phase_fn,
    mode_strength_observable,
    mode_strengths,
)
from interp_toolkit.tasks.hierarchical import animals_and_plants, svd_modes

torch.set_num_threads(1)


def _mixture(chains=4, draws=2000, pi_u=0.3, seed=0):
    """Two Gaussian components U/V in (a [2], b [2]) plus a phase observable that
    tells them apart (indicator + small noise)."""
    gen = torch.Generator().manual_seed(seed)
    n = chains * draws
    in_u = torch.rand(n, generator=gen, dtype=torch.float64) < pi_u
    mean_u = torch.tensor([1.0, -0.5, 2.0, 0.7], dtype=torch.float64)
    mean_v = torch.tensor([-0.2, 0.4, 0.5, -0.3], dtype=torch.float64)
    sigma = 0.3
    values = torch.where(in_u[:, None], mean_u, mean_v) + sigma * torch.randn(n, 4, generator=gen, dtype=torch.float64)
    phase_obs = in_u.double() + 0.05 * torch.randn(n, generator=gen, dtype=torch.float64)
    a = values[:, :2].reshape(chains, draws, 2)
    b = torch.cat([values[:, 2:], phase_obs[:, None]], 1).reshape(chains, draws, 3)
    draws_obj = Draws(a, b, {"query": (0, 2), "phase": (2, 3)})
    return draws_obj, in_u.reshape(chains, draws), mean_u, mean_v, sigma


def _split_on_phase(d: Draws):
    return threshold_phases(d.observables[..., 2:3], 0.5)


def test_solution_phases_recover_mixture_components_and_analytic_between():
    draws, in_u, mean_u, mean_v, sigma = _mixture()
    result = phase_share_with_null(draws, _split_on_phase, index=(0, 0), null_repeats=5, observable="query")
    assert result.between.shape == (2, 2)
    assert torch.equal(result.labels, in_u.long())  # phase 1 = component U
    n = in_u.numel()
    pi_u = float(in_u.double().mean())
    assert result.phase_ids == [0, 1]
    assert math.isclose(float(result.weights[1]), pi_u, rel_tol=1e-12)
    # Analytic between-phase term: -pi_U pi_V (mu_a^U - mu_a^V)(mu_b^U - mu_b^V).
    true_pi = 0.3
    for i in range(2):
        for j in range(2):
            da, db = float(mean_u[i] - mean_v[i]), float(mean_u[2 + j] - mean_v[2 + j])
            analytic = -true_pi * (1 - true_pi) * da * db
            # Sampling error of the estimate: from pi and from the two component means.
            se_pi = math.sqrt(true_pi * (1 - true_pi) / n) * abs((1 - 2 * true_pi) * da * db)
            se_mean = sigma * math.sqrt(1 / (n * true_pi) + 1 / (n * (1 - true_pi)))
            se = se_pi + true_pi * (1 - true_pi) * (abs(da) + abs(db)) * se_mean
            assert abs(float(result.between[i, j]) - analytic) < 4 * se, (i, j, float(result.between[i, j]), analytic)
    # Well-separated components: the split carries far more than its Gaussian null.
    assert result.share > 0.9
    assert result.share > result.null_share + 5 * result.null_std


def test_single_gaussian_null_matches_measured_share():
    gen = torch.Generator().manual_seed(1)
    chains, n_draws = 4, 1500
    mixing = torch.tensor([[1.0, 0.6, 0.5], [0.0, 0.8, 0.3], [0.0, 0.0, 0.8]], dtype=torch.float64)
    values = torch.randn(chains * n_draws, 3, generator=gen, dtype=torch.float64) @ mixing
    values = values.reshape(chains, n_draws, 3)
    draws = Draws(values[..., :1], values[..., 1:], {"query": (0, 1), "phase": (1, 2)})

    def split(d: Draws):
        return threshold_phases(d.observables[..., 1:2], 0.0)

    result = phase_share_with_null(draws, split, index=(0, 0), null_repeats=30)
    assert 0.1 < result.share < 0.9  # a sizeable between term from a unimodal posterior...
    assert abs(result.share - result.null_share) < 4 * result.null_std  # ...exactly its null


def test_two_means_split_of_a_gaussian_gives_two_over_pi():
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(4, 2000, 1, generator=gen, dtype=torch.float64)
    draws = Draws(a, a.clone())
    result = phase_share_with_null(draws, lambda d: cluster_phases(d.statistic, 2), index=(0, 0), null_repeats=10)
    assert abs(result.share - 2 / math.pi) < 0.03
    assert abs(result.null_share - 2 / math.pi) < 0.03
    assert torch.allclose(result.weights, torch.tensor([0.5, 0.5], dtype=torch.float64), atol=0.02)


def test_threshold_phases_and_bad_thresholds():
    values = torch.tensor([[0.1, 0.9], [0.6, 0.2], [0.7, 0.8]])
    assert threshold_phases(values, 0.5).tolist() == [2, 1, 3]
    assert threshold_phases(values, [0.0, 0.85]).tolist() == [3, 1, 1]
    with pytest.raises(UserError, match="3 thresholds"):
        threshold_phases(values, [0.1, 0.2, 0.3])
    with pytest.raises(UserError, match="null_repeats"):
        phase_share_with_null(_mixture(draws=10)[0], _split_on_phase, null_repeats=0)


def test_dln_mode_phase_fn_classifies_learned_modes():
    data = animals_and_plants()
    modes = svd_modes(data)
    model = DeepLinearNetwork(DLNConfig(8, 16, data.n_properties, init_scale=1e-3, seed=0))
    phase_fn = mode_phase_fn(modes)
    assert phase_fn(model) == 0
    gradient_descent(model, data.inputs, data.targets, 0.05, 3000)
    assert phase_fn(model) == 2 ** len(modes.S) - 1
    strengths = mode_strengths(model, modes)
    assert torch.allclose(mode_strength_observable(modes)(model).detach(), strengths, atol=1e-5)
    # Only the first mode, at a model that has learned just it.
    early = DeepLinearNetwork(DLNConfig(8, 16, data.n_properties, init_scale=1e-3, seed=0))
    half = modes.target_strengths / 2
    for _ in range(400):
        gradient_descent(early, data.inputs, data.targets, 0.05, 5)
        a = mode_strengths(early, modes)
        if a[0] > half[0] and a[1] < half[1]:
            break
    assert mode_phase_fn(modes, which=[0, 1])(early) == 1
    assert observable_phase_fn(mode_strength_observable(modes, [0]), float(half[0]))(early) == 1
    with pytest.raises(UserError, match="fraction"):
        mode_phase_fn(modes, fraction=1.5)


def test_streamed_mode_phases_match_stored_split():
    data = animals_and_plants()
    modes = svd_modes(data)
    model = DeepLinearNetwork(DLNConfig(8, 16, data.n_properties, init_scale=1e-3, seed=0))
    gradient_descent(model, data.inputs, data.targets, 0.05, 262)  # at the first transition
    config = SamplerConfig(eps=2e-5, gamma=100.0, n_beta=400.0, chains=2, draws=40, burn_in=50,
                           steps_between_draws=2, keep_draws=True, progress=False)
    first = [0]
    result = bif(model, (data.inputs, data.targets), (data.inputs, data.targets), dln_per_example_loss, config,
                 observables={"modes": mode_strength_observable(modes, first)},
                 phase_fn=mode_phase_fn(modes, which=first))
    start, stop = result.draws.observable_slices["modes"]
    stored = threshold_phases(result.draws.observables[..., start:stop], modes.target_strengths[first] / 2)
    assert torch.equal(stored, result.draws.phase_labels)
    again = compute_bif(result.draws, phases=stored)
    assert len(again.phases.labels) == 2  # the draws straddle the first transition
    # Streamed float32 accumulation (in blocks) agrees with float64 on the stored draws.
    assert result.bif.dtype == torch.float32 and again.bif.dtype == torch.float64
    scale = float(again.bif.abs().max())
    assert float((result.bif.double() - again.bif).abs().max()) < 1e-5 * scale
    assert float((result.phases.between.double() - again.phases.between).abs().max()) < 1e-5 * scale
