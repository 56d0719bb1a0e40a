"""Train one 2-layer MPSP model at r = 0.9 and watch its circuits over training.

Trains ``max_parity_sum_parity`` (label: sum of 10 values mod 2; shortcut: max value mod 2,
agreeing with the label on 90% of training examples), then runs two analyses over every
checkpoint with :func:`interp_toolkit.analyses.over_checkpoints.over_checkpoints` (cached:
a rerun only recomputes what changed) and draws one figure on a shared epoch axis:

1. train / val (shortcut-consistent) / adv (anti-shortcut) accuracy;
2. gradient conflict: cosine between the mean gradients of shortcut-consistent and
   anti-shortcut training examples (all parameters and each head's QK / OV);
3. the amplification ratio (anti / consistent per-example gradient norm);
4. the QK magnitude fingerprint of every head (Spearman rho of readout score vs value) and
   its attention share on position 0;
5. the OV parity fingerprint of every head (weights: W_E W_V W_O W_U; data: the head's
   readout output vs the parity of the value it attends to most).

Default size runs in about 10 minutes on 2 CPU cores (n_train 4,096, 400 epochs);
``--paper`` uses the paper's size (n_train 16,384, 15,000 epochs: GPU or hours of CPU).

    python examples/shortcut_mechanism.py                 # laptop size
    python examples/shortcut_mechanism.py --paper --device cuda
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from interp_toolkit import ModelConfig, TrainConfig, build_model, train
from interp_toolkit.analyses._common import pyplot, save_png
from interp_toolkit.analyses.over_checkpoints import over_checkpoints
from interp_toolkit.io import read_jsonl
from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", default="runs/shortcut_mechanism")
    p.add_argument("--r", type=float, default=0.9, help="spurious ratio of the training split")
    p.add_argument("--n-train", type=int, default=4096)
    p.add_argument("--n-eval", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=400)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--grad-n", type=int, default=2048, help="training examples for the gradient analysis")
    p.add_argument("--fingerprint-n", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--device", default=None)
    p.add_argument("--paper", action="store_true",
                   help="paper size: n_train 16,384, n_eval 2,048, 15,000 epochs, checkpoints every 500")
    args = p.parse_args(argv)
    if args.paper:
        args.n_train, args.n_eval, args.epochs, args.checkpoint_every = 16_384, 2_048, 15_000, 500
        args.grad_n = 16_384
    return args


def plot_mechanism(run_dir: Path, grads, prints, path: Path) -> Path:
    """The over-checkpoints figure (see the module docstring)."""
    plt = pyplot()
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    fig, axes = plt.subplots(5, 1, figsize=(10, 15), sharex=True)
    ax = axes[0]
    for split in ("train", "val", "adv"):
        ax.plot([m["epoch"] for m in metrics], [m[f"{split}_acc"] for m in metrics], label=split)
    ax.set(ylabel="accuracy", ylim=(-0.02, 1.02),
           title=f"2-layer MPSP, r = 0.9 ({run_dir.name}): val = shortcut-consistent, adv = anti-shortcut")

    def lines(table, key_col, key, value):
        rows = sorted(table.where(**{key_col: key}).rows, key=lambda r: r["epoch"])
        return [r["epoch"] for r in rows], [r[value] for r in rows]

    groups = sorted(set(grads.table.column("group")))
    shown = ["all"] + [g for g in groups if g.endswith((".QK", ".OV"))]
    for g in shown:
        axes[1].plot(*lines(grads.table, "group", g, "conflict_cos"), marker=".", label=g,
                     lw=2.5 if g == "all" else 1)
        axes[2].plot(*lines(grads.table, "group", g, "amplification"), marker=".", label=g,
                     lw=2.5 if g == "all" else 1)
    axes[1].set(ylabel="cos(mean grad consistent,\nmean grad anti)")
    axes[1].axhline(0, color="grey", lw=0.5)
    axes[2].set(ylabel="amplification\n(anti / consistent norm)", yscale="log")
    axes[2].axhline(1, color="grey", lw=0.5)

    heads = sorted(set(prints.table.column("component")))
    for h in heads:
        line = axes[3].plot(*lines(prints.table, "component", h, "qk_rho"), marker=".", label=f"{h} QK rho")[0]
        axes[3].plot(*lines(prints.table, "component", h, "first_share"), ls=":", color=line.get_color(),
                     label=f"{h} share on pos 0")
        line = axes[4].plot(*lines(prints.table, "component", h, "ov_rho"), marker=".", label=f"{h} OV (weights)")[0]
        axes[4].plot(*lines(prints.table, "component", h, "ov_data_rho"), ls="--", color=line.get_color(),
                     label=f"{h} OV (data)")
    axes[3].set(ylabel="QK magnitude fingerprint\n(Spearman rho score vs value)", ylim=(-1.05, 1.05))
    axes[4].set(ylabel="OV parity fingerprint\n(Spearman rho vs v mod 2)", ylim=(-1.05, 1.05))
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=3, loc="best")
    axes[3].axhline(0, color="grey", lw=0.5)
    axes[4].axhline(0, color="grey", lw=0.5)
    axes[-1].set_xlabel("epoch")
    fig.tight_layout()
    return save_png(fig, path)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    run_dir = Path(args.run_dir)
    task = MPSPConfig(r=args.r, n_train=args.n_train, n_eval=args.n_eval, seed=args.seed)
    splits = make_splits(task)
    model = build_model(ModelConfig(n_layers=2, n_heads=2, seed=args.seed, **task.model_dims()), device=args.device)
    started = time.perf_counter()
    result = train(model, splits, TrainConfig(epochs=args.epochs, checkpoint_every=args.checkpoint_every), run_dir,
                   run_info={"task": {"name": task.name, **task.to_dict()}})
    print(f"trained in {time.perf_counter() - started:.0f} s: {result.final}")

    started = time.perf_counter()
    grads = over_checkpoints("gradients", run_dir, splits=splits,
                             config={"split": "train", "n": args.grad_n, "chunk_size": 256})
    prints = over_checkpoints("fingerprints", run_dir, splits=splits,
                              config={"split": "train", "n": args.fingerprint_n})
    print(f"analyses in {time.perf_counter() - started:.0f} s "
          f"({len(grads.computed) + len(prints.computed)} computed, "
          f"{len(grads.cache_hits) + len(prints.cache_hits)} cached)")
    path = plot_mechanism(run_dir, grads, prints, run_dir / "shortcut_mechanism.png")
    print(f"figure: {path}")
    last = max(grads.table.column("epoch"))
    for row in grads.table.where(epoch=last, group="all").rows:
        print(f"epoch {last}: gradient conflict cos {row['conflict_cos']:.3f}, "
              f"amplification {row['amplification']:.2f}")
    for row in prints.table.where(epoch=last).rows:
        print(f"epoch {last} {row['component']}: QK rho {row['qk_rho']:.2f}, share pos0 {row['first_share']:.2f}, "
              f"OV rho {row['ov_rho']:.2f} (data {row['ov_data_rho']:.2f})")
    return path


if __name__ == "__main__":
    main()
