"""The hierarchy-toy BIF story re-measured with long chains, several sampler seeds and
several DLN initializations, with convergence diagnostics and controls (docs/bif.md).

The command line of :mod:`interp_toolkit.studies.bif.remeasure` (stage 1, ``sample``: SGLD
draws of every (init, step) replica, resumable per sampler seed; ``calibrate``: the library's
sweep at step 384) and :mod:`interp_toolkit.studies.bif.remeasure_analysis` (stage 2,
``analyze``: the claims on the stored draws; stage 3, ``phases``: within / between-phase
split by solution); ``replot`` redraws the claims' figure from a committed summary;
``locality`` re-measures a rung's locality gate (``locality.csv``, read by the verdicts).

    # the step-size ladder (docs/bif.md): one rung; the others are eps 8e-4 / 4e-4 / 1e-4 with
    # burn-in 2000 / 4000 / 16000 and draws 4 / 8 / 32 steps apart (chains of 8 / eps steps)
    nice -n 19 python examples/bif_hierarchy_remeasure.py sample --out runs/bif_ladder/eps1.6e-3 --eps 1.6e-3 \
        --burn-in 1000 --draws 2000 --steps-between-draws 2
    python examples/bif_hierarchy_remeasure.py analyze --out runs/bif_ladder/eps1.6e-3 --docs docs/bif/ladder/eps1.6e-3
    python examples/bif_hierarchy_remeasure.py calibrate --docs docs/bif
    # the locality gate of a rung (its draws' loss against the zero map's; locality.csv):
    python examples/bif_hierarchy_remeasure.py locality --docs docs/bif/ladder/eps1.6e-3
    # within / between:
    python examples/bif_hierarchy_remeasure.py phases --out runs/bif_ladder/eps1.6e-3 --docs docs/bif/ladder/eps1.6e-3
"""

from __future__ import annotations

import argparse
from pathlib import Path

from interp_toolkit.studies.bif.remeasure import INITS, SEEDS, calibrate, locality, sample
from interp_toolkit.studies.bif.remeasure_analysis import analyze, phases
from interp_toolkit.studies.bif.remeasure_plot import replot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("sample", "calibrate", "analyze", "phases", "replot", "locality"))
    parser.add_argument("--out", default="runs/bif_remeasure")
    parser.add_argument("--docs", default="docs/bif")
    parser.add_argument("--eps", type=float, default=2e-5)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--burn-in", type=int, default=1000)
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--steps-between-draws", type=int, default=5)
    parser.add_argument("--inits", type=int, nargs="+", default=list(INITS))
    args = parser.parse_args()
    out = Path(args.out)
    if args.stage == "sample":
        sample(out, args.eps, tuple(args.seeds), args.burn_in, args.draws, args.steps_between_draws, tuple(args.inits))
    elif args.stage == "calibrate":
        calibrate(Path(args.docs))
    elif args.stage == "phases":
        phases(out, Path(args.docs), tuple(args.seeds))
    elif args.stage == "replot":
        replot(Path(args.docs))
    elif args.stage == "locality":
        locality(Path(args.docs), args.seeds[0], tuple(args.inits))
    else:
        analyze(out, Path(args.docs), tuple(args.seeds))


if __name__ == "__main__":
    main()
