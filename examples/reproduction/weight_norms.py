"""Parameter norms over the checkpoints of every finished run of one or more sweep studies:
the command line of :func:`interp_toolkit.studies.mechanism.weight_norms.weight_norm_study` (its module
docstring says what each output holds and why).

    python examples/reproduction/weight_norms.py runs/sweeps/reproduce_final_2L \\
        --out docs/reproduction --name weight_norms_2L
    python examples/reproduction/weight_norms.py --replot docs/reproduction/weight_norms_2L.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from interp_toolkit.cli import run_script
from interp_toolkit.errors import UserError
from interp_toolkit.studies.mechanism.weight_norms import (
    decay_share_lines,
    replot,
    weight_norm_study,
)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("studies", nargs="*", type=Path, help="sweep study directories")
    p.add_argument("--replot", type=Path, help="redraw the figure of a <name>.csv written before, from it alone")
    p.add_argument("--out", type=Path, default=Path("."), help="where the CSVs and figure go")
    p.add_argument("--name", default="weight_norms", help="file name stem of the outputs")
    p.add_argument("--from-epoch", type=int, default=500, help="decay rates use checkpoints from this epoch on")
    args = p.parse_args(argv)
    if args.replot is not None:
        print(f"figure: {replot(args.replot)}")
        return
    if not args.studies:
        raise UserError("give sweep study directories (or --replot CSV)")
    study = weight_norm_study(args.studies, args.out, args.name, args.from_epoch)
    for path in (study.table, study.rates_table, study.figure):
        if path is not None:
            print(f"{'figure' if path.suffix == '.png' else 'table'}: {path}")
    print(f"share of pure decay per step over the last two checkpoints from epoch {args.from_epoch} "
          "(median over seeds; 1 = undefended, 0 = held, < 0 = growing):")
    for line in decay_share_lines(study.rates):
        print(f"  {line}")


if __name__ == "__main__":
    sys.exit(run_script(lambda: main(sys.argv[1:])))
