"""Per-run outcome records of MPSP shortcut studies, computed from ``metrics.jsonl``.

Definitions (``r`` is the training split's spurious ratio, ``m`` the task's modulus: 2 for
sum parity, 3 for sum mod 3, so chance is ``1/m``; ``val`` is the shortcut-consistent split
(r = 1), ``adv`` the adversarial one (r = 0)):

* **generalization split**: the split where the training bias misleads: ``adv`` when
  ``r > 1/m`` (the shortcut is predictive in training), ``val`` when ``r < 1/m`` (the
  *anti*-shortcut is), and ``both`` when ``|r - 1/m| < 1e-9`` (no bias to exploit).
* **favored split**: the other one (the split a bias-following model does well on):
  ``val`` when ``r > 1/m``, ``adv`` when ``r < 1/m``, none at chance.
* **generalized** (the paper's criterion): at some evaluation, accuracy on the
  generalization split reaches ``threshold`` (default 1.0, i.e. 100%); at ``r = 1/m``,
  both splits at ``threshold`` at the same evaluation.
* **rule_learned** (stricter, its own column): both ``val`` and ``adv`` at ``threshold`` at
  the same evaluation. A run can be generalized without it (adv 100%, val 99.95%).
* **transience** (found a generalization basin, then left it), judged on the
  generalization split (at chance: the lower of the two) after its first ``threshold``:
  ``basin_fraction`` is the share of later evaluations still at ``threshold``;
  ``min_acc_after`` the lowest accuracy from the first generalization on;
  ``left_epoch`` the first evaluation of the first *qualifying fall*: at least
  ``transient_min_span`` (default 3) consecutive evaluations below
  ``transient_tolerance`` (default 0.99). **transient** is true when such a fall exists,
  whether or not the run recovers later; a single one-evaluation dip is not transience.
* **shortcut_epoch**: first evaluation with the favored split at >= ``near_perfect`` times
  what the bias alone can score there (1.0, except the ``adv`` split of a mod-3 task below
  chance, where "not the shortcut" leaves two classes: 1/2). ``None`` at chance.
* **phase2_onset_epoch**: after the shortcut is learned, among evaluations whose favored
  split stays at that level: the epoch of the running minimum of the generalization
  split's accuracy at the first evaluation where that accuracy has risen ``rise``
  (default 0.1) above it. ``None`` if that never happens (including runs that learn the
  rule directly) and at chance.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from interp_toolkit.errors import UserError

#: |r - 1/m| below this counts as "at chance".
CHANCE_TOLERANCE = 1e-9

OUTCOME_FIELDS = (
    "generalized", "first_generalized_epoch", "rule_learned", "first_rule_learned_epoch",
    "transient", "left_epoch", "basin_fraction", "min_acc_after",
    "max_adv_acc", "max_val_acc", "final_adv_acc", "final_val_acc", "shortcut_epoch",
    "phase2_onset_epoch", "favored_split", "generalization_split", "modulus", "final_epoch",
    "n_evaluations", "transient_tolerance", "transient_min_span",
)


@dataclass(frozen=True)
class OutcomeThresholds:
    """Every setting an outcome record depends on (recorded with it and in ``study.json``).

    Attributes:
        threshold: Accuracy that counts as "100%" (generalized / rule learned).
        near_perfect: Share of the bias-only accuracy of the favored split that counts as
            "shortcut learned".
        rise: Rise of the generalization split's accuracy that marks the onset of phase 2.
        transient_tolerance: Accuracy of the generalization split below which a
            generalized run counts as out of its basin.
        transient_min_span: Consecutive evaluations below ``transient_tolerance`` that make
            a qualifying fall (a shorter dip is noise, not transience).
    """

    threshold: float = 1.0
    near_perfect: float = 0.99
    rise: float = 0.1
    transient_tolerance: float = 0.99
    transient_min_span: int = 3

    def __post_init__(self) -> None:
        for name in ("threshold", "near_perfect", "rise", "transient_tolerance"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
                raise UserError(f"outcome {name} must be a number in (0, 1], got {value!r}")
        span = self.transient_min_span
        if isinstance(span, bool) or not isinstance(span, int) or span < 1:
            raise UserError(f"outcome transient_min_span must be an integer >= 1, got {span!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "OutcomeThresholds":
        """Build from a dict, ignoring keys that are not thresholds (e.g. a whole sweep config)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def _check_modulus(modulus: int) -> None:
    if isinstance(modulus, bool) or not isinstance(modulus, int) or modulus < 2:
        raise UserError(f"task modulus m must be an integer >= 2 (2: parity, 3: mod 3), got {modulus!r}")


