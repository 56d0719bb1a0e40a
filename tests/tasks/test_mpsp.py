import pytest
import torch

from interp_toolkit.tasks.mpsp import TASKS, MPSPConfig, compute_features, make_split, make_splits


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("r", [0.0, 0.1, 0.37, 0.5, 0.9, 1.0])
def test_ratio_is_exact_and_labels_balanced(task, r):
    cfg = MPSPConfig.from_task(task, seq_len=6, n_values=10)
    n = 301
    split = make_split(cfg, r, n, seed=3)
    assert int(split.agrees.sum()) == round(r * n)
    assert split.r == pytest.approx(round(r * n) / n)
    m = cfg.modulus
    for group in (split.agrees, ~split.agrees):
        counts = torch.bincount(split.labels[group], minlength=m)
        if group.sum() > 0:
            assert int(counts.max() - counts.min()) <= 1, counts


@pytest.mark.parametrize("task", sorted(TASKS))
def test_features_match_definitions(task):
    cfg = MPSPConfig.from_task(task, seq_len=7, n_values=12)
    split = make_split(cfg, 0.5, 200, seed=1)
    m = cfg.modulus
    for values, label, shortcut in zip(split.values.tolist(), split.labels.tolist(), split.shortcut.tolist()):
        assert label == sum(values) % m
        expected = (max(values) if cfg.shortcut == "max" else values[0]) % m
        assert shortcut == expected
    assert torch.equal(split.agrees, split.shortcut == split.labels)
    assert split.tokens.shape == (200, cfg.seq_len + 1)
    assert torch.equal(split.tokens[:, :-1], split.values)
    assert bool((split.tokens[:, -1] == cfg.readout_token).all())
    assert int(split.values.max()) < cfg.n_values and int(split.values.min()) >= 0


def test_seeds_determine_data():
    cfg = MPSPConfig(seq_len=5)
    a, b, c = (make_split(cfg, 0.9, 100, seed=s) for s in (0, 0, 1))
    assert torch.equal(a.tokens, b.tokens)
    assert not torch.equal(a.tokens, c.tokens)


def test_standard_splits():
    cfg = MPSPConfig(seq_len=5, n_train=500, n_eval=200, r=0.7)
    splits = make_splits(cfg)
    assert set(splits) == {"train", "val", "adv"}
    assert len(splits["train"]) == 500 and len(splits["val"]) == 200
    assert splits["train"].r == pytest.approx(0.7)
    assert bool(splits["val"].agrees.all()) and not bool(splits["adv"].agrees.any())
    assert not torch.equal(splits["val"].values, splits["adv"].values[:200])
    again = make_splits(cfg)
    assert torch.equal(again["adv"].tokens, splits["adv"].tokens)


def test_anti_shortcut_regime_below_chance():
    cfg = MPSPConfig.from_task("max_mod3_sum_mod3", seq_len=6)
    split = make_split(cfg, 0.1, 1000, seed=0)  # below chance level 1/3
    assert int(split.agrees.sum()) == 100


def test_compute_features_first_shortcut():
    values = torch.tensor([[3, 8, 1], [4, 4, 4]])
    labels, shortcut = compute_features(values, "sum_mod3", "first")
    assert labels.tolist() == [0, 0] and shortcut.tolist() == [0, 1]


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "0.5", True])
def test_bad_ratio_raises(bad):
    with pytest.raises(ValueError, match="r must be"):
        make_split(MPSPConfig(), bad, 10, seed=0)
    with pytest.raises(ValueError, match="r must be"):
        MPSPConfig(r=bad)


@pytest.mark.parametrize("field,value", [("seq_len", 0), ("n_values", -1), ("n_train", 0), ("label", "sum_mod5"),
                                         ("shortcut", "last")])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        MPSPConfig(**{field: value})


def test_bad_n_raises():
    with pytest.raises(ValueError, match="n must be"):
        make_split(MPSPConfig(), 0.5, 0, seed=0)


def test_infeasible_groups_raise():
    # One value: sum = shortcut = 0 always, so no example can disagree.
    with pytest.raises(ValueError, match="n_values=1"):
        make_split(MPSPConfig(seq_len=4, n_values=1), 0.5, 10, seed=0)
    # A single element: sum == first == max, so r < 1 is impossible.
    with pytest.raises(ValueError, match="seq_len=1"):
        make_split(MPSPConfig(seq_len=1), 0.9, 10, seed=0)
    # ... but r = 1 works there.
    assert make_split(MPSPConfig(seq_len=1), 1.0, 10, seed=0).r == 1.0


def test_unknown_task_name():
    with pytest.raises(ValueError, match="unknown MPSP task"):
        MPSPConfig.from_task("parity")
    assert MPSPConfig.from_task("first_mod3_sum_mod3").name == "first_mod3_sum_mod3"
