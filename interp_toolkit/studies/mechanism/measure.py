"""The shortcut-saturation mechanism of one MPSP run, over its checkpoints: data and figure.

:func:`mechanism_over_checkpoints` runs five analyses on every checkpoint of any run
directory written by :func:`interp_toolkit.train` or ``interp-toolkit sweep`` (``run.json``,
``metrics.jsonl``, ``checkpoints/``), with
:func:`interp_toolkit.analyses.over_checkpoints.over_checkpoints`, which caches every
checkpoint's result by (checkpoint bytes, analysis, settings, data): a rerun on the same run
computes nothing, and a run that has grown only computes its new checkpoints. The data is
rebuilt from the run record's task and checked against the run's data fingerprints.
:func:`~interp_toolkit.studies.mechanism.plot.plot_mechanism` draws seven panels on one log-scaled epoch axis, one
colour per head
in every panel:

1. train / val (shortcut-consistent) / adv (anti-shortcut) accuracy from ``metrics.jsonl``,
   with the shortcut epoch, the phase-2 onset and the first generalized evaluation marked
   (:func:`interp_toolkit.studies.common.outcomes.compute_outcome`, paper criteria); a run that
   stops short of 100% names, in the title, its best accuracy, the examples still wrong
   there and the feature group holding them
   (:func:`interp_toolkit.studies.common.near_miss.near_miss_of_run`);
2. gradient cosine between the mean gradients of shortcut-consistent and anti-shortcut
   training examples (all parameters, and each head's QK and OV parameters);
3. amplification of the minority (the paper's quantity): mean per-example gradient norm of
   the minority shortcut group over the majority's, for all parameters and each head's QK and
   OV. The minority is the anti-shortcut examples when r > 0.5 (then it is the anti /
   consistent ratio ``amplification``, also in the table), the consistent ones when r < 0.5;
   at r = 0.5 there is none and the panel draws anti / consistent;
4. QK magnitude fingerprint of each head (Spearman rho, readout score vs value) and its
   attention share on position 0;
5. OV parity fingerprint of each head (from the weights, and on data);
6. minimal-pair patching of each head: the change of the pair logit difference
   (logit of the source's label minus the target's) when the head's output on the target
   is replaced by its output on the minimal-pair source, for consistent -> anti pairs
   (``val`` into ``adv``) and the reverse; the black lines are the full source-target gap;
7. mean ablation of each head: change of accuracy on ``val`` and on ``adv``.

The result is also a tidy table, one row per ``(epoch, head, quantity, value)``
(``head`` is ``all`` for whole-model quantities), which :func:`~interp_toolkit.studies.mechanism.plot.write_mechanism`
saves as CSV
beside the figure, with a JSON of the settings and the run's outcome; :func:`read_mechanism`
reads both back, so the figure can be redrawn from its data alone. Quantities per panel
are listed in :data:`PANEL_QUANTITIES`.

    result = mechanism_over_checkpoints("runs/my_run")
    fig = plot_mechanism(result)        # interp_toolkit.studies.mechanism.plot
    write_mechanism(result, "runs/my_run/mechanism.png")   # + .csv, .json (mechanism_plot too)

Command line: ``interp-toolkit mechanism RUN_DIR [--out FIG] [--format png|svg|pdf]``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from interp_toolkit.config import Config
from interp_toolkit.errors import UserError
from interp_toolkit.runs.layout import ANALYSES, CHECKPOINTS, METRICS

#: Panel title -> the quantities of the tidy table drawn in it (``head`` is ``all`` for the
#: whole-model ones: accuracies, all-parameter gradient statistics, patching gaps).
PANEL_QUANTITIES: dict[str, tuple[str, ...]] = {
    "accuracy": ("acc_train", "acc_val", "acc_adv"),
    "gradient cosine": ("grad_cos", "grad_cos_qk", "grad_cos_ov"),
    "amplification": ("minority_amplification", "minority_amplification_qk", "minority_amplification_ov",
                      "amplification", "amplification_qk", "amplification_ov"),
    "QK fingerprint": ("qk_rho", "first_share"),
    "OV fingerprint": ("ov_rho", "ov_data_rho"),
    "minimal-pair patching": ("patch_val_to_adv", "patch_adv_to_val", "patch_val_to_adv_normalized",
                              "patch_adv_to_val_normalized", "patch_gap_val_to_adv", "patch_gap_adv_to_val"),
    "ablation": ("ablation_acc_val", "ablation_acc_adv", "ablation_loss_val", "ablation_loss_adv"),
}
#: Quantities measured once per checkpoint for the whole model (``head == "all"``).
WHOLE_MODEL_QUANTITIES = ("acc_train", "acc_val", "acc_adv", "grad_cos", "amplification",
                          "minority_amplification", "patch_gap_val_to_adv", "patch_gap_adv_to_val")
ALL = "all"
_HEAD_NAME = re.compile(r"^L\d+H\d+$")


@dataclass
class MechanismConfig(Config):
    """How many examples each analysis of the mechanism figure uses (part of the cache key).

    Attributes:
        grad_n: Training examples for the per-example gradients (the first ``grad_n``).
        grad_chunk_size: Examples per vmap chunk of the gradient analysis (bounds memory).
        fingerprint_n: Training examples for the QK / OV fingerprints.
        patching_n: Minimal pairs per direction.
        ablation_n: Examples of val and of adv for the ablation.
        ablation_method: ``mean`` (over the training split, the default), ``zero`` or ``resample``.
    """

    grad_n: int = 2048
    grad_chunk_size: int = 256
    fingerprint_n: int = 1024
    patching_n: int = 256
    ablation_n: int = 1024
    ablation_method: Literal["mean", "zero", "resample"] = "mean"

    def __post_init__(self) -> None:
        for name in ("grad_n", "grad_chunk_size", "fingerprint_n", "patching_n", "ablation_n"):
            value = getattr(self, name)
            self.check(name, not isinstance(value, bool) and isinstance(value, int) and value >= 1,
                       "a positive integer")
        self.check("ablation_method", self.ablation_method in ("mean", "zero", "resample"),
                   "one of mean, zero, resample")


@dataclass
class MechanismResult:
    """What :func:`mechanism_over_checkpoints` returns.

    Attributes:
        run_dir: The run.
        table: Tidy rows ``epoch, head, quantity, value`` (see :data:`PANEL_QUANTITIES`).
        heads: Head names (``L0H0`` ...) in (layer, head) order.
        checkpoint_epochs: Epochs of the analysed checkpoints.
        outcome: :func:`~interp_toolkit.studies.common.outcomes.compute_outcome` of the run's metrics.
        task: The run's task config as a dict (``r``, ``seq_len``, ...).
        model: The run's model config as a dict (``n_layers``, ``n_heads``, ...).
        config: The :class:`MechanismConfig` used.
        computed, cache_hits: Per analysis, the epochs computed now and those read from the cache.
        near_miss: For a run short of the criterion, :meth:`NearMiss.fields
            <interp_toolkit.studies.common.near_miss.NearMiss.fields>` plus ``text`` (its one-line
            description); empty for a generalized run.
        cache_key: :func:`result_key` of the inputs this result was computed from (None for
            a result read back with :func:`read_mechanism`).
    """

    run_dir: Path
    table: Any
    heads: list[str]
    checkpoint_epochs: list[int]
    outcome: dict[str, Any]
    task: dict[str, Any]
    model: dict[str, Any]
    config: MechanismConfig
    computed: dict[str, list[int]] = field(default_factory=dict)
    cache_hits: dict[str, list[int]] = field(default_factory=dict)
    near_miss: dict[str, Any] = field(default_factory=dict)
    cache_key: str | None = None

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.table.rows

    @property
    def n_computed(self) -> int:
        """Checkpoint analyses computed by this call (0 on a full cache hit)."""
        return sum(len(v) for v in self.computed.values())

    @property
    def n_cached(self) -> int:
        """Checkpoint analyses read from the cache by this call."""
        return sum(len(v) for v in self.cache_hits.values())

    def series(self, quantity: str, head: str = ALL) -> tuple[list[int], list[float]]:
        """``(epochs, values)`` of one quantity of one head, by epoch (NaN values dropped)."""
        points = sorted((r["epoch"], r["value"]) for r in self.table.rows
                        if r["quantity"] == quantity and r["head"] == head
                        and isinstance(r["value"], (int, float)) and not math.isnan(r["value"]))
        return [e for e, _ in points], [v for _, v in points]

    def last_epoch_summary(self) -> dict[str, Any] | None:
        """At the last analysed checkpoint: its epoch, the gradient cosine and an amplification.

        The amplification is the paper's amplification of the minority
        (``minority_amplification``) where the run has one; at r = 0.5 there is no minority,
        so it is the anti / consistent ratio (``amplification``). None if the gradient cosine
        was not measured at the last checkpoint.

        Returns:
            ``{"epoch", "grad_cos", "amplification", "amplification_kind"}`` (kind:
            ``"minority"`` or ``"anti / consistent"``), or None.
        """
        if not self.checkpoint_epochs:
            return None
        last = self.checkpoint_epochs[-1]
        cos = self.series("grad_cos")
        if last not in cos[0]:
            return None
        minority, anti = self.series("minority_amplification"), self.series("amplification")
        kind, (epochs, values) = ("minority", minority) if last in minority[0] else ("anti / consistent", anti)
        return {"epoch": last, "grad_cos": cos[1][cos[0].index(last)],
                "amplification": values[epochs.index(last)] if last in epochs else float("nan"),
                "amplification_kind": kind}

    def to_csv(self, path: str | Path) -> Path:
        return self.table.to_csv(path)

    def to_pandas(self) -> Any:
        """The tidy table as a pandas DataFrame."""
        return self.table.to_pandas()

    def summary(self) -> dict[str, Any]:
        """JSON-able settings and outcome (written beside the figure by
        :func:`~interp_toolkit.studies.mechanism.plot.write_mechanism`)."""
        return {"run_dir": str(self.run_dir), "task": self.task, "model": self.model,
                "settings": self.config.to_dict(), "heads": self.heads,
                "checkpoint_epochs": self.checkpoint_epochs, "outcome": self.outcome,
                "near_miss": self.near_miss,
                "panels": {k: list(v) for k, v in PANEL_QUANTITIES.items()}}


def check_run_dir(run_dir: str | Path) -> tuple[dict[str, Any], list[tuple[int, Path]], list[dict[str, Any]]]:
    """``(record, checkpoints, metrics)`` of a run directory; UserError naming what is missing.

    Everything the mechanism needs is checked here, before any analysis runs: a run record
    with an MPSP task, at least one checkpoint, and evaluations with val and adv accuracy.
    """
    from interp_toolkit.runs.layout import list_checkpoints
    from interp_toolkit.runs.metrics import read_metrics
    from interp_toolkit.runs.record import read_record, task_config

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run directory {run_dir} does not exist (expected a directory with run.json, "
                        "metrics.jsonl and checkpoints/, written by `interp-toolkit train` or `sweep`)")
    record = read_record(run_dir)
    task_config(run_dir)  # names a missing or non-MPSP task
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        raise UserError(f"{run_dir} has no checkpoints (expected {run_dir / CHECKPOINTS}/epoch_*.safetensors)")
    metrics_path = run_dir / METRICS
    metrics = read_metrics(metrics_path) if metrics_path.is_file() else []
    metrics = [m for m in metrics if "val_acc" in m and "adv_acc" in m]
    if not metrics:
        raise UserError(f"{metrics_path} holds no evaluation with val_acc and adv_acc; the mechanism figure needs "
                        "a run evaluated on the val and adv splits")
    return record, checkpoints, metrics


def check_mechanism_splits(run_dir: str | Path, splits: Mapping[str, Any]) -> None:
    """UserError naming what a run's splits lack for the mechanism figure: ``train`` with
    ``.agrees``, and ``val`` / ``adv`` splits (shortcut-consistent and conflicting) for
    cross-split patching (an MPSP task has them all; a custom task must provide them)."""
    missing = [name for name in ("train", "val", "adv") if name not in splits]
    if missing:
        raise UserError(f"the task of {run_dir} has no split {missing} (it has {sorted(splits)}): the mechanism "
                        "figure needs train, val (every example follows the shortcut) and adv (none does)")
    lacking = [name for name in ("train", "val", "adv") if getattr(splits[name], "agrees", None) is None]
    if lacking:
        raise UserError(f"splits {lacking} of the task of {run_dir} have no .agrees (which examples follow the "
                        "shortcut): the gradient-conflict and patching panels need it (docs/custom_tasks.md)")


def mechanism_over_checkpoints(
    run_dir: str | Path,
    config: MechanismConfig | None = None,
    epochs: Sequence[int] | None = None,
    device: Any = None,
    progress: bool = False,
    n_threads: int | None = None,
) -> MechanismResult:
    """Run the mechanism analyses on every checkpoint of a run (cached per checkpoint).

    Args:
        run_dir: A run directory (``run.json`` with an MPSP task, ``metrics.jsonl``,
            ``checkpoints/``).
        config: Sample sizes of the analyses (default :class:`MechanismConfig`).
        epochs: Checkpoint epochs to analyse (default: all).
        device: Where checkpoints are loaded (``cpu``, ``cuda``, ``auto``; default CPU);
            not part of the cache key.
        progress: Show one progress bar per analysis.
        n_threads: Torch CPU threads while analysing (restored after; ``None``: leave the
            current setting). One thread suits the small MPSP models: on a busy 2-core
            machine a second thread made this call several times slower.

    Returns:
        :class:`MechanismResult`. Caches and per-analysis CSVs live in
        ``run_dir/analyses/mechanism/<analysis>/``.

    Raises:
        UserError: If ``run_dir`` is not a run directory with checkpoints and evaluations,
            or its training split lacks shortcut-consistent or anti-shortcut examples
            (r = 0 or 1: no gradient conflict to measure).
    """
    config = MechanismConfig() if config is None else config
    if not isinstance(config, MechanismConfig):
        raise UserError(f"config must be a MechanismConfig, got {type(config).__name__}")
    run_dir = Path(run_dir)
    record, checkpoints, metrics = check_run_dir(run_dir)
    available = [e for e, _ in checkpoints]
    if epochs is not None:
        missing = sorted(set(epochs) - set(available))
        if missing:
            raise UserError(f"no checkpoint for epochs {missing} in {run_dir}; available epochs: {available}")
        available = sorted(set(epochs))
    # A full cache hit reads one file: no torch, no data, no per-checkpoint entries.
    key = result_key(run_dir, config, [(e, p) for e, p in checkpoints if e in set(available)])
    cached = read_cached_result(run_dir, key)
    if cached is not None:
        return cached

    from interp_toolkit.analyses.over_checkpoints import over_checkpoints, splits_from_run
    from interp_toolkit.devices import resolve_device
    from interp_toolkit.runs.record import task_config
    from interp_toolkit.studies.common.outcomes import compute_outcome
    from interp_toolkit.threads import torch_threads

    device = resolve_device(device if device is not None else "cpu")
    task = task_config(run_dir)
    splits = splits_from_run(run_dir)
    check_mechanism_splits(run_dir, splits)
    agrees = splits["train"].agrees[: config.grad_n]
    if bool(agrees.all()) or not bool(agrees.any()):
        raise UserError(f"the first {min(config.grad_n, len(splits['train'].agrees))} training examples of {run_dir} "
                        f"(r = {task.r}) are all shortcut-{'consistent' if bool(agrees.all()) else 'conflicting'}: "
                        "the gradient panels need both kinds; use a run with 0 < r < 1 or a larger grad_n")
    outcome = compute_outcome(metrics, task.r, task.modulus)

    runs: dict[str, tuple[str, dict[str, Any]]] = {
        "gradients": ("gradients", gradient_settings(config.grad_n, config.grad_chunk_size)),
        "fingerprints": ("fingerprints", {"split": "train", "n": config.fingerprint_n}),
        "patching_val_to_adv": ("patching", {"source": "val", "target": "adv", "n": config.patching_n,
                                             "kinds": ["head"], "positions": None}),
        "patching_adv_to_val": ("patching", {"source": "adv", "target": "val", "n": config.patching_n,
                                             "kinds": ["head"], "positions": None}),
        "ablation": ("ablation", {"method": config.ablation_method, "reference": "train",
                                  "split_names": ["val", "adv"], "kinds": ["head"], "n": config.ablation_n}),
    }
    # Patching needs minimal pairs on its source split (an MPSP split has them; a custom task may
    # not): a direction without them is skipped before any work, said once, and its panel says so.
    from interp_toolkit.analyses.patching import has_minimal_pairs

    unpaired = [source for source in ("val", "adv") if not has_minimal_pairs(splits[source])]
    if unpaired:
        from interp_toolkit.errors import notice

        for source in unpaired:
            runs.pop(f"patching_{source}_to_{'adv' if source == 'val' else 'val'}")
        notice(f"minimal-pair patching from {' and '.join(unpaired)} skipped: the task of {run_dir} gives no "
               f"minimal_pairs on split{'s' if len(unpaired) > 1 else ''} {unpaired} (pairs one token apart whose "
               "shortcut agreement flips; docs/custom_tasks.md); the other panels are drawn")
    tables: dict[str, Any] = {}
    computed: dict[str, list[int]] = {}
    hits: dict[str, list[int]] = {}
    # checkpoints load on the CPU; moving them there again only makes TransformerLens print
    load_on = None if device.type == "cpu" else str(device)
    with torch_threads(n_threads):
        for name, (analysis, analysis_config) in runs.items():
            result = over_checkpoints(analysis, run_dir, splits=splits, epochs=available, config=analysis_config,
                                      name=name, out_dir=analysis_dir(run_dir, name), plot=False,
                                      progress=progress, device=load_on)
            tables[name] = result.table
            computed[name], hits[name] = result.computed, result.cache_hits

    model_config = dict(record.get("model_config") or {})
    heads = sorted({r["component"] for r in tables["fingerprints"].rows},
                   key=lambda h: tuple(int(x) for x in re.findall(r"\d+", h)))
    table = _tidy(metrics, tables, minority_of(task.r))
    near_miss: dict[str, Any] = {}
    from interp_toolkit.tasks.custom import CustomTask

    if not outcome["generalized"] and not isinstance(task, CustomTask):  # residue-count groups: MPSP only
        from interp_toolkit.studies.common.near_miss import near_miss_of_run

        split = outcome["generalization_split"] if outcome["generalization_split"] in ("adv", "val") else "adv"
        with torch_threads(n_threads):
            near = near_miss_of_run(run_dir, split=split, device=load_on)
        near_miss = {**near.fields(), "text": near.describe()}
    mechanism = MechanismResult(run_dir=run_dir, table=table, heads=heads, checkpoint_epochs=available,
                                outcome=outcome, task={"name": task.name, **task.to_dict()}, model=model_config,
                                config=config, computed=computed, cache_hits=hits, near_miss=near_miss,
                                cache_key=key)
    write_cached_result(mechanism)
    return mechanism


#: Part of :func:`result_key`: bumped when the mechanism's table changes for the same inputs.
RESULT_VERSION = 1
#: Modules whose source is part of :func:`result_key`: an edit to the code that computes or
#: draws the mechanism recomputes it instead of serving a stale result or figure.
RESULT_CODE = ("interp_toolkit.analyses.ablation", "interp_toolkit.analyses.fingerprints",
               "interp_toolkit.analyses.gradients", "interp_toolkit.analyses.patching",
               "interp_toolkit.analyses.over_checkpoints", "interp_toolkit.analyses._common",
               "interp_toolkit.analyses.near_misses", "interp_toolkit.tasks.mpsp", "interp_toolkit.plotting",
               "interp_toolkit.studies.mechanism.measure", "interp_toolkit.studies.common.outcomes",
               "interp_toolkit.studies.common.near_miss")
_RESULTS = "results"


def _code_digest() -> str:
    import hashlib
    import importlib.util

    digest = hashlib.sha256()
    for module in RESULT_CODE:
        spec = importlib.util.find_spec(module)
        origin = spec.origin if spec is not None else None
        digest.update(module.encode() + b"\0" + (Path(origin).read_bytes() if origin else b"missing") + b"\0")
    return digest.hexdigest()[:16]


def result_key(run_dir: str | Path, config: MechanismConfig, checkpoints: Sequence[tuple[int, Path]]) -> str:
    """What a mechanism result depends on, hashed: the bytes of the analysed checkpoints, of
    ``metrics.jsonl`` and ``run.json``, the settings, the source of the code that computes
    and draws it (:data:`RESULT_CODE`) and :data:`RESULT_VERSION`. Reading it costs hashing
    those files; no model is loaded."""
    from interp_toolkit.io import config_hash, file_digest
    from interp_toolkit.runs.layout import RECORD

    run_dir = Path(run_dir)
    return config_hash({"version": RESULT_VERSION, "code": _code_digest(), "settings": config.to_dict(),
                        "checkpoints": {str(epoch): file_digest(path) for epoch, path in checkpoints},
                        "metrics": file_digest(run_dir / METRICS), "record": file_digest(run_dir / RECORD)}, 24)


def _result_path(run_dir: Path, key: str) -> Path:
    return analysis_dir(run_dir, _RESULTS) / f"{key}.json"


def write_cached_result(result: MechanismResult) -> Path | None:
    """Store ``result`` under its ``cache_key`` (atomic, with a digest of its content), so
    the same inputs are read back by :func:`read_cached_result`. None without a key."""
    from interp_toolkit import __version__
    from interp_toolkit.io import atomic_write_json, with_header_digest

    if result.cache_key is None:
        return None
    return atomic_write_json(_result_path(result.run_dir, result.cache_key), with_header_digest({
        "key": result.cache_key, "written_by": f"interp-toolkit {__version__}", "summary": result.summary(),
        "analyses": sorted(set(result.computed) | set(result.cache_hits)), "rows": result.table.rows}))


def read_cached_result(run_dir: str | Path, key: str) -> MechanismResult | None:
    """The result stored under ``key`` for ``run_dir``, or None when there is none or it fails
    its content digest (then it is recomputed, with a ``note:`` line)."""
    import json

    from interp_toolkit.errors import notice
    from interp_toolkit.io import HEADER_DIGEST_KEY, header_digest
    from interp_toolkit.table import Table

    run_dir = Path(run_dir)
    path = _result_path(run_dir, key)
    if not path.is_file():
        return None
    try:
        entry = json.loads(path.read_bytes().decode("utf-8"))
        if entry.get(HEADER_DIGEST_KEY) != header_digest(entry) or entry.get("key") != key:
            raise UserError("content does not match its digest")
        summary = entry["summary"]
        epochs = list(summary["checkpoint_epochs"])
        rows = [{"epoch": row["epoch"], "head": row["head"], "quantity": row["quantity"], "value": row["value"]}
                for row in entry["rows"]]  # stored with sorted keys: the tidy column order again
        return MechanismResult(run_dir=run_dir, table=Table(rows), heads=list(summary["heads"]),
                               checkpoint_epochs=epochs, outcome=summary["outcome"], task=summary["task"],
                               model=summary["model"], config=MechanismConfig.from_dict(summary["settings"]),
                               computed={name: [] for name in entry["analyses"]},
                               cache_hits={name: epochs for name in entry["analyses"]},
                               near_miss=dict(summary.get("near_miss") or {}), cache_key=key)
    except (OSError, UnicodeDecodeError, ValueError, UserError, KeyError, TypeError, AttributeError) as err:
        notice(f"mechanism: recomputing the cached result {path}: {err}")
        return None


def analysis_dir(run_dir: str | Path, name: str) -> Path:
    """Where the mechanism keeps ``name`` (an analysis's cache and CSV, or its own records)
    under ``run_dir``: ``RUN_DIR/analyses/mechanism/<name>``."""
    return Path(run_dir) / ANALYSES / "mechanism" / name


def gradient_settings(grad_n: int, chunk_size: int) -> dict[str, Any]:
    """The mechanism's settings of the ``gradients`` analysis (part of its cache key): anyone
    measuring the same quantities with these settings in :func:`analysis_dir` shares its cache."""
    return {"split": "train", "n": grad_n, "chunk_size": chunk_size}


def gradient_quantities(row: Mapping[str, Any], minority: str) -> dict[str, float]:
    """The mechanism's gradient quantities of one row of the ``gradients`` analysis (one
    parameter group at one checkpoint): ``grad_cos``, ``amplification`` (anti / consistent)
    and, unless ``minority`` is ``"none"`` (r = 0.5), ``minority_amplification``.

    Args:
        row: A row of :func:`interp_toolkit.analyses.gradients.gradient_conflict`'s table.
        minority: :func:`minority_of` the run's r.
    """
    from interp_toolkit.analyses.gradients import minority_amplification

    out = {"grad_cos": float(row["conflict_cos"]), "amplification": float(row["amplification"])}
    if minority != "none":
        # from the group norms, so checkpoint caches written before this quantity existed serve too
        out["minority_amplification"] = minority_amplification(row["norm_consistent"], row["norm_anti"], minority)
    return out


def minority_of(r: float) -> str:
    """The minority shortcut group of a training set with shortcut ratio ``r``: ``"anti"``
    above 0.5, ``"consistent"`` below, ``"none"`` at 0.5."""
    from interp_toolkit.analyses.gradients import minority_group

    return minority_group(r, 1 - r)


def _tidy(metrics: list[dict[str, Any]], tables: dict[str, Any], minority: str) -> Any:
    """One ``(epoch, head, quantity, value)`` row per measured number (see PANEL_QUANTITIES)."""
    from interp_toolkit.analyses._common import Table

    rows: list[dict[str, Any]] = []

    def add(epoch: int, head: str, quantity: str, value: Any) -> None:
        rows.append({"epoch": int(epoch), "head": head, "quantity": quantity, "value": float(value)})

    for m in metrics:
        for split in ("train", "val", "adv"):
            if f"{split}_acc" in m:
                add(m["epoch"], ALL, f"acc_{split}", m[f"{split}_acc"])
    for r in tables["gradients"].rows:
        quantities = gradient_quantities(r, minority)
        if r["group"] == "all":
            for quantity, value in quantities.items():
                add(r["epoch"], ALL, quantity, value)
            continue
        head, _, kind = r["group"].partition(".")
        if _HEAD_NAME.match(head) and kind in ("QK", "OV"):
            for quantity, value in quantities.items():
                add(r["epoch"], head, f"{quantity}_{kind.lower()}", value)
    for r in tables["fingerprints"].rows:
        for quantity in PANEL_QUANTITIES["QK fingerprint"] + PANEL_QUANTITIES["OV fingerprint"]:
            add(r["epoch"], r["component"], quantity, r[quantity])
    for direction in ("val_to_adv", "adv_to_val"):
        gaps: dict[int, float] = {}
        for r in tables[f"patching_{direction}"].rows if f"patching_{direction}" in tables else []:
            add(r["epoch"], r["component"], f"patch_{direction}", r["patched"] - r["target"])
            add(r["epoch"], r["component"], f"patch_{direction}_normalized", r["normalized"])
            gaps[r["epoch"]] = r["source"] - r["target"]
        for epoch, gap in gaps.items():
            add(epoch, ALL, f"patch_gap_{direction}", gap)
    for r in tables["ablation"].rows:
        metric = {"accuracy": "acc", "loss": "loss"}.get(r["metric"])
        if metric is not None:
            add(r["epoch"], r["component"], f"ablation_{metric}_{r['split']}", r["delta"])
    rows.sort(key=lambda r: (r["epoch"], r["head"] != ALL, r["head"], r["quantity"]))
    return Table(rows)


def read_mechanism(path: str | Path) -> MechanismResult:
    """A :class:`MechanismResult` read back from the CSV and JSON
    :func:`~interp_toolkit.studies.mechanism.plot.write_mechanism` wrote.

    Redraws (or restyles) the figure from its data without the run's checkpoints.

    Args:
        path: The figure, the CSV or the JSON (the other files share its stem).

    Raises:
        UserError: If the CSV or JSON is missing or is not a mechanism table.
    """
    import json

    from interp_toolkit.table import Table

    path = Path(path)
    # only a file suffix is dropped: a stem such as mechanism_r0.9_s0 keeps its dots
    stem = path.with_suffix("") if path.suffix.lower() in (".csv", ".json", ".png", ".svg", ".pdf") else path
    csv_path, json_path = stem.parent / f"{stem.name}.csv", stem.parent / f"{stem.name}.json"
    for needed in (csv_path, json_path):
        if not needed.is_file():
            raise UserError(f"{needed} does not exist (expected the files write_mechanism writes beside the figure)")
    table = Table.from_csv(csv_path)
    if table.columns != ["epoch", "head", "quantity", "value"]:
        raise UserError(f"{csv_path} has columns {table.columns}, expected epoch, head, quantity, value")
    try:
        summary = json.loads(json_path.read_text(encoding="utf-8"))
        return MechanismResult(run_dir=Path(summary["run_dir"]), table=table, heads=list(summary["heads"]),
                               checkpoint_epochs=list(summary["checkpoint_epochs"]), outcome=summary["outcome"],
                               task=summary["task"], model=summary["model"],
                               config=MechanismConfig.from_dict(summary["settings"]),
                               near_miss=dict(summary.get("near_miss") or {}))
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise UserError(f"{json_path} is not a mechanism summary ({type(err).__name__}: {err})") from err


__all__ = ["ALL", "MechanismConfig", "MechanismResult", "PANEL_QUANTITIES", "WHOLE_MODEL_QUANTITIES",
           "RESULT_CODE", "RESULT_VERSION", "check_run_dir", "mechanism_over_checkpoints",
           "analysis_dir", "read_cached_result", "read_mechanism", "result_key", "write_cached_result"]
