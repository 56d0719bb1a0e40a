"""Script a seed study with the library: plan it, run it, grow it by more seeds, report it.

A study trains every cell of a grid (task x r x layers x heads x weight decay) with many
seeds; its table counts, per cell, the seeds that generalized by the paper's criterion, with
95% Wilson intervals, and compares cells with a Newcombe interval and a Fisher exact p.
The same steps on the command line: `interp-toolkit sweep --dry-run`, `interp-toolkit sweep`,
`interp-toolkit report --compare` (docs/sweeps.md).

Run: python examples/scripted_study.py [--out runs/scripted_study] [--epochs 40] [--seeds 4]
"""

import argparse
from pathlib import Path

from interp_toolkit.studies.grid.config import preset
from interp_toolkit.studies.report.write import write_report
from interp_toolkit.studies.sweep.run import plan_sweep, run_sweep


def describe(plan: dict) -> str:
    return (f"{plan['finished']} finished, {plan['recorded']} recorded, {plan['resume']} to resume, "
            f"{plan['new']} to start")


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/scripted_study"))
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--n-train", type=int, default=256)
    parser.add_argument("--seeds", type=int, default=4, help="seeds per cell after growing (>= 3)")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    if args.seeds < 3:
        parser.error(f"--seeds must be >= 3 (the study starts with 2 and grows), got {args.seeds}")

    # The smoke preset's small regime (length 5, d_model 32): 1 layer x r in {0.5, 0.9}.
    settings = dict(epochs=args.epochs, n_train=args.n_train)
    first = preset("smoke", seeds=[0, 1], **settings)
    print(f"plan, 2 seeds per cell: {describe(plan_sweep(first, args.out))} in {args.out}")
    result = run_sweep(first, args.out, workers=args.workers, progress=False, report=False)
    print(f"trained: {len(result.rows) - result.n_cached} runs ({result.n_cached} cached)")

    # Growing the grid (more seeds) keeps the study: its finished runs are cache hits.
    grown = preset("smoke", seeds=list(range(args.seeds)), **settings)
    print(f"plan, {args.seeds} seeds per cell: {describe(plan_sweep(grown, args.out))}")
    result = run_sweep(grown, args.out, workers=args.workers, progress=False, report=False)
    print(f"trained: {len(result.rows) - result.n_cached} runs ({result.n_cached} cached)")

    report = write_report(args.out, compare=[("r=0.5", "r=0.9")])
    return report["paths"]["table_md"]


if __name__ == "__main__":
    main()
