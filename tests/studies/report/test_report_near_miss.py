"""Outcomes, tables and the rate figure carry the near-miss view beside the paper's rate
(issue 38): a study of three r = 0.9 runs, one generalized, one that never left the
shortcut and one that stopped 13 adversarial examples short, all of them all-odd."""

from __future__ import annotations

import csv
import json

import pytest

from interp_toolkit.checkpoint import save_checkpoint
from interp_toolkit.io import atomic_write_json
from interp_toolkit.model import model_config_of
from interp_toolkit.studies.common.near_miss import AT_BEST_NAME, NEAR_MISS_FIELDS
from interp_toolkit.studies.grid.study import read_outcome
from interp_toolkit.studies.report.write import write_report, write_report_sources
from interp_toolkit.tasks.mpsp import MPSPConfig
from tests.studies.common.test_near_miss import all_odd_missing_model

TASK = MPSPConfig(seq_len=8, n_values=10, r=0.9, n_train=16_384, n_eval=2_048, seed=0)
MODEL = model_config_of(all_odd_missing_model(8))  # seed 0
BEST = 1 - 13 / 2048  # the hand-built model's adversarial accuracy: the 13 all-odd sequences wrong


def _run(study, name, seed, adv_accs, checkpoint_model=None):
    """A run directory as a sweep writes it (task, model, train configs), metrics every 50
    epochs; every run has the hand-built model's architecture (the checkpoint must fit it)."""
    run_dir = study / "runs" / name
    run_dir.mkdir(parents=True)
    atomic_write_json(run_dir / "run.json", {
        "key": name, "status": "finished", "run_info": {"task": {"name": TASK.name, **TASK.to_dict()}},
        "model_config": {**MODEL.to_dict(), "seed": seed},
        "train_config": {"epochs": 150, "lr": 1e-3, "weight_decay": 1.0, "batch_size": 512, "eval_every": 50},
        "split_sizes": {"train": 16_384, "val": 2_048, "adv": 2_048}})
    lines = [{"epoch": 50 * i, "val_acc": 1.0, "adv_acc": acc} for i, acc in enumerate(adv_accs)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    if checkpoint_model is not None:
        best_epoch = 50 * adv_accs.index(max(adv_accs))
        save_checkpoint(checkpoint_model, run_dir / "checkpoints" / f"epoch_{best_epoch:06d}.safetensors",
                        metadata={"epoch": best_epoch})
    return run_dir


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    _run(root, "gen", 1, [0.5, 0.0, 1.0, 1.0])
    _run(root, "stuck", 2, [0.5, 0.0, 0.0, 0.01])
    _run(root, "near", 0, [0.5, 0.0, BEST, 0.2], checkpoint_model=all_odd_missing_model(8))
    return root


def _csv(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_outcomes_carry_the_near_miss_view_beside_the_unchanged_rate(study, tmp_path):
    result = write_report(study, tmp_path / "report", print_table=False)
    by_seed = {row["seed"]: row for row in result["rows"]}
    assert [by_seed[s]["generalized"] for s in (1, 2, 0)] == [True, False, False]  # the paper's criterion
    near = by_seed[0]
    assert {k: near[k] for k in NEAR_MISS_FIELDS} == {
        "best_adv_acc": BEST, "best_adv_epoch": 100, "n_adv_wrong_at_best": 13, "within_1pct": True,
        "near_miss_groups": "n_odd=8 (13 of 13 wrong)", "near_miss_epoch": 100, "n_adv_wrong_at_checkpoint": 13}
    assert by_seed[2]["within_1pct"] is False and by_seed[2]["near_miss_groups"] is None  # never left the shortcut
    assert by_seed[1]["within_1pct"] is False and by_seed[1]["n_adv_wrong_at_best"] == 0
    # cached: the outcome record holds it and the checkpoint's analysis is on disk
    assert read_outcome(near["run_dir"])["near_miss_groups"] == "n_odd=8 (13 of 13 wrong)"
    assert (study / "runs" / "near" / "analyses" / AT_BEST_NAME).is_dir()
    assert not (study / "runs" / "stuck" / "analyses").exists()  # far from the criterion: no checkpoint read
    # 16,384 examples in batches of 512: 32 steps an epoch, 150 epochs; lr x wd 1e-3
    assert {(row["steps"], row["lr_x_wd"], row["decay_clocks"]) for row in result["rows"]} == {(4800, 0.001, 4.8)}

    written = {row["seed"]: row for row in _csv(result["paths"]["outcomes_csv"])}
    assert written["0"]["within_1pct"] == "True" and written["0"]["n_adv_wrong_at_best"] == "13"
    assert written["0"]["near_miss_groups"] == "n_odd=8 (13 of 13 wrong)"
    (cell,) = result["table"]
    assert (cell["n_generalized"], cell["n_near_misses"], cell["n_near_miss_known"], cell["n_seeds"]) == (1, 1, 3, 3)
    assert (cell["steps"], cell["decay_clocks"]) == (4800, 4.8)
    assert _csv(result["paths"]["table_csv"])[0]["n_near_misses"] == "1"
    markdown = result["paths"]["table_md"].read_text()
    assert "near misses (within 1%) k/n" in markdown and "| 1/3 | 0.33 |" in markdown and "| 1/3 |" in markdown
    assert "| 4,800 | 4.8 |" in markdown
    assert result["paths"]["rate_png"].is_file()

    # the report's own outcomes.csv reads back to the same table, near misses included
    again = write_report_sources([result["paths"]["outcomes_csv"]], tmp_path / "again", print_table=False)
    assert again["table"] == result["table"]
    assert (tmp_path / "again" / "outcomes.csv").read_bytes() == result["paths"]["outcomes_csv"].read_bytes()


def test_rows_of_an_outcomes_csv_without_the_view_stay_blank(study, tmp_path):
    result = write_report(study, tmp_path / "report", print_table=False)
    rows = _csv(result["paths"]["outcomes_csv"])
    old = tmp_path / "old.csv"
    with open(old, "w", newline="") as handle:
        columns = [k for k in rows[0] if k not in NEAR_MISS_FIELDS]
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    report = write_report_sources([old], tmp_path / "old_report", print_table=False)
    assert all(row[k] is None for row in report["rows"] for k in NEAR_MISS_FIELDS)
    (cell,) = report["table"]
    assert (cell["n_near_misses"], cell["n_near_miss_known"]) == (0, 0)
    assert "| 1/3 | 0.33 | [0.06, 0.79] | - |" in report["paths"]["table_md"].read_text()


def test_the_rate_figure_marks_near_misses_apart_from_the_shortcut(study, tmp_path):
    from interp_toolkit.studies.report.plots import plot_rate_vs_r

    table = write_report(study, tmp_path / "report", print_table=False)["table"]
    texts = [t.get_text() for t in plot_rate_vs_r(table).axes[0].texts]
    assert texts == ["+1 near"]
    no_near = [{**table[0], "n_near_misses": 0}]
    assert list(plot_rate_vs_r(no_near).axes[0].texts) == []
