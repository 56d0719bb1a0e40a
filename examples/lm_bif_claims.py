"""The language-model claims on the testbed: class-to-class influence across checkpoints
dense through the induction transition, for several training seeds (resumable). The command
line of :mod:`interp_toolkit.studies.lm.claims_study` (its docstring says what is cached where).

    python examples/lm_bif_claims.py --stage cost        # CPU seconds of one checkpoint's BIF
    python examples/lm_bif_claims.py --stage calibrate   # eps sweep at the transition (seed 0)
    python examples/lm_bif_claims.py --stage run         # train + BIF, cached per checkpoint
    python examples/lm_bif_claims.py --stage report --docs docs/lm_bif   # CSV, figures, peaks, verdicts
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from interp_toolkit.cli import run_script
from interp_toolkit.errors import UserError
from interp_toolkit.studies.lm.claims_study import (
    ClaimsStudyConfig,
    calibrate_claims,
    claims_cost,
    report_claims,
    run_claims,
)
from interp_toolkit.userfiles import check_output_dir


def _at_least(low: int) -> Any:
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value
    return parse


def _positive_number(text: str) -> float:
    value = float(text)
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text}")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one error: line and exit 2, as the commands do
        raise UserError(f"{message} (see --help)")


def main(argv: list[str] | None = None) -> None:
    parser = _Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", choices=["cost", "calibrate", "run", "report"], required=True)
    parser.add_argument("--out", type=Path, default=Path("runs/lm_bif_claims"))
    parser.add_argument("--docs", type=Path, default=Path("docs/lm_bif"))
    parser.add_argument("--seeds", type=_at_least(0), nargs="+", default=[0, 1, 2])
    parser.add_argument("--chains", type=_at_least(2), default=8)
    parser.add_argument("--draws", type=_at_least(2), default=200)
    parser.add_argument("--burn-in", type=_at_least(0), default=200)
    parser.add_argument("--eps", type=_positive_number, default=None, help="default: calibration.json's, else 1e-4")
    parser.add_argument("--gamma", type=_positive_number, default=None, help="default: calibration.json's, else 100")
    parser.add_argument("--coarse", type=_at_least(1), default=100, help="BIF every this many steps outside the "
                                                                         "transition")
    parser.add_argument(
        "--steps", type=_at_least(0), nargs="+", default=None,
        help="only these checkpoint steps, in this order (default: the transition first, then --coarse)",
    )
    parser.add_argument("--total-steps", type=_at_least(1), default=1000, help="the testbed's training steps")
    parser.add_argument("--checkpoint-every", type=_at_least(1), default=25,
                        help="the testbed's checkpoint spacing (log-spaced below it)")
    parser.add_argument("--cost-draws", type=_at_least(2), default=10, help="draws (and burn-in) of the cost / "
                                                                            "calibration runs")
    parser.add_argument("--calibrate-eps", type=_positive_number, nargs="+", default=[1e-4, 3e-4, 1e-3])
    parser.add_argument("--calibrate-gamma", type=_positive_number, nargs="+", default=[100.0, 300.0])
    args = parser.parse_args(argv)
    check_output_dir(args.out, "--out")  # /dev/null or a file: refused before any training
    if args.stage == "report":
        check_output_dir(args.docs, "--docs")
        report_claims(args.out, args.docs)
        return
    config = ClaimsStudyConfig(**{k: v for k, v in vars(args).items() if k not in ("stage", "docs")})
    torch.set_num_threads(1)
    if args.stage == "cost":
        print(json.dumps(claims_cost(config)))
    elif args.stage == "calibrate":
        print(calibrate_claims(config))
    else:
        run_claims(config)


if __name__ == "__main__":
    sys.exit(run_script(main))  # the commands' contract: one error: line and exit 2 on bad input
