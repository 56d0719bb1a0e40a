"""Which examples a model gets wrong, grouped by task-meaningful features (near misses).

The paper's criterion ("generalized": 100% adversarial accuracy at some evaluation) reads a
run that learned the rule everywhere except at one extreme of the data the same as a run
that never left the shortcut. :func:`near_misses` says where the wrong examples are: every
example of each split is described by the features of
:func:`interp_toolkit.tasks.mpsp.example_features` (count of values per residue mod m, e.g.
``n_odd``; ``label`` = the sum mod m; ``shortcut``; ``max`` and ``max_count``; ``max_position``
or, for first-element tasks, ``first_value``), and for every (split, feature, value) group
the table gives its size, wrong examples and accuracy, its share of the split's wrong
examples, and how much of the training split (and of its anti-shortcut examples) the group
is: a group the model gets wrong and training barely holds is reached for by extrapolation.

Table columns: ``split, feature, value, n, n_wrong, accuracy, wrong_share, train_count,
train_share, anti_train_count, anti_train_share`` (``wrong_share`` is NaN when the split has
no wrong example; the training columns are NaN without a ``train`` split, and the anti ones
when training holds no anti-shortcut example). Tensors: ``<split>_wrong`` (bool ``[n]``),
``<split>_predictions`` (``[n]``) and ``<split>_features`` (``[n, n_features]``, columns in
``config["features"]`` order).

:func:`failing_groups` reads the rows of one split back into the group(s) that hold its
wrong examples (the feature whose wrong groups are the purest), and :func:`describe_groups`
writes them as one line, e.g. ``n_odd=8 (13 of 13 wrong)``.

Over checkpoints: ``over_checkpoints("near_misses", run_dir)`` or
``interp-toolkit analyze RUN --analysis near_misses`` (the figure: accuracy and wrong
examples of each adversarial residue-count group, over epochs).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from interp_toolkit.errors import UserError

from ._common import AnalysisResult, Table, callable_module, check_positive_int, check_splits

#: Residue-count features the over-checkpoints figure draws (one per task family).
PLOT_FEATURES = ("n_odd", "n_mod3_0")


def _task_of(name: str, split: Any) -> Any:
    from interp_toolkit.tasks.mpsp import MPSPConfig

    task = getattr(split, "task", None)
    if not isinstance(task, MPSPConfig) or not isinstance(getattr(split, "values", None), Tensor):
        raise UserError(f"split {name!r} must be an MPSP split made by make_split (with .values and its .task), "
                         f"got {type(split).__name__}{' without a task' if task is None else ''}")
    return task


@torch.no_grad()
def predictions(model: Any, tokens: Int[Tensor, "n pos"], position: int = -1,
                batch_size: int = 4096) -> Int[Tensor, " n"]:
    """The model's predicted class at the readout ``position`` of every example."""
    device = next(model.parameters()).device
    out = []
    for start in range(0, tokens.shape[0], batch_size):
        logits = model(tokens[start : start + batch_size].to(device))
        out.append(logits[:, position, :].argmax(-1).cpu())
    return torch.cat(out)


def group_rows(split_name: str, features: Mapping[str, Int[Tensor, " n"]], wrong: Bool[Tensor, " n"],
               train_features: Mapping[str, Int[Tensor, " n_train"]] | None = None,
               train_anti: Bool[Tensor, " n_train"] | None = None) -> list[dict[str, Any]]:
    """One row per (feature, value) of one split (the module docstring's columns).

    Args:
        split_name: Written in the ``split`` column.
        features: Feature name -> value of each example of the split.
        wrong: Which examples the model gets wrong.
        train_features: The same features of the training split (for the share columns).
        train_anti: Which training examples are anti-shortcut (``~agrees``).
    """
    total_wrong = int(wrong.sum())
    n_train = None if train_features is None else len(next(iter(train_features.values())))
    n_anti = None if train_anti is None else int(train_anti.sum())
    rows = []
    for feature, values in features.items():
        for value in sorted(set(values.tolist())):
            members = values == value
            n, n_wrong = int(members.sum()), int((members & wrong).sum())
            row: dict[str, Any] = {"split": split_name, "feature": feature, "value": int(value), "n": n,
                                   "n_wrong": n_wrong, "accuracy": 1.0 - n_wrong / n,
                                   "wrong_share": n_wrong / total_wrong if total_wrong else math.nan}
            if train_features is not None and feature in train_features:
                in_train = train_features[feature] == value
                row["train_count"] = int(in_train.sum())
                row["train_share"] = row["train_count"] / n_train
                row["anti_train_count"] = int((in_train & train_anti).sum())
                row["anti_train_share"] = row["anti_train_count"] / n_anti if n_anti else math.nan
            else:
                row.update(train_count=math.nan, train_share=math.nan, anti_train_count=math.nan,
                           anti_train_share=math.nan)
            rows.append(row)
    return rows


