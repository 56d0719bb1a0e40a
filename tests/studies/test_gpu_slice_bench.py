"""benchmarks/gpu_slice.py: its estimate, its dry mode on the CPU, its refusal without CUDA."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_slice.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("gpu_slice", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_slice_estimate_uses_the_rate_at_a_jobs_seeds_and_the_best_rate(bench):
    rates = {(1, 16): 1_000.0, (1, 32): 2_000.0, (1, 64): 3_000.0, (2, 32): 500.0, (2, 64): 400.0}
    estimate = bench.slice_estimate(rates, job_seeds=30, cells=2, epochs=15_000)
    seed_epochs = 2 * 30 * 15_000
    assert estimate["one_job_at_a_time"] == pytest.approx(seed_epochs / 2_000 + seed_epochs / 500)
    assert estimate["best_rate"] == pytest.approx(seed_epochs / 3_000 + seed_epochs / 500)
    # no K >= 30 measured: the largest one
    assert bench.slice_estimate({(1, 8): 100.0}, job_seeds=30)["one_job_at_a_time"] == pytest.approx(
        2 * 30 * 15_000 / 100)
    with pytest.raises(ValueError, match="at least one measured rate"):
        bench.slice_estimate({})


def test_dry_mode_runs_the_measurement_on_the_cpu(bench, capsys):
    assert bench.main(["--dry", "--layers", "1", "--ks", "1", "2"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("1 ")]
    assert [int(row[1]) for row in rows] == [1, 2] and all(float(row[3]) > 0 for row in rows)
    assert "headline slice" in out and "--dry: not the slice's" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where CUDA is missing")
def test_without_cuda_it_exits_2_saying_so(bench, capsys):
    assert bench.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
