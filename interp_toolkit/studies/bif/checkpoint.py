"""Bayesian influence of MPSP training examples on query losses at one checkpoint: the
library behind ``interp-toolkit bif`` (:mod:`interp_toolkit.cli.bif` only parses and prints).

The data is the task the checkpoint was trained on, read from its run record
(:mod:`interp_toolkit.runs.record`; ``RUN/checkpoints/epoch_*.safetensors``). A checkpoint
outside a run needs ``task_config`` (an ``MPSPConfig`` as JSON); given beside a run record, it
must name the same task (else the command is refused: the model never saw that data).
:func:`compute_bif_summary` writes a cached :class:`~interp_toolkit.analyses.bif.BIFResult`
(``bif_<hash>/bif.safetensors``, ``bif.png``, ``diagnostics.png``) and ``summary.json`` (the
schema: :func:`bif_summary`); :func:`calibrate_checkpoint` runs the sampler calibration sweep
(:mod:`interp_toolkit.analyses.bif.calibration`) on the same data. Both take a
:class:`CheckpointBIFConfig` (what is measured); where the files go and on which device are
keyword arguments. The command's own config, ``BIFCommandConfig``, is in
:mod:`interp_toolkit.cli.bif`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

from interp_toolkit.analyses.bif.adaptive import AdaptiveConfig
from interp_toolkit.analyses.bif.config import LocalizeConfig, SamplerConfig
from interp_toolkit.config import Config
from interp_toolkit.errors import UserError, notice

__all__ = [
    "CheckpointBIFConfig", "bif_output_dir", "bif_summary", "calibrate_checkpoint", "calibration_lines",
    "checkpoint_bif_inputs", "compute_bif_summary", "readout_example_loss", "task_for_checkpoint",
]


@dataclass
class CheckpointBIFConfig(Config):
    """What a BIF at one MPSP checkpoint measures (``interp-toolkit bif`` takes these as flags).

    Attributes:
        n_attribution: Training examples scored (rows). More than the task's training set
            holds uses the whole set, says so in a note: line, and summary.json
            records the number used (command_config) and the one asked (clipped_from).
        n_query: Query examples (columns); likewise at most the query split's size.
        query_split: Split the query examples come from.
        sampler: SGLD settings (--sampler.eps, --sampler.chains, ...; short: --eps, --chains). --chains is at
            least 2: the BIF's standard error is a leave-one-chain-out jackknife, which one chain
            cannot give (it would be NaN everywhere).
        convergence: Adaptive chain length (--adaptive, the default: draws and burn-in double
            until R-hat <= 1.01 and ESS >= 100, or --max-steps SGLD steps per chain would be
            exceeded; summary.json records every round and which stopped it).
        localize: How gamma and eps are chosen (--localize.auto, the default: per checkpoint, the
            smallest gamma whose prior-only cloud climbs at most 2.5% of the gap between the
            checkpoint's training loss and the label-marginal loss, and eps = min(0.3 / gamma,
            1 / (n_beta x the largest Hessian eigenvalue at the checkpoint)); this overrides
            --gamma and --eps, which --localize.no-auto keeps).
    """

    n_attribution: int = 256
    n_query: int = 64
    query_split: Literal["train", "val", "adv"] = "adv"
    sampler: SamplerConfig = field(default_factory=lambda: SamplerConfig(eps=1e-3, batch_size=256))
    convergence: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    localize: LocalizeConfig = field(default_factory=LocalizeConfig)

    def __post_init__(self) -> None:
        for name in ("n_attribution", "n_query"):
            value = getattr(self, name)
            self.check(name, isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                       "an integer >= 1")
        self.check("query_split", self.query_split in ("train", "val", "adv"), "one of train, val, adv")
        if isinstance(self.sampler.chains, int) and self.sampler.chains < 2:
            raise UserError(f"--chains {self.sampler.chains}: a BIF needs at least 2 chains (its standard error is "
                            "a leave-one-chain-out jackknife, NaN with one chain)")
        from interp_toolkit.analyses.bif.adaptive import check_budget

        check_budget(self.sampler, self.convergence)  # sized before any work


def bif_output_dir(checkpoint: str | Path | None, out: str | Path | None = None) -> Path:
    """``out``, else ``RUN_DIR/analyses/bif`` of the checkpoint's run (or, for a checkpoint
    outside a run, ``analyses/bif`` beside it): results live with what they measure, not in
    the folder the command was started from."""
    from interp_toolkit.runs.layout import ANALYSES
    from interp_toolkit.runs.record import find_run_dir, has_record

    if out is not None:
        return Path(out)
    if checkpoint is None:
        raise UserError("a BIF needs a checkpoint (a .safetensors file); got none")
    checkpoint = Path(checkpoint)
    run_dir = checkpoint if checkpoint.is_dir() and has_record(checkpoint) else find_run_dir(checkpoint)
    return (run_dir if run_dir is not None else checkpoint.parent) / ANALYSES / "bif"


def readout_example_loss(model: Any, batch: tuple[Any, Any]) -> Any:
    """Per-example cross-entropy at the readout (last) position: a BIF ``loss_fn``."""
    import torch.nn.functional as F

    tokens, labels = batch
    return F.cross_entropy(model(tokens)[:, -1, :], labels, reduction="none")


def readout_correct(model: Any, batch: tuple[Any, Any]) -> Any:
    """Per-example correctness (1.0 / 0.0) at the readout position: the locality gate's accuracy."""
    tokens, labels = batch
    return (model(tokens)[:, -1, :].argmax(-1) == labels).float()


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


