import pytest
import torch

from interp_toolkit.errors import UserError
from interp_toolkit.tasks.mpsp import (
    TASKS,
    MPSPConfig,
    MPSPSplit,
    compute_features,
    make_split,
    make_splits,
    minimal_pairs,
)


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
    with pytest.raises(UserError, match="r must be"):
        make_split(MPSPConfig(), bad, 10, seed=0)
    with pytest.raises(UserError, match="r must be"):
        MPSPConfig(r=bad)


@pytest.mark.parametrize("field,value", [("seq_len", 0), ("n_values", -1), ("n_train", 0), ("label", "sum_mod5"),
                                         ("shortcut", "last")])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(UserError, match=field):
        MPSPConfig(**{field: value})


def test_bad_n_raises():
    with pytest.raises(UserError, match="n must be"):
        make_split(MPSPConfig(), 0.5, 0, seed=0)


def test_infeasible_groups_raise():
    # One value: sum = shortcut = 0 always, so no example can disagree.
    with pytest.raises(UserError, match="n_values=1"):
        make_split(MPSPConfig(seq_len=4, n_values=1), 0.5, 10, seed=0)
    # A single element: sum == first == max, so r < 1 is impossible.
    with pytest.raises(UserError, match="seq_len=1"):
        make_split(MPSPConfig(seq_len=1), 0.9, 10, seed=0)
    # ... but r = 1 works there.
    assert make_split(MPSPConfig(seq_len=1), 1.0, 10, seed=0).r == 1.0


def test_unknown_task_name():
    with pytest.raises(UserError, match="unknown MPSP task"):
        MPSPConfig.from_task("parity")
    assert MPSPConfig.from_task("first_mod3_sum_mod3").name == "first_mod3_sum_mod3"


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("seq_len", range(3, 13))
def test_minimal_pairs_differ_in_one_token_keep_the_shortcut_and_move_the_label(task, seq_len):
    cfg = MPSPConfig.from_task(task, seq_len=seq_len, n_values=10, n_train=8, n_eval=8)
    for r in (1.0, 0.0):  # val -> adv-like targets, and the reverse direction from adv
        split = make_split(cfg, r, 48, seed=seq_len)
        pairs = minimal_pairs(split, seed=1)
        assert len(pairs) >= 40  # only examples without any valid edit are skipped
        src, tgt = pairs.source, pairs.target
        differs = src.values != tgt.values
        assert (differs.sum(dim=1) == 1).all()
        rows = torch.arange(len(pairs))
        assert (differs[rows, pairs.position]).all()
        assert (tgt.values[rows, pairs.position] - src.values[rows, pairs.position] == pairs.delta).all()
        assert ((tgt.values >= 0) & (tgt.values < cfg.n_values)).all()
        assert torch.equal(src.shortcut, tgt.shortcut)
        assert (src.labels != tgt.labels).all()
        assert torch.equal(tgt.agrees, ~src.agrees)
        assert torch.equal(tgt.tokens[:, -1], src.tokens[:, -1])  # readout token kept
        # labels and shortcut recomputed from the edited values
        labels, feature = compute_features(tgt.values, cfg.label, cfg.shortcut)
        assert torch.equal(labels, tgt.labels) and torch.equal(feature, tgt.shortcut)
        if cfg.shortcut == "max":
            assert torch.equal(src.values.max(1).values, tgt.values.max(1).values)
            assert (tgt.values[rows, pairs.position] <= src.values.max(1).values).all()
        else:
            assert (pairs.position != 0).all()
        # the smallest step: |delta| = 1 whenever a +-1 edit of an allowed position exists
        if cfg.modulus == 2 or r == 1.0:
            assert (pairs.delta.abs() == 1).float().mean() > 0.9
        assert torch.equal(pairs.swapped().source.values, tgt.values)
        assert torch.equal(pairs.head(5).target.values, tgt.values[:5])


def test_minimal_pairs_bad_input():
    cfg = MPSPConfig(seq_len=4, n_train=8, n_eval=8)
    split = make_split(cfg, 1.0, 16, seed=0)
    with pytest.raises(UserError, match="n=999"):
        minimal_pairs(split, n=999)
    bare = MPSPSplit(split.values, split.tokens, split.labels, split.shortcut, split.agrees, 1.0)
    with pytest.raises(UserError, match="records its task"):
        minimal_pairs(bare)
    zeros = MPSPConfig(seq_len=3, n_values=1, n_train=4, n_eval=4)
    with pytest.raises(UserError, match="no example"):
        minimal_pairs(make_split(zeros, 1.0, 4, seed=0))


