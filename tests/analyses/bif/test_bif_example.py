"""Smoke test of examples/bif_hierarchical.py (slow: ~1 minute on 2 cores)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_bif_hierarchical_example_quick(tmp_path):
    subprocess.run([sys.executable, "-W", "ignore", str(ROOT / "examples" / "bif_hierarchical.py"), "--quick",
                    "--out", str(tmp_path)], check=True, timeout=600)
    assert (tmp_path / "bif_hierarchical.png").stat().st_size > 10_000
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["mode_half_times"][0] < summary["mode_half_times"][1] < min(summary["mode_half_times"][4:])
    assert set(summary["causal_windows"]) == {"window_end", "horizon"}
    assert summary["items"][:4] == ["dog", "cat", "sparrow", "robin"]
    branch = summary["hidden_branch_steps"]
    assert int(branch["0"]) < int(branch["1"]) < int(branch["2"]) < int(branch["3"])
    # Solution-based phases: some checkpoints have draws on both sides of a mode's half
    # strength, and every between share there comes with its null.
    assert summary["phase_transitions"]
    assert all("null_share" in t and "share" in t for t in summary["phase_transitions"])
    assert all(-1 <= row["retrain_pearson"] <= 1 for row in summary["leave_one_out"])
