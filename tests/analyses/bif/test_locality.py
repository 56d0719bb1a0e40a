"""The locality gate (analyses.bif.locality) and the per-checkpoint gamma (analyses.bif.localize),
on a model whose basin is known by construction."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from interp_toolkit.analyses.bif import SamplerConfig, bif
from interp_toolkit.analyses.bif.config import LocalizeConfig
from interp_toolkit.analyses.bif.locality import (
    CLIMB_MAX,
    Locality,
    label_marginal_loss,
    measure_locality,
    sampling_verdict,
    unigram_loss,
)
from interp_toolkit.analyses.bif.localize import (
    EPS_GAMMA,
    EPS_STIFF,
    local_gamma,
    localized_sampler,
    top_curvature,
)
from interp_toolkit.errors import UserError

D, RADIUS = 200, 0.5
CHANCE = math.log(2.0)


class Basin(nn.Module):
    """Solves its task exactly inside the ball ``||w|| < RADIUS``: every example's margin is
    ``8 (1 - ||w||^2 / RADIUS^2) + a_i . w``, so the solution is gone (accuracy ~50%, loss
    above chance) once the draws leave the ball. ``w* = 0``."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(D))

    def margins(self, a: torch.Tensor) -> torch.Tensor:
        return 8.0 * (1 - self.w.pow(2).sum() / RADIUS**2) + a @ self.w


A = 0.1 * torch.randn(256, D, generator=torch.Generator().manual_seed(0))


def loss_fn(model: Basin, a: torch.Tensor) -> torch.Tensor:
    return F.softplus(-model.margins(a))


def correct(model: Basin, a: torch.Tensor) -> torch.Tensor:
    return (model.margins(a) > 0).float()


