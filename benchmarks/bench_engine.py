"""Seconds per full-batch AdamW epoch: the bridge, a bare all-positions module, the fast engine.

Run: python benchmarks/bench_engine.py [--quick] [--n 16384] [--seq-len 10] [--threads 2] [--clock cpu]
     [--compare-positions 24576]

Everything is measured side by side in one run (the machines are shared and noisy: read
the ratios, not the absolute times):

* (a) ``bridge``: a plain TransformerLens loop over the ``TransformerBridge`` (full forward,
  cross-entropy at the readout, ``torch.optim.AdamW``), what ``train()`` did before the engine;
* (b) ``bare``: a bare PyTorch module of the same shape computing every position;
* (c) ``engine``: :class:`interp_toolkit.runs.forward.ReadoutForward` (``train()``'s default),
  and beside it the same engine in passes of ``--compare-positions`` positions per thread (the
  gradient of a full batch is summed over passes; ``runs.cost.CPU_MEMBER_POSITIONS_PER_PASS``).

Useful GFLOP per epoch counts a dense implementation of what the loss needs (every position
below the last layer, the readout position only in the last; forward + backward = 3x
forward; ``cost.step_flops``). The engine computes less than that count (layer 0's
projections come from a (token, position) table), so its "achieved" rate is an effective
rate. The peak is a 2048^3 fp32 matmul timed in the same run. Then seed-epochs/s of K
stacked members (the batched trainer's engine path) against K sequential engine runs.

``--clock cpu`` times with this process's CPU time instead of the wall clock: on a machine so
loaded that the wall clock measures the scheduler, with ``--threads 1`` it still measures the
work (with more threads it counts OpenMP spin-waiting too).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from interp_toolkit import ModelConfig, build_model
from interp_toolkit.runs.batched import StackedModel, batched_readout_loss
from interp_toolkit.runs.cost import CPU_MEMBER_POSITIONS_PER_PASS, default_engine_chunk, step_flops
from interp_toolkit.runs.forward import ReadoutForward
from interp_toolkit.runs.optim import StackedAdamW
from interp_toolkit.runs.trainer import readout_loss
from interp_toolkit.tasks.mpsp import MPSPConfig, make_split


class BareModel(nn.Module):
    """Pre-LN transformer of the toolkit's shape computing every position (no hooks)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, hd = cfg.d_model, cfg.n_heads * cfg.d_head
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.d_vocab, d)
        self.pos = nn.Embedding(cfg.n_ctx, d)
        self.blocks = nn.ModuleList()
        for _ in range(cfg.n_layers):
            self.blocks.append(nn.ModuleDict({
                "ln1": nn.LayerNorm(d), "qkv": nn.Linear(d, 3 * hd), "o": nn.Linear(hd, d),
                "ln2": nn.LayerNorm(d), "mlp_in": nn.Linear(d, cfg.d_mlp), "mlp_out": nn.Linear(cfg.d_mlp, d),
            }))
        self.ln_final = nn.LayerNorm(d)
        self.unembed = nn.Linear(d, cfg.d_vocab_out)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        batch, pos = tokens.shape
        h, dh = self.cfg.n_heads, self.cfg.d_head
        x = self.embed(tokens) + self.pos.weight[:pos]
        mask = torch.ones(pos, pos, dtype=torch.bool).triu(1)
        for block in self.blocks:
            q, k, v = block["qkv"](block["ln1"](x)).view(batch, pos, 3, h, dh).permute(2, 0, 3, 1, 4)
            scores = (q @ k.transpose(-2, -1) / math.sqrt(dh)).masked_fill(mask, float("-inf"))
            z = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, pos, h * dh)
            x = x + block["o"](z)
            x = x + block["mlp_out"](F.relu(block["mlp_in"](block["ln2"](x))))
        return self.unembed(self.ln_final(x))


CLOCK = time.perf_counter


def interleaved(steps: dict, epochs: int) -> dict[str, float]:
    """Median seconds per call of each step, timed in alternating rounds (after a warm-up)
    so that load changes on a shared machine hit every contender alike."""
    for step in steps.values():
        step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(epochs):
        for name, step in steps.items():
            start = CLOCK()
            step()
            times[name].append(CLOCK() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def sgemm_gflops(size: int = 2048, reps: int = 3) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(reps))
    return 2 * size**3 / best / 1e9


def _timed(fn) -> float:
    start = CLOCK()
    fn()
    return CLOCK() - start


def engine_step_fn(cfg: ModelConfig, tokens, labels, chunk: int | None = None):
    model = build_model(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.1)
    forward = ReadoutForward(model, -1)
    assert forward.fast

    def engine_step():  # what train() does per full-batch step
        optimizer.zero_grad(set_to_none=True)
        forward.backward(tokens, labels, chunk_size=chunk)
        optimizer.step()

    return engine_step