def at_chance(r: float, modulus: int) -> bool:
    """True when ``r`` is the chance level ``1/m`` (within ``CHANCE_TOLERANCE``)."""
    _check_modulus(modulus)
    return abs(float(r) - 1.0 / modulus) < CHANCE_TOLERANCE


def generalization_split(r: float, modulus: int) -> str:
    """``"adv"`` when ``r > 1/m``, ``"val"`` when ``r < 1/m``, ``"both"`` at chance."""
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 <= float(r) <= 1.0:
        raise UserError(f"spurious ratio r must be a number in [0, 1], got {r!r}")
    if at_chance(r, modulus):
        return "both"
    return "adv" if r > 1.0 / modulus else "val"


def favored_split(r: float, modulus: int) -> str | None:
    """The split the training bias helps: ``"val"`` above chance, ``"adv"`` below, ``None`` at it."""
    split = generalization_split(r, modulus)
    return {"adv": "val", "val": "adv", "both": None}[split]


def bias_only_accuracy(split: str, r: float, modulus: int) -> float:
    """Accuracy a model following only the training bias reaches on the favored ``split``.

    Above chance the bias is "predict the shortcut": 100% on ``val``. Below chance it is
    "predict anything but the shortcut": 100% on ``adv`` for parity, 1/(m-1) for m > 2.
    """
    if split == "val":
        return 1.0
    return 1.0 / (modulus - 1)


def _generalization_acc(row: Mapping[str, Any], split: str) -> float:
    if split == "both":
        return min(row["val_acc"], row["adv_acc"])
    return row[f"{split}_acc"]


