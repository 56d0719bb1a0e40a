"""Outcome records, Wilson intervals and the report on a synthetic study with known outcomes."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from scipy.stats import binomtest, fisher_exact

from interp_toolkit.errors import UserError
from interp_toolkit.io import atomic_write_json
from interp_toolkit.studies.common.outcomes import (
    OutcomeThresholds,
    compute_outcome,
    generalization_split,
    generalization_stop_rule,
)
from interp_toolkit.studies.common.statistics import newcombe_interval, wilson_interval
from interp_toolkit.studies.report.write import write_report


def _curve(pairs, every=10):
    return [{"epoch": i * every, "val_acc": v, "adv_acc": a} for i, (v, a) in enumerate(pairs)]


def test_outcome_of_shortcut_then_rule_run():
    # shortcut learned at epoch 20, adv bottoms at epoch 30, rises from epoch 40, rule at 60
    metrics = _curve([(0.5, 0.5), (0.9, 0.2), (1.0, 0.05), (1.0, 0.02), (1.0, 0.3), (1.0, 0.8), (1.0, 1.0),
                      (1.0, 1.0)])
    out = compute_outcome(metrics, r=0.9)
    assert out["generalized"] and out["rule_learned"] and not out["transient"]
    assert out["first_generalized_epoch"] == 60 == out["first_rule_learned_epoch"]
    assert out["shortcut_epoch"] == 20
    assert out["phase2_onset_epoch"] == 30
    assert out["max_adv_acc"] == 1.0 and out["final_val_acc"] == 1.0
    assert out["favored_split"] == "val" and out["generalization_split"] == "adv"
    assert out["basin_fraction"] == 1.0 and out["left_epoch"] is None


def test_adv_at_100_with_val_below_is_generalized_not_rule_learned():
    # the paper's criterion: 100% on the generalization split (adv at r = 0.9) at some evaluation
    out = compute_outcome(_curve([(1.0, 0.0), (0.9995, 1.0), (0.9995, 1.0)]), r=0.9)
    assert out["generalized"] and out["first_generalized_epoch"] == 10
    assert not out["rule_learned"] and out["first_rule_learned_epoch"] is None


def test_mod3_above_chance_generalization_split_is_adv():
    # m = 3: chance is 1/3, so r = 0.4 favours the shortcut: val favored, adv misleads
    out = compute_outcome(_curve([(0.4, 0.3), (1.0, 0.0), (1.0, 1.0)]), r=0.4, modulus=3)
    assert out["favored_split"] == "val" and out["generalization_split"] == "adv"
    assert out["generalized"] and out["shortcut_epoch"] == 10
    # the same r on a parity task is below chance: the roles swap
    parity = compute_outcome(_curve([(0.4, 0.3), (1.0, 0.0), (1.0, 1.0)]), r=0.4, modulus=2)
    assert parity["favored_split"] == "adv" and parity["generalization_split"] == "val"
    assert generalization_split(0.4, 3) == "adv" and generalization_split(0.3, 3) == "val"


def test_parity_below_chance_generalization_split_is_val():
    # r = 0.2 on parity: the anti-shortcut aces adv; 100% on val is the paper's generalization
    anti = compute_outcome(_curve([(0.5, 0.5), (0.0, 1.0), (0.0, 1.0)]), r=0.2)
    assert anti["generalization_split"] == "val" and anti["favored_split"] == "adv"
    assert not anti["generalized"] and anti["shortcut_epoch"] == 10
    rule = compute_outcome(_curve([(0.5, 0.5), (0.0, 1.0), (0.4, 1.0), (1.0, 0.97)]), r=0.2)
    assert rule["generalized"] and not rule["rule_learned"] and rule["phase2_onset_epoch"] == 10


def test_mod3_below_chance_shortcut_level_is_one_half_on_adv():
    # "not the shortcut" leaves two classes in mod 3: the bias alone scores 1/2 on adv
    out = compute_outcome(_curve([(0.3, 0.3), (0.0, 0.5), (0.2, 0.5), (1.0, 1.0)]), r=0.1, modulus=3)
    assert out["favored_split"] == "adv" and out["shortcut_epoch"] == 10
    assert out["phase2_onset_epoch"] == 10 and out["generalized"]


def test_at_chance_needs_both_splits_at_one_evaluation():
    for r, m in ((0.5, 2), (1 / 3, 3)):
        apart = compute_outcome(_curve([(1.0, 0.9), (0.9, 1.0)]), r=r, modulus=m)
        assert apart["generalization_split"] == "both" and apart["favored_split"] is None
        assert not apart["generalized"] and apart["shortcut_epoch"] is None
        together = compute_outcome(_curve([(1.0, 0.9), (1.0, 1.0)]), r=r, modulus=m)
        assert together["generalized"] and together["rule_learned"]
    # 0.5 is above chance for mod 3: adv alone decides
    assert compute_outcome(_curve([(0.9, 1.0)]), r=0.5, modulus=3)["generalized"]


def test_one_evaluation_dip_is_not_transient():
    out = compute_outcome(_curve([(1.0, 0.0), (1.0, 1.0), (1.0, 0.97), (1.0, 1.0), (1.0, 1.0)]), r=0.9)
    assert out["generalized"] and not out["transient"] and out["left_epoch"] is None
    assert out["min_acc_after"] == 0.97 and out["basin_fraction"] == pytest.approx(2 / 3)
    # two evaluations below tolerance at the end: still shorter than the 3-evaluation span
    short = compute_outcome(_curve([(1.0, 1.0), (1.0, 0.5), (1.0, 0.5)]), r=0.9)
    assert not short["transient"]


def test_five_evaluation_fall_is_transient_with_epoch_and_depth():
    accs = [0.0, 0.6, 1.0, 1.0, 0.95, 0.9, 0.8, 0.85, 0.9, 1.0, 1.0]
    out = compute_outcome(_curve([(1.0, a) for a in accs]), r=0.9)
    assert out["transient"] and out["left_epoch"] == 40
    assert out["min_acc_after"] == 0.8 and out["first_generalized_epoch"] == 20
    assert out["basin_fraction"] == pytest.approx(3 / 8)
    assert out["transient_tolerance"] == 0.99 and out["transient_min_span"] == 3
    # the settings decide: a 6-evaluation span is not met by a 5-evaluation fall
    strict = compute_outcome(_curve([(1.0, a) for a in accs]), r=0.9,
                             thresholds=OutcomeThresholds(transient_min_span=6))
    assert not strict["transient"] and strict["transient_min_span"] == 6
    loose = compute_outcome(_curve([(1.0, a) for a in accs]), r=0.9,
                            thresholds=OutcomeThresholds(transient_tolerance=0.86))
    assert not loose["transient"]  # only 0.8 and 0.85 fall below 0.86: two evaluations


def test_stuck_run():
    stuck = compute_outcome(_curve([(0.6, 0.4), (1.0, 0.0), (1.0, 0.03)]), r=0.9)
    assert not stuck["generalized"] and stuck["phase2_onset_epoch"] is None and not stuck["transient"]
    assert stuck["first_generalized_epoch"] is None and stuck["shortcut_epoch"] == 10
    assert stuck["basin_fraction"] is None and stuck["min_acc_after"] is None


def test_outcome_validates():
    with pytest.raises(UserError, match="threshold"):
        compute_outcome(_curve([(1.0, 1.0)]), r=0.9, thresholds=OutcomeThresholds(threshold=1.5))
    with pytest.raises(UserError, match="transient_min_span"):
        OutcomeThresholds(transient_min_span=0)
    with pytest.raises(UserError, match="adv_acc"):
        compute_outcome([{"epoch": 0, "val_acc": 1.0}], r=0.9)
    with pytest.raises(UserError, match="modulus"):
        compute_outcome(_curve([(1.0, 1.0)]), r=0.9, modulus=1)
    with pytest.raises(UserError, match="r must be"):
        compute_outcome(_curve([(1.0, 1.0)]), r=1.5)


def test_stop_rule_uses_the_paper_criterion():
    assert generalization_stop_rule(0.9, 2)({"val_acc": 0.99, "adv_acc": 1.0})
    assert not generalization_stop_rule(0.2, 2)({"val_acc": 0.99, "adv_acc": 1.0})
    assert not generalization_stop_rule(0.5, 2)({"val_acc": 0.99, "adv_acc": 1.0})
    assert generalization_stop_rule(0.5, 3)({"val_acc": 0.2, "adv_acc": 1.0})


def test_rate_plot_grows_with_a_key_of_many_regimes():
    """Twelve regimes (studies, each a two-line key entry) make a key taller than the default 3.8 in: the figure grows,
    so
    its axes keep most of their height instead of being squashed by the layout."""
    from interp_toolkit.studies.report.plots import plot_rate_vs_r

    low, high = wilson_interval(0, 4)
    rows = [
        {
            "task": "max_parity_sum_parity", "study": f"a study whose name wraps onto a second line {i}", "n_layers": 2,
            "n_heads": 2, "weight_decay": 0.1, "r": 0.9, "n_seeds": 4, "n_generalized": 0, "rate": 0.0,
            "wilson_low": low, "wilson_high": high,
        }
        for i in range(12)
    ]
    few = plot_rate_vs_r(rows[:1], x_axis="categorical")
    many = plot_rate_vs_r(rows, x_axis="categorical", layout="markers")
    assert few.get_size_inches()[1] == pytest.approx(3.8)
    assert many.get_size_inches()[1] > 3.8
    many.canvas.draw()
    assert many.axes[0].get_position().height > 0.5  # of the figure's height


def test_rate_plot_of_more_regimes_than_marker_shapes_is_a_forest_of_cells():
    """Past ten regimes the marker shapes would repeat: the plot becomes one row per cell, its
    name on the y axis, each r at its rate with its Wilson interval and its k/n beside it, and
    published rates in rows of their own. Its height grows with the rows, not with a key."""
    from interp_toolkit.studies.report.forest import plot_rate_forest
    from interp_toolkit.studies.report.plots import plot_rate_vs_r
    from interp_toolkit.studies.report.tables import PAPER_HEADLINE_RATES

    def row(study, layers, r, k, n=4):
        low, high = wilson_interval(k, n)
        return {"task": "max_parity_sum_parity", "study": f"study {study}", "n_layers": layers, "n_heads": 2,
                "weight_decay": 0.1, "r": r, "n_seeds": n, "n_generalized": k, "rate": k / n,
                "wilson_low": low, "wilson_high": high, "n_near_misses": 1 if (study, layers, r) == (3, 2, 0.9) else 0}

    rows = [row(i, layers, r, (i + layers + int(r * 10)) % 5)
            for i in range(11) for layers in (1, 2) for r in (0.5, 0.9)]
    fig = plot_rate_vs_r(rows, x_axis="categorical", references=PAPER_HEADLINE_RATES)
    (ax,) = fig.axes
    names = [label.get_text().replace("\n", " ") for label in ax.get_yticklabels()]
    assert len(names) == 2 + 22  # two published rows (1L, 2L), then every cell once
    assert names[:2] == ["1L 2H: published", "2L 2H: published"]
    assert names[2] == "1L 2H | study study 0" and names[3] == "2L 2H | study study 0"  # by regime, then architecture
    # every measured rate is drawn at its value, its interval at the Wilson bounds
    def drawn_at(container):
        (low, _), (high, _) = container.lines[2][0].get_segments()[0]
        return tuple(round(float(v), 6) for v in (container.lines[0].get_xdata()[0], low, high))

    published = [(k / 30, *wilson_interval(k, 30)) for k in (10, 0, 0, 23)]
    expected = [(r["rate"], r["wilson_low"], r["wilson_high"]) for r in rows] + published
    assert sorted(drawn_at(c) for c in ax.containers) == sorted(tuple(round(v, 6) for v in e) for e in expected)
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("0/30") == 2 and "10/30" in texts and "23/30" in texts
    assert any(text.endswith("+1 near") for text in texts)
    assert fig.get_size_inches()[1] > 24 * 0.2  # a row per cell: it grows with them
    # fewer regimes keep the marker plot; a layout can be asked for; a bad one is refused
    assert plot_rate_vs_r(rows[:8], x_axis="categorical").axes[0].get_ylabel() == "fraction of seeds that generalized"
    assert len(plot_rate_vs_r(rows[:8], layout="forest").axes[0].get_yticklabels()) == 4  # 2 studies x 2 layers
    with pytest.raises(UserError, match="layout must be one of .*got 'grid'"):
        plot_rate_vs_r(rows, layout="grid")
    assert plot_rate_forest({("2L", ""): rows[:1]}).axes[0].get_yticklabels()[0].get_text() == "2L"
    with pytest.raises(UserError, match="needs at least one cell or published rate, got none"):
        plot_rate_forest({})


def test_rate_plot_takes_zero_of_seven(tmp_path):
    from interp_toolkit.studies.report.plots import plot_rate_vs_r

    low, high = wilson_interval(0, 7)
    row = {"task": "max_parity_sum_parity", "n_layers": 2, "n_heads": 2, "weight_decay": 0.1, "r": 0.9,
           "n_seeds": 7, "n_generalized": 0, "rate": 0.0, "wilson_low": low, "wilson_high": high}
    fig = plot_rate_vs_r([row, dict(row, r=0.5)], x_axis="categorical")
    assert fig is not None


def test_rate_plot_centres_each_r_on_the_series_measured_there():
    """A series alone at an r sits on its tick; series sharing an r straddle it."""
    from interp_toolkit.studies.report.plots import plot_rate_vs_r

    def row(layers, r):
        low, high = wilson_interval(1, 4)
        return {"task": "max_parity_sum_parity", "n_layers": layers, "n_heads": 2, "weight_decay": 0.1,
                "r": r, "n_seeds": 4, "n_generalized": 1, "rate": 0.25, "wilson_low": low, "wilson_high": high}

    fig = plot_rate_vs_r([row(1, 0.1), row(1, 0.5), row(2, 0.5), row(2, 0.9)], x_axis="categorical")
    xs = {}
    for container in fig.axes[0].containers:
        line = container.lines[0]
        xs[line.get_color()] = list(line.get_xdata())
    one_layer, two_layer = sorted(xs.values())
    assert one_layer[0] == pytest.approx(0.0) and two_layer[1] == pytest.approx(2.0)  # alone: on the tick
    assert one_layer[1] < 1.0 < two_layer[0]  # shared r = 0.5: either side of its tick
    assert one_layer[1] + two_layer[0] == pytest.approx(2.0)


def _make_run(root: Path, name: str, r: float, layers: int, seed: int, curve, status: str = "finished") -> None:
    run_dir = root / "runs" / name
    run_dir.mkdir(parents=True)
    atomic_write_json(run_dir / "run.json", {
        "key": name, "status": status,
        "run_info": {"task": {"name": "max_parity_sum_parity", "r": r}},
        "model_config": {"n_layers": layers, "n_heads": 2, "seed": seed},
        "train_config": {"weight_decay": 0.1},
    })
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in curve))


def test_report_on_synthetic_study_gives_known_rates(tmp_path, capsys):
    gen = _curve([(0.5, 0.5), (1.0, 0.0), (1.0, 1.0)])
    adv_only = _curve([(0.5, 0.5), (1.0, 0.0), (0.9995, 1.0)])  # generalized, not rule learned
    trans = _curve([(0.5, 0.5), (1.0, 1.0), (1.0, 0.5), (1.0, 0.5), (1.0, 0.6)])
    stuck = _curve([(0.5, 0.5), (1.0, 0.0), (1.0, 0.0)])
    anti = _curve([(0.5, 0.5), (0.0, 1.0), (0.0, 1.0)])
    both = _curve([(0.5, 0.5), (0.0, 1.0), (1.0, 1.0)])
    val_only = _curve([(0.5, 0.5), (0.0, 1.0), (1.0, 0.99)])
    # cell (1L, r=0.9): 3 of 5 generalized (one transiently, one adv-only), 2 rule learned
    for seed, curve in enumerate([gen, trans, adv_only, stuck, stuck]):
        _make_run(tmp_path, f"a{seed}", 0.9, 1, seed, curve)
    # cell (1L, r=0.1): the generalization split is val: 2 of 4; the anti-shortcut's 100% adv
    # does not count; 1 rule learned
    for seed, curve in enumerate([anti, val_only, both, anti]):
        _make_run(tmp_path, f"b{seed}", 0.1, 1, seed, curve)
    # cell (2L, r=0.9): 3 of 3
    for seed in range(3):
        _make_run(tmp_path, f"c{seed}", 0.9, 2, seed, gen)
    # a stale cache from older definitions is ignored and rewritten
    atomic_write_json(tmp_path / "runs" / "a2" / "outcome.json",
                      {"generalized": False, "resumed_from": 7, "stopped_early_at": None})
    result = write_report(tmp_path, compare=[("L=1,r=0.9", "L=1,r=0.1")])
    by_cell = {(row["n_layers"], row["r"]): row for row in result["table"]}
    expected = {(1, 0.9): (3, 2, 5, 1), (1, 0.1): (2, 1, 4, 0), (2, 0.9): (3, 3, 3, 0)}
    assert set(by_cell) == set(expected)
    for cell, (k, k_rule, n, n_transient) in expected.items():
        row = by_cell[cell]
        assert (row["n_generalized"], row["n_rule_learned"], row["n_seeds"], row["n_transient"]) == (
            k, k_rule, n, n_transient)
        assert row["rate"] == pytest.approx(k / n) and row["rule_learned_rate"] == pytest.approx(k_rule / n)
        ref = binomtest(k, n).proportion_ci(method="wilson")
        assert (row["wilson_low"], row["wilson_high"]) == pytest.approx((ref.low, ref.high))
        ref = binomtest(k_rule, n).proportion_ci(method="wilson")
        assert (row["rule_learned_wilson_low"], row["rule_learned_wilson_high"]) == pytest.approx((ref.low, ref.high))
    cache = json.loads((tmp_path / "runs" / "a2" / "outcome.json").read_text())
    assert cache["generalized"] is True and cache["rule_learned"] is False and cache["resumed_from"] == 7
    with open(result["paths"]["table_csv"]) as handle:
        csv_rows = list(csv.DictReader(handle))
    assert len(csv_rows) == 3
    assert {(int(r["n_layers"]), float(r["r"])): int(r["n_generalized"]) for r in csv_rows} == {
        cell: k for cell, (k, _, _, _) in expected.items()}
    assert {(int(r["n_layers"]), float(r["r"])): int(r["n_rule_learned"]) for r in csv_rows} == {
        cell: k_rule for cell, (_, k_rule, _, _) in expected.items()}
    # contrasts: one r pair in the 1L architecture, none in 2L (a single r)
    assert len(result["contrasts"]) == 1
    contrast = result["contrasts"][0]
    assert (contrast["r_a"], contrast["r_b"], contrast["k_a"], contrast["k_b"]) == (0.9, 0.1, 3, 2)
    assert contrast["difference"] == pytest.approx(3 / 5 - 2 / 4)
    assert contrast["fisher_p"] == pytest.approx(fisher_exact([[3, 2], [2, 2]]).pvalue)
    paper, rule = result["comparisons"]
    assert (paper["column"], paper["k_a"], paper["k_b"]) == ("generalized", 3, 2)
    assert (rule["column"], rule["k_a"], rule["k_b"]) == ("rule_learned", 2, 1)
    for key in ("rate_png", "curves_png"):
        assert result["paths"][key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "0.60" in printed and "0.50" in printed and "Newcombe" in printed
    assert "headline plot" in printed


def test_report_cli_compare_and_bad_cell_spec(tmp_path, capsys):
    from interp_toolkit.cli import main

    for seed, layers in enumerate([1, 1, 2, 2]):
        _make_run(tmp_path, f"r{seed}", 0.9, layers, seed, _curve([(1.0, 0.0), (1.0, float(seed % 2))]))
    assert main(["report", str(tmp_path), "--compare", "L=1", "L=2"]) == 0
    out = capsys.readouterr().out
    assert "1/2" in out and "+0.00" in out
    assert main(["report", str(tmp_path), "--compare", "L=3", "L=2"]) == 2
    assert "matches no cell" in capsys.readouterr().err
    assert main(["report", str(tmp_path), "--compare", "layers two", "L=2"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_report_where_selects_runs_of_one_regime(tmp_path, capsys):
    from interp_toolkit.cli import main

    for seed, layers in enumerate([1, 1, 2, 2]):
        _make_run(tmp_path, f"r{seed}", 0.9, layers, seed, _curve([(1.0, 0.0), (1.0, float(seed % 2))]))
    whole = write_report(tmp_path, out_dir=tmp_path / "all", print_table=False)
    assert {row["n_layers"] for row in whole["rows"]} == {1, 2}
    result = write_report(tmp_path, out_dir=tmp_path / "two", print_table=False, where="L=2")  # one spec as a str
    assert [row["n_layers"] for row in result["rows"]] == [2, 2]
    assert [(row["n_layers"], row["n_generalized"], row["n_seeds"]) for row in result["table"]] == [(2, 1, 2)]
    # what is written holds the selection only, so the CSV alone gives the same table again
    again = write_report(result["paths"]["outcomes_csv"], out_dir=tmp_path / "again", print_table=False)
    assert (tmp_path / "again" / "table.md").read_text() == (tmp_path / "two" / "table.md").read_text()
    assert len(again["rows"]) == 2
    # several specs keep runs matching any; keys within one spec must all match
    both = write_report(tmp_path, out_dir=tmp_path / "both", print_table=False, where=["L=1,r=0.9", "L=2"])
    assert len(both["rows"]) == 4
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "cli"), "--where", "L=1"]) == 0
    printed = capsys.readouterr().out
    assert "(selected 2 of 4 runs: L=1)" in printed
    # a selection matching nothing names the values there are; a malformed one fails before any work
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "none"), "--where", "L=3"]) == 2
    err = capsys.readouterr().err
    assert "matches none of the 4 runs" in err and "L: 1, 2" in err
    assert not (tmp_path / "none").exists()
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "bad"), "--where", "layers two"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_report_uses_study_outcome_thresholds(tmp_path):
    fall = _curve([(1.0, a) for a in [0.0, 1.0, 0.95, 0.95, 1.0, 1.0]])
    _make_run(tmp_path, "x0", 0.9, 1, 0, fall)
    assert write_report(tmp_path, print_table=False)["rows"][0]["transient"] is False  # 2 < 3 evaluations
    atomic_write_json(tmp_path / "study.json", {"outcome_thresholds": {"transient_min_span": 2}})
    row = write_report(tmp_path, print_table=False)["rows"][0]
    assert row["transient"] is True and row["left_epoch"] == 20 and row["transient_min_span"] == 2


def test_report_rejects_non_study(tmp_path):
    with pytest.raises(UserError, match="not a study directory"):
        write_report(tmp_path)


def test_read_thresholds_of_older_studies(tmp_path):
    from interp_toolkit.studies.grid.study import read_thresholds

    assert read_thresholds(tmp_path) == OutcomeThresholds()
    atomic_write_json(tmp_path / "study.json", {"key": "k", "config": {"threshold": 0.98, "epochs": 5}})
    assert read_thresholds(tmp_path) == OutcomeThresholds(threshold=0.98)


def test_rates_count_finished_runs_only(tmp_path, capsys):
    """A run still training has no outcome yet: it is counted apart (running), not as failed."""
    gen = _curve([(1.0, 0.0), (1.0, 1.0)])
    stuck = _curve([(1.0, 0.0), (1.0, 0.0)])
    _make_run(tmp_path, "f0", 0.9, 1, 0, gen)
    _make_run(tmp_path, "f1", 0.9, 1, 1, stuck)
    _make_run(tmp_path, "u2", 0.9, 1, 2, stuck, status="running")
    _make_run(tmp_path, "u3", 0.5, 1, 3, stuck, status="running")  # a cell with no finished run yet
    result = write_report(tmp_path)
    (cell,) = result["table"]
    assert (cell["r"], cell["n_generalized"], cell["n_seeds"], cell["n_running"]) == (0.9, 1, 2, 1)
    assert cell["rate"] == 0.5
    assert len(result["rows"]) == 4  # outcomes.csv keeps every run, with its status
    out = capsys.readouterr().out
    assert "2 runs still training are not counted" in out and "running" in out.splitlines()[0]
    markdown = (tmp_path / "table.md").read_text()
    assert "| running |" in markdown and "| 1/2 |" in markdown
    # the same table from outcomes.csv alone: the status travels with each row
    write_report(tmp_path / "outcomes.csv", tmp_path / "again", print_table=False)
    assert (tmp_path / "again" / "table.md").read_text() == markdown
    # once every run has finished, the running column leaves the table
    for name in ("u2", "u3"):
        record = json.loads((tmp_path / "runs" / name / "run.json").read_text())
        atomic_write_json(tmp_path / "runs" / name / "run.json", {**record, "status": "finished"})
    done = write_report(tmp_path, print_table=False)
    assert [(c["n_seeds"], c["n_running"]) for c in done["table"]] == [(1, 0), (3, 0)]
    assert "running" not in (tmp_path / "table.md").read_text()


def test_compare_names_cells_still_training(tmp_path):
    _make_run(tmp_path, "f0", 0.9, 1, 0, _curve([(1.0, 0.0), (1.0, 1.0)]))
    _make_run(tmp_path, "u1", 0.5, 1, 1, _curve([(1.0, 0.0), (1.0, 0.0)]), status="running")
    with pytest.raises(UserError, match=r"matches no cell.*runs still training: 1;"):
        write_report(tmp_path, print_table=False, compare=[("r=0.9", "r=0.5")])


def test_report_of_a_study_with_no_finished_run_yet(tmp_path, capsys):
    _make_run(tmp_path, "u0", 0.9, 1, 0, _curve([(1.0, 0.0), (1.0, 0.0)]), status="running")
    result = write_report(tmp_path)
    assert result["table"] == [] and result["contrasts"] == []
    assert result["paths"]["curves_png"].exists()  # the learning curves show the progress
    assert "no run has finished yet" in capsys.readouterr().out


def test_report_writes_no_outcome_cache_for_unfinished_runs(tmp_path):
    # a sweep takes outcome.json as "done": a report during training must not create one
    _make_run(tmp_path, "u0", 0.9, 1, 0, _curve([(1.0, 0.0), (1.0, 1.0)]), status="running")
    _make_run(tmp_path, "f0", 0.9, 1, 1, _curve([(1.0, 0.0), (1.0, 1.0)]))
    rows = write_report(tmp_path, print_table=False)["rows"]
    assert [row["generalized"] for row in rows] == [True, True]
    assert not (tmp_path / "runs" / "u0" / "outcome.json").exists()
    assert json.loads((tmp_path / "runs" / "f0" / "outcome.json").read_text())["generalized"] is True


def _table_row(layers: int, r: float, k: int, n: int, wd: float = 0.1, task: str = "max_parity_sum_parity") -> dict:
    low, high = wilson_interval(k, n)
    return {"task": task, "n_layers": layers, "n_heads": 2, "weight_decay": wd, "r": r, "n_seeds": n,
            "n_generalized": k, "rate": k / n, "wilson_low": low, "wilson_high": high}


def test_reference_comparison_matches_the_paper_cells_only():
    """Each cell with a published rate is compared with it (here - paper): Newcombe interval
    and Fisher p as for two measured cells; cells of other weight decays, r or tasks are not."""
    from interp_toolkit.studies.report.tables import PAPER_HEADLINE_RATES, reference_comparison

    table = [_table_row(2, 0.9, 0, 8), _table_row(1, 0.5, 7, 30), _table_row(1, 0.9, 0, 8, wd=0.4),
             _table_row(2, 0.7, 1, 4), _table_row(2, 0.9, 2, 4, task="first_parity_sum_parity")]
    rows = reference_comparison(table, PAPER_HEADLINE_RATES)
    assert [(row["n_layers"], row["r"]) for row in rows] == [(2, 0.9), (1, 0.5)]
    two_layer, one_layer = rows
    assert (two_layer["k"], two_layer["n"], two_layer["reference_k"], two_layer["reference_n"]) == (0, 8, 23, 30)
    assert two_layer["difference"] == pytest.approx(0 - 23 / 30)
    assert (two_layer["newcombe_low"], two_layer["newcombe_high"]) == pytest.approx(newcombe_interval(0, 8, 23, 30)[1:])
    assert two_layer["fisher_p"] == pytest.approx(fisher_exact([[0, 8], [23, 7]]).pvalue)
    assert two_layer["fisher_p"] < 1e-3  # 0/8 is far from the paper's 23/30
    assert one_layer["fisher_p"] == pytest.approx(fisher_exact([[7, 23], [10, 20]]).pvalue)
    assert one_layer["newcombe_low"] < 0 < one_layer["newcombe_high"]  # 7/30 vs 10/30: consistent


def test_paper_headline_rates_are_the_papers_percentages():
    from interp_toolkit.studies.report.tables import PAPER_HEADLINE_RATES

    rates = {(ref.n_layers, ref.r): round(100 * ref.k / ref.n) for ref in PAPER_HEADLINE_RATES}
    assert rates == {(2, 0.5): 0, (2, 0.9): 77, (1, 0.5): 33, (1, 0.9): 0}


def test_reference_rate_validates():
    from interp_toolkit.studies.report.tables import ReferenceRate

    with pytest.raises(UserError, match=r"\[0, 30\]"):
        ReferenceRate("max_parity_sum_parity", 2, 0.9, 31, 30, "a typo")
    with pytest.raises(UserError, match="r must be in"):
        ReferenceRate("max_parity_sum_parity", 2, 90, 23, 30, "a percentage")


def test_rate_plot_draws_published_rates_beside_their_cells():
    """A published rate whose cell is in the table is one more (hollow) series there; one
    whose cell is not is not drawn."""
    from interp_toolkit.studies.report.plots import plot_rate_vs_r
    from interp_toolkit.studies.report.tables import PAPER_HEADLINE_RATES

    table = [_table_row(2, 0.9, 0, 8), _table_row(2, 0.5, 0, 8), _table_row(1, 0.1, 0, 8)]
    plain = plot_rate_vs_r(table, x_axis="categorical")
    fig = plot_rate_vs_r(table, x_axis="categorical", references=PAPER_HEADLINE_RATES)
    assert len(fig.axes[0].containers) == len(plain.axes[0].containers) + 1
    hollow = [c.lines[0] for c in fig.axes[0].containers if c.lines[0].get_markerfacecolor() == "white"]
    assert len(hollow) == 1
    assert sorted(hollow[0].get_ydata()) == pytest.approx([0.0, 23 / 30])  # 2L at r = 0.5 and 0.9, not 1L
    # the key's published marker has the colour the hollow markers are drawn in, not black
    keyed = [h for h in fig.axes[0].get_legend().legend_handles
             if getattr(h, "get_marker", lambda: None)() == "h"]
    assert [h.get_color() for h in keyed] == [hollow[0].get_color()]
    assert "23/30 at r = 0.9" in fig.axes[0].get_legend().get_texts()[-1].get_text().replace("\n", " ")


def test_report_against_paper_writes_table_csv_and_prints(tmp_path, capsys):
    from interp_toolkit.cli import main

    for seed in range(3):
        _make_run(tmp_path, f"r{seed}", 0.9, 2, seed, _curve([(1.0, 0.0), (1.0, float(seed == 0))]))
    assert main(["report", str(tmp_path)]) == 0
    assert not (tmp_path / "paper_comparison.csv").exists() and "published" not in (tmp_path / "table.md").read_text()
    capsys.readouterr()
    assert main(["report", str(tmp_path), "--against-paper"]) == 0
    out = capsys.readouterr().out
    assert "against the published rates" in out and "1/3" in out and "23/30" in out
    with open(tmp_path / "paper_comparison.csv") as handle:
        (row,) = list(csv.DictReader(handle))
    assert (int(row["k"]), int(row["n"]), int(row["reference_k"])) == (1, 3, 23)
    assert float(row["fisher_p"]) == pytest.approx(fisher_exact([[1, 2], [23, 7]]).pvalue)
    assert "| 1/3 | 23/30 |" in (tmp_path / "table.md").read_text()
    capsys.readouterr()
    missing = tmp_path / "elsewhere" / "outcomes.csv"
    assert main(["report", str(missing), "--against-paper"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and str(missing) in err and "Traceback" not in err
    assert not missing.parent.exists()  # nothing written


@pytest.mark.parametrize("bad", [{"adv_acc": 1.1953}, {"val_acc": -0.2}, {"val_loss": float("nan")}])
def test_outcome_refuses_an_evaluation_no_trainer_writes(bad):
    """A hand-edited history (e.g. adv_acc 1.1953) would turn a run 'generalized' and move a
    cell's headline rate: it is a user error instead."""
    from interp_toolkit.runs.metrics import MetricsError

    metrics = _curve([(0.5, 0.5), (1.0, 0.0), (1.0, 0.1)])
    metrics[2] = {**metrics[2], **bad}
    with pytest.raises(MetricsError, match="evaluation 3 of the run's history"):
        compute_outcome(metrics, r=0.9)


