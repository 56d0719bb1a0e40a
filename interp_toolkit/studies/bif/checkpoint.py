"""Bayesian influence of MPSP training examples on query losses at one checkpoint: the
library behind ``interp-toolkit bif`` (:mod:`interp_toolkit.cli.bif` only parses and prints).

The data is the task the checkpoint was trained on, read from its run record
(:mod:`interp_toolkit.runs.record`; ``RUN/checkpoints/epoch_*.safetensors``). A checkpoint
outside a run needs ``task_config`` (an ``MPSPConfig`` as JSON); given beside a run record, it
must name the same task (else the command is refused: the model never saw that data).
:func:`compute_bif_summary` writes a cached :class:`~interp_toolkit.analyses.bif.BIFResult`
(``bif_<hash>/bif.safetensors``, ``bif.png``, ``diagnostics.png``) and ``summary.json`` (the
schema: :func:`bif_summary`); :func:`calibrate_checkpoint` runs the sampler calibration sweep
(:mod:`interp_toolkit.analyses.bif.calibration`) on the same data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro

from interp_toolkit.analyses.bif.adaptive import AdaptiveConfig
from interp_toolkit.analyses.bif.config import SamplerConfig
from interp_toolkit.config import Config, required_positional
from interp_toolkit.errors import UserError, notice

__all__ = [
    "BIFCommandConfig", "bif_summary", "calibrate_checkpoint", "calibration_lines", "check_calibration_grids",
    "checkpoint_bif_inputs", "compute_bif_summary", "readout_example_loss", "task_for_checkpoint",
]


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
class BIFCommandConfig(Config):
    """Settings of ``interp-toolkit bif`` (every field is a flag; ``--config FILE`` sets them too).

    Attributes:
        checkpoint: A .safetensors checkpoint (interp_toolkit format), or a run directory (its last).
        task_config: MPSPConfig as JSON (default: the run record's; refused if it differs).
        out: Output / cache directory (default: beside the checkpoint's run,
            RUN_DIR/analyses/bif; for a checkpoint outside a run, analyses/bif beside it).
        n_attribution: Training examples scored (rows). More than the task's training set
            holds uses the whole set, says so in a note: line, and summary.json
            records the number used (command_config) and the one asked (clipped_from).
        n_query: Query examples (columns); likewise at most the query split's size.
        query_split: Split the query examples come from.
        device: cpu, cuda, cuda:N or auto.
        format: Figure file format (png, svg or pdf; the cached result always has bif.png).
        calibrate: Instead of one BIF: sweep eps x gamma (x n_beta) and recommend a setting.
        calibrate_eps: Step sizes of the sweep (default: eps / 10, eps, eps * 10).
        calibrate_gamma: Localization strengths of the sweep (default: gamma).
        calibrate_n_beta: n * beta of the sweep (default: n_beta).
        sampler: SGLD settings (--sampler.eps, --sampler.chains, ...; short: --eps, --chains). --chains is at
            least 2: the BIF's standard error is a leave-one-chain-out jackknife, which one chain
            cannot give (it would be NaN everywhere).
        convergence: Adaptive chain length (--adaptive, the default: draws and burn-in double
            until R-hat <= 1.01 and ESS >= 100, or --max-steps SGLD steps per chain would be
            exceeded; summary.json records every round and which stopped it).
    """

    checkpoint: Annotated[Path | None, tyro.conf.Positional, required_positional("CHECKPOINT")] = None
    task_config: Path | None = None
    out: Path | None = None
    n_attribution: int = 256
    n_query: int = 64
    query_split: Literal["train", "val", "adv"] = "adv"
    device: str = "cpu"
    format: Literal["png", "svg", "pdf"] = "png"
    calibrate: bool = False
    calibrate_eps: tuple[float, ...] = ()
    calibrate_gamma: tuple[float, ...] = ()
    calibrate_n_beta: tuple[float, ...] = ()
    sampler: SamplerConfig = field(default_factory=lambda: SamplerConfig(eps=1e-3, batch_size=256))
    convergence: AdaptiveConfig = field(default_factory=AdaptiveConfig)

    def __post_init__(self) -> None:
        for name in ("n_attribution", "n_query"):
            value = getattr(self, name)
            self.check(name, isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                       "an integer >= 1")
        self.check("query_split", self.query_split in ("train", "val", "adv"), "one of train, val, adv")
        if isinstance(self.sampler.chains, int) and self.sampler.chains < 2:
            raise UserError(f"--chains {self.sampler.chains}: a BIF needs at least 2 chains (its standard error is "
                            "a leave-one-chain-out jackknife, NaN with one chain)")
        self.check("format", self.format in ("png", "svg", "pdf"), "one of png, svg, pdf")
        check_calibration_grids(self)
        for name in ("checkpoint", "task_config", "out"):
            if isinstance(getattr(self, name), str):
                setattr(self, name, Path(getattr(self, name)))


    def output_dir(self) -> Path:
        """``--out``, else ``RUN_DIR/analyses/bif`` of the checkpoint's run (or, for a
        checkpoint outside a run, ``analyses/bif`` beside it): results live with what they
        measure, not in the folder the command was started from."""
        from interp_toolkit.runs.layout import ANALYSES
        from interp_toolkit.runs.record import find_run_dir, has_record

        if self.out is not None:
            return Path(self.out)
        if self.checkpoint is None:
            raise UserError("a BIF needs a checkpoint (a .safetensors file); got none")
        checkpoint = Path(self.checkpoint)
        run_dir = checkpoint if checkpoint.is_dir() and has_record(checkpoint) else find_run_dir(checkpoint)
        return (run_dir if run_dir is not None else checkpoint.parent) / ANALYSES / "bif"


def readout_example_loss(model: Any, batch: tuple[Any, Any]) -> Any:
    """Per-example cross-entropy at the readout (last) position: a BIF ``loss_fn``."""
    import torch.nn.functional as F

    tokens, labels = batch
    return F.cross_entropy(model(tokens)[:, -1, :], labels, reduction="none")


def task_for_checkpoint(checkpoint: Path, task_config: Path | None) -> tuple[Any, str]:
    """The ``MPSPConfig`` to run ``checkpoint`` on and where it came from.

    The run record of the checkpoint's run wins; ``task_config`` is only needed (and only
    accepted when it agrees with the record) for checkpoints outside a run.

    Raises:
        UserError: If the file is missing, no task config can be found, or the given one
            names other data than the run was trained on.
    """
    from interp_toolkit.runs.record import check_task_matches, find_run_dir, record_path
    from interp_toolkit.runs.record import task_config as recorded
    from interp_toolkit.tasks.mpsp import MPSPConfig
    from interp_toolkit.userfiles import read_mapping_file

    if not checkpoint.is_file():
        raise UserError(f"checkpoint {checkpoint} does not exist (expected a .safetensors file)")
    requested = None
    if task_config is not None:
        requested = MPSPConfig.from_dict(read_mapping_file(task_config, "task config"))
    run_dir = find_run_dir(checkpoint)
    if run_dir is not None:
        if requested is not None:
            check_task_matches(run_dir, requested)
        return recorded(run_dir), str(record_path(run_dir))
    if requested is None:
        raise UserError(f"no task config for {checkpoint}: it is not inside a run directory with a run record; "
                        "pass --task-config task.json (an MPSPConfig as JSON)")
    return requested, str(task_config)


def _check_model_fits(model_cfg: Any, task: Any, checkpoint: Path) -> None:
    from interp_toolkit.tasks.custom import CustomTask

    if isinstance(task, CustomTask):  # its sizes follow its data: the token and label checks below decide
        return
    dims = task.model_dims()
    wrong = {k: (getattr(model_cfg, k), v) for k, v in dims.items() if getattr(model_cfg, k) != v}
    if wrong:
        detail = ", ".join(f"{k} {m} (task needs {t})" for k, (m, t) in wrong.items())
        raise UserError(f"checkpoint {checkpoint} was built for another task: {detail}")


def checkpoint_bif_inputs(args: BIFCommandConfig) -> dict[str, Any]:
    """Everything a BIF at ``args.checkpoint`` needs, checked before any sampling: the model,
    its metadata, the task and where it came from, the sampler config, the posterior, query
    and attribution data and the attribution rows' shortcut agreement.

    Raises:
        UserError: A missing checkpoint or task, a task of another model, or a checkpoint whose
            run key differs from its run record's.
    """
    import torch

    from interp_toolkit.checkpoint import load_checkpoint
    from interp_toolkit.devices import resolve_device
    from interp_toolkit.model import model_config_of
    from interp_toolkit.runs.record import find_run_dir, read_record, record_path
    from interp_toolkit.runs.trainer import check_label_ids, check_token_ids
    from interp_toolkit.tasks.custom import task_splits

    if args.checkpoint is None:
        raise UserError("a BIF needs a checkpoint (a .safetensors file); got none")
    config = args.sampler
    device = resolve_device(args.device or "cpu")
    checkpoint = Path(args.checkpoint)
    task, task_source = task_for_checkpoint(checkpoint, args.task_config)
    model, metadata = load_checkpoint(checkpoint, device=device)
    _check_model_fits(model_config_of(model), task, checkpoint)
    run_dir = find_run_dir(checkpoint)
    if run_dir is not None and metadata.get("run_key") not in (None, read_record(run_dir).get("key")):
        raise UserError(f"checkpoint {checkpoint} belongs to run {metadata['run_key']}, but {record_path(run_dir)} "
                        f"records run {read_record(run_dir).get('key')}")
    splits = task_splits(task)
    if args.query_split not in splits:
        raise UserError(f"--query-split {args.query_split!r}: the task of {task_source} has splits {sorted(splits)}")
    try:  # a task config of another model: refuse before any file is written
        for name, split in splits.items():
            check_token_ids(name, split.tokens, int(model.cfg.d_vocab))
            check_label_ids(name, split.labels, int(getattr(model.cfg, "d_vocab_out", model.cfg.d_vocab)))
    except UserError as err:
        raise UserError(f"the task of {task_source} does not fit checkpoint {checkpoint}: {err}") from err
    train = splits["train"]
    query = splits[args.query_split]
    used = {"n_attribution": min(args.n_attribution, int(train.labels.shape[0])),
            "n_query": min(args.n_query, int(query.labels.shape[0]))}
    clipped_from = {name: getattr(args, name) for name in used if used[name] < getattr(args, name)}
    for name, asked in clipped_from.items():  # rows are taken from a split: never more than it holds
        split_name = "train" if name == "n_attribution" else args.query_split
        notice(f"--{name.replace('_', '-')} {asked} exceeds the {used[name]} examples of the task's {split_name} "
               f"split; using {used[name]} (summary.json records both)")
    if config.batch_size is not None and config.batch_size > train.labels.shape[0]:
        config = SamplerConfig.from_dict({**config.to_dict(), "batch_size": None})
    gen = torch.Generator().manual_seed(config.seed)
    rows = torch.randperm(train.labels.shape[0], generator=gen)[: args.n_attribution]
    return {
        "model": model, "metadata": metadata, "checkpoint": checkpoint, "task": task, "task_source": task_source,
        "sampler": config,
        "train": (train.tokens.to(device), train.labels.to(device)),
        "query": (query.tokens[: args.n_query].to(device), query.labels[: args.n_query].to(device)),
        "attribution": (train.tokens[rows].to(device), train.labels[rows].to(device)),
        # which rows follow the shortcut (None: a custom task that does not say)
        "agrees": train.agrees[rows] if getattr(train, "agrees", None) is not None else None,
        "used": used, "clipped_from": clipped_from,
    }


def bif_summary(args: BIFCommandConfig, inputs: dict[str, Any], result: Any,
                adaptive: Any = None) -> dict[str, Any]:
    """The ``summary.json`` of ``interp-toolkit bif`` (its schema, in one place); ``adaptive``
    is the :class:`~interp_toolkit.analyses.bif.adaptive.AdaptiveRecord` of the rounds."""
    per_row = result.bif.mean(1).cpu()
    agrees = inputs["agrees"]
    task = inputs["task"]
    return {
        "checkpoint": str(inputs["checkpoint"]),
        "checkpoint_metadata": inputs["metadata"],
        "command_config": {**args.to_dict(), **inputs.get("used", {})},  # the numbers of rows used
        "clipped_from": inputs.get("clipped_from", {}),
        "task": {"name": task.name, **task.to_dict()},
        "task_source": inputs["task_source"],
        "query_split": args.query_split,
        "cache_key": result.cache_key,
        "result_dir": str(args.output_dir() / f"bif_{result.cache_key}"),
        "query": f"the mean readout cross-entropy over {inputs.get('used', {}).get('n_query', args.n_query)} "
                 f"{args.query_split} examples",
        "mean_bif_on_query_loss": {
            "shortcut_consistent_train_examples": float(per_row[agrees].mean()) if agrees.any() else None,
            "shortcut_inconsistent_train_examples": float(per_row[~agrees].mean()) if (~agrees).any() else None,
        } if agrees is not None else {"all_train_examples": float(per_row.mean())},
        "stderr_method": "jackknife (leave one chain out); per_chain_stderr in the result",
        "convergence": result.convergence.summary() if result.convergence is not None else None,
        "adaptive": adaptive.to_dict() if adaptive is not None else None,
        "verdict": adaptive.describe() if adaptive is not None else None,
        "sampler_used": result.config,
        "sampler_warnings": result.diagnostics.warnings if result.diagnostics else [],
    }


def calibration_lines(report: dict[str, Any]) -> str:
    """What ``bif --calibrate`` and ``bif-lm --calibrate`` print: one line per setting, the
    recommendation and the file written."""
    def num(value: object, digits: int = 3) -> str:
        return f"{value:.{digits}g}" if isinstance(value, float) else str(value)

    lines = []
    for row in report["rows"]:
        state = "diverged" if row["diverged"] else ("converged" if row["converged"] else "not converged")
        lines.append(f"eps {row['eps']:.2e} gamma {row['gamma']:g} n_beta {num(row['n_beta'])}: {state}, "
                     f"max R-hat {num(row['max_rhat'], 4)}, min ESS {num(row['min_ess_bulk'])} / "
                     f"{num(row['min_ess_tail'])}, loss drift {num(row['loss_drift'])}")
    lines.append(f"recommended: {report['reason']}")
    lines.append(f"wrote {report['path']}")
    return "\n".join(lines)


def round_notice(summary: dict[str, Any]) -> None:
    """One ``note:`` line per adaptive round that did not converge (long work shows progress)."""
    if summary["diverged"]:
        notice(f"SGLD diverged at eps {summary['eps']:.3g}; rerunning at a third of it")
    elif not summary["converged"]:
        rhat, bulk, tail = (summary[k] for k in ("max_rhat", "min_ess_bulk", "min_ess_tail"))
        notice(f"BIF at {summary['draws']} draws after {summary['burn_in']} burn-in steps per chain: not converged "
               f"(max R-hat {'n/a' if rhat is None else f'{rhat:.3f}'}, min ESS "
               f"{'n/a' if bulk is None else f'{bulk:.0f}'} / {'n/a' if tail is None else f'{tail:.0f}'})")


def compute_bif_summary(args: BIFCommandConfig) -> dict[str, Any]:
    """Run ``bif`` at the checkpoint and return (and write) its summary."""
    from interp_toolkit.analyses.bif import bif
    from interp_toolkit.analyses.bif.adaptive import ROUNDS_DIR, keep_final_round, until_converged
    from interp_toolkit.io import atomic_write_json

    inputs = checkpoint_bif_inputs(args)
    # adaptive rounds are cached under OUT/rounds; the last one is the result, copied to OUT
    rounds_dir = args.output_dir() / ROUNDS_DIR if args.convergence.adaptive else args.output_dir()

    def one_round(sampler: SamplerConfig) -> Any:
        return bif(inputs["model"], inputs["train"], inputs["query"], readout_example_loss, sampler,
                   attribution_data=inputs["attribution"], cache_dir=rounds_dir, cache_tag="mpsp-readout-ce")

    result, adaptive = until_converged(one_round, inputs["sampler"], args.convergence, on_round=round_notice)
    if rounds_dir != args.output_dir():
        keep_final_round(rounds_dir, args.output_dir(), f"bif_{result.cache_key}")
    summary = bif_summary(args, inputs, result, adaptive)
    atomic_write_json(args.output_dir() / f"bif_{result.cache_key}" / "summary.json", summary)
    from interp_toolkit.analyses.bif import plot_bif
    from interp_toolkit.plotting import save_figure

    # bif() caches an ungrouped bif.png; the MPSP figure groups its rows by the shortcut
    agrees = inputs["agrees"]
    groups = None if agrees is None else {"shortcut-consistent": agrees.cpu().numpy(),
                                          "anti-shortcut": ~agrees.cpu().numpy()}
    save_figure(plot_bif(result, row_groups=groups), Path(summary["result_dir"]) / "bif", args.format)
    return summary


def calibrate_checkpoint(args: BIFCommandConfig) -> dict[str, Any]:
    """The sampler calibration sweep at the checkpoint (``interp-toolkit bif --calibrate``).

    Writes ``OUT/calibration_<key>.json`` (every setting's diagnostics, the recommendation)
    and ``OUT/calibration_<key>.<format>``, ``key`` a hash of the checkpoint and the sweep, so
    calibrations of other settings are kept side by side; returns the JSON plus ``path``.
    """
    from interp_toolkit.analyses.bif.calibration import calibrate_sampler, plot_calibration
    from interp_toolkit.io import atomic_write_json, config_hash, file_digest
    from interp_toolkit.plotting import save_figure

    inputs = checkpoint_bif_inputs(args)
    base = inputs["sampler"]
    eps = args.calibrate_eps or (base.eps / 10, base.eps, base.eps * 10)
    calibration = calibrate_sampler(
        inputs["model"], inputs["train"], inputs["query"], readout_example_loss, base, eps=eps,
        gamma=args.calibrate_gamma or None, n_beta=args.calibrate_n_beta or None,
        attribution_data=inputs["attribution"],
    )
    report = {"checkpoint": str(inputs["checkpoint"]), "task_source": inputs["task_source"],
              **calibration.to_dict()}
    # One file per checkpoint and sweep: a later calibration of other settings keeps this one.
    key = config_hash({"checkpoint": file_digest(inputs["checkpoint"]), "eps": list(eps),
                       "gamma": list(args.calibrate_gamma), "n_beta": list(args.calibrate_n_beta),
                       "sampler": base.to_dict(), "used": inputs.get("used", {}), "query": args.query_split}, 10)
    out = args.output_dir()
    path = out / f"calibration_{key}.json"
    atomic_write_json(path, report)
    save_figure(plot_calibration(calibration), out / f"calibration_{key}", args.format)
    return {**report, "path": str(path)}
