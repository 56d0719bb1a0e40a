"""Mechanism with controls: runs sorted by outcome, per-epoch and per-window statistics against
hand computations, verdicts, the shared gradient cache, files, CLI and its errors."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import ttest_ind

from interp_toolkit.errors import UserError
from interp_toolkit.studies.mechanism.contrast import (
    compute_contrast,
    contrast_runs,
    default_windows,
    read_contrast,
)
from interp_toolkit.studies.mechanism.contrast_data import (
    FILES,
    ContrastConfig,
    RunSeries,
    parse_window,
)
from interp_toolkit.studies.mechanism.contrast_plot import write_contrast
from interp_toolkit.studies.mechanism.measure import MechanismConfig, mechanism_over_checkpoints
from tests.studies.fakes import GEN, STUCK, curve
from tests.studies.mechanism.test_mechanism import _cli, _train

EPOCHS = list(range(0, 110, 10))
ONSET = 50


def _outcome(left: bool) -> dict:
    return {"generalized": left, "first_generalized_epoch": 80 if left else None, "shortcut_epoch": 10,
            "phase2_onset_epoch": ONSET if left else None, "max_adv_acc": 1.0 if left else 0.05}


def _series(n_left: int, n_stayed: int, r: float = 0.9, gap: float = 1.5, seed: int = 0) -> list[RunSeries]:
    """Runs whose quantities match before ONSET (noise only) and differ by ``gap`` (cosine)
    and 4x (amplification) after it in the runs that left."""
    rng = np.random.default_rng(seed)
    runs = []
    for i in range(n_left + n_stayed):
        left = i < n_left
        cos = [-0.95 + 0.01 * rng.standard_normal() + (gap if left and e >= ONSET else 0.0) for e in EPOCHS]
        amp = [9.0 + 0.3 * rng.standard_normal() - (6.0 if left and e >= ONSET else 0.0) for e in EPOCHS]
        runs.append(RunSeries(run_dir=Path(f"run{i}"), outcome=_outcome(left), r=r,
                              n_layers=1, epochs=list(EPOCHS),
                              values={"grad_cos": cos, "minority_amplification": amp}))
    return runs


def test_default_windows_are_the_shortcut_phase_and_phase_2_on():
    runs = _series(5, 5)
    assert default_windows(runs, EPOCHS, "generalized") == [("shortcut phase", 10, ONSET), ("phase 2 on", ONSET, None)]
    runs[0].outcome["shortcut_epoch"] = 60  # learned after the first onset: no common shortcut phase
    assert default_windows(runs, EPOCHS, "generalized") == [("first shortcut to first onset", 10, ONSET),
                                                           ("phase 2 on", ONSET, None)]
    for run in runs:
        run.outcome["shortcut_epoch"] = 55 if run.left("generalized") else 60  # every shortcut after the onset
    assert default_windows(runs, EPOCHS, "generalized") == [("before the first onset", 0, ONSET),
                                                           ("phase 2 on", ONSET, None)]
    runs[0].outcome["shortcut_epoch"] = None  # no shortcut (r = 1/m), so no phase 2: split at the first onset
    assert default_windows(runs, EPOCHS, "generalized") == [("before the first onset", 0, ONSET),
                                                           ("from the first onset", ONSET, None)]
    runs[1].outcome["phase2_onset_epoch"] = runs[1].outcome["first_generalized_epoch"] = None
    assert default_windows(runs, EPOCHS, "generalized") == [("whole run", 0, None)]


def test_quantities_that_differ_only_after_the_onset_are_told_apart_only_there():
    result = compute_contrast(_series(5, 5), ContrastConfig())
    verdicts = {(row["quantity"], row["window"]): row["verdict"] for row in result.window_rows}
    assert verdicts == {("grad_cos", "shortcut phase"): "does not distinguish",
                        ("grad_cos", "phase 2 on"): "distinguishes",
                        ("minority_amplification", "shortcut phase"): "does not distinguish",
                        ("minority_amplification", "phase 2 on"): "distinguishes"}
    after = next(row for row in result.window_rows if row["window"] == "phase 2 on" and row["quantity"] == "grad_cos")
    assert after["p"] == pytest.approx(2 / 252)  # fully separated 5 vs 5: the exact test's floor
    assert after["p_holm"] == pytest.approx(4 * 2 / 252)  # the smallest of a family of 4, times 4
    assert after["difference"] == pytest.approx(1.5, abs=0.03)


def test_per_epoch_and_per_window_numbers_are_the_hand_computed_ones():
    runs = _series(4, 6, seed=2)
    result = compute_contrast(runs, ContrastConfig())
    left, stayed = runs[:4], runs[4:]
    row = next(r for r in result.by_epoch if r["epoch"] == 70 and r["quantity"] == "minority_amplification")
    a = [run.values["minority_amplification"][7] for run in left]
    b = [run.values["minority_amplification"][7] for run in stayed]
    ci = ttest_ind(a, b, equal_var=False).confidence_interval()
    assert (row["mean_leaving"], row["sd_leaving"], row["n_leaving"]) == pytest.approx(
        (np.mean(a), np.std(a, ddof=1), 4)
    )
    assert (row["mean_staying"], row["n_staying"]) == pytest.approx((np.mean(b), 6))
    assert (row["difference"], row["ci_low"], row["ci_high"]) == pytest.approx(
        (np.mean(a) - np.mean(b), ci.low, ci.high)
    )
    # a window's per-run value is the run's median over the window's epochs (10..40 here)
    window = next(r for r in result.window_rows if r["window"] == "shortcut phase" and r["quantity"] == "grad_cos")
    medians = [float(np.median(run.values["grad_cos"][1:5])) for run in runs]
    assert window["mean_leaving"] == pytest.approx(np.mean(medians[:4]))
    assert window["mean_staying"] == pytest.approx(np.mean(medians[4:]))
    assert [r["grad_cos@generalized:shortcut phase"] for r in result.run_rows] == pytest.approx(medians)
    assert [r["kind_generalized"] for r in result.run_rows] == ["generalized"] * 4 + ["not generalized"] * 6


def test_groups_too_small_to_reach_the_level_say_so():
    result = compute_contrast(_series(3, 3), ContrastConfig())
    # 3 vs 3 can never go below p = 0.1: no verdict either way
    assert {row["verdict"] for row in result.window_rows} == {"too few runs"}
    assert all(row["smallest_p"] == pytest.approx(0.1) for row in result.window_rows)


def test_explicit_windows_and_grouping_by_phase_2():
    runs = _series(3, 5)
    runs[3].outcome["phase2_onset_epoch"] = 60  # rose toward the rule, never reached 100%
    by_gen = compute_contrast(runs, ContrastConfig(by=("generalized",), windows=("0:30", "60:")))
    by_phase2 = compute_contrast(runs, ContrastConfig(by="phase2", windows=("0:30", "60:")))
    assert [w[1:] for w in by_gen.windows["generalized"]] == [(0, 30), (60, None)]
    assert sum(r["kind_generalized"] == "generalized" for r in by_gen.run_rows) == 3
    assert sum(r["kind_phase2"] == "phase 2" for r in by_phase2.run_rows) == 4
    assert by_phase2.kinds == {"phase2": ("phase 2", "no phase 2")}
    assert by_gen.groupings == ("generalized",) and by_phase2.groupings == ("phase2",)


def test_every_grouping_is_reported_and_holm_runs_over_the_whole_family():
    runs = _series(5, 5)
    runs[5].outcome["phase2_onset_epoch"] = 60  # rose toward the rule, never reached 100%
    runs[6].outcome["phase2_onset_epoch"] = 60
    both = compute_contrast(runs, ContrastConfig())
    alone = {by: compute_contrast(runs, ContrastConfig(by=by)) for by in ("generalized", "phase2")}
    assert both.groupings == ("generalized", "phase2") and both.skipped == {}
    assert [(r["grouping"], r["quantity"], r["window"]) for r in both.window_rows] == [
        (r["grouping"], r["quantity"], r["window"]) for by in ("generalized", "phase2")
        for r in alone[by].window_rows]
    raw = [r["p"] for r in both.window_rows]
    assert raw == pytest.approx([r["p"] for by in ("generalized", "phase2") for r in alone[by].window_rows])
    # Holm by hand over all 8 tests: the sorted p times (m - rank), running maximum, capped at 1
    order = sorted(range(len(raw)), key=lambda i: raw[i])
    expected, running = [0.0] * len(raw), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(raw) - rank) * raw[i]))
        expected[i] = running
    assert [r["p_holm"] for r in both.window_rows] == pytest.approx(expected)
    # a family twice the size: each test's Holm p is at least its one-grouping value
    for row, single in zip(both.window_rows[:4], alone["generalized"].window_rows, strict=True):
        assert row["p_holm"] >= single["p_holm"] - 1e-12
    assert {r["kind_phase2"] for r in both.run_rows} == {"phase 2", "no phase 2"}


def test_a_grouping_that_cannot_be_formed_or_repeats_another_is_named_not_computed():
    runs = _series(5, 5)  # every run with an onset generalized: phase2 sorts them as generalized does
    result = compute_contrast(runs, ContrastConfig())
    assert result.groupings == ("generalized",)
    assert "sorts the runs exactly as by 'generalized'" in result.skipped["phase2"]
    assert {r["grouping"] for r in result.window_rows} == {"generalized"}
    for run in runs[5:]:
        run.outcome["phase2_onset_epoch"] = 70  # now all 10 left by phase2: no "no phase 2" group
    result = compute_contrast(runs, ContrastConfig())
    assert result.skipped["phase2"].startswith("10 phase 2 and 0 no phase 2")
    assert any("by 'phase2': not computed (10 phase 2 and 0 no phase 2" in line for line in result.counts())
    with pytest.raises(UserError, match="by 'phase2' 10 phase 2 and 0 no phase 2.*try --by generalized"):
        compute_contrast(runs, ContrastConfig(by="phase2"))


@pytest.mark.parametrize("text, needle", [("5", "must be START:END"), ("a:b", "must be START:END"),
                                          ("30:10", "0 <= START < END"), ("-1:5", "0 <= START < END")])
def test_bad_windows_are_named(text, needle):
    with pytest.raises(UserError, match=needle):
        parse_window(text)
    with pytest.raises(UserError, match=needle):
        ContrastConfig(windows=(text,))


def _shift_first_run(runs):
    first = runs[0]
    runs[0] = RunSeries(first.run_dir, first.outcome, first.r, 1, [e + 1 for e in first.epochs], first.values)
    return runs


def _balanced(runs):
    for run in runs:
        run.r = 0.5
    return runs


@pytest.mark.parametrize("runs, needle", [
    (lambda: _series(1, 2), "1 generalized and 2 not generalized"),
    (lambda: _series(4, 1), "4 generalized and 1 not generalized"),
    (lambda: _balanced(_series(2, 2)), "undefined at r = 0.5"),
    (lambda: _shift_first_run(_series(2, 2)), "share no checkpoint epoch"),
])
def test_contrasts_that_cannot_be_made_are_refused_by_name(runs, needle):
    with pytest.raises(UserError, match=needle):
        compute_contrast(runs(), ContrastConfig())


def test_a_window_without_shared_epochs_is_refused():
    with pytest.raises(UserError, match="holds none of the runs' shared checkpoint epochs"):
        compute_contrast(_series(2, 2), ContrastConfig(windows=("101:200",)))


def test_config_rejects_unknown_quantities_and_levels():
    with pytest.raises(UserError, match="quantities"):
        ContrastConfig(quantities=("loss",))
    with pytest.raises(UserError, match="alpha"):
        ContrastConfig(alpha=1.5)
    with pytest.raises(UserError, match="by"):
        ContrastConfig(by="accuracy")


def test_written_files_redraw_from_the_summary_alone(tmp_path):
    result = compute_contrast(_series(5, 4), ContrastConfig())
    paths = write_contrast(result, tmp_path / "out")
    assert {p.name for p in paths.values()} == set(FILES.values())
    assert paths["figure"].read_bytes()[:4] == b"\x89PNG"
    again = read_contrast(tmp_path / "out")
    write_contrast(again, tmp_path / "again")
    for name in ("by_epoch", "windows", "runs"):
        assert (tmp_path / "again" / FILES[name]).read_text() == paths[name].read_text()
    summary = json.loads(paths["summary"].read_text())
    assert summary["kinds"] == {"generalized": ["generalized", "not generalized"]} and len(summary["runs"]) == 9
    assert summary["skipped"] == {"phase2": "it sorts the runs exactly as by 'generalized'; its tests would repeat "
                                            "those"}


def test_a_summary_written_with_one_grouping_name_reads_back(tmp_path):
    result = compute_contrast(_series(5, 4), ContrastConfig(by="generalized"))
    data = result.summary()
    data["config"]["by"] = "generalized"  # how summaries stored it when by was one name
    again = compute_contrast(result.runs, ContrastConfig.from_dict(data["config"]))
    assert again.window_rows == result.window_rows


# ----------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def four_runs(tmp_path_factory):
    """Four tiny trained runs (real checkpoints and gradients); two get a generalizing history."""
    root = tmp_path_factory.mktemp("contrast")
    runs = []
    for seed in range(4):
        run_dir = _train(root / f"s{seed}", 1)
        histories = GEN if seed < 2 else STUCK
        # the outcome is read from metrics.jsonl: these runs are sorted as if two generalized
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps({**m, "epoch": 10 * i}) + "\n"
                                                       for i, m in enumerate(curve(histories))))
        runs.append(run_dir)
    return runs


SMALL = ContrastConfig(grad_n=128, grad_chunk_size=64)


def test_series_are_the_mechanism_figures_own_and_share_its_cache(four_runs):
    result = contrast_runs(four_runs, SMALL)
    assert [row["kind_generalized"] for row in result.run_rows] == ["generalized"] * 2 + ["not generalized"] * 2
    assert result.epochs == [0, 10, 20]
    mech = mechanism_over_checkpoints(four_runs[0], MechanismConfig(grad_n=128, grad_chunk_size=64, fingerprint_n=64,
                                                                    patching_n=32, ablation_n=64))
    assert mech.computed["gradients"] == []  # the contrast computed them into the mechanism's cache
    for quantity in ("grad_cos", "minority_amplification"):
        epochs, values = mech.series(quantity)
        assert epochs == result.runs[0].epochs
        assert values == pytest.approx(result.runs[0].values[quantity])
        assert all(math.isfinite(v) for v in values)


def test_cli_on_a_study_folder_writes_every_file_and_prints_the_verdicts(four_runs, tmp_path, capsys):
    study = tmp_path / "study"
    (study / "runs").mkdir(parents=True)
    (study / "study.json").write_text(json.dumps({"name": "study"}))
    for run_dir in four_runs:
        shutil.copytree(run_dir, study / "runs" / run_dir.parent.name)
    code, out, err = _cli(capsys, "mechanism-contrast", study, "--out", tmp_path / "out", "--grad-n", "128",
                          "--grad-chunk-size", "64", "--no-progress", "--windows", "0:15", "15:")
    assert code == 0, err
    assert "4 runs; 3 shared checkpoint epochs (0-20)\nby 'generalized': 2 generalized, 2 not generalized\n" in out
    assert "by 'phase2': not computed (" in out
    assert "Holm over the whole family: 4 tests (1 grouping x windows x quantities)" in out
    assert out.count(": too few runs") == 4  # 2 vs 2 can never reach 0.05
    assert all((tmp_path / "out" / name).is_file() for name in FILES.values())
    code, out, err = _cli(capsys, "mechanism-contrast", "--from-summary", tmp_path / "out" / FILES["summary"],
                          "--out", tmp_path / "redrawn")
    assert code == 0, err
    assert (tmp_path / "redrawn" / FILES["windows"]).read_text() == (tmp_path / "out" / FILES["windows"]).read_text()


@pytest.mark.parametrize("argv, needle", [
    (["mechanism-contrast", "RUN0"], "needs --out DIR"),
    (["mechanism-contrast", "--out", "OUT"], "needs run directories or study directories"),
    (["mechanism-contrast", "NOWHERE", "--out", "OUT"], "neither a run directory"),
    (["mechanism-contrast", "RUN0", "RUN0", "--out", "OUT"], "given twice"),
    (["mechanism-contrast", "RUN0", "RUN1", "RUN2", "--out", "OUT"], "2 generalized and 1 not generalized"),
    (["mechanism-contrast", "RUN0", "--from-summary", "OUT/contrast.json", "--out", "OUT"], "not both"),
    (["mechanism-contrast", "RUN0", "RUN1", "RUN2", "RUN3", "--out", "OUT", "--windows", "50:"],
     "holds none of the runs' shared checkpoint epochs"),
    (["mechanism-contrast", "RUN0", "--out", "OUT", "--quantities", "loss"], "quantities"),
])
def test_cli_bad_input_is_one_error_line_and_nothing_is_computed(argv, needle, four_runs, tmp_path, capsys):
    paths = {f"RUN{i}": run for i, run in enumerate(four_runs)}
    paths.update({"OUT": tmp_path / "out", "NOWHERE": tmp_path / "nowhere",
                  "OUT/contrast.json": tmp_path / "out" / "contrast.json"})
    before = {run: sorted(p.relative_to(run) for p in run.rglob("*")) for run in four_runs}
    code, _, err = _cli(capsys, *[paths.get(a, a) for a in argv])
    assert code == 2, err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1, err
    assert needle in err, err
    assert not (tmp_path / "out").exists()
    assert {run: sorted(p.relative_to(run) for p in run.rglob("*")) for run in four_runs} == before


# ----------------------------------------------------------------------------- settings, files read back


@pytest.fixture(scope="module")
def other_r_run(tmp_path_factory):
    """A run of the four's setting but r = 0.7, with a stuck history."""
    run_dir = _train(tmp_path_factory.mktemp("other_r"), 1, r=0.7)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({**m, "epoch": 10 * i}) + "\n"
                                                   for i, m in enumerate(curve(STUCK))))
    return run_dir


