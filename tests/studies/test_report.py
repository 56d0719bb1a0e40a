"""Outcome records, Wilson intervals and the report on a synthetic study with known outcomes."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from scipy.stats import binomtest

from interp_toolkit.io import atomic_write_json
from interp_toolkit.studies.outcomes import compute_outcome
from interp_toolkit.studies.report import wilson_interval, write_report


def _curve(pairs, every=10):
    return [{"epoch": i * every, "val_acc": v, "adv_acc": a} for i, (v, a) in enumerate(pairs)]


def test_outcome_of_shortcut_then_rule_run():
    # shortcut learned at epoch 20, adv bottoms at epoch 30, rises from epoch 40, rule at 60
    metrics = _curve([(0.5, 0.5), (0.9, 0.2), (1.0, 0.05), (1.0, 0.02), (1.0, 0.3), (1.0, 0.8), (1.0, 1.0),
                      (1.0, 1.0)])
    out = compute_outcome(metrics, r=0.9)
    assert out["generalized"] and not out["transient"]
    assert out["first_generalized_epoch"] == 60
    assert out["shortcut_epoch"] == 20
    assert out["phase2_onset_epoch"] == 30
    assert out["max_adv_acc"] == 1.0 and out["final_val_acc"] == 1.0 and out["favored_split"] == "val"


def test_outcome_transient_and_stuck():
    transient = compute_outcome(_curve([(1.0, 0.0), (1.0, 1.0), (1.0, 0.97)]), r=0.9)
    assert transient["generalized"] and transient["transient"] and transient["final_adv_acc"] == 0.97
    stuck = compute_outcome(_curve([(0.6, 0.4), (1.0, 0.0), (1.0, 0.03)]), r=0.9)
    assert not stuck["generalized"] and stuck["phase2_onset_epoch"] is None
    assert stuck["first_generalized_epoch"] is None and stuck["shortcut_epoch"] == 10


def test_outcome_below_chance_is_not_fooled_by_anti_shortcut():
    # r = 0.1: predicting "not shortcut" aces adv (sum parity) but fails val: not the rule
    anti = compute_outcome(_curve([(0.5, 0.5), (0.0, 1.0), (0.0, 1.0)]), r=0.1)
    assert not anti["generalized"] and anti["favored_split"] == "adv" and anti["shortcut_epoch"] == 10
    rule = compute_outcome(_curve([(0.5, 0.5), (0.0, 1.0), (0.4, 1.0), (1.0, 1.0)]), r=0.1)
    assert rule["generalized"] and rule["phase2_onset_epoch"] == 10


def test_outcome_validates():
    with pytest.raises(ValueError, match="threshold"):
        compute_outcome(_curve([(1.0, 1.0)]), r=0.9, threshold=1.5)
    with pytest.raises(ValueError, match="adv_acc"):
        compute_outcome([{"epoch": 0, "val_acc": 1.0}], r=0.9)


@pytest.mark.parametrize("k, n", [(0, 5), (2, 5), (5, 5), (7, 30), (1, 1)])
def test_wilson_matches_scipy(k, n):
    ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    low, high = wilson_interval(k, n)
    assert low == pytest.approx(ref.low, abs=1e-9) and high == pytest.approx(ref.high, abs=1e-9)


def test_wilson_validates():
    with pytest.raises(ValueError, match="n >= 1"):
        wilson_interval(0, 0)
    with pytest.raises(ValueError, match=r"\[0, 3\]"):
        wilson_interval(4, 3)


def _make_run(root: Path, name: str, r: float, layers: int, seed: int, curve) -> None:
    run_dir = root / "runs" / name
    run_dir.mkdir(parents=True)
    atomic_write_json(run_dir / "run.json", {
        "key": name, "status": "finished",
        "run_info": {"task": {"name": "max_parity_sum_parity", "r": r}},
        "model_config": {"n_layers": layers, "n_heads": 2, "seed": seed},
        "train_config": {"weight_decay": 0.1},
    })
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in curve))


def test_report_on_synthetic_study_gives_known_rates(tmp_path, capsys):
    gen = _curve([(0.5, 0.5), (1.0, 0.0), (1.0, 1.0)])
    trans = _curve([(0.5, 0.5), (1.0, 1.0), (1.0, 0.5)])
    stuck = _curve([(0.5, 0.5), (1.0, 0.0), (1.0, 0.0)])
    anti = _curve([(0.5, 0.5), (0.0, 1.0), (0.0, 1.0)])
    both = _curve([(0.5, 0.5), (0.0, 1.0), (1.0, 1.0)])
    # cell (1L, r=0.9): 2 of 5 generalized (one transiently)
    for seed, curve in enumerate([gen, trans, stuck, stuck, stuck]):
        _make_run(tmp_path, f"a{seed}", 0.9, 1, seed, curve)
    # cell (1L, r=0.1): 1 of 4 (two anti-shortcut runs at 100% adv do not count)
    for seed, curve in enumerate([anti, anti, both, stuck]):
        _make_run(tmp_path, f"b{seed}", 0.1, 1, seed, curve)
    # cell (2L, r=0.9): 3 of 3
    for seed in range(3):
        _make_run(tmp_path, f"c{seed}", 0.9, 2, seed, gen)
    result = write_report(tmp_path)
    by_cell = {(row["n_layers"], row["r"]): row for row in result["table"]}
    expected = {(1, 0.9): (2, 5, 1), (1, 0.1): (1, 4, 0), (2, 0.9): (3, 3, 0)}
    assert set(by_cell) == set(expected)
    for cell, (k, n, n_transient) in expected.items():
        row = by_cell[cell]
        assert (row["n_generalized"], row["n_seeds"], row["n_transient"]) == (k, n, n_transient)
        assert row["rate"] == pytest.approx(k / n)
        ref = binomtest(k, n).proportion_ci(method="wilson")
        assert (row["wilson_low"], row["wilson_high"]) == pytest.approx((ref.low, ref.high))
    with open(result["paths"]["table_csv"]) as handle:
        csv_rows = list(csv.DictReader(handle))
    assert len(csv_rows) == 3
    assert {(int(r["n_layers"]), float(r["r"])): int(r["n_generalized"]) for r in csv_rows} == {
        cell: k for cell, (k, _, _) in expected.items()}
    for key in ("rate_png", "curves_png"):
        assert result["paths"][key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "0.40" in printed and "0.25" in printed
    assert "headline plot" in printed


def test_report_rejects_non_study(tmp_path):
    with pytest.raises(ValueError, match="not a study directory"):
        write_report(tmp_path)
