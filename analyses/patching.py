"""Activation patching on TransformerLens hooks: minimal-pair cross-split patching, and the
index-paired resample-ablation damage.

The model runs on a *target* input while activations cached from a *source* input are
written into one component at one position (or all positions). The table reports how far
the target metric moves toward the source:
``normalized = (patched - target) / gap`` with ``gap = source - target`` (0: target
behaviour, 1: source behaviour).

When the source and target metrics nearly agree the ratio divides by noise (a gap of 0.06
logits turns a 0.06 shift into "full transfer"), so ``normalized`` is left blank (NaN) when
``|gap| < max(gap_atol, gap_rtol * max(|source|, |target|))``, by default
:data:`GAP_ATOL` = 1e-3 and :data:`GAP_RTOL` = 0.05 (the gap is under 5% of the larger
metric). A warning names how many entries were blanked; ``gap``, ``patched`` and the raw
shift ``patched - target`` stay in the table, and plots draw NaN as a break in the line.

* :func:`minimal_pair_patching` (registered as ``patching``):
  the paper's cross-split patching. Pairs from ``tasks.mpsp.minimal_pairs``: each source
  example of one split (``val``: shortcut-consistent, or ``adv``: conflicting) and a copy
  that differs in one token, changed by the smallest step that moves the label while the
  shortcut feature stays, so the pair flips agreement. The metric is the logit difference
  between the source's label and the target's label at the readout, so a component that
  carries the label (the rule) moves it to ~1 and one that carries the shortcut (equal
  within a pair) leaves it at ~0.
* :func:`resample_ablation_damage`: the index-paired mode (the i-th example of one split
  patched into the i-th of another, which differ in every token and in their labels). It
  measures how much a component's activation from an unrelated input damages the metric:
  resample-ablation damage, not a causal transfer of one feature.

In ``transformer_lens.patching`` terms the source is the "clean" run and the target the
"corrupted" run; :func:`compute_patching` with ``positions`` and a scalar metric returns
the same ``[component, position]`` values as its ``get_act_patch_*`` functions.

High level: :func:`minimal_pair_patching`, :func:`resample_ablation_damage` (model + named
splits) and :func:`activation_patching` (model + two token batches). Low level:
:func:`compute_patching` (target tokens + cached source activations -> patched metric values).

Table columns: ``component, kind, layer, head, position, metric, source, target, gap, patched,
normalized`` (``position`` is -1 when every position is patched at once), plus
``source_split, target_split`` for the split-level calls. Tensors: ``patched`` and
``normalized`` [component, position].
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any, Callable, Mapping, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_toolkit.errors import UserError
from interp_toolkit.model import HookedModel
from interp_toolkit.progress import progress_bar

from ._common import (
    METRICS,
    AnalysisResult,
    Table,
    check_choice,
    check_positions,
    check_positive_int,
    check_splits,
    model_device,
)
from .ablation import KINDS, Component, replace_hook, resolve_components

Metric = Callable[[Float[Tensor, "batch pos vocab"]], Float[Tensor, ""]]

#: ``normalized`` is NaN when ``|gap|`` is under this (absolute, in the metric's units) ...
GAP_ATOL = 1e-3
#: ... or under this fraction of ``max(|source|, |target|)``, whichever is larger.
GAP_RTOL = 0.05


def gap_tolerance(source: float, target: float, gap_atol: float = GAP_ATOL,
                  gap_rtol: float = GAP_RTOL) -> float:
    """The smallest ``|source - target|`` that ``normalized`` divides by.

    Args:
        source, target: The unpatched metric on the source and on the target input.
        gap_atol: Absolute floor, in the metric's units.
        gap_rtol: Fraction of the larger of ``|source|`` and ``|target|``.

    Returns:
        ``max(gap_atol, gap_rtol * max(|source|, |target|))``.
    """
    return max(gap_atol, gap_rtol * max(abs(source), abs(target)))


def normalize_patching(patched: Float[Tensor, "component position"], source: float, target: float,
                       gap_atol: float = GAP_ATOL, gap_rtol: float = GAP_RTOL,
                       ) -> Float[Tensor, "component position"]:
    """``(patched - target) / (source - target)``, NaN everywhere when the gap is under tolerance.

    Warns (``UserWarning``) with the gap, the tolerance and how many entries were blanked.

    Args:
        patched: Metric of the target run with each component patched.
        source, target: The unpatched metric on the source and on the target input.
        gap_atol, gap_rtol: See :func:`gap_tolerance`.
    """
    for name, value in (("gap_atol", gap_atol), ("gap_rtol", gap_rtol)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise UserError(f"{name} must be a number >= 0, got {value!r}")
    gap = source - target
    tolerance = gap_tolerance(source, target, gap_atol, gap_rtol)
    if math.isfinite(gap) and abs(gap) >= tolerance and gap != 0:
        return (patched - target) / gap
    warnings.warn(
        f"patching: source and target metrics differ by {gap:.3g} ({source:.4g} vs {target:.4g}), under the "
        f"tolerance {tolerance:.3g} (max(gap_atol={gap_atol:g}, gap_rtol={gap_rtol:g} * max |metric|)); "
        f"normalized is NaN for all {patched.numel()} entries (the change column holds the raw change, patched - "
        "target)",
        stacklevel=4,  # the caller of activation_patching / minimal_pair_patching
    )
    return torch.full_like(patched, float("nan"))


def readout_metric(name: str, labels: Int[Tensor, " batch"], readout_position: int = -1,
                   classes: Sequence[int] | None = None) -> Metric:
    """Scalar metric of full logits: mean ``loss``, ``accuracy`` or ``logit_diff`` at the readout."""
    check_choice("metric", name, list(METRICS))

    def metric(logits: Tensor) -> Tensor:
        out = logits[:, readout_position]
        if classes is not None:
            out = out[:, list(classes)]
        return METRICS[name](out, labels.to(out.device)).mean()

    return metric


def compute_patching(
    model: HookedModel,
    target_tokens: Int[Tensor, "batch pos"],
    source_acts: Mapping[str, Tensor],
    components: Sequence[Component],
    positions: Sequence[int] | None,
    metric: Metric,
    progress: bool = False,
) -> Float[Tensor, "component position"]:
    """Metric of the target run with each component patched from cached source activations.

    Args:
        model: A TransformerLens model (in eval mode).
        target_tokens: The target run's input.
        source_acts: Hook name -> source activations (same batch size as the target).
        components: What to patch.
        positions: Patch each of these positions separately; ``None`` patches all
            positions at once (one column).
        metric: Logits -> scalar.
        progress: Show a progress bar (plain lines where stderr is not a terminal).
    """
    columns: list[list[int] | None] = [None] if positions is None else [[p] for p in positions]
    out = torch.zeros(len(components), len(columns))
    bar = progress_bar(total=out.numel(), desc="patching", disable=not progress)
    with torch.no_grad():
        for i, comp in enumerate(components):
            source = source_acts[comp.hook_name]
            if comp.head is not None:
                source = source[:, :, comp.head]
            for j, pos in enumerate(columns):
                hook = functools.partial(replace_hook, comp=comp, replacement=source, positions=pos)
                logits = model.run_with_hooks(target_tokens, fwd_hooks=[(comp.hook_name, hook)])
                out[i, j] = float(metric(logits))
                bar.update()
    bar.close()
    return out


def pair_logit_diff_metric(source_labels: Int[Tensor, " batch"], target_labels: Int[Tensor, " batch"],
                           readout_position: int = -1) -> Metric:
    """Mean of ``logit[source label] - logit[target label]`` at the readout, pair by pair."""

    def metric(logits: Tensor) -> Tensor:
        out = logits[:, readout_position]
        rows = torch.arange(out.shape[0], device=out.device)
        return (out[rows, source_labels.to(out.device)] - out[rows, target_labels.to(out.device)]).mean()

    return metric


def _check_patching_inputs(source_tokens: Tensor, target_tokens: Tensor, positions: Any,
                           readout_position: int) -> list[int] | None:
    if not isinstance(source_tokens, Tensor) or not isinstance(target_tokens, Tensor):
        raise UserError("source_tokens and target_tokens must be tensors")
    if source_tokens.shape != target_tokens.shape or source_tokens.ndim != 2:
        raise UserError(f"source and target tokens must both be [batch, pos] of one shape, got "
                         f"{tuple(source_tokens.shape)} and {tuple(target_tokens.shape)}")
    seq_len = target_tokens.shape[1]
    if positions == "each":
        pos = list(range(seq_len))
    elif isinstance(positions, str):
        raise UserError(f"positions must be 'each', None or a list of ints, got {positions!r}")
    else:
        pos = check_positions(positions, seq_len)
    check_positions([readout_position], seq_len)
    return pos


def _patch_and_tabulate(model: HookedModel, source_tokens: Tensor, target_tokens: Tensor, comps: Sequence[Component],
                        pos: list[int] | None, metric_fn: Metric, metric_name: str,
                        progress: bool, gap_atol: float = GAP_ATOL,
                        gap_rtol: float = GAP_RTOL) -> tuple[list[dict[str, Any]], Tensor, Tensor]:
    was_training = model.training
    model.eval()
    device = model_device(model)
    hook_names = sorted({c.hook_name for c in comps})
    try:
        with torch.no_grad():
            source_logits, cache = model.run_with_cache(source_tokens.to(device),
                                                        names_filter=lambda name: name in hook_names)
            source_acts = {name: cache[name] for name in hook_names}
            target_tokens = target_tokens.to(device)
            source_value = float(metric_fn(source_logits))
            target_value = float(metric_fn(model(target_tokens)))
            patched = compute_patching(model, target_tokens, source_acts, comps, pos, metric_fn, progress)
    finally:
        model.train(was_training)
    gap = source_value - target_value
    normalized = normalize_patching(patched, source_value, target_value, gap_atol, gap_rtol)
    columns = [-1] if pos is None else pos
    rows = []
    for i, comp in enumerate(comps):
        for j, p in enumerate(columns):
            rows.append({
                "component": comp.name, "kind": comp.kind, "layer": comp.layer,
                "head": -1 if comp.head is None else comp.head, "position": p, "metric": metric_name,
                "source": source_value, "target": target_value, "gap": gap, "patched": float(patched[i, j]),
                # the raw change in the metric: defined (and shown) where normalized is blank
                "change": float(patched[i, j]) - target_value, "normalized": float(normalized[i, j]),
            })
    return rows, patched, normalized


def activation_patching(
    model: HookedModel,
    source_tokens: Int[Tensor, "batch pos"],
    target_tokens: Int[Tensor, "batch pos"],
    labels: Int[Tensor, " batch"],
    components: Sequence[str | Component] | None = None,
    kinds: Sequence[str] = ("resid", "head", "attn", "mlp"),
    positions: Sequence[int] | None | str = "each",
    metric: str = "logit_diff",
    readout_position: int = -1,
    classes: Sequence[int] | None = None,
    progress: bool = False,
    gap_atol: float = GAP_ATOL,
    gap_rtol: float = GAP_RTOL,
) -> AnalysisResult:
    """Patch source activations into the target run, component by component.

    Args:
        model: A TransformerLens model.
        source_tokens, target_tokens: Paired inputs of equal shape.
        labels: Labels the metric is scored against (e.g. the target's labels).
        components: Component names or ``None`` for every component of ``kinds``.
        kinds: Component kinds used when ``components`` is ``None``.
        positions: ``"each"`` (every position separately), ``None`` (all at once) or a
            list of positions (each separately).
        metric: ``logit_diff``, ``loss`` or ``accuracy`` at ``readout_position``.
        readout_position: Position whose logits are scored.
        classes: Output indices of the classes (default: all outputs).
        progress: Show a progress bar (plain lines where stderr is not a terminal).
        gap_atol, gap_rtol: ``normalized`` is NaN (with a warning) when
            ``|source - target|`` is under ``max(gap_atol, gap_rtol * max(|source|, |target|))``.

    Returns:
        :class:`AnalysisResult` (see the module docstring).
    """
    pos = _check_patching_inputs(source_tokens, target_tokens, positions, readout_position)
    if labels.shape != (source_tokens.shape[0],):
        raise UserError(f"labels must be [{source_tokens.shape[0]}], got {tuple(labels.shape)}")
    check_choice("metric", metric, list(METRICS))
    comps = resolve_components(model, components, kinds)
    metric_fn = readout_metric(metric, labels, readout_position, classes)
    rows, patched, normalized = _patch_and_tabulate(model, source_tokens, target_tokens, comps, pos, metric_fn,
                                                    metric, progress, gap_atol, gap_rtol)
    config = {"components": [c.name for c in comps], "positions": pos, "metric": metric,
              "readout_position": readout_position, "classes": None if classes is None else list(classes),
              "gap_atol": gap_atol, "gap_rtol": gap_rtol}
    return AnalysisResult(Table(rows), {"patched": patched, "normalized": normalized}, config)


def has_minimal_pairs(split: Any) -> bool:
    """Whether :func:`minimal_pair_patching` can pair ``split``: an MPSP split (its task makes
    the pairs) or one with its own ``minimal_pairs(seed)``."""
    return getattr(split, "task", None) is not None or callable(getattr(split, "minimal_pairs", None))


def minimal_pair_patching(
    model: HookedModel,
    splits: Mapping[str, Any],
    source: str = "val",
    target: str = "adv",
    n: int | None = 256,
    seed: int = 0,
    components: Sequence[str | Component] | None = None,
    kinds: Sequence[str] = ("resid", "head", "attn", "mlp"),
    positions: Sequence[int] | None | str = "each",
    readout_position: int = -1,
    progress: bool = False,
    gap_atol: float = GAP_ATOL,
    gap_rtol: float = GAP_RTOL,
) -> AnalysisResult:
    """Cross-split patching with minimal pairs (the paper's measurement).

    Source examples are the first examples of split ``source`` that have a minimal edit;
    each target is that example with one token changed (``tasks.mpsp.minimal_pairs``):
    the label moves, the shortcut feature stays, agreement with the shortcut flips. So
    ``source="val", target="adv"`` patches shortcut-consistent activations into
    conflicting runs, and ``source="adv", target="val"`` the reverse direction.

    Metric: ``logit[source label] - logit[target label]`` at the readout (mean over pairs),
    normalized per component so that 0 = target behaviour and 1 = source behaviour.

    Args:
        model: A TransformerLens model.
        splits: Named MPSP splits (made by ``make_split``/``make_splits``, which record the
            task); ``source`` provides the examples.
        source, target: Split names: one shortcut-consistent (r = 1) and one conflicting
            (r = 0) split; ``target`` names the kind of the edited examples.
        n: At most this many pairs (``None``: every example of ``source`` that has an edit;
            examples without one, rare, are skipped).
        seed: Tie-breaking seed of the pair generation.
        components, kinds, positions, readout_position, progress, gap_atol, gap_rtol: As in
            :func:`activation_patching`.

    Returns:
        :class:`AnalysisResult`; rows also hold ``source_split``, ``target_split``,
        ``n_pairs``; the config records ``n`` (pairs used).
    """
    from interp_toolkit.tasks.mpsp import minimal_pairs

    check_splits(splits, [source, target], model)
    check_positive_int("n", n, allow_none=True)
    if source == target:
        raise UserError(f"source and target splits must differ, got {source!r} for both")
    src, tgt = splits[source], splits[target]
    kinds_of = {}
    for name, split in ((source, src), (target, tgt)):
        agrees = getattr(split, "agrees", None)
        if agrees is None:
            raise UserError(f"split {name!r} has no .agrees (which examples follow the shortcut): minimal-pair "
                             "patching needs it on both splits (an MPSP split, or a custom task's split with "
                             ".agrees; docs/custom_tasks.md)")
        if bool(agrees.all()):
            kinds_of[name] = "consistent"
        elif not bool(agrees.any()):
            kinds_of[name] = "conflicting"
        else:
            raise UserError(f"split {name!r} mixes shortcut-consistent and conflicting examples (r = "
                             f"{float(agrees.float().mean()):.3g}); minimal-pair patching needs one split at "
                             "r = 1 and one at r = 0 (e.g. val and adv)")
    if kinds_of[source] == kinds_of[target]:
        raise UserError(f"splits {source!r} and {target!r} are both shortcut-{kinds_of[source]}; expected one "
                         "consistent (r = 1) and one conflicting (r = 0)")
    # validate positions and components before building pairs (pairs keep the source's shape)
    pos = _check_patching_inputs(src.tokens, src.tokens, positions, readout_position)
    comps = resolve_components(model, components, kinds)
    if not has_minimal_pairs(src):
        raise UserError(f"split {source!r} provides no minimal pairs: minimal-pair patching needs an MPSP split "
                         "(make_split) or a split with a minimal_pairs(seed) method returning pairs one token "
                         "apart whose shortcut agreement flips (docs/custom_tasks.md)")
    if getattr(src, "task", None) is not None:
        pairs = minimal_pairs(src, seed=seed)
    else:  # a custom task's own pairs
        pairs = src.minimal_pairs(seed=seed)
    if n is not None:
        pairs = pairs.head(n)
    source_tokens, target_tokens = pairs.source.tokens, pairs.target.tokens
    metric_fn = pair_logit_diff_metric(pairs.source.labels, pairs.target.labels, readout_position)
    rows, patched, normalized = _patch_and_tabulate(model, source_tokens, target_tokens, comps, pos, metric_fn,
                                                    "pair_logit_diff", progress, gap_atol, gap_rtol)
    for row in rows:
        row["source_split"], row["target_split"], row["n_pairs"] = source, target, len(pairs)
    config = {"components": [c.name for c in comps], "positions": pos, "metric": "pair_logit_diff",
              "readout_position": readout_position, "source": source, "target": target, "n": len(pairs),
              "seed": seed, "pairs": "minimal", "gap_atol": gap_atol, "gap_rtol": gap_rtol}
    return AnalysisResult(Table(rows), {"patched": patched, "normalized": normalized}, config)


#: The paper's cross-split patching is the minimal-pair one.


def resample_ablation_damage(
    model: HookedModel,
    splits: Mapping[str, Any],
    source: str = "val",
    target: str = "adv",
    labels: str = "target",
    n: int | None = 256,
    **kwargs: Any,
) -> AnalysisResult:
    """Index-paired patching: resample-ablation damage of each component.

    The i-th example of split ``source`` is patched into the run on the i-th example of
    ``target`` (the first ``n`` of each). The two differ in every token and in their labels,
    so this does not transfer one feature: it measures how much replacing a component's
    activation with one from an unrelated input of the other split damages (or moves) the
    metric scored against ``labels``. For the causal cross-split measurement use
    :func:`minimal_pair_patching`.

    Args:
        model: A TransformerLens model.
        splits: Named splits with ``.tokens`` and ``.labels``.
        source, target: Split names.
        labels: Score against the ``"target"`` or the ``"source"`` split's labels.
        n: Number of pairs (``None``: as many as the smaller split has).
        **kwargs: Passed to :func:`activation_patching` (components, positions, metric ...).
    """
    if source == target:
        raise UserError(f"patching needs two different splits, got source = target = {source!r}: patching a "
                         f"split into itself changes nothing and every normalized effect is 0/0")
    check_splits(splits, [source, target], model)
    check_choice("labels", labels, ["target", "source"])
    check_positive_int("n", n, allow_none=True)
    src, tgt = splits[source], splits[target]
    if src.tokens.shape[1] != tgt.tokens.shape[1]:
        raise UserError(f"splits {source!r} and {target!r} have different sequence lengths "
                         f"{src.tokens.shape[1]} and {tgt.tokens.shape[1]}")
    count = min(len(src.labels), len(tgt.labels), n or len(src.labels))
    chosen = (tgt if labels == "target" else src).labels[:count]
    result = activation_patching(model, src.tokens[:count], tgt.tokens[:count], chosen, **kwargs)
    for row in result.rows:
        row["source_split"], row["target_split"] = source, target
    result.config.update({"source": source, "target": target, "labels": labels, "n": count})
    return result


__all__ = ["GAP_ATOL", "GAP_RTOL", "KINDS", "activation_patching", "compute_patching", "has_minimal_pairs",
           "gap_tolerance", "minimal_pair_patching", "normalize_patching", "pair_logit_diff_metric",
           "readout_metric", "resample_ablation_damage"]
