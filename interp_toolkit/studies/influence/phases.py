"""Phases for the joined study: a run's training phase at a checkpoint (from its outcome), and
the solution each SGLD draw sits in (:func:`solution_label`: the shortcut, the rule or neither,
by its accuracy on the adversarial and validation query sets) or, as the first study did, its
phase-2 onset label (:func:`draw_phase_threshold`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from interp_toolkit.errors import UserError

#: A draw sits in a solution when its accuracy on the query set(s) that solution gets right
#: reaches this (and, for the shortcut, its adversarial accuracy is at most 1 minus it).
SOLUTION_LEVEL = 0.9


#: The draw labels of ``draw_phases="solution"``, by label.
SOLUTIONS = ("shortcut", "rule", "neither")


DRAW_PHASES = ("solution", "onset")


def run_outcome(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]], float]:
    """The run's outcome record (:func:`compute_outcome`), its evaluations and its ``r``."""
    from interp_toolkit.runs.layout import metrics_path
    from interp_toolkit.runs.metrics import read_metrics
    from interp_toolkit.runs.record import task_config
    from interp_toolkit.studies.common.outcomes import compute_outcome

    task = task_config(run_dir)
    metrics = read_metrics(metrics_path(run_dir))
    if not metrics:
        raise UserError(f"run directory {run_dir} has no evaluations in metrics.jsonl; train it first")
    return compute_outcome(metrics, task.r, task.modulus), metrics, float(task.r)


def training_phase(epoch: int, outcome: Mapping[str, Any]) -> str:
    """Which phase of its run a checkpoint epoch lies in, from the run's outcome record.

    ``before shortcut`` (before ``shortcut_epoch``), ``shortcut`` (from it until the onset of
    phase 2, or to the end), ``phase 2`` (from ``phase2_onset_epoch`` until the run first
    generalizes), ``generalized`` (from then on). A run without a shortcut phase (r at
    chance, or the rule learned directly) gives ``no shortcut`` / ``generalized``.
    """
    shortcut, onset = outcome.get("shortcut_epoch"), outcome.get("phase2_onset_epoch")
    generalized = outcome.get("first_generalized_epoch")
    if generalized is not None and epoch >= generalized:
        return "generalized"
    if shortcut is None:
        return "no shortcut"
    if epoch < shortcut:
        return "before shortcut"
    if onset is not None and epoch >= onset:
        return "phase 2"
    return "shortcut"


def draw_phase_threshold(outcome: Mapping[str, Any], metrics: Sequence[Mapping[str, Any]], rise: float = 0.1) -> float:
    """Adversarial accuracy above which an SGLD draw counts as phase 2: the outcome code's
    onset criterion (the generalization split ``rise`` above its shortcut-phase low).

    The low is the adversarial accuracy at the run's ``phase2_onset_epoch``; a run without
    one uses the lowest adversarial accuracy from its ``shortcut_epoch`` on (from the start
    when it never learned the shortcut).
    """
    by_epoch = {row["epoch"]: row for row in metrics}
    onset, shortcut = outcome.get("phase2_onset_epoch"), outcome.get("shortcut_epoch")
    if onset is not None and onset in by_epoch:
        low = float(by_epoch[onset]["adv_acc"])
    else:
        start = shortcut if shortcut is not None else -1
        low = min(float(row["adv_acc"]) for row in metrics if row["epoch"] >= start)
    return low + rise


def solution_label(adv_acc: float, val_acc: float, level: float = SOLUTION_LEVEL) -> int:
    """Which solution a model (an SGLD draw) sits in, from its accuracy on the adversarial and
    the validation query sets: :func:`solution_labels` of one draw (1 the rule, 0 the shortcut,
    2 neither)."""
    import torch

    return int(solution_labels(torch.tensor(adv_acc), torch.tensor(val_acc), level))


def solution_labels(adv_acc: Any, val_acc: Any, level: float = SOLUTION_LEVEL) -> Any:
    """The solution of every draw at once, from tensors of one shape (``[chains, draws]`` or
    any): 1 (the rule) where both accuracies reach ``level``; 0 (the shortcut) where validation
    does and adversarial accuracy is at most ``1 - level``; 2 (neither: between the two, or off
    both) elsewhere. For runs at r > 1/m, where the shortcut is right on the validation set and
    wrong on the adversarial one (:data:`SOLUTIONS` names the labels)."""
    import torch

    if not 0.5 < level <= 1:
        raise UserError(f"solution level must be in (0.5, 1], got {level!r}")
    rule = (val_acc >= level) & (adv_acc >= level)
    shortcut = (val_acc >= level) & (adv_acc <= 1 - level)
    return torch.where(rule, 1, torch.where(shortcut, 0, 2)).long()


__all__ = ["DRAW_PHASES", "SOLUTIONS", "SOLUTION_LEVEL", "draw_phase_threshold", "run_outcome",
           "solution_label", "solution_labels", "training_phase"]
