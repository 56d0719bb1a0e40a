"""The influence measurement of docs/influence.md: which training examples drive an MPSP run
out of its saturated shortcut.

    python examples/influence_study.py train OUT EPOCHS SEED...   # the demo's task and model
    python examples/influence_study.py measure OUT SEED...        # interp-toolkit influence per run
    python examples/influence_study.py figures OUT DEST           # CSVs, figures, numbers -> DEST
    python examples/influence_study.py outcomes OUT DEST.csv      # every trained run's kind and epochs
    python examples/influence_study.py merge DEST.csv MEASURED... # one table from re-measured checkpoints

``train`` trains one run per model seed with the demo's task and model (1 layer, 2 heads,
length 5, values 0..9, r = 0.9, 4,096 training examples) for EPOCHS full-batch epochs,
checkpoints every 25 epochs plus log-spaced ones (resumable). ``measure`` runs the influence
study (``interp-toolkit influence``'s default sampler: 4 chains x 50 draws after 60 burn-in
steps, 2 steps apart; 512 query examples of each split) at epochs 50, 100, 200, 300, 400 where a
run has them (cached per checkpoint: an interrupted measurement resumes). ``figures`` copies each
run's ``influence.csv`` to ``DEST/<run>.csv``, regenerates every figure from those CSVs only
(``DEST/<run>.png``, ``DEST/summary.png``), and writes ``DEST/numbers.json``: per run its
phases, the anti-shortcut group's BIF on the adversarial loss at the shortcut-phase and
onset checkpoints with their errors, the between-phase share, and for runs that left the
shortcut the features of the most helpful anti-shortcut examples at the onset with their
permutation p-values. ``merge`` joins several ``interp-toolkit influence`` outputs of one run
into one table: a later output's epochs replace the earlier ones' (a checkpoint measured again
with more draws), and every row names its sampler's draws.
"""

from __future__ import annotations

import sys
from pathlib import Path

from interp_toolkit.errors import UserError
from interp_toolkit.studies.influence.study import (
    measure_runs,
    merge_measurements,
    table_outcomes,
    train_runs,
    write_figures,
)


def main(argv: list[str]) -> int:
    command, *rest = argv or ["--help"]
    try:
        if command == "train":
            train_runs(Path(rest[0]), int(rest[1]), [int(s) for s in rest[2:]])
        elif command == "measure":
            measure_runs(Path(rest[0]), [int(s) for s in rest[1:]])
        elif command == "figures":
            write_figures(Path(rest[0]), Path(rest[1]))
        elif command == "outcomes":
            table_outcomes(Path(rest[0]), Path(rest[1]))
        elif command == "merge":
            merge_measurements(Path(rest[0]), [Path(p) for p in rest[1:]])
        else:
            print(__doc__)
            return 0 if command in ("-h", "--help") else 2
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
