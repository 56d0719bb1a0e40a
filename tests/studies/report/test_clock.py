"""Rates against decay clocks: censoring, reached vs held, pooling across horizons, the report."""

from __future__ import annotations

import csv

import pytest

from interp_toolkit.cli import main
from interp_toolkit.errors import UserError
from interp_toolkit.plotting import drawn_series
from interp_toolkit.studies.report.clock import clock_table, setting_fields
from interp_toolkit.studies.report.plots import plot_rate_vs_clock
from tests.studies.fakes import GEN, STUCK, make_run

#: 16,384 examples in batches of 512 at lr 1e-3, wd 1.0: 32 steps an epoch, 0.032 clocks an epoch.
HOT = {"task": "max_parity_sum_parity", "n_train": 16_384, "batch_size": 512, "lr": 1e-3, "weight_decay": 1.0,
       "n_layers": 2, "n_heads": 2, "r": 0.9}


def _run(study, epochs, final, gen=None, left=None, **settings):
    return {**HOT, "study": study, "epochs": epochs, "eval_every": 10, "final_epoch": final,
            "first_generalized_epoch": gen, "left_epoch": left, **settings}


def _at(table, clock, **setting):
    rows = [row for row in table if abs(row["decay_clocks"] - clock) < 1e-9
            and all(row[k] == v for k, v in setting.items())]
    assert len(rows) == 1, (clock, setting, rows)
    return rows[0]


def test_reached_and_held_count_the_runs_that_trained_that_far():
    rows = [_run("stage2", 150, 150, gen=70, left=120),  # in its basin from clock 2.24 to 3.84
            _run("stage2", 150, 150, gen=100),  # from 3.2 to its end, 4.8
            _run("stage1", 300, 300),  # never: trained to 9.6, one study and horizon of its own
            _run("stage1", 300, 40)]  # still training at epoch 40 (1.28): censored there
    table = clock_table(rows)
    assert len({row["setting"] for row in table}) == 1  # stages and horizons pool into one setting
    assert {row["studies"] for row in table} == {"stage1; stage2"}  # and the table names what it pooled
    expected = {1.28: (4, 0, 0), 2.24: (3, 1, 1), 3.2: (3, 2, 2), 3.84: (3, 2, 1), 4.8: (3, 2, 1), 9.6: (1, 0, 0)}
    assert [row["decay_clocks"] for row in table] == sorted(expected)
    for clock, (observed, reached, held) in expected.items():
        row = _at(table, clock)
        assert (row["n_observed"], row["n_reached"], row["n_held"]) == (observed, reached, held), clock
        assert row["reached_rate"] == pytest.approx(reached / observed)
        assert row["held_rate"] == pytest.approx(held / observed)
        assert row["reached_low"] <= row["reached_rate"] <= row["reached_high"]
    # 2 of 3 at clock 3.2: the Wilson score interval, written out, z = 1.96
    z, p, n = 1.959963984540054, 2 / 3, 3
    centre, half = (
        (p + z * z / (2 * n)) / (1 + z * z / n),
        z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5 / (1 + z * z / n),
    )
    assert (_at(table, 3.2)["reached_low"], _at(table, 3.2)["reached_high"]) == pytest.approx(
        (centre - half, centre + half)
    )


def test_settings_split_on_what_the_run_is_and_label_what_varies():
    rows = [_run("a", 150, 150, gen=70), _run("a", 150, 150, r=0.5),
            _run("b", 75, 75, batch_size=128),  # 128 steps an epoch: 0.128 clocks an epoch
            _run("c", 150, 150, lr=3e-3, weight_decay=0.4)]
    table = clock_table(rows)
    assert "study" not in setting_fields(rows) and "epochs" not in setting_fields(rows) and "r" in setting_fields(rows)
    labels = {(row["setting"], row["r"]) for row in table}
    assert labels == {("wd 1, lr 0.001, batch 512", 0.9), ("wd 1, lr 0.001, batch 512", 0.5),
                      ("wd 1, lr 0.001, batch 128", 0.9), ("wd 0.4, lr 0.003, batch 512", 0.9)}
    assert _at(table, 9.6, batch_size=128)["n_observed"] == 1  # 75 epochs x 128 steps x 1e-3 x 1.0
    assert _at(table, 150 * 32 * 3e-3 * 0.4, lr=3e-3)["reached_rate"] == 0.0
    # a dotted setting (model.*, train.*) is labelled by its last part
    betas = clock_table([_run("a", 150, 150), _run("a", 150, 150, **{"train.betas": [0.9, 0.999]})])
    assert {row["setting"] for row in betas} == {"betas ?", "betas 0.9/0.999"}


def test_runs_without_a_clock_or_an_evaluation_are_left_out_and_bad_epochs_are_named():
    assert clock_table([_run("a", 150, 0), _run("a", 150, 150, lr=None), _run("a", 150, None)]) == []
    with pytest.raises(UserError, match=r"left_epoch 160 is after its final_epoch 150"):
        clock_table([_run("a", 150, 150, gen=70, left=160)])
    with pytest.raises(UserError, match="at least one clock-table row"):
        plot_rate_vs_clock([])


def test_the_figure_draws_both_rates_of_every_setting():
    table = clock_table([_run("a", 150, 150, gen=70, left=120), _run("a", 150, 150, r=0.5),
                         _run("b", 75, 75, batch_size=128)])
    fig = plot_rate_vs_clock(table)
    drawn = drawn_series(fig)
    settings = {(row["setting"], row["r"]) for row in table}
    assert len(drawn) == 2 * len(settings) == 6
    assert {key.split("|")[0] for key in drawn} == {"reached_rate", "held_rate"}
    # the held line of the transient run comes back down to 0 where it left its basin
    held = next(line for line in fig.axes[1].get_lines()
                if line.get_gid() and line.get_gid().endswith("held_rate|batch 512|r=0.9"))
    ys = list(held.get_ydata())
    assert max(ys) - min(ys) == pytest.approx(1.0) and ys[-1] == pytest.approx(ys[0])


def test_report_clock_writes_the_table_and_figure_from_a_study(tmp_path, capsys):
    study = tmp_path / "study"
    make_run(study, "gen", 0.9, 0, GEN, batch_size=512, lr=1e-3, weight_decay=1.0)  # 4,096 examples: 8 steps/epoch
    make_run(study, "stuck", 0.9, 1, STUCK, batch_size=512, lr=1e-3, weight_decay=1.0)
    out = tmp_path / "report"
    assert main(["report", str(study), "--out", str(out), "--clock"]) == 0
    assert "rates against decay clocks" in capsys.readouterr().out
    with open(out / "rate_vs_clock.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    # GEN reaches adv 1.0 at its third evaluation (epoch 20: 160 steps, 0.16 clocks); both end there
    assert [(row["decay_clocks"], row["n_observed"], row["n_reached"], row["n_held"]) for row in rows] == [
        ("0.16", "2", "1", "1")]
    assert (out / "rate_vs_clock.png").stat().st_size > 0
    # without --clock nothing of it is written
    assert main(["report", str(study), "--out", str(tmp_path / "plain")]) == 0
    assert not (tmp_path / "plain" / "rate_vs_clock.csv").exists()
