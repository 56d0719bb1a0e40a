"""Convergence diagnostics (R-hat, ESS, between-chain share) and the jackknife error of the BIF."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from interp_toolkit.analyses.bif import BIFResult, CoMoments, Draws, SamplerConfig, bif, compute_bif
from interp_toolkit.analyses.bif.diagnostics import (
    RHAT_MAX,
    between_chain_share,
    convergence_diagnostics,
    ess_bulk,
    ess_tail,
    split_rhat,
    tracked_indices,
)
from interp_toolkit.analyses.bif.estimator import estimate_from_moments
from interp_toolkit.errors import UserError
from tests.analyses.bif.test_bif import X_QUERY, X_TRAIN, Quadratic, quadratic_loss

torch.set_num_threads(1)


def _arviz():
    with warnings.catch_warnings():  # ArviZ 0.23 announces its refactor on import
        warnings.simplefilter("ignore")
        import arviz

    return arviz


def test_rhat_and_ess_match_arviz_on_correlated_and_shifted_chains():
    az = _arviz()
    rng = np.random.default_rng(3)
    white = rng.normal(size=(4, 300))
    walk = np.cumsum(rng.normal(size=(4, 300)), 1) * 0.1 + rng.normal(size=(4, 300))
    shifted = rng.normal(size=(4, 300)) + np.array([[0.0], [0.0], [2.0], [0.0]])
    ties = np.round(rng.normal(size=(3, 101)), 1)  # odd draws (split drops the middle), tied ranks
    for x in (white, walk, shifted, ties):
        assert split_rhat(x) == pytest.approx(float(az.rhat(x, method="rank")), abs=1e-6)
        assert ess_bulk(x) == pytest.approx(float(az.ess(x, method="bulk")), abs=1e-6)
        assert ess_tail(x) == pytest.approx(float(az.ess(x, method="tail")), abs=1e-6)
    assert split_rhat(shifted) > 1.1 and split_rhat(white) < RHAT_MAX


def test_converged_conjugate_gaussian_passes_and_matches_arviz_on_the_stored_draws():
    # the quadratic model's posterior is Gaussian (conjugate); short autocorrelation: eps P / 2 ~ 0.05
    # (only w is sampled: the model's frozen parameter feels gamma alone and mixes in ~400 steps)
    config = SamplerConfig(eps=5e-3, gamma=1.0, n_beta=20.0, chains=4, draws=400, burn_in=200,
                           steps_between_draws=8, seed=1, keep_draws=True, progress=False, param_patterns=("w",))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a converged run must not warn
        result = bif(Quadratic(), X_TRAIN, X_QUERY, quadratic_loss, config)
    conv = result.convergence
    assert conv.converged and not conv.warnings
    assert conv.max_rhat < RHAT_MAX and conv.min_ess_bulk >= 100 and conv.min_ess_tail >= 100
    assert conv.rows == list(range(6)) and conv.cols == list(range(4))
    az = _arviz()
    a, b = result.draws.attribution.double(), result.draws.observables.double()
    ca, cb = a - a.reshape(-1, 6).mean(0), b - b.reshape(-1, 4).mean(0)
    for i, j in ((0, 0), (3, 2), (5, 3)):
        product = (ca[..., i] * cb[..., j]).numpy()
        assert float(conv.rhat[i, j]) == pytest.approx(float(az.rhat(product, method="rank")), abs=1e-6)
        assert float(conv.ess_bulk[i, j]) == pytest.approx(float(az.ess(product, method="bulk")), abs=1e-6)
        assert float(conv.ess_tail[i, j]) == pytest.approx(float(az.ess(product, method="tail")), abs=1e-6)
    mean_loss = a.mean(-1).numpy()
    assert conv.scalars["mean attribution loss"]["ess_bulk"] == pytest.approx(
        float(az.ess(mean_loss, method="bulk")), abs=1e-6)
    # the sampler's distance from w* is traced at every step and levels off (localized)
    distance = result.diagnostics.distance_trace
    assert distance.shape == (4, config.total_steps) and float(distance[:, 0].abs().max()) == 0.0
    assert float(distance[:, -1000:].mean()) == pytest.approx(float(distance[:, -2000:-1000].mean()), rel=0.2)


def test_two_chains_at_different_modes_fail_rhat_and_name_the_settings():
    # planted: chains stuck at different places (two at the modes of a bimodal posterior,
    # two in between); with only 2 chains a leave-one-chain-out jackknife is the per-chain spread
    gen = torch.Generator().manual_seed(0)
    offset = torch.tensor([-1.5, 1.5, 0.4, -0.3], dtype=torch.float64)[:, None, None]
    a = torch.randn(4, 300, 3, generator=gen, dtype=torch.float64) * 0.3 + offset
    b = a[..., :2] * 2 + torch.randn(4, 300, 2, generator=gen, dtype=torch.float64) * 0.1
    result = compute_bif(Draws(a, b))
    conv = result.convergence
    assert not conv.converged and conv.max_rhat > 1.5
    assert any("R-hat" in w and "eps" in w and "draws" in w for w in conv.warnings)
    # the pooled estimate is mostly between-chain covariance: the chains' own estimates are small
    assert float(np.nanmin(conv.between_chain_share.numpy())) > 0.8
    # ... which the jackknife sees and the per-chain spread does not
    assert bool((result.stderr > 5 * result.per_chain_stderr).all())


def test_far_too_few_steps_warn_and_flag_the_result():
    config = SamplerConfig(eps=1e-5, gamma=1.0, n_beta=20.0, chains=3, draws=30, burn_in=0,
                           steps_between_draws=1, progress=False)
    with pytest.warns(UserWarning, match="BIF not converged.*calibrate"):
        result = bif(Quadratic(), X_TRAIN, X_QUERY, quadratic_loss, config)
    assert not result.convergence.converged
    assert result.convergence.min_ess_bulk < 100


def test_between_chain_share_is_the_pooled_minus_the_chains_own():
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(3, 50, 4, generator=gen, dtype=torch.float64)
    b = torch.randn(3, 50, 2, generator=gen, dtype=torch.float64) + a[..., :2]
    a[1] += 1.0
    b[1] += 0.5
    result = compute_bif(Draws(a, b))
    share = between_chain_share(result.bif, result.per_chain)
    between = -torch.einsum("ci,cj->ij", a.mean(1) - a.mean((0, 1)), b.mean(1) - b.mean((0, 1))) / 3
    torch.testing.assert_close(share * result.bif, between)
    torch.testing.assert_close(result.convergence.between_chain_share, share)


def test_pearson_jackknife_leaves_one_chain_out_of_the_correlation():
    gen = torch.Generator().manual_seed(4)
    a = torch.randn(4, 40, 3, generator=gen, dtype=torch.float64)
    b = torch.randn(4, 40, 2, generator=gen, dtype=torch.float64) + 0.5 * a[..., :2]
    storage = torch.zeros(4, 3, 2, dtype=torch.float64)
    accs = {}
    for c in range(4):
        accs[(c, 0)] = CoMoments(3, 2, out=storage[c])
        accs[(c, 0)].update_batch(a[c], b[c])
    estimate = estimate_from_moments(accs, 4, True, False, per_chain_out=storage)

    def corr(keep):
        x, y = a[keep].reshape(-1, 3), b[keep].reshape(-1, 2)
        x, y = x - x.mean(0), y - y.mean(0)
        return -(x.T @ y) / torch.outer(x.norm(dim=0), y.norm(dim=0))

    loo = torch.stack([corr([c for c in range(4) if c != k]) for k in range(4)])
    torch.testing.assert_close(estimate.bif, corr([0, 1, 2, 3]))
    torch.testing.assert_close(estimate.stderr, ((loo - loo.mean(0)).pow(2).sum(0) * 3 / 4).sqrt())


def test_convergence_and_errors_survive_save_and_load(tmp_path):
    config = SamplerConfig(eps=5e-3, gamma=1.0, n_beta=20.0, chains=2, draws=20, burn_in=5, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 2 x 20 draws: not converged, and it says so
        result = bif(Quadratic(), X_TRAIN, X_QUERY, quadratic_loss, config, cache_dir=tmp_path)
    loaded = BIFResult.load(tmp_path / f"bif_{result.cache_key}")
    torch.testing.assert_close(loaded.per_chain_stderr, result.per_chain_stderr)
    torch.testing.assert_close(loaded.convergence.rhat, result.convergence.rhat, equal_nan=True)
    torch.testing.assert_close(loaded.diagnostics.distance_trace, result.diagnostics.distance_trace)
    assert loaded.convergence.summary() == result.convergence.summary()
    assert loaded.convergence.summary()["converged"] is False


def test_tracked_indices_are_all_or_evenly_spaced():
    assert tracked_indices(5) == [0, 1, 2, 3, 4]
    picked = tracked_indices(1000)
    assert len(picked) == 16 and picked[0] == 0 and picked[-1] == 999


def test_convergence_needs_two_chains_for_rhat():
    a = torch.randn(1, 100, 2, dtype=torch.float64)
    conv = convergence_diagnostics(a, a, [0, 1], [0, 1])
    assert not conv.converged and any(">= 2 chains" in w for w in conv.warnings)


def test_calibration_recommends_a_converged_setting_at_the_base_posterior_and_refuses_bad_grids():
    from interp_toolkit.analyses.bif import calibrate_sampler, plot_calibration

    base = SamplerConfig(eps=1e-5, gamma=1.0, n_beta=20.0, chains=4, draws=400, burn_in=200,
                         steps_between_draws=8, seed=1, progress=False, param_patterns=("w",))
    with pytest.raises(UserError, match="eps must be a non-empty list"):
        calibrate_sampler(Quadratic(), X_TRAIN, X_QUERY, quadratic_loss, base, eps=[0.0])
    # eps 1e-5 barely moves in 3,400 steps; 5e-3 mixes (as in the converged test above); 2.0 diverges
    calibration = calibrate_sampler(Quadratic(), X_TRAIN, X_QUERY, quadratic_loss, base, eps=[1e-5, 5e-3, 2.0],
                                    gamma=[1.0, 50.0])
    by_setting = {(r.eps, r.gamma): r for r in calibration.rows}
    assert by_setting[(2.0, 1.0)].diverged and by_setting[(2.0, 50.0)].diverged
    assert not by_setting[(1e-5, 1.0)].converged
    best = calibration.rows[calibration.recommended]
    assert (best.eps, best.gamma) == (5e-3, 1.0) and best.converged
    assert "converged" in calibration.reason and "NOTE" not in calibration.reason
    assert calibration.to_dict()["recommended_setting"] == {"eps": 5e-3, "gamma": 1.0, "n_beta": 20.0}
    assert len(plot_calibration(calibration).axes) == 2
