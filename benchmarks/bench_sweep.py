"""Benchmark of the sweep's trainer, printed side by side in one run (same data, same machine).

1. Seed-epochs per second: the sweep's batched trainer (``train_batched``: K seeds stacked in
   one process, by default on the fast engine of ``interp_toolkit.runs.engine``, with its run directories: evaluations,
   checkpoints, curves) and its inner
   vmapped step loop alone, vs the same K seeds trained one after another with a plain
   TransformerLens loop (``build_model`` + ``torch.optim.AdamW``, no I/O).
2. Seconds per epoch of one model: the toolkit's ``train`` (bridge, evaluation and
   bookkeeping at the end only) and the plain TransformerLens loop vs a bare PyTorch
   transformer of the same shape (hand-written ``nn.Module``, same forward/backward/AdamW):
   the toolkit's overhead.

Usage::

    python benchmarks/bench_sweep.py [--seeds 4] [--epochs 20] [--n-train 1024] [--seq-len 6]
        [--layers 1] [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from interp_toolkit import ModelConfig, TrainConfig, build_model, train
from interp_toolkit.runs.batched import StackedModel, batched_readout_loss, train_batched
from interp_toolkit.runs.optim import StackedAdamW
from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits


class BareTransformer(nn.Module):
    """Pre-LN transformer with the toolkit's shapes: learned positions, ReLU MLP, LN, no dropout."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, h, dh = cfg.d_model, cfg.n_heads, cfg.d_head
        self.n_heads, self.d_head = h, dh
        self.embed = nn.Embedding(cfg.d_vocab, d)
        self.pos = nn.Embedding(cfg.n_ctx, d)
        self.blocks = nn.ModuleList()
        for _ in range(cfg.n_layers):
            self.blocks.append(nn.ModuleDict({
                "ln1": nn.LayerNorm(d), "q": nn.Linear(d, h * dh), "k": nn.Linear(d, h * dh),
                "v": nn.Linear(d, h * dh), "o": nn.Linear(h * dh, d), "ln2": nn.LayerNorm(d),
                "fc_in": nn.Linear(d, cfg.d_mlp), "fc_out": nn.Linear(cfg.d_mlp, d),
            }))
        self.ln_final = nn.LayerNorm(d)
        self.unembed = nn.Linear(d, cfg.d_vocab_out)
        self.register_buffer("mask", torch.tril(torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool)))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        batch, pos = tokens.shape
        x = self.embed(tokens) + self.pos(torch.arange(pos))
        for block in self.blocks:
            y = block["ln1"](x)
            q, k, v = (block[n](y).view(batch, pos, self.n_heads, self.d_head).transpose(1, 2) for n in "qkv")
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.d_head)
            scores = scores.masked_fill(~self.mask[:pos, :pos], float("-inf"))
            attn = scores.softmax(-1) @ v
            x = x + block["o"](attn.transpose(1, 2).reshape(batch, pos, -1))
            x = x + block["fc_out"](F.relu(block["fc_in"](block["ln2"](x))))
        return self.unembed(self.ln_final(x))


