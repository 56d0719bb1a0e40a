"""The near-miss view of a run: how far it stopped from the paper's criterion, and where.

The paper's criterion ("generalized": 100% adversarial accuracy at some evaluation) is kept
as it is. Beside it, :func:`near_miss_of_run` gives for one run directory:

* ``best_adv_acc`` / ``best_adv_epoch``: its best adversarial accuracy and the first
  evaluation reaching it (``metrics.jsonl``, the same numbers as ``max_adv_acc`` of
  :func:`interp_toolkit.studies.common.outcomes.compute_outcome`);
* ``n_adv_wrong_at_best``: the adversarial examples still wrong at that evaluation, exact
  from the logged accuracy and the split's size (``run.json``'s ``split_sizes``);
* ``within_1pct``: short of the criterion by at most 1 percentage point (a near miss;
  a generalized run is not one);
* ``near_miss_groups``: the feature group(s) holding the wrong examples, e.g.
  ``n_odd=8 (13 of 13 wrong)``, from
  :func:`interp_toolkit.analyses.near_misses.failing_groups`, and ``near_miss_epoch``: the
  checkpoint they were read at.

**Which checkpoint.** ``metrics.jsonl`` holds accuracies only, so the wrong examples are
recomputed from a checkpoint: the one at the best evaluation when it was saved, otherwise
the checkpoint whose logged accuracy is highest (then the nearest in epochs, then the
earlier). ``near_miss_epoch`` says which, and ``n_adv_wrong_at_checkpoint`` how many examples
were wrong there; where it differs from the best evaluation the groups describe that
checkpoint, not the best evaluation itself (runs evaluate every ``eval_every`` epochs but
checkpoint every ``checkpoint_every`` plus log-spaced epochs). The trainers are left
unchanged: no training-time hook, so existing runs and resume are untouched. The analysis is
cached in ``RUN/analyses/near_miss_at_best/`` (by checkpoint bytes), so asking again is cheap.
Groups are read only for runs within ``group_margin`` (default 5 points) of the criterion:
a run on the shortcut gets wrong the anti-shortcut examples as a whole, which no group
narrows.

For a study table (``outcomes.csv``): :data:`NEAR_MISS_FIELDS` are the columns and
:meth:`NearMiss.fields` one run's values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from interp_toolkit.errors import UserError

#: Within this many accuracy points below the criterion, a run is a near miss (``within_1pct``).
NEAR_MISS_MARGIN = 0.01
#: Groups are read (a checkpoint evaluated) only for runs within this margin.
GROUP_MARGIN = 0.05
AT_BEST_NAME = "near_miss_at_best"


def near_miss_fields(split: str = "adv") -> tuple[str, ...]:
    """Column names of :meth:`NearMiss.fields` for ``split`` (``adv``: :data:`NEAR_MISS_FIELDS`)."""
    return (f"best_{split}_acc", f"best_{split}_epoch", f"n_{split}_wrong_at_best", "within_1pct",
            "near_miss_groups", "near_miss_epoch", f"n_{split}_wrong_at_checkpoint")


#: The columns a study table adds per run (adversarial split).
NEAR_MISS_FIELDS = near_miss_fields("adv")


@dataclass
class NearMiss:
    """What :func:`near_miss_of_run` returns (module docstring).

    Attributes:
        run_dir: The run.
        split: The split judged (``adv``).
        threshold: The criterion's accuracy (1.0: the paper's 100%).
        best_acc: Best accuracy on ``split`` over the run's evaluations.
        best_epoch: First evaluation reaching it.
        n_examples: Examples in ``split``.
        n_wrong_at_best: Examples wrong at ``best_epoch``.
        within_1pct: ``threshold - margin <= best_acc < threshold``.
        groups: Rows of :func:`~interp_toolkit.analyses.near_misses.failing_groups` at
            ``checkpoint_epoch`` (empty when not read: generalized, too far, no checkpoint).
        checkpoint_epoch: The checkpoint the groups were read at, or None.
        n_wrong_at_checkpoint: Examples of ``split`` wrong at that checkpoint, or None.
        note: Why no groups were read, when they were not.
    """

    run_dir: Path
    split: str
    threshold: float
    best_acc: float
    best_epoch: int
    n_examples: int
    n_wrong_at_best: int
    within_1pct: bool
    groups: list[dict[str, Any]] = field(default_factory=list)
    checkpoint_epoch: int | None = None
    n_wrong_at_checkpoint: int | None = None
    note: str = ""

    @property
    def met_criterion(self) -> bool:
        return self.best_acc >= self.threshold

    @property
    def groups_text(self) -> str:
        """The groups in one line, e.g. ``n_odd=8 (13 of 13 wrong)`` (``""``: none read)."""
        from interp_toolkit.analyses.near_misses import describe_groups

        return describe_groups(self.groups)

    def fields(self) -> dict[str, Any]:
        """One run's values of :func:`near_miss_fields` (CSV-ready: ``""`` for no groups)."""
        names = near_miss_fields(self.split)
        values = (self.best_acc, self.best_epoch, self.n_wrong_at_best, self.within_1pct, self.groups_text,
                  self.checkpoint_epoch, self.n_wrong_at_checkpoint)
        return dict(zip(names, values, strict=True))

    def describe(self) -> str:
        """One sentence for printouts and figure titles.

        E.g. ``adv accuracy peaked at 99.37% (epoch 100): 13 of 2048 still wrong, all in
        n_odd=8 (13 of 13 wrong) (checkpoint at epoch 100)``.
        """
        head = (f"{self.split} accuracy peaked at {self.best_acc:.2%} (epoch {self.best_epoch}): "
                f"{self.n_wrong_at_best} of {self.n_examples} still wrong")
        if self.met_criterion:
            return f"{self.split} accuracy reached {self.best_acc:.2%} at epoch {self.best_epoch}"
        if not self.groups:
            return head + (f" ({self.note})" if self.note else "")
        held = sum(g["n_wrong"] for g in self.groups)
        where = "all in" if held == self.n_wrong_at_checkpoint else "mostly in"
        at = (f"checkpoint at epoch {self.checkpoint_epoch}" if self.checkpoint_epoch == self.best_epoch else
              f"read at the nearest checkpoint, epoch {self.checkpoint_epoch}, "
              f"{self.n_wrong_at_checkpoint} wrong there")
        return f"{head}, {where} {self.groups_text} ({at})"