def compute_outcome(
    metrics: Sequence[Mapping[str, Any]],
    r: float,
    modulus: int = 2,
    thresholds: OutcomeThresholds | None = None,
) -> dict[str, Any]:
    """The outcome record of one run from its evaluations (``val_acc`` and ``adv_acc``).

    Args:
        metrics: Evaluations in epoch order, each with ``epoch``, ``val_acc``, ``adv_acc``.
        r: The run's training spurious ratio.
        modulus: The task's m (2: parity tasks, 3: mod-3 tasks); chance is ``1/m``.
        thresholds: The settings (default :class:`OutcomeThresholds`).

    Returns:
        A dict with the keys of ``OUTCOME_FIELDS`` (see the module docstring).
    """
    thresholds = OutcomeThresholds() if thresholds is None else thresholds
    if not isinstance(thresholds, OutcomeThresholds):
        raise UserError(f"thresholds must be an OutcomeThresholds, got {type(thresholds).__name__}")
    gen_split = generalization_split(r, modulus)
    if not metrics:
        raise UserError("compute_outcome needs at least one evaluation, got none")
    from interp_toolkit.runs.metrics import MetricsError, row_problem

    for number, row in enumerate(metrics, start=1):
        missing = [k for k in ("epoch", "val_acc", "adv_acc") if k not in row]
        if missing:
            raise UserError(f"evaluation {dict(row)} lacks {missing}; expected epoch, val_acc and adv_acc")
        # An accuracy above 1 or a non-finite loss would change the outcome (and a headline rate).
        problem = row_problem(dict(row), None)  # values only: callers may pass evaluations unsorted
        if problem is not None:
            raise MetricsError(f"evaluation {number} of the run's history: {problem}; it is not what a trainer "
                               f"writes (see the run's metrics.jsonl)")
    rows = sorted(metrics, key=lambda m: m["epoch"])
    threshold = thresholds.threshold
    favored = favored_split(r, modulus)

    gen_acc = [_generalization_acc(row, gen_split) for row in rows]
    first_gen = next((i for i, acc in enumerate(gen_acc) if acc >= threshold), None)
    first_rule = next((i for i, row in enumerate(rows) if min(row["val_acc"], row["adv_acc"]) >= threshold), None)

    basin_fraction = min_acc_after = left_epoch = None
    if first_gen is not None:
        later = gen_acc[first_gen + 1 :]
        basin_fraction = sum(acc >= threshold for acc in later) / len(later) if later else None
        min_acc_after = min(gen_acc[first_gen:])
        run_start, run_length = 0, 0  # run_start is read only once run_length >= 1
        for i in range(first_gen + 1, len(rows)):
            if gen_acc[i] < thresholds.transient_tolerance:
                run_start = i if run_length == 0 else run_start
                run_length += 1
                if run_length >= thresholds.transient_min_span:
                    left_epoch = rows[run_start]["epoch"]
                    break
            else:
                run_length = 0

    shortcut_index = onset = None
    if favored is not None:
        shortcut_level = thresholds.near_perfect * bias_only_accuracy(favored, r, modulus)
        favored_key = f"{favored}_acc"
        shortcut_index = next((i for i, row in enumerate(rows) if row[favored_key] >= shortcut_level), None)
        if shortcut_index is not None:
            low_value, low_epoch = None, None
            for i in range(shortcut_index, len(rows)):
                if rows[i][favored_key] < shortcut_level:
                    continue
                if low_value is None or gen_acc[i] < low_value:
                    low_value, low_epoch = gen_acc[i], rows[i]["epoch"]
                elif gen_acc[i] - low_value >= thresholds.rise:
                    onset = low_epoch
                    break

    return {
        "generalized": first_gen is not None,
        "first_generalized_epoch": rows[first_gen]["epoch"] if first_gen is not None else None,
        "rule_learned": first_rule is not None,
        "first_rule_learned_epoch": rows[first_rule]["epoch"] if first_rule is not None else None,
        "transient": left_epoch is not None,
        "left_epoch": left_epoch,
        "basin_fraction": basin_fraction,
        "min_acc_after": min_acc_after,
        "max_adv_acc": max(row["adv_acc"] for row in rows),
        "max_val_acc": max(row["val_acc"] for row in rows),
        "final_adv_acc": rows[-1]["adv_acc"],
        "final_val_acc": rows[-1]["val_acc"],
        "shortcut_epoch": rows[shortcut_index]["epoch"] if shortcut_index is not None else None,
        "phase2_onset_epoch": onset,
        "favored_split": favored,
        "generalization_split": gen_split,
        "modulus": modulus,
        "final_epoch": rows[-1]["epoch"],
        "n_evaluations": len(rows),
        "transient_tolerance": thresholds.transient_tolerance,
        "transient_min_span": thresholds.transient_min_span,
    }


def outcome_of_run(run_dir: str | Path, r: float, modulus: int = 2,
                   thresholds: OutcomeThresholds | None = None) -> dict[str, Any]:
    """:func:`compute_outcome` of a run directory's ``metrics.jsonl``."""
    from interp_toolkit.runs.layout import metrics_path
    from interp_toolkit.runs.metrics import read_metrics

    metrics = read_metrics(metrics_path(run_dir))
    if not metrics:
        raise UserError(f"run directory {run_dir} has no evaluations in metrics.jsonl")
    return compute_outcome(metrics, r, modulus, thresholds)


def generalization_stop_rule(r: float, modulus: int, threshold: float = 1.0) -> Callable[[dict[str, Any]], bool]:
    """Early-stop rule: a run's ``generalized`` outcome is decided once it has generalized.

    Uses the paper's criterion (the generalization split at ``threshold``; both splits at
    chance). Only for studies that ignore transience (it cannot see a later fall).
    """
    split = generalization_split(r, modulus)

    def decided(metrics: dict[str, Any]) -> bool:
        return _generalization_acc(metrics, split) >= threshold

    return decided


