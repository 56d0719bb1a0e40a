"""Nothing lost, nothing run that should not be: run-directory locks, foreign files kept,
pickle-free resume state, checkpoints that belong to their run, Ctrl-C and killed sweeps.

Where a user meets the behaviour at the command line, the test goes through
``python -m interp_toolkit.cli`` in a subprocess (signals, PIDs, a second process);
otherwise through :func:`interp_toolkit.cli.main` in-process (the same code, seconds cheaper).
"""

from __future__ import annotations

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

from interp_toolkit.checkpoint import load_checkpoint
from interp_toolkit.cli import main
from interp_toolkit.errors import UserError
from interp_toolkit.io import read_jsonl
from interp_toolkit.runs.lock import DirectoryLock, DirectoryLockedError
from interp_toolkit.runs.resume import RESUME_NAME, ResumeStateError, load_resume_state

CLI = [sys.executable, "-m", "interp_toolkit.cli"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
TINY = ["--seq-len", "4", "--n-values", "6", "--n-train", "256", "--n-eval", "64", "--d-model", "16",
        "--d-mlp", "32", "--quiet"]
# ``interp_toolkit.cli.main`` in a fresh process, called once the parent writes a line
WARM_MAIN = ("import sys; from interp_toolkit.cli import build_parser, main; import interp_toolkit.runs.trainer, "
             "interp_toolkit.tasks.mpsp; build_parser(); print('ready', flush=True); sys.stdin.readline(); "
             "sys.exit(main(sys.argv[1:]))")
# long enough (seconds even on the fast engine) to act on a run while it trains
LONG = ["train", *TINY, "--epochs", "2000", "--eval-every", "50", "--checkpoint-every", "500"]


def _wait_for_metrics(run: Path, proc: subprocess.Popen, lines: int, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    metrics = run / "metrics.jsonl"
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= lines:
            return
        time.sleep(0.05)
    raise AssertionError(f"run {run} did not reach {lines} evaluations while running (exit {proc.poll()})")


def _contents(folder: Path) -> dict[str, bytes]:
    """Every file's bytes by relative path (the lock file aside: it only names a PID)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".lock"}


def _same_files(a: Path, b: Path) -> None:
    assert (a / "metrics.jsonl").read_text() == (b / "metrics.jsonl").read_text()
    names = sorted(p.name for p in (a / "checkpoints").glob("*.safetensors"))
    assert names == sorted(p.name for p in (b / "checkpoints").glob("*.safetensors"))
    model_a, _ = load_checkpoint(a / "checkpoints" / names[-1])
    model_b, _ = load_checkpoint(b / "checkpoints" / names[-1])
    for key, value in model_a.state_dict().items():
        assert torch.equal(value, model_b.state_dict()[key]), key


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The LONG run trained alone, without interruption (in-process, one thread)."""
    run = tmp_path_factory.mktemp("reference") / "run"
    assert main([*LONG, "--run-dir", str(run)]) == 0
    return run


# ----------------------------------------------------------------------------- locks


@pytest.mark.slow  # subprocesses: ~20-100 s on 2 loaded cores
def test_lock_refuses_second_holder_names_pid_and_is_released(tmp_path):
    held = DirectoryLock(tmp_path / "d", "run directory").acquire()
    # another process is refused at once, naming this process
    code = ("import sys; from interp_toolkit.runs.lock import DirectoryLock, DirectoryLockedError\n"
            "try:\n    DirectoryLock(sys.argv[1], 'run directory').acquire()\n"
            "except DirectoryLockedError as err:\n    print(err); sys.exit(3)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "d")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 3 and f"process {os.getpid()}" in out.stdout
    with DirectoryLock(tmp_path / "d"):  # re-entrant within this process
        pass
    held.release()
    # a holder killed with SIGKILL leaves no stale lock
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from interp_toolkit.runs.lock import "
                               "DirectoryLock; DirectoryLock(sys.argv[1]).acquire(); print('held', flush=True); "
                               "time.sleep(60)", str(tmp_path / "e")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(DirectoryLockedError, match=f"process {holder.pid}"):
        DirectoryLock(tmp_path / "e").acquire()
    holder.kill()
    holder.wait()
    with DirectoryLock(tmp_path / "e"):
        pass


def test_lock_holder_names_a_live_holder_only_and_never_takes_the_lock(tmp_path):
    """``lock_holder`` reads who writes to a directory: this process while it holds the lock,
    nobody after release or when the file names a dead process, and a holder on another host
    as written (it cannot be checked from here)."""
    import socket

    from interp_toolkit.runs.lock import LOCK_NAME, lock_holder

    folder = tmp_path / "d"
    assert lock_holder(folder) is None  # no directory
    with DirectoryLock(folder, "run directory"):
        assert lock_holder(folder) == f"process {os.getpid()} on {socket.gethostname()}"
        assert lock_holder(folder) == f"process {os.getpid()} on {socket.gethostname()}"  # still held by us
        import fcntl

        with open(folder / LOCK_NAME, "a+") as handle, pytest.raises(BlockingIOError):
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # still held exclusively
    assert lock_holder(folder) is None and not (folder / LOCK_NAME).exists()
    folder.mkdir(exist_ok=True)  # the lock removed the directory it created
    finished = subprocess.Popen(["true"])
    finished.wait()  # a killed holder's file is left behind naming a dead process
    (folder / LOCK_NAME).write_text(f"pid={finished.pid} host={socket.gethostname()}\n")
    assert lock_holder(folder) is None
    (folder / LOCK_NAME).write_text("pid=12345 host=elsewhere.example\n")
    assert lock_holder(folder) == "process 12345 on elsewhere.example, another host"
    (folder / LOCK_NAME).write_text("garbage\n")
    assert lock_holder(folder) is None


@pytest.mark.slow  # subprocesses: ~20-100 s on 2 loaded cores
def test_concurrent_train_on_one_directory_is_refused_and_first_matches_lone_run(reference, tmp_path):
    run = tmp_path / "run"
    first = subprocess.Popen([*CLI, *LONG, "--run-dir", str(run)], env=ENV, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        # the second command's interpreter is started (imports paid) before the first gets far,
        # then released: a cold start here takes longer than the whole first run
        second_proc = subprocess.Popen([sys.executable, "-c", WARM_MAIN, *LONG, "--run-dir", str(run)], env=ENV,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert second_proc.stdout.readline().strip() == "ready"
        _wait_for_metrics(run, first, 2)
        assert first.poll() is None
        started = time.time()
        out, err = second_proc.communicate("go\n", timeout=120)
        second = subprocess.CompletedProcess(second_proc.args, second_proc.returncode, out, err)
        assert second.returncode == 2, second.stderr
        errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and f"in use by process {first.pid}" in errors[0], second.stderr
        assert "Traceback" not in second.stderr
        assert first.poll() is None or time.time() - started < 60  # refused at once, not after waiting
    finally:
        assert first.wait(timeout=300) == 0, first.stderr.read()
    _same_files(run, reference)
    epochs = [m["epoch"] for m in read_jsonl(run / "metrics.jsonl")]
    assert epochs == sorted(set(epochs))  # no epoch logged twice


# ----------------------------------------------------------------------------- Ctrl-C


# subprocesses: ~20-100 s on 2 loaded cores; SIGTERM (what schedulers send) by default, SIGINT in -m slow
@pytest.mark.parametrize("signum, status, line", [
    pytest.param(signal.SIGINT, 130, "interrupted; rerun the same command to resume from epoch ",
                 marks=pytest.mark.slow),
    (signal.SIGTERM, 143, "terminated (SIGTERM); rerun the same command to resume from epoch "),
], ids=["SIGINT", "SIGTERM"])
def test_interrupt_exits_with_one_line_and_resumes_identically(reference, tmp_path, signum, status, line):
    run = tmp_path / "run"
    proc = subprocess.Popen([*CLI, *LONG, "--run-dir", str(run)], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _wait_for_metrics(run, proc, 8)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(line), err
    epoch = int(lines[0].rsplit(" ", 1)[1])
    assert 0 < epoch < 200
    assert load_resume_state(run / RESUME_NAME)["epoch"] == epoch
    assert json.loads((run / "run.json").read_text())["status"] == "running"
    assert main([*LONG, "--run-dir", str(run)]) == 0  # the same command again (in-process: cheaper)
    _same_files(run, reference)
    assert json.loads((run / "run.json").read_text())["status"] == "finished"


# ----------------------------------------------------------------------------- pickle


class _Payload:
    """Unpickling this creates a marker file: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def _running_copy(reference: Path, target: Path) -> Path:
    """A copy of a run made to look interrupted (status running, no resume state)."""
    shutil.copytree(reference, target)
    record = json.loads((target / "run.json").read_text())
    record["status"] = "running"
    (target / "run.json").write_text(json.dumps(record))
    return target


def test_a_planted_pickle_is_never_unpickled(reference, tmp_path):
    marker = tmp_path / "PWNED"
    payload = pickle.dumps({"epoch": 5, "x": _Payload(marker)})
    pickle.loads(payload)  # the payload works: unpickling it runs code ...
    assert marker.exists()
    marker.unlink()

    # ... planted beside the run's files under the old pickle resume name: never read
    run = _running_copy(reference, tmp_path / "run")
    (run / "resume.pt").write_bytes(payload)
    done = subprocess.run([*CLI, *LONG, "--run-dir", str(run)], env=ENV, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    assert (run / "resume.pt").read_bytes() == payload  # left alone, not deleted

    # the same bytes planted as the resume file the toolkit does read: a clear error, no code
    run = _running_copy(reference, tmp_path / "run2")
    (run / RESUME_NAME).write_bytes(payload)
    with pytest.raises(ResumeStateError, match="truncated or corrupted"):
        load_resume_state(run / RESUME_NAME)
    assert main([*LONG, "--run-dir", str(run)]) == 2
    assert not marker.exists()


def test_truncated_resume_file_is_a_clear_error_naming_it(reference, tmp_path, capsys):
    run = tmp_path / "run"
    _running_copy(reference, run)
    # a real resume state of this run, then cut in half
    record = json.loads((run / "run.json").read_text())
    from interp_toolkit.runs.resume import save_resume_state

    save_resume_state(
        run / RESUME_NAME, 100, record["key"], {"w": torch.zeros(3)}, {}, torch.zeros(5, dtype=torch.uint8)
    )
    raw = (run / RESUME_NAME).read_bytes()
    (run / RESUME_NAME).write_bytes(raw[: len(raw) // 2])
    assert main([*LONG, "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert str(run / RESUME_NAME) in err and "truncated or corrupted" in err and "Traceback" not in err


# ----------------------------------------------------------------------------- foreign files


def test_copied_run_without_run_json_keeps_its_files(reference, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(reference, copy)
    (copy / "run.json").unlink()
    stamps = {p.name: p.stat().st_mtime_ns for p in (copy / "checkpoints").iterdir()}
    metrics = (copy / "metrics.jsonl").read_text()
    assert main([*LONG, "--run-dir", str(copy)]) == 0
    assert "already finished" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in (copy / "checkpoints").iterdir()} == stamps
    assert (copy / "metrics.jsonl").read_text() == metrics
    assert json.loads((copy / "run.json").read_text())["status"] == "finished"  # record rebuilt


def test_directory_of_another_run_is_never_cleared_and_overwrite_moves_it_aside(reference, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(reference, other)
    (other / "run.json").unlink()  # nothing but the checkpoints tells whose files these are
    before = _contents(other)
    different = [*LONG, "--lr", "0.002", "--run-dir", str(other)]
    assert main(different) == 2
    err = capsys.readouterr().err
    assert "holds a different run's files" in err and "--overwrite" in err and str(other) in err
    assert _contents(other) == before

    # metrics without anything telling whose they are: kept too
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "metrics.jsonl").write_text('{"epoch": 0}\n')
    assert main([*LONG, "--run-dir", str(loose)]) == 2
    assert "metrics.jsonl" in capsys.readouterr().err
    assert (loose / "metrics.jsonl").read_text() == '{"epoch": 0}\n'

    # --overwrite moves the old files aside (nothing deleted) and trains afresh
    quick = ["train", *TINY, "--epochs", "3", "--lr", "0.002", "--run-dir", str(other), "--overwrite"]
    assert main(quick) == 0
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("other.old-")]
    assert len(aside) == 1
    assert _contents(aside[0]) == before
    assert json.loads((other / "run.json").read_text())["train_config"]["epochs"] == 3


def test_finished_run_without_checkpoints_is_a_clear_error(reference, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    shutil.rmtree(run / "checkpoints")
    assert main([*LONG, "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert "recorded finished" in err and str(run / "checkpoints") in err


# ----------------------------------------------------------------------------- consistency


def test_checkpoint_of_another_run_is_refused_by_analyze(reference, tmp_path, capsys):
    mod3 = tmp_path / "mod3"
    assert main(["train", *TINY, "--task", "first_mod3_sum_mod3", "--epochs", "2", "--run-dir", str(mod3)]) == 0
    parity = tmp_path / "parity"
    shutil.copytree(reference, parity)
    last = sorted((parity / "checkpoints").glob("*.safetensors"))[-1]
    shutil.copy(sorted((mod3 / "checkpoints").glob("*.safetensors"))[-1], last)
    capsys.readouterr()
    for analysis in ("fingerprints", "ablation"):
        assert main(["analyze", str(parity), "--analysis", analysis, "--last", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert str(last) in err and "belongs to run" in err
    assert not (parity / "analyses").exists()


def test_fingerprints_refuse_data_without_a_readout_token():
    from interp_toolkit.analyses.fingerprints import fingerprints
    from interp_toolkit.model import ModelConfig, build_model
    from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits

    task = MPSPConfig(seq_len=4, n_values=6, n_train=64, n_eval=32)
    model = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=16, **task.model_dims()))
    splits = make_splits(task)
    assert fingerprints(model, splits, n=16).rows  # with the readout token: fine
    values_only = type(splits["train"])(splits["train"].values, splits["train"].values, splits["train"].labels,
                                        splits["train"].shortcut, splits["train"].agrees, splits["train"].r)
    with pytest.raises(UserError, match="no readout token"):
        fingerprints(model, {"train": values_only}, n=16)


def test_train_refuses_token_ids_outside_the_vocabulary_before_any_file(tmp_path):
    from interp_toolkit import TrainConfig, build_model, train
    from interp_toolkit.errors import UserError
    from interp_toolkit.model import ModelConfig
    from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits

    splits = make_splits(MPSPConfig(seq_len=4, n_values=9, n_train=64, n_eval=32))
    small = MPSPConfig(seq_len=4, n_values=6)
    model = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=16, **small.model_dims()))
    with pytest.raises(UserError, match="token id 9"):
        train(model, splits, TrainConfig(epochs=1, progress=False), tmp_path / "run")
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- sweeps


def _smoke_overrides():
    return dict(ratios=[0.9], seeds=[0, 1], seeds_per_process=1, n_train=64, n_eval=32, epochs=10,
                eval_every=5, checkpoint_every=5)


def test_truncated_resume_file_in_a_sweep_fails_that_run_only(tmp_path):
    from interp_toolkit.studies.grid.config import preset
    from interp_toolkit.studies.sweep.run import run_sweep

    cfg = preset("smoke", **_smoke_overrides())
    study = tmp_path / "study"
    first = run_sweep(cfg, study, workers=1, progress=False, report=False)
    broken, kept = (Path(row["run_dir"]) for row in first.rows)
    for run in (broken, kept):
        (run / "outcome.json").unlink()
    record = json.loads((broken / "run.json").read_text())
    record["status"] = "running"
    (broken / "run.json").write_text(json.dumps(record))
    (broken / RESUME_NAME).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"__meta")  # truncated
    again = run_sweep(cfg, study, workers=1, progress=False, report=False)
    assert [Path(row["run_dir"]) for row in again.rows] == [kept]
    assert (kept / "outcome.json").exists()
    assert len(again.failed) == 1 and str(broken / RESUME_NAME) in again.failed[0]["error"]
    assert not (broken / "outcome.json").exists()


def _session_workers(session: int) -> list[int]:
    """Live (not zombie) sweep worker processes of a session."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, sid = fields[0], int(fields[3])
        if sid == session and state != "Z" and "spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.slow  # subprocesses: ~20-100 s on 2 loaded cores
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; PR_SET_PDEATHSIG is Linux-only")
def test_killed_sweep_parent_leaves_no_worker_alive(tmp_path):
    study = tmp_path / "study"
    args = ["sweep", "--preset", "smoke", "--ratios", "0.5,0.9", "--seeds", "1", "--epochs", "3000",
            "--eval-every", "5", "--workers", "2", "--quiet", "--out", str(study)]
    parent = subprocess.Popen([*CLI, *args], env=ENV, start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and parent.poll() is None:
            if len(list(study.glob("runs/*/metrics.jsonl"))) >= 2 and len(_session_workers(parent.pid)) == 2:
                break
            time.sleep(0.1)
        workers = _session_workers(parent.pid)
        assert parent.poll() is None and len(workers) == 2, "the workers never started"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.time() + 30
        while time.time() < deadline and _session_workers(parent.pid):
            time.sleep(0.1)
        assert _session_workers(parent.pid) == [], "a sweep worker outlived its parent"
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
        for pid in _session_workers(parent.pid):
            os.kill(pid, signal.SIGKILL)
    # the study directory's lock died with the parent: a rerun may take it
    with DirectoryLock(study):
        pass


def test_batched_copy_without_run_json_keeps_its_files_and_foreign_is_refused(tmp_path):
    from interp_toolkit import TrainConfig
    from interp_toolkit.model import ModelConfig
    from interp_toolkit.runs.batched import train_batched
    from interp_toolkit.runs.resume import ForeignRunDirectoryError
    from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits

    task = MPSPConfig(seq_len=4, n_values=6, n_train=64, n_eval=32)
    splits = make_splits(task)
    cfgs = [ModelConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=16, seed=s, **task.model_dims()) for s in (0, 1)]
    train_cfg = TrainConfig(epochs=4, eval_every=2, progress=False)
    dirs = [tmp_path / "a", tmp_path / "b"]
    first = train_batched(cfgs, splits, train_cfg, dirs)
    (dirs[0] / "run.json").unlink()
    stamps = {p: p.stat().st_mtime_ns for p in (dirs[0] / "checkpoints").iterdir()}
    again = train_batched(cfgs, splits, train_cfg, dirs)
    assert again.already_finished == [True, True]
    assert again.finals == first.finals
    assert {p: p.stat().st_mtime_ns for p in (dirs[0] / "checkpoints").iterdir()} == stamps
    # seed 1's directory given to seed 0: refused, its files kept
    before = _contents(dirs[1])
    with pytest.raises(ForeignRunDirectoryError, match="holds a different run's files"):
        train_batched(cfgs[:1], splits, train_cfg, [dirs[1]])
    assert _contents(dirs[1]) == before


@pytest.mark.slow  # subprocesses: ~20-100 s on 2 loaded cores
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ulimit -f through bash")
def test_file_size_limit_is_one_error_line_naming_the_file(tmp_path):
    run = tmp_path / "run"
    command = " ".join([f"ulimit -f 8; exec {sys.executable} -m interp_toolkit.cli", *LONG, "--run-dir", str(run)])
    done = subprocess.run(["bash", "-c", command], env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "File too large" in errors[0] and str(run) in errors[0], done.stderr
    assert "Traceback" not in done.stderr
    assert not list(run.rglob("*.tmp"))  # atomic writes left no partial file
