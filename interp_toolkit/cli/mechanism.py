"""The ``mechanism`` subcommand: ``interp-toolkit mechanism RUN_DIR [--out FIG] [--format png|svg|pdf]``.

Runs :func:`interp_toolkit.studies.mechanism.measure.mechanism_over_checkpoints` on every checkpoint
of a run directory (written by ``train`` or ``sweep``; results cached per checkpoint, so a
rerun computes nothing) and writes the seven-panel mechanism figure, its tidy table
(``.csv``: epoch, head, quantity, value) and its settings and outcome (``.json``) side by
side (default ``RUN_DIR/mechanism.<format>``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, Optional, Sequence

import tyro

from interp_toolkit.config import Config, parse_config, required_positional
from interp_toolkit.errors import UserError
from interp_toolkit.studies.mechanism.measure import MechanismConfig

DESCRIPTION = ("Accuracies with the two phases marked, gradient cosine, amplification, QK / OV fingerprints, "
               "minimal-pair patching and ablation per head, over every checkpoint of a run directory "
               "(MPSP, or a task of your own), "
               "on one log-scaled epoch axis (one colour per head). Analyses are cached per checkpoint: a rerun "
               "is a cache hit. Writes the figure, a CSV (epoch, head, quantity, value) and a JSON beside it.")
FORMATS = ("png", "svg", "pdf")


@dataclass
class MechanismCommandConfig(Config):
    """Settings of ``interp-toolkit mechanism`` (every field is a flag; ``--config FILE`` sets them too).

    Attributes:
        run_dir: Run directory (run.json, metrics.jsonl, checkpoints/) of an MPSP or custom-task run.
        out: Figure path (default RUN_DIR/mechanism.<format>); the .csv and .json go beside it.
        format: Figure format (default: the suffix of --out, else png).
        epochs: Checkpoint epochs to analyse (default: all).
        device: cpu, cuda, cuda:N or auto (where checkpoints are loaded).
        threads: Torch CPU threads (1 suits the small MPSP models; on a busy 2-core machine a
            second thread made the analyses several times slower).
        progress: Show progress bars.
        settings: Sample sizes of the analyses.
        wandb: Log the figure and its table to the run's W&B run as an artifact (offline:
            under the run directory, no network; the W&B run id is the run key).
        wandb_project: W&B project (with --wandb).
        wandb_entity: W&B entity (team or user); unset: your default entity.
        wandb_group: W&B group; unset: none.
    """

    run_dir: Annotated[Optional[Path], tyro.conf.Positional, required_positional("RUN_DIR")] = None  # noqa: UP007
    out: Optional[Path] = None  # noqa: UP007
    format: Optional[Literal["png", "svg", "pdf"]] = None  # noqa: UP007
    epochs: Optional[tuple[int, ...]] = None  # noqa: UP007
    device: str = "cpu"
    threads: int = 1
    progress: bool = True
    settings: MechanismConfig = field(default_factory=MechanismConfig)
    wandb: Optional[Literal["offline", "online"]] = None  # noqa: UP007
    wandb_project: str = "interp-toolkit"
    wandb_entity: Optional[str] = None  # noqa: UP007
    wandb_group: Optional[str] = None  # noqa: UP007

    def __post_init__(self) -> None:
        self.check("threads", not isinstance(self.threads, bool) and isinstance(self.threads, int)
                   and self.threads >= 1, "a positive integer")
        self.check("format", self.format is None or self.format in FORMATS, f"one of {', '.join(FORMATS)}")
        for name in ("run_dir", "out"):
            if isinstance(getattr(self, name), str):
                setattr(self, name, Path(getattr(self, name)))
        if self.epochs is not None:
            self.epochs = tuple(self.epochs)

    def target(self) -> Path:
        """The run directory; a user error if none was given."""
        if self.run_dir is None:
            raise UserError("mechanism needs a RUN_DIR (a directory written by `interp-toolkit train` or `sweep`)")
        return self.run_dir


def parse(argv: Sequence[str], prog: str = "interp-toolkit mechanism") -> MechanismCommandConfig:
    """``argv`` (after ``mechanism``) -> a validated :class:`MechanismCommandConfig`."""
    config = parse_config(MechanismCommandConfig, argv, prog=prog, description=DESCRIPTION)
    config.target()
    return config


def figure_path(args: MechanismCommandConfig) -> tuple[Path, str]:
    """``(path, format)`` of the figure: --out and --format reconciled (UserError if they disagree)."""
    from interp_toolkit.userfiles import check_output_file

    if args.out is not None:  # x.gif would silently become x.png; a file in the way fails after the work
        check_output_file(args.out, "--out", FORMATS)
    suffix = args.out.suffix[1:].lower() if args.out is not None else ""
    if args.format is not None and suffix in FORMATS and suffix != args.format:
        raise UserError(f"--out {args.out} has suffix .{suffix} but --format is {args.format}; drop one or make "
                        "them agree")
    fmt = args.format or (suffix if suffix in FORMATS else "png")
    path = args.out if args.out is not None else args.target() / "mechanism"
    return path.with_suffix(f".{fmt}"), fmt


def phases_summary(outcome: dict) -> str:
    """The run's phase epochs in words; a phase the run never reached says so (not "None")."""
    last = outcome.get("final_epoch")
    within = f" within {last} epochs" if last is not None else ""
    shortcut, onset = outcome.get("shortcut_epoch"), outcome.get("phase2_onset_epoch")
    generalized = outcome.get("first_generalized_epoch")
    if outcome.get("favored_split") is None:
        parts = ["no shortcut phase (r at chance)"]
    else:
        parts = [f"shortcut learned at epoch {shortcut}" if shortcut is not None
                 else f"shortcut not learned{within}"]
        parts.append(f"phase 2 onset at epoch {onset}" if onset is not None else f"no phase 2 onset{within}")
    parts.append(f"generalized at epoch {generalized}" if generalized is not None else f"not generalized{within}")
    return ", ".join(parts)


