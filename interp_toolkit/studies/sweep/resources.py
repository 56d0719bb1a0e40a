"""How a sweep's work is cut into jobs and what it costs: seeds per job, GPU shares, and the
expected core-hours / GPU-hours of a grid.

The rules (documented in docs/sweeps.md, "Job sizing"):

- **Cost of one seed-epoch.** On one CPU core: the seconds measured at a reference shape
  (:data:`CPU_SECONDS_PER_SEED_EPOCH`, one torch thread, full batch, the fast engine), scaled
  by the FLOPs of one full-batch step (:func:`interp_toolkit.runs.cost.step_flops`) of the
  run's shape over the reference's, separately for 1-layer and deeper models (their measured
  speeds differ by more than their FLOPs). On a GPU: the step's FLOPs at
  :data:`GPU_EFFECTIVE_FLOP_PER_S`, an assumption until ``benchmarks/gpu_slice.py`` measures it.
- **Seeds per job on CPUs** (``seeds_per_process`` unset): as many seeds as train in
  :data:`CPU_JOB_HOURS` hours on one core (the slowest cell decides), at least 1, at most
  :data:`CPU_MAX_SEEDS_PER_JOB` (stacking seeds on a CPU saves nothing: it only sets the
  job's length). So no job holds a cell's 30 seeds of 15,000 epochs on one core.
- **Seeds per job on GPUs**: every seed of a cell, up to :data:`GPU_MAX_SEEDS_PER_JOB`; the
  engine splits each step into passes that fit the GPU's memory.
- **Jobs per GPU** (the share a job asks for, ``1 / jobs_per_gpu``): enough jobs that one
  step of all of them reaches :data:`GPU_SATURATING_STEP_FLOP` (a smaller step leaves a large
  GPU idle between kernels), at most :data:`GPU_MAX_JOBS_PER_DEVICE`.

Importable without torch (the FLOP count imports it lazily).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from interp_toolkit.errors import UserError

#: Seconds per seed-epoch on one CPU core (one torch thread, full batch, fast engine), by
#: layer count (deeper models use the 2-layer figure), measured at :data:`CPU_REFERENCE`:
#: the ``reproduce`` preset's shape, 2L ~1.2-1.3 s and 1L ~0.2 s per seed-epoch on these
#: machines' AMD EPYC cores (docs/reproduction.md, calibration study).
CPU_SECONDS_PER_SEED_EPOCH = {1: 0.2, 2: 1.3}
#: The shape those seconds were measured at.
CPU_REFERENCE = {"n_train": 16_384, "seq_len": 8, "n_values": 10, "d_model": 64, "d_mlp": 128, "n_heads": 2}
#: Target length of one CPU job, in hours of one core.
CPU_JOB_HOURS = 4.0
#: Most seeds one CPU job stacks.
CPU_MAX_SEEDS_PER_JOB = 4
#: Most seeds one GPU job stacks.
GPU_MAX_SEEDS_PER_JOB = 256
#: Assumed sustained FLOP/s of one GPU on these small models (an assumption, not a
#: measurement; ``benchmarks/gpu_slice.py`` measures it). About 15% of an H100/H200's fp32 peak.
GPU_EFFECTIVE_FLOP_PER_S = 10e12
#: FLOPs per optimizer step (all jobs on a GPU together) below which a GPU idles between kernels.
GPU_SATURATING_STEP_FLOP = 1e12
#: Most jobs sharing one GPU.
GPU_MAX_JOBS_PER_DEVICE = 8


def _check_positive_int(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise UserError(f"{name} must be a positive integer or None, got {value!r}")


def step_flop(cfg: Any, cell: Mapping[str, Any]) -> float:
    """FLOPs of one full-batch (or one epoch of minibatches) step of one seed of ``cell``."""
    from interp_toolkit.runs.cost import step_flops
    from interp_toolkit.studies.grid.config import cell_configs

    task_cfg, model_cfg, _train_cfg, _info = cell_configs(cfg, cell, cfg.seeds[0])
    return float(step_flops(model_cfg, task_cfg.n_train, task_cfg.n_ctx))


def _reference_flop(n_layers: int) -> float:
    from interp_toolkit.model import ModelConfig
    from interp_toolkit.runs.cost import step_flops
    from interp_toolkit.tasks.mpsp import MPSPConfig

    ref = CPU_REFERENCE
    task = MPSPConfig(seq_len=ref["seq_len"], n_values=ref["n_values"], n_train=ref["n_train"], n_eval=64)
    model = ModelConfig(n_layers=n_layers, n_heads=ref["n_heads"], d_model=ref["d_model"], d_mlp=ref["d_mlp"],
                        **task.model_dims())
    return float(step_flops(model, task.n_train, task.n_ctx))


def cpu_seed_epoch_seconds(cfg: Any, cell: Mapping[str, Any]) -> float:
    """Expected seconds of one seed-epoch of ``cell`` on one CPU core."""
    layers = min(int(cell["n_layers"]), 2)
    return CPU_SECONDS_PER_SEED_EPOCH[layers] * step_flop(cfg, cell) / _reference_flop(layers)


def gpu_seed_epoch_seconds(cfg: Any, cell: Mapping[str, Any],
                           flop_per_s: float = GPU_EFFECTIVE_FLOP_PER_S) -> float:
    """Expected GPU-seconds of one seed-epoch of ``cell`` at ``flop_per_s``."""
    return step_flop(cfg, cell) / flop_per_s


def seeds_per_job(cfg: Any, on_gpu: bool = False) -> int:
    """Seeds one job trains together: ``cfg.seeds_per_process`` if set, else the rule of the
    module docstring (CPU: ~:data:`CPU_JOB_HOURS` of one core, 1 to
    :data:`CPU_MAX_SEEDS_PER_JOB`; GPU: every seed of a cell, up to
    :data:`GPU_MAX_SEEDS_PER_JOB`). Never more than the sweep has, and 1 with
    ``data_seeds="model"``: the seeds of a job train on one dataset."""
    n_seeds = len(cfg.seeds)
    if getattr(cfg, "data_seeds", "fixed") == "model":
        return 1  # stacked seeds share one dataset: a dataset per seed means a job per seed
    if cfg.seeds_per_process is not None:
        return min(cfg.seeds_per_process, n_seeds)
    if on_gpu:
        return min(n_seeds, GPU_MAX_SEEDS_PER_JOB)
    seed_hours = max(cpu_seed_epoch_seconds(cfg, cell) for cell in cfg.cells()) * cfg.train["epochs"] / 3600
    fit = math.floor(CPU_JOB_HOURS / seed_hours) if seed_hours > 0 else CPU_MAX_SEEDS_PER_JOB
    return max(1, min(n_seeds, CPU_MAX_SEEDS_PER_JOB, fit))


def jobs_per_gpu(cfg: Any, seeds: int, override: int | None = None) -> int:
    """Jobs sharing one GPU (each asks for ``1 / jobs_per_gpu`` of it): ``override`` if given,
    else enough that one step of them all reaches :data:`GPU_SATURATING_STEP_FLOP` (the
    largest cell decides), 1 to :data:`GPU_MAX_JOBS_PER_DEVICE`."""
    _check_positive_int("jobs_per_gpu", override)
    if override is not None:
        return override
    job_step = seeds * max(step_flop(cfg, cell) for cell in cfg.cells())
    return max(1, min(GPU_MAX_JOBS_PER_DEVICE, math.ceil(GPU_SATURATING_STEP_FLOP / job_step)))


@dataclass
class SweepCost:
    """What a sweep's remaining work is expected to cost.

    Attributes:
        jobs: Jobs of the sweep (every run, finished or not).
        seeds_per_job: Seeds one job stacks (CPU rule; GPU jobs: ``gpu_seeds_per_job``).
        core_hours: Expected core-hours of every run on CPUs (no early stop assumed).
        job_hours: Expected hours of the longest CPU job on one core.
        gpu_seeds_per_job: Seeds one GPU job stacks.
        gpu_jobs: Jobs of the sweep on GPUs.
        jobs_per_gpu: GPU jobs sharing one GPU.
        gpu_hours: Expected GPU-hours of every run (at :data:`GPU_EFFECTIVE_FLOP_PER_S`).
        gpu_job_hours: Expected hours of the longest GPU job on its share of a GPU.
    """

    jobs: int
    seeds_per_job: int
    core_hours: float
    job_hours: float
    gpu_seeds_per_job: int
    gpu_jobs: int
    jobs_per_gpu: int
    gpu_hours: float
    gpu_job_hours: float

    def lines(self) -> list[str]:
        """Readable lines for ``sweep --dry-run``."""
        return [
            f"on CPUs: {self.jobs:,} jobs of up to {self.seeds_per_job} seeds, ~{duration_text(self.job_hours)} per "
            f"job on one core; ~{hours_text(self.core_hours)} core-hours in all (measured per-epoch cost, no early "
            "stop)",
            f"on GPUs: {self.gpu_jobs:,} jobs of up to {self.gpu_seeds_per_job} seeds, {self.jobs_per_gpu} per GPU, "
            f"~{duration_text(self.gpu_job_hours)} per job; ~{hours_text(self.gpu_hours)} GPU-hours in all (FLOP "
            f"count at an assumed {GPU_EFFECTIVE_FLOP_PER_S / 1e12:g} TFLOP/s; measure with benchmarks/gpu_slice.py)",
        ]


#: The headline slice: the paper's task, r in {0.5, 0.9}, 1L and 2L, wd 0.1, 30 seeds and 15,000
#: epochs, with 2 heads (this project's choice: the paper names 1 and 2) and the ``paper``
#: preset's settings otherwise.
HEADLINE_SLICE = {"tasks": ["max_parity_sum_parity"], "ratios": [0.5, 0.9], "n_heads": [2], "weight_decays": [0.1]}


def cost_table_row(name: str, cfg: Any) -> str:
    """One row of docs/sweeps.md's table of presets: runs, CPU jobs and hours per job,
    core-hours, GPU jobs, jobs per GPU and GPU-hours (a test keeps the docs equal to this)."""
    cost = sweep_cost(cfg)
    return (f"| {name} | {cfg.n_runs():,} | {cost.jobs:,} x {cost.seeds_per_job} | {duration_text(cost.job_hours)} | "
            f"{hours_text(cost.core_hours)} | {cost.gpu_jobs:,} x {cost.gpu_seeds_per_job} | {cost.jobs_per_gpu} | "
            f"{hours_text(cost.gpu_hours)} |")


def duration_text(hours: float) -> str:
    """``"40 s"``, ``"4.4 min"``, ``"6.6 h"``."""
    seconds = hours * 3600
    if seconds < 60:
        return f"{seconds:.2g} s"
    return f"{seconds / 60:.2g} min" if seconds < 3600 else f"{hours:,.2g} h"


def hours_text(hours: float) -> str:
    """A number of (core- or GPU-) hours, ``"<0.01"`` below that."""
    if hours < 0.01:
        return "<0.01"
    return f"{hours:,.0f}" if hours >= 100 else f"{hours:.3g}"


def cost_table() -> list[str]:
    """docs/sweeps.md's table of every preset's (and the paper's headline slice's) cost."""
    from interp_toolkit.studies.grid.config import PRESETS, preset

    rows = [cost_table_row(name, preset(name)) for name in PRESETS]
    rows.append(cost_table_row("paper, headline slice", preset("paper", **HEADLINE_SLICE)))
    return rows


def sweep_cost(cfg: Any, jobs_per_gpu_override: int | None = None) -> SweepCost:
    """The expected cost of every run of ``cfg`` on CPUs and on GPUs (:class:`SweepCost`)."""
    epochs = cfg.train["epochs"]
    n_seeds = len(cfg.seeds)
    cpu_k, gpu_k = seeds_per_job(cfg), seeds_per_job(cfg, on_gpu=True)
    cells = cfg.cells()
    cpu = [cpu_seed_epoch_seconds(cfg, cell) for cell in cells]
    gpu = [gpu_seed_epoch_seconds(cfg, cell) for cell in cells]
    share = jobs_per_gpu(cfg, gpu_k, jobs_per_gpu_override)
    return SweepCost(
        jobs=len(cells) * math.ceil(n_seeds / cpu_k), seeds_per_job=cpu_k,
        core_hours=sum(cpu) * n_seeds * epochs / 3600, job_hours=max(cpu) * cpu_k * epochs / 3600,
        gpu_seeds_per_job=gpu_k, gpu_jobs=len(cells) * math.ceil(n_seeds / gpu_k), jobs_per_gpu=share,
        gpu_hours=sum(gpu) * n_seeds * epochs / 3600,
        # A job on 1/J of a GPU runs at about 1/J of its rate when the GPU is saturated.
        gpu_job_hours=max(gpu) * gpu_k * epochs * share / 3600,
    )


__all__ = [
    "HEADLINE_SLICE", "cost_table", "cost_table_row", "CPU_JOB_HOURS", "CPU_MAX_SEEDS_PER_JOB", "CPU_REFERENCE",
    "CPU_SECONDS_PER_SEED_EPOCH", "GPU_EFFECTIVE_FLOP_PER_S", "GPU_MAX_JOBS_PER_DEVICE", "GPU_MAX_SEEDS_PER_JOB",
    "GPU_SATURATING_STEP_FLOP", "SweepCost", "duration_text", "hours_text", "cpu_seed_epoch_seconds",
    "gpu_seed_epoch_seconds", "jobs_per_gpu", "seeds_per_job", "step_flop", "sweep_cost",
]