def checkpoint_bif_inputs(checkpoint: str | Path | None, config: CheckpointBIFConfig, *,
                          task_config: str | Path | None = None, device: str = "cpu") -> dict[str, Any]:
    """Everything a BIF at ``checkpoint`` needs, checked before any sampling: the model,
    its metadata, the task and where it came from, the sampler config, the posterior, query
    and attribution data and the attribution rows' shortcut agreement.

    ``task_config`` (an ``MPSPConfig`` as JSON) is needed only for a checkpoint outside a run
    (:func:`task_for_checkpoint`); ``device`` is where the model and data are put.

    Raises:
        UserError: A missing checkpoint or task, a task of another model, or a checkpoint whose
            run key differs from its run record's.
    """
    import torch

    from interp_toolkit.analyses.bif.locality import label_marginal_loss
    from interp_toolkit.analyses.bif.localize import local_gamma, localized_sampler
    from interp_toolkit.checkpoint import load_checkpoint
    from interp_toolkit.devices import resolve_device
    from interp_toolkit.model import model_config_of
    from interp_toolkit.runs.record import find_run_dir, read_record, record_path
    from interp_toolkit.runs.trainer import check_label_ids, check_token_ids
    from interp_toolkit.tasks.custom import task_splits

    if checkpoint is None:
        raise UserError("a BIF needs a checkpoint (a .safetensors file); got none")
    sampler = config.sampler
    resolved = resolve_device(device or "cpu")
    checkpoint = Path(checkpoint)
    task, task_source = task_for_checkpoint(checkpoint, None if task_config is None else Path(task_config))
    model, metadata = load_checkpoint(checkpoint, device=resolved)
    _check_model_fits(model_config_of(model), task, checkpoint)
    run_dir = find_run_dir(checkpoint)
    if run_dir is not None and metadata.get("run_key") not in (None, read_record(run_dir).get("key")):
        raise UserError(f"checkpoint {checkpoint} belongs to run {metadata['run_key']}, but {record_path(run_dir)} "
                        f"records run {read_record(run_dir).get('key')}")
    splits = task_splits(task)
    if config.query_split not in splits:
        raise UserError(f"--query-split {config.query_split!r}: the task of {task_source} has splits {sorted(splits)}")
    try:  # a task config of another model: refuse before any file is written
        for name, split in splits.items():
            check_token_ids(name, split.tokens, int(model.cfg.d_vocab))
            check_label_ids(name, split.labels, int(getattr(model.cfg, "d_vocab_out", model.cfg.d_vocab)))
    except UserError as err:
        raise UserError(f"the task of {task_source} does not fit checkpoint {checkpoint}: {err}") from err
    train = splits["train"]
    query = splits[config.query_split]
    used = {"n_attribution": min(config.n_attribution, int(train.labels.shape[0])),
            "n_query": min(config.n_query, int(query.labels.shape[0]))}
    clipped_from = {name: getattr(config, name) for name in used if used[name] < getattr(config, name)}
    for name, asked in clipped_from.items():  # rows are taken from a split: never more than it holds
        split_name = "train" if name == "n_attribution" else config.query_split
        notice(f"--{name.replace('_', '-')} {asked} exceeds the {used[name]} examples of the task's {split_name} "
               f"split; using {used[name]} (summary.json records both)")
    if sampler.batch_size is not None and sampler.batch_size > train.labels.shape[0]:
        sampler = SamplerConfig.from_dict({**sampler.to_dict(), "batch_size": None})
    posterior = (train.tokens.to(resolved), train.labels.to(resolved))
    reference, reference_loss = "label-marginal cross-entropy", label_marginal_loss(train.labels)
    localization = None
    if config.localize.auto:
        localization = local_gamma(model, posterior, readout_example_loss, reference_loss=reference_loss,
                                   reference=reference, config=config.localize, param_patterns=sampler.param_patterns,
                                   seed=sampler.seed, eval_batch_size=sampler.eval_batch_size,
                                   n_beta=sampler.resolved_n_beta(int(train.labels.shape[0])))
        notice(f"localization: {localization.describe()}")
        sampler = localized_sampler(sampler, localization)
    gen = torch.Generator().manual_seed(sampler.seed)
    rows = torch.randperm(train.labels.shape[0], generator=gen)[: config.n_attribution]
    return {
        "model": model, "metadata": metadata, "checkpoint": checkpoint, "task": task, "task_source": task_source,
        "sampler": sampler,
        "reference": reference, "reference_loss": reference_loss, "localization": localization,
        "train": posterior,
        "query": (query.tokens[: config.n_query].to(resolved), query.labels[: config.n_query].to(resolved)),
        "attribution": (train.tokens[rows].to(resolved), train.labels[rows].to(resolved)),
        # which rows follow the shortcut (None: a custom task that does not say)
        "agrees": train.agrees[rows] if getattr(train, "agrees", None) is not None else None,
        "used": used, "clipped_from": clipped_from,
    }


