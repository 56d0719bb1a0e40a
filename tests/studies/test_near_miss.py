"""near_miss_of_run: the best adversarial accuracy, the examples still wrong there and their group."""

from __future__ import annotations

import json

import pytest

from interp_toolkit.checkpoint import save_checkpoint
from interp_toolkit.errors import UserError
from interp_toolkit.io import atomic_write_json
from interp_toolkit.studies.near_miss import (
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
    assert (run_dir / "analyses" / "near_miss_at_best" / "near_miss_at_best.csv").is_file()
    # a margin wide enough for these misses makes it a near miss
    assert near_miss_of_run(run_dir, margin=0.25).within_1pct


def test_a_checkpoint_off_the_best_evaluation_is_named(tmp_path, missed):
    best = 1 - missed / 128
    run_dir = _run(tmp_path, [0.5, best, best - 0.01, 0.7], checkpoint_epochs=[0, 20, 30])
    near = near_miss_of_run(run_dir, group_margin=0.25, out_dir=tmp_path / "elsewhere")
    assert (tmp_path / "elsewhere" / "near_miss_at_best.csv").is_file()
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
