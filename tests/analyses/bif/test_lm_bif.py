import pytest
import torch

from interp_toolkit.analyses.bif import SamplerConfig
from interp_toolkit.analyses.bif.lm import LMBIFConfig, lm_bif
from interp_toolkit.analyses.bif.lm_estimate import naive_token_bif
from interp_toolkit.analyses.bif.lm_tokens import TokenSet, group_ids, reduce_matrix
from interp_toolkit.analyses.induction import induction_scores
from interp_toolkit.errors import UserError
from interp_toolkit.sources import resolve_checkpoints
from interp_toolkit.tasks.induction_corpus import repeated_random_tokens
from tests.helpers import assert_fields_equal

torch.set_num_threads(1)
VOCAB, SEQ = 13, 8


@pytest.fixture(scope="module")
def neox_ref(tmp_path_factory):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=2 * SEQ + 1, rotary_pct=0.25)
    path = tmp_path_factory.mktemp("neox") / "step0"
    GPTNeoXForCausalLM(cfg).save_pretrained(path)
    return resolve_checkpoints([path])[0]


def _data():
    gen = torch.Generator().manual_seed(0)
    posterior = torch.randint(0, VOCAB, (16, SEQ), generator=gen)
    train = TokenSet(posterior[:3], torch.randint(0, 3, (3, SEQ - 1), generator=gen), ["a", "b", "c"])
    query = TokenSet(torch.randint(0, VOCAB, (2, SEQ), generator=gen), torch.randint(0, 2, (2, SEQ - 1), generator=gen))
    return posterior, train, query


SAMPLER = dict(eps=1e-3, gamma=100.0, n_beta=20.0, chains=2, draws=6, burn_in=2, batch_size=8,
               keep_draws=True, progress=False)


def test_token_bif_matches_naive_and_reductions_match_full_matrix(neox_ref, tmp_path):
    model = neox_ref.load()  # the local GPTNeoX path: loads, hooks, samples
    assert induction_scores(model, repeated_random_tokens(2, 4, 1, VOCAB), 4).shape == (2, 2)
    posterior, train, query = _data()
    reductions = ("token:token", "class:class", "sequence:sequence", "class:all", "all:sequence")
    config = LMBIFConfig(SamplerConfig(**SAMPLER), reductions=reductions)
    result = lm_bif(model, posterior, train, query, config, cache_dir=tmp_path)
    assert result.train_draws.shape == (2, 6, 3 * (SEQ - 1)) and result.query_draws.shape == (2, 6, 2 * (SEQ - 1))
    assert torch.isfinite(result.train_draws).all() and result.train_draws.std() > 0
    full = result["token:token"].bif
    naive = naive_token_bif(result.train_draws, result.query_draws)
    assert full.shape == (21, 14) and full.abs().max() > 0
    torch.testing.assert_close(full, naive, rtol=1e-9, atol=1e-12)
    for reduction in reductions[1:]:
        g_a, g_b = reduction.split(":")
        ids_a, labels_a = group_ids(train, g_a)
        ids_b, labels_b = group_ids(query, g_b)
        expected = reduce_matrix(naive, ids_a, ids_b)
        torch.testing.assert_close(result[reduction].bif, expected, rtol=1e-9, atol=1e-12)
        assert result[reduction].row_labels == labels_a and result[reduction].col_labels == labels_b
    assert result["class:class"].row_labels == ["a", "b", "c"]
    # per-chain estimates and standard errors are there
    assert result["class:class"].per_chain.shape == (2, 3, 2) and torch.isfinite(result["class:class"].stderr).all()
    # convergence diagnostics of the class:class entries, from the classes' mean losses per draw
    from interp_toolkit.analyses.bif.diagnostics import split_rhat
    from interp_toolkit.analyses.bif.lm_estimate import _group_means_of_draws

    conv = result.convergence
    assert conv.rhat.shape == (3, 2) and not conv.converged and conv.warnings  # 2 x 6 draws
    ga = _group_means_of_draws(result.train_draws, group_ids(train, "class")[0], 3)
    gb = _group_means_of_draws(result.query_draws, group_ids(query, "class")[0], 2)
    ga, gb = ga - ga.reshape(-1, 3).mean(0), gb - gb.reshape(-1, 2).mean(0)
    assert float(conv.rhat[2, 1]) == pytest.approx(split_rhat(ga[..., 2] * gb[..., 1]), abs=1e-9)
    # rerun with the same config is a cache hit returning, field by field, the fresh result
    again = lm_bif(model, posterior, train, query, config, cache_dir=tmp_path)
    assert again.cache_key == result.cache_key and result.diagnostics.sampled_parameters
    assert result.diagnostics.sampling_drift.abs().sum() > 0  # the old cache hit zeroed it
    assert_fields_equal(result, again)


def test_query_none_records_train_once_and_is_symmetric(neox_ref):
    model = neox_ref.load()
    posterior, train, _ = _data()
    config = LMBIFConfig(SamplerConfig(**SAMPLER), reductions=("sequence:sequence",))
    result = lm_bif(model, posterior, train, None, config)
    m = result["sequence:sequence"].bif
    torch.testing.assert_close(m, m.T)
    assert (torch.diagonal(m) <= 0).all()  # -Var


