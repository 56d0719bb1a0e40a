"""examples/reproduction/gpu_literal_protocol.py: its logic on the CPU at tiny shapes (--dry),
its outcomes table readable by the report, resumable, and sized before any training."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "reproduction" / "gpu_literal_protocol.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


def test_dry_run_writes_an_outcomes_table_the_report_reads(tmp_path):
    from interp_toolkit.studies.grid.outcome_table import read_outcomes_csv

    done = _run("--dry", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = read_outcomes_csv(tmp_path / "out" / "outcomes.csv")
    assert sorted((r["r"], r["seed"]) for r in rows) == [(0.5, 300), (0.5, 301), (0.9, 300), (0.9, 301)]
    assert all(r["data_seed"] == 300 and r["n_layers"] == 2 and r["status"] == "finished" for r in rows)
    with open(tmp_path / "out" / "outcomes.csv", newline="") as handle:
        assert all(not row["run_dir"].startswith("/") for row in csv.DictReader(handle))  # relative to the study
    again = _run("--dry", "--out", str(tmp_path / "out"))  # a rerun trains nothing and writes the same table
    assert again.returncode == 0
    assert read_outcomes_csv(tmp_path / "out" / "outcomes.csv") == rows


def test_the_slice_is_sized_before_any_training(tmp_path):
    missing = _run("--out", str(tmp_path / "a"))
    assert missing.returncode == 2 and "--rate" in missing.stderr and not (tmp_path / "a").exists()
    slow = _run("--rate", "100", "--out", str(tmp_path / "b"))
    assert slow.returncode == 2 and "2400 s" in slow.stderr and "--budget-s" in slow.stderr
    assert not (tmp_path / "b").exists()
