import pytest
import torch

from interp_toolkit import ModelConfig, build_model, model_config_of


def test_build_model_is_a_transformer_bridge_with_hooks(small_model_cfg):
    from transformer_lens.model_bridge import TransformerBridge

    model = build_model(small_model_cfg)
    assert isinstance(model, TransformerBridge)
    assert model_config_of(model) is small_model_cfg
    tokens = torch.randint(0, small_model_cfg.d_vocab, (3, small_model_cfg.n_ctx))
    logits, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_pattern"))
    assert logits.shape == (3, small_model_cfg.n_ctx, small_model_cfg.d_vocab_out)
    pattern = cache["blocks.0.attn.hook_pattern"]
    assert pattern.shape == (3, 2, small_model_cfg.n_ctx, small_model_cfg.n_ctx)
    assert torch.allclose(pattern.sum(-1), torch.ones(3, 2, small_model_cfg.n_ctx), atol=1e-5)
    assert model.W_Q.shape == (1, 2, 16, 8)


def test_seed_determines_weights(small_model_cfg):
    tokens = torch.randint(0, small_model_cfg.d_vocab, (2, small_model_cfg.n_ctx))
    a, b = build_model(small_model_cfg), build_model(small_model_cfg)
    other = build_model(ModelConfig(**{**small_model_cfg.to_dict(), "seed": 1}))
    assert torch.equal(a(tokens), b(tokens))
    assert not torch.equal(a(tokens), other(tokens))


@pytest.mark.parametrize("overrides", [
    {"attn_only": True, "normalization": None},
    {"n_layers": 2, "n_heads": 1, "positional_embedding": "rotary"},
])
def test_architecture_options(small_model_cfg, overrides):
    cfg = ModelConfig(**{**small_model_cfg.to_dict(), **overrides})
    model = build_model(cfg)
    keys = list(model.state_dict())
    assert any(k.startswith(f"blocks.{cfg.n_layers - 1}.") for k in keys)
    assert any(".mlp." in k for k in keys) is not cfg.attn_only
    assert any(".ln1." in k for k in keys) is (cfg.normalization == "LN")
    assert ("pos_embed.weight" in keys) is (cfg.positional_embedding == "standard")


def test_d_head_defaults_and_roundtrip():
    cfg = ModelConfig(n_layers=1, n_heads=4, d_vocab=11, n_ctx=6, d_vocab_out=2)
    assert cfg.d_head == 16
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("kwargs,name", [
    ({"n_layers": 0}, "n_layers"),
    ({"n_heads": 3}, "d_model"),
    ({"act_fn": "tanh"}, "act_fn"),
    ({"normalization": "RMS"}, "normalization"),
    ({"positional_embedding": "alibi"}, "positional_embedding"),
    ({"d_vocab_out": 0}, "d_vocab_out"),
])
def test_bad_config_names_the_field(kwargs, name):
    base = {"n_layers": 1, "n_heads": 2, "d_vocab": 11, "n_ctx": 6}
    with pytest.raises(ValueError, match=name):
        ModelConfig(**{**base, **kwargs})


def test_unknown_keys_rejected():
    with pytest.raises(ValueError, match="unknown ModelConfig keys"):
        ModelConfig.from_dict({"n_layers": 1, "n_heads": 1, "d_vocab": 3, "n_ctx": 2, "dropout": 0.1})
