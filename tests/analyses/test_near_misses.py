"""near_misses: wrong examples grouped by task features, on a hand-built model wrong on one group."""

import math

import pytest
import torch

from interp_toolkit.analyses.near_misses import describe_groups, failing_groups, near_misses
from interp_toolkit.analyses.over_checkpoints import over_checkpoints
from interp_toolkit.errors import UserError

from .conftest import SEQ_LEN, hand_built_parity_model

MISSED_COUNT = 4  # the hand-built model gets every sequence with 4 odd values (of 5) wrong


def parity_model_missing_one_count(count: int = MISSED_COUNT):
    """conftest's sum-parity circuit with one odd-value count answered wrong.

    Its MLP writes the sum-parity sign ``f(c)`` of the count c of odd values as a sum of
    ``w_j relu(c - j)``; adding ``delta`` to ``w_{k-1}`` and ``w_{k+1}`` and ``-2 delta`` to
    ``w_k`` adds a bump ``delta * [c == k]`` (zero at every other integer c). delta = 4 moves
    the sign at c = k from -1 (even) to +3 (odd), which outweighs the max-parity head: only
    sequences with k odd values are predicted wrong, whatever their max.
    """
    assert 1 <= count < SEQ_LEN
    model = hand_built_parity_model()
    delta = 4.0 if count % 2 == 0 else -4.0
    with torch.no_grad():
        w_out = model.state_dict()["blocks.0.mlp.out.weight"].clone()
        w_out[6, count - 1] += delta
        w_out[6, count] -= 2 * delta
        w_out[6, count + 1] += delta
        model.load_state_dict({**model.state_dict(), "blocks.0.mlp.out.weight": w_out})
    return model


@pytest.fixture(scope="module")
def missing_model():
    return parity_model_missing_one_count()


def test_the_hand_built_model_is_wrong_exactly_on_one_count(missing_model, splits):
    for split in splits.values():
        logits = missing_model(split.tokens)[:, -1, :]
        wrong = logits.argmax(-1) != split.labels
        n_odd = (split.values % 2).sum(-1)
        assert torch.equal(wrong, n_odd == MISSED_COUNT)
        assert 0 < int(wrong.sum()) < len(wrong)


def test_near_misses_names_the_one_wrong_group_with_its_size_and_accuracy(missing_model, splits):
    result = near_misses(missing_model, splits)
    table = result.table
    for name, split in splits.items():
        n_odd = (split.values % 2).sum(-1)
        size = int((n_odd == MISSED_COUNT).sum())
        row = table.where(split=name, feature="n_odd", value=MISSED_COUNT).rows[0]
        assert (row["n"], row["n_wrong"], row["accuracy"], row["wrong_share"]) == (size, size, 0.0, 1.0)
        others = [r for r in table.where(split=name, feature="n_odd").rows if r["value"] != MISSED_COUNT]
        assert others and all(r["n_wrong"] == 0 and r["accuracy"] == 1.0 for r in others)
        # every feature partitions the split: its group sizes add up to the split
        for feature in result.config["features"]:
            rows = table.where(split=name, feature=feature).rows
            assert sum(r["n"] for r in rows) == len(split)
            assert sum(r["n_wrong"] for r in rows) == size
        groups = failing_groups(table.rows, name)
        assert [(g["feature"], g["value"], g["n"], g["accuracy"]) for g in groups] == [
            ("n_odd", MISSED_COUNT, size, 0.0)]
        assert describe_groups(groups) == f"n_odd={MISSED_COUNT} ({size} of {size} wrong)"
        assert torch.equal(result.tensors[f"{name}_wrong"], n_odd == MISSED_COUNT)
    # the share columns: of the training split, and of its anti-shortcut examples
    train = splits["train"]
    in_train = (train.values % 2).sum(-1) == MISSED_COUNT
    row = table.where(split="adv", feature="n_odd", value=MISSED_COUNT).rows[0]
    assert row["train_count"] == int(in_train.sum())
    assert row["train_share"] == pytest.approx(int(in_train.sum()) / len(train))
    anti = ~train.agrees
    assert row["anti_train_count"] == int((in_train & anti).sum())
    assert row["anti_train_share"] == pytest.approx(int((in_train & anti).sum()) / int(anti.sum()))


def test_a_split_without_wrong_examples_has_no_failing_group(hand_parity_model, splits):
    result = near_misses(hand_parity_model, splits, split_names=["adv"], n=64)
    rows = result.table.where(split="adv").rows
    assert all(r["n_wrong"] == 0 and math.isnan(r["wrong_share"]) for r in rows)
    assert sum(r["n"] for r in rows if r["feature"] == "label") == 64
    assert failing_groups(rows, "adv") == [] and describe_groups([]) == ""


def test_the_purest_feature_wins_and_many_groups_are_counted():
    rows = [{"split": "adv", "feature": "n_odd", "value": 7, "n": 100, "n_wrong": 2, "accuracy": 0.98},
            {"split": "adv", "feature": "n_odd", "value": 8, "n": 13, "n_wrong": 13, "accuracy": 0.0},
            {"split": "adv", "feature": "label", "value": 0, "n": 1000, "n_wrong": 15, "accuracy": 0.985}]
    groups = failing_groups(rows, "adv")
    assert [g["value"] for g in groups] == [7, 8]  # purity 15/113 beats label's 15/1000
    assert describe_groups(groups, max_groups=1) == "n_odd=7 (2 of 100 wrong); 1 more groups (13 wrong)"
    with pytest.raises(UserError, match=r"no near_misses row of split 'val'.*\['adv'\]"):
        failing_groups(rows, "val")


def test_bad_splits_are_refused_before_any_work(missing_model, splits):
    with pytest.raises(UserError, match="split 'nope' not found"):
        near_misses(missing_model, splits, split_names=["nope"])
    plain = type("Plain", (), {"tokens": splits["adv"].tokens, "labels": splits["adv"].labels})()
    with pytest.raises(UserError, match="split 'adv' must be an MPSP split"):
        near_misses(missing_model, {"adv": plain})


def test_near_misses_over_checkpoints_is_cached_and_plotted(tiny_run, tmp_path):
    run_dir, splits = tiny_run
    result = over_checkpoints("near_misses", run_dir, epochs=[0, 6], out_dir=tmp_path / "nm", progress=False)
    assert sorted(set(result.table.column("epoch"))) == [0, 6]
    adv = result.table.where(epoch=6, split="adv", feature="n_odd").rows
    assert sum(r["n"] for r in adv) == len(splits["adv"])
    assert result.png_path.is_file() and result.csv_path.is_file()
    again = over_checkpoints("near_misses", run_dir, epochs=[0, 6], out_dir=tmp_path / "nm", progress=False,
                             plot=False)
    assert again.cache_hits == [0, 6] and again.table.rows == result.table.rows