def bif_summary(config: CheckpointBIFConfig, inputs: dict[str, Any], result: Any, adaptive: Any = None, *,
                out_dir: Path, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``summary.json`` of ``interp-toolkit bif`` (its schema, in one place); ``adaptive``
    is the :class:`~interp_toolkit.analyses.bif.adaptive.AdaptiveRecord` of the rounds,
    ``out_dir`` the output directory, ``settings`` every setting of the call as the command's
    flags name them (``command_config``; default: ``config``'s)."""
    per_row = result.bif.mean(1).cpu()
    agrees = inputs["agrees"]
    task = inputs["task"]
    group_means = result.group_means or {}
    return {
        "checkpoint": str(inputs["checkpoint"]),
        "checkpoint_metadata": inputs["metadata"],
        "command_config": {**(settings if settings is not None else config.to_dict()),
                           **inputs.get("used", {})},  # the numbers of rows used
        "clipped_from": inputs.get("clipped_from", {}),
        "task": {"name": task.name, **task.to_dict()},
        "task_source": inputs["task_source"],
        "query_split": config.query_split,
        "cache_key": result.cache_key,
        "result_dir": str(out_dir / f"bif_{result.cache_key}"),
        "query": f"the mean readout cross-entropy over {inputs.get('used', {}).get('n_query', config.n_query)} "
                 f"{config.query_split} examples",
        "mean_bif_on_query_loss": {
            "shortcut_consistent_train_examples": float(per_row[agrees].mean()) if agrees.any() else None,
            "shortcut_inconsistent_train_examples": float(per_row[~agrees].mean()) if (~agrees).any() else None,
        } if agrees is not None else {"all_train_examples": float(per_row.mean())},
        # the same group means with their leave-one-chain-out jackknife errors (None: empty group)
        "mean_bif_on_query_loss_stderr": {group: group_means[group]["query_loss"][1] if group in group_means else None
                                          for group in (_group_names(agrees))},
        "stderr_method": "jackknife (leave one chain out); per_chain_stderr in the result",
        "sampling_verdict": result.verdict,
        "locality": result.locality.to_dict() if result.locality is not None else None,
        "localization": inputs["localization"].to_dict() if inputs.get("localization") is not None else None,
        "convergence": result.convergence.summary() if result.convergence is not None else None,
        "adaptive": adaptive.to_dict() if adaptive is not None else None,
        "verdict": adaptive.describe() if adaptive is not None else None,
        "sampler_used": result.config,
        "sampler_warnings": result.diagnostics.warnings if result.diagnostics else [],
    }


def _group_names(agrees: Any) -> list[str]:
    return (["shortcut_consistent_train_examples", "shortcut_inconsistent_train_examples"] if agrees is not None
            else ["all_train_examples"])


def row_groups(agrees: Any, n: int) -> dict[str, Any]:
    """The attribution-row groups whose mean BIF the summary reports (non-empty ones only)."""
    import torch

    if agrees is None:
        return {"all_train_examples": torch.ones(n, dtype=torch.bool)}
    masks = dict(zip(_group_names(agrees), (agrees.cpu(), ~agrees.cpu()), strict=True))
    return {name: mask for name, mask in masks.items() if bool(mask.any())}


def calibration_lines(report: dict[str, Any]) -> str:
    """What ``bif --calibrate`` and ``bif-lm --calibrate`` print: one line per setting, the
    recommendation and the file written."""
    def num(value: object, digits: int = 3) -> str:
        return f"{value:.{digits}g}" if isinstance(value, float) else str(value)

    lines = []
    for row in report["rows"]:
        state = "diverged" if row["diverged"] else ("converged" if row["converged"] else "not converged")
        local = {True: "local", False: "NOT local", None: "locality unmeasured"}[row.get("local")]
        climb = row.get("climb")
        lines.append(f"eps {row['eps']:.2e} gamma {row['gamma']:g} n_beta {num(row['n_beta'])}: {state}, {local}"
                     f"{'' if climb is None else f' (climb {climb:.1%} of the loss gap)'}, "
                     f"max R-hat {num(row['max_rhat'], 4)}, min ESS {num(row['min_ess_bulk'])} / "
                     f"{num(row['min_ess_tail'])}, loss drift {num(row['loss_drift'])}")
    lines.append(f"recommended: {report['reason']}")
    lines.append(f"wrote {report['path']}")
    return "\n".join(lines)


def locality_kwargs(inputs: dict[str, Any], command: str) -> dict[str, Any]:
    """The locality gate's keyword arguments of :func:`~interp_toolkit.analyses.bif.bif` for an
    MPSP (or custom-task) checkpoint: its label-marginal reference loss, readout accuracy, and
    warnings that name ``interp-toolkit COMMAND --calibrate``."""
    from interp_toolkit.analyses.bif.diagnostics import advice_for

    return {"reference_loss": inputs["reference_loss"], "reference": inputs["reference"],
            "accuracy_fn": readout_correct, "advice": advice_for(command)}


def round_notice(summary: dict[str, Any]) -> None:
    """One ``note:`` line per adaptive round that did not converge (long work shows progress),
    with its cost: SGLD steps per chain and seconds."""
    cost = f" ({summary['steps_per_chain']:,} steps per chain"
    cost += f", {summary['seconds']:.0f} s)" if summary.get("seconds") is not None else ")"
    if summary["diverged"]:
        notice(f"SGLD diverged at eps {summary['eps']:.3g}{cost}; rerunning at a third of it")
    elif summary.get("local") is False and summary.get("climb") is not None:
        notice(f"BIF at {summary['draws']} draws, eps {summary['eps']:.3g}{cost}: NOT local (the draws climbed "
               f"{summary['climb']:.0%} of the loss gap; the gate allows 10%)")
    elif not summary["converged"]:
        rhat, bulk, tail = (summary[k] for k in ("max_rhat", "min_ess_bulk", "min_ess_tail"))
        notice(f"BIF at {summary['draws']} draws after {summary['burn_in']} burn-in steps per chain{cost}: not "
               f"converged (max R-hat {'n/a' if rhat is None else f'{rhat:.3f}'}, min ESS "
               f"{'n/a' if bulk is None else f'{bulk:.0f}'} / {'n/a' if tail is None else f'{tail:.0f}'})")


def _settings(checkpoint: Path | None, config: CheckpointBIFConfig, task_config: str | Path | None,
              out: str | Path | None, device: str, format: str) -> dict[str, Any]:
    """Every setting of a call, in the order and with the names of the ``bif`` command's flags."""
    fields = config.to_dict()
    return {"checkpoint": None if checkpoint is None else str(checkpoint),
            "task_config": None if task_config is None else str(task_config),
            "out": None if out is None else str(out),
            **{k: fields.pop(k) for k in ("n_attribution", "n_query", "query_split")},
            "device": device, "format": format, **fields}


def compute_bif_summary(checkpoint: str | Path | None, config: CheckpointBIFConfig | None = None, *,
                        task_config: str | Path | None = None, out: str | Path | None = None,
                        device: str = "cpu", format: str = "png") -> dict[str, Any]:
    """BIF of the training examples on the query loss at ``checkpoint``: computes (or reads the
    cached rounds), writes ``OUT/bif_<key>/summary.json`` and the grouped figure, and returns
    the summary (:func:`bif_summary`).

    Args:
        checkpoint: A ``.safetensors`` checkpoint (interp_toolkit format).
        config: What is measured (default :class:`CheckpointBIFConfig`'s defaults).
        task_config: An ``MPSPConfig`` as JSON, for a checkpoint outside a run.
        out: Output / cache directory (default :func:`bif_output_dir`).
        device: cpu, cuda, cuda:N or auto.
        format: Figure file format (png, svg or pdf).
    """
    from interp_toolkit.analyses.bif import bif
    from interp_toolkit.analyses.bif.adaptive import ROUNDS_DIR, keep_final_round, until_converged
    from interp_toolkit.io import atomic_write_json
    from interp_toolkit.plotting import check_format

    format = check_format(format)  # a bad format is refused before any sampling
    config = config if config is not None else CheckpointBIFConfig()
    inputs = checkpoint_bif_inputs(checkpoint, config, task_config=task_config, device=device)
    out_dir = bif_output_dir(checkpoint, out)
    # adaptive rounds are cached under OUT/rounds; the last one is the result, copied to OUT
    rounds_dir = out_dir / ROUNDS_DIR if config.convergence.adaptive else out_dir

    groups = row_groups(inputs["agrees"], int(inputs["attribution"][1].shape[0]))

    def one_round(sampler: SamplerConfig) -> Any:
        return bif(inputs["model"], inputs["train"], inputs["query"], readout_example_loss, sampler,
                   attribution_data=inputs["attribution"], cache_dir=rounds_dir, cache_tag="mpsp-readout-ce",
                   row_groups=groups, **locality_kwargs(inputs, "bif"))

    result, adaptive = until_converged(one_round, inputs["sampler"], config.convergence, on_round=round_notice,
                                       local_backoff=config.localize.auto)
    if rounds_dir != out_dir:
        keep_final_round(rounds_dir, out_dir, f"bif_{result.cache_key}")
    summary = bif_summary(config, inputs, result, adaptive, out_dir=out_dir,
                          settings=_settings(inputs["checkpoint"], config, task_config, out, device, format))
    atomic_write_json(out_dir / f"bif_{result.cache_key}" / "summary.json", summary)
    from interp_toolkit.analyses.bif import plot_bif
    from interp_toolkit.plotting import save_figure

    # bif() caches an ungrouped bif.png; the MPSP figure groups its rows by the shortcut
    agrees = inputs["agrees"]
    figure_groups = None if agrees is None else {"shortcut-consistent": agrees.cpu().numpy(),
                                                 "anti-shortcut": ~agrees.cpu().numpy()}
    save_figure(plot_bif(result, row_groups=figure_groups), Path(summary["result_dir"]) / "bif", format)
    return summary


def calibrate_checkpoint(checkpoint: str | Path | None, config: CheckpointBIFConfig | None = None, *,
                         eps: Sequence[float] = (), gamma: Sequence[float] = (), n_beta: Sequence[float] = (),
                         task_config: str | Path | None = None, out: str | Path | None = None,
                         device: str = "cpu", format: str = "png") -> dict[str, Any]:
    """The sampler calibration sweep at the checkpoint (``interp-toolkit bif --calibrate``):
    ``eps`` x ``gamma`` (x ``n_beta``) around ``config.sampler`` (defaults: eps / 10, eps,
    eps * 10; the sampler's gamma; its n_beta).

    Writes ``OUT/calibration_<key>.json`` (every setting's diagnostics, the recommendation)
    and ``OUT/calibration_<key>.<format>``, ``key`` a hash of the checkpoint and the sweep, so
    calibrations of other settings are kept side by side; returns the JSON plus ``path``.
    The other arguments are those of :func:`compute_bif_summary`.
    """
    from interp_toolkit.analyses.bif.calibration import calibrate_sampler, plot_calibration
    from interp_toolkit.io import atomic_write_json, config_hash, file_digest
    from interp_toolkit.plotting import check_format, save_figure

    format = check_format(format)  # a bad format is refused before any sampling
    config = config if config is not None else CheckpointBIFConfig()
    inputs = checkpoint_bif_inputs(checkpoint, config, task_config=task_config, device=device)
    base = inputs["sampler"]
    gamma, n_beta = tuple(gamma), tuple(n_beta)
    eps = tuple(eps) or (base.eps / 10, base.eps, base.eps * 10)
    calibration = calibrate_sampler(
        inputs["model"], inputs["train"], inputs["query"], readout_example_loss, base, eps=eps,
        gamma=gamma or None, n_beta=n_beta or None, attribution_data=inputs["attribution"],
        **locality_kwargs(inputs, "bif"),
    )
    report = {"checkpoint": str(inputs["checkpoint"]), "task_source": inputs["task_source"],
              **calibration.to_dict()}
    # One file per checkpoint and sweep: a later calibration of other settings keeps this one.
    key = config_hash({"checkpoint": file_digest(inputs["checkpoint"]), "eps": list(eps),
                       "gamma": list(gamma), "n_beta": list(n_beta),
                       "sampler": base.to_dict(), "used": inputs.get("used", {}), "query": config.query_split}, 10)
    out_dir = bif_output_dir(checkpoint, out)
    path = out_dir / f"calibration_{key}.json"
    atomic_write_json(path, report)
    save_figure(plot_calibration(calibration), out_dir / f"calibration_{key}", format)
    return {**report, "path": str(path)}
