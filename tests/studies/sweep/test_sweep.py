"""Sweeps end to end: local and Ray backends, caching, resume after a kill, CLI, validation."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from interp_toolkit.cli import main
from interp_toolkit.errors import UserError
from interp_toolkit.io import atomic_write_json, read_jsonl
from interp_toolkit.runs.trainer import list_checkpoints
from interp_toolkit.studies.grid.config import SweepConfig, preset
from interp_toolkit.studies.grid.study import default_study_dir
from interp_toolkit.studies.sweep.run import plan_jobs, plan_sweep, run_sweep

torch.set_num_threads(1)

COMPARED = ("task", "n_layers", "n_heads", "weight_decay", "r", "seed", "generalized",
            "first_generalized_epoch", "final_adv_acc", "final_val_acc", "max_adv_acc", "shortcut_epoch")


def _summary(rows):
    return [tuple(row[k] for k in COMPARED) for row in rows]


@pytest.fixture(scope="module")
def smoke_local(tmp_path_factory):
    study = tmp_path_factory.mktemp("smoke") / "local"
    from interp_toolkit.loggers import TensorBoardLogger

    result = run_sweep(preset("smoke"), study, backend="local", workers=2, progress=False,
                       callbacks=[TensorBoardLogger()])
    return result


def test_smoke_sweep_local_end_to_end(smoke_local):
    cfg = preset("smoke")
    assert len(smoke_local.rows) == cfg.n_runs() == 4
    assert smoke_local.n_cached == 0
    run_dirs = {row["run_dir"] for row in smoke_local.rows}
    assert len(run_dirs) == 4  # two runs never share a directory
    for row in smoke_local.rows:
        run_dir = Path(row["run_dir"])
        record = json.loads((run_dir / "run.json").read_text())
        assert record["status"] == "finished" and record["trainer"] == "batched"
        metrics = read_jsonl(run_dir / "metrics.jsonl")
        assert metrics[-1]["epoch"] == cfg.train.epochs
        assert [e for e, _ in list_checkpoints(run_dir)][-1] == cfg.train.epochs
        outcome = json.loads((run_dir / "outcome.json").read_text())
        assert outcome["transient_min_span"] == cfg.transient_min_span
        assert outcome["max_adv_acc"] == max(m["adv_acc"] for m in metrics)
        assert outcome["final_val_acc"] == metrics[-1]["val_acc"]
    # seeds differ, so their trajectories differ
    finals = [row["final_adv_acc"] for row in smoke_local.rows]
    assert len(set(finals)) > 1
    for name in ("table.csv", "outcomes.csv", "generalization_rate.png", "curves_by_cell.png"):
        assert (smoke_local.study_dir / name).stat().st_size > 0
    study = json.loads((smoke_local.study_dir / "study.json").read_text())
    assert study["outcome_thresholds"] == cfg.outcome_thresholds().to_dict()


def test_smoke_sweep_over_checkpoints_loadable(smoke_local):
    from interp_toolkit import load_checkpoint

    run_dir = Path(smoke_local.rows[0]["run_dir"])
    model, meta = load_checkpoint(list_checkpoints(run_dir)[-1][1])
    assert meta["epoch"] == preset("smoke").train.epochs
    assert model.interp_config.seed == smoke_local.rows[0]["seed"]


def test_rerun_is_cache_hit(smoke_local):
    before = {row["run_dir"]: (Path(row["run_dir"]) / "run.json").stat().st_mtime_ns for row in smoke_local.rows}
    started = time.perf_counter()
    again = run_sweep(preset("smoke"), smoke_local.study_dir, workers=2, progress=False, report=False)
    assert again.n_cached == 4
    assert time.perf_counter() - started < 10
    assert _summary(again.rows) == _summary(smoke_local.rows)
    after = {row["run_dir"]: (Path(row["run_dir"]) / "run.json").stat().st_mtime_ns for row in again.rows}
    assert after == before


def test_other_sweep_in_same_study_dir_is_refused(smoke_local):
    with pytest.raises(UserError, match="different sweep .settings that differ: epochs, lr"):
        run_sweep(preset("smoke", epochs=10, lr=1e-3), smoke_local.study_dir, progress=False)


def test_study_grows_by_more_seeds_in_place(smoke_local, tmp_path, capsys):
    import shutil

    study = tmp_path / "grown"
    shutil.copytree(smoke_local.study_dir, study)
    grown = run_sweep(preset("smoke", seeds=[0, 1, 2], seeds_per_process=1), study, workers=2,
                      progress=False, log_every=1e-6)
    log = capsys.readouterr().err.splitlines()
    assert log and log[-1].startswith("sweep smoke: runs 6/6 done, evaluations ")  # the line at the end
    done, total = log[-1].split("evaluations ")[1].split(" ")[0].split("/")
    assert done == total  # every evaluation counted once the sweep is over
    assert grown.n_cached == 4  # the study's finished runs are not trained again
    assert len(grown.rows) == 6
    assert sorted({row["seed"] for row in grown.rows}) == [0, 1, 2]
    assert json.loads((study / "study.json").read_text())["config"]["seeds"] == [0, 1, 2]
    import csv

    with open(study / "table.csv", newline="") as f:
        cells = list(csv.DictReader(f))
    assert [cell["n_seeds"] for cell in cells] == ["3", "3"]  # both cells pool their 3 seeds
    # the original, smaller sweep still runs there: every one of its runs is a cache hit
    again = run_sweep(preset("smoke"), study, workers=2, progress=False, report=False)
    assert again.n_cached == 4


def test_progress_lines_for_background_logs():
    """--log-every: plain lines at most that often, with an upper bound on the time left."""
    import io

    from interp_toolkit.studies.sweep.execution import SweepProgress

    class Bar:
        def update(self, n):
            pass

        def set_postfix_str(self, text):
            pass

    now = [0.0]
    stream = io.StringIO()
    jobs = [{"evaluations_per_run": 4, "runs": [{"run_dir": "a"}, {"run_dir": "b"}]}]
    tracker = SweepProgress(Bar(), jobs, n_runs=3, n_cached=1, log_every=60, name="demo", initial=4,
                             stream=stream, clock=lambda: now[0])
    now[0] = 30.0
    tracker.event("evaluation", "a")  # not yet a minute since the start: no line
    assert stream.getvalue() == ""
    now[0] = 61.0
    tracker.event("evaluation", "a")
    assert stream.getvalue() == ("sweep demo: runs 1/3 done, evaluations 6/12 (50%), 0:01:01 elapsed, "
                                 "at most ~0:03:03 left\n")
    now[0] = 70.0
    tracker.event("run_end", "a")  # fills a's remaining evaluations; too soon for a line
    tracker.event("run_end", "b")
    assert stream.getvalue().count("\n") == 1
    tracker.maybe_log(force=True)
    assert stream.getvalue().splitlines()[-1] == "sweep demo: runs 3/3 done, evaluations 12/12 (100%), 0:01:10 elapsed"
    with pytest.raises(UserError, match="log_every must be a positive number"):
        run_sweep(preset("smoke"), log_every=0)


def test_scripted_study_example(tmp_path):
    """examples/scripted_study.py at a tiny size, run as a user runs it: plan, run, grow by a
    seed, report."""
    import csv
    import subprocess
    import sys

    path = Path(__file__).parents[3] / "examples" / "scripted_study.py"
    proc = subprocess.run([sys.executable, str(path), "--out", str(tmp_path / "study"), "--epochs", "4",
                           "--n-train", "64", "--seeds", "3"], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "plan, 2 seeds per cell: 0 finished, 0 recorded, 0 to resume, 4 to start" in out
    assert "plan, 3 seeds per cell: 4 finished, 0 recorded, 0 to resume, 2 to start" in out
    # the grown sweep's new seed shares a job with finished ones: they still count as cached
    assert out.count("trained: 4 runs (0 cached)") == 1 and "trained: 2 runs (4 cached)" in out
    tables = list((tmp_path / "study").rglob("table.csv"))
    assert len(tables) == 1, tables
    with open(tables[0], newline="") as f:
        assert [row["n_seeds"] for row in csv.DictReader(f)] == ["3", "3"]  # both cells pool their 3 seeds
    assert "requested comparisons" in out


def test_cli_log_every_and_dry_run_refusal(smoke_local, tmp_path, capsys):
    """Through the entry point: --log-every prints its last line and exits 0; a dry run in a
    directory holding another sweep exits 2 with one error line and writes nothing."""
    import shutil

    study = tmp_path / "study"
    shutil.copytree(smoke_local.study_dir, study)
    assert main(["sweep", "--preset", "smoke", "--seeds", "3", "--out", str(study), "--workers", "1", "--quiet",
                 "--log-every", "0.001"]) == 0
    err = capsys.readouterr().err
    assert "sweep smoke: runs 6/6 done" in err and "Traceback" not in err
    listing = sorted(str(p) for p in study.rglob("*"))
    assert main(["sweep", "--preset", "smoke", "--epochs", "3", "--out", str(study), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1 and "Traceback" not in err
    assert "settings that differ: epochs" in err
    assert sorted(str(p) for p in study.rglob("*")) == listing


def test_default_study_dir_is_shared_by_grids_with_the_same_settings(tmp_path):
    """A sweep grown by more seeds or ratios lands, by default, in the study it grows."""
    root = tmp_path / "sweeps"
    base = default_study_dir(preset("smoke"), root)
    assert default_study_dir(preset("smoke", seeds=[0, 1, 2], ratios=[0.9]), root) == base
    assert default_study_dir(preset("smoke", epochs=7), root) != base  # a shared setting: another study
    assert base.parent == root and base.name.startswith("smoke_")


def test_default_study_dir_continues_a_study_named_by_its_whole_grid(smoke_local, tmp_path, monkeypatch):
    """Studies started while the default name hashed the whole grid are continued, not retrained."""
    import shutil

    monkeypatch.chdir(tmp_path)
    legacy = Path("runs/sweeps") / f"smoke_{preset('smoke').key()}"
    shutil.copytree(smoke_local.study_dir, legacy)
    one_cell = preset("smoke", ratios=[0.9])  # differs only in the grid: its old name differs too
    assert default_study_dir(one_cell) == legacy
    result = run_sweep(one_cell, workers=1, progress=False, report=False)
    assert result.study_dir == legacy.resolve() and result.n_cached == len(result.rows) == 2
    # another old study with the same settings: which one is meant is ambiguous, unless exact
    other = Path("runs/sweeps") / f"smoke_{preset('smoke', seeds=[5]).key()}"
    other.mkdir(parents=True)
    (other / "study.json").write_text(json.dumps({"key": "x", "config": preset("smoke", seeds=[5]).to_dict()}))
    with pytest.raises(UserError, match="several study directories"):
        default_study_dir(preset("smoke", seeds=[0, 1, 2]))
    assert default_study_dir(preset("smoke", seeds=[5])) == other  # the one holding this exact sweep
    # once the new default directory exists, it is the study
    current = Path("runs/sweeps") / f"smoke_{preset('smoke').study_key()}"
    current.mkdir()
    assert default_study_dir(preset("smoke", seeds=[0, 1, 2])) == current


def test_dry_run_says_what_a_sweep_would_do(smoke_local, tmp_path, capsys):
    """Before hours of training: which runs are cache hits, recorded, resumed or new."""
    import csv
    import shutil

    study = tmp_path / "study"
    shutil.copytree(smoke_local.study_dir, study)
    runs = sorted(p for p in (study / "runs").iterdir() if p.is_dir())
    (runs[0] / "outcome.json").unlink()  # started here, not finished: resumed
    shutil.rmtree(runs[1])  # not here, but an earlier sitting's table lists it as finished
    with open(smoke_local.study_dir / "outcomes.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    table = tmp_path / "earlier_outcomes.csv"
    with open(table, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(row for row in rows if Path(row["run_dir"]).name == runs[1].name)
    grown = preset("smoke", seeds=[0, 1, 2])
    plan = plan_sweep(grown, study, recorded=[table])
    assert {k: plan[k] for k in ("n_runs", "finished", "recorded", "resume", "new")} == \
        {"n_runs": 6, "finished": 2, "recorded": 1, "resume": 1, "new": 2}
    listing = sorted(str(p) for p in study.rglob("*"))
    assert main(["sweep", "--preset", "smoke", "--seeds", "3", "--out", str(study), "--recorded", str(table),
                 "--dry-run"]) == 0
    assert (f"study {study.resolve()} (exists): 2 finished there, 1 finished in recorded outcomes, 1 to resume, "
            "0 to extend from shorter runs, 2 to start") in capsys.readouterr().out
    assert sorted(str(p) for p in study.rglob("*")) == listing  # a dry run touches nothing
    # a directory the sweep would be refused in is refused by the dry run too
    with pytest.raises(UserError, match="settings that differ: epochs"):
        plan_sweep(preset("smoke", epochs=3), study)


def test_dry_run_says_where_each_run_stands(smoke_local, tmp_path, capsys):
    """A study spread over several invocations: the dry run names the sweep running on it and, per run
    with a directory, finished (generalized or not), running, or the epoch it resumes from,
    with its last evaluation read from metrics.jsonl; it touches nothing."""
    import shutil
    import socket

    from interp_toolkit.io import read_jsonl
    from interp_toolkit.runs.lock import LOCK_NAME
    from interp_toolkit.runs.resume import RESUME_NAME

    study = tmp_path / "study"
    shutil.copytree(smoke_local.study_dir, study)
    runs = sorted(p for p in (study / "runs").iterdir() if p.is_dir())
    stopped, running, done_early = runs[0], runs[1], runs[2]
    for run_dir, status in ((stopped, "running"), (running, "running"), (done_early, "finished")):
        (run_dir / "outcome.json").unlink()
        record = json.loads((run_dir / "run.json").read_text())
        record["status"] = status  # as run.json says while training, and once a seed is done
        if run_dir == done_early:
            record["stopped_early_at"] = 30  # done before the rest of its job; outcome comes at the job's end
        (run_dir / "run.json").write_text(json.dumps(record))
    shutil.copy(stopped / "final_state.safetensors", stopped / RESUME_NAME)  # the resume format
    live = f"pid={os.getpid()} host={socket.gethostname()}\n"
    held = []  # locked as a live writer holds them: the kernel's lock table names this process
    for folder in (running, done_early, study):
        (folder / LOCK_NAME).write_text(live)
        held.append(open(folder / LOCK_NAME, "a+"))  # noqa: SIM115 - held until the dry runs are read
        fcntl.flock(held[-1].fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(running / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 41, "train_acc": 0.5')  # a line being appended right now
    cfg = preset("smoke")
    listing = sorted(str(p) for p in study.rglob("*"))
    plan = plan_sweep(cfg, study)
    assert plan["in_use_by"] == f"process {os.getpid()} on {socket.gethostname()}"
    by_dir = {run["run_dir"].name: run for run in plan["runs"]}
    assert len(plan["runs"]) == cfg.n_runs() and set(by_dir) == {p.name for p in runs}
    last_logged = read_jsonl(stopped / "metrics.jsonl")[-1]
    assert by_dir[stopped.name]["resume_epoch"] == cfg.train.epochs and by_dir[stopped.name]["running"] is None
    assert by_dir[stopped.name]["epoch"] == last_logged["epoch"]
    assert by_dir[stopped.name]["val_acc"] == last_logged["val_acc"]
    assert by_dir[running.name]["running"] == plan["in_use_by"]
    assert by_dir[running.name]["epoch"] == read_jsonl(running / "metrics.jsonl")[-1]["epoch"] != 41
    assert by_dir[done_early.name]["trained"] and by_dir[done_early.name]["stopped_early_at"] == 30
    assert not by_dir[done_early.name]["finished"] and not by_dir[running.name]["trained"]
    outcomes = {p.name: json.loads((p / "outcome.json").read_text())["generalized"] for p in runs[3:]}
    assert outcomes  # at least one run finished as a whole
    assert {name: by_dir[name]["generalized"] for name in outcomes} == outcomes
    assert all(by_dir[name]["finished"] for name in outcomes) and not by_dir[stopped.name]["finished"]
    assert main(["sweep", "--preset", "smoke", "--out", str(study), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"a sweep is running on it now: process {os.getpid()}" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert f"stopped, resumes from epoch {cfg.train.epochs}" in lines[stopped.name]
    assert f"running (process {os.getpid()}" in lines[running.name]
    assert "stopped early at epoch 30, outcome written when its job ends (process" in lines[done_early.name]
    assert f"epoch {last_logged['epoch']}/{cfg.train.epochs}" in lines[stopped.name]
    assert f"{last_logged['val_acc']:.3f}" in lines[stopped.name]
    for name, generalized in outcomes.items():
        assert ("finished, generalized" if generalized else "finished, not generalized") in lines[name]
    for handle in held:
        handle.close()
    (running / LOCK_NAME).unlink()
    (done_early / LOCK_NAME).unlink()
    (study / LOCK_NAME).unlink()
    listing = [p for p in listing if not p.endswith(LOCK_NAME)]
    assert sorted(str(p) for p in study.rglob("*")) == listing  # a dry run touches nothing
    assert main(["sweep", "--preset", "smoke", "--out", str(study), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "running" not in out and "started, restarts from epoch 0" in out  # no resume state there


def test_ray_backend_gives_same_table(smoke_local, tmp_path):
    import ray
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        result = run_sweep(preset("smoke"), tmp_path / "ray", backend="ray", progress=False)
    finally:
        ray.shutdown()
    assert _summary(result.rows) == _summary(smoke_local.rows)
    assert (tmp_path / "ray" / "table.csv").read_text() == (smoke_local.study_dir / "table.csv").read_text()


def test_resume_after_kill_mid_way(smoke_local, tmp_path):
    # one cell of the smoke grid: its runs are the same computations as in smoke_local
    study = tmp_path / "killed"
    code = ("import sys; from interp_toolkit.cli import main; "
            f"sys.exit(main(['sweep', '--preset', 'smoke', '--ratios', '0.9', '--out', {str(study)!r}, "
            "'--workers', '1', '--quiet']))")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    killed_at = None
    try:
        while time.time() < deadline and proc.poll() is None:
            epochs = [read_jsonl(p)[-1]["epoch"] for p in study.glob("runs/*/metrics.jsonl") if read_jsonl(p)]
            if epochs and max(epochs) >= 20:
                os.killpg(proc.pid, signal.SIGKILL)
                killed_at = max(epochs)
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None and killed_at is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert killed_at is not None, "the sweep finished or stalled before it could be killed"
    statuses = [json.loads(p.read_text())["status"] for p in study.glob("runs/*/run.json")]
    assert "running" in statuses
    result = run_sweep(preset("smoke", ratios=[0.9]), study, workers=1, progress=False, report=False)
    resumed = [row for row in result.rows if row["resumed_from"] is not None]
    assert resumed and all(row["resumed_from"] >= 10 for row in resumed)
    assert {Path(row["run_dir"]).name for row in result.rows} == {
        Path(row["run_dir"]).name for row in smoke_local.rows if row["r"] == 0.9}
    assert _summary(result.rows) == _summary([row for row in smoke_local.rows if row["r"] == 0.9])
    for row in result.rows:
        assert not (Path(row["run_dir"]) / "resume.safetensors").exists()


def test_a_longer_sweep_extends_a_shorter_one_and_ends_as_from_scratch(smoke_local, tmp_path, capsys):
    short = run_sweep(preset("smoke", epochs=20), tmp_path / "short", workers=2, progress=False, report=False)
    assert all((Path(row["run_dir"]) / "final_state.safetensors").is_file() for row in short.rows)
    plan = plan_sweep(preset("smoke"), tmp_path / "long", extend_from=[tmp_path / "short"])
    assert (plan["extend"], plan["new"]) == (4, 0)
    assert main(["sweep", "--preset", "smoke", "--out", str(tmp_path / "long"), "--extend-from",
                 str(tmp_path / "short"), "--dry-run"]) == 0
    assert "0 to resume, 4 to extend from shorter runs, 0 to start" in capsys.readouterr().out

    long = run_sweep(preset("smoke"), tmp_path / "long", workers=2, progress=False, report=False,
                     extend_from=[tmp_path / "short"])
    assert [row["resumed_from"] for row in long.rows] == [20] * 4
    assert _summary(long.rows) == _summary(smoke_local.rows)  # the 40-epoch sweep trained from scratch
    by_name = {Path(row["run_dir"]).name: Path(row["run_dir"]) for row in smoke_local.rows}
    sources = {(row["r"], row["seed"]): row["run_dir"] for row in short.rows}
    for row in long.rows:
        run_dir = Path(row["run_dir"])
        assert (run_dir / "metrics.jsonl").read_text() == (by_name[run_dir.name] / "metrics.jsonl").read_text()
        record = json.loads((run_dir / "run.json").read_text())
        assert record["extended_from"]["run_dir"] == sources[(row["r"], row["seed"])]
        assert record["extended_from"]["epochs"] == 20
    # Only a shorter run of the same sweep is a source: a different learning rate is not.
    other = run_sweep(preset("smoke", epochs=20, lr=1e-3), tmp_path / "other", workers=2, progress=False, report=False)
    assert plan_sweep(preset("smoke"), tmp_path / "fresh", extend_from=[other.study_dir])["extend"] == 0
    assert main(["sweep", "--preset", "smoke", "--extend-from", str(tmp_path / "nowhere"), "--dry-run"]) == 2
    assert "--extend-from" in capsys.readouterr().err
    # The extension's own record carries --extend-from: its directory alone resumes it, and a
    # run not started there still continues its shorter run instead of starting at epoch 0.
    shutil.rmtree(long.rows[0]["run_dir"])
    capsys.readouterr()
    assert main(["sweep", "--out", str(tmp_path / "long"), "--dry-run"]) == 0
    assert "3 finished there, 0 finished in recorded outcomes, 0 to resume, 1 to extend from shorter runs, " \
        "0 to start" in capsys.readouterr().out
    # Moved since: the error says the path came from the study's record, and a flag overrides it.
    (tmp_path / "short").rename(tmp_path / "short_moved")
    assert main(["sweep", "--out", str(tmp_path / "long"), "--dry-run"]) == 2
    assert f"was run with --extend-from {(tmp_path / 'short').resolve()}, which is gone" in capsys.readouterr().err
    assert main(["sweep", "--out", str(tmp_path / "long"), "--extend-from", str(tmp_path / "short_moved"),
                 "--dry-run"]) == 0
    assert "1 to extend from shorter runs" in capsys.readouterr().out


def test_study_record_keeps_the_whole_grid_and_every_sitting(smoke_local, tmp_path, capsys):
    """A study run a few seeds at a time: study.json keeps the union of the invocations' grids
    and one entry per sitting, so `sweep --out DIR` alone resumes or inspects all of it."""
    import socket

    from interp_toolkit.cli.sweep import parse
    from interp_toolkit.studies.grid.study import study_sweep

    study = tmp_path / "study"
    shutil.copytree(smoke_local.study_dir, study)
    first = json.loads((study / "study.json").read_text())
    assert first["grid"]["seeds"] == [0, 1]  # (earlier tests reran this study: a sitting each)
    assert all(s["host"] == socket.gethostname() and s["extend_from"] == [] for s in first["invocations"])
    assert first["invocations"][0]["grid"] == first["grid"]

    run_sweep(preset("smoke", seeds=[2], seeds_per_process=1), study, workers=2, progress=False, report=False)
    record = json.loads((study / "study.json").read_text())
    assert record["config"]["seeds"] == [2]  # the latest sitting's settings ...
    assert record["grid"]["seeds"] == [0, 1, 2]  # ... and the study's whole grid
    assert [s["grid"]["seeds"] for s in record["invocations"]] == [[0, 1]] * len(first["invocations"]) + [[2]]
    assert record["invocations"][:-1] == first["invocations"]  # earlier invocations are kept as they were
    resumed = study_sweep(study)["config"]
    assert resumed.seeds == [0, 1, 2]
    assert resumed.key() == preset("smoke", seeds=[0, 1, 2], seeds_per_process=1).key()

    # Through the CLI: --out alone starts from the study; flags still override; a preset or
    # --config is the start when given, and a directory without a study keeps the smoke default.
    assert parse(["--out", str(study)]).sweep.seeds == [0, 1, 2]
    assert parse(["--out", str(study), "--seeds", "0", "7"]).sweep.seeds == [0, 7]
    assert parse(["--out", str(study), "--preset", "smoke"]).sweep.seeds == [0, 1]
    assert parse(["--out", str(tmp_path / "empty")]).sweep.key() == preset("smoke").key()
    capsys.readouterr()
    assert main(["sweep", "--out", str(study), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "2 cells x 3 seeds = 6 runs" in out and "6 finished there" in out and "0 to start" in out

    # A record written before grids were kept knows its last sitting's grid, and grows from it.
    old = tmp_path / "old"
    shutil.copytree(smoke_local.study_dir, old)
    atomic_write_json(old / "study.json", {"key": first["key"], "config": first["config"], "format": 1})
    assert study_sweep(old)["config"].seeds == [0, 1] and study_sweep(old)["extend_from"] == []
    run_sweep(preset("smoke", seeds=[2], seeds_per_process=1), old, workers=2, progress=False, report=False)
    assert json.loads((old / "study.json").read_text())["grid"]["seeds"] == [0, 1, 2]

    # A broken record is named, before any work.
    (old / "study.json").write_text("{not json")
    assert main(["sweep", "--out", str(old), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "study.json is unreadable" in err and "Traceback" not in err
    atomic_write_json(old / "study.json", {"key": "k"})
    with pytest.raises(UserError, match="holds no sweep config"):
        study_sweep(old)
    with pytest.raises(UserError, match="is not a study directory: it has no study.json"):
        study_sweep(tmp_path / "empty")


def test_cli_dry_run_and_validation(capsys):
    assert main(["sweep", "--preset", "quick", "--ratios", "0.1,0.5", "--seeds", "3", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4 cells x 3 seeds = 12 runs" in out
    assert main(["sweep", "--preset", "smoke", "--ratios", "0.5,1.5", "--dry-run"]) == 2
    assert "1.5" in capsys.readouterr().err


def test_a_lone_seed_count_that_is_a_listed_seed_is_refused_before_any_work(tmp_path, capsys):
    """``--seeds 480`` against a config listing seeds 480-483 would plan seeds 0..479; it is
    refused with the spelling that runs seed 480 alone. A count inside the listed seeds, or with
    no config or study to list any, is still a count."""
    from interp_toolkit.cli.sweep import parse

    config = tmp_path / "sweep.yaml"
    config.write_text("seeds: [480, 481, 482, 483]\nepochs: 5\nworkers: 1\n")
    with pytest.raises(UserError, match=r"--seeds 480 is a count: it plans seeds 0..479 .*--seeds 480,"):
        parse(["--config", str(config), "--seeds", "480"])
    assert parse(["--config", str(config), "--seeds", "480,"]).sweep.seeds == [480]
    assert parse(["--config", str(config), "--seeds", "480", "481"]).sweep.seeds == [480, 481]
    assert parse(["--config", str(config), "--seeds", "3"]).sweep.seeds == [0, 1, 2]  # 3 is not a listed seed
    config.write_text("seeds: [0, 1, 2, 3]\nepochs: 5\nworkers: 1\n")
    assert parse(["--config", str(config), "--seeds", "2"]).sweep.seeds == [0, 1]  # every counted seed is listed
    assert parse(["--preset", "smoke", "--seeds", "3"]).sweep.seeds == [0, 1, 2]
    config.write_text("seeds: [480, 481, 482, 483]\nepochs: 5\nworkers: 1\n")
    assert main(["sweep", "--config", str(config), "--seeds", "480", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--seeds 480 is a count" in err and "Traceback" not in err
    assert err.startswith("error: ") and err.count("error:") == 1 and len(err.strip().splitlines()) == 1


def test_cli_report(smoke_local, capsys):
    assert main(["report", str(smoke_local.study_dir)]) == 0
    out = capsys.readouterr().out
    assert "headline plot" in out and "max_parity_sum_parity" in out


def test_cli_wires_into_main_parser(capsys):
    assert main(["sweep", "--preset", "smoke", "--dry-run"]) == 0
    assert "runs" in capsys.readouterr().out


def test_plan_jobs_chunks_seeds_and_names_are_distinct(tmp_path):
    cfg = preset("smoke", seeds=5, seeds_per_process=2)
    jobs = plan_jobs(cfg, tmp_path)
    n_cells = len(cfg.cells())
    assert [len(job["runs"]) for job in jobs] == [2] * n_cells + [2] * n_cells + [1] * n_cells
    dirs = [run["run_dir"] for job in jobs for run in job["runs"]]
    assert len(set(dirs)) == len(dirs) == cfg.n_runs()
    # every cell's first seeds come first: a study stopped part-way has balanced cells
    assert n_cells > 1 and [job["cell"] for job in jobs[:n_cells]] == cfg.cells()
    assert {tuple(run["seed"] for run in job["runs"]) for job in jobs[:n_cells]} == {(0, 1)}


def test_sweep_flags_are_generated_from_sweep_config(tmp_path):
    from interp_toolkit.cli.sweep import parse

    parsed = parse(["--preset", "smoke", "--threshold", "0.95", "--betas", "0.9", "0.99", "--ratios", "0.3", "0.7"])
    assert parsed.sweep.threshold == 0.95 and tuple(parsed.sweep.train.betas) == (0.9, 0.99)  # never hand-written flags
    assert parsed.sweep.ratios == [0.3, 0.7]
    assert parsed.sweep.train.epochs == preset("smoke").train.epochs  # the preset's value where no flag is given
    config = tmp_path / "sweep.yaml"
    config.write_text("ratios: [0.3]\nepochs: 5\nworkers: 1\n")
    parsed = parse(["--config", str(config), "--epochs", "6"])
    assert parsed.sweep.ratios == [0.3] and parsed.sweep.train.epochs == 6 and parsed.workers == 1
    assert parsed.sweep.task.n_train == SweepConfig().task.n_train  # no preset when a file is given
    # one device option: SweepConfig.device, spelled --device
    assert parse(["--device", "cpu"]).sweep.device == "cpu"
    assert parse([]).sweep.device == SweepConfig().device == "auto"
    from interp_toolkit.cli.sweep import SweepCommandConfig

    assert "device" not in {f.name for f in dataclasses.fields(SweepCommandConfig)}


class _CountingCallback:
    def __init__(self):
        self.evaluations: dict[str, int] = {}

    def on_evaluation(self, run_dir, metrics):
        self.evaluations[str(run_dir)] = self.evaluations.get(str(run_dir), 0) + 1


def test_sweep_callbacks_and_progress_per_evaluation(tmp_path, monkeypatch):
    import interp_toolkit.studies.sweep.run as sweep_module

    bars = []

    class RecordingBar:
        def __init__(self, total=None, initial=0, **kwargs):
            self.total, self.n, self.updates = total, initial, []
            bars.append(self)

        def update(self, k):
            self.updates.append(k)
            self.n += k

        def set_postfix_str(self, text):
            self.postfix = text

        def close(self):
            pass

    monkeypatch.setattr(sweep_module, "progress_bar", RecordingBar)
    counter = _CountingCallback()
    cfg = preset("smoke", ratios=[0.9], epochs=20)
    result = run_sweep(cfg, tmp_path / "study", workers=1, report=False, callbacks=[counter])
    (bar,) = bars
    assert bar.n == bar.total  # every evaluation of every run counted once
    assert bar.postfix == f"runs {cfg.n_runs()}/{cfg.n_runs()}"
    assert len(bar.updates) > cfg.n_runs()  # moves per evaluation, not once per cell
    for row in result.rows:
        logged = read_jsonl(Path(row["run_dir"]) / "metrics.jsonl")
        assert counter.evaluations[row["run_dir"]] == len(logged)


def test_sweep_tensorboard_events_in_every_run_dir(smoke_local):
    # The smoke sweep ran with a TensorBoardLogger in two worker processes (pickled copies).
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for row in smoke_local.rows:
        events = EventAccumulator(row["run_dir"])
        events.Reload()
        steps = [s.step for s in events.Scalars("accuracy/adv")]
        assert steps == [m["epoch"] for m in read_jsonl(Path(row["run_dir"]) / "metrics.jsonl")]


def test_recorded_outcomes_are_not_trained_again(smoke_local, tmp_path, capsys):
    """A study spread over several invocations: runs listed as finished in an earlier outcomes.csv are
    taken from it, the others trained, and the study's report holds both."""
    import csv

    from interp_toolkit.studies.grid.outcome_table import read_outcomes_csv
    from interp_toolkit.studies.grid.study import RECORDED_OUTCOMES

    with open(smoke_local.study_dir / "outcomes.csv", newline="") as handle:
        reader = csv.DictReader(handle)
        header, rows = reader.fieldnames, list(reader)
    r_first = min(float(row["r"]) for row in rows)
    earlier = [row for row in rows if float(row["r"]) == r_first]  # one cell of two
    assert len(earlier) == 2
    earlier_csv = tmp_path / "earlier" / "outcomes.csv"
    earlier_csv.parent.mkdir()
    with open(earlier_csv, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=header)
        writer.writeheader()
        writer.writerows(earlier)

    study = tmp_path / "second_sitting"
    result = run_sweep(preset("smoke"), study, workers=2, progress=False, recorded=[earlier_csv])
    assert result.n_recorded == 2
    assert len(result.rows) == 2 and {row["r"] for row in result.rows} == {0.9}  # only the other cell trained
    assert len(list((study / "runs").iterdir())) == 2
    assert len(read_outcomes_csv(study / RECORDED_OUTCOMES)) == 2
    pooled = read_outcomes_csv(study / "outcomes.csv")  # the study's report: both invocations
    assert sorted((row["r"], row["seed"]) for row in pooled) == sorted(
        (row["r"], row["seed"]) for row in smoke_local.rows)
    assert _summary(sorted(pooled, key=lambda r: (r["r"], r["seed"]))) == _summary(smoke_local.rows)

    # everything recorded: nothing is trained, through the CLI too
    assert main(["sweep", "--preset", "smoke", "--out", str(tmp_path / "third"), "--quiet",
                 "--recorded", str(smoke_local.study_dir / "outcomes.csv")]) == 0
    assert "4 taken from recorded outcomes" in capsys.readouterr().out
    assert not (tmp_path / "third" / "runs").exists() or not any((tmp_path / "third" / "runs").iterdir())