def near_misses(model: Any, splits: Mapping[str, Any], split_names: Sequence[str] | None = None,
                n: int | None = None, batch_size: int = 4096) -> AnalysisResult:
    """Accuracy of every feature group of every split, with its share of the training data.

    Args:
        model: A TransformerLens model of the task (predicts at the last position).
        splits: MPSP splits made by :func:`interp_toolkit.tasks.mpsp.make_split` (they carry
            their values and task); ``train`` gives the share columns.
        split_names: Splits to group (default: all, in the mapping's order).
        n: Only the first ``n`` examples of each grouped split (default: all). The training
            shares are always of the whole ``train`` split.
        batch_size: Examples per forward pass.

    Returns:
        :class:`AnalysisResult` (module docstring: columns and tensors).

    Raises:
        ValueError: A named split is missing or not an MPSP split, or splits of different tasks.
    """
    from interp_toolkit.tasks.mpsp import example_features

    names = list(splits) if split_names is None else list(split_names)
    if not names:
        raise UserError("split_names must name at least one split")
    check_splits(splits, names, model)
    check_positive_int("n", n, allow_none=True)
    check_positive_int("batch_size", batch_size)
    tasks = {name: _task_of(name, splits[name]) for name in names}
    train = splits.get("train")
    train_features = train_anti = None
    if train is not None:
        train_task = _task_of("train", train)
        train_features = example_features(train.values, train_task)
        train_anti = ~train.agrees
    feature_names: list[str] = []
    rows: list[dict[str, Any]] = []
    tensors: dict[str, Tensor] = {}
    for name in names:
        split = splits[name]
        task = tasks[name]
        if train is not None and (task.label, task.shortcut, task.seq_len) != (
                train_task.label, train_task.shortcut, train_task.seq_len):
            raise UserError(f"split {name!r} is of task {task.name} with seq_len {task.seq_len}, but train is of "
                             f"{train_task.name} with seq_len {train_task.seq_len}: their groups do not compare")
        count = len(split.labels) if n is None else min(n, len(split.labels))
        features = example_features(split.values[:count], task)
        predicted = predictions(model, split.tokens[:count], batch_size=batch_size)
        wrong = predicted != split.labels[:count]
        feature_names = list(features)
        rows += group_rows(name, features, wrong, train_features, train_anti)
        tensors[f"{name}_wrong"] = wrong
        tensors[f"{name}_predictions"] = predicted
        tensors[f"{name}_features"] = torch.stack(list(features.values()), dim=-1)
    config = {"split_names": names, "n": n, "features": feature_names}
    return AnalysisResult(Table(rows), tensors, config)


def failing_groups(rows: Sequence[Mapping[str, Any]], split: str = "adv") -> list[dict[str, Any]]:
    """The group(s) that hold a split's wrong examples, from :func:`near_misses` rows.

    Each feature splits the wrong examples over its groups; the feature chosen is the one
    whose groups with wrong examples are the purest (wrong examples / their size), then the
    fewest such groups, then the first in feature order (residue counts first). E.g. a model
    wrong on exactly the 13 all-odd adversarial sequences at length 8: ``n_odd = 8`` (13 of
    13 wrong) beats ``label = 0`` (13 of 1,024).

    Args:
        rows: Rows of one checkpoint (one epoch) of :func:`near_misses`.
        split: Which split's wrong examples.

    Returns:
        The chosen feature's rows with wrong examples (``feature, value, n, n_wrong,
        accuracy, ...``), by value; empty when the split has no wrong example.

    Raises:
        ValueError: ``rows`` hold no row of ``split``, or rows of several epochs.
    """
    mine = [row for row in rows if row.get("split") == split]
    if not mine:
        raise UserError(f"no near_misses row of split {split!r}; splits there: "
                         f"{sorted({str(row.get('split')) for row in rows})}")
    epochs = {row["epoch"] for row in mine if "epoch" in row}
    if len(epochs) > 1:
        raise UserError(f"rows of several epochs {sorted(epochs)}; pass one checkpoint's rows")
    by_feature: dict[str, list[Mapping[str, Any]]] = {}
    for row in mine:
        if row["n_wrong"] > 0:
            by_feature.setdefault(row["feature"], []).append(row)
    if not by_feature:
        return []
    order = list(dict.fromkeys(row["feature"] for row in mine))

    def rank(feature: str) -> tuple[float, int, int]:
        groups = by_feature[feature]
        purity = sum(g["n_wrong"] for g in groups) / sum(g["n"] for g in groups)
        return (-purity, len(groups), order.index(feature))

    best = min(by_feature, key=rank)
    return [dict(row) for row in sorted(by_feature[best], key=lambda g: g["value"])]


def describe_groups(groups: Sequence[Mapping[str, Any]], max_groups: int = 4) -> str:
    """One line naming groups of :func:`failing_groups`, e.g. ``n_odd=8 (13 of 13 wrong)``;
    ``""`` for none. Past ``max_groups`` groups, the rest are counted."""
    parts = [f"{g['feature']}={g['value']} ({g['n_wrong']} of {g['n']} wrong)" for g in groups[:max_groups]]
    if len(groups) > max_groups:
        rest = groups[max_groups:]
        parts.append(f"{len(rest)} more groups ({sum(g['n_wrong'] for g in rest)} wrong)")
    return "; ".join(parts)


__all__ = ["PLOT_FEATURES", "describe_groups", "failing_groups", "group_rows", "near_misses", "predictions"]

callable_module(__name__)  # ``from interp_toolkit.analyses import near_misses`` is callable either way