def run_config(args: MechanismCommandConfig) -> int:
    """Run the ``mechanism`` subcommand; returns 0 (bad input raises a user error: exit 2 in ``main``)."""
    from interp_toolkit.devices import resolve_device
    from interp_toolkit.studies.mechanism.measure import check_run_dir, mechanism_over_checkpoints
    from interp_toolkit.studies.mechanism.plot import write_mechanism

    path, fmt = figure_path(args)
    run_dir = args.target()
    check_run_dir(run_dir)  # a missing or foreign directory fails here, before any work
    wandb_logger = None
    if args.wandb:
        from interp_toolkit.loggers import wandb_logger_from_flags

        wandb_logger = wandb_logger_from_flags(args)  # refused (no wandb, no API key) before any work
    # a GPU is checked before any work; the CPU needs no torch import (a cached rerun loads none)
    device = "cpu" if (args.device or "cpu") == "cpu" else resolve_device(args.device)
    result = mechanism_over_checkpoints(run_dir, args.settings, epochs=args.epochs, device=device,
                                        progress=args.progress, n_threads=args.threads)
    written = write_mechanism(result, path, fmt)
    outcome = result.outcome
    print(f"{len(result.checkpoint_epochs)} checkpoint(s), heads {', '.join(result.heads)}: "
          f"{result.n_computed} analyses computed, {result.n_cached} from cache")
    print(f"phases: {phases_summary(outcome)}")
    if result.near_miss.get("text"):
        print(f"short of 100%: {result.near_miss['text']}")
    last = result.last_epoch_summary()
    if last is not None:
        amplification = (
            f"minority amplification {last['amplification']:.2f}"
            if last["amplification_kind"] == "minority"
            else f"amplification (anti / consistent) {last['amplification']:.2f}"
        )
        print(f"epoch {last['epoch']}: gradient cosine {last['grad_cos']:.3f}, {amplification}")
    print(f"figure:  {written['figure']}")
    print(f"table:   {written['table']}")
    print(f"summary: {written['summary']}")
    if wandb_logger is not None:
        artifact = wandb_logger.log_analysis(run_dir, "mechanism", [written["figure"], written["table"],
                                                                    written["summary"]])
        print(f"W&B ({wandb_logger.mode}): artifact {artifact.name} in project {wandb_logger.project}")
    return 0


__all__ = ["DESCRIPTION", "MechanismCommandConfig", "figure_path", "parse", "run_config"]
