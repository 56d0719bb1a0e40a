"""Command line: Bayesian influence of MPSP training examples on query losses at a checkpoint.

``interp-toolkit bif ...`` (flags from :class:`BIFCommandConfig`), or run standalone::

    python -m interp_toolkit.cli.bif CHECKPOINT --task-config task.json   # results in RUN_DIR/analyses/bif
    python -m interp_toolkit.cli.bif CHECKPOINT --calibrate --calibrate-eps 1e-5 1e-4 1e-3

The data is the task the checkpoint was trained on, read from its run record
(:mod:`interp_toolkit.runs.record`; ``RUN/checkpoints/epoch_*.safetensors``). A checkpoint
outside a run needs ``--task-config`` (an ``MPSPConfig`` as JSON); given beside a run
record, ``--task-config`` must name the same task (else the command is refused: the model
never saw that data). Writes a cached :class:`~interp_toolkit.analyses.bif.BIFResult`
(``bif_<hash>/bif.safetensors``, ``bif.png``, ``diagnostics.png``) and ``summary.json`` with
the task config used, where it came from, the mean BIF of shortcut-consistent vs
shortcut-inconsistent training examples on the query loss (negative = helpful) and the
convergence verdict. With ``--calibrate``: a sweep of eps x gamma (x n_beta) instead, written to
``calibration.json`` / ``calibration.png`` with the recommended setting. The work is done by
:mod:`interp_toolkit.studies.bif.checkpoint`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

from interp_toolkit.config import parse_config
from interp_toolkit.errors import UserError
from interp_toolkit.studies.bif.checkpoint import (
    BIFCommandConfig,
    calibration_lines,
    compute_bif_summary,
    readout_example_loss,
    task_for_checkpoint,
)

__all__ = ["BIFCommandConfig", "DESCRIPTION", "compute_bif_summary", "main", "parse",
           "readout_example_loss", "run_config", "task_for_checkpoint"]

DESCRIPTION = ("Bayesian influence of MPSP training examples on query losses at a checkpoint (a "
               ".safetensors file, or a run directory: its last checkpoint).")


def parse(argv: Sequence[str], prog: str = "interp-toolkit bif") -> BIFCommandConfig:
    """``argv`` (after ``bif``) -> a validated :class:`BIFCommandConfig`."""
    config = parse_config(BIFCommandConfig, argv, prog=prog, description=DESCRIPTION)
    if config.checkpoint is None:
        raise UserError("bif needs a CHECKPOINT (a .safetensors file or a run directory) as its first argument")
    if config.checkpoint.is_dir():
        config.checkpoint = last_checkpoint(config.checkpoint)
    return config


def last_checkpoint(directory: Path) -> Path:
    """The last checkpoint of a run directory (``RUN/checkpoints/epoch_*.safetensors``).

    Raises:
        UserError: ``directory`` holds no checkpoint (names it and what was expected).
    """
    from interp_toolkit.runs.resume import list_checkpoints

    checkpoints = list_checkpoints(directory)
    if not checkpoints:
        raise UserError(f"{directory} is a directory without checkpoints; expected a .safetensors checkpoint "
                        f"or a run directory with {directory}/checkpoints/epoch_*.safetensors")
    return checkpoints[-1][1]


def run_config(config: BIFCommandConfig) -> int:
    """The ``bif`` handler: computes, prints the task used, the mean BIFs and the convergence
    verdict (or, with ``--calibrate``, the sweep and its recommendation); returns 0."""
    if config.calibrate:
        from interp_toolkit.studies.bif.checkpoint import calibrate_checkpoint

        print(calibration_lines(calibrate_checkpoint(config)))
        return 0
    print(f"checkpoint: {config.checkpoint}")
    summary = compute_bif_summary(config)
    print(f"task ({summary['task_source']}): {json.dumps(summary['task'], sort_keys=True)}")
    print(f"mean BIF of the training examples on {summary['query']}:")
    print(json.dumps(summary["mean_bif_on_query_loss"], indent=2))
    convergence = summary["convergence"]
    print(summary["verdict"])
    if not convergence["converged"]:
        print("; ".join(convergence["warnings"]))
    print(f"wrote {summary['result_dir']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point, ``python -m interp_toolkit.cli.bif ...``: ``interp-toolkit bif ...``."""
    from interp_toolkit.cli import main as cli_main

    return cli_main(["bif", *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    raise SystemExit(main())
