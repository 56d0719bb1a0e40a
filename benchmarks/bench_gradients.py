"""Per-example gradients: vmap(grad) vs a Python loop, and the memory of 16,384 examples.

Prints, side by side in one run:

* the time to get per-example gradients of ``--n`` MPSP examples with
  ``torch.func.vmap(grad(...))`` over ``functional_call`` (one chunk) and with a Python
  loop of ordinary backward passes, and their ratio;
* the wall time and peak memory of the chunked gradient-conflict analysis
  (:func:`interp_toolkit.analyses.gradients.gradient_conflict`) over ``--n-large``
  examples (default 16,384), next to what storing every per-example gradient would need.

Peak memory on CPU is the resident set size sampled every 2 ms minus the baseline before
the call, measured in a fresh child process (so memory the allocator kept from earlier
work in this process cannot hide it); on CUDA it is ``torch.cuda.max_memory_allocated``.

    python benchmarks/bench_gradients.py                 # 2-layer model, d_model 64
    python benchmarks/bench_gradients.py --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import torch
import torch.nn.functional as F

from interp_toolkit import ModelConfig, build_model
from interp_toolkit.analyses.gradients import gradient_conflict, per_example_grads
from interp_toolkit.tasks.mpsp import MPSPConfig, make_split


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """Peak extra memory of a block: sampled RSS on CPU, max_memory_allocated on CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak = 0

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            self.base = rss_bytes()
            self.stop = threading.Event()
            self.max_rss = self.base
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.stop.is_set():
            self.max_rss = max(self.max_rss, rss_bytes())
            time.sleep(0.002)

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.base
        else:
            self.stop.set()
            self.thread.join()
            self.peak = max(self.max_rss, rss_bytes()) - self.base


def loop_grads(model, tokens, labels):
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for i in range(tokens.shape[0]):
        loss = F.cross_entropy(model(tokens[i : i + 1])[:, -1], labels[i : i + 1])
        out.append(torch.autograd.grad(loss, params))
    return out


def timed(fn, repeats: int, device: torch.device) -> float:
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=256, help="examples for the vmap-vs-loop timing")
    p.add_argument("--n-large", type=int, default=16_384, help="examples for the memory measurement")
    p.add_argument("--chunk-size", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.memory_child:
        memory_child(args, device)
        return

    task = MPSPConfig(r=0.9)  # seq_len 10, values 0..9
    large = make_split(task, 0.9, args.n_large, seed=0)
    cfg = ModelConfig(n_layers=args.n_layers, n_heads=2, **task.model_dims())  # d_model 64, d_mlp 128, LN
    model = build_model(cfg, device=device)
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    tokens, labels = large.tokens[: args.n].to(device), large.labels[: args.n].to(device)

    per_example_grads(model, tokens[:8], labels[:8])  # warm-up
    loop_grads(model, tokens[:8], labels[:8])
    t_vmap = timed(lambda: per_example_grads(model, tokens, labels, chunk_size=args.chunk_size), args.repeats, device)
    t_loop = timed(lambda: loop_grads(model, tokens, labels), max(1, args.repeats - 2), device)

    with PeakMemory(device) as mem_small:
        per_example_grads(model, tokens, labels, chunk_size=args.chunk_size)
    child = subprocess.run([sys.executable, __file__, "--memory-child", "--n-large", str(args.n_large),
                            "--chunk-size", str(args.chunk_size), "--n-layers", str(args.n_layers),
                            "--threads", str(args.threads), "--device", args.device],
                           capture_output=True, text=True, check=True)
    large_result = json.loads(child.stdout.strip().splitlines()[-1])
    t_large, peak_large = large_result["seconds"], large_result["peak"]
    stored = args.n_large * n_params * 4

    mib = 2**20
    print(f"model: {cfg.n_layers} layers, d_model {cfg.d_model}, d_mlp {cfg.d_mlp}, {n_params:,} parameters; "
          f"MPSP seq_len {task.seq_len} (+ readout); device {device}; torch threads {args.threads}")
    print(f"{'measurement':<52}{'vmap(grad) chunked':>22}{'Python loop':>16}{'ratio':>10}")
    print(f"{f'per-example grads, {args.n} examples (s)':<52}{t_vmap:>22.3f}{t_loop:>16.3f}"
          f"{t_loop / t_vmap:>9.1f}x")
    print(f"{'  per example (ms)':<52}{1e3 * t_vmap / args.n:>22.3f}{1e3 * t_loop / args.n:>16.3f}")
    print(f"{f'peak extra memory, {args.n} stored grads (MiB)':<52}{mem_small.peak / mib:>22.1f}")
    print(f"{f'gradient_conflict on {args.n_large:,} examples (s)':<52}{t_large:>22.1f}")
    print(f"{f'peak extra memory, {args.n_large:,} examples (MiB)':<52}{peak_large / mib:>22.1f}"
          f"{'(stored: ' + f'{stored / mib:,.0f})':>16}")
    print(f"(chunk size {args.chunk_size}; 'stored' = every per-example gradient kept in float32; "
          f"check at init: conflict cos {large_result['conflict_cos']:.3f}, "
          f"amplification {large_result['amplification']:.2f})")


def memory_child(args: argparse.Namespace, device: torch.device) -> None:
    """Fresh process: time and peak memory of gradient_conflict on ``--n-large`` examples."""
    task = MPSPConfig(r=0.9)
    large = make_split(task, 0.9, args.n_large, seed=0)
    model = build_model(ModelConfig(n_layers=args.n_layers, n_heads=2, **task.model_dims()), device=device)
    model.eval()
    start = time.perf_counter()
    with PeakMemory(device) as mem:
        result = gradient_conflict(model, {"train": large}, split="train", n=args.n_large,
                                   chunk_size=args.chunk_size)
    row = result.table.where(group="all").rows[0]
    print(json.dumps({"seconds": time.perf_counter() - start, "peak": mem.peak,
                      "conflict_cos": row["conflict_cos"], "amplification": row["amplification"]}))


if __name__ == "__main__":
    main()
