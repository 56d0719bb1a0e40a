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

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Sequence

import tyro

# the inherited fields' types, so that BIFCommandConfig's signature resolves in this module (pdoc)
from interp_toolkit.analyses.bif.adaptive import AdaptiveConfig  # noqa: F401
from interp_toolkit.analyses.bif.config import (
    LocalizeConfig,  # noqa: F401
    SamplerConfig,  # noqa: F401
)
from interp_toolkit.config import parse_config, required_positional
from interp_toolkit.errors import UserError
from interp_toolkit.studies.bif.checkpoint import (
    CheckpointBIFConfig,
    calibration_lines,
    compute_bif_summary,
)

__all__ = ["BIFCommandConfig", "DESCRIPTION", "check_calibration_grids", "main", "parse", "run_config"]

DESCRIPTION = ("Bayesian influence of training examples (MPSP or a task of your own) on query losses at a "
               "checkpoint (a .safetensors file, or a run directory: its last checkpoint).")


def check_calibration_grids(config: Any) -> None:
    """Normalize and check a command config's ``calibrate_eps`` / ``calibrate_gamma`` /
    ``calibrate_n_beta`` (tuples of numbers > 0; gamma >= 0), as ``bif`` and ``bif-lm`` take
    them; the config's own ``check`` names a bad one."""
    for name in ("calibrate_eps", "calibrate_gamma", "calibrate_n_beta"):
        values = tuple(getattr(config, name))
        setattr(config, name, values)
        config.check(name, all(isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v >= 0
                               and (v > 0 or name == "calibrate_gamma") for v in values),
                     "numbers > 0 (gamma: >= 0)")


@dataclass
class BIFCommandConfig(CheckpointBIFConfig):
    """Settings of ``interp-toolkit bif`` (every field is a flag; ``--config FILE`` sets them too):
    what is measured (the fields of
    :class:`~interp_toolkit.studies.bif.checkpoint.CheckpointBIFConfig`), and the command's own.

    Attributes:
        checkpoint: A .safetensors checkpoint (interp_toolkit format), or a run directory (its last).
        task_config: An MPSP task config as JSON, for an MPSP checkpoint outside a run (default: the run
            record's task, MPSP or custom; refused if it differs).
        out: Output / cache directory (default: beside the checkpoint's run,
            RUN_DIR/analyses/bif; for a checkpoint outside a run, analyses/bif beside it).
        device: cpu, cuda, cuda:N or auto.
        format: Figure file format (png, svg or pdf; the cached result always has bif.png).
        calibrate: Instead of one BIF: sweep eps x gamma (x n_beta) and recommend a setting.
        calibrate_eps: Step sizes of the sweep (default: eps / 10, eps, eps * 10).
        calibrate_gamma: Localization strengths of the sweep (default: gamma).
        calibrate_n_beta: n * beta of the sweep (default: n_beta).
    """

    checkpoint: Annotated[Path | None, tyro.conf.Positional, required_positional("CHECKPOINT")] = None
    task_config: Path | None = None
    out: Path | None = None
    device: str = "cpu"
    format: Literal["png", "svg", "pdf"] = "png"
    calibrate: bool = False
    calibrate_eps: tuple[float, ...] = ()
    calibrate_gamma: tuple[float, ...] = ()
    calibrate_n_beta: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check("format", self.format in ("png", "svg", "pdf"), "one of png, svg, pdf")
        check_calibration_grids(self)
        for name in ("checkpoint", "task_config", "out"):
            if isinstance(getattr(self, name), str):
                setattr(self, name, Path(getattr(self, name)))

    def settings(self) -> CheckpointBIFConfig:
        """What is measured, as the library takes it."""
        return CheckpointBIFConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(CheckpointBIFConfig)})

    def place(self) -> dict[str, Any]:
        """The keyword arguments of the library calls that say where: task, output, device, format."""
        return {"task_config": self.task_config, "out": self.out, "device": self.device, "format": self.format}


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

        print(calibration_lines(calibrate_checkpoint(
            config.checkpoint, config.settings(), eps=config.calibrate_eps, gamma=config.calibrate_gamma,
            n_beta=config.calibrate_n_beta, **config.place())))
        return 0
    print(f"checkpoint: {config.checkpoint}")
    summary = compute_bif_summary(config.checkpoint, config.settings(), **config.place())
    print(f"task ({summary['task_source']}): {json.dumps(summary['task'], sort_keys=True)}")
    print(f"mean BIF of the training examples on {summary['query']}:")
    for group, value in summary["mean_bif_on_query_loss"].items():
        stderr = summary["mean_bif_on_query_loss_stderr"].get(group)
        shown = "n/a (no such example)" if value is None else (
            f"{value:+.4g} +- {stderr:.2g} (jackknife)" if stderr is not None else f"{value:+.4g}")
        print(f"  {group}: {shown}")
    convergence = summary["convergence"]
    print(summary["verdict"])
    if not convergence["converged"]:
        print("; ".join(convergence["warnings"]))
    locality = summary["locality"]
    print(f"sampling verdict: {summary['sampling_verdict']}")
    if locality is not None:
        print(f"locality: {describe_locality(locality)}")
    print(f"wrote {summary['result_dir']}")
    return 0


def describe_locality(locality: dict[str, Any]) -> str:
    """The locality line of a command's output, from a summary's ``locality`` entry."""
    from interp_toolkit.analyses.bif.locality import Locality

    return Locality.from_dict(locality).describe()


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point, ``python -m interp_toolkit.cli.bif ...``: ``interp-toolkit bif ...``."""
    from interp_toolkit.cli import main as cli_main

    return cli_main(["bif", *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    raise SystemExit(main())
