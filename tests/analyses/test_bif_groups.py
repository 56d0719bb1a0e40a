"""Group reductions of the BIF: a planted case with a known sign, and the streamed group rows
against an independent NumPy reference on the same draws."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from interp_toolkit.analyses.bif import bif
from interp_toolkit.analyses.bif.config import SamplerConfig
from interp_toolkit.analyses.bif.groups import (
    check_groups,
    group_loss_fn,
    jackknife_reduction,
    reduce_draws,
)
from interp_toolkit.errors import UserError

torch.set_num_threads(1)


class TwoRuleModel(nn.Module):
    """Anti-shortcut examples' losses depend only on ``rule``, consistent ones only on
    ``shortcut``; the adversarial loss depends only on ``rule``. At the checkpoint
    ``rule = 0`` and every anti-shortcut target (and the adversarial one) is 1, so training on
    an anti-shortcut example moves ``rule`` towards the adversarial target: helpful, negative BIF."""

    def __init__(self) -> None:
        super().__init__()
        self.rule = nn.Parameter(torch.zeros(3))
        self.shortcut = nn.Parameter(torch.zeros(3))


def per_example_loss(model: TwoRuleModel, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    is_anti, target = batch
    rule = ((model.rule[None] - target) ** 2).sum(1)
    shortcut = ((model.shortcut[None] - target) ** 2).sum(1)
    return torch.where(is_anti, rule, shortcut)


def planted_data(n_anti: int = 8, n_consistent: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    is_anti = torch.cat([torch.ones(n_anti, dtype=torch.bool), torch.zeros(n_consistent, dtype=torch.bool)])
    target = torch.ones(n_anti + n_consistent, 3) + 0.1 * torch.randn(n_anti + n_consistent, 3, generator=gen)
    target[~is_anti] *= -1.0  # the shortcut pulls its parameters elsewhere
    return is_anti, target


def adversarial_loss(model: TwoRuleModel) -> torch.Tensor:
    return ((model.rule - 1.0) ** 2).sum().reshape(1)


def sampler(**changes) -> SamplerConfig:
    return SamplerConfig(**{"eps": 1e-3, "gamma": 50.0, "n_beta": 4.0, "chains": 4, "draws": 300, "burn_in": 100,
                            "seed": 0, "progress": False, **changes})


def test_planted_case_group_reduction_finds_the_anti_shortcut_examples_with_negative_sign():
    data = planted_data()
    groups = {"anti": data[0], "consistent": ~data[0]}
    from interp_toolkit.analyses.bif import per_example_losses

    attribution = group_loss_fn(per_example_losses(per_example_loss, data, 64), groups)
    with _no_check():
        result = bif(TwoRuleModel(), data, None, per_example_loss, sampler(), attribution_fn=attribution,
                     observables={"adv_loss": adversarial_loss})
    n = data[0].shape[0]
    anti, consistent = result.bif[n, 0], result.bif[n + 1, 0]
    anti_err, consistent_err = result.stderr[n, 0], result.stderr[n + 1, 0]
    assert anti < -5 * anti_err, (anti, anti_err)  # helpful, well beyond its error
    assert abs(consistent) < 3 * consistent_err + 1e-3 * abs(anti), (consistent, consistent_err)
    assert abs(anti) > 20 * abs(consistent)
    # the group rows are the means of the per-example rows (linearity of the covariance)
    assert torch.allclose(result.bif[:n][data[0]].mean(0), result.bif[n], rtol=1e-4, atol=1e-7)
    assert torch.allclose(result.bif[:n][~data[0]].mean(0), result.bif[n + 1], rtol=1e-4, atol=1e-6)


class _no_check:
    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("ignore")  # convergence notes are not what this test checks

    def __exit__(self, *exc):
        self._catch.__exit__(*exc)


def numpy_reference(attribution: np.ndarray, observable: np.ndarray, rows: np.ndarray,
                    cols: np.ndarray) -> tuple[float, float]:
    """Group-mean -Cov and its leave-one-chain-out jackknife, written from the definitions."""
    def estimate(a: np.ndarray, b: np.ndarray) -> float:
        a = a.reshape(-1, a.shape[-1])[:, rows].mean(1)
        b = b.reshape(-1, b.shape[-1])[:, cols].mean(1)
        return -float(np.mean((a - a.mean()) * (b - b.mean())))

    chains = attribution.shape[0]
    full = estimate(attribution, observable)
    loo = np.array([estimate(np.delete(attribution, k, 0), np.delete(observable, k, 0)) for k in range(chains)])
    return full, float(np.sqrt((chains - 1) / chains * np.sum((loo - loo.mean()) ** 2)))


def test_streamed_group_rows_match_a_numpy_reference_on_the_same_draws():
    data = planted_data(6, 10)
    groups = {"anti": data[0], "consistent": ~data[0]}
    from interp_toolkit.analyses.bif import per_example_losses

    attribution = group_loss_fn(per_example_losses(per_example_loss, data, 64), groups)
    observables = {"adv_loss": adversarial_loss, "all_loss": lambda m: per_example_loss(m, data)}
    with _no_check():
        result = bif(TwoRuleModel(), data, None, per_example_loss,
                     sampler(draws=40, burn_in=10, keep_draws=True, chains=3),
                     attribution_fn=attribution, observables=observables)
    draws = result.draws
    a, b = draws.attribution.double().numpy(), draws.observables.double().numpy()
    n = data[0].shape[0]
    for g, mask in enumerate(groups.values()):
        for col in (0, 1 + int(np.argmax(mask.numpy()))):
            bif_ref, err_ref = numpy_reference(a[..., :n], b, mask.numpy(), np.array([col]))
            assert float(result.bif[n + g, col]) == pytest.approx(bif_ref, rel=1e-4, abs=1e-9)
            assert float(result.stderr[n + g, col]) == pytest.approx(err_ref, rel=1e-3, abs=1e-9)
    # reduce_draws (used on stored draws) agrees with the reference too, for a column group
    cols = torch.zeros(b.shape[-1], dtype=torch.bool)
    cols[1:] = True
    reduced = reduce_draws(draws.attribution[..., :n], draws.observables, groups, {"all": cols})
    for name, mask in groups.items():
        bif_ref, err_ref = numpy_reference(a[..., :n], b, mask.numpy(), cols.numpy())
        assert float(reduced[(name, "all")][0]) == pytest.approx(bif_ref, rel=1e-6, abs=1e-12)
        assert float(reduced[(name, "all")][1]) == pytest.approx(err_ref, rel=1e-6, abs=1e-12)


def test_bad_groups_are_refused_by_name():
    with pytest.raises(UserError, match="'empty' is empty"):
        check_groups({"empty": torch.zeros(4, dtype=torch.bool)}, 4)
    with pytest.raises(UserError, match=r"'short' must be a boolean mask of shape \[4\]"):
        check_groups({"short": torch.ones(3, dtype=torch.bool)}, 4)
    with pytest.raises(UserError, match="at least one group"):
        check_groups({}, 4)
    assert torch.isnan(jackknife_reduction(torch.tensor([1.0])))
    assert float(jackknife_reduction(torch.tensor([1.0, 3.0]))) == pytest.approx(1.0)


def test_row_groups_give_group_means_with_the_jackknife_of_the_numpy_reference():
    data = planted_data(6, 10)
    groups = {"anti": data[0], "consistent": ~data[0]}
    observables = {"adv_loss": adversarial_loss, "all_loss": lambda m: per_example_loss(m, data)}
    with _no_check():
        result = bif(TwoRuleModel(), data, None, per_example_loss, sampler(draws=40, burn_in=10, keep_draws=True,
                     chains=3), observables=observables, row_groups=groups)
    a, b = result.draws.attribution.double().numpy(), result.draws.observables.double().numpy()
    for name, mask in groups.items():
        for observable, (start, stop) in result.observable_slices.items():
            bif_ref, err_ref = numpy_reference(a, b, mask.numpy(), np.arange(start, stop))
            value, stderr = result.group_means[name][observable]
            assert value == pytest.approx(bif_ref, rel=1e-6, abs=1e-12)
            assert stderr == pytest.approx(err_ref, rel=1e-6, abs=1e-12)
            # the same number as the mean of the group's entries (linearity)
            assert value == pytest.approx(float(result.bif[mask][:, start:stop].mean()), rel=1e-4, abs=1e-9)
    with pytest.raises(UserError, match="pearson=False"):
        bif(TwoRuleModel(), data, None, per_example_loss, sampler(pearson=True), observables=observables,
            row_groups=groups)
