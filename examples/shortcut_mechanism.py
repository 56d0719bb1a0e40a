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
from matplotlib.figure import Figure

from interp_toolkit import ModelConfig, TrainConfig, build_model, train
from interp_toolkit.analyses.over_checkpoints import over_checkpoints
from interp_toolkit.io import read_jsonl
from interp_toolkit.plotting import (
    FORMATS,
    component_colors,
    epoch_axis,
    label,
    new_panels,
    save_figure,
    split_colors,
    style,
)
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
    p.add_argument("--format", choices=FORMATS, default="png", help="figure file format")
    p.add_argument("--paper", action="store_true",
                   help="paper size: n_train 16,384, n_eval 2,048, 15,000 epochs, checkpoints every 500")
    args = p.parse_args(argv)
    if args.paper:
        args.n_train, args.n_eval, args.epochs, args.checkpoint_every = 16_384, 2_048, 15_000, 500
        args.grad_n = 16_384
    return args


def plot_mechanism(run_dir: Path, grads, prints, ax=None) -> Figure:
    """The over-checkpoints figure (see the module docstring).

    One colour per head in every panel (solid: QK, dashed: OV; black: all parameters),
    fixed split colours in the accuracy panel, and a log-scaled epoch axis so the early
    checkpoints, where the gradient cosine collapses, are not squeezed into the first pixel.
    """
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    heads = sorted(set(prints.table.column("component")))
    colors = component_colors(heads)
    epochs = [m["epoch"] for m in metrics]

    def lines(table, key_col, key, value):
        rows = sorted(table.where(**{key_col: key}).rows, key=lambda r: r["epoch"])
        return [r["epoch"] for r in rows], [r[value] for r in rows]

    with style():
        fig, axes = new_panels(5, ax, figsize=(7.5, 12), sharex=True)
        for split, color in split_colors().items():
            axes[0].plot(epochs, [m[f"{split}_acc"] for m in metrics], label=label(split), color=color)
        axes[0].set(ylabel="accuracy", ylim=(-0.02, 1.02),
                    title="2-layer MPSP, r = 0.9: validation = shortcut-consistent, adversarial = anti-shortcut")

        for panel, value in ((axes[1], "conflict_cos"), (axes[2], "amplification")):
            panel.plot(*lines(grads.table, "group", "all", value), color="black", lw=2.2, label="all parameters")
            for head in heads:
                for kind, ls in (("QK", "-"), ("OV", "--")):
                    panel.plot(*lines(grads.table, "group", f"{head}.{kind}", value), color=colors[head], ls=ls,
                               lw=1, label=f"{head} {kind}")
        axes[1].set(ylabel="cos(mean gradient consistent,\nmean gradient anti)")
        axes[1].axhline(0, color="grey", lw=0.5)
        axes[2].set(ylabel="gradient norm ratio\n(anti / consistent)", yscale="log")
        axes[2].axhline(1, color="grey", lw=0.5)

        for head in heads:
            axes[3].plot(*lines(prints.table, "component", head, "qk_rho"), color=colors[head], label=f"{head} QK ρ")
            axes[3].plot(*lines(prints.table, "component", head, "first_share"), color=colors[head], ls=":",
                         label=f"{head} attention on position 0")
            axes[4].plot(*lines(prints.table, "component", head, "ov_rho"), color=colors[head],
                         label=f"{head} OV ρ (weights)")
            axes[4].plot(*lines(prints.table, "component", head, "ov_data_rho"), color=colors[head], ls="--",
                         label=f"{head} OV ρ (data)")
        axes[3].set(ylabel="QK magnitude fingerprint\n(Spearman ρ, score vs value)", ylim=(-1.05, 1.05))
        axes[4].set(ylabel="OV parity fingerprint\n(Spearman ρ vs value mod 2)", ylim=(-1.05, 1.05))
        for panel in axes:
            panel.legend(ncol=3, loc="best", fontsize=6.5)
            epoch_axis(panel, epochs)
        for panel in axes[:-1]:
            panel.set_xlabel("")
        axes[3].axhline(0, color="grey", lw=0.5)
        axes[4].axhline(0, color="grey", lw=0.5)
    return fig


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
    path = save_figure(plot_mechanism(run_dir, grads, prints), run_dir / f"shortcut_mechanism.{args.format}")
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
