"""Seed-epochs/s on one GPU for 1L / 2L models at K = 1..256 stacked seeds, and the paper's
headline slice's expected wall time there.

Run (on a machine with CUDA; under 5 minutes on a data-centre GPU):

    python benchmarks/gpu_slice.py                 # K = 1, 2, 4, ..., 256; 1L and 2L
    python benchmarks/gpu_slice.py --budget-s 120  # stop each layer count's K loop sooner
    python benchmarks/gpu_slice.py --dry           # the script's logic on the CPU, tiny shapes

Each point times full-batch AdamW steps of K stacked seeds exactly as a sweep job trains them
(``StackedModel`` + ``batched_readout_loss`` + ``StackedAdamW``: the fast readout engine, its
passes sized to the GPU's free memory), at the ``paper`` preset's shape (16,384 examples of
length 10, d_model 64, d_mlp 128, 2 heads), after one warm-up step, with the GPU synchronized
around the timed steps. Printed: seed-epochs/s, seconds per epoch, and the effective TFLOP/s
(``cost.step_flops``, the count behind ``resources.GPU_EFFECTIVE_FLOP_PER_S``).

The slice (one task, r in {0.5, 0.9}, 1L and 2L, 30 seeds, 15,000 epochs) is 2 cells x 30 seeds
x 15,000 epochs per layer count. Its wall time is estimated two ways: one job at a time (each
cell's 30 seeds at the rate measured at K = 32), and the GPU's best measured rate (several jobs
sharing it, ``--jobs-per-gpu``). Without CUDA (and without ``--dry``) it exits 2 saying so.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

import torch

#: The paper's headline slice: runs per layer count, epochs per run.
SLICE_CELLS_PER_LAYER_COUNT = 2
SLICE_SEEDS = 30
SLICE_EPOCHS = 15_000
DEFAULT_KS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def slice_estimate(rates: dict[tuple[int, int], float], job_seeds: int = SLICE_SEEDS,
                   cells: int = SLICE_CELLS_PER_LAYER_COUNT, epochs: int = SLICE_EPOCHS) -> dict[str, float]:
    """Wall seconds of the slice from measured rates ``{(n_layers, K): seed-epochs/s}``.

    Returns:
        ``{"one_job_at_a_time": s, "best_rate": s}``: every layer count's ``cells x job_seeds x
        epochs`` seed-epochs at the rate of the smallest measured K >= ``job_seeds`` (else the
        largest K), and at that layer count's best measured rate.
    """
    layers = sorted({n for n, _ in rates})
    if not layers:
        raise ValueError("slice_estimate needs at least one measured rate")
    one_at_a_time = best = 0.0
    for n in layers:
        ks = sorted(k for m, k in rates if m == n)
        k_job = next((k for k in ks if k >= job_seeds), ks[-1])
        seed_epochs = cells * job_seeds * epochs
        one_at_a_time += seed_epochs / rates[(n, k_job)]
        best += seed_epochs / max(rates[(n, k)] for k in ks)
    return {"one_job_at_a_time": one_at_a_time, "best_rate": best}


def _clock_text(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def measure(n_layers: int, k: int, tokens: torch.Tensor, labels: torch.Tensor, shape: dict,
            epochs: int, synchronize: Callable[[], None]) -> tuple[float, float]:
    """``(seconds per epoch, FLOPs per epoch)`` of K stacked seeds (one warm-up step first)."""
    from interp_toolkit import ModelConfig
    from interp_toolkit.runs.batched import StackedModel, batched_readout_loss
    from interp_toolkit.runs.cost import step_flops
    from interp_toolkit.runs.optim import StackedAdamW

    cfgs = [ModelConfig(n_layers=n_layers, n_heads=shape["n_heads"], d_model=shape["d_model"],
                        d_mlp=shape["d_mlp"], seed=seed, **shape["dims"]) for seed in range(k)]
    stacked = StackedModel(cfgs, device=tokens.device)
    optimizer = StackedAdamW(stacked.params, 1e-3, (0.9, 0.98), 0.1)

    def step() -> None:
        grads, _ = batched_readout_loss(stacked, tokens, labels, -1)
        optimizer.step(stacked.params, grads)

    step()  # warm-up: kernels chosen, memory allocated
    synchronize()
    start = time.perf_counter()
    for _ in range(epochs):
        step()
    synchronize()
    seconds = (time.perf_counter() - start) / epochs
    return seconds, k * step_flops(cfgs[0], len(labels), tokens.shape[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", type=int, nargs="+", default=list(DEFAULT_KS), help="stacked seeds per point")
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--epochs", type=int, default=5, help="timed full-batch epochs per point")
    parser.add_argument("--budget-s", type=float, default=110.0,
                        help="seconds per layer count; larger K are skipped once it is spent")
    parser.add_argument("--dry", action="store_true",
                        help="CPU, 256 examples of length 5, d_model 16, K = 1, 2, 1 epoch: the logic only")
    args = parser.parse_args(argv)
    from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits

    if args.dry:
        device = torch.device("cpu")
        task = MPSPConfig(seq_len=5, n_values=10, n_train=256, n_eval=64, r=0.9)
        shape = {"d_model": 16, "d_mlp": 32, "n_heads": 2}
        ks, epochs = [k for k in args.ks if k <= 2] or [1], 1
    else:
        if not torch.cuda.is_available():
            print("error: benchmarks/gpu_slice.py needs a CUDA GPU (torch.cuda.is_available() is False here); "
                  "--dry runs its logic on the CPU", file=sys.stderr)
            return 2
        device = torch.device("cuda")
        # The paper preset's task and widths (studies.grid.config.PRESETS["paper"]).
        task = MPSPConfig(seq_len=10, n_values=10, n_train=16_384, n_eval=2_048, r=0.9)
        shape = {"d_model": 64, "d_mlp": 128, "n_heads": 2}
        ks, epochs = sorted(args.ks), args.epochs
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    shape["dims"] = task.model_dims()
    split = make_splits(task)["train"]  # the split a sweep trains on
    tokens, labels = split.tokens.to(device), split.labels.to(device)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    print(f"{len(labels):,} examples x {tokens.shape[1]} tokens, d_model {shape['d_model']}, d_mlp {shape['d_mlp']}, "
          f"{shape['n_heads']} heads, full batch, {epochs} timed epochs per point")
    print(f"{'layers':>6} {'K':>4} {'s/epoch':>9} {'seed-epochs/s':>14} {'TFLOP/s':>8}")
    rates: dict[tuple[int, int], float] = {}
    for n_layers in args.layers:
        started = time.perf_counter()
        for k in ks:
            if time.perf_counter() - started > args.budget_s:
                print(f"{n_layers:>6} {k:>4}  skipped (--budget-s {args.budget_s:g} spent)")
                continue
            seconds, flops = measure(n_layers, k, tokens, labels, shape, epochs, synchronize)
            rates[(n_layers, k)] = k / seconds
            print(f"{n_layers:>6} {k:>4} {seconds:>9.4f} {k / seconds:>14.1f} {flops / seconds / 1e12:>8.2f}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
    estimate = slice_estimate(rates)
    what = "these tiny shapes (--dry: not the slice's)" if args.dry else "one GPU"
    print(f"headline slice ({SLICE_CELLS_PER_LAYER_COUNT} cells x {SLICE_SEEDS} seeds x {SLICE_EPOCHS:,} epochs per "
          f"layer count) on {what}: ~{_clock_text(estimate['one_job_at_a_time'])} one job at a time, "
          f"~{_clock_text(estimate['best_rate'])} at the best measured rate (jobs sharing the GPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