@pytest.mark.parametrize("n_train, epochs, warned", [(384, 60, True), (16384, 60, True), (384, 15000, True),
                                                    (16384, 15000, False), (8192, 2000, False)])
def test_report_against_paper_warns_of_cells_much_smaller_than_the_papers(tmp_path, capsys, n_train, epochs,
                                                                           warned):
    from interp_toolkit.cli import main

    for seed in range(2):
        _make_run(tmp_path, f"r{seed}", 0.9, 2, seed, _curve([(1.0, 0.0), (1.0, float(seed == 0))]))
        record_path = tmp_path / "runs" / f"r{seed}" / "run.json"
        record = json.loads(record_path.read_text())
        record["run_info"]["task"]["n_train"] = n_train
        record["train_config"]["epochs"] = epochs
        atomic_write_json(record_path, record)
    assert main(["report", str(tmp_path), "--against-paper"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("warning:")]
    if not warned:
        assert not lines
        return
    (line,) = lines  # one line
    assert "1 of the 1 cells compared with the published rates are much smaller than the paper's" in line
    assert "16,384 training sequences, 15,000 epochs" in line
    assert (f"n_train {n_train:,}" in line) == (n_train < 4096) and (f"epochs {epochs:,}" in line) == (epochs < 1500)
    assert main(["report", str(tmp_path)]) == 0  # without --against-paper nothing is compared: no warning
    assert "warning:" not in capsys.readouterr().err


def test_curve_panel_titles_of_long_study_names_do_not_overlap(tmp_path):
    """Two studies named as the regime search names them: each panel's title stays clear of its neighbours'."""
    from interp_toolkit.studies.report.plots import plot_curves_by_cell

    rows = []
    for layers in (1, 2):
        for r in (0.5, 0.9):
            run_dir = tmp_path / f"{layers}L_{r}"
            run_dir.mkdir()
            (run_dir / "metrics.jsonl").write_text(
                "".join(json.dumps({"epoch": e, "adv_acc": 0.5, "val_acc": 0.5, "train_acc": 0.5}) + "\n"
                        for e in (0, 10, 20)))
            rows.append({"task": "max_parity_sum_parity", "study": f"regime_axes_c_len8_b512_wd0.1_1500ep_{layers}L",
                         "n_layers": layers, "n_heads": 2, "weight_decay": 0.1, "r": r, "seed": 470,
                         "run_dir": str(run_dir)})
    fig = plot_curves_by_cell(rows)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    boxes = sorted((ax.title.get_window_extent(renderer) for ax in fig.axes if ax.get_title()), key=lambda b: b.x0)
    assert len(boxes) == 4
    for left, right in zip(boxes, boxes[1:]):
        assert left.x1 < right.x0, (left, right)