def single_runs(cfg: ModelConfig, tokens, labels, epochs: int, other_chunk: int | None = None) -> dict[str, float]:
    model = build_model(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.1)

    def bridge_step():
        loss = readout_loss(model(tokens), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    bare = BareModel(cfg)
    bare_opt = torch.optim.AdamW(bare.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.1)

    def bare_step():
        loss = F.cross_entropy(bare(tokens)[:, -1], labels)
        bare_opt.zero_grad(set_to_none=True)
        loss.backward()
        bare_opt.step()

    steps = {"bridge": bridge_step, "bare": bare_step, "engine": engine_step_fn(cfg, tokens, labels)}
    if other_chunk is not None:  # the same engine with another pass size, side by side
        steps["engine@"] = engine_step_fn(cfg, tokens, labels, other_chunk)
    return interleaved(steps, epochs)


def stacked_vs_sequential(cfg: ModelConfig, k: int, tokens, labels, epochs: int) -> tuple[float, float]:
    """(seconds per stacked K-member epoch, seconds per single-member engine epoch), interleaved."""
    stacked = StackedModel([ModelConfig.from_dict({**cfg.to_dict(), "seed": s}) for s in range(k)])
    optimizer = StackedAdamW(stacked.params, 1e-3, (0.9, 0.98), 0.1)

    def stacked_step():
        grads, _ = batched_readout_loss(stacked, tokens, labels, -1)
        optimizer.step(stacked.params, grads)

    times = interleaved({"stacked": stacked_step, "single": engine_step_fn(cfg, tokens, labels)}, epochs)
    return times["stacked"], times["single"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=16_384, help="training examples (full batch)")
    parser.add_argument("--seq-len", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per measurement (after 1 warm-up)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ks", default="1,4,16", help="seed counts trained together")
    parser.add_argument("--layers", default="1,2")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time by the wall clock or by this process's CPU time (for --threads 1 under load)")
    parser.add_argument("--compare-positions", type=int, default=24_576,
                        help="also time the engine with passes of this many positions per thread, side by "
                             "side (default: the pass size before it was measured down to "
                             "CPU_MEMBER_POSITIONS_PER_PASS; 0: skip)")
    parser.add_argument("--quick", action="store_true", help="n=2,048, 2 epochs, K=1,4 (a smoke run under load)")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # progress shows when redirected to a file
    if args.quick:
        args.n, args.epochs, args.ks = 2_048, 2, "1,4"
    torch.set_num_threads(args.threads)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    task = MPSPConfig(seq_len=args.seq_len, n_train=args.n)
    split = make_split(task, task.r, args.n, seed=0)
    tokens, labels = split.tokens, split.labels
    n_pos = tokens.shape[1]
    peak = sgemm_gflops()
    print(f"n={args.n}, sequence length {args.seq_len} (+1 readout = {n_pos} positions), d_model 64, "
          f"d_mlp 128, 2 heads, torch threads {torch.get_num_threads()}, {args.clock} clock; "
          f"2048^3 sgemm: {peak:.1f} GFLOP/s")
    ks = [int(k) for k in args.ks.split(",")]
    for n_layers in (int(x) for x in args.layers.split(",")):
        cfg = ModelConfig(n_layers=n_layers, n_heads=2, **task.model_dims())
        useful = step_flops(cfg, args.n, n_pos, readout_only=True) / 1e9
        everything = step_flops(cfg, args.n, n_pos, readout_only=False) / 1e9
        other = (max(32, args.compare_positions * args.threads // n_pos)
                 if args.compare_positions else None)
        times = single_runs(cfg, tokens, labels, args.epochs, other)
        print(f"\n{n_layers}L: useful {useful:.1f} GFLOP/epoch (all positions: {everything:.1f})")
        print(f"  {'path':<8} {'s/epoch':>8} {'vs bridge':>10} {'useful GFLOP/s':>15} {'of sgemm':>9}")
        for name in ("bridge", "bare", "engine"):
            rate = useful / times[name]
            print(f"  {name:<8} {times[name]:8.3f} {times['bridge'] / times[name]:9.2f}x {rate:15.1f} "
                  f"{rate / peak:8.0%}")
        print(f"  engine vs bare: {times['bare'] / times['engine']:.2f}x faster")
        if other is not None:
            chunk = default_engine_chunk(1, args.n, "cpu", None, n_pos)
            print(f"  engine in passes of {chunk} examples ({CPU_MEMBER_POSITIONS_PER_PASS:,} positions per "
                  f"thread): {times['engine']:.3f} s/epoch; in passes of {other} "
                  f"({args.compare_positions:,} per thread): {times['engine@']:.3f}; "
                  f"{times['engine@'] / times['engine']:.2f}x faster")
        for k in ks:
            stacked, single = stacked_vs_sequential(cfg, k, tokens, labels, max(2, args.epochs - 1))
            print(f"  K={k:<3} stacked: {k / stacked:6.2f} seed-epochs/s; K sequential engine runs: "
                  f"{1 / single:6.2f}; ratio {single * k / stacked:.2f}x")


if __name__ == "__main__":
    main()
