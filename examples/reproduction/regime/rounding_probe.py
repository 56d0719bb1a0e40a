"""Does a run's outcome depend on float rounding? One seed, one setting, several numerics:
the command line of :func:`interp_toolkit.studies.rounding_probe.probe` (its module docstring
lists the modes).

    python examples/reproduction/regime/rounding_probe.py --mode toolkit --seed 0 --out probe.jsonl

Appends one JSON line per evaluation (mode, seed, epoch, train/val/adv accuracy) to ``--out``;
``--stop-at`` ends a run once adversarial accuracy reaches it (to save CPU). The regime defaults
are stage 1e's (2 layers, 2 heads, length 8, r = 0.9, batch 512, lr 1e-3, wd 1.0, betas
(0.9, 0.98)); they are this project's choices, not the paper's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from interp_toolkit.cli import run_script
from interp_toolkit.studies.rounding_probe import MODES, probe
from interp_toolkit.tasks.mpsp import MPSPConfig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--weight-decay", type=float, default=1.0)
    parser.add_argument("--r", type=float, default=0.9)
    parser.add_argument("--stop-at", type=float, default=0.9)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--then-epochs", type=int, default=0,
                        help="then train this many more epochs on a split with --then-extreme-train all-odd sequences")
    parser.add_argument("--then-extreme-train", type=int, default=None,
                        help="all-odd training sequences of the continuation (default: the original split)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    task = MPSPConfig.from_task("max_parity_sum_parity", r=args.r, seq_len=8, n_values=10, n_train=16_384,
                                n_eval=2_048, seed=0)
    rows = probe(args.mode, args.seed, args.epochs, task, weight_decay=args.weight_decay, stop_at=args.stop_at,
                 eval_every=args.eval_every, then_extreme_train=args.then_extreme_train, then_epochs=args.then_epochs)
    with args.out.open("a") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    print(json.dumps(rows[-1]))


if __name__ == "__main__":
    sys.exit(run_script(lambda: main(sys.argv[1:])))
