"""near_miss_of_run: the best adversarial accuracy, the examples still wrong there and their group."""

from __future__ import annotations

import json

import pytest
import torch

from interp_toolkit.checkpoint import save_checkpoint
from interp_toolkit.errors import UserError
from interp_toolkit.io import atomic_write_json
from interp_toolkit.studies.common.near_miss import (
    NEAR_MISS_FIELDS,
    choose_checkpoint,
    near_miss_of_run,
)
from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits
from tests.analyses.test_near_misses import MISSED_COUNT, parity_model_missing_one_count

TASK = MPSPConfig(seq_len=5, n_values=10, r=0.75, n_train=256, n_eval=128, seed=0)


def _run(root, adv_accs, checkpoint_epochs, model=None, every=10):
    """A run directory: run.json with the task, metrics every ``every`` epochs, and the
    hand-built model (wrong on exactly the 4-odd-value sequences) saved at ``checkpoint_epochs``."""
    run_dir = root / "run"
    run_dir.mkdir(parents=True)
    atomic_write_json(run_dir / "run.json", {
        "key": "k", "status": "finished", "run_info": {"task": {"name": TASK.name, **TASK.to_dict()}},
        "model_config": {}, "train_config": {}, "split_sizes": {"train": 256, "val": 128, "adv": 128}})
    lines = [{"epoch": i * every, "val_acc": 1.0, "adv_acc": acc} for i, acc in enumerate(adv_accs)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    model = model or parity_model_missing_one_count()
    for epoch in checkpoint_epochs:
        save_checkpoint(model, run_dir / "checkpoints" / f"epoch_{epoch:06d}.safetensors", metadata={"epoch": epoch})
    return run_dir


@pytest.fixture(scope="module")
def missed():
    """How many adversarial examples of TASK have 4 odd values (the hand-built model's misses)."""
    adv = make_splits(TASK)["adv"]
    return int(((adv.values % 2).sum(-1) == MISSED_COUNT).sum())


def test_near_miss_counts_the_one_wrong_group_at_the_best_evaluation(tmp_path, missed):
    best = 1 - missed / 128
    # at length 5 every count of odd values is common (24 of 128 here): a wider group margin
    # than the default 5 points, so that the groups are read
    assert 0.75 <= best < 0.95
    run_dir = _run(tmp_path, [0.5, 0.02, best, 0.7], checkpoint_epochs=[0, 20, 30])
    assert near_miss_of_run(run_dir).groups == []
    near = near_miss_of_run(run_dir, group_margin=0.25)
    assert (near.best_acc, near.best_epoch, near.n_examples) == (best, 20, 128)
    assert near.n_wrong_at_best == missed == near.n_wrong_at_checkpoint
    assert near.checkpoint_epoch == 20 and not near.met_criterion
    assert [(g["feature"], g["value"], g["n"], g["n_wrong"], g["accuracy"]) for g in near.groups] == [
        ("n_odd", MISSED_COUNT, missed, missed, 0.0)]
    fields = near.fields()
    assert tuple(fields) == NEAR_MISS_FIELDS
    assert fields["near_miss_groups"] == f"n_odd={MISSED_COUNT} ({missed} of {missed} wrong)"
    assert fields["n_adv_wrong_at_best"] == missed and fields["best_adv_epoch"] == 20
    assert fields["within_1pct"] is False
    assert f"{missed} of 128 still wrong, all in n_odd={MISSED_COUNT}" in near.describe()
    assert (run_dir / "analyses" / "near_miss_at_best" / "near_miss_at_best_epochs_20.csv").is_file()
    # a margin wide enough for these misses makes it a near miss
    assert near_miss_of_run(run_dir, margin=0.25).within_1pct


def test_a_checkpoint_off_the_best_evaluation_is_named(tmp_path, missed):
    best = 1 - missed / 128
    run_dir = _run(tmp_path, [0.5, best, best - 0.01, 0.7], checkpoint_epochs=[0, 20, 30])
    near = near_miss_of_run(run_dir, group_margin=0.25, out_dir=tmp_path / "elsewhere")
    assert (tmp_path / "elsewhere" / "near_miss_at_best_epochs_20.csv").is_file()
    assert near.best_epoch == 10 and near.checkpoint_epoch == 20  # the best logged accuracy among checkpoints
    assert near.n_wrong_at_checkpoint == missed  # what the checkpoint got wrong (the metrics are made up)
    assert "nearest checkpoint, epoch 20" in near.describe()


def test_runs_that_met_the_criterion_or_stayed_on_the_shortcut_read_no_groups(tmp_path):
    met = near_miss_of_run(_run(tmp_path / "a", [0.5, 1.0, 0.9], checkpoint_epochs=[]))
    assert met.met_criterion and met.n_wrong_at_best == 0 and not met.within_1pct and met.groups == []
    assert met.fields()["near_miss_groups"] == ""
    stuck = near_miss_of_run(_run(tmp_path / "b", [0.02, 0.01, 0.03], checkpoint_epochs=[0]))
    assert stuck.n_wrong_at_best == round(0.97 * 128) and stuck.groups == [] and stuck.checkpoint_epoch is None
    assert "no group read" in stuck.describe()


def test_choose_checkpoint():
    accs = {0: 0.5, 100: 0.98, 110: 0.994, 200: 0.97, 300: 0.98}
    assert choose_checkpoint([0, 100, 110, 200], accs, 110) == 110
    assert choose_checkpoint([0, 100, 200, 300], accs, 110) == 100  # 0.98 at 100 and 300: the nearer
    assert choose_checkpoint([], accs, 110) is None


def test_bad_input_is_refused(tmp_path):
    run_dir = _run(tmp_path, [0.5], checkpoint_epochs=[])
    with pytest.raises(UserError, match="margin must be a number in \\[0, 1\\], got 2"):
        near_miss_of_run(run_dir, margin=2)
    with pytest.raises(UserError, match="no evaluation with train_acc"):
        near_miss_of_run(run_dir, split="train")


def all_odd_missing_model(seq_len: int):
    """tests/analyses/conftest.py's sum-parity circuit at ``seq_len`` values, wrong exactly on the
    all-odd sequences (the near miss of the length-8 probes in ../shared/FACTS.md).

    Head 0 counts the odd values (uniform attention, "is odd" copied); hidden unit j of the
    MLP is relu(count - j), and its output ``-1 + 2 h_0 - 4 h_1 + 4 h_2 ...`` is the sum-parity
    sign. Adding 4 to ``w_{k-1}`` and -8 to ``w_k`` (k = seq_len) adds 4 at count k only
    (counts never exceed k), which turns the all-odd sequences' sign (even length: even sum) to
    odd. Head 1 copies the max's parity sign with a smaller weight, so the shortcut never decides.
    """
    from interp_toolkit.model import ModelConfig, build_model

    assert seq_len % 2 == 0  # an all-odd sequence has an even sum
    cfg = ModelConfig(n_layers=1, n_heads=2, d_vocab=11, n_ctx=seq_len + 1, d_vocab_out=2, d_model=8, d_head=4,
                      d_mlp=seq_len + 1, normalization=None, act_fn="relu")
    model = build_model(cfg)
    sd = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    for v in range(10):
        sd["embed.weight"][v, 0] = float(v)
        sd["embed.weight"][v, 2] = 1.0 if v % 2 else -1.0
        sd["embed.weight"][v, 3] = float(v % 2)
    sd["embed.weight"][10, 1] = 1.0
    q, k, vw, o = (sd[f"blocks.0.attn.{x}.weight"] for x in "qkvo")
    vw[0, 3], o[4, 0] = 1.0, float(seq_len + 1)  # head 0: the count of odd values into dim 4
    q[4, 1], k[4, 0], vw[4, 2], o[5, 4] = 40.0, 1.0, 1.0, 1.0  # head 1: the max's parity sign into dim 5
    w_in, b_in, w_out = sd["blocks.0.mlp.in.weight"], sd["blocks.0.mlp.in.bias"], sd["blocks.0.mlp.out.weight"]
    for j in range(seq_len + 1):
        w_in[j, 4], b_in[j] = 1.0, -float(j)
        w_out[6, j] = 2.0 if j == 0 else 4.0 * (-1) ** j
    w_out[6, seq_len - 1] += 4.0
    w_out[6, seq_len] -= 8.0
    sd["blocks.0.mlp.out.bias"][6] = -1.0
    sd["unembed.weight"][1, 6], sd["unembed.weight"][0, 6] = 2.0, -2.0
    sd["unembed.weight"][1, 5], sd["unembed.weight"][0, 5] = 0.5, -0.5
    model.load_state_dict(sd)
    model.eval()
    return model


def test_the_all_odd_near_miss_at_length_8_is_within_1pct_and_named(tmp_path):
    """The issue's case: 13 of 2,048 adversarial sequences wrong, all of them all-odd."""
    task = MPSPConfig(seq_len=8, n_values=10, r=0.9, n_train=16_384, n_eval=2_048, seed=0)
    splits = make_splits(task)
    all_odd = {name: (split.values % 2).sum(-1) == 8 for name, split in splits.items()}
    n_adv, n_train = int(all_odd["adv"].sum()), int(all_odd["train"].sum())
    assert (n_adv, n_train) == (13, 9)  # the counts ../shared/FACTS.md reports for this data
    model = all_odd_missing_model(8)
    wrong = model(splits["adv"].tokens)[:, -1, :].argmax(-1) != splits["adv"].labels
    assert torch.equal(wrong, all_odd["adv"])

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    atomic_write_json(run_dir / "run.json", {
        "key": "k", "status": "finished", "run_info": {"task": {"name": task.name, **task.to_dict()}},
        "model_config": {}, "train_config": {}, "split_sizes": {"train": 16_384, "val": 2_048, "adv": 2_048}})
    best = 1 - n_adv / 2048
    lines = [{"epoch": e, "val_acc": 1.0, "adv_acc": a} for e, a in ((0, 0.5), (50, 0.0), (100, best), (150, 0.0))]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    save_checkpoint(model, run_dir / "checkpoints" / "epoch_000100.safetensors", metadata={"epoch": 100})

    near = near_miss_of_run(run_dir)  # default margins: a 0.6-point miss
    fields = near.fields()
    assert fields == {"best_adv_acc": best, "best_adv_epoch": 100, "n_adv_wrong_at_best": 13, "within_1pct": True,
                      "near_miss_groups": "n_odd=8 (13 of 13 wrong)", "near_miss_epoch": 100,
                      "n_adv_wrong_at_checkpoint": 13}
    (group,) = near.groups
    # training holds 9 all-odd sequences of 16,384, every one anti-shortcut (even sum, odd max)
    assert (group["train_count"], group["anti_train_count"]) == (9, 9)
    assert group["anti_train_share"] == pytest.approx(9 / int((~splits["train"].agrees).sum()))
    assert near.describe() == ("adv accuracy peaked at 99.37% (epoch 100): 13 of 2048 still wrong, all in "
                               "n_odd=8 (13 of 13 wrong) (checkpoint at epoch 100)")
