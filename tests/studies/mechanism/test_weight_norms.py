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
