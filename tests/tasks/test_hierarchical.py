"""Tests of the hierarchical dataset, the deep linear network and Saxe dynamics."""

from __future__ import annotations

import json

import pytest
import torch

from interp_toolkit.errors import UserError
from interp_toolkit.studies.bif.dln import (
    DeepLinearNetwork,
    DLNConfig,
    DLNTrainConfig,
    classical_mds,
    fit_initial_strength,
    gradient_descent,
    log_spaced_steps,
    mode_strengths,
    saxe_trajectory,
    train_dln,
    weighted_steps,
)
from interp_toolkit.tasks.hierarchical import binary_tree_hierarchy, living_things, svd_modes

torch.set_num_threads(1)
LR = 0.05


def test_living_things_is_the_stated_hierarchy():
    data = living_things()
    assert data.items == ["canary", "robin", "salmon", "sunfish", "oak", "pine", "rose", "daisy"]
    assert data.targets.shape == (8, 30)
    canary = data.targets[data.item_index("canary")]
    has = {p for p, v in zip(data.properties, canary.tolist(), strict=True) if v == 1}
    assert {"can_grow", "can_move", "can_fly", "can_sing"} <= has
    assert "has_roots" not in has and "has_gills" not in has
    assert data.targets[:, data.properties.index("can_grow")].eq(1).all()
    assert data.lowest_common_level(0, 1) == 2  # canary, robin: birds
    assert data.lowest_common_level(0, 2) == 1  # canary, salmon: animals
    assert data.lowest_common_level(0, 4) == 0  # canary, oak: living things


def test_svd_modes_have_hierarchy_levels_in_order():
    modes = svd_modes(living_things())
    assert modes.levels == [0, 1, 2, 2, 3, 3, 3, 3]
    assert torch.all(modes.S[:-1] >= modes.S[1:] - 1e-6)
    # Reconstruction: U diag(s) V^T == Y^T.
    recon = modes.U @ torch.diag(modes.target_strengths) @ modes.V.T
    assert torch.allclose(recon, living_things().targets.T, atol=1e-5)


def test_binary_tree_generator_and_noise():
    clean = binary_tree_hierarchy(depth=4, properties_per_node=2)
    assert clean.n_items == 16 and clean.n_properties == 2 * (2**5 - 1)
    assert svd_modes(clean).levels == [0, 1, 2, 2] + [3] * 4 + [4] * 8
    noisy = binary_tree_hierarchy(depth=3, properties_per_node=1, noise=0.1, seed=1)
    assert not torch.equal(noisy.targets, binary_tree_hierarchy(3, 1).targets)
    assert torch.equal(noisy.targets, binary_tree_hierarchy(3, 1, noise=0.1, seed=1).targets)
    assert svd_modes(noisy).levels[:2] == [0, 1]
    with pytest.raises(UserError, match="depth"):
        binary_tree_hierarchy(depth=0)
    with pytest.raises(UserError, match="noise"):
        binary_tree_hierarchy(noise=-1.0)


def test_dln_hooks_and_validation():
    model = DeepLinearNetwork(DLNConfig(n_in=8, n_hidden=5, n_out=30))
    out, cache = model.run_with_cache(torch.eye(8))
    assert set(cache.keys()) == {"hook_hidden", "hook_output"}
    assert cache["hook_hidden"].shape == (8, 5)
    assert torch.allclose(out, torch.eye(8) @ model.network_map().T)
    with pytest.raises(UserError, match="init_scale"):
        DLNConfig(init_scale=0.0)
    with pytest.raises(UserError, match="aligned"):
        DeepLinearNetwork(DLNConfig(init="aligned"))
    with pytest.raises(UserError, match="lr"):
        DLNTrainConfig(lr=-1.0)


def _strength_curve(init: str, steps: int) -> tuple[torch.Tensor, torch.Tensor, object]:
    data = living_things()
    modes = svd_modes(data)
    model = DeepLinearNetwork(DLNConfig(8, 16, 30, init_scale=1e-3, init=init, seed=0), modes=modes)
    curve = [mode_strengths(model, modes)]
    gradient_descent(model, data.inputs, data.targets, LR, steps,
                     on_step=lambda step, m: curve.append(mode_strengths(m, modes)))
    return torch.arange(steps + 1), torch.stack(curve), modes


def test_aligned_start_follows_saxe_trajectories():
    t, curve, modes = _strength_curve("aligned", 900)
    for k in range(len(modes.S)):
        s = float(modes.target_strengths[k])
        theory = saxe_trajectory(t, s, 1e-3, LR, modes.input_variance)
        assert (curve[:, k] - theory).abs().max() < 0.04 * s, k
        assert curve[-1, k] > 0.98 * s


def test_random_small_init_learns_modes_in_order_of_singular_value():
    t, curve, modes = _strength_curve("random", 1400)
    half_times = []
    for k in range(len(modes.S)):
        s = float(modes.target_strengths[k])
        half_times.append(int((curve[:, k] >= s / 2).nonzero()[0]))
        # Sigmoidal: one effective a0 (from the half time) fits the whole curve.
        a0 = fit_initial_strength(t, curve[:, k], s, LR, modes.input_variance)
        theory = saxe_trajectory(t, s, a0, LR, modes.input_variance)
        assert (curve[:, k] - theory).abs().max() < 0.08 * s, k
    by_level = {}
    for level, time in zip(modes.levels, half_times, strict=True):
        by_level.setdefault(level, []).append(time)
    order = [max(by_level[level]) for level in sorted(by_level)]
    firsts = [min(by_level[level]) for level in sorted(by_level)]
    # Every mode of a coarser level is learned before any mode of a finer one.
    assert all(order[i] < firsts[i + 1] for i in range(len(order) - 1)), by_level


