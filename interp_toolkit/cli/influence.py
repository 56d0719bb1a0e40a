"""Command line: which training examples drive an MPSP run out of its shortcut.

``interp-toolkit influence RUN_DIR ...`` (flags from :class:`InfluenceCommandConfig`): Bayesian
influence of the run's training examples (shortcut-consistent vs anti-shortcut; memorized
or not where the checkpoint has not learned the rule) on the adversarial and validation
losses at every checkpoint (or ``--epochs``), with jackknife errors, SGLD diagnostics, the
within/between-phase split by the run's own phases and the gradient amplification of the
minority at the same epochs. Writes ``influence.csv``, ``influence.png`` and
``summary.json`` under ``--out`` (default ``RUN_DIR/analyses/influence``), cached per
checkpoint. A command of its own rather than an ``analyze`` kind: it needs the run's
history (its phases from the outcome code) and keeps per-example values beside the table.
The work is done by :mod:`interp_toolkit.studies.influence.measure`.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Sequence

import tyro

# the inherited field's type, so that InfluenceCommandConfig's signature resolves in this module (pdoc)
from interp_toolkit.analyses.bif.adaptive import AdaptiveConfig  # noqa: F401
from interp_toolkit.analyses.bif.config import (
    LocalizeConfig,  # noqa: F401
    SamplerConfig,  # noqa: F401
)
from interp_toolkit.config import parse_config, required_positional
from interp_toolkit.errors import UserError
from interp_toolkit.studies.influence.measure import InfluenceConfig

__all__ = ["DESCRIPTION", "InfluenceCommandConfig", "main", "parse", "run_config"]

DESCRIPTION = ("Bayesian influence of a run's training examples (consistent vs anti-shortcut: MPSP, or a task "
               "of your own with .agrees) on its "
               "adversarial and validation losses across checkpoints, beside the gradient amplification.")


@dataclass
class InfluenceCommandConfig(InfluenceConfig):
    """Settings of ``interp-toolkit influence`` (every field is a flag; ``--config FILE`` too): what
    is measured (the fields of :class:`~interp_toolkit.studies.influence.measure.InfluenceConfig`)
    and the command's own.

    Attributes:
        run_dir: A run directory (checkpoints, metrics.jsonl, run.json) of MPSP or of a task with .agrees.
        out: Output / cache directory (default RUN_DIR/analyses/influence).
        device: cpu, cuda, cuda:N or auto.
        format: Figure file format (png, svg or pdf).
        calibrate: Instead of the study: sweep eps x gamma (x n_beta) at its first checkpoint,
            gate every setting for locality and recommend a local one (calibration_<key>.json
            and its figure under --out).
        calibrate_eps: Step sizes of the sweep (default: eps / 10, eps, eps * 10).
        calibrate_gamma: Localization strengths of the sweep (default: gamma).
        calibrate_n_beta: n * beta of the sweep (default: n_beta).
    """

    run_dir: Annotated[Path | None, tyro.conf.Positional, required_positional("RUN_DIR")] = None
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
        from interp_toolkit.cli.bif import check_calibration_grids

        check_calibration_grids(self)
        for name in ("run_dir", "out"):
            if isinstance(getattr(self, name), str):
                setattr(self, name, Path(getattr(self, name)))

    def settings(self) -> InfluenceConfig:
        """What is measured, as the library takes it."""
        return InfluenceConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(InfluenceConfig)})


def parse(argv: Sequence[str], prog: str = "interp-toolkit influence") -> InfluenceCommandConfig:
    """``argv`` (after ``influence``) -> a validated :class:`InfluenceCommandConfig`."""
    config = parse_config(InfluenceCommandConfig, argv, prog=prog, description=DESCRIPTION)
    if config.run_dir is None:
        raise UserError("influence needs a RUN_DIR (a run directory) as its first argument")
    return config


def run_config(config: InfluenceCommandConfig) -> int:
    """The ``influence`` handler: computes (or reads the cache), prints the phases, the anti and
    consistent groups' BIF on the adversarial loss per epoch and the files written; returns 0."""
    from interp_toolkit.studies.influence.calibrate import calibrate_influence
    from interp_toolkit.studies.influence.measure import run_influence

    if config.calibrate:
        from interp_toolkit.studies.bif.checkpoint import calibration_lines

        print(calibration_lines(calibrate_influence(
            config.run_dir, config.settings(), eps=config.calibrate_eps, gamma=config.calibrate_gamma,
            n_beta=config.calibrate_n_beta, out=config.out, device=config.device, format=config.format)))
        return 0
    result = run_influence(config.run_dir, config.settings(), out=config.out, device=config.device,
                           format=config.format, progress=config.sampler.progress)
    for line in result.phases:
        print(line)
    print(f"{'epoch':>6} {'phase':<16} {'group':<20} {'BIF on adv loss':>22} {'amplification':>14}  sampling verdict")
    for row in result.rows:
        if row["query_set"] == "adv":
            climb = row.get("climb")
            gate = row["verdict"] + ("" if climb is None else f" (climb {climb:.1%})")
            print(f"{row['epoch']:>6} {row['phase']:<16} {row['train_group']:<20} "
                  f"{row['bif']:>+11.4g} ± {row['stderr']:<8.2g} {row['amplification']:>14.3g}  {gate}")
    failed = sorted({row["epoch"] for row in result.rows if row["verdict"] != "converged and local"})
    if failed:
        print(f"epochs {failed}: not converged and local, so their BIFs are not evidence; raise --max-steps, or "
              "sweep settings with `interp-toolkit influence RUN_DIR --calibrate`")
    print(f"computed {len(result.computed)} checkpoint(s), {len(result.cache_hits)} from the cache")
    print(f"wrote {result.csv_path} and {result.figure_path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point, ``python -m interp_toolkit.cli.influence ...``."""
    from interp_toolkit.cli import main as cli_main

    return cli_main(["influence", *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    raise SystemExit(main())
