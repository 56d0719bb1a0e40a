import math

import pytest
import torch

from interp_toolkit.analyses.gradients import parameter_groups
from interp_toolkit.analyses.over_checkpoints import over_checkpoints
from interp_toolkit.analyses.weights import compute_weight_norms, weight_norms
from interp_toolkit.errors import UserError


def test_group_norms_partition_the_model_and_match_its_weights(small_trained_like_model):
    model = small_trained_like_model
    rows = {row["group"]: row for row in weight_norms(model).rows}
    params = [p.detach() for p in model.parameters()]
    total = math.sqrt(sum(float((p.double() ** 2).sum()) for p in params))
    assert rows["all"]["norm"] == pytest.approx(total, rel=1e-12)
    assert rows["all"]["n_params"] == sum(p.numel() for p in params)
    # every parameter sits in exactly one named group, so the squares add up to all's
    parts = [row for group, row in rows.items() if group != "all"]
    assert sum(row["norm"] ** 2 for row in parts) == pytest.approx(total ** 2, rel=1e-10)
    assert sum(row["n_params"] for row in parts) == rows["all"]["n_params"]
    # a head's groups are its TransformerLens weights (W_Q, W_K, b_Q, b_K / W_V, W_O, b_V)
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            qk = [model.W_Q[layer, head], model.W_K[layer, head], model.b_Q[layer, head], model.b_K[layer, head]]
            ov = [model.W_V[layer, head], model.W_O[layer, head], model.b_V[layer, head]]
            for name, tensors in (("QK", qk), ("OV", ov)):
                expected = math.sqrt(sum(float((t.detach().double() ** 2).sum()) for t in tensors))
                assert rows[f"L{layer}H{head}.{name}"]["norm"] == pytest.approx(expected, rel=1e-10)


def test_norms_follow_a_rescaled_model(small_trained_like_model):
    params = {name: p.detach().clone() for name, p in small_trained_like_model.named_parameters()}
    groups = parameter_groups(small_trained_like_model)
    before = compute_weight_norms(params, groups)
    after = compute_weight_norms({name: 0.5 * p for name, p in params.items()}, groups)
    assert torch.allclose(after.tensors["norms"], 0.5 * before.tensors["norms"])
    assert [r["group"] for r in after.rows] == [r["group"] for r in before.rows]


def test_groups_naming_missing_parameters_are_refused(small_trained_like_model):
    params = dict(small_trained_like_model.named_parameters())
    with pytest.raises(UserError, match=r"parameters the model does not have: \['nope.weight'\]"):
        compute_weight_norms(params, {"x": [("nope.weight", ())]})


def test_weight_norms_over_checkpoints(tiny_run, tmp_path):
    run_dir, _ = tiny_run
    result = over_checkpoints("weight_norms", run_dir, out_dir=tmp_path / "w", progress=False)
    assert sorted(set(result.table.column("epoch"))) == [0, 1, 2, 3, 4, 6]
    by_epoch = {e: {r["group"]: r["norm"] for r in result.table.where(epoch=e).rows} for e in (0, 6)}
    assert by_epoch[0]["all"] != by_epoch[6]["all"]  # training moved the weights
    assert {"all", "embed", "L0H0.QK", "L0H1.OV", "unembed"} <= set(by_epoch[6])
    assert result.png_path.is_file()
    assert over_checkpoints("weight_norms", run_dir, out_dir=tmp_path / "w", progress=False,
                            plot=False).cache_hits == [0, 1, 2, 3, 4, 6]


def test_distance_and_cosine_to_a_reference(small_trained_like_model):
    params = {name: p.detach().clone() for name, p in small_trained_like_model.named_parameters()}
    groups = parameter_groups(small_trained_like_model)
    same = {r["group"]: r for r in compute_weight_norms(params, groups, params).rows}
    assert all(r["distance"] == 0 for r in same.values())
    assert all(r["cosine"] == pytest.approx(1.0) for r in same.values() if r["norm"] > 0)
    assert all(math.isnan(r["cosine"]) for r in same.values() if r["norm"] == 0)  # e.g. zero-init biases
    # the reference is the model at 80% scale plus an orthogonal-ish perturbation of one head
    reference = {name: 0.8 * p for name, p in params.items()}
    rows = {r["group"]: r for r in compute_weight_norms(params, groups, reference).rows}
    for row in rows.values():
        if row["norm"] > 0:
            assert row["cosine"] == pytest.approx(1.0)
            assert row["reference_norm"] == pytest.approx(0.8 * row["norm"])
            assert row["relative_distance"] == pytest.approx(0.25)  # |w - 0.8 w| / |0.8 w|
    flipped = dict(reference)
    (raw, index), *_ = groups["L0H0.QK"]
    flipped[raw] = reference[raw].clone()
    flipped[raw][index] = -flipped[raw][index]
    row = next(r for r in compute_weight_norms(params, groups, flipped).rows if r["group"] == "L0H0.QK")
    assert row["cosine"] < 1.0 and row["distance"] > rows["L0H0.QK"]["distance"]


def test_reference_problems_are_named(small_trained_like_model, tmp_path):
    with pytest.raises(UserError, match="reference checkpoint .*missing.safetensors' does not exist"):
        weight_norms(small_trained_like_model, reference=tmp_path / "missing.safetensors")
    with pytest.raises(UserError, match="reference must be a model or a checkpoint path, got int"):
        weight_norms(small_trained_like_model, reference=3)
    params = dict(small_trained_like_model.named_parameters())
    name = next(iter(params))
    bad = {**params, name: torch.zeros(3)}
    with pytest.raises(UserError, match=rf"differ in shape .*{name}"):
        compute_weight_norms(params, parameter_groups(small_trained_like_model), bad)


def test_distance_to_initialization_over_checkpoints(tiny_run, tmp_path):
    run_dir, _ = tiny_run
    init = str(run_dir / "checkpoints" / "epoch_000000.safetensors")
    result = over_checkpoints("weight_norms", run_dir, config={"reference": init}, epochs=[0, 6],
                              out_dir=tmp_path / "w", progress=False, plot=False)
    at = {e: {r["group"]: r for r in result.table.where(epoch=e).rows} for e in (0, 6)}
    assert at[0]["all"]["distance"] == 0 and at[0]["all"]["cosine"] == pytest.approx(1.0)
    assert at[6]["all"]["distance"] > 0 and at[6]["all"]["cosine"] < 1.0
    assert at[6]["all"]["reference_norm"] == pytest.approx(at[0]["all"]["norm"])


def test_a_reference_path_is_read_once_and_again_when_rewritten(tiny_run, tmp_path):
    import shutil

    from interp_toolkit.analyses.weights import _checkpoint_params
    from interp_toolkit.checkpoint import load_checkpoint

    run_dir, _ = tiny_run
    reference = tmp_path / "reference.safetensors"
    shutil.copy(run_dir / "checkpoints" / "epoch_000000.safetensors", reference)
    model, _ = load_checkpoint(run_dir / "checkpoints" / "epoch_000006.safetensors")
    first = {r["group"]: r for r in weight_norms(model, reference=reference).rows}
    hits = _checkpoint_params.cache_info().hits
    assert {r["group"]: r for r in weight_norms(model, reference=str(reference)).rows} == first
    assert _checkpoint_params.cache_info().hits == hits + 1  # the same file: not loaded again
    shutil.copy(run_dir / "checkpoints" / "epoch_000006.safetensors", reference)  # rewritten: read again
    again = {r["group"]: r for r in weight_norms(model, reference=reference).rows}
    assert first["all"]["distance"] > 0 and again["all"]["distance"] == 0
