"""Smoke test of examples/shortcut_mechanism.py at a tiny size."""

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "shortcut_mechanism.py"


@pytest.mark.slow  # ~40 s on the shared 2-core machine (trains, then the mechanism on 3 checkpoints twice)
def test_shortcut_mechanism_example_tiny(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("shortcut_mechanism", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = ["--run-dir", str(tmp_path / "run"), "--n-train", "128", "--n-eval", "64", "--epochs", "2",
            "--checkpoint-every", "2", "--grad-n", "64", "--fingerprint-n", "64"]
    path = module.main(args)
    assert path.is_file() and path.read_bytes()[:4] == b"\x89PNG"
    assert path.with_suffix(".csv").is_file()  # the figure's data beside it
    out = capsys.readouterr().out
    assert "gradient conflict cos" in out and "L1H1: QK rho" in out and "phases: shortcut learned" in out
    # a rerun hits every cache: 5 analyses x checkpoints 0, 1, 2
    module.main(args)
    assert "(0 computed, 15 cached)" in capsys.readouterr().out
