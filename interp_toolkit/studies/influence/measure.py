"""Which training examples drive an MPSP run out of its saturated shortcut: Bayesian influence
of training examples on the adversarial and validation losses at a run's checkpoints, beside
the shortcut-saturation paper's gradient amplification of the minority at the same epochs.

What it computes at each chosen checkpoint (:func:`checkpoint_influence`):

* **per-example BIF** of every anti-shortcut training example and a random subset of the
  shortcut-consistent ones (``n_consistent``) on the mean loss of the ``adv`` query set
  (the shortcut-inconsistent split, r = 0) and of the ``val`` query set (r = 1), from SGLD
  draws of the localized posterior at the checkpoint (:func:`~interp_toolkit.analyses.bif.bif`;
  negative = training on the example lowers that loss);
* **group reductions**: the mean BIF of a group of training examples on a query set, recorded
  as the group's mean loss (:mod:`interp_toolkit.analyses.bif.groups`), so its standard error
  is the leave-one-chain-out jackknife of the reduction itself. Groups: ``consistent`` and
  ``anti`` (shortcut-consistent / anti-shortcut training examples) and, at checkpoints that
  have not learned the rule (adversarial accuracy below 0.5), ``anti_memorized`` (anti-shortcut
  training examples the checkpoint classifies correctly: fitted without the rule) and
  ``anti_not_memorized``;
* the **within/between-phase decomposition**: every SGLD draw is labelled by the solution it
  sits in (``draw_phases="solution"``, the default; :func:`solution_label`): the rule when
  its accuracy on both query sets reaches :data:`SOLUTION_LEVEL`, the shortcut when its
  validation accuracy does and its adversarial accuracy is at most ``1 - SOLUTION_LEVEL``,
  neither otherwise. ``draw_phases="onset"`` keeps the earlier labels: phase 2 when a draw's
  adversarial accuracy is ``rise`` (0.1) above the run's shortcut-phase low (the outcome
  code's onset criterion), which labels draws of a checkpoint on the shortcut as phase 2 by
  noise alone where that low is near 0;
* the **amplification**: the paper's minority / majority mean per-example gradient norm
  (:func:`~interp_toolkit.analyses.gradients.gradient_conflict` on the training split, all
  parameters), and the gradient cosine between the two groups.

Each checkpoint's record is cached in ``OUT/cache/epoch_<epoch>_<key>.json`` (``key`` hashes
the checkpoint file, the settings and :data:`VERSION`; the BIF result with every per-example
value sits in ``OUT/bif/bif_<hash>/``), so an interrupted study resumes and a rerun reads the
cache. :func:`run_influence` writes ``OUT/influence.csv`` (one row per epoch, training group
and query set) and ``OUT/influence.png`` (:func:`~interp_toolkit.studies.influence.plot.plot_influence`);
:func:`~interp_toolkit.studies.influence.examples.onset_examples`
describes the most influential anti-shortcut examples at the onset of phase 2 against random
ones (a permutation test). The CLI is ``interp-toolkit influence RUN_DIR``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from interp_toolkit.analyses.bif.adaptive import AdaptiveConfig
from interp_toolkit.analyses.bif.config import LocalizeConfig, SamplerConfig
from interp_toolkit.callbacks import Callback
from interp_toolkit.config import Config
from interp_toolkit.errors import UserError
from interp_toolkit.runs.layout import ANALYSES
from interp_toolkit.studies.influence.phases import (
    DRAW_PHASES,
    SOLUTION_LEVEL,
    SOLUTIONS,
    draw_phase_threshold,
    run_outcome,
    solution_label,
    solution_labels,
    training_phase,
)
from interp_toolkit.studies.influence.table import QUERY_SETS, influence_rows, write_influence_csv

__all__ = [
    "InfluenceConfig",
    "InfluenceResult",
    "VERSION",
    "attribution_rows",
    "checkpoint_influence",
    "influence_output_dir",
    "run_influence",
    "training_groups",
]

#: Part of every cache key: bump when a record's numbers or fields change (2: locality, derived
#: gamma and adaptive rounds).
VERSION = 2
#: Below this adversarial accuracy a checkpoint has not learned the rule, so an anti-shortcut
#: training example it classifies correctly is fitted without it (memorized).
MEMORIZED_BELOW_ADV_ACC = 0.5


def _default_sampler() -> SamplerConfig:
    # n_beta = n (beta = 1), chosen on the demo run's epoch-100 checkpoint (docs/influence.md).
    # gamma and eps are derived per checkpoint by default (InfluenceConfig.localize); the values
    # here are those of --localize.no-auto (which the locality gate then checks).
    return SamplerConfig(eps=1e-4, gamma=1000.0, n_beta=4096.0, chains=4, draws=50, burn_in=60,
                         steps_between_draws=2, batch_size=256, progress=False)


@dataclass
class InfluenceConfig(Config):
    """What the influence study of a run measures (``interp-toolkit influence`` takes these as
    flags; where its files go and the device are arguments of :func:`run_influence`).

    Attributes:
        epochs: Checkpoint epochs to analyse (default: every checkpoint).
        min_epoch: Skip checkpoints before this epoch (log-spaced early ones), unless listed in --epochs.
        n_query: Examples of each query set (adv, val); at most the split's size.
        n_consistent: Shortcut-consistent training examples scored (every anti-shortcut one is).
        amplification_n: Training examples used for the gradient amplification (at most all).
        draw_phases: How SGLD draws are labelled for the within/between-phase split: solution
            (the solution each draw sits in, by its accuracy on both query sets) or onset (its
            adversarial accuracy above the run's onset threshold, the earlier labels).
        sampler: SGLD settings (--sampler.eps, --sampler.chains, ...; short: --eps, --chains); --chains >= 2
            (the standard errors are a leave-one-chain-out jackknife).
        convergence: Adaptive chain length per checkpoint (--adaptive, the default: draws and
            burn-in double until R-hat <= 1.01 and ESS >= 100, or --max-steps SGLD steps per
            chain would be exceeded; each checkpoint's record keeps its rounds).
        localize: How gamma and eps are chosen (--localize.auto, the default: per checkpoint, the
            smallest gamma whose prior-only cloud climbs at most 2.5% of the gap between the
            checkpoint's training loss and the label-marginal loss, and eps = min(0.3 / gamma,
            1 / (n_beta x the largest Hessian eigenvalue at the checkpoint)); overrides --gamma
            and --eps, which --localize.no-auto keeps).
    """

    epochs: tuple[int, ...] = ()
    min_epoch: int = 1
    n_query: int = 1024
    n_consistent: int = 512
    amplification_n: int = 4096
    draw_phases: Literal["solution", "onset"] = "solution"
    sampler: SamplerConfig = field(default_factory=_default_sampler)
    convergence: AdaptiveConfig = field(default_factory=lambda: AdaptiveConfig(max_steps=1600))
    localize: LocalizeConfig = field(default_factory=LocalizeConfig)

    def __post_init__(self) -> None:
        for name in ("n_query", "n_consistent", "amplification_n"):
            value = getattr(self, name)
            self.check(name, isinstance(value, int) and not isinstance(value, bool) and value >= 1, "an integer >= 1")
        self.check("min_epoch", isinstance(self.min_epoch, int) and self.min_epoch >= 0, "an integer >= 0")
        self.epochs = tuple(self.epochs)
        self.check("epochs", all(isinstance(e, int) and not isinstance(e, bool) and e >= 0 for e in self.epochs),
                   "checkpoint epochs (integers >= 0)")
        self.check("draw_phases", self.draw_phases in DRAW_PHASES, f"one of {', '.join(DRAW_PHASES)}")
        if isinstance(self.sampler.chains, int) and self.sampler.chains < 2:
            raise UserError(f"--chains {self.sampler.chains}: the influence study needs at least 2 chains (its "
                            "standard errors are a leave-one-chain-out jackknife)")
        from interp_toolkit.analyses.bif.adaptive import check_budget

        check_budget(self.sampler, self.convergence)  # sized before any checkpoint is read


def influence_output_dir(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """``out``, else ``RUN_DIR/analyses/influence``."""
    return Path(out) if out is not None else Path(run_dir) / ANALYSES / "influence"


# --------------------------------------------------------------------------- phases of a run


# --------------------------------------------------------------------------- one checkpoint


def _accuracy_fn(tokens: Any, labels: Any, batch_size: int) -> Any:
    import torch

    def adversarial_accuracy(model: Any) -> Any:
        correct = 0
        with torch.no_grad():
            for start in range(0, tokens.shape[0], batch_size):
                logits = model(tokens[start:start + batch_size])[:, -1, :]
                correct += int((logits.argmax(-1) == labels[start:start + batch_size]).sum())
        return torch.tensor([correct / tokens.shape[0]])

    return adversarial_accuracy


def _mean_loss_fn(tokens: Any, labels: Any, batch_size: int, name: str,
                  accuracy_out: dict[str, float] | None = None) -> Any:
    """``model -> [mean readout loss]`` of a query set; with ``accuracy_out``, the same pass's
    accuracy is stored there under ``name`` (the draw's phase reads it)."""
    import torch
    import torch.nn.functional as F

    def mean_loss(model: Any) -> Any:
        total, correct = 0.0, 0
        with torch.no_grad():
            for start in range(0, tokens.shape[0], batch_size):
                logits = model(tokens[start:start + batch_size])[:, -1, :]
                batch_labels = labels[start:start + batch_size]
                total += float(F.cross_entropy(logits, batch_labels, reduction="sum"))
                correct += int((logits.argmax(-1) == batch_labels).sum())
        if accuracy_out is not None:
            accuracy_out[name] = correct / tokens.shape[0]
        return torch.tensor([total / tokens.shape[0]], dtype=torch.float64)

    mean_loss.__qualname__ = f"mean_query_loss({name})"
    return mean_loss


def attribution_rows(agrees: Any, n_consistent: int, seed: int) -> Any:
    """Indices of the training examples scored: every anti-shortcut example, then up to
    ``n_consistent`` shortcut-consistent ones (a seeded random subset; they are the large
    majority at r > 0.5, and their group mean needs no more)."""
    import torch

    agrees = agrees.bool()
    consistent = torch.nonzero(agrees).flatten()
    pick = torch.randperm(consistent.numel(), generator=torch.Generator().manual_seed(seed))[:n_consistent]
    return torch.cat([torch.nonzero(~agrees).flatten(), consistent[pick].sort().values])


def training_groups(model: Any, split: Any, adv_acc: float, batch_size: int = 1024) -> dict[str, Any]:
    """Boolean masks over the training split: ``consistent``, ``anti`` and, when the checkpoint
    has not learned the rule (``adv_acc`` < :data:`MEMORIZED_BELOW_ADV_ACC`), ``anti_memorized``
    / ``anti_not_memorized`` (anti-shortcut examples it gets right / wrong; each only if
    non-empty)."""
    import torch

    agrees = split.agrees.bool()
    groups = {"consistent": agrees, "anti": ~agrees}
    if adv_acc < MEMORIZED_BELOW_ADV_ACC:
        device = next(model.parameters()).device
        with torch.no_grad():
            correct = torch.cat([
                model(split.tokens[s:s + batch_size].to(device))[:, -1, :].argmax(-1).cpu()
                == split.labels[s:s + batch_size] for s in range(0, len(split), batch_size)])
        for name, mask in (("anti_memorized", ~agrees & correct), ("anti_not_memorized", ~agrees & ~correct)):
            if bool(mask.any()):
                groups[name] = mask
    return {k: v for k, v in groups.items() if bool(v.any())}


def checkpoint_influence(model: Any, splits: Mapping[str, Any], sampler: SamplerConfig, threshold: float,
                         n_query: int = 1024, n_consistent: int = 512, amplification_n: int = 4096,
                         cache_dir: Path | None = None, device: str = "cpu",
                         draw_phases: str = "solution", adaptive: AdaptiveConfig | None = None,
                         localize: LocalizeConfig | None = None) -> dict[str, Any]:
    """BIF of the training examples on the query losses at one checkpoint, with group
    reductions, the phase decomposition and the gradient amplification.

    Args:
        model: The checkpoint's model (its weights are the localization centre).
        splits: The run's MPSP splits (``train``, ``val``, ``adv``).
        sampler: SGLD settings.
        threshold: Adversarial accuracy above which a draw is labelled phase 2 with
            ``draw_phases="onset"`` (:func:`draw_phase_threshold`).
        n_query: Examples of each query set.
        n_consistent: Shortcut-consistent training examples scored (every anti-shortcut one is;
            :func:`attribution_rows`).
        amplification_n: Training examples of the gradient amplification.
        cache_dir: Where :func:`bif` caches its result (per-example values); None: not kept.
        device: Where the data goes (the model's device).
        draw_phases: ``"solution"`` (:func:`solution_label`: 0 shortcut, 1 rule, 2 neither) or
            ``"onset"`` (1 above ``threshold``, else 0).
        adaptive: Chain length (default: one round, the sampler's; the study passes its
            :class:`AdaptiveConfig`).
        localize: gamma and eps (default: the sampler's; the study passes its
            :class:`LocalizeConfig`, derived per checkpoint by default).

    Returns:
        A JSON-able record: ``groups`` (name -> {query set -> bif, stderr, within, between,
        ...}), ``per_example`` (query set -> per-training-example bif and stderr), the draw
        phases, convergence summary, ``locality`` and ``sampling_verdict`` (the locality gate,
        against the training labels' label-marginal loss), ``localization``, ``adaptive`` (the
        rounds), ``amplification`` and timing.
    """

    from interp_toolkit.analyses.bif import bif, per_example_losses
    from interp_toolkit.analyses.bif.adaptive import until_converged
    from interp_toolkit.analyses.bif.diagnostics import advice_for
    from interp_toolkit.analyses.bif.groups import group_loss_fn
    from interp_toolkit.analyses.bif.locality import label_marginal_loss
    from interp_toolkit.analyses.bif.localize import local_gamma, localized_sampler
    from interp_toolkit.analyses.gradients import gradient_conflict
    from interp_toolkit.studies.bif.checkpoint import readout_correct, readout_example_loss, round_notice
    from interp_toolkit.tasks.custom import split_subset

    if draw_phases not in DRAW_PHASES:  # before any forward pass
        raise UserError(f"draw_phases must be one of {DRAW_PHASES}, got {draw_phases!r}")
    train = splits["train"]
    queries = {name: (splits[name].tokens[:n_query].to(device), splits[name].labels[:n_query].to(device))
               for name in QUERY_SETS}
    batch = sampler.eval_batch_size
    accuracy = {name: float(_accuracy_fn(*queries[name], batch)(model)) for name in QUERY_SETS}
    rows = attribution_rows(train.agrees, n_consistent, sampler.seed)
    scored = split_subset(train, rows)
    groups = training_groups(model, scored, accuracy["adv"], batch)
    train_data = (train.tokens.to(device), train.labels.to(device))
    if sampler.batch_size is not None and sampler.batch_size > len(train):
        sampler = SamplerConfig.from_dict({**sampler.to_dict(), "batch_size": None})
    reference, reference_loss = "label-marginal cross-entropy", label_marginal_loss(train.labels)
    localization = None
    if localize is not None and localize.auto:
        localization = local_gamma(model, train_data, readout_example_loss, reference_loss=reference_loss,
                                   reference=reference, config=localize, param_patterns=sampler.param_patterns,
                                   seed=sampler.seed, eval_batch_size=batch, n_beta=sampler.resolved_n_beta(len(train)))
        sampler = localized_sampler(sampler, localization)
    scored_data = (scored.tokens.to(device), scored.labels.to(device))
    attribution = group_loss_fn(per_example_losses(readout_example_loss, scored_data, batch), groups)
    last_accuracy: dict[str, float] = {}
    observables = {f"{name}_loss": _mean_loss_fn(*queries[name], batch, name, last_accuracy) for name in QUERY_SETS}

    def draw_phase(model: Any) -> int:
        # bif() records the observables of a draw, then asks its phase: the accuracies of those
        # same forward passes (no second pass over the query sets)
        if draw_phases == "solution":
            return solution_label(last_accuracy["adv"], last_accuracy["val"])
        return int(last_accuracy["adv"] > threshold)

    draw_phase.__qualname__ = (f"solution_of_draw(level={SOLUTION_LEVEL})" if draw_phases == "solution"
                               else f"adv_accuracy_above({threshold:.6f})")
    if draw_phases == "solution" and not sampler.keep_draws:
        sampler = SamplerConfig.from_dict({**sampler.to_dict(), "keep_draws": True})
    recorders: list[_DrawAccuracies] = []

    def one_round(round_sampler: SamplerConfig) -> Any:
        # Each draw's accuracies, kept (with the draws themselves) for the between-phase share's
        # Gaussian null: the null relabels Gaussian draws by the same solution rule.
        recorders.append(_DrawAccuracies(round_sampler.chains, round_sampler.draws, last_accuracy))
        return bif(model, train_data, None, readout_example_loss, round_sampler, attribution_fn=attribution,
                   observables=observables, phase_fn=draw_phase, cache_dir=cache_dir,
                   cache_tag=f"influence-v{VERSION}:{','.join(groups)}",
                   callbacks=[recorders[-1]] if draw_phases == "solution" else None,
                   reference_loss=reference_loss, reference=reference, accuracy_fn=readout_correct,
                   advice=advice_for("influence"))

    started = time.perf_counter()
    result, rounds = until_converged(one_round, sampler, adaptive or AdaptiveConfig(adaptive=False),
                                     on_round=round_notice, local_backoff=localization is not None)
    recorder = recorders[-1]
    sampler = SamplerConfig.from_dict(result.config) if result.config is not None else sampler
    bif_seconds = time.perf_counter() - started
    n_train = len(scored)
    null = _between_share_null(result, recorder, n_train, list(groups), sampler.seed) \
        if draw_phases == "solution" else {}
    phases = result.phases
    record_groups: dict[str, Any] = {}
    for g, name in enumerate(groups):
        row = n_train + g
        record_groups[name] = {"n_examples": int(groups[name].sum())}
        for q, query in enumerate(QUERY_SETS):
            entry: dict[str, float | None] = {"bif": float(result.bif[row, q]), "stderr": float(result.stderr[row, q])}
            if phases is not None:
                entry.update(within=float(phases.within[row, q]), between=float(phases.between[row, q]),
                             within_stderr=float(phases.within_stderr[row, q]),
                             between_stderr=float(phases.between_stderr[row, q]))
            entry.update(null.get((name, query), {}))
            record_groups[name][query] = entry
    shares = {label: 0.0 for label in ((0, 1, 2) if draw_phases == "solution" else (0, 1))}
    if phases is not None:
        shares.update({int(label): float(weight) for label, weight in zip(phases.labels, phases.weights, strict=True)})
    phase2_share = shares[1]
    started = time.perf_counter()
    conflict = gradient_conflict(model, splits, split="train", n=min(amplification_n, n_train))
    grad_seconds = time.perf_counter() - started
    everything = next(row for row in conflict.rows if row["group"] == "all")
    return {
        "accuracy": accuracy,
        "groups": record_groups,
        "train_index": rows.tolist(),
        "per_example": {query: {"bif": result.bif[:n_train, q].tolist(), "stderr": result.stderr[:n_train, q].tolist()}
                        for q, query in enumerate(QUERY_SETS)},
        "posterior_mean_loss": {query: float(result.observable_mean[q]) for q, query in enumerate(QUERY_SETS)},
        "draw_phases": draw_phases,
        "draw_phase_threshold": threshold,
        "phase2_draw_share": phase2_share,
        "draw_label_shares": ({SOLUTIONS[label]: share for label, share in shares.items()} if draw_phases == "solution"
                              else {"shortcut phase": shares[0], "phase 2": shares[1]}),
        "convergence": result.convergence.summary() if result.convergence is not None else None,
        "sampling_verdict": result.verdict,
        "locality": result.locality.to_dict() if result.locality is not None else None,
        "localization": localization.to_dict() if localization is not None else None,
        "adaptive": rounds.to_dict(),
        "sampler_warnings": result.diagnostics.warnings if result.diagnostics else [],
        "amplification": {k: everything[k] for k in ("minority_amplification", "amplification", "conflict_cos",
                                                     "norm_consistent", "norm_anti", "minority")},
        "bif_cache_key": result.cache_key,
        "seconds": {"bif": bif_seconds, "amplification": grad_seconds},
        "sampler": sampler.to_dict(),
    }


class _DrawAccuracies(Callback):
    """An SGLD callback keeping each draw's adversarial and validation accuracy (read from the
    observables' pass of that draw) as ``values [chains, draws, 2]`` (NaN where no draw was
    made: a result read from the BIF cache)."""

    def __init__(self, chains: int, draws: int, last_accuracy: Mapping[str, float]) -> None:
        import torch

        self.values = torch.full((chains, draws, 2), float("nan"), dtype=torch.float64)
        self.last = last_accuracy

    def on_draw(self, chain: int, draw: int, info: Mapping[str, float]) -> None:
        self.values[chain, draw, 0] = self.last["adv"]
        self.values[chain, draw, 1] = self.last["val"]


def _between_share_null(result: Any, recorder: _DrawAccuracies, n_train: int, groups: Sequence[str], seed: int,
                        null_repeats: int = 20) -> dict[tuple[str, str], dict[str, float | None]]:
    """Per (group, query set): the between-solution share of the group's BIF and its Gaussian
    null (:func:`~interp_toolkit.analyses.bif.phases.phase_share_with_null`, the draws
    relabelled by :func:`solution_labels`); None where the draws were not kept or not seen."""
    import torch

    from interp_toolkit.analyses.bif.phases import phase_share_with_null
    from interp_toolkit.analyses.bif.results import Draws

    draws = result.draws
    if draws is None or not bool(torch.isfinite(recorder.values).all()):
        return {(name, query): {"between_share": None, "null_between_share": None, "null_between_std": None}
                for name in groups for query in QUERY_SETS}
    n_b = draws.observables.shape[-1]
    joined = Draws(draws.attribution, torch.cat([draws.observables, recorder.values.to(draws.observables.dtype)], -1),
                   {**draws.observable_slices, "adv_acc": (n_b, n_b + 1), "val_acc": (n_b + 1, n_b + 2)},
                   phase_labels=draws.phase_labels)

    def split(d: Any) -> Any:
        return solution_labels(d.observables[..., n_b], d.observables[..., n_b + 1])

    out: dict[tuple[str, str], dict[str, float | None]] = {}
    for g, name in enumerate(groups):
        for query in QUERY_SETS:
            share = phase_share_with_null(joined, split, index=(n_train + g, 0), observable=f"{query}_loss",
                                          null_repeats=null_repeats, seed=seed)
            out[name, query] = {"between_share": share.share, "null_between_share": share.null_share,
                                "null_between_std": share.null_std}
    return out


# --------------------------------------------------------------------------- a run


def selected_checkpoints(run_dir: Path, args: InfluenceConfig) -> list[tuple[int, Path]]:
    from interp_toolkit.runs.resume import list_checkpoints

    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        raise UserError(f"{run_dir} has no checkpoints (expected {run_dir}/checkpoints/epoch_*.safetensors)")
    if args.epochs:
        available = dict(checkpoints)
        missing = [e for e in args.epochs if e not in available]
        if missing:
            raise UserError(f"no checkpoint for epochs {missing} in {run_dir}; available: {sorted(available)}")
        return [(e, available[e]) for e in sorted(set(args.epochs))]
    chosen = [(e, p) for e, p in checkpoints if e >= args.min_epoch]
    if not chosen:
        raise UserError(f"--min-epoch {args.min_epoch} leaves no checkpoint of {run_dir} (its last is epoch "
                        f"{checkpoints[-1][0]}); expected a --min-epoch at most {checkpoints[-1][0]}, or --epochs")
    return chosen


@dataclass
class InfluenceResult:
    """What :func:`run_influence` did.

    Attributes:
        rows: The CSV rows (:data:`~interp_toolkit.studies.influence.table.CSV_COLUMNS`).
        records: Epoch -> the checkpoint's full record (per-example values included).
        outcome: The run's outcome record; ``phases`` its phases in words.
        csv_path, figure_path: Files written.
        computed, cache_hits: Epochs computed now and read from the cache.
    """

    rows: list[dict[str, Any]]
    records: dict[int, dict[str, Any]]
    outcome: dict[str, Any]
    phases: list[str]
    csv_path: Path
    figure_path: Path
    computed: list[int]
    cache_hits: list[int]


def run_influence(run_dir: str | Path | None, config: InfluenceConfig | None = None, *,
                  out: str | Path | None = None, device: str = "cpu", format: str = "png",
                  progress: bool = True) -> InfluenceResult:
    """The influence study of one run: every chosen checkpoint (cached), the CSV and the figure.

    Args:
        run_dir: An MPSP run directory (checkpoints, metrics.jsonl, run.json).
        config: What is measured (default :class:`InfluenceConfig`'s defaults).
        out: Output / cache directory (default ``RUN_DIR/analyses/influence``).
        device: cpu, cuda, cuda:N or auto.
        format: Figure file format (png, svg or pdf).
        progress: A progress bar over the checkpoints.

    Raises:
        UserError: A missing run directory, checkpoints or evaluations, or unknown epochs
            (all before any sampling).
    """

    from interp_toolkit.analyses.over_checkpoints import (
        check_checkpoints_belong_to_run,
        splits_from_run,
    )
    from interp_toolkit.checkpoint import load_checkpoint
    from interp_toolkit.devices import resolve_device
    from interp_toolkit.io import CheckpointCache, atomic_write_json
    from interp_toolkit.plotting import check_format, save_figure
    from interp_toolkit.progress import progress_bar
    from interp_toolkit.studies.common.outcomes import describe_phases
    from interp_toolkit.userfiles import check_output_dir

    format = check_format(format)
    if run_dir is None or not Path(run_dir).is_dir():
        raise UserError(f"run directory {run_dir} does not exist (expected an MPSP run directory)")
    config = config if config is not None else InfluenceConfig()
    run_dir = Path(run_dir)
    out = influence_output_dir(run_dir, out)
    check_output_dir(out, "--out")
    checkpoints = selected_checkpoints(run_dir, config)
    check_checkpoints_belong_to_run(run_dir, checkpoints)
    splits = splits_from_run(run_dir)
    missing = [name for name in ("train", *QUERY_SETS) if name not in splits]
    if missing or getattr(splits["train"], "agrees", None) is None:
        raise UserError(f"the task of {run_dir} " + (f"has no split {missing}" if missing else
                        "has no .agrees on its train split") + f": the influence study needs splits train, "
                        f"{' and '.join(QUERY_SETS)} and train.agrees (which examples follow the shortcut; "
                        "docs/custom_tasks.md)")
    outcome, metrics, _ = run_outcome(run_dir)
    threshold = draw_phase_threshold(outcome, metrics)
    device = str(resolve_device(device or "cpu"))
    settings = {
        "sampler": {k: v for k, v in config.sampler.to_dict().items() if k != "progress"},
        "convergence": config.convergence.to_dict(), "localize": config.localize.to_dict(),
        "n_query": config.n_query, "n_consistent": config.n_consistent, "amplification_n": config.amplification_n,
        "threshold": round(threshold, 9),
        "version": VERSION, **({"draw_phases": config.draw_phases} if config.draw_phases != "onset" else {}),
    }
    rows: list[dict[str, Any]] = []
    records: dict[int, dict[str, Any]] = {}
    computed, hits = [], []
    cache = CheckpointCache(out / "cache", "influence")
    for epoch, path in progress_bar(checkpoints, desc="influence over checkpoints", disable=not progress):
        cache_path = cache.path(epoch, path, settings)
        record = cache.read(cache_path, epoch)
        if record is not None:
            hits.append(epoch)
        else:
            model, _ = load_checkpoint(path, device=device)
            record = checkpoint_influence(model, splits, config.sampler, threshold, config.n_query, config.n_consistent,
                                          config.amplification_n, cache_dir=out / "bif", device=device,
                                          draw_phases=config.draw_phases, adaptive=config.convergence,
                                          localize=config.localize)
            record = {"epoch": epoch, "checkpoint": path.name, **record}
            # the digest makes an edited or flipped number a recomputation, never a result
            cache.write(cache_path, record)
            computed.append(epoch)
        records[epoch] = record
        rows.extend(influence_rows(epoch, training_phase(epoch, outcome), record))
    cache.report()
    csv_path = write_influence_csv(out / "influence.csv", rows)
    from interp_toolkit.studies.influence.plot import (
        plot_influence,  # the drawing imports this module
    )

    figure_path = save_figure(plot_influence(rows, outcome, title=run_dir.name), out / f"influence.{format}")
    phases = describe_phases(outcome, metrics)
    atomic_write_json(out / "summary.json", {
        "run_dir": str(run_dir), "outcome": outcome, "phases": phases, "draw_phase_threshold": threshold,
        "settings": settings, "epochs": sorted(records), "computed": computed, "cache_hits": hits,
        "csv": str(csv_path), "figure": str(figure_path),
        "seconds_per_checkpoint": {e: r["seconds"] for e, r in records.items()},
    })
    return InfluenceResult(rows, records, outcome, phases, csv_path, figure_path, computed, hits)
