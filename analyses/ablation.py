"""Zero, mean and resample ablation of heads, attention layers, MLPs and the residual stream.

High level: :func:`ablation` (model + named splits -> :class:`AnalysisResult`).
Low level: :func:`compute_replacement` (cached reference activations -> the values patched
in) and :func:`compute_ablation_table` (clean and ablated logits -> tidy rows).

Table columns: ``component, kind, layer, head, split, metric, clean, ablated, delta`` for
``metric`` in ``loss, accuracy, logit_diff`` (at the readout position). Tensors:
``clean`` [split, metric] and ``ablated`` [component, split, metric].
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.utilities import get_act_name

from interp_toolkit.errors import UserError
from interp_toolkit.model import HookedModel
from interp_toolkit.progress import progress_bar

from ._common import (
    METRICS,
    AnalysisResult,
    Table,
    callable_module,
    check_choice,
    check_positions,
    check_positive_int,
    check_splits,
    first_n,
    model_device,
    model_shape,
)

METHODS = ("zero", "mean", "resample")
KINDS = ("head", "attn", "mlp", "resid")


@dataclass(frozen=True)
class Component:
    """One ablatable/patchable piece of the model.

    Attributes:
        name: ``L0H1`` (head), ``attn0``, ``mlp0`` or ``resid_pre0``.
        kind: ``head``, ``attn``, ``mlp`` or ``resid``.
        layer: Block index.
        hook_name: TransformerLens hook whose activation is replaced.
        head: Head index on the hook's head axis (``hook_z``: [batch, pos, head, d_head]).
    """

    name: str
    kind: str
    layer: int
    hook_name: str
    head: int | None = None


def list_components(model: HookedModel, kinds: Sequence[str] = KINDS) -> list[Component]:
    """Every component of ``model`` of the given kinds (MLPs skipped on attention-only models)."""
    for kind in kinds:
        check_choice("component kind", kind, KINDS)
    shape = model_shape(model)
    out: list[Component] = []
    for layer in range(shape["n_layers"]):
        if "resid" in kinds:
            out.append(Component(f"resid_pre{layer}", "resid", layer, get_act_name("resid_pre", layer)))
        if "head" in kinds:
            for head in range(shape["n_heads"]):
                out.append(Component(f"L{layer}H{head}", "head", layer, get_act_name("z", layer), head))
        if "attn" in kinds:
            out.append(Component(f"attn{layer}", "attn", layer, get_act_name("attn_out", layer)))
        if "mlp" in kinds and not shape["attn_only"]:
            out.append(Component(f"mlp{layer}", "mlp", layer, get_act_name("mlp_out", layer)))
    return out


def resolve_components(model: HookedModel, components: Sequence[str | Component] | None,
                       kinds: Sequence[str] = KINDS) -> list[Component]:
    """Components by name (or all of ``kinds`` when ``None``); ValueError on unknown names."""
    available = {c.name: c for c in list_components(model, KINDS)}
    if components is None:
        return list_components(model, kinds)
    out = []
    for comp in components:
        if isinstance(comp, Component):
            out.append(comp)
        elif comp in available:
            out.append(available[comp])
        else:
            raise UserError(f"unknown component {comp!r}; expected one of {sorted(available)}")
    if not out:
        raise UserError("components is empty; pass None for every component")
    return out


def _select(act: Tensor, comp: Component) -> Tensor:
    return act[:, :, comp.head] if comp.head is not None else act


def compute_replacement(
    reference: Float[Tensor, "n_ref pos ..."], method: str, batch: int, seed: int = 0
) -> Float[Tensor, "batch pos ..."] | None:
    """Values that replace a component's activation for a batch of ``batch`` examples.

    Args:
        reference: The component's activations cached on the reference split.
        method: ``zero`` (returns ``None``: the hook writes zeros), ``mean`` (mean over the
            reference examples, per position) or ``resample`` (a reference example drawn
            with replacement, per target example, from a generator seeded by ``seed``).
        batch: Number of target examples.
        seed: Seed of the resampling.
    """
    check_choice("ablation method", method, METHODS)
    if method == "zero":
        return None
    if method == "mean":
        return reference.mean(0, keepdim=True).expand(batch, *reference.shape[1:])
    gen = torch.Generator().manual_seed(int(seed))
    index = torch.randint(0, reference.shape[0], (batch,), generator=gen)
    return reference[index.to(reference.device)]


def replace_hook(act: Tensor, hook: Any, comp: Component, replacement: Tensor | None,
                 positions: list[int] | None) -> Tensor:
    """Hook function: write ``replacement`` (zeros if ``None``) into ``comp`` at ``positions``."""
    pos = slice(None) if positions is None else positions
    target = _select(act, comp)
    if replacement is None:
        target[:, pos] = 0.0
    else:
        target[:, pos] = replacement[:, pos].to(target.dtype)
    return act


def compute_ablation_table(
    clean_logits: Mapping[str, Float[Tensor, "batch vocab"]],
    ablated_logits: Mapping[tuple[str, str], Float[Tensor, "batch vocab"]],
    labels: Mapping[str, Int[Tensor, " batch"]],
    components: Sequence[Component],
    method: str,
) -> tuple[Table, Tensor, Tensor]:
    """Tidy rows from readout logits.

    Args:
        clean_logits: Split name -> readout logits of the unablated model.
        ablated_logits: ``(component name, split)`` -> readout logits with it ablated.
        labels: Split name -> labels.
        components: The ablated components, in table order.
        method: Recorded in the ``method`` column.

    Returns:
        ``(table, clean [split, metric], ablated [component, split, metric])``.
    """
    split_names = list(clean_logits)
    metric_names = list(METRICS)
    clean = torch.tensor([[float(METRICS[m](clean_logits[s], labels[s]).mean()) for m in metric_names]
                          for s in split_names])
    ablated = torch.zeros(len(components), len(split_names), len(metric_names))
    rows = []
    for i, comp in enumerate(components):
        for j, split in enumerate(split_names):
            logits = ablated_logits[(comp.name, split)]
            for k, metric in enumerate(metric_names):
                value = float(METRICS[metric](logits, labels[split]).mean())
                ablated[i, j, k] = value
                rows.append({
                    "component": comp.name, "kind": comp.kind, "layer": comp.layer,
                    "head": -1 if comp.head is None else comp.head, "method": method,
                    "split": split, "metric": metric, "clean": float(clean[j, k]),
                    "ablated": value, "delta": value - float(clean[j, k]),
                })
    return Table(rows), clean, ablated


def ablation(
    model: HookedModel,
    splits: Mapping[str, Any],
    method: str = "mean",
    split_names: Sequence[str] | None = None,
    components: Sequence[str | Component] | None = None,
    kinds: Sequence[str] = KINDS,
    reference: str = "train",
    positions: Sequence[int] | None = None,
    readout_position: int = -1,
    n: int | None = 512,
    seed: int = 0,
    classes: Sequence[int] | None = None,
    progress: bool = False,
) -> AnalysisResult:
    """Ablate every chosen component and measure loss, accuracy and logit difference.

    Args:
        model: A TransformerLens model (``TransformerBridge`` or anything with hooks).
        splits: Named splits with ``.tokens`` [n, pos] and ``.labels`` [n].
        method: ``zero``, ``mean`` (over ``reference``) or ``resample`` (from ``reference``).
        split_names: Splits to measure on (default: every split except ``reference`` when
            there are others).
        components: Component names (``L0H1``, ``attn0``, ``mlp0``, ``resid_pre0``) or
            ``None`` for all components of ``kinds``.
        kinds: Component kinds used when ``components`` is ``None``.
        reference: Split whose activations give the mean / resampled values.
        positions: Sequence positions ablated (default: all).
        readout_position: Position whose logits are scored.
        n: Use at most this many examples of each split (``None``: all).
        seed: Seed of resampling.
        classes: Output indices of the classes (default: all outputs).
        progress: Show a progress bar (plain lines where stderr is not a terminal).

    Returns:
        :class:`AnalysisResult` (see the module docstring for columns and tensors).
    """
    check_choice("method", method, METHODS)
    check_positive_int("n", n, allow_none=True)
    if split_names is None:
        split_names = [s for s in splits if s != reference] or list(splits)
    needed = list(split_names) + ([reference] if method != "zero" else [])
    check_splits(splits, needed, model)
    comps = resolve_components(model, components, kinds)
    seq_len = splits[split_names[0]].tokens.shape[1]
    pos = check_positions(positions, seq_len)
    check_positions([readout_position], seq_len)
    if classes is not None:
        classes = list(classes)

    was_training = model.training
    model.eval()
    device = model_device(model)
    hook_names = sorted({c.hook_name for c in comps})
    try:
        with torch.no_grad():
            ref_acts: dict[str, Tensor] = {}
            if method != "zero":
                ref_tokens, _ = first_n(splits[reference], n)
                _, cache = model.run_with_cache(ref_tokens.to(device), names_filter=lambda name: name in hook_names)
                ref_acts = {name: cache[name] for name in hook_names}
            clean_logits, ablated_logits, labels = {}, {}, {}
            bar = progress_bar(total=len(comps) * len(split_names), desc=f"{method} ablation", disable=not progress)
            for split in split_names:
                tokens, split_labels = first_n(splits[split], n)
                tokens = tokens.to(device)
                labels[split] = split_labels.to(device)

                def readout(logits: Tensor) -> Tensor:
                    out = logits[:, readout_position]
                    return out[:, classes] if classes is not None else out

                clean_logits[split] = readout(model(tokens))
                for comp in comps:
                    replacement = None
                    if method != "zero":
                        replacement = compute_replacement(_select(ref_acts[comp.hook_name], comp), method,
                                                          tokens.shape[0], seed)
                    hook = functools.partial(replace_hook, comp=comp, replacement=replacement, positions=pos)
                    logits = model.run_with_hooks(tokens, fwd_hooks=[(comp.hook_name, hook)])
                    ablated_logits[(comp.name, split)] = readout(logits)
                    bar.update()
            bar.close()
    finally:
        model.train(was_training)
    table, clean, ablated = compute_ablation_table(clean_logits, ablated_logits, labels, comps, method)
    config = {"method": method, "split_names": list(split_names), "components": [c.name for c in comps],
              "reference": reference, "positions": pos, "readout_position": readout_position, "n": n,
              "seed": seed, "classes": classes}
    return AnalysisResult(table, {"clean": clean, "ablated": ablated}, config)


zero_ablation = functools.partial(ablation, method="zero")
mean_ablation = functools.partial(ablation, method="mean")
resample_ablation = functools.partial(ablation, method="resample")

__all__ = ["Component", "METHODS", "KINDS", "list_components", "resolve_components", "compute_replacement",
           "replace_hook", "compute_ablation_table", "ablation", "zero_ablation", "mean_ablation",
           "resample_ablation"]

callable_module(__name__)  # ``from interp_toolkit.analyses import ablation`` is callable either way
