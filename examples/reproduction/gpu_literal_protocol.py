"""The 2-layer headline slice at the paper's literal protocol, on one GPU.

The paper states n = 16,384, 2 layers, d_model 64, d_ff 128, AdamW with weight decay 0.1 and
15,000 epochs; the rest is this project's choice (the ``paper`` preset's: length 10, values
0..9, full batch, lr 1e-3, betas (0.9, 0.98), 2 heads). This script trains r = 0.5 and r = 0.9
at 8 fresh model seeds each (300-307) on a fresh dataset (data seed 300; stacked seeds share
one dataset, so a dataset per seed would mean a job per seed), every cell's seeds stacked in
one job on the GPU, and writes ``OUT/outcomes.csv`` (and the
rate table) that ``interp-toolkit report`` reads::

    python benchmarks/gpu_slice.py                       # measure seed-epochs/s at K = 8 on this GPU
    python examples/reproduction/gpu_literal_protocol.py --rate 2600 --out runs/literal_2L
    python examples/reproduction/gpu_literal_protocol.py --dry --out /tmp/literal   # the logic on a CPU

Before any training it prints the expected wall time, 2 cells x 8 seeds x 15,000 epochs at
``--rate`` seed-epochs/s (the rate ``benchmarks/gpu_slice.py`` prints for 2 layers at K = 8),
and refuses to start when that exceeds ``--budget-s`` (default 540 s: 9 minutes), so a session
with a time limit is not spent on a run that cannot finish. Cut anyway, it resumes: rerun the
same command and every run continues from its last saved state (a sweep's run directories).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from interp_toolkit.cli import run_script
from interp_toolkit.errors import UserError

SEEDS = list(range(300, 308))
EPOCHS = 15_000
CELLS = 2  # r = 0.5 and r = 0.9


def sweep_config(dry: bool, device: str):
    """The slice's :class:`~interp_toolkit.studies.grid.config.SweepConfig` (tiny under ``dry``)."""
    from interp_toolkit.studies.grid.config import SweepConfig

    if dry:
        return SweepConfig(name="literal_2L_dry", tasks=["max_parity_sum_parity"], ratios=[0.5, 0.9], n_layers=[2],
                           n_heads=[2], weight_decays=[0.1], seeds=SEEDS[:2],
                           task={"seq_len": 4, "n_values": 5, "n_train": 64, "n_eval": 16, "seed": 300},
                           model={"d_model": 16, "d_mlp": 32},
                           train={"epochs": 3, "eval_every": 1, "checkpoint_every": 3}, seeds_per_process=2,
                           device="cpu")
    return SweepConfig(name="literal_2L", tasks=["max_parity_sum_parity"], ratios=[0.5, 0.9], n_layers=[2],
                       n_heads=[2], weight_decays=[0.1], seeds=SEEDS,
                       task={"seq_len": 10, "n_values": 10, "n_train": 16_384, "n_eval": 2_048, "seed": 300},
                       model={"d_model": 64, "d_mlp": 128},
                       train={"epochs": EPOCHS, "lr": 1e-3, "eval_every": 100, "checkpoint_every": 1_000},
                       seeds_per_process=len(SEEDS), device=device)


def expected_seconds(rate: float, n_seeds: int = len(SEEDS), epochs: int = EPOCHS) -> float:
    """Wall seconds of the slice at ``rate`` seed-epochs/s (one cell's stacked job at a time)."""
    return CELLS * n_seeds * epochs / rate


def run(args: argparse.Namespace) -> int:
    from interp_toolkit.studies.report.write import write_report
    from interp_toolkit.studies.sweep.run import run_sweep

    cfg = sweep_config(args.dry, args.device)
    if not args.dry:
        if args.rate is None:
            raise UserError("--rate is needed: the 2-layer seed-epochs/s at K = 8 that benchmarks/gpu_slice.py "
                            "prints on this GPU (the slice is sized from it)")
        seconds = expected_seconds(args.rate)
        print(f"expected: {CELLS} cells x {len(SEEDS)} seeds x {EPOCHS:,} epochs at {args.rate:g} seed-epochs/s "
              f"= {seconds:.0f} s", flush=True)
        if seconds > args.budget_s:
            raise UserError(f"the slice needs ~{seconds:.0f} s at --rate {args.rate:g}, over --budget-s "
                            f"{args.budget_s:g}; run it where it fits (or raise --budget-s: it resumes if cut)")
    study = Path(args.out) / "study"
    result = run_sweep(cfg, study_dir=study, workers=1, progress=not args.dry, report=False)
    if result.failed:
        raise UserError(f"{len(result.failed)} runs failed, the first: {result.failed[0]['error']} (rerun to retry; "
                        f"finished runs are kept)")
    report = write_report(study, Path(args.out), print_table=True, rate_axis="categorical")
    print(f"outcomes: {report['paths']['outcomes_csv']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/literal_2L"))
    parser.add_argument("--rate", type=float, default=None,
                        help="2-layer seed-epochs/s at K = 8, from benchmarks/gpu_slice.py on this GPU")
    parser.add_argument("--budget-s", type=float, default=540.0, help="refuse to start above this (default 540)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dry", action="store_true", help="tiny shapes on the CPU: the script's logic only")
    return run_script(lambda: run(parser.parse_args(argv)), argv, "gpu_literal_protocol.py")


if __name__ == "__main__":
    sys.exit(main())
