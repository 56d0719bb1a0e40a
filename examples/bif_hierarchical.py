"""Stagewise attribution on the hierarchy toy, as the paper tells it: a deep linear network
learns animals vs plants, then mammals vs birds (and trees vs flowers), then the species;
the Bayesian influence of a dog sample on a sparrow sample is helpful (negative) while
animal vs plant is learned and harmful (positive) while mammal vs bird is learned.

Run (CPU, a few minutes; the DLN run and every BIF result are cached, a rerun is faster)::

    python examples/bif_hierarchical.py --out runs/bif_hierarchical

Writes ``bif_hierarchical.png``, ``summary.json`` (every number quoted in ``docs/bif.md``),
``dln_run/`` and ``bif_cache/`` in ``--out``: see
:func:`interp_toolkit.studies.bif.hierarchy.hierarchy_study`, which does the work.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from interp_toolkit.studies.bif.hierarchy import hierarchy_study, summary_lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/bif_hierarchical")
    parser.add_argument("--quick", action="store_true", help="fewer draws and checkpoints (smoke test)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.time()
    summary = hierarchy_study(args.out, quick=args.quick, seed=args.seed)
    out = Path(args.out)
    print(f"wrote {out / 'bif_hierarchical.png'} and {out / 'summary.json'} in {time.time() - started:.0f} s")
    print("\n".join(summary_lines(summary)))


if __name__ == "__main__":
    main()