@pytest.mark.parametrize("task_name", sorted(TASKS))
def test_example_features_of_every_task_variant(task_name):
    from interp_toolkit.tasks.mpsp import example_features

    cfg = MPSPConfig.from_task(task_name, seq_len=4, n_values=10)
    values = torch.tensor([[1, 3, 5, 7], [2, 9, 9, 0], [6, 6, 6, 6]])
    features = example_features(values, cfg)
    m = cfg.modulus
    residue_names = ["n_odd"] if m == 2 else ["n_mod3_0", "n_mod3_1", "n_mod3_2"]
    assert list(features)[: len(residue_names) + 4] == [*residue_names, "label", "shortcut", "max", "max_count"]
    if m == 2:
        assert features["n_odd"].tolist() == [4, 2, 0]
    else:
        assert [features[f"n_mod3_{c}"].tolist() for c in range(3)] == [[1, 3, 4], [2, 0, 0], [1, 1, 0]]
    labels, shortcut = compute_features(values, cfg.label, cfg.shortcut)
    assert features["label"].tolist() == labels.tolist() == (values.sum(-1) % m).tolist()
    assert features["shortcut"].tolist() == shortcut.tolist()
    assert features["max"].tolist() == [7, 9, 6]
    assert features["max_count"].tolist() == [1, 2, 4]
    if cfg.shortcut == "max":
        assert features["max_position"].tolist() == [3, 1, 0]  # the first position of a tied max
        assert "first_value" not in features
    else:
        assert features["first_value"].tolist() == [1, 2, 6]
        assert "max_position" not in features


def test_example_features_refuse_values_of_another_length():
    from interp_toolkit.tasks.mpsp import example_features

    with pytest.raises(UserError, match=r"integer tensor \[n, 5\].*\(2, 4\)"):
        example_features(torch.zeros(2, 4, dtype=torch.long), MPSPConfig(seq_len=5))


# --- extreme-count enrichment (a labelled departure for extrapolation tests) -------------

def _extreme_cfg(**kwargs):
    return MPSPConfig(seq_len=8, n_train=4096, n_eval=256, r=0.9, **kwargs)


@pytest.mark.parametrize("k", [0, 3, 40])
def test_extreme_train_holds_exactly_k_and_keeps_size_ratio_and_labels(k):
    from interp_toolkit.tasks.mpsp import is_extreme_count

    plain = make_splits(_extreme_cfg())["train"]
    split = make_splits(_extreme_cfg(extreme_train=k))["train"]
    all_odd = (split.values % 2 == 1).all(-1)  # independent of is_extreme_count
    assert int(all_odd.sum()) == k == int(is_extreme_count(split.values, 2).sum())
    assert len(split) == len(plain) and split.r == plain.r
    assert torch.equal(torch.bincount(split.labels, minlength=2), torch.bincount(plain.labels, minlength=2))
    assert torch.equal(split.labels, split.values.sum(-1) % 2)
    # only swapped examples move, and every all-odd sequence is anti-shortcut at an even length
    moved = (split.values != plain.values).any(-1)
    natural = int((plain.values % 2 == 1).all(-1).sum())
    assert int(moved.sum()) == abs(k - natural)
    assert not split.agrees[all_odd].any()


def test_extreme_train_leaves_eval_splits_and_default_key_alone():
    plain, enriched = make_splits(_extreme_cfg()), make_splits(_extreme_cfg(extreme_train=40))
    for name in ("val", "adv"):
        assert torch.equal(plain[name].values, enriched[name].values)
    assert "extreme_train" not in _extreme_cfg().to_dict()
    assert MPSPConfig.from_dict(_extreme_cfg(extreme_train=40).to_dict()).extreme_train == 40


@pytest.mark.parametrize("value", [-1, 5000, True, 1.5])
def test_extreme_train_out_of_range_is_refused_by_name(value):
    with pytest.raises(UserError, match="MPSPConfig.extreme_train"):
        _extreme_cfg(extreme_train=value)
