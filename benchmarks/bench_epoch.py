"""Seconds per full-batch AdamW epoch of the default MPSP models at n_train = 16,384.

Run: python benchmarks/bench_epoch.py [--epochs 5] [--threads N]
Prints one line per architecture, measured side by side in one run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from interp_toolkit import ModelConfig, build_model
from interp_toolkit.runs.trainer import readout_loss
from interp_toolkit.tasks.mpsp import MPSPConfig, make_split


def seconds_per_epoch(n_layers: int, split, task: MPSPConfig, epochs: int) -> list[float]:
    model = build_model(ModelConfig(n_layers=n_layers, n_heads=2, **task.model_dims()))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.1)
    times = []
    for _ in range(epochs + 1):  # the first epoch is warm-up
        start = time.perf_counter()
        loss = readout_loss(model(split.tokens), split.labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    task = MPSPConfig()
    split = make_split(task, task.r, task.n_train, seed=0)
    print(f"MPSP default task: n_train={task.n_train}, seq_len={task.seq_len} (+1 readout), "
          f"torch threads={torch.get_num_threads()}")
    results = {}
    for n_layers in (1, 2):
        times = seconds_per_epoch(n_layers, split, task, args.epochs)
        results[n_layers] = statistics.median(times)
        print(f"{n_layers}-layer, 2 heads, d_model 64, d_mlp 128: median {results[n_layers]:.3f} s/epoch "
              f"(min {min(times):.3f}, max {max(times):.3f}, {args.epochs} epochs)")
    print(f"ratio 2-layer / 1-layer: {results[2] / results[1]:.2f}")


if __name__ == "__main__":
    main()