def test_runs_of_other_settings_are_refused_naming_the_setting(four_runs, other_r_run, tmp_path, capsys):
    before = sorted(p.relative_to(other_r_run) for p in other_r_run.rglob("*"))
    code, _, err = _cli(capsys, "mechanism-contrast", *four_runs[:3], other_r_run, "--out", tmp_path / "out",
                        "--no-progress")
    assert code == 2, err
    assert err.count("error:") == 1 and "differ in more than their seeds (task.r: 0.9, 0.7)" in err, err
    assert "--allow-differing task.r" in err
    assert not (tmp_path / "out").exists()
    assert sorted(p.relative_to(other_r_run) for p in other_r_run.rglob("*")) == before  # nothing computed
    # named, the contrast is made and says what confounds it
    code, out, err = _cli(capsys, "mechanism-contrast", *four_runs[:3], other_r_run, "--out", tmp_path / "out",
                          "--no-progress", "--grad-n", "128", "--grad-chunk-size", "64",
                          "--quantities", "grad_cos", "--allow-differing", "task.r")
    assert code == 0, err
    assert "confounded: the runs also differ in task.r (0.9, 0.7)" in out
    summary = json.loads((tmp_path / "out" / FILES["summary"]).read_text())
    assert [run["settings"]["task.r"] for run in summary["runs"]] == [0.9, 0.9, 0.9, 0.7]
    assert "train.seed" not in summary["runs"][0]["settings"] and "model.seed" not in summary["runs"][0]["settings"]


