"""A sweep killed with ``kill -9`` at any point of its runs finishes, when rerun, with the
same metrics, checkpoints and outcomes as a sweep never interrupted: before the first
evaluation, right after it (one metrics line, a resume state at epoch 0), mid-run and at the
end of a run (its record finished, its outcome not yet written)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from interp_toolkit.runs.layout import list_checkpoints
from interp_toolkit.studies.grid.config import preset
from interp_toolkit.studies.sweep.run import run_sweep

REPO = Path(__file__).resolve().parents[3]
# outcome fields that record the run's history, not its result
HISTORY = {"resumed_from"}


def _grid():
    return preset("smoke", ratios=[0.9])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return run_sweep(_grid(), tmp_path_factory.mktemp("kill") / "whole", workers=2, progress=False)


def _killed_sweep(study: Path, stage: str) -> None:
    """Run the sweep in a process group of its own, killed by SIGKILL at ``stage``."""
    code = ("import sys; from tests.helpers import KillProcessGroupAt; "
            "from interp_toolkit.studies.sweep.run import run_sweep; "
            "from interp_toolkit.studies.grid.config import preset; "
            f"run_sweep(preset('smoke', ratios=[0.9]), {str(study)!r}, workers=2, progress=False, "
            f"callbacks=[KillProcessGroupAt({stage!r})])")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, start_new_session=True, timeout=300,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]


def _run_dirs(study: Path) -> dict[str, Path]:
    return {p.name: p for p in (study / "runs").iterdir() if (p / "run.json").is_file()}


@pytest.mark.parametrize("stage", ["before_first_evaluation", "first_evaluation", "mid_run", "run_end"])
def test_sweep_killed_at_any_point_finishes_as_uninterrupted(uninterrupted, tmp_path, stage):
    study = tmp_path / "killed"
    _killed_sweep(study, "first_evaluation" if stage == "before_first_evaluation" else stage)
    runs = _run_dirs(study)
    assert runs, "the sweep was killed before any run started"
    statuses = {json.loads((p / "run.json").read_text())["status"] for p in runs.values()}
    if stage == "before_first_evaluation":
        # what a kill before the first evaluation leaves: the record of a run started, nothing else
        for run_dir in runs.values():
            for name in ("metrics.jsonl", "resume.safetensors"):
                (run_dir / name).unlink(missing_ok=True)
            for _, path in list_checkpoints(run_dir):
                path.unlink()
    if stage == "first_evaluation":
        assert statuses == {"running"}
        assert all(len((p / "metrics.jsonl").read_text().splitlines()) == 1 for p in runs.values())
    if stage == "run_end":
        assert "finished" in statuses and not any((p / "outcome.json").exists() for p in runs.values())

    rerun = run_sweep(_grid(), study, workers=2, progress=False)
    assert not any(row.get("error") for row in rerun.rows), [row.get("error") for row in rerun.rows]
    assert all(json.loads((p / "run.json").read_text())["status"] == "finished" for p in _run_dirs(study).values())
    whole = _run_dirs(uninterrupted.study_dir)
    assert sorted(_run_dirs(study)) == sorted(whole)
    for name, reference in whole.items():
        run_dir = study / "runs" / name
        assert (run_dir / "metrics.jsonl").read_bytes() == (reference / "metrics.jsonl").read_bytes(), name
        ours, theirs = list_checkpoints(run_dir), list_checkpoints(reference)
        assert [e for e, _ in ours] == [e for e, _ in theirs], name
        for (epoch, a), (_, b) in zip(ours, theirs):
            ta, tb = load_file(a), load_file(b)
            assert sorted(ta) == sorted(tb) and all(torch.equal(ta[k], tb[k]) for k in ta), (name, epoch)
        outcome = json.loads((run_dir / "outcome.json").read_text())
        expected = json.loads((reference / "outcome.json").read_text())
        assert {k: v for k, v in outcome.items() if k not in HISTORY} == \
            {k: v for k, v in expected.items() if k not in HISTORY}, name
        assert not (run_dir / "resume.safetensors").exists()
    assert (study / "table.csv").read_text() == (uninterrupted.study_dir / "table.csv").read_text()


def test_sigterm_to_the_sweep_driver_saves_states_says_so_and_resumes(uninterrupted, tmp_path):
    import os
    import signal
    import time

    from interp_toolkit.io import read_jsonl

    study = tmp_path / "terminated"
    code = ("import sys; from interp_toolkit.cli import main; "
            f"sys.exit(main(['sweep', '--preset', 'smoke', '--ratios', '0.9', '--out', {str(study)!r}, "
            "'--workers', '2', '--quiet']))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline, sent = time.time() + 120, False
    try:
        while time.time() < deadline and proc.poll() is None:
            epochs = [rows[-1]["epoch"] for rows in map(read_jsonl, study.glob("runs/*/metrics.jsonl")) if rows]
            if epochs and max(epochs) >= 10:
                proc.send_signal(signal.SIGTERM)  # the driver alone, as a scheduler sends it
                sent = True
                break
            time.sleep(0.02)
        err = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert sent, "the sweep finished before it could be terminated"
    assert proc.returncode == 143, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("terminated (SIGTERM); rerun the same command to resume"), err
    run_sweep(_grid(), study, workers=2, progress=False)
    for name, reference in _run_dirs(uninterrupted.study_dir).items():
        assert (study / "runs" / name / "metrics.jsonl").read_bytes() == (reference / "metrics.jsonl").read_bytes()
    assert (study / "table.csv").read_text() == (uninterrupted.study_dir / "table.csv").read_text()
