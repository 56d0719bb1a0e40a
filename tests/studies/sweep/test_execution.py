"""Where a sweep's jobs run: GPU slots per local worker, the device resolved on the worker,
job sizing, failures collected while the other jobs finish, the shared-storage check."""

from __future__ import annotations

import json
import os
import queue
from pathlib import Path

import pytest
import torch

from interp_toolkit.cli import main
from interp_toolkit.errors import UserError
from interp_toolkit.studies.grid.config import preset
from interp_toolkit.studies.sweep import execution
from interp_toolkit.studies.sweep.execution import deal_gpu_slots, local_gpu_slots, take_gpu_slot
from interp_toolkit.studies.sweep.ray_backend import verify_sentinels
from interp_toolkit.studies.sweep.run import plan_jobs, run_sweep
from tests.helpers import KillWorkerOnce


def test_gpu_slots_deal_the_gpus_in_turn_and_cuda_n_pins_one(monkeypatch):
    assert deal_gpu_slots(["0", "1"], 2) == ["0", "1", "0", "1"]
    with pytest.raises(UserError, match="jobs_per_gpu >= 1"):
        deal_gpu_slots(["0"], 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert local_gpu_slots("cuda", 2) == ["0", "1", "2", "0", "1", "2"]
    assert local_gpu_slots("auto", 1) == ["0", "1", "2"]
    assert local_gpu_slots("cuda:2", 3) == ["2", "2", "2"]
    # the driver's own CUDA_VISIBLE_DEVICES names the physical GPUs; cuda:N is the N-th of them
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6,7")
    assert local_gpu_slots("cuda:1", 1) == ["6"]
    assert local_gpu_slots("cuda", 1) == ["4", "6", "7"]
    assert local_gpu_slots("cpu", 4) is None


def test_a_worker_takes_one_slot_and_sees_that_gpu_as_cuda(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # restored after the test
    slots: queue.Queue[str] = queue.Queue()
    slots.put("5")
    assert take_gpu_slot(slots, timeout=0.01) == "5" and os.environ["CUDA_VISIBLE_DEVICES"] == "5"
    assert take_gpu_slot(slots, timeout=0.01) is None and os.environ["CUDA_VISIBLE_DEVICES"] == "5"
    assert take_gpu_slot(None) is None


class FailOnRatio:
    """A callback that fails every run of one ratio (its job fails as a whole)."""

    def __init__(self, ratio: float) -> None:
        self.ratio = ratio

    def on_evaluation(self, run_dir, metrics):
        if f"_r{self.ratio:g}_" in Path(run_dir).name and metrics["epoch"] >= 10:
            raise RuntimeError(f"injected failure in {Path(run_dir).name}")


def test_local_workers_get_one_gpu_slot_each_and_a_failing_job_fails_alone(tmp_path, monkeypatch):
    """Two workers over GPU slots 7 and 9 (a driver with CUDA is stood in for; the workers
    have none, so ``auto`` resolves to the CPU there): each worker keeps one slot, every job
    resolves its device on its worker, and one failing job leaves the others to finish."""
    monkeypatch.setattr(execution, "local_gpu_slots", lambda device, jobs_per_gpu: ["7", "9"])
    cfg = preset("smoke", seeds_per_process=1, epochs=20)
    result = run_sweep(cfg, tmp_path / "study", workers=2, progress=False, report=False,
                       callbacks=[FailOnRatio(0.9)])
    assert len(result.placements) == len(plan_jobs(cfg, tmp_path)) == 4
    slot_of_pid = {}
    for where in result.placements:
        assert where["cuda_visible_devices"] in ("7", "9") and where["device"] == "cpu"
        assert slot_of_pid.setdefault(where["pid"], where["cuda_visible_devices"]) == where["cuda_visible_devices"]
        assert where["pid"] != os.getpid()
    if len(slot_of_pid) == 2:  # both workers took a job: they hold different slots
        assert sorted(slot_of_pid.values()) == ["7", "9"]
    assert {row["r"] for row in result.failed} == {0.9} and len(result.failed) == 2
    assert all("injected failure" in row["error"] and Path(row["run_dir"]).is_dir() for row in result.failed)
    assert {row["r"] for row in result.rows} == {0.5} and len(result.rows) == 2


def test_a_failing_job_in_process_fails_alone_too(tmp_path):
    cfg = preset("smoke", seeds_per_process=1, epochs=20, ratios=[0.9, 0.5])
    result = run_sweep(cfg, tmp_path / "study", workers=1, progress=False, report=False,
                       callbacks=[FailOnRatio(0.9)])
    assert [row["r"] for row in result.failed] == [0.9, 0.9] and len(result.rows) == 2
    assert all(row["run_dir"] in row["error"] or "injected" in row["error"] for row in result.failed)


def test_shared_storage_check_names_out_and_the_node_that_does_not_share_it(tmp_path):
    check_dir = tmp_path / "study" / ".shared-storage-check" / "abc"
    check_dir.mkdir(parents=True)
    (check_dir / "node-a").write_text("abc")
    nodes = {"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"}
    verify_sentinels(tmp_path / "study", check_dir, "abc", {"a": "10.0.0.1"}, {"a": ""})
    with pytest.raises(UserError, match=r"--out .*study is not on storage shared") as err:
        verify_sentinels(tmp_path / "study", check_dir, "abc", nodes, {"a": "", "b": "", "c": "cannot read X"})
    text = str(err.value)
    assert "10.0.0.2 wrote" in text and "node 10.0.0.3: cannot read X" in text and "10.0.0.1" not in text


def test_ray_backend_without_ray_is_a_user_error(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(UserError, match=r"pip install 'interp-toolkit\[ray\]'"):
        run_sweep(preset("smoke"), tmp_path / "study", backend="ray", progress=False)


def _files(run_dir: Path) -> dict[str, bytes]:
    paths = [run_dir / "metrics.jsonl", *sorted((run_dir / "checkpoints").glob("*"))]
    return {p.name: p.read_bytes() for p in paths}


@pytest.mark.slow  # two sweeps through spawned pools: ~1-2.5 minutes on a loaded 2-core machine
def test_a_killed_local_worker_is_retried_in_a_fresh_pool_and_ends_byte_identical(tmp_path):
    cfg = preset("smoke", device="cpu", seeds_per_process=1, ratios=[0.9])
    reference = run_sweep(cfg, tmp_path / "reference", workers=1, progress=False, report=False)
    marker = tmp_path / "killed"
    result = run_sweep(cfg, tmp_path / "study", workers=2, progress=False, report=False,
                       callbacks=[KillWorkerOnce(marker, "_s0_")])
    assert marker.exists() and not result.failed and len(result.rows) == 2  # killed, and no run lost
    (killed,) = [row for row in result.rows if row["seed"] == 0]
    assert killed["resumed_from"] == 20
    by_name = {Path(row["run_dir"]).name: Path(row["run_dir"]) for row in reference.rows}
    for row in result.rows:
        assert _files(Path(row["run_dir"])) == _files(by_name[Path(row["run_dir"]).name])


def test_a_job_whose_worker_always_dies_fails_alone_and_its_neighbour_finishes(tmp_path, capsys):
    from tests.helpers import KillWorkerAlways

    # with no retries, only the job whose worker died while it ran alone is reported failed,
    # with its run directory; the job that ran beside it when the pool broke finishes
    cfg = preset("smoke", device="cpu", seeds_per_process=1, ratios=[0.9])
    result = run_sweep(cfg, tmp_path / "no_retry", workers=2, progress=False, report=False,
                       callbacks=[KillWorkerAlways("_s0_")], retries=0)
    assert [row["seed"] for row in result.failed] == [0]
    assert all("BrokenProcessPool" in row["error"] and Path(row["run_dir"]).is_dir() for row in result.failed)
    (neighbour,) = [row for row in result.rows if row["seed"] == 1]
    assert not neighbour.get("error") and neighbour["final_epoch"] == cfg.train.epochs
    # the report calls the failed run failed, not training
    failed_dir = Path(result.failed[0]["run_dir"])
    assert json.loads((failed_dir / "failure.json").read_text())["error"] == result.failed[0]["error"]
    capsys.readouterr()
    assert main(["report", str(tmp_path / "no_retry")]) == 0
    out = capsys.readouterr().out
    assert "(1 runs failed (their sweep job raised or its worker died" in out and "still training" not in out
    outcomes = (tmp_path / "no_retry" / "outcomes.csv").read_text().splitlines()
    assert sum(",failed," in line for line in outcomes) == 1


class _DeadQueue:
    """A progress queue whose actor is gone (as Ray's is once killed): every call raises."""

    def put(self, item):
        raise RuntimeError("The actor died unexpectedly before finishing this task")

    def get_nowait(self):
        raise RuntimeError("The actor died unexpectedly before finishing this task")


def test_a_dead_progress_queue_stops_neither_training_nor_the_sweep(tmp_path, capsys):
    import queue as queue_module

    from interp_toolkit.studies.sweep.execution import SweepProgress

    class Bar:
        updates = 0

        def update(self, n):
            Bar.updates += n

        def set_postfix_str(self, text):
            pass

    # on a worker: a run reports to a dead queue and trains on
    cfg = preset("smoke", ratios=[0.9], seeds=[0])
    job = plan_jobs(cfg, tmp_path / "study")[0]
    rows = execution.run_job(job, 1, [], _DeadQueue())
    assert len(rows) == 1 and not rows[0].get("error") and rows[0]["final_epoch"] == cfg.train.epochs
    # on the driver: the bar gives the queue up with one note and still moves as jobs end
    jobs = [{"evaluations_per_run": 4, "runs": [{"run_dir": "a"}]}]
    tracker = SweepProgress(Bar(), jobs, n_runs=1, n_cached=0)
    tracker.drain(_DeadQueue())
    tracker.drain(_DeadQueue())
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "progress queue failed (RuntimeError); training goes on" in notes[0]
    tracker.job_done(jobs[0])
    assert Bar.updates == 4 and tracker.runs_done == 1
    empty = queue_module.Queue()
    SweepProgress(Bar(), jobs, n_runs=1, n_cached=0).drain(empty)  # an empty queue is no failure
    assert capsys.readouterr().err == ""


def test_jobs_rerun_alone_after_a_worker_death_take_different_gpu_slots(tmp_path, monkeypatch):
    # both jobs broke in the shared pool; rerun side by side in pools of their own, each pool
    # takes its own GPU slot (not every one the first)
    monkeypatch.setattr(execution, "local_gpu_slots", lambda device, jobs_per_gpu: ["7", "9"])
    cfg = preset("smoke", seeds_per_process=1, epochs=30, ratios=[0.9])
    marker = tmp_path / "killed"
    result = run_sweep(cfg, tmp_path / "study", workers=2, progress=False, report=False,
                       callbacks=[KillWorkerOnce(marker, "_s0_")])
    assert marker.exists() and not result.failed and len(result.rows) == 2
    assert sorted(where["cuda_visible_devices"] for where in result.placements) == ["7", "9"]
