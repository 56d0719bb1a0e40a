import pytest
import torch
import torch.nn.functional as F

from interp_toolkit.analyses.gradients import (
    compute_gradient_conflict,
    gradient_conflict,
    group_gradients,
    minority_amplification,
    parameter_groups,
    per_example_grads,
)
from interp_toolkit.errors import UserError


def _loop_grads(model, tokens, labels):
    out = []
    for i in range(tokens.shape[0]):
        model.zero_grad()
        loss = F.cross_entropy(model(tokens[i : i + 1])[:, -1], labels[i : i + 1])
        names, params = zip(*[(n, p) for n, p in model.named_parameters()], strict=True)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        out.append({n: torch.zeros_like(p) if g is None else g for n, p, g in zip(names, params, grads, strict=True)})
    return {n: torch.stack([o[n] for o in out]) for n in out[0]}


def test_vmapped_per_example_grads_equal_a_loop(small_trained_like_model, splits):
    tokens, labels = splits["train"].tokens[:12], splits["train"].labels[:12]
    vm = per_example_grads(small_trained_like_model, tokens, labels, chunk_size=5)
    loop = _loop_grads(small_trained_like_model, tokens, labels)
    assert set(vm) == set(loop)
    for name in vm:
        torch.testing.assert_close(vm[name], loop[name], atol=1e-6, rtol=1e-4)


def test_parameter_groups_partition_the_heads(small_trained_like_model):
    groups = parameter_groups(small_trained_like_model)
    assert {"all", "embed", "L0H0.QK", "L1H1.OV", "mlp0", "mlp1", "unembed", "ln"} <= set(groups)
    sizes = {g: sum(int(torch.zeros(dict(small_trained_like_model.named_parameters())[raw].shape)[index].numel())
                    for raw, index in members) for g, members in groups.items()}
    d_model, d_head = 16, 8
    assert sizes["L0H0.QK"] == 2 * (d_model * d_head + d_head)
    assert sizes["L0H0.OV"] == d_model * d_head + d_head + d_head * d_model
    # every parameter entry is in exactly one non-"all" group
    assert sum(v for g, v in sizes.items() if g != "all") == sizes["all"]


def _direct(model, split, n):
    grads = _loop_grads(model, split.tokens[:n], split.labels[:n])
    flat = torch.cat([g.reshape(n, -1) for g in grads.values()], dim=1)
    agrees = split.agrees[:n]
    mc, ma = flat[agrees].mean(0), flat[~agrees].mean(0)
    norms = flat.norm(dim=1)
    cos_to_c = F.cosine_similarity(flat, mc[None], dim=1)
    return {
        "conflict_cos": float(F.cosine_similarity(mc, ma, dim=0)),
        "amplification": float(norms[~agrees].mean() / norms[agrees].mean()),
        "anti_cos_mean": float(cos_to_c[~agrees].mean()),
        "cos": cos_to_c,
    }


def test_conflict_and_ratios_equal_a_direct_computation(small_trained_like_model, splits):
    n = 24
    split = splits["train"]
    direct = _direct(small_trained_like_model, split, n)
    streamed = gradient_conflict(small_trained_like_model, splits, split="train", n=n, chunk_size=7)
    row = streamed.table.where(group="all").rows[0]
    assert row["n_consistent"] == int(split.agrees[:n].sum()) and row["n_anti"] == n - row["n_consistent"]
    for key in ("conflict_cos", "amplification", "anti_cos_mean"):
        assert row[key] == pytest.approx(direct[key], rel=1e-4, abs=1e-6)
    torch.testing.assert_close(streamed.tensors["cos_to_consistent/all"], direct["cos"], atol=1e-5, rtol=1e-4)

    # the low-level function on stored, grouped per-example grads gives the same table
    stored = group_gradients(per_example_grads(small_trained_like_model, split.tokens[:n], split.labels[:n]),
                             parameter_groups(small_trained_like_model))
    low = compute_gradient_conflict(stored, split.agrees[:n])
    for a, b in zip(low.rows, streamed.rows, strict=True):
        assert a["group"] == b["group"]
        for key in ("conflict_cos", "amplification", "anti_cos_q50", "norm_anti"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6)


