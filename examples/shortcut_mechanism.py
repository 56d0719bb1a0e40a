"""Train one 2-layer MPSP model at r = 0.9 and draw its mechanism over checkpoints.

Trains ``max_parity_sum_parity`` (label: sum of 10 values mod 2; shortcut: max value mod 2,
agreeing with the label on 90% of training examples), then calls the library:
:func:`interp_toolkit.studies.mechanism.measure.mechanism_over_checkpoints` runs the analyses over
every checkpoint (cached: a rerun only recomputes what changed) and
:func:`~interp_toolkit.studies.mechanism.plot.write_mechanism` saves the seven-panel figure
(accuracies with the two phases marked, gradient cosine, amplification, QK and OV
fingerprints, minimal-pair patching and ablation per head, on one log-scaled epoch axis)
with its tidy table (CSV) and settings (JSON) beside it. The same figure for any existing
run directory: ``interp-toolkit mechanism RUN_DIR``.

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
from interp_toolkit.plotting import FORMATS
from interp_toolkit.studies.mechanism.measure import (
    MechanismConfig,
    mechanism_over_checkpoints,
)
from interp_toolkit.studies.mechanism.plot import write_mechanism
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
    settings = MechanismConfig(
        grad_n=min(args.grad_n, args.n_train), fingerprint_n=min(args.fingerprint_n, args.n_train)
    )
    mechanism = mechanism_over_checkpoints(run_dir, settings, device=args.device, n_threads=args.threads)
    print(f"analyses in {time.perf_counter() - started:.0f} s "
          f"({mechanism.n_computed} computed, {mechanism.n_cached} cached)")
    path = write_mechanism(mechanism, run_dir / f"shortcut_mechanism.{args.format}")["figure"]
    print(f"figure: {path} (table: {path.with_suffix('.csv')})")
    outcome = mechanism.outcome
    print(f"phases: shortcut learned at epoch {outcome['shortcut_epoch']}, "
          f"phase 2 onset at epoch {outcome['phase2_onset_epoch']}")
    last = mechanism.checkpoint_epochs[-1]
    value = {(r["head"], r["quantity"]): r["value"] for r in mechanism.rows if r["epoch"] == last}
    print(f"epoch {last}: gradient conflict cos {value[('all', 'grad_cos')]:.3f}, "
          f"amplification {value[('all', 'amplification')]:.2f}")
    for head in mechanism.heads:
        print(f"epoch {last} {head}: QK rho {value[(head, 'qk_rho')]:.2f}, "
              f"share pos0 {value[(head, 'first_share')]:.2f}, OV rho {value[(head, 'ov_rho')]:.2f} "
              f"(data {value[(head, 'ov_data_rho')]:.2f}), ablation adv acc change "
              f"{value[(head, 'ablation_acc_adv')]:+.2f}")
    return path


if __name__ == "__main__":
    main()