def run(config: SamplerConfig, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return bif(Basin(), A, A[:8], loss_fn, config, reference_loss=CHANCE, reference="chance",
                   accuracy_fn=correct, **kwargs)


# the old `bif` defaults' posterior (gamma 100, eps 1e-3, n_beta n / log n), chains long enough to converge
OLD = SamplerConfig(eps=1e-3, gamma=100.0, chains=4, draws=200, burn_in=100, steps_between_draws=2, progress=False)
LONG = dict(chains=4, draws=600, burn_in=200, steps_between_draws=10, progress=False)


def test_old_defaults_are_converged_but_not_local():
    result = run(OLD)
    assert result.convergence.converged
    assert not result.locality.local
    assert result.verdict == "converged, not local"
    assert result.locality.worst_climb > 1.0  # above chance: the solution is gone
    assert result.locality.draw_accuracy is not None and max(result.locality.draw_accuracy) < 0.8
    assert result.locality.checkpoint_accuracy == 1.0
    assert "loss climb" in result.locality.failed[0] and "at most 10%" in result.locality.failed[0]


def test_derived_gamma_is_converged_and_local():
    found = local_gamma(Basin(), A, loss_fn, reference_loss=CHANCE, reference="chance")
    assert found.found and found.climbs[found.gamma] <= found.target
    # the ladder stops at the first gamma that is local: the one below it was not
    smaller = [g for g in found.climbs if g < found.gamma]
    assert smaller and found.climbs[max(smaller)] > found.target
    assert found.eps == pytest.approx(EPS_GAMMA / found.gamma)
    config = localized_sampler(SamplerConfig(**LONG), found)
    assert (config.gamma, config.eps) == (found.gamma, found.eps)
    result = run(config)
    assert result.verdict == "converged and local", (result.convergence.warnings, result.locality.describe())
    assert result.locality.worst_climb < CLIMB_MAX
    assert min(result.locality.draw_accuracy) > 0.99


def test_gate_numbers_equal_a_recomputation_from_kept_draws():
    # full batch: every draw's posterior loss is the mean of its kept per-example training losses
    config = SamplerConfig(eps=1e-4, gamma=1000.0, chains=3, draws=30, burn_in=10, keep_draws=True, progress=False)
    result = run(config, observables={"w": lambda m: m.w.detach().clone()})
    draws = result.draws
    assert draws is not None
    draw_loss = draws.attribution.double().mean(-1)  # [chains, draws]
    assert torch.allclose(draw_loss, result.diagnostics.draw_loss, rtol=1e-6, atol=1e-9)
    checkpoint = float(loss_fn(Basin(), A).detach().mean())
    climb = (draw_loss.mean(1) - checkpoint) / (CHANCE - checkpoint)
    assert result.locality.climb == pytest.approx(climb.tolist(), rel=1e-6, abs=1e-9)
    start, stop = draws.observable_slices["w"]
    distance = draws.observables[:, :, start:stop].double().norm(dim=-1).mean(1)
    assert result.locality.distance == pytest.approx(distance.tolist(), rel=1e-6)
    assert result.locality.prior_radius == pytest.approx(math.sqrt(D / 1000.0))
    assert result.locality.n_parameters == D


def test_locality_survives_save_and_load(tmp_path):
    result = run(OLD, cache_dir=tmp_path)
    again = run(OLD, cache_dir=tmp_path)  # a cache hit: read back from the artifact
    assert again.locality is not None and again.locality.to_dict() == result.locality.to_dict()
    assert again.verdict == result.verdict == "converged, not local"
    assert torch.equal(again.diagnostics.draw_loss, result.diagnostics.draw_loss)


def test_without_a_reference_the_climb_is_unmeasured_and_never_local():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = bif(Basin(), A, A[:8], loss_fn, OLD)
    assert math.isnan(result.locality.worst_climb)
    assert not result.locality.local and "unmeasured" in result.locality.failed[0]
    assert result.verdict == "converged, not local"


def test_sampling_verdict_labels():
    local = measure_locality(torch.full((2, 5), 0.01), torch.ones(2, 5), checkpoint_loss=0.0, reference_loss=0.7,
                             reference="chance", n_parameters=10, gamma=10.0)
    far = measure_locality(torch.full((2, 5), 0.5), torch.ones(2, 5), checkpoint_loss=0.0, reference_loss=0.7,
                           reference="chance", n_parameters=10, gamma=10.0)
    assert local.local and not far.local
    assert sampling_verdict(True, local) == "converged and local"
    assert sampling_verdict(True, far) == "converged, not local"
    assert sampling_verdict(False, local) == "not converged"
    assert sampling_verdict(True, None) == "converged, not local"
    assert Locality.from_dict(far.to_dict()).to_dict() == far.to_dict()


def test_one_chain_out_of_the_basin_fails_the_gate():
    loss = torch.full((3, 4), 0.01)
    loss[2] = 0.15  # 21% of the gap, the others 1.4%: 8% together
    locality = measure_locality(loss, torch.ones(3, 4), checkpoint_loss=0.0, reference_loss=0.7, reference="chance",
                                n_parameters=4, gamma=1.0)
    assert locality.mean_climb < CLIMB_MAX < locality.worst_climb
    assert not locality.local and "chain 2" in locality.failed[0]


def test_references():
    assert label_marginal_loss(torch.tensor([0, 1, 0, 1])) == pytest.approx(math.log(2))
    assert label_marginal_loss(torch.tensor([0, 0, 0, 1])) == pytest.approx(
        -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    # unigram: the predicted tokens (after the first of each row)
    assert unigram_loss(torch.tensor([[9, 1, 2], [9, 1, 2]])) == pytest.approx(math.log(2))
    with pytest.raises(UserError, match="at least one label"):
        label_marginal_loss(torch.tensor([], dtype=torch.long))


def test_bad_input_is_refused_before_any_work():
    with pytest.raises(UserError, match=r"\[chains, draws\]"):
        measure_locality(torch.zeros(5), torch.zeros(5), checkpoint_loss=0.0, reference_loss=1.0, reference="x",
                         n_parameters=1, gamma=1.0)
    with pytest.raises(UserError, match="target"):
        LocalizeConfig(target=1.5)
    with pytest.raises(UserError, match="finite reference_loss"):
        local_gamma(Basin(), A, loss_fn, reference_loss=float("nan"))


def test_local_gamma_restores_the_weights():
    model = Basin()
    with torch.no_grad():
        model.w.fill_(0.01)
    before = model.w.detach().clone()
    local_gamma(model, A, loss_fn, reference_loss=CHANCE)
    assert torch.equal(model.w.detach(), before)


class Stiff(nn.Module):
    """Loss ``0.5 * sum_k c_k w_k^2`` (every example alike): Hessian eigenvalues ``c``."""

    def __init__(self, curvatures: torch.Tensor) -> None:
        super().__init__()
        self.c = curvatures
        self.w = nn.Parameter(torch.full_like(curvatures, 0.01))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * (self.c * self.w.pow(2)).sum() + 0.0 * x


def stiff_loss(model: Stiff, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def test_top_curvature_is_the_largest_hessian_eigenvalue():
    curvatures = torch.tensor([0.5, 3.0, 40.0, 7.0])
    model = Stiff(curvatures)
    assert top_curvature(model, torch.zeros(10), stiff_loss) == pytest.approx(40.0, rel=1e-3)
    assert torch.equal(model.w.detach(), torch.full((4,), 0.01))  # weights untouched


def test_the_step_size_allows_for_a_stiff_likelihood():
    model = Stiff(torch.tensor([0.5, 3.0, 40.0, 7.0]))
    reference = 1.0  # far above the checkpoint's ~0.004: any gamma of the ladder is local
    alone = local_gamma(model, torch.zeros(10), stiff_loss, reference_loss=reference)
    assert alone.eps == pytest.approx(EPS_GAMMA / alone.gamma) and alone.n_beta is None
    stiff = local_gamma(model, torch.zeros(10), stiff_loss, reference_loss=reference, n_beta=1e4)
    assert stiff.gamma == alone.gamma and stiff.curvature == pytest.approx(40.0, rel=1e-3)
    assert stiff.eps == pytest.approx(min(EPS_GAMMA / stiff.gamma, EPS_STIFF / (1e4 * stiff.curvature)))
    assert stiff.eps < alone.eps and "lambda_max" in stiff.describe()


def test_calibration_recommends_the_local_setting_over_a_converged_non_local_one():
    from interp_toolkit.analyses.bif import calibrate_sampler

    found = local_gamma(Basin(), A, loss_fn, reference_loss=CHANCE, reference="chance")
    base = SamplerConfig(**LONG)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        calibration = calibrate_sampler(Basin(), A, A[:8], loss_fn, base, eps=[found.eps], gamma=[100.0, found.gamma],
                                        reference_loss=CHANCE, reference="chance", accuracy_fn=correct)
    by_gamma = {row.gamma: row for row in calibration.rows}
    # gamma 100 is the looser posterior, and its draws leave the ball whatever the step size
    assert not by_gamma[100.0].local and by_gamma[100.0].climb > CLIMB_MAX
    assert by_gamma[found.gamma].local
    best = calibration.rows[calibration.recommended]
    assert best.gamma == found.gamma and best.local


def test_a_checkpoint_above_its_reference_is_localized_against_the_gates_floored_gap():
    """An untrained checkpoint (loss at or above the reference) has no solution to leave, so the
    gate measures a climb against 10% of the reference; the ladder reads that same gap instead
    of taking its smallest gamma unseen (which let an untrained LM's draws climb 20-50%)."""
    from interp_toolkit.analyses.bif.locality import GAP_FLOOR, loss_gap
    from interp_toolkit.analyses.bif.localize import GAMMA_LADDER

    checkpoint = float(loss_fn(Basin(), A).detach().mean())
    assert loss_gap(checkpoint, checkpoint / 2) == (pytest.approx(GAP_FLOOR * checkpoint / 2), True)
    assert loss_gap(0.1, 0.7) == (pytest.approx(0.6), False)
    found = local_gamma(Basin(), A, loss_fn, reference_loss=checkpoint / 2, reference="a loss below the checkpoint's")
    assert found.gamma > GAMMA_LADDER[0] and found.climbs[found.gamma] <= found.target
    assert any("learned little" in note for note in found.notes)


def test_chain_lengths_are_sized_before_any_work(tmp_path, capsys):
    """A first round beyond --max-steps and traces beyond the machine's memory are refused at
    parse time, naming the numbers (they used to start, then fail or overrun silently)."""
    from interp_toolkit.analyses.bif.adaptive import AdaptiveConfig, check_budget
    from interp_toolkit.analyses.bif.config import check_memory, trace_bytes
    from interp_toolkit.cli import main

    long = SamplerConfig(draws=10, burn_in=10, steps_between_draws=1)
    with pytest.raises(UserError, match=r"first round alone takes 20 SGLD steps .* max_steps = 5 \(--max-steps\)"):
        check_budget(long, AdaptiveConfig(max_steps=5))
    check_budget(long, AdaptiveConfig(adaptive=False, max_steps=5))  # one round asked for: no budget to exceed
    huge = SamplerConfig(draws=99_999_999_999, burn_in=10)
    assert trace_bytes(huge) > 10**13
    with pytest.raises(UserError, match=r"4 chains x 99,999,999,999 draws .* GiB"):
        check_memory(huge, available=16 * 2**30)
    check_memory(long, available=16 * 2**30)
    for argv in (["bif", str(tmp_path / "x.safetensors"), "--draws", "99999999999", "--max-steps", "100"],
                 ["bif", str(tmp_path / "x.safetensors"), "--draws", "99999999999", "--no-adaptive"]):
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("error:") == 1 and ("--max-steps" in err or "GiB" in err)
