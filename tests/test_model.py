import pytest
import torch

from interp_toolkit import ModelConfig, build_model, model_config_of
from interp_toolkit.errors import UserError


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
    with pytest.raises(UserError, match=name):
        ModelConfig(**{**base, **kwargs})


def test_unknown_keys_rejected():
    with pytest.raises(UserError, match="unknown ModelConfig keys"):
        ModelConfig.from_dict({"n_layers": 1, "n_heads": 1, "d_vocab": 3, "n_ctx": 2, "dropout": 0.1})


# --- initialization schemes -------------------------------------------------------------

def _init_cfg(**kwargs):
    return ModelConfig(n_layers=2, n_heads=2, d_vocab=10, n_ctx=8, d_vocab_out=2, **kwargs)


def _param(model, suffix):
    return next(p for name, p in model.named_parameters() if name.endswith(suffix))


def test_init_torch_matches_pytorch_defaults_and_is_seeded():
    import math

    model = build_model(_init_cfg(init="torch", seed=3))
    embed = _param(model, "tok_embed._original_component.weight")
    fc_in = _param(model, "fc_in._original_component.weight")
    fc_in_bias = _param(model, "fc_in._original_component.bias")
    # nn.Embedding: N(0, 1); nn.Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias
    assert 0.85 < embed.std().item() < 1.15
    bound = 1 / math.sqrt(64)
    assert fc_in.abs().max().item() <= bound and fc_in.abs().max().item() > 0.9 * bound
    assert fc_in_bias.abs().max().item() <= bound and fc_in_bias.abs().max().item() > 0
    again = build_model(_init_cfg(init="torch", seed=3))
    other = build_model(_init_cfg(init="torch", seed=4))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))
    assert not torch.equal(embed, _param(other, "tok_embed._original_component.weight"))


def test_init_torch_leaves_the_global_random_state_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    build_model(_init_cfg(init="torch"))
    assert torch.equal(torch.rand(3), expected)


def test_init_scale_multiplies_matrices_not_layernorm():
    base = build_model(_init_cfg())
    scaled = build_model(_init_cfg(init_scale=2.5))
    for (name, a), (_, b) in zip(base.named_parameters(), scaled.named_parameters(), strict=True):
        if a.dim() >= 2:
            assert torch.allclose(b, 2.5 * a), name
        else:
            assert torch.equal(a, b), name


def test_new_init_fields_stay_out_of_the_key_at_their_defaults():
    # run keys hash ModelConfig.to_dict(): runs made before these fields existed keep their key
    assert "init" not in _init_cfg().to_dict() and "init_scale" not in _init_cfg().to_dict()
    data = _init_cfg(init="torch", init_scale=0.5).to_dict()
    assert data["init"] == "torch" and data["init_scale"] == 0.5
    assert ModelConfig.from_dict(data) == _init_cfg(init="torch", init_scale=0.5)


@pytest.mark.parametrize("field, value", [("init", "xavier"), ("init_scale", 0.0), ("init_scale", float("nan")),
                                          ("init_scale", True)])
def test_bad_init_settings_are_refused_by_name(field, value):
    with pytest.raises(UserError, match=f"ModelConfig.{field}"):
        _init_cfg(**{field: value})
