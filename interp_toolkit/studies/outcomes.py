"""Per-run outcome records of MPSP shortcut studies, computed from ``metrics.jsonl``.

Definitions (``r`` is the training split's spurious ratio; ``val`` is the
shortcut-consistent split, ``adv`` the adversarial one):

* **favored split**: the split a shortcut model aces: ``val`` when ``r >= 0.5``; ``adv``
  when ``r < 0.5`` (below chance the *anti*-shortcut is predictive, and for sum parity a
  model that predicts ``1 - shortcut`` scores 100% on ``adv`` and 0% on ``val``).
* **generalized**: at some evaluation, *both* ``val`` and ``adv`` accuracy reach
  ``threshold`` (default 1.0, i.e. 100%). For ``r >= 0.5`` this is the paper's criterion
  "100% adversarial accuracy" (a model at 100% on ``adv`` that follows the true rule is at
  100% on ``val`` too); requiring both keeps the rate correct below chance, where 100% on
  ``adv`` alone is the anti-shortcut, not the rule.
* **transient**: generalized, and a later evaluation fell below ``threshold`` again.
* **shortcut_epoch**: first evaluation with the favored split at >= ``near_perfect``
  (default 0.99: "~100%").
* **phase2_onset_epoch**: after the shortcut is learned, among evaluations whose favored
  split stays >= ``near_perfect``: the epoch of the running minimum of the other split's
  accuracy at the first evaluation where that accuracy has risen ``rise`` (default 0.1)
  above it. ``None`` if that never happens (including runs that learn the rule directly).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from interp_toolkit.io import read_jsonl

OUTCOME_FIELDS = (
    "generalized", "first_generalized_epoch", "transient", "max_adv_acc", "final_adv_acc",
    "final_val_acc", "shortcut_epoch", "phase2_onset_epoch", "favored_split", "final_epoch",
    "n_evaluations",
)


def compute_outcome(
    metrics: Sequence[dict[str, Any]],
    r: float,
    threshold: float = 1.0,
    near_perfect: float = 0.99,
    rise: float = 0.1,
) -> dict[str, Any]:
    """The outcome record of one run from its evaluations (``val_acc`` and ``adv_acc``).

    Args:
        metrics: Evaluations in epoch order, each with ``epoch``, ``val_acc``, ``adv_acc``.
        r: The run's training spurious ratio (decides the favored split).
        threshold: Accuracy both splits must reach to count as generalized.
        near_perfect: Accuracy of the favored split that counts as "shortcut learned".
        rise: Rise of the other split's accuracy that marks the onset of phase 2.

    Returns:
        A dict with the keys of ``OUTCOME_FIELDS``.
    """
    for name, value in (("threshold", threshold), ("near_perfect", near_perfect), ("rise", rise)):
        if not (isinstance(value, (int, float)) and 0.0 < value <= 1.0):
            raise ValueError(f"compute_outcome {name} must be in (0, 1], got {value!r}")
    if not metrics:
        raise ValueError("compute_outcome needs at least one evaluation, got none")
    for row in metrics:
        missing = [k for k in ("epoch", "val_acc", "adv_acc") if k not in row]
        if missing:
            raise ValueError(f"evaluation {row} lacks {missing}; expected epoch, val_acc and adv_acc")
    rows = sorted(metrics, key=lambda m: m["epoch"])
    favored, other = ("val_acc", "adv_acc") if r >= 0.5 else ("adv_acc", "val_acc")

    def rule_ok(row: dict[str, Any]) -> bool:
        return min(row["val_acc"], row["adv_acc"]) >= threshold

    first_gen = next((i for i, row in enumerate(rows) if rule_ok(row)), None)
    transient = first_gen is not None and any(not rule_ok(row) for row in rows[first_gen + 1 :])
    shortcut_index = next((i for i, row in enumerate(rows) if row[favored] >= near_perfect), None)

    onset = None
    if shortcut_index is not None:
        low_value, low_epoch = None, None
        for row in rows[shortcut_index:]:
            if row[favored] < near_perfect:
                continue
            if low_value is None or row[other] < low_value:
                low_value, low_epoch = row[other], row["epoch"]
            elif row[other] - low_value >= rise:
                onset = low_epoch
                break

    return {
        "generalized": first_gen is not None,
        "first_generalized_epoch": rows[first_gen]["epoch"] if first_gen is not None else None,
        "transient": transient,
        "max_adv_acc": max(row["adv_acc"] for row in rows),
        "final_adv_acc": rows[-1]["adv_acc"],
        "final_val_acc": rows[-1]["val_acc"],
        "shortcut_epoch": rows[shortcut_index]["epoch"] if shortcut_index is not None else None,
        "phase2_onset_epoch": onset,
        "favored_split": favored[:-4],
        "final_epoch": rows[-1]["epoch"],
        "n_evaluations": len(rows),
    }


def outcome_of_run(run_dir: str | Path, r: float, **kwargs: Any) -> dict[str, Any]:
    """:func:`compute_outcome` of a run directory's ``metrics.jsonl``."""
    metrics = read_jsonl(Path(run_dir) / "metrics.jsonl")
    if not metrics:
        raise ValueError(f"run directory {run_dir} has no evaluations in metrics.jsonl")
    return compute_outcome(metrics, r, **kwargs)


def generalization_stop_rule(threshold: float = 1.0) -> Any:
    """Early-stop rule: a run's outcome is decided once it has generalized.

    Only for studies that ignore transience (it cannot see a later fall).
    """

    def decided(metrics: dict[str, Any]) -> bool:
        return min(metrics["val_acc"], metrics["adv_acc"]) >= threshold

    return decided


__all__ = ["OUTCOME_FIELDS", "compute_outcome", "generalization_stop_rule", "outcome_of_run"]
