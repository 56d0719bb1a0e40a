import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_example_quick_runs_end_to_end(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "lm_bif_testbed.py"), "--quick", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=900,
        env={"OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "bif" / "per_class.png").stat().st_size > 1000
    assert "Induction score" in (tmp_path / "note.txt").read_text()