def _summary_file(tmp_path):
    result = compute_contrast(_series(5, 4), ContrastConfig())
    result.runs[0].values["grad_cos"][1] = math.nan
    return write_contrast(result, tmp_path / "out")["summary"]


def test_summary_is_strict_json_and_nan_reads_back_as_nan(tmp_path):
    path = _summary_file(tmp_path)
    text = path.read_text()
    assert "NaN" not in text and "header_digest" in text
    json.loads(text, parse_constant=lambda token: pytest.fail(f"bare {token} in {path}"))
    again = read_contrast(path)
    assert math.isnan(again.runs[0].values["grad_cos"][1])
    assert len(again.runs[0].values["grad_cos"]) == len(again.runs[0].epochs)


def _edit_value(data):
    data["runs"][0]["values"]["grad_cos"][0] += 1.0


def _shorten_list(data):
    data["runs"][0]["values"]["grad_cos"].pop()


@pytest.mark.parametrize("edit, needle", [
    (_edit_value, "does not match the digest written with it"),
    (lambda data: data.pop("header_digest"), "records no content digest"),
])
def test_an_edited_summary_is_refused_by_name(edit, needle, tmp_path, capsys):
    path = _summary_file(tmp_path)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    code, _, err = _cli(capsys, "mechanism-contrast", "--from-summary", path, "--out", tmp_path / "redrawn")
    assert code == 2 and err.count("error:") == 1 and str(path) in err and needle in err, err
    assert not (tmp_path / "redrawn").exists()


@pytest.mark.parametrize("make, needle", [
    ("run_json", "is not the contrast.json of interp-toolkit mechanism-contrast: it has no runs"),
    ("short_list", "holds a run series that mechanism-contrast cannot have written"),
    ("not_json", "is not JSON"),
    ("not_utf8", "is not UTF-8 text"),
])
def test_malformed_summaries_are_user_errors_naming_the_file(make, needle, four_runs, tmp_path, capsys):
    from interp_toolkit.io import with_header_digest

    path = tmp_path / "contrast.json"
    if make == "run_json":
        path.write_text(json.dumps(with_header_digest(json.loads((four_runs[0] / "run.json").read_text()))))
    elif make == "short_list":
        data = json.loads(_summary_file(tmp_path).read_text())
        _shorten_list(data)
        path.write_text(json.dumps(with_header_digest(data)))  # re-digested: the digest cannot catch it
    elif make == "not_json":
        path.write_text('{"runs": [')
    else:
        path.write_bytes(b'{"runs": "\xff"}')
    code, _, err = _cli(capsys, "mechanism-contrast", "--from-summary", path, "--out", tmp_path / "redrawn")
    assert code == 2, err
    assert err.count("error:") == 1 and str(path) in err and needle in err and "internal error" not in err, err
