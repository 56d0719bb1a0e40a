import pytest
import torch
import transformer_lens.patching as tl_patching

from interp_toolkit.analyses.ablation import resolve_components
from interp_toolkit.analyses.patching import (
    activation_patching,
    compute_patching,
    cross_split_patching,
    readout_metric,
)


def test_patching_the_max_head_moves_the_metric_fully(hand_model, splits):
    result = cross_split_patching(hand_model, splits, source="val", target="adv", positions=None)
    norm = {r["component"]: r["normalized"] for r in result.rows}
    assert norm["L0H0"] == pytest.approx(1.0, abs=1e-5)
    assert norm["attn0"] == pytest.approx(1.0, abs=1e-5)
    assert norm["resid_pre0"] == pytest.approx(1.0, abs=1e-5)
    assert norm["L0H1"] == pytest.approx(0.0, abs=1e-5)
    row = result.rows[0]
    assert row["source"] != row["target"]
    assert row["source_split"] == "val" and row["target_split"] == "adv"


def test_patching_by_position_finds_the_readout(hand_model, splits):
    result = cross_split_patching(hand_model, splits, components=["L0H0"], positions="each", n=64)
    norm = {r["position"]: r["normalized"] for r in result.rows}
    assert norm[5] == pytest.approx(1.0, abs=1e-5)  # the head's output is read at the readout
    assert all(abs(norm[p]) < 1e-5 for p in range(5))
    assert result.tensors["normalized"].shape == (1, 6)


@pytest.mark.parametrize("model_name", ["hand_model", "small_trained_like_model"])
def test_agrees_with_transformer_lens_patching(model_name, request, splits):
    model = request.getfixturevalue(model_name)
    model.eval()
    source, target = splits["val"].tokens[:48], splits["adv"].tokens[:48]
    metric = readout_metric("logit_diff", splits["adv"].labels[:48])
    _, source_cache = model.run_with_cache(source)
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads

    resid = compute_patching(model, target, source_cache, resolve_components(
        model, [f"resid_pre{layer}" for layer in range(n_layers)]), list(range(6)), metric)
    tl_resid = tl_patching.get_act_patch_resid_pre(model, target, source_cache, metric)
    torch.testing.assert_close(resid, tl_resid.float(), atol=1e-5, rtol=1e-4)

    heads = [f"L{layer}H{head}" for layer in range(n_layers) for head in range(n_heads)]
    by_pos = compute_patching(model, target, source_cache, resolve_components(model, heads), list(range(6)), metric)
    tl_by_pos = tl_patching.get_act_patch_attn_head_out_by_pos(model, target, source_cache, metric)
    # TL: [layer, pos, head]; ours: [layer*head, pos]
    torch.testing.assert_close(by_pos, tl_by_pos.permute(0, 2, 1).reshape(-1, 6).float(), atol=1e-5, rtol=1e-4)

    attn = compute_patching(model, target, source_cache, resolve_components(
        model, [f"attn{layer}" for layer in range(n_layers)]), list(range(6)), metric)
    tl_attn = tl_patching.get_act_patch_attn_out(model, target, source_cache, metric)
    torch.testing.assert_close(attn, tl_attn.float(), atol=1e-5, rtol=1e-4)

    all_pos = compute_patching(model, target, source_cache, resolve_components(model, heads), None, metric)
    tl_all = tl_patching.get_act_patch_attn_head_out_all_pos(model, target, source_cache, metric)
    torch.testing.assert_close(all_pos[:, 0], tl_all.reshape(-1).float(), atol=1e-5, rtol=1e-4)


def test_patching_bad_input(hand_model, splits):
    with pytest.raises(ValueError, match="split 'x' not found"):
        cross_split_patching(hand_model, splits, source="x")
    with pytest.raises(ValueError, match="metric must be one of"):
        cross_split_patching(hand_model, splits, metric="kl")
    with pytest.raises(ValueError, match="one shape"):
        activation_patching(hand_model, splits["val"].tokens[:4], splits["adv"].tokens[:5],
                            splits["adv"].labels[:4])
    with pytest.raises(ValueError, match="positions must be"):
        cross_split_patching(hand_model, splits, positions="last")
