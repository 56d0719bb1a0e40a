"""interp_toolkit.studies.mechanism.weight_norms: finished runs only, tables, figure, decay shares."""

import csv
import json
import shutil

import pytest

from interp_toolkit.errors import UserError
from interp_toolkit.studies.mechanism.weight_norms import (
    decay_share_lines,
    median_series,
    replot,
    weight_norm_study,
)


def test_weight_norm_study_on_a_study(tiny_run, tmp_path, capsys):
    run_dir, _ = tiny_run
    study = tmp_path / "study"
    shutil.copytree(run_dir, study / "runs" / "finished")
    (study / "runs" / "finished" / "outcome.json").write_text(json.dumps({"generalized": False}))
    shutil.copytree(run_dir, study / "runs" / "still_training")  # no outcome.json: left out
    result = weight_norm_study([study], tmp_path / "out", name="wn", from_epoch=3)
    assert "[1/1] finished: 6 computed, 0 cached" in capsys.readouterr().out
    rows = list(csv.DictReader(result.table.open()))
    assert result.table == tmp_path / "out" / "wn.csv"
    assert {r["epoch"] for r in rows} == {"0", "1", "2", "3", "4", "6"} and {r["seed"] for r in rows} == {"0"}
    whole = {r["epoch"]: r for r in rows if r["group"] == "all"}  # measured against the run's epoch 0
    assert float(whole["0"]["cosine"]) == pytest.approx(1.0) and float(whole["0"]["distance"]) == 0
    assert float(whole["6"]["distance"]) > 0
    rates = list(csv.DictReader(result.rates_table.open()))
    assert rates and len(rates) == len(result.rates)
    for rate in rates:  # epochs 4 -> 6 are the last two checkpoints from epoch 3 on
        assert (rate["from_epoch"], rate["to_epoch"]) == ("4", "6")
        expected = (float(rate["norm_to"]) / float(rate["norm_from"]) - 1) / 2
        assert float(rate["rate_per_step"]) == pytest.approx(expected)
    assert result.figure.read_bytes()[:4] == b"\x89PNG"
    lines = decay_share_lines(result.rates)
    assert len(lines) == 1 and lines[0].startswith("1L r=0.75") and "all " in lines[0]
    # the figure redraws from the table alone
    result.figure.unlink()
    assert replot(result.table) == result.figure and result.figure.read_bytes()[:4] == b"\x89PNG"

    # a rerun reads every checkpoint from the cache
    weight_norm_study([study], tmp_path / "out", name="wn", from_epoch=3)
    assert "[1/1] finished: 0 computed, 6 cached" in capsys.readouterr().out

    with pytest.raises(UserError, match="from_epoch must be an integer >= 0, got -1"):
        weight_norm_study([study], tmp_path / "o2", from_epoch=-1)
    shutil.rmtree(study / "runs" / "finished")
    with pytest.raises(UserError, match="no finished runs"):
        weight_norm_study([study], tmp_path / "o2")
    with pytest.raises(UserError, match="not a sweep study directory"):
        weight_norm_study([tmp_path / "out"], tmp_path / "o2")
    assert not (tmp_path / "o2").exists()  # refused before any work


def test_weight_norm_medians_skip_epochs_only_early_stopped_runs_have():
    def row(seed, epoch, norm):
        return {"study": "s", "cell": "c", "seed": seed, "group": "all", "epoch": epoch, "norm": norm, "cosine": 1.0}

    rows = [row(seed, epoch, 2.0) for seed in (1, 2, 3) for epoch in (0, 10)]
    rows += [row(1, 7, 1.0), row(2, 20, 3.0), row(3, 20, 5.0)]  # seed 1 stopped at epoch 7
    epochs, values = median_series(rows, "norm")["c", "all"]
    assert epochs == [0, 10, 20] and values == [1.0, 1.0, 2.0]  # norm / norm at epoch 0, median of 2 runs


@pytest.mark.parametrize("schedule", [{}, {"warmup_steps": 3, "lr_schedule": "cosine", "min_lr_ratio": 0.1}])
def test_weight_norms_count_optimizer_steps_not_epochs(tmp_path, schedule):
    """A minibatch run takes ceil(n_train / batch) steps per epoch; decay acts per step, with the run's own schedule."""
    import math

    from interp_toolkit.model import ModelConfig, build_model
    from interp_toolkit.runs.trainer import TrainConfig, train
    from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits

    task = MPSPConfig(seq_len=5, n_values=10, n_train=100, n_eval=32, r=0.75)  # batch 32: 4 steps per epoch
    cfg = ModelConfig(n_layers=1, n_heads=1, d_model=16, attn_only=True, **task.model_dims())
    train_cfg = TrainConfig(epochs=4, eval_every=2, checkpoint_every=2, checkpoint_log_spaced=False, progress=False,
                            lr=1e-2, weight_decay=0.5,
                            batch_size=32, **schedule)
    run_dir = tmp_path / "study" / "runs" / "mini"
    train(build_model(cfg), make_splits(task), train_cfg, run_dir,
          run_info={"task": {"name": task.name, **task.to_dict()}})
    (run_dir / "outcome.json").write_text(json.dumps({"generalized": False}))
    result = weight_norm_study([tmp_path / "study"], tmp_path / "out", name="wn", from_epoch=0, progress=False)
    rows = [r for r in csv.DictReader(result.table.open()) if r["group"] == "all"]
    assert {(r["epoch"], r["step"], r["steps_per_epoch"]) for r in rows} == {("0", "0", "4"), ("2", "8", "4"),
                                                                           ("4", "16", "4")}
    lrs = [train_cfg.lr_at(s, 16) for s in range(1, 17)]
    by_hand = {e: math.prod(1 - lr * 0.5 for lr in lrs[:4 * e]) for e in (0, 2, 4)}
    for r in rows:
        assert float(r["pure_decay"]) == pytest.approx(by_hand[int(r["epoch"])], rel=1e-12)
    for rate in result.rates:  # epochs 2 -> 4 are 8 steps apart
        assert rate["rate_per_step"] == pytest.approx((rate["norm_to"] / rate["norm_from"] - 1) / 8)
        if schedule:  # the geometric mean of (1 - lr_s wd) over steps 9..16, minus 1
            assert rate["pure_decay_rate"] == pytest.approx((by_hand[4] / by_hand[2]) ** (1 / 8) - 1)
            assert rate["pure_decay_rate"] > -1e-2 * 0.5  # the cosine has lowered the rate below lr * wd
        else:
            assert rate["pure_decay_rate"] == -1e-2 * 0.5
    assert replot(result.table).read_bytes()[:4] == b"\x89PNG"  # the figure redraws with the steps column
