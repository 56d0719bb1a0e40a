"""Cross-split activation patching on TransformerLens hooks.

The model runs on a *target* split while activations cached from a *source* split (paired
example by example) are written into one component at one position (or all positions).
The table reports how far the target metric moves toward the source:
``normalized = (patched - target) / (source - target)`` (0: no effect, 1: fully moved).

In ``transformer_lens.patching`` terms the source is the "clean" run and the target the
"corrupted" run; :func:`compute_patching` with ``positions`` and a scalar metric returns
the same ``[component, position]`` values as its ``get_act_patch_*`` functions.

High level: :func:`cross_split_patching` (model + named splits) and
:func:`activation_patching` (model + two token batches). Low level: :func:`compute_patching`
(target tokens + cached source activations -> patched metric values).

Table columns: ``component, kind, layer, head, position, metric, source, target, patched,
normalized`` (``position`` is -1 when every position is patched at once). Tensors:
``patched`` and ``normalized`` [component, position].
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

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
    model: Any,
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
        progress: Show a tqdm bar.
    """
    columns: list[list[int] | None] = [None] if positions is None else [[p] for p in positions]
    out = torch.zeros(len(components), len(columns))
    bar = tqdm(total=out.numel(), desc="patching", disable=not progress)
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


def activation_patching(
    model: Any,
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
        progress: Show a tqdm bar.

    Returns:
        :class:`AnalysisResult` (see the module docstring).
    """
    if not isinstance(source_tokens, Tensor) or not isinstance(target_tokens, Tensor):
        raise ValueError("source_tokens and target_tokens must be tensors")
    if source_tokens.shape != target_tokens.shape or source_tokens.ndim != 2:
        raise ValueError(f"source and target tokens must both be [batch, pos] of one shape, got "
                         f"{tuple(source_tokens.shape)} and {tuple(target_tokens.shape)}")
    if labels.shape != (source_tokens.shape[0],):
        raise ValueError(f"labels must be [{source_tokens.shape[0]}], got {tuple(labels.shape)}")
    check_choice("metric", metric, list(METRICS))
    seq_len = target_tokens.shape[1]
    if positions == "each":
        pos = list(range(seq_len))
    elif isinstance(positions, str):
        raise ValueError(f"positions must be 'each', None or a list of ints, got {positions!r}")
    else:
        pos = check_positions(positions, seq_len)
    check_positions([readout_position], seq_len)
    comps = resolve_components(model, components, kinds)
    metric_fn = readout_metric(metric, labels, readout_position, classes)

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
    normalized = (patched - target_value) / gap if gap != 0 else torch.full_like(patched, float("nan"))
    columns = [-1] if pos is None else pos
    rows = []
    for i, comp in enumerate(comps):
        for j, p in enumerate(columns):
            rows.append({
                "component": comp.name, "kind": comp.kind, "layer": comp.layer,
                "head": -1 if comp.head is None else comp.head, "position": p, "metric": metric,
                "source": source_value, "target": target_value, "patched": float(patched[i, j]),
                "normalized": float(normalized[i, j]),
            })
    config = {"components": [c.name for c in comps], "positions": pos, "metric": metric,
              "readout_position": readout_position, "classes": None if classes is None else list(classes)}
    return AnalysisResult(Table(rows), {"patched": patched, "normalized": normalized}, config)


def cross_split_patching(
    model: Any,
    splits: Mapping[str, Any],
    source: str = "val",
    target: str = "adv",
    labels: str = "target",
    n: int | None = 256,
    **kwargs: Any,
) -> AnalysisResult:
    """Patch activations of split ``source`` into runs on split ``target``.

    Examples are paired by index (the first ``n`` of each split).

    Args:
        model: A TransformerLens model.
        splits: Named splits with ``.tokens`` and ``.labels``.
        source, target: Split names.
        labels: Score against the ``"target"`` or the ``"source"`` split's labels.
        n: Number of pairs (``None``: as many as the smaller split has).
        **kwargs: Passed to :func:`activation_patching` (components, positions, metric ...).
    """
    if source == target:
        raise ValueError(f"patching needs two different splits, got source = target = {source!r}: patching a "
                         f"split into itself changes nothing and every normalized effect is 0/0")
    check_splits(splits, [source, target], model)
    check_choice("labels", labels, ["target", "source"])
    check_positive_int("n", n, allow_none=True)
    src, tgt = splits[source], splits[target]
    if src.tokens.shape[1] != tgt.tokens.shape[1]:
        raise ValueError(f"splits {source!r} and {target!r} have different sequence lengths "
                         f"{src.tokens.shape[1]} and {tgt.tokens.shape[1]}")
    count = min(len(src.labels), len(tgt.labels), n or len(src.labels))
    chosen = (tgt if labels == "target" else src).labels[:count]
    result = activation_patching(model, src.tokens[:count], tgt.tokens[:count], chosen, **kwargs)
    for row in result.rows:
        row["source_split"], row["target_split"] = source, target
    result.config.update({"source": source, "target": target, "labels": labels, "n": count})
    return result


__all__ = ["KINDS", "readout_metric", "compute_patching", "activation_patching", "cross_split_patching"]