def test_hand_model_gradients_conflict(hand_model, splits):
    # the hand model predicts the shortcut: anti-shortcut examples are confidently wrong,
    # so their gradients are larger and point against the consistent ones
    result = gradient_conflict(hand_model, splits, split="train", n=64)
    row = result.table.where(group="L0H0.OV").rows[0]
    assert row["conflict_cos"] < -0.5
    assert row["amplification"] > 1.0


def test_minority_amplification_is_the_smaller_groups_norm_over_the_larger(hand_model, task, splits):
    """The paper's amplification of the minority: anti-shortcut examples are the minority above
    r = 0.5 (it equals ``amplification``), shortcut-consistent ones below it (its inverse)."""
    from interp_toolkit.tasks.mpsp import make_split

    above = gradient_conflict(hand_model, splits, split="train", n=64).table.where(group="all").rows[0]
    assert above["n_anti"] < above["n_consistent"] and above["minority"] == "anti"
    assert above["minority_amplification"] == pytest.approx(above["amplification"])
    assert above["minority_amplification"] > 1.0  # the hand model predicts the shortcut

    below_split = make_split(task, 0.25, 64, seed=4)
    below = gradient_conflict(hand_model, {"train": below_split}, split="train").table.where(group="all").rows[0]
    assert below["n_consistent"] < below["n_anti"] and below["minority"] == "consistent"
    assert below["minority_amplification"] == pytest.approx(below["norm_consistent"] / below["norm_anti"])
    assert below["minority_amplification"] == pytest.approx(1 / below["amplification"])
    # the shortcut-following model is right on the consistent minority: its gradients are the small ones
    assert below["minority_amplification"] < 1.0


def test_minority_amplification_edge_cases():
    assert minority_amplification(2.0, 6.0, "anti") == 3.0
    assert minority_amplification(2.0, 6.0, "consistent") == pytest.approx(1 / 3)
    assert minority_amplification(2.0, 6.0, "none") != minority_amplification(2.0, 6.0, "none")  # NaN
    assert minority_amplification(0.0, 6.0, "anti") == float("inf")
    with pytest.raises(UserError, match="minority must be 'anti', 'consistent' or 'none', got 'rare'"):
        minority_amplification(1.0, 1.0, "rare")


def test_gradient_bad_input(hand_model, splits):
    with pytest.raises(UserError, match="chunk_size must be a positive integer"):
        gradient_conflict(hand_model, splits, chunk_size=0)
    with pytest.raises(UserError, match="at least one shortcut-consistent and one anti-shortcut"):
        gradient_conflict(hand_model, splits, split="val")
    with pytest.raises(UserError, match="agrees must be a bool tensor"):
        compute_gradient_conflict({"all": torch.zeros(4, 3)}, torch.tensor([1, 0, 1, 0]))


def test_model_still_trains_after_per_example_grads(small_trained_like_model, splits):
    tokens, labels = splits["train"].tokens[:8], splits["train"].labels[:8]
    per_example_grads(small_trained_like_model, tokens, labels)
    params = list(small_trained_like_model.parameters())
    assert all(isinstance(p, torch.nn.Parameter) and p.requires_grad for p in params)
    loss = F.cross_entropy(small_trained_like_model(tokens)[:, -1], labels)
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    assert all(g is not None for g in grads)


def test_gradients_on_boot_transformers_model(neox_model, splits):
    tokens, labels = splits["train"].tokens[:6], splits["train"].labels[:6]
    vm = per_example_grads(neox_model, tokens, labels)
    loop = _loop_grads(neox_model, tokens, labels)
    for name in vm:
        torch.testing.assert_close(vm[name], loop[name], atol=1e-6, rtol=1e-4)
    result = gradient_conflict(neox_model, splits, split="train", n=16, chunk_size=8)
    rows = {r["group"]: r for r in result.rows}
    assert {"all", "L0H0.QK", "L1H1.OV", "mlp1"} <= set(rows)
    assert rows["L0H0.OV"]["norm_consistent"] > 0 and -1 <= rows["all"]["conflict_cos"] <= 1
