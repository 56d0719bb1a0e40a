"""Tests of the SGLD sampler and BIF estimator (analyses/bif/)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from interp_toolkit.analyses.bif import (
    BIFResult,
    CoMoments,
    Draws,
    SamplerConfig,
    SamplerDivergenceError,
    bif,
    cluster_phases,
    compute_bif,
    estimate_from_moments,
    sample_sgld,
)
from interp_toolkit.errors import UserError
from tests.helpers import assert_fields_equal

torch.set_num_threads(1)

# A quadratic model whose SGLD stationary distribution is known exactly:
# loss_i(w) = 1/2 (w - x_i)^T A (w - x_i). Full-batch SGLD on
# exp(-n_beta L_n(w) - gamma/2 |w - w*|^2) is the linear recursion
# w' = w - (eps/2) P (w - m) + N(0, eps I) with P = n_beta A + gamma I, whose stationary law is
# N(m, (P - eps P^2 / 4)^-1) (-> N(m, P^-1), the posterior, as eps -> 0).
A = torch.tensor([[2.0, 0.5, 0.0], [0.5, 1.5, 0.3], [0.0, 0.3, 1.0]], dtype=torch.float64)
X_TRAIN = torch.tensor(
    [[1.0, 0.0, 0.5], [0.0, 1.0, -0.5], [-1.0, 0.5, 0.0], [0.5, -1.0, 1.0], [0.2, 0.2, 0.2], [-0.5, -0.5, 1.5]],
    dtype=torch.float64,
)
X_QUERY = torch.tensor([[0.8, 0.1, 0.4], [-0.7, 0.6, 0.1], [0.0, -0.9, 0.9], [1.5, 1.5, -1.0]], dtype=torch.float64)
W_STAR = torch.tensor([0.3, -0.2, 0.4], dtype=torch.float64)


class Quadratic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(W_STAR.clone())
        self.frozen = nn.Parameter(torch.tensor([1.0], dtype=torch.float64))


def quadratic_loss(model: Quadratic, x: torch.Tensor) -> torch.Tensor:
    diff = model.w[None, :] - x
    return 0.5 * torch.einsum("ni,ij,nj->n", diff, A, diff) + 0.0 * model.frozen.sum()


def exact_covariance(n_beta: float, gamma: float, eps: float) -> torch.Tensor:
    P = n_beta * A + gamma * torch.eye(3, dtype=torch.float64)
    m = torch.linalg.solve(P, n_beta * A @ X_TRAIN.mean(0) + gamma * W_STAR)
    sigma = torch.linalg.inv(P - eps * P @ P / 4)
    quad = 0.5 * torch.trace(A @ sigma @ A @ sigma)
    left = (m - X_TRAIN) @ A @ sigma @ A  # [n_train, 3]
    return quad + left @ (m - X_QUERY).T


def small_config(**overrides) -> SamplerConfig:
    base = dict(eps=0.02, gamma=5.0, n_beta=10.0, chains=3, draws=40, burn_in=20, steps_between_draws=2, progress=False)
    base.update(overrides)
    return SamplerConfig(**base)


def test_gaussian_posterior_covariance_within_standard_error():
    config = small_config(chains=12, draws=200, burn_in=40, steps_between_draws=3)
    result = bif(Quadratic(), X_TRAIN, X_QUERY, quadratic_loss, config)
    exact = -exact_covariance(10.0, 5.0, 0.02)
    z = (result.bif - exact) / result.stderr
    assert torch.isfinite(z).all()
    assert z.abs().max() < 4.5, z
    assert (z**2).mean() < 3.0, z
    # The estimate is informative, not just noisy: errors are small relative to the signal.
    assert (result.bif - exact).abs().max() < 0.15 * exact.abs().max()
    # (At eps = 0.02 the chain's law differs from the eps -> 0 posterior by ~15%: the
    # comparison is against the chain's exact stationary law, which is what SE measures.)


def test_streaming_equals_batch_and_numpy():
    config = small_config(keep_draws=True)
    streamed = bif(Quadratic(), X_TRAIN, X_QUERY, quadratic_loss, config)
    batch = compute_bif(streamed.draws)
    assert torch.allclose(streamed.bif, batch.bif, atol=1e-10, rtol=1e-8)
    assert torch.allclose(streamed.stderr, batch.stderr, atol=1e-10, rtol=1e-8)
    a = streamed.draws.attribution.double().reshape(-1, 6).numpy()
    b = streamed.draws.observables.double().reshape(-1, 4).numpy()
    direct = -np.cov(np.concatenate([a, b], 1).T, bias=True)[:6, 6:]
    np.testing.assert_allclose(streamed.bif.numpy(), direct, atol=1e-10, rtol=1e-8)
    corr = compute_bif(streamed.draws, pearson=True).bif.numpy()
    direct_corr = -np.corrcoef(np.concatenate([a, b], 1).T)[:6, 6:]
    np.testing.assert_allclose(corr, direct_corr, atol=1e-10)


def test_comoments_merge_equals_sequential_updates():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(50, 4, generator=gen, dtype=torch.float64) * 3 + 10
    b = torch.randn(50, 2, generator=gen, dtype=torch.float64) - 5
    sequential = CoMoments(4, 2)
    for i in range(50):
        sequential.update(a[i], b[i])
    merged = CoMoments(4, 2)
    for chunk in range(0, 50, 7):
        merged.update_batch(a[chunk : chunk + 7], b[chunk : chunk + 7])
    direct = CoMoments.from_batch(a, b)
    for acc in (sequential, merged):
        assert acc.count == 50
        assert torch.allclose(acc.covariance(), direct.covariance(), atol=1e-12)
        assert torch.allclose(acc.m2_a, direct.m2_a, atol=1e-9)
        assert torch.allclose(acc.mean_b, direct.mean_b, atol=1e-12)


def test_phase_decomposition_adds_up_exactly():
    config = small_config(keep_draws=True, draws=60)
    result = bif(Quadratic(), X_TRAIN, X_QUERY, quadratic_loss, config)
    labels = cluster_phases(result.draws.statistic, 3)
    assert set(labels.unique().tolist()) == {0, 1, 2}
    # Labels are ordered by statistic.
    stat = result.draws.statistic
    assert stat[labels == 0].max() <= stat[labels == 1].min()
    decomposed = compute_bif(result.draws, phases=labels)
    parts = decomposed.phases
    assert torch.allclose(parts.within + parts.between, parts.total, atol=1e-12, rtol=0)
    assert torch.allclose(parts.total, result.bif, atol=1e-10)
    assert math.isclose(float(parts.weights.sum()), 1.0)
    assert not torch.allclose(parts.between, torch.zeros_like(parts.between))


def test_streaming_phase_fn_matches_stored_labels():
    calls = {"n": 0}

    def phase_of_draw(model: nn.Module) -> int:
        label = (calls["n"] // 10) % 3
        calls["n"] += 1
        return label

    config = small_config(keep_draws=True, draws=45)
    streamed = bif(Quadratic(), X_TRAIN, X_QUERY, quadratic_loss, config, phase_fn=phase_of_draw)
    labels = ((torch.arange(config.chains * config.draws) // 10) % 3).reshape(config.chains, config.draws)
    assert torch.equal(streamed.draws.phase_labels, labels)
    batch = compute_bif(streamed.draws, phases=labels)
    for name in ("within", "between", "total", "weights"):
        assert torch.allclose(getattr(streamed.phases, name), getattr(batch.phases, name), atol=1e-10), name
    assert torch.allclose(streamed.phases.within + streamed.phases.between, streamed.bif, atol=1e-12)


def _record_draws(config: SamplerConfig) -> torch.Tensor:
    values = []
    sample_sgld(Quadratic(), X_TRAIN, quadratic_loss, config, {"w": lambda m: m.w.clone()},
                lambda chain, draw, v: values.append(v["w"]))
    return torch.stack(values)


def test_same_seed_same_draws_and_model_restored():
    model = Quadratic()
    config = small_config(batch_size=4)
    first = _record_draws(config)
    second = _record_draws(config)
    assert torch.equal(first, second)
    other = _record_draws(small_config(batch_size=4, seed=1))
    assert not torch.allclose(first, other)
    sample_sgld(model, X_TRAIN, quadratic_loss, config)
    assert torch.equal(model.w.detach(), W_STAR)


def test_param_restriction_keeps_other_parameters_fixed():
    config = small_config(param_patterns=("frozen",))
    values = []
    diag = sample_sgld(Quadratic(), X_TRAIN, quadratic_loss, config, {"w": lambda m: m.w.clone()},
                       lambda c, d, v: values.append(v["w"]))
    assert diag.sampled_parameters == ["frozen"]
    assert all(torch.equal(v, W_STAR) for v in values)


@pytest.mark.parametrize(
    "field, value",
    [("eps", 0.0), ("eps", -1e-3), ("eps", float("nan")), ("gamma", -1.0), ("chains", 0), ("draws", 0),
     ("steps_between_draws", 0), ("batch_size", 0), ("n_beta", 0.0), ("divergence_factor", 1.0)],
)
def test_bad_settings_raise_clear_errors(field, value):
    with pytest.raises(UserError, match=f"SamplerConfig.{field}"):
        small_config(**{field: value})


def test_bad_usage_raises_before_work():
    with pytest.raises(UserError, match="batch_size"):
        sample_sgld(Quadratic(), X_TRAIN, quadratic_loss, small_config(batch_size=100))
    with pytest.raises(UserError, match="match no parameter"):
        sample_sgld(Quadratic(), X_TRAIN, quadratic_loss, small_config(param_patterns=("nope*",)))
    with pytest.raises(UserError, match="phases must have shape"):
        compute_bif(Draws(torch.zeros(2, 5, 3), torch.zeros(2, 5, 1)), phases=torch.zeros(2, 4, dtype=torch.long))


def test_divergence_gives_clear_error_and_restores_model():
    model = Quadratic()
    with pytest.raises(SamplerDivergenceError, match="Lower eps"):
        sample_sgld(model, X_TRAIN, quadratic_loss, small_config(eps=5.0, n_beta=1000.0))
    assert torch.equal(model.w.detach(), W_STAR)
    assert model.w.requires_grad


def test_cache_hit_and_files(tmp_path):
    config = small_config()
    first = bif(Quadratic(), X_TRAIN, X_QUERY, quadratic_loss, config, cache_dir=tmp_path)
    folder = tmp_path / f"bif_{first.cache_key}"
    assert (folder / "bif.png").stat().st_size > 0
    assert (folder / "bif.safetensors").exists()
    mtime = (folder / "bif.safetensors").stat().st_mtime_ns
    second = bif(Quadratic(), X_TRAIN, X_QUERY, quadratic_loss, config, cache_dir=tmp_path)
    assert (folder / "bif.safetensors").stat().st_mtime_ns == mtime
    assert second.diagnostics.loss_trace.shape == (config.chains, config.total_steps)
    assert_fields_equal(first, second)  # a cache hit is the fresh result, field by field
    third = bif(Quadratic(), X_TRAIN, X_QUERY, quadratic_loss, small_config(seed=3), cache_dir=tmp_path)
    assert third.cache_key != first.cache_key
    loaded = BIFResult.load(folder)
    assert loaded.observable_slices == {"query_loss": (0, 4)}


def test_config_round_trip_and_observables():
    config = small_config(param_patterns=("w",))
    assert SamplerConfig.from_dict(config.to_dict()) == config
    with pytest.raises(UserError, match="unknown SamplerConfig keys"):
        SamplerConfig.from_dict({"epsilon": 1.0})
    result = bif(Quadratic(), X_TRAIN, None, quadratic_loss, config, observables={"w0": lambda m: m.w[:1]})
    assert result.bif.shape == (6, 1)
    assert result.observable("w0").shape == (6, 1)


def test_query_equal_to_attribution_is_recorded_once_with_same_result():
    config = small_config()
    separate = bif(Quadratic(), X_TRAIN, X_TRAIN.clone(), quadratic_loss, config)
    calls = {"n": 0}

    def counting_loss(model, x):
        calls["n"] += 1
        return quadratic_loss(model, x)

    shared = bif(Quadratic(), X_TRAIN, X_TRAIN, counting_loss, config)
    assert torch.allclose(shared.bif, separate.bif, atol=1e-12)
    # SGLD steps + initial loss + one probing pass + one attribution pass per draw (no
    # query pass, at the probe either) + per chain, the loss at its last draw (locality: every
    # other draw's loss is the next step's forward).
    assert calls["n"] == config.chains * (config.total_steps + config.draws + 1) + 2


def test_float32_block_accumulation_matches_float64():
    # Values with a large offset and small spread: uncentred float32 sums would lose it.
    gen = torch.Generator().manual_seed(3)
    a = 50.0 + 1e-2 * torch.randn(400, 30, generator=gen, dtype=torch.float64)
    b = -20.0 + 1e-2 * torch.randn(400, 20, generator=gen, dtype=torch.float64) + 0.5e-2 * a[:, :20]
    a, b = a.float(), b.float()  # the recorded values are float32; the reference is exact on them
    exact = CoMoments.from_batch(a.double(), b.double()).covariance()
    streamed = CoMoments(30, 20, dtype=torch.float32)
    for start in range(0, 400, 64):
        streamed.update_batch(a[start : start + 64], b[start : start + 64])
    assert streamed.comoment.dtype == torch.float32
    error = (streamed.covariance().double() - exact).abs().max()
    assert error < 1e-5 * exact.abs().max(), float(error / exact.abs().max())


def test_per_chain_estimates_in_place_and_blocked_stderr_match_direct():
    gen = torch.Generator().manual_seed(5)
    chains, draws, n_a, n_b = 3, 30, 700, 500  # 350k entries: the stderr works in row blocks
    a = torch.randn(chains, draws, n_a, generator=gen, dtype=torch.float64)
    b = torch.randn(chains, draws, n_b, generator=gen, dtype=torch.float64) + 0.3 * a[..., :n_b]
    copied = estimate_from_moments({(c, 0): CoMoments.from_batch(a[c], b[c]) for c in range(chains)},
                                   chains, False, False)
    storage = torch.zeros(chains, n_a, n_b, dtype=torch.float64)
    accs = {}
    for c in range(chains):
        accs[(c, 0)] = CoMoments(n_a, n_b, out=storage[c])
        for start in range(0, draws, 8):  # streamed in blocks, as bif() does
            accs[(c, 0)].update_batch(a[c, start : start + 8], b[c, start : start + 8])
    in_place = estimate_from_moments(accs, chains, False, False, per_chain_out=storage)
    assert in_place.per_chain.data_ptr() == storage.data_ptr()  # no new [chains, n_a, n_b] tensor
    ca, cb = a - a.mean(1, keepdim=True), b - b.mean(1, keepdim=True)
    direct = -torch.einsum("cda,cdb->cab", ca, cb) / draws
    torch.testing.assert_close(in_place.per_chain, direct, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(in_place.per_chain_stderr, direct.std(0) / math.sqrt(chains), rtol=1e-8, atol=1e-12)
    # the default stderr: the jackknife over the pooled estimates leaving one chain out
    def pooled(keep):
        x, y = a[keep].reshape(-1, n_a), b[keep].reshape(-1, n_b)
        return -(x - x.mean(0)).T @ (y - y.mean(0)) / x.shape[0]

    loo = torch.stack([pooled([c for c in range(chains) if c != k]) for k in range(chains)])
    jackknife = ((loo - loo.mean(0)).pow(2).sum(0) * (chains - 1) / chains).sqrt()
    torch.testing.assert_close(in_place.stderr, jackknife, rtol=1e-8, atol=1e-12)
    torch.testing.assert_close(in_place.bif, copied.bif, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(copied.stderr, in_place.stderr, rtol=1e-10, atol=1e-12)
    with pytest.raises(UserError, match="per_chain_out"):
        estimate_from_moments({(c, 0): CoMoments.from_batch(a[c], b[c]) for c in range(chains)},
                              chains, False, False, per_chain_out=torch.zeros(2, n_a, n_b, dtype=torch.float64))


def test_flat_sgld_update_equals_per_tensor_update_and_restores_parameters():
    config = small_config(keep_draws=True)
    model = Quadratic()
    own = model.w.untyped_storage().data_ptr()
    # Recorded at every draw: 1 if w still lives in its own storage (the per-tensor update).
    in_own_storage = {"own": lambda m: torch.tensor([float(m.w.untyped_storage().data_ptr() == own)])}
    flat = bif(model, X_TRAIN, X_QUERY, quadratic_loss, config, observables=in_own_storage)
    assert model.w.untyped_storage().data_ptr() == own and torch.equal(model.w.detach(), W_STAR)
    assert model.w.grad is None
    strided = Quadratic()
    strided.w = nn.Parameter(W_STAR.repeat_interleave(2)[::2])  # not contiguous: per-tensor update
    own = strided.w.untyped_storage().data_ptr()
    per_tensor = bif(strided, X_TRAIN, X_QUERY, quadratic_loss, config, observables=in_own_storage)
    start, stop = flat.observable_slices["own"]
    assert (flat.draws.observables[..., start] == 0).all()  # sampled in the flat buffer
    assert (per_tensor.draws.observables[..., start] == 1).all()
    torch.testing.assert_close(flat.draws.attribution, per_tensor.draws.attribution, rtol=0, atol=1e-12)
    torch.testing.assert_close(flat.bif, per_tensor.bif, rtol=0, atol=1e-12)


def test_a_cache_of_an_earlier_format_is_recomputed_not_an_error(tmp_path):
    from safetensors.torch import save_file

    config = small_config()
    first = bif(Quadratic(), X_TRAIN, X_QUERY, quadratic_loss, config, cache_dir=tmp_path)
    stored = tmp_path / f"bif_{first.cache_key}" / "bif.safetensors"
    save_file({"bif": first.bif.contiguous()}, stored)  # what the format before artifacts left behind
    assert not BIFResult.is_stored(stored.parent)
    again = bif(Quadratic(), X_TRAIN, X_QUERY, quadratic_loss, config, cache_dir=tmp_path)
    assert BIFResult.is_stored(stored.parent)
    assert_fields_equal(first, again)