def test_train_dln_checkpoints_cache_and_resume(tmp_path):
    data = living_things()
    cfg, tcfg = DLNConfig(8, 16, 30, seed=2), DLNTrainConfig(lr=LR, steps=300, n_checkpoints=10)
    run = train_dln(data.inputs, data.targets, cfg, tcfg, run_dir=tmp_path / "run")
    assert sorted(run.checkpoints) == log_spaced_steps(300, 10)
    assert run.losses[-1] < run.losses[0]
    files = sorted((tmp_path / "run" / "checkpoints").glob("*.safetensors"))
    assert len(files) == len(run.checkpoints)
    again = train_dln(data.inputs, data.targets, cfg, tcfg, run_dir=tmp_path / "run")
    assert again.cache_hit
    assert torch.equal(again.model.W1.weight, run.model.W1.weight)
    # Simulate a crash after step 64: drop later checkpoints, mark the run unfinished.
    for path in files:
        if int(path.stem.split("_")[1]) > 64:
            path.unlink()
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    record["status"] = "running"
    (tmp_path / "run" / "run.json").write_text(json.dumps(record))
    resumed = train_dln(data.inputs, data.targets, cfg, tcfg, run_dir=tmp_path / "run")
    assert resumed.resumed_from is not None and resumed.resumed_from <= 64
    assert torch.equal(resumed.model.W2.weight, run.model.W2.weight)
    assert resumed.losses == run.losses
    with pytest.raises(UserError, match="different run"):
        train_dln(data.inputs, data.targets, DLNConfig(8, 16, 30, seed=3), tcfg, run_dir=tmp_path / "run")


def test_classical_mds_recovers_distances():
    gen = torch.Generator().manual_seed(0)
    points = torch.randn(6, 2, generator=gen, dtype=torch.float64) @ torch.randn(
        2, 5, generator=gen, dtype=torch.float64
    )
    coords, values = classical_mds(points, n_components=2)
    assert torch.allclose(torch.cdist(coords.double(), coords.double()), torch.cdist(points, points), atol=1e-4)
    assert values[0] >= values[1] > 0


def test_tree_from_dict_builds_expected_correlation_and_singular_values():
    from interp_toolkit.tasks.hierarchical import animals_and_plants, hierarchy_from_dict

    data = animals_and_plants()
    assert data.items == ["dog", "cat", "sparrow", "robin", "oak", "pine", "rose", "daisy"]
    assert data.n_properties == 15  # one per node (7) and per item (8)
    assert data.lowest_common_level(data.item_index("dog"), data.item_index("sparrow")) == 1
    assert data.lowest_common_level(data.item_index("dog"), data.item_index("cat")) == 2
    # Input-output correlation Sigma_yx[p, i] = 1/P iff property p's node is on item i's path.
    paths = {
        "dog": ["living thing", "animal", "mammal", "dog"], "cat": ["living thing", "animal", "mammal", "cat"],
        "sparrow": ["living thing", "animal", "bird", "sparrow"], "robin": ["living thing", "animal", "bird", "robin"],
        "oak": ["living thing", "plant", "tree", "oak"], "pine": ["living thing", "plant", "tree", "pine"],
        "rose": ["living thing", "plant", "flower", "rose"], "daisy": ["living thing", "plant", "flower", "daisy"],
    }
    expected = torch.zeros(15, 8)
    for i, item in enumerate(data.items):
        for node in paths[item]:
            expected[data.properties.index(f"is_{node}"), i] = 1 / 8
    assert torch.equal(data.targets.T / 8, expected)
    # Items sharing k+1 nodes: Y Y^T has eigenvalues 15, 7, 3, 3, 1, 1, 1, 1 (Saxe et al.).
    modes = svd_modes(data)
    assert modes.levels == [0, 1, 2, 2, 3, 3, 3, 3]
    expected_s = torch.tensor([15, 7, 3, 3, 1, 1, 1, 1], dtype=torch.float64).sqrt()
    assert torch.allclose(modes.target_strengths.double(), expected_s, atol=1e-5)
    # An unbalanced tree with two properties per node.
    small = hierarchy_from_dict({"animal": {"fish": ["salmon"], "bird": ["canary", "robin"]}, "plant": ["oak"]},
                                properties_per_node=2)
    assert small.items == ["salmon", "canary", "robin", "oak"]
    assert small.n_properties == 2 * (1 + 2 + 2 + 4)
    gram = small.targets @ small.targets.T  # 2 x shared nodes
    assert gram.tolist() == [[8, 4, 4, 2], [4, 8, 6, 2], [4, 6, 8, 2], [2, 2, 2, 6]]


@pytest.mark.parametrize(
    "tree, message",
    [({}, "non-empty dict"), ({"a": []}, "empty list"), ({"a": ["x", "x"]}, "twice"),
     ({"a": {"b": 3}}, "subtree must be"), ({"a": ["x", 5]}, "non-empty strings")],
)
def test_tree_from_dict_rejects_bad_trees(tree, message):
    from interp_toolkit.tasks.hierarchical import hierarchy_from_dict

    with pytest.raises(UserError, match=message):
        hierarchy_from_dict(tree)


def test_weighted_steps_gives_each_step_its_weights():
    c = torch.tensor([1.0, 0.0])
    assert [(step, w) for step, w in weighted_steps(3, None, start_step=4)] == [(4, None), (5, None), (6, None)]
    assert all(w is c for _, w in weighted_steps(2, c))
    by_step = [(step, float(w[0])) for step, w in weighted_steps(3, lambda s: torch.tensor([float(s)]), start_step=7)]
    assert by_step == [(7, 7.0), (8, 8.0), (9, 9.0)]
    assert list(weighted_steps(0, c)) == []
