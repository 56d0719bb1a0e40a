"""The influence study on a tiny MPSP run: the command, its CSV, its cache, its phases and
the onset-examples permutation test."""

from __future__ import annotations

import json

import pytest
import torch

from interp_toolkit.cli import main
from interp_toolkit.errors import UserError
from interp_toolkit.model import ModelConfig
from interp_toolkit.runs.config import TrainConfig
from interp_toolkit.runs.mpsp import train_mpsp
from interp_toolkit.studies.influence.examples import onset_examples
from interp_toolkit.studies.influence.phases import draw_phase_threshold, training_phase
from interp_toolkit.studies.influence.plot import plot_influence, plot_influence_summary
from interp_toolkit.studies.influence.table import CSV_COLUMNS, read_influence_csv
from interp_toolkit.tasks.mpsp import MPSPConfig

torch.set_num_threads(1)

TINY = ["--chains", "2", "--draws", "4", "--burn-in", "2", "--batch-size", "32", "--eps", "1e-4",
        "--n-query", "16", "--n-consistent", "8", "--amplification-n", "32", "--no-progress", "--no-adaptive"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("influence") / "run"
    task = MPSPConfig(seq_len=4, n_values=5, r=0.75, n_train=64, n_eval=32)
    model = ModelConfig(n_layers=1, n_heads=1, d_model=16, d_mlp=16, **task.model_dims())
    train_mpsp(task, model, TrainConfig(epochs=20, eval_every=10, checkpoint_every=10, checkpoint_log_spaced=False,
                                        progress=False), run_dir)
    return run_dir


def record_climb(out, epoch):
    (path,) = (out / "cache").glob(f"epoch_{epoch:06d}_*.json")
    return json.loads(path.read_text())["locality"]["worst_climb"]


def test_influence_calibrate_gates_every_setting_for_locality(tiny_run, tmp_path, capsys):
    out = tmp_path / "cal"
    assert main(["influence", str(tiny_run), "--out", str(out), "--epochs", "20", *TINY, "--calibrate",
                 "--calibrate-eps", "1e-5", "1e-3"]) == 0
    printed = capsys.readouterr().out
    (path,) = out.glob("calibration_*.json")
    report = json.loads(path.read_text())
    assert report["epoch"] == 20 and [row["eps"] for row in report["rows"]] == [1e-5, 1e-3]
    assert all(row["local"] in (True, False) and (row["diverged"] or row["climb"] is not None)
               for row in report["rows"])
    recommended = report["recommended"]
    assert recommended is None or report["rows"][recommended]["local"]  # never a non-local setting
    assert "recommended:" in printed and path.with_suffix(".png").is_file()
    assert main(["influence", str(tiny_run), "--out", str(out), *TINY, "--calibrate", "--calibrate-eps", "0"]) == 2
    err = capsys.readouterr().err
    assert "calibrate_eps" in err and err.count("error:") == 1 and "Traceback" not in err


def test_influence_command_writes_csv_figure_and_reads_its_cache(tiny_run, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["influence", str(tiny_run), "--out", str(out), "--epochs", "10", "20", *TINY]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "computed 2 checkpoint(s), 0 from the cache" in printed
    rows = read_influence_csv(out / "influence.csv")
    assert list(rows[0]) == list(CSV_COLUMNS)
    assert {r["epoch"] for r in rows} == {10, 20}
    assert {r["query_set"] for r in rows} == {"adv", "val"}
    assert {"anti", "consistent"} <= {r["train_group"] for r in rows}
    for row in rows:  # the phase split adds up to the total
        assert row["within"] + row["between"] == pytest.approx(row["bif"], rel=1e-4, abs=1e-6)
        assert row["stderr"] >= 0 and row["amplification"] > 0
    anti = next(r for r in rows if r["train_group"] == "anti")
    n_anti = int((~_splits(tiny_run)["train"].agrees).sum())
    assert anti["n_examples"] == n_anti
    (record_path,) = (out / "cache").glob("epoch_000010_*.json")
    record = json.loads(record_path.read_text())
    assert len(record["per_example"]["adv"]["bif"]) == n_anti + 8 == len(record["train_index"])
    # every row carries the joint gate of its checkpoint's draws; 2 chains x 4 draws never converge
    assert {r["verdict"] for r in rows} == {"not converged"} and "sampling verdict" in printed
    assert record["locality"]["reference"] == "label-marginal cross-entropy"
    assert all(r["climb"] == pytest.approx(record_climb(out, r["epoch"])) for r in rows)
    # gamma and eps were derived at the checkpoint (the default)
    from interp_toolkit.analyses.bif.localize import EPS_GAMMA, EPS_STIFF

    found = record["localization"]
    assert found["gamma"] == record["sampler"]["gamma"] and found["eps"] == record["sampler"]["eps"]
    assert found["eps"] == pytest.approx(min(EPS_GAMMA / found["gamma"],
                                             EPS_STIFF / (found["n_beta"] * abs(found["curvature"]))))
    assert (out / "influence.png").exists() and (out / "summary.json").exists()
    written = (out / "influence.csv").read_text()
    assert main(args) == 0  # the rerun is served from the cache
    assert "computed 0 checkpoint(s), 2 from the cache" in capsys.readouterr().out
    assert (out / "influence.csv").read_text() == written
    assert main(["influence", str(tiny_run), "--out", str(out), "--epochs", "7", *TINY]) == 2
    assert "no checkpoint for epochs [7]" in capsys.readouterr().err
    assert main(["influence", str(tmp_path / "nowhere"), *TINY]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["influence", str(tiny_run), "--chains", "1"]) == 2
    assert "at least 2 chains" in capsys.readouterr().err
    fig = plot_influence(rows, title="tiny")
    assert fig.axes[0].get_xscale() == "log" and "BIF" in fig.axes[0].get_ylabel()
    summary = plot_influence_summary({"a": rows, "b": rows}, {"a": "left the shortcut"})
    assert len(summary.axes[0].get_lines()) >= 2


def _splits(run_dir):
    from interp_toolkit.analyses.over_checkpoints import splits_from_run

    return splits_from_run(run_dir)


def test_phases_of_a_run_from_its_outcome():
    outcome = {"shortcut_epoch": 40, "phase2_onset_epoch": 100, "first_generalized_epoch": 300}
    assert [training_phase(e, outcome) for e in (10, 40, 99, 100, 299, 300, 600)] == [
        "before shortcut", "shortcut", "shortcut", "phase 2", "phase 2", "generalized", "generalized"]
    assert training_phase(5, {"shortcut_epoch": None, "phase2_onset_epoch": None,
                              "first_generalized_epoch": None}) == "no shortcut"
    metrics = [{"epoch": 0, "adv_acc": 0.5}, {"epoch": 40, "adv_acc": 0.02}, {"epoch": 100, "adv_acc": 0.01},
               {"epoch": 200, "adv_acc": 0.6}]
    assert draw_phase_threshold(outcome, metrics) == pytest.approx(0.11)
    stuck = {"shortcut_epoch": 40, "phase2_onset_epoch": None}
    assert draw_phase_threshold(stuck, metrics[:3]) == pytest.approx(0.11)  # the low after the shortcut


def test_onset_examples_find_a_planted_feature_and_not_a_random_one():
    gen = torch.Generator().manual_seed(1)
    values = torch.randint(0, 10, (400, 5), generator=gen)
    anti = torch.rand(400, generator=gen) < 0.5
    # planted: the most helpful (most negative) anti examples are those whose max sits at position 0
    planted = torch.where(values.argmax(1) == 0, -1.0, 0.0) + 0.01 * torch.rand(400, generator=gen)
    k = 15
    found = onset_examples(values, anti, planted, k=k, permutations=2000)
    position = found["features"]["position_of_max"]
    assert position["top_counts"][0] == k and position["p_tv"] < 0.01 and position["p_mean"] < 0.01
    noise = onset_examples(values, anti, torch.rand(400, generator=gen), k=k, permutations=2000)
    assert noise["features"]["position_of_max"]["p_tv"] > 0.01
    assert all(i in torch.nonzero(anti).flatten().tolist() for i in found["top_index"])
    with pytest.raises(UserError, match="k must be in"):
        onset_examples(values, anti, planted, k=0)


@pytest.mark.parametrize("corrupt, why", [
    ("flip_digit", "content does not match its digest"),
    ("torn", "unreadable"),
    ("no_digest", "written without a content digest"),
])
def test_a_corrupted_cache_entry_is_recomputed_with_a_note(tiny_run, tmp_path, capsys, corrupt, why):
    import re

    out = tmp_path / "out"
    args = ["influence", str(tiny_run), "--out", str(out), "--epochs", "10", *TINY]
    assert main(args) == 0
    written = (out / "influence.csv").read_text()
    (entry,) = (out / "cache").glob("epoch_000010_*.json")
    text = entry.read_text()
    if corrupt == "flip_digit":  # one digit of a stored amplification, as a bit flip would leave it
        match = re.search(r'"amplification": (\d)', text)
        assert match is not None
        digit = match.group(1)
        text = text[:match.start(1)] + str((int(digit) + 8) % 10) + text[match.end(1):]
    elif corrupt == "torn":
        text = text[: len(text) // 2]
    else:
        data = json.loads(text)
        data.pop("header_digest")
        text = json.dumps(data)
    entry.write_text(text)
    capsys.readouterr()
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "computed 1 checkpoint(s), 0 from the cache" in captured.out
    # (the sampler's round notes aside: "BIF at 4 draws ...: not converged")
    notes = [line for line in captured.err.splitlines() if line.startswith("note:") and "BIF at" not in line]
    assert len(notes) == 1 and "recomputed 1 cache entry" in notes[0] and why in notes[0], captured.err
    assert (out / "influence.csv").read_text() == written  # the corrupted number never reaches a result


class _PlantedDraw:
    """A stand-in for an SGLD draw that sits in a known solution of MPSP: it predicts each
    query example's shortcut (or its label: the rule), with a fraction of its predictions
    flipped at random (the draw's noise)."""

    def __init__(self, splits, solution: str, flip: float, seed: int):
        self.lookup = {}
        gen = torch.Generator().manual_seed(seed)
        for name in ("val", "adv"):
            split = splits[name]
            target = split.shortcut if solution == "shortcut" else split.labels
            flipped = torch.rand(len(target), generator=gen) < flip
            for row, value, swap in zip(split.tokens.tolist(), target.tolist(), flipped.tolist(), strict=True):
                self.lookup[tuple(row)] = 1 - value if swap else value

    def __call__(self, tokens):
        preds = torch.tensor([self.lookup[tuple(row)] for row in tokens.tolist()])
        logits = torch.zeros(tokens.shape[0], tokens.shape[1], 2)
        logits[torch.arange(tokens.shape[0]), -1, preds] = 1.0
        return logits


def test_solution_labels_separate_planted_draws_of_the_two_solutions():
    """Draws planted in the shortcut or the rule (with 0-8% of predictions flipped) get their
    solution's label; a draw at chance, or between the two solutions, gets neither."""
    from interp_toolkit.studies.influence.measure import _accuracy_fn
    from interp_toolkit.studies.influence.phases import SOLUTIONS, solution_label
    from interp_toolkit.tasks.mpsp import make_splits

    splits = make_splits(MPSPConfig(seq_len=5, n_values=10, r=0.9, n_train=64, n_eval=512))
    labelled = {}
    for solution in ("shortcut", "rule"):
        for seed, flip in enumerate((0.0, 0.02, 0.05, 0.08)):
            draw = _PlantedDraw(splits, solution, flip, seed)
            acc = {name: float(_accuracy_fn(splits[name].tokens, splits[name].labels, 128)(draw))
                   for name in ("val", "adv")}
            labelled[solution, flip] = SOLUTIONS[solution_label(acc["adv"], acc["val"])]
            if solution == "shortcut":
                assert acc["val"] >= 0.9 and acc["adv"] <= 0.1, acc  # planted as intended
    assert all(label == solution for (solution, _), label in labelled.items()), labelled
    chance = _PlantedDraw(splits, "rule", 0.5, 9)
    acc = {name: float(_accuracy_fn(splits[name].tokens, splits[name].labels, 128)(chance)) for name in ("val", "adv")}
    assert SOLUTIONS[solution_label(acc["adv"], acc["val"])] == "neither"
    # between the two solutions (the rule half learned): neither, not the rule
    assert solution_label(0.6, 1.0) == 2 and solution_label(0.95, 0.95) == 1 and solution_label(0.05, 0.95) == 0
    # a shortcut draw whose noise lifts its adversarial accuracy to 0.12: the onset labels of a
    # run whose shortcut-phase low is 0.02 (threshold 0.12) would call it phase 2 at 0.13
    assert solution_label(0.13, 0.97) == 2 and solution_label(0.08, 0.97) == 0
    with pytest.raises(UserError, match="solution level"):
        solution_label(0.5, 0.5, level=0.4)


def test_the_influence_study_labels_draws_by_solution_by_default(tiny_run, tmp_path):
    from interp_toolkit.analyses.bif.adaptive import AdaptiveConfig
    from interp_toolkit.analyses.bif.config import SamplerConfig
    from interp_toolkit.studies.influence.measure import InfluenceConfig, run_influence

    sampler = SamplerConfig(eps=1e-4, gamma=1000.0, n_beta=64.0, chains=2, draws=4, burn_in=2, progress=False)
    config = InfluenceConfig(epochs=(20,), n_query=16, n_consistent=8, amplification_n=32, sampler=sampler,
                             convergence=AdaptiveConfig(adaptive=False))
    assert config.draw_phases == "solution"  # the default
    result = run_influence(tiny_run, config, out=tmp_path / "solution", progress=False)
    record = result.records[20]
    assert record["draw_phases"] == "solution"
    shares = record["draw_label_shares"]
    assert set(shares) == {"shortcut", "rule", "neither"} and sum(shares.values()) == pytest.approx(1.0)
    assert record["phase2_draw_share"] == shares["rule"]
    # the between-solution share of each group's BIF beside its Gaussian null
    for name, values in record["groups"].items():
        for query in ("adv", "val"):
            entry = values[query]
            assert entry["null_between_share"] is not None and entry["null_between_std"] >= 0, (name, query)
            if entry["bif"] != 0:  # the share of the decomposition the study reports
                assert entry["between_share"] == pytest.approx(entry["between"] / entry["bif"], rel=1e-4, abs=1e-9)
    onset = run_influence(tiny_run, InfluenceConfig(epochs=(20,), n_query=16, n_consistent=8, amplification_n=32,
                                                    sampler=sampler, draw_phases="onset",
                                                    convergence=AdaptiveConfig(adaptive=False)),
                          out=tmp_path / "onset", progress=False)
    assert set(onset.records[20]["draw_label_shares"]) == {"shortcut phase", "phase 2"}
    with pytest.raises(UserError, match="draw_phases"):
        InfluenceConfig(draw_phases="by-eye")


def test_a_bad_draw_phases_flag_is_one_error_line_and_exit_2(tiny_run, tmp_path, capsys):
    assert main(["influence", str(tiny_run), "--out", str(tmp_path / "out"), "--draw-phases", "by-eye", *TINY]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "by-eye" in err and "--draw-phases" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # refused before any work


def test_the_study_script_tables_every_trained_run_by_kind(tmp_path):
    import csv
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "examples" / "influence_study.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    out, dest = tmp_path / "study", tmp_path / "runs.csv"
    for args in (["train", str(out), "20", "0", "1"], ["outcomes", str(out), str(dest)]):
        done = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
    with open(dest, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["seed"] for row in rows] == ["0", "1"]
    assert list(rows[0]) == ["seed", "kind", "shortcut_epoch", "phase2_onset_epoch", "first_100pct_adv_epoch",
                             "best_adv_acc_after_shortcut", "final_adv_acc", "final_epoch"]
    for row in rows:
        assert row["kind"] in ("left the shortcut", "no phase 2 (outcome code)", "rising, no onset")
        assert row["final_epoch"] == "20" and 0.0 <= float(row["final_adv_acc"]) <= 1.0


def _measured(folder, run_dir, draws, rows):
    import json

    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"run_dir": run_dir, "settings": {"sampler": {"draws": draws}}}))
    lines = ["epoch,train_group,query_set,bif"] + [",".join(map(str, row)) for row in rows]
    (folder / "influence.csv").write_text("\n".join(lines) + "\n")


def _study_script(*args):
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "examples" / "influence_study.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, str(script), *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_study_script_merges_a_checkpoint_measured_again_with_its_draws(tmp_path):
    import csv

    first = [(50, "anti", "adv", -0.1), (50, "anti", "val", 0.1), (100, "anti", "adv", -0.2), (100, "anti", "val", 0.2),
             (200, "anti", "adv", -0.3), (200, "anti", "val", 0.3)]
    _measured(tmp_path / "a", "runs/seed3", 200, first)
    _measured(tmp_path / "b", "runs/seed3", 400, [(100, "anti", "val", 0.25), (100, "anti", "adv", -0.25)])
    done = _study_script("merge", tmp_path / "merged.csv", tmp_path / "a", tmp_path / "b")
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "merged.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    # epoch 100 comes from the second measurement, in the first table's row order; the rest stay
    assert [(r["epoch"], r["query_set"], r["bif"], r["draws"]) for r in rows] == [
        ("50", "adv", "-0.1", "200"), ("50", "val", "0.1", "200"), ("100", "adv", "-0.25", "400"),
        ("100", "val", "0.25", "400"), ("200", "adv", "-0.3", "200"), ("200", "val", "0.3", "200")]
    assert "epoch 100: 400 draws" in done.stdout


def test_the_study_script_refuses_to_merge_measurements_of_two_runs(tmp_path):
    _measured(tmp_path / "a", "runs/seed3", 200, [(50, "anti", "adv", -0.1)])
    _measured(tmp_path / "b", "runs/seed5", 400, [(50, "anti", "adv", -0.2)])
    done = _study_script("merge", tmp_path / "merged.csv", tmp_path / "a", tmp_path / "b")
    assert done.returncode != 0 and "runs/seed3" in done.stderr and "runs/seed5" in done.stderr
    assert not (tmp_path / "merged.csv").exists()


def test_merge_measurements_refuses_two_runs_with_a_user_error(tmp_path):
    from interp_toolkit.studies.influence.study import merge_measurements

    _measured(tmp_path / "a", "runs/seed3", 200, [(50, "anti", "adv", -0.1)])
    _measured(tmp_path / "b", "runs/seed5", 400, [(50, "anti", "adv", -0.2)])
    with pytest.raises(UserError, match=r"one run; these measure \['runs/seed3', 'runs/seed5'\]"):
        merge_measurements(tmp_path / "merged.csv", [tmp_path / "a", tmp_path / "b"])
    assert not (tmp_path / "merged.csv").exists()


def test_run_influence_refuses_a_bad_figure_format_before_any_work(tiny_run, tmp_path):
    from interp_toolkit.studies.influence.measure import InfluenceConfig, run_influence

    with pytest.raises(UserError, match="got 'gif'"):
        run_influence(tiny_run, InfluenceConfig(epochs=(20,)), out=tmp_path / "out", format="gif")
    assert not (tmp_path / "out").exists()
