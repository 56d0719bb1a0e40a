import pytest
import torch

from interp_toolkit.analyses.ablation import (
    ablation,
    compute_replacement,
    list_components,
    mean_ablation,
    resample_ablation,
    zero_ablation,
)
from interp_toolkit.errors import UserError


def _get(result, component, split, metric):
    rows = result.table.where(component=component, split=split, metric=metric).rows
    assert len(rows) == 1
    return rows[0]


def test_zero_ablation_of_the_max_head_destroys_the_shortcut_and_spares_the_rest(hand_model, splits):
    result = zero_ablation(hand_model, splits, split_names=["val", "adv"])
    max_head = _get(result, "L0H0", "val", "accuracy")
    assert max_head["clean"] == 1.0 and max_head["ablated"] <= 0.6
    assert _get(result, "L0H0", "val", "logit_diff")["ablated"] == pytest.approx(0.0, abs=1e-6)
    # the first-position head writes nothing that is read: ablating it changes nothing
    for metric in ("loss", "accuracy", "logit_diff"):
        assert _get(result, "L0H1", "val", metric)["delta"] == pytest.approx(0.0, abs=1e-6)
    # columns, and the tensors agree with the table
    assert {"component", "split", "metric", "clean", "ablated", "delta"} <= set(result.table.columns)
    comps = [c.name for c in list_components(hand_model)]
    assert comps == ["resid_pre0", "L0H0", "L0H1", "attn0"]
    assert result.tensors["ablated"].shape == (4, 2, 3)
    assert float(result.tensors["ablated"][1, 0, 1]) == max_head["ablated"]


@pytest.mark.parametrize("fn", [mean_ablation, resample_ablation])
def test_mean_and_resample_ablation_remove_the_head_information(fn, hand_model, splits):
    result = fn(hand_model, splits, split_names=["val"], components=["L0H0", "L0H1"], reference="train")
    assert _get(result, "L0H0", "val", "accuracy")["ablated"] < 0.8
    assert _get(result, "L0H1", "val", "accuracy")["delta"] == pytest.approx(0.0)


def test_ablation_at_positions_only_touches_those_positions(hand_model, splits):
    # ablating the max head only at value positions changes nothing: its output is read
    # at the readout position only
    result = ablation(hand_model, splits, method="zero", split_names=["val"], components=["L0H0"],
                      positions=[0, 1, 2, 3, 4])
    assert _get(result, "L0H0", "val", "logit_diff")["delta"] == pytest.approx(0.0, abs=1e-6)
    result = ablation(hand_model, splits, method="zero", split_names=["val"], components=["L0H0"],
                      positions=[-1])
    assert _get(result, "L0H0", "val", "accuracy")["ablated"] <= 0.6


def test_compute_replacement():
    ref = torch.arange(12.0).reshape(4, 3)
    mean = compute_replacement(ref, "mean", batch=2)
    torch.testing.assert_close(mean, ref.mean(0, keepdim=True).expand(2, 3))
    res = compute_replacement(ref, "resample", batch=5, seed=1)
    assert all(any(torch.equal(r, x) for x in ref) for r in res)
    torch.testing.assert_close(res, compute_replacement(ref, "resample", batch=5, seed=1))
    assert compute_replacement(ref, "zero", batch=2) is None


def test_ablation_bad_input(hand_model, splits):
    with pytest.raises(UserError, match="method must be one of"):
        ablation(hand_model, splits, method="median")
    with pytest.raises(UserError, match="unknown component 'L5H0'"):
        ablation(hand_model, splits, components=["L5H0"])
    with pytest.raises(UserError, match="split 'test' not found"):
        ablation(hand_model, splits, split_names=["test"])
    with pytest.raises(UserError, match="position 9"):
        ablation(hand_model, splits, positions=[9])


def test_ablation_runs_on_mlp_layernorm_and_boot_transformers_models(small_trained_like_model, neox_model, splits):
    for model, classes in ((small_trained_like_model, None), (neox_model, [0, 1])):
        result = ablation(model, splits, method="mean", split_names=["val"], n=32, classes=classes,
                          kinds=("resid", "mlp", "head"))
        comps = set(result.table.column("component"))
        assert {"mlp0", "mlp1", "L1H1", "resid_pre0"} <= comps
        # mean-ablating the whole residual stream at every position makes every example's
        # prediction identical
        resid = _get(result, "resid_pre0", "val", "accuracy")["ablated"]
        labels = splits["val"].labels[:32]
        assert resid in (float((labels == 0).float().mean()), float((labels == 1).float().mean()))