def describe_phases(outcome: Mapping[str, Any], metrics: Sequence[Mapping[str, Any]]) -> list[str]:
    """The two phases of a run in words, one line each, from its outcome record.

    Phase 1 is the shortcut (the favored split at the bias's level, the generalization split
    low); phase 2 is the rule taking over (the generalization split rising from its low to
    the threshold). A run that learns the rule directly, or never leaves the shortcut, says so.

    Args:
        outcome: What :func:`compute_outcome` returned for ``metrics``.
        metrics: The run's evaluations (``epoch``, ``val_acc``, ``adv_acc``).
    """
    by_epoch = {row["epoch"]: row for row in metrics}
    gen_split, favored = outcome["generalization_split"], outcome["favored_split"]
    shortcut, onset, generalized = (outcome["shortcut_epoch"], outcome["phase2_onset_epoch"],
                                    outcome["first_generalized_epoch"])
    last = outcome["final_epoch"]
    if favored is None:
        return ["no shortcut phase: r is at chance, so the training data carry no bias to exploit"
                + (f"; the rule was learned at epoch {generalized}" if generalized is not None else "")]
    lines = []
    if shortcut is None:
        lines.append(f"phase 1 (shortcut): never reached within {last} epochs")
    else:
        row = by_epoch.get(shortcut, {})
        lines.append(f"phase 1 (shortcut): from epoch {shortcut}, {favored} accuracy "
                     f"{row.get(f'{favored}_acc', float('nan')):.1%} while {gen_split} accuracy is "
                     f"{_generalization_acc(row, gen_split) if row else float('nan'):.1%}: the model follows the "
                     "shortcut")
    if onset is not None and generalized is not None and generalized >= onset:
        row = by_epoch.get(onset, {})
        lines.append(f"phase 2 (rule): {gen_split} accuracy rises from its low of "
                     f"{_generalization_acc(row, gen_split) if row else float('nan'):.1%} at epoch {onset} "
                     f"to 100% at epoch {generalized}: the true rule takes over")
    elif generalized is not None:
        lines.append(f"no separate second phase: the rule was learned directly (epoch {generalized})")
    elif onset is not None:
        lines.append(f"phase 2 (rule) began at epoch {onset} but {gen_split} accuracy peaked at "
                     f"{outcome['max_adv_acc' if gen_split == 'adv' else 'max_val_acc']:.1%} "
                     f"within {last} epochs")
    else:
        lines.append(f"phase 2 (rule): not within {last} epochs ({gen_split} accuracy at most "
                     f"{outcome['max_adv_acc' if gen_split == 'adv' else 'max_val_acc']:.1%})")
    return lines


def plot_phases(metrics: Sequence[Mapping[str, Any]], outcome: Mapping[str, Any], ax: Any = None) -> Any:
    """Accuracy of every split over training with the two phases shaded and named.

    Args:
        metrics: The run's evaluations (``epoch`` and ``<split>_acc`` keys).
        outcome: What :func:`compute_outcome` returned for them.
        ax: Optional axes to draw into.

    Returns:
        The :class:`matplotlib.figure.Figure` drawn on.
    """
    from interp_toolkit.plotting import (
        epoch_axis,
        legend_outside,
        mpsp_split_label,
        new_panels,
        split_colors,
        split_linestyle,
        style,
    )

    with style():
        fig, (axis,) = new_panels(1, None if ax is None else [ax], figsize=(7.5, 3.6))
        epochs = [row["epoch"] for row in metrics]
        for split, color in split_colors().items():
            key = f"{split}_acc"
            if metrics and key in metrics[0]:
                axis.plot(epochs, [row[key] for row in metrics], color=color, ls=split_linestyle(split),
                          label=mpsp_split_label(split))
        shortcut, onset = outcome.get("shortcut_epoch"), outcome.get("phase2_onset_epoch")
        generalized, last = outcome.get("first_generalized_epoch"), outcome.get("final_epoch")
        if shortcut is not None:
            end = onset if onset is not None else last
            axis.axvspan(max(shortcut, 1), max(end or 1, 1), color="tab:orange", alpha=0.12, lw=0,
                         label="phase 1: shortcut")
        if onset is not None:
            end = generalized if generalized is not None else last
            axis.axvspan(max(onset, 1), max(end or 1, 1), color="tab:green", alpha=0.15, lw=0,
                         label="phase 2: rule takes over")
        if generalized is not None:
            axis.axvline(generalized, color="tab:green", ls="--", lw=1.0,
                         label=f"generalized (epoch {generalized})")
        epoch_axis(axis, epochs)
        axis.set(ylabel="accuracy", ylim=(-0.02, 1.02))
        legend_outside(axis)
    return fig


__all__ = ["CHANCE_TOLERANCE", "OUTCOME_FIELDS", "OutcomeThresholds", "at_chance", "bias_only_accuracy",
           "compute_outcome", "describe_phases", "favored_split", "generalization_split", "generalization_stop_rule",
           "outcome_of_run", "plot_phases"]