def plain_loop(model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor, epochs: int, lr: float) -> float:
    """Seconds of ``epochs`` full-batch AdamW steps (forward, backward, step; nothing else)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.1)
    started = time.perf_counter()
    for _ in range(epochs):
        loss = F.cross_entropy(model(tokens)[:, -1, :], labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return time.perf_counter() - started


def batched_steps(cfgs: list[ModelConfig], tokens: torch.Tensor, labels: torch.Tensor, epochs: int,
                  lr: float) -> float:
    """Seconds of ``epochs`` vmapped AdamW steps of all members (the trainer's inner loop only)."""
    stacked = StackedModel(cfgs)
    optimizer = StackedAdamW(stacked.params, lr, (0.9, 0.98), 0.1)
    started = time.perf_counter()
    for _ in range(epochs):
        grads, _ = batched_readout_loss(stacked, tokens, labels, -1)
        optimizer.step(stacked.params, grads)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--n-train", type=int, default=1024)
    parser.add_argument("--seq-len", type=int, default=6)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--d-mlp", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    task = MPSPConfig(seq_len=args.seq_len, n_train=args.n_train, n_eval=256, r=0.9)
    splits = make_splits(task)
    tokens, labels = splits["train"].tokens, splits["train"].labels
    cfgs = [ModelConfig(n_layers=args.layers, n_heads=2, d_model=args.d_model, d_mlp=args.d_mlp, seed=s,
                        **task.model_dims()) for s in range(args.seeds)]
    train_cfg = TrainConfig(epochs=args.epochs, lr=1e-3, eval_every=args.epochs, checkpoint_every=None,
                            checkpoint_log_spaced=False, progress=False)
    plain_loop(build_model(cfgs[0]), tokens, labels, 2, 1e-3)  # warm-up

    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        train_batched(cfgs, splits, train_cfg, [Path(tmp) / f"b{i}" for i in range(args.seeds)])
        batched_s = time.perf_counter() - started
        started = time.perf_counter()
        train(build_model(cfgs[0]), splits, train_cfg, Path(tmp) / "single")
        toolkit_train_s = time.perf_counter() - started

    batched_core_s = batched_steps(cfgs, tokens, labels, args.epochs, 1e-3)
    sequential_s = sum(plain_loop(build_model(cfg), tokens, labels, args.epochs, 1e-3) for cfg in cfgs)
    torch.manual_seed(0)
    bare_s = plain_loop(BareTransformer(cfgs[0]), tokens, labels, args.epochs, 1e-3)

    seed_epochs = args.seeds * args.epochs
    figures = {
        "setup": vars(args),
        "batched_seed_epochs_per_s": seed_epochs / batched_s,
        "sequential_tl_seed_epochs_per_s": seed_epochs / sequential_s,
        "batched_over_sequential": sequential_s / batched_s,
        "batched_steps_only_seed_epochs_per_s": seed_epochs / batched_core_s,
        "batched_steps_only_over_sequential": sequential_s / batched_core_s,
        "toolkit_train_s_per_epoch": toolkit_train_s / args.epochs,
        "plain_tl_s_per_epoch": sequential_s / seed_epochs,
        "bare_pytorch_s_per_epoch": bare_s / args.epochs,
    }
    figures["toolkit_train_over_bare"] = figures["toolkit_train_s_per_epoch"] / figures["bare_pytorch_s_per_epoch"]
    figures["plain_tl_over_bare"] = figures["plain_tl_s_per_epoch"] / figures["bare_pytorch_s_per_epoch"]

    print(f"MPSP n_train={args.n_train} seq_len={args.seq_len} {args.layers}L 2H d_model={args.d_model} "
          f"d_mlp={args.d_mlp}, {args.seeds} seeds x {args.epochs} epochs, {args.threads} thread(s)")
    print(f"{'':44s}{'seed-epochs/s':>15s}{'s/epoch':>10s}{'ratio':>9s}")
    print(f"{'batched trainer (train_batched, K vmapped)':44s}{figures['batched_seed_epochs_per_s']:15.2f}"
          f"{batched_s / seed_epochs:10.4f}{figures['batched_over_sequential']:8.2f}x  (vs sequential)")
    print(f"{'  its vmapped steps only (no eval/I/O)':44s}{figures['batched_steps_only_seed_epochs_per_s']:15.2f}"
          f"{batched_core_s / seed_epochs:10.4f}{figures['batched_steps_only_over_sequential']:8.2f}x  (vs sequential)")
    print(f"{'sequential plain TransformerLens loop':44s}{figures['sequential_tl_seed_epochs_per_s']:15.2f}"
          f"{figures['plain_tl_s_per_epoch']:10.4f}{1.0:8.2f}x")
    print(f"{'toolkit train() (one seed)':44s}{1 / figures['toolkit_train_s_per_epoch']:15.2f}"
          f"{figures['toolkit_train_s_per_epoch']:10.4f}{figures['toolkit_train_over_bare']:8.2f}x  (vs bare)")
    print(f"{'plain TransformerLens loop (one seed)':44s}{1 / figures['plain_tl_s_per_epoch']:15.2f}"
          f"{figures['plain_tl_s_per_epoch']:10.4f}{figures['plain_tl_over_bare']:8.2f}x  (vs bare)")
    print(f"{'bare PyTorch forward/backward (one seed)':44s}{1 / figures['bare_pytorch_s_per_epoch']:15.2f}"
          f"{figures['bare_pytorch_s_per_epoch']:10.4f}{1.0:8.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