def test_config_validation():
    with pytest.raises(UserError, match="'class:bogus'"):
        LMBIFConfig(reductions=("class:bogus",))
    with pytest.raises(UserError, match="seq_len - 1"):
        TokenSet(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long))
    posterior, train, query = _data()
    with pytest.raises(UserError, match="max_matrix_entries"):
        lm_bif(torch.nn.Linear(1, 1), posterior, train, query,
               LMBIFConfig(reductions=("token:token",), max_matrix_entries=10))


def test_pearson_conventions_streamed_and_from_draws_agree(neox_ref):
    """lm_bif's two Pearson paths equal compute_lm_bif on the same kept draws."""
    from interp_toolkit.analyses.bif.lm_estimate import compute_lm_bif

    model = neox_ref.load()
    posterior, train, query = _data()
    reductions = ("class:class", "sequence:all", "token:token")
    for convention in ("token_mean", "group_means"):
        config = LMBIFConfig(SamplerConfig(**{**SAMPLER, "pearson": True, "keep_draws": True}), reductions=reductions,
                             pearson_convention=convention)
        result = lm_bif(model, posterior, train, query, config)
        again = compute_lm_bif(result.train_draws, result.query_draws, train, query, reductions, pearson=True,
                               pearson_convention=convention)
        for name in reductions:
            torch.testing.assert_close(result[name].bif, again[name].bif, rtol=1e-6, atol=1e-9)
            torch.testing.assert_close(result[name].per_chain, again[name].per_chain, rtol=1e-6, atol=1e-9)
        assert result.config["pearson_convention"] == convention
    with pytest.raises(UserError, match="pearson_convention"):
        LMBIFConfig(pearson_convention="mean")


def test_jackknife_stderr_streamed_and_from_draws(neox_ref):
    """The default stderr is the leave-one-chain-out jackknife of the pooled estimate."""
    from interp_toolkit.analyses.bif.lm_estimate import compute_lm_bif

    model = neox_ref.load()
    posterior, train, query = _data()
    reductions = ("class:class", "token:token")
    config = LMBIFConfig(SamplerConfig(**{**SAMPLER, "chains": 3}), reductions=reductions)
    assert config.stderr_method == "jackknife"
    result = lm_bif(model, posterior, train, query, config)
    a, b = result.train_draws, result.query_draws
    for name in reductions:
        loo = torch.stack(
            [
                compute_lm_bif(
                    a[[c for c in range(3) if c != k]], b[[c for c in range(3) if c != k]], train, query, (name,),
                    stderr_method="per_chain",
                )[name].bif
                for k in range(3)
            ]
        )
        expected = ((loo - loo.mean(0)).pow(2).sum(0) * 2 / 3).sqrt()
        torch.testing.assert_close(result[name].stderr, expected, rtol=1e-6, atol=1e-12)
        per_chain = compute_lm_bif(a, b, train, query, (name,), stderr_method="per_chain")[name]
        torch.testing.assert_close(per_chain.stderr, per_chain.per_chain.std(0) / 3**0.5)
        torch.testing.assert_close(per_chain.bif, result[name].bif, rtol=1e-6, atol=1e-12)
    with pytest.raises(UserError, match="stderr_method"):
        LMBIFConfig(stderr_method="bootstrap")


def test_streamed_reductions_give_the_stderr_their_method_names(neox_ref):
    """Streamed through the engine, per_chain is the chains' spread and jackknife the
    leave-one-chain-out error of the pooled estimate, as for reductions from stored draws."""
    from interp_toolkit.analyses.bif.lm_estimate import compute_lm_bif

    model = neox_ref.load()
    posterior, train, query = _data()
    config = LMBIFConfig(SamplerConfig(**{**SAMPLER, "chains": 3}), reductions=("class:class", "sequence:all"),
                         stderr_method="per_chain")
    result = lm_bif(model, posterior, train, query, config)
    jackknife = compute_lm_bif(result.train_draws, result.query_draws, train, query, config.reductions)
    for name in config.reductions:
        torch.testing.assert_close(result[name].stderr, result[name].per_chain.std(0) / 3**0.5)
        torch.testing.assert_close(result[name].bif, jackknife[name].bif, rtol=1e-9, atol=1e-12)
        assert not torch.allclose(result[name].stderr, jackknife[name].stderr)


def test_cache_hit_equals_fresh_with_pearson_conventions_and_jackknife(neox_ref, tmp_path):
    """lmbif's options (draw-based token_mean Pearson, jackknife stderr, draws dropped without
    keep_draws) round-trip through the artifact cache field by field, and are part of the key."""
    model = neox_ref.load()
    posterior, train, query = _data()
    sampler = SamplerConfig(**{**SAMPLER, "chains": 3, "pearson": True, "keep_draws": False})
    config = LMBIFConfig(sampler, reductions=("class:class", "sequence:all"), pearson_convention="token_mean")
    fresh = lm_bif(model, posterior, train, query, config, cache_dir=tmp_path)
    assert fresh.train_draws is None and fresh.query_draws is None  # kept for the estimate only
    assert torch.isfinite(fresh["class:class"].stderr).all()
    again = lm_bif(model, posterior, train, query, config, cache_dir=tmp_path)
    assert_fields_equal(fresh, again)
    other = lm_bif(model, posterior, train, query, config.replace(stderr_method="per_chain"), cache_dir=tmp_path)
    assert other.cache_key != fresh.cache_key and other.config["stderr_method"] == "per_chain"
    torch.testing.assert_close(other["class:class"].bif, fresh["class:class"].bif)
    assert not torch.equal(other["class:class"].stderr, fresh["class:class"].stderr)
