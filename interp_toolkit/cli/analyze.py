"""The ``analyze`` subcommand: ``interp-toolkit analyze RUN_DIR --analysis NAME [options]``.

Flags are generated from :class:`AnalyzeCommandConfig` (``--config FILE`` sets them too);
:func:`run_config` runs the analysis over the run's checkpoints, on the data rebuilt from the
run record's task (checked against the run's data fingerprints), and writes
``RUN_DIR/analyses/<name>/<name>.csv`` and ``.png``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Sequence

import tyro

from interp_toolkit.config import Config, parse_config, required_positional
from interp_toolkit.errors import UserError

DESCRIPTION = ("Run fingerprints, ablation, patching, gradients, weight norms or near misses (wrong examples "
               "grouped by task features) over every checkpoint of a run "
               "(results cached per checkpoint and config; reruns are cache hits). The data is rebuilt "
               "from the run record's task config and checked against the run's data fingerprints.")
# Names of interp_toolkit.analyses.over_checkpoints.ANALYSES and ablation.METHODS, spelled out
# so that --help imports no torch (a test keeps them equal).
ANALYSIS_NAMES = ("ablation", "fingerprints", "gradients", "near_misses", "patching", "resample_ablation_damage",
                  "weight_norms")
ABLATION_METHODS = ("zero", "mean", "resample")

# option -> analyses it applies to
_OPTION_SCOPE = {
    "split": ("fingerprints", "gradients"),
    "method": ("ablation",),
    "reference": ("ablation",),
    "split_names": ("ablation", "near_misses"),
    "source": ("patching", "resample_ablation_damage"),
    "target": ("patching", "resample_ablation_damage"),
    "positions": ("patching", "resample_ablation_damage", "ablation"),
    "metric": ("resample_ablation_damage",),
    "chunk_size": ("gradients",),
    "components": ("ablation", "patching", "resample_ablation_damage"),
}


@dataclass
class AnalyzeCommandConfig(Config):
    """Settings of ``interp-toolkit analyze`` (every field is a flag; ``--config FILE`` sets them too).

    Attributes:
        run_dir: Run directory written by `interp-toolkit train`.
        analysis: Which analysis.
        epochs: Checkpoint epochs (default: all).
        last: Only the last checkpoint.
        n: Examples per split used by the analysis.
        split: fingerprints/gradients: split to measure on (default train).
        method: ablation: zero, mean or resample (default mean).
        reference: ablation: split giving mean/resampled activations (default train; a
            split the run's task lacks is refused, and so is --reference with --method zero).
        split_names: ablation: splits measured (default: all but reference); near_misses:
            splits grouped (default: all). A split (or component, or epoch) listed twice is refused.
        components: ablation/patching: e.g. L0H1 attn0 mlp1 resid_pre0.
        source: patching: source split (default val).
        target: patching: target split (default adv).
        positions: patching: each position separately or all at once (ablation: 'all' only).
        metric: resample_ablation_damage metric (patching always uses the minimal pairs'
            source-vs-target label logit difference).
        chunk_size: gradients: examples per vmap chunk (default 256).
        out_dir: Output directory (default RUN_DIR/analyses/<analysis>).
        plot: Write the figure.
        format: Figure file format (png, svg or pdf).
        progress: Show progress bars.
        device: cpu, cuda, cuda:N or auto.
        wandb: Log the analysis's table and figure to the run's W&B run as an artifact
            (offline: under the run directory, no network; the W&B run id is the run key).
        wandb_project: W&B project (with --wandb).
        wandb_entity: W&B entity (team or user); unset: your default entity.
        wandb_group: W&B group; unset: none.
    """

    run_dir: Annotated[Optional[Path], tyro.conf.Positional, required_positional("RUN_DIR")] = None  # noqa: UP007
    analysis: Optional[Literal["ablation", "fingerprints", "gradients", "near_misses", "patching",  # noqa: UP007
                               "resample_ablation_damage", "weight_norms"]] = None
    epochs: Optional[tuple[int, ...]] = None  # noqa: UP007
    last: bool = False
    n: Optional[int] = None  # noqa: UP007
    split: Optional[str] = None  # noqa: UP007
    method: Optional[Literal["zero", "mean", "resample"]] = None  # noqa: UP007
    reference: Optional[str] = None  # noqa: UP007
    split_names: Optional[tuple[str, ...]] = None  # noqa: UP007
    components: Optional[tuple[str, ...]] = None  # noqa: UP007
    source: Optional[str] = None  # noqa: UP007
    target: Optional[str] = None  # noqa: UP007
    positions: Optional[Literal["each", "all"]] = None  # noqa: UP007
    metric: Optional[Literal["logit_diff", "loss", "accuracy"]] = None  # noqa: UP007
    chunk_size: Optional[int] = None  # noqa: UP007
    out_dir: Optional[Path] = None  # noqa: UP007
    plot: bool = True
    format: Literal["png", "svg", "pdf"] = "png"
    progress: bool = True
    device: str = "cpu"
    wandb: Optional[Literal["offline", "online"]] = None  # noqa: UP007
    wandb_project: str = "interp-toolkit"
    wandb_entity: Optional[str] = None  # noqa: UP007
    wandb_group: Optional[str] = None  # noqa: UP007

    def __post_init__(self) -> None:
        for name, choices in (("analysis", ANALYSIS_NAMES), ("method", ABLATION_METHODS),
                              ("positions", ("each", "all")), ("format", ("png", "svg", "pdf")),
                              ("metric", ("logit_diff", "loss", "accuracy"))):
            value = getattr(self, name)
            self.check(name, value is None or value in choices, f"one of {', '.join(choices)}")
        for name in ("epochs", "split_names", "components"):
            if getattr(self, name) is not None:
                setattr(self, name, tuple(getattr(self, name)))
                # A value listed twice would be measured (and written) twice: never what was meant.
                repeated = sorted({str(v) for v in getattr(self, name) if getattr(self, name).count(v) > 1})
                if repeated:
                    raise UserError(f"--{name.replace('_', '-')} lists {', '.join(repeated)} more than once; "
                                    "expected each value once")
        for name in ("run_dir", "out_dir"):
            if isinstance(getattr(self, name), str):
                setattr(self, name, Path(getattr(self, name)))

    def run_and_analysis(self) -> tuple[Path, str]:
        """``(run_dir, analysis)``; a user error names whichever is missing."""
        if self.run_dir is None:
            raise UserError("analyze needs a RUN_DIR (a directory written by `interp-toolkit train`)")
        if self.analysis is None:
            raise UserError(f"analyze needs --analysis, one of {', '.join(ANALYSIS_NAMES)}")
        if self.last and self.epochs:
            raise UserError("--last and --epochs are exclusive")
        return self.run_dir, self.analysis


def parse(argv: Sequence[str], prog: str = "interp-toolkit analyze") -> AnalyzeCommandConfig:
    """``argv`` (after ``analyze``) -> a validated :class:`AnalyzeCommandConfig`."""
    config = parse_config(AnalyzeCommandConfig, argv, prog=prog, description=DESCRIPTION)
    config.run_and_analysis()
    return config


def _config(args: AnalyzeCommandConfig) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for option, scope in _OPTION_SCOPE.items():
        value = getattr(args, option, None)
        if value is None:
            continue
        if args.analysis not in scope:
            flag = "--" + option.replace("_", "-")
            raise UserError(f"{flag} applies to {', '.join(scope)} only, not to {args.analysis}")
        config[option] = value
    if "reference" in config and args.method == "zero":
        raise UserError(f"--reference {config['reference']} applies to --method mean or resample; zero "
                        "ablation uses no reference split")
    if "positions" in config:
        if args.analysis == "ablation" and config["positions"] != "all":
            raise UserError("--positions each is for patching; ablation ablates all positions at once")
        config["positions"] = None if config["positions"] == "all" else "each"
    for name in ("split_names", "components"):
        if name in config:
            config[name] = list(config[name])
    if args.n is not None:
        config["n"] = args.n
    return config


def run_config(args: AnalyzeCommandConfig) -> int:
    """Run the ``analyze`` subcommand; returns 0 (bad input raises a user error: exit 2 in ``main``)."""
    import json

    from interp_toolkit.analyses.over_checkpoints import over_checkpoints
    from interp_toolkit.devices import resolve_device
    from interp_toolkit.loggers import wandb_logger_from_flags
    from interp_toolkit.runs.record import read_record, task_dict

    run_dir, analysis = args.run_and_analysis()
    if args.out_dir is not None:
        from interp_toolkit.userfiles import check_output_dir

        check_output_dir(args.out_dir, "--out-dir")  # a file there fails now, not after the analysis
    config = _config(args)
    device = resolve_device(args.device or "cpu")
    record = read_record(run_dir)  # a missing or foreign directory fails here, before any work
    wandb_logger = wandb_logger_from_flags(args)  # no W&B or no API key: refused before the analysis runs
    print("task (from the run record): " + json.dumps(task_dict(record) or {}, sort_keys=True))
    result = over_checkpoints(analysis, run_dir, epochs=list(args.epochs) if args.epochs else None,
                              last=args.last, config=config, out_dir=args.out_dir, plot=args.plot,
                              progress=args.progress, device=device, figure_format=args.format)
    print(f"{analysis}: {len(result.computed)} checkpoint(s) computed, {len(result.cache_hits)} from cache")
    print(f"table: {result.csv_path}")
    if result.png_path is not None:
        print(f"plot:  {result.png_path}")
    if wandb_logger is not None:
        files = [p for p in (result.csv_path, result.png_path) if p is not None]
        artifact = wandb_logger.log_analysis(run_dir, result.csv_path.stem if result.csv_path else analysis, files)
        print(f"W&B ({wandb_logger.mode}): artifact {artifact.name} in project {wandb_logger.project}")
    return 0


__all__ = ["ABLATION_METHODS", "ANALYSIS_NAMES", "AnalyzeCommandConfig", "DESCRIPTION", "parse",
           "run_config"]