def _split_size(record: dict[str, Any], task: Any, split: str) -> int:
    sizes = record.get("split_sizes") or {}
    if isinstance(sizes.get(split), int):
        return int(sizes[split])
    return int(task.n_train if split == "train" else task.n_eval)


def choose_checkpoint(checkpoint_epochs: list[int], accuracy_by_epoch: dict[int, float],
                      best_epoch: int) -> int | None:
    """The checkpoint whose wrong examples stand for the best evaluation (module docstring):
    ``best_epoch`` itself, else the highest logged accuracy, the nearest epoch, the earlier."""
    if not checkpoint_epochs:
        return None
    if best_epoch in checkpoint_epochs:
        return best_epoch
    return min(checkpoint_epochs,
               key=lambda e: (-accuracy_by_epoch.get(e, -math.inf), abs(e - best_epoch), e))


def near_miss_of_run(run_dir: str | Path, split: str = "adv", threshold: float = 1.0,
                     margin: float = NEAR_MISS_MARGIN, group_margin: float = GROUP_MARGIN,
                     device: str | None = None, out_dir: str | Path | None = None) -> NearMiss:
    """The near-miss view of one run directory (module docstring).

    Args:
        run_dir: A run written by ``interp-toolkit train`` or ``sweep`` (``run.json`` with
            its MPSP task, ``metrics.jsonl``, ``checkpoints/``).
        split: The split judged (``adv``: the paper's criterion for r > 1/m).
        threshold: Accuracy that meets the criterion (1.0: 100%).
        margin: A run short of ``threshold`` by at most this is ``within_1pct``.
        group_margin: Groups are read only for runs within this of ``threshold``.
        device: Where the checkpoint is evaluated (default CPU).
        out_dir: Where the analysis of the checkpoint is cached (default
            ``RUN/analyses/near_miss_at_best``; another folder for a run directory you cannot write).

    Returns:
        :class:`NearMiss`.

    Raises:
        UserError: No run record or task, no evaluation of ``split``, or a bad margin.
    """
    from interp_toolkit.runs.layout import metrics_path as layout_metrics_path
    from interp_toolkit.runs.metrics import read_metrics
    from interp_toolkit.runs.record import mpsp_task_config, read_record
    from interp_toolkit.runs.resume import list_checkpoints

    for name, value in (("threshold", threshold), ("margin", margin), ("group_margin", group_margin)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            raise UserError(f"near_miss_of_run: {name} must be a number in [0, 1], got {value!r}")
    run_dir = Path(run_dir)
    record = read_record(run_dir)
    task = mpsp_task_config(run_dir, "the near-miss view (wrong examples grouped by residue counts)")
    metrics_path = layout_metrics_path(run_dir)
    key = f"{split}_acc"
    metrics = [m for m in (read_metrics(metrics_path) if metrics_path.is_file() else []) if key in m]
    if not metrics:
        raise UserError(f"{metrics_path} holds no evaluation with {key}; the near-miss view needs a run evaluated "
                        f"on the {split!r} split")
    accuracy_by_epoch = {int(m["epoch"]): float(m[key]) for m in metrics}
    best_acc = max(accuracy_by_epoch.values())
    best_epoch = min(e for e, acc in accuracy_by_epoch.items() if acc == best_acc)
    n_examples = _split_size(record, task, split)
    n_wrong = round((1.0 - best_acc) * n_examples)
    short = best_acc < threshold
    near = NearMiss(run_dir, split, float(threshold), best_acc, best_epoch, n_examples, n_wrong,
                    within_1pct=short and best_acc >= threshold - margin - 1e-12)
    if not short or n_wrong == 0:
        return near
    if best_acc < threshold - group_margin - 1e-12:
        near.note = f"more than {group_margin:.0%} short: no group read"
        return near
    checkpoints = list_checkpoints(run_dir)
    epoch = choose_checkpoint([e for e, _ in checkpoints], accuracy_by_epoch, best_epoch)
    if epoch is None:
        near.note = "no checkpoint to read the wrong examples from"
        return near
    from interp_toolkit.analyses.near_misses import failing_groups
    from interp_toolkit.analyses.over_checkpoints import over_checkpoints

    result = over_checkpoints("near_misses", run_dir, epochs=[epoch], config={"split_names": [split]},
                              name=AT_BEST_NAME, out_dir=out_dir, plot=False, progress=False, device=device)
    rows = result.table.where(split=split).rows
    first_feature = rows[0]["feature"]
    near.checkpoint_epoch = epoch
    near.n_wrong_at_checkpoint = sum(r["n_wrong"] for r in rows if r["feature"] == first_feature)
    near.groups = failing_groups(rows, split)
    if not near.groups:
        near.note = f"none wrong at the checkpoint of epoch {epoch}"
    return near


__all__ = ["AT_BEST_NAME", "GROUP_MARGIN", "NEAR_MISS_FIELDS", "NEAR_MISS_MARGIN", "NearMiss", "choose_checkpoint",
           "near_miss_fields", "near_miss_of_run"]