def test_cli_grows_a_study_and_refuses_other_settings(smoke_local, tmp_path, capsys):
    """Through the entry point: more seeds run in the study's directory (exit 0, finished runs
    reused); other shared settings exit 2 with one error line naming them, the record untouched."""
    import shutil

    study = tmp_path / "study"
    shutil.copytree(smoke_local.study_dir, study)
    assert main(["sweep", "--preset", "smoke", "--seeds", "0", "1", "2", "--out", str(study), "--quiet",
                 "--workers", "2"]) == 0
    assert len(list((study / "runs").iterdir())) == 6
    record = (study / "study.json").read_text()
    capsys.readouterr()
    assert main(["sweep", "--preset", "smoke", "--epochs", "20", "--out", str(study), "--quiet"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "settings that differ: epochs" in lines[0]
    assert "Traceback" not in err
    assert (study / "study.json").read_text() == record
    assert len(list((study / "runs").iterdir())) == 6


def test_bad_recorded_outcomes_are_refused_before_any_work(tmp_path, capsys):
    assert main(["sweep", "--preset", "smoke", "--out", str(tmp_path / "s"), "--recorded",
                 str(tmp_path / "missing.csv")]) == 2
    err = capsys.readouterr().err
    assert "missing.csv" in err and "outcomes.csv" in err
    not_outcomes = tmp_path / "other.csv"
    not_outcomes.write_text("a,b\n1,2\n")
    assert main(["sweep", "--preset", "smoke", "--out", str(tmp_path / "s"), "--recorded", str(not_outcomes)]) == 2
    assert "other.csv lacks the columns" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()




def test_planning_hands_each_job_the_typed_config_with_its_own_seeds(tmp_path, monkeypatch):
    # a copy of every seed per job made planning quadratic in the seed count (20,000 seeds: minutes)
    cfg = preset("smoke", seeds=list(range(40)), seeds_per_process=4)
    calls = []
    original = SweepConfig.to_dict
    monkeypatch.setattr(SweepConfig, "to_dict", lambda self: calls.append(1) or original(self))
    jobs = plan_jobs(cfg, tmp_path / "study")
    assert calls == [] and len(jobs) == 20  # no dict round trip
    for job in jobs:
        assert type(job["sweep"]) is SweepConfig and set(job) == {"sweep", "cell", "runs"}
        assert job["sweep"].seeds == [run["seed"] for run in job["runs"]] and len(job["runs"]) == 4
        assert {f.name: getattr(job["sweep"], f.name) for f in dataclasses.fields(cfg) if f.name != "seeds"} == \
            {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "seeds"}
    assert cfg.seeds == list(range(40))  # the caller's config is left alone
    assert pickle.loads(pickle.dumps(jobs[0]))["sweep"].seeds == jobs[0]["sweep"].seeds


def test_a_dataset_per_seed_is_a_seed_of_the_cell_not_a_cell_per_dataset(tmp_path):
    """data_seeds 'model': every run's data seed is its model seed, so the report pools the
    seeds into one cell (data_seed 'seed'), in the rows, the table and outcomes.csv."""
    from interp_toolkit.studies.grid.cells import TIED_DATA_SEED, find_cell
    from interp_toolkit.studies.grid.outcome_table import read_outcomes_csv
    from interp_toolkit.studies.grid.study import collect_runs
    from interp_toolkit.studies.report.tables import rate_table

    cfg = dataclasses.replace(preset("smoke"), ratios=[0.9], n_layers=[1], seeds=[0, 1], data_seeds="model")
    result = run_sweep(cfg, tmp_path / "tied", workers=1, progress=False)
    rows = collect_runs(result.study_dir)
    assert [row["data_seed"] for row in rows] == [TIED_DATA_SEED] * 2
    records = [json.loads((Path(row["run_dir"]) / "run.json").read_text()) for row in rows]
    assert [r["run_info"]["task"]["seed"] for r in records] == [0, 1]  # the datasets do differ
    table = rate_table(rows)
    assert len(table) == 1 and table[0]["n_seeds"] == 2
    again = read_outcomes_csv(tmp_path / "tied" / "outcomes.csv")
    assert [row["data_seed"] for row in again] == [TIED_DATA_SEED] * 2
    assert len(rate_table(again)) == 1
    assert find_cell(rate_table(again), "data_seed=seed,r=0.9")["n_seeds"] == 2
    # a fixed-data study keeps its number, even for the run whose model seed equals it
    fixed = run_sweep(dataclasses.replace(cfg, data_seeds="fixed"), tmp_path / "fixed", workers=1, progress=False,
                      report=False)
    assert [row["data_seed"] for row in collect_runs(fixed.study_dir)] == [0, 0]
