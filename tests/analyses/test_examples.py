"""Smoke test of examples/shortcut_mechanism.py at a tiny size, run as a user runs it."""

from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "shortcut_mechanism.py"


@pytest.mark.slow  # ~40 s on the shared 2-core machine (trains, then the mechanism on 3 checkpoints twice)
def test_shortcut_mechanism_example_tiny(tmp_path):
    """examples/shortcut_mechanism.py run as a user runs it, at a tiny size; a rerun hits every cache."""
    import os
    import subprocess
    import sys

    args = [sys.executable, str(EXAMPLE), "--run-dir", str(tmp_path / "run"), "--n-train", "128", "--n-eval", "64",
            "--epochs", "2", "--checkpoint-every", "2", "--grad-n", "64", "--fingerprint-n", "64"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    path = Path(out.split("figure: ", 1)[1].split(" (table:", 1)[0])
    assert path.read_bytes()[:4] == b"\x89PNG" and path.with_suffix(".csv").is_file()  # the figure's data beside it
    assert "gradient conflict cos" in out and "L1H1: QK rho" in out and "phases: shortcut learned" in out
    # a rerun hits every cache: 5 analyses x checkpoints 0, 1, 2
    again = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert again.returncode == 0 and "(0 computed, 15 cached)" in again.stdout, again.stderr
