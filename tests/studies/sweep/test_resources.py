"""Job sizing and expected cost: the documented rules, the presets' stated figures, dry-run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from interp_toolkit.cli import main
from interp_toolkit.errors import UserError
from interp_toolkit.studies.grid.config import preset
from interp_toolkit.studies.sweep import resources
from interp_toolkit.studies.sweep.resources import (
    HEADLINE_SLICE,
    cost_table,
    cpu_seed_epoch_seconds,
    jobs_per_gpu,
    seeds_per_job,
    step_flop,
    sweep_cost,
)
from interp_toolkit.studies.sweep.run import plan_jobs

DOCS = Path(__file__).resolve().parents[3] / "docs" / "sweeps.md"


def test_cpu_cost_is_the_measured_seconds_at_the_reference_shape_and_scales_with_flops():
    ref = resources.CPU_REFERENCE
    cfg = preset("reproduce")  # its shape is the reference's
    assert (cfg.task.n_train, cfg.task.seq_len, cfg.model.d_model, cfg.model.d_mlp) == (
        ref["n_train"], ref["seq_len"], ref["d_model"], ref["d_mlp"])
    one, two = (next(c for c in cfg.cells() if c["n_layers"] == n) for n in (1, 2))
    assert cpu_seed_epoch_seconds(cfg, one) == pytest.approx(0.2)
    assert cpu_seed_epoch_seconds(cfg, two) == pytest.approx(1.3)
    double = preset("reproduce", n_train=2 * ref["n_train"])
    assert cpu_seed_epoch_seconds(double, two) == pytest.approx(2.6)
    assert step_flop(double, two) == pytest.approx(2 * step_flop(cfg, two))


def test_no_cpu_job_holds_a_cell_of_30_paper_seeds_and_a_gpu_job_holds_them_all(tmp_path):
    slice_cfg = preset("paper", **HEADLINE_SLICE)
    # 2L: 15,000 epochs x ~1.6 s = ~6.6 h per seed > CPU_JOB_HOURS: one seed per CPU job
    assert seeds_per_job(slice_cfg) == 1 and seeds_per_job(slice_cfg, on_gpu=True) == 30
    assert max(len(job["runs"]) for job in plan_jobs(slice_cfg, tmp_path)) == 1
    one_layer = preset("paper", **{**HEADLINE_SLICE, "n_layers": [1]})
    seed_hours = 15_000 * max(cpu_seed_epoch_seconds(one_layer, c) for c in one_layer.cells()) / 3600
    assert seeds_per_job(one_layer) == min(4, math.floor(resources.CPU_JOB_HOURS / seed_hours)) == 4
    assert seeds_per_job(preset("paper", **HEADLINE_SLICE, seeds_per_process=7)) == 7  # set: kept
    assert seeds_per_job(preset("smoke")) == 2  # never more than the sweep has


def test_jobs_per_gpu_fill_a_step_of_about_a_teraflop():
    slice_cfg = preset("paper", **HEADLINE_SLICE)
    assert jobs_per_gpu(slice_cfg, 30) == 1  # 2L x 30 seeds: ~1.5 TFLOP per step already
    one_layer = preset("paper", **{**HEADLINE_SLICE, "n_layers": [1]})
    step = 30 * step_flop(one_layer, one_layer.cells()[0])
    assert jobs_per_gpu(one_layer, 30) == math.ceil(resources.GPU_SATURATING_STEP_FLOP / step) > 1
    assert jobs_per_gpu(preset("smoke"), 2) == resources.GPU_MAX_JOBS_PER_DEVICE
    assert jobs_per_gpu(one_layer, 30, override=2) == 2
    with pytest.raises(UserError, match="jobs_per_gpu must be a positive integer or None, got 0"):
        jobs_per_gpu(one_layer, 30, override=0)


def test_the_cost_adds_up_over_cells_and_seeds():
    cfg = preset("paper", **HEADLINE_SLICE)
    cost = sweep_cost(cfg)
    per_cell = [cpu_seed_epoch_seconds(cfg, cell) * 30 * 15_000 / 3600 for cell in cfg.cells()]
    assert cost.core_hours == pytest.approx(sum(per_cell)) and cost.jobs == 120 and cost.gpu_jobs == 4
    flops = sum(step_flop(cfg, cell) for cell in cfg.cells()) * 30 * 15_000
    assert cost.gpu_hours == pytest.approx(flops / resources.GPU_EFFECTIVE_FLOP_PER_S / 3600)


def test_every_preset_states_its_jobs_and_job_time_in_the_docs():
    text = DOCS.read_text()
    for row in cost_table():
        assert row in text, f"docs/sweeps.md lacks (or has another) row: {row}"


def test_dry_run_prints_the_expected_cost(tmp_path, capsys):
    assert main(["sweep", "--preset", "paper", "--tasks", "max_parity_sum_parity", "--ratios", "0.5", "0.9",
                 "--n-heads", "2", "--weight-decays", "0.1", "--out", str(tmp_path / "s"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "120 runs" in out and "on CPUs: 120 jobs of up to 1 seeds" in out
    assert "core-hours in all" in out and "on GPUs: 4 jobs of up to 30 seeds, 1 per GPU" in out
    assert "GPU-hours in all" in out
    assert not (tmp_path / "s").exists()  # a dry run touches nothing


def test_ray_device_is_not_resolved_on_the_driver(tmp_path, monkeypatch):
    """``--backend ray --device cuda`` from a machine without CUDA reaches run_sweep (the
    workers resolve it); the local backend refuses it before any work."""
    import interp_toolkit.studies.sweep.run as sweep_module
    from interp_toolkit.cli.sweep import parse, run_config

    seen = {}

    class Stop(Exception):
        pass

    def fake_run_sweep(cfg, out, **kwargs):
        seen.update(device=cfg.device, **kwargs)
        raise Stop

    monkeypatch.setattr(sweep_module, "run_sweep", fake_run_sweep)
    with pytest.raises(Stop):
        run_config(parse(["--preset", "smoke", "--backend", "ray", "--device", "cuda", "--jobs-per-gpu", "4",
                          "--retries", "1", "--out", str(tmp_path / "s")]))
    assert (seen["device"], seen["backend"], seen["jobs_per_gpu"], seen["retries"]) == ("cuda", "ray", 4, 1)
    import torch

    if not torch.cuda.is_available():
        assert main(["sweep", "--preset", "smoke", "--device", "cuda", "--out", str(tmp_path / "l")]) == 2
        assert not (tmp_path / "l").exists()
