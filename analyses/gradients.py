"""Per-example gradients (torch.func) and gradient conflict between shortcut groups.

For a split whose examples are marked shortcut-consistent (``agrees``) or anti-shortcut,
per parameter group (``all``, ``embed``, each head's ``QK`` and ``OV``, each ``mlp``,
``unembed``, ``ln``, ``other``):

* ``conflict_cos``: cosine between the mean gradient of consistent and of anti examples;
* ``norm_consistent`` / ``norm_anti``: mean per-example gradient norm of each group, and
  ``amplification`` = ``norm_anti / norm_consistent``;
* ``minority`` (``anti``, ``consistent`` or ``none`` on a tie: the smaller group of the split)
  and ``minority_amplification`` = minority norm / majority norm, the shortcut-saturation
  paper's "gradient amplification of the minority" (:func:`minority_amplification`). It equals
  ``amplification`` when anti-shortcut examples are the minority (r > 0.5) and is its inverse
  below r = 0.5, where the shortcut-consistent examples are the minority;
* the distribution of per-example cosines of anti examples to the consistent mean gradient
  (``anti_cos_mean``, ``anti_cos_q10/q50/q90``, ``anti_frac_negative``) and of consistent
  examples to the anti mean (``cons_cos_mean``).

Per-example gradients come from ``vmap(grad(loss))`` over ``functional_call`` of the model,
in chunks of ``chunk_size`` examples; only per-example norms and dot products are kept,
so memory is bounded by one chunk's gradients whatever the split size. The two mean
gradients come from ordinary backward passes.

High level: :func:`gradient_conflict`. Low level: :func:`per_example_grads`,
:func:`group_gradients`, :func:`compute_gradient_conflict` (on stored per-example
gradients). Groups: :func:`parameter_groups`.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, cast

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor
from torch.func import functional_call, grad, vmap

from interp_toolkit.errors import UserError
from interp_toolkit.model import HookedModel
from interp_toolkit.progress import progress_bar

from ._common import (
    AnalysisResult,
    Table,
    check_positions,
    check_positive_int,
    check_splits,
    first_n,
    model_device,
    model_shape,
)

# A group is a list of (raw parameter name, index into one example's gradient).
Groups = dict[str, list[tuple[str, tuple]]]
_ATTN = re.compile(r"^blocks\.(\d+)\.attn\.([qkvo])\.(weight|bias)$")
_MLP = re.compile(r"^blocks\.(\d+)\.mlp\.")
_LN = re.compile(r"^(blocks\.\d+\.ln\d|ln_final)\.")


def parameter_names(model: HookedModel) -> dict[str, str]:
    """Raw parameter path (``named_parameters``) -> TransformerLens state-dict key."""
    by_ptr = {v.data_ptr(): k for k, v in model.state_dict().items()}
    return {name: by_ptr.get(p.data_ptr(), name) for name, p in model.named_parameters() if p.requires_grad}


def parameter_groups(model: HookedModel) -> Groups:
    """Parameter groups: ``all``, ``embed``, ``L{l}H{h}.QK``, ``L{l}H{h}.OV``, ``mlp{l}``,
    ``unembed``, ``ln``, ``other`` (attention output biases and anything unrecognized).

    Head slices follow the ``nn.Linear`` layout of the TransformerLens state dict: rows
    ``h*d_head:(h+1)*d_head`` of q/k/v (weights and biases), columns of o.
    """
    shape = model_shape(model)
    d_head = shape["d_head"]
    groups: Groups = {"all": []}
    params = dict(model.named_parameters())

    def add(group: str, raw: str, index: tuple = ()) -> None:
        groups.setdefault(group, []).append((raw, index))

    for raw, tl in parameter_names(model).items():
        groups["all"].append((raw, ()))
        match = _ATTN.match(tl)
        if match:
            layer, which, kind = int(match.group(1)), match.group(2), match.group(3)
            if which == "o" and kind == "bias":
                add("other", raw)
                continue
            n_heads = params[raw].shape[1 if which == "o" and kind == "weight" else 0] // d_head
            for head in range(n_heads):
                rows = slice(head * d_head, (head + 1) * d_head)
                index = (slice(None), rows) if which == "o" else (rows,)
                add(f"L{layer}H{head}.{'QK' if which in 'qk' else 'OV'}", raw, index)
        elif tl.startswith(("embed.", "pos_embed.")):
            add("embed", raw)
        elif (mlp := _MLP.match(tl)) is not None:
            add(f"mlp{mlp.group(1)}", raw)
        elif tl.startswith("unembed."):
            add("unembed", raw)
        elif _LN.match(tl):
            add("ln", raw)
        else:
            add("other", raw)
    return groups


def _loss_fn(model: HookedModel, buffers: dict[str, Tensor], position: int):
    def loss(params: dict[str, Tensor], tokens: Tensor, label: Tensor) -> Tensor:
        # tie_weights=False: the bridge registers each parameter under two paths; with the
        # default tie handling, functional_call leaves detached tensors in the model
        # afterwards (ordinary autograd then no longer reaches them).
        module = cast(torch.nn.Module, model)  # a HookedModel is an nn.Module (bridge or HookedTransformer)
        logits = functional_call(module, (params, buffers), (tokens[None],), tie_weights=False)
        return F.cross_entropy(logits[:, position], label[None])

    return loss


def per_example_grads(
    model: HookedModel,
    tokens: Int[Tensor, "n pos"],
    labels: Int[Tensor, " n"],
    readout_position: int = -1,
    chunk_size: int = 256,
) -> dict[str, Float[Tensor, "n ..."]]:
    """Gradient of each example's readout cross-entropy, per raw parameter name.

    Uses ``vmap(grad(loss))`` over ``torch.func.functional_call`` in chunks of
    ``chunk_size``. Stores every gradient: use :func:`gradient_conflict` for large n.
    """
    check_positive_int("chunk_size", chunk_size)
    out: dict[str, list[Tensor]] = {}
    for chunk in _chunked_grads(model, tokens, labels, readout_position, chunk_size):
        for name, g in chunk.items():
            out.setdefault(name, []).append(g)
    return {name: torch.cat(parts) for name, parts in out.items()}


def _chunked_grads(model: HookedModel, tokens: Tensor, labels: Tensor, position: int, chunk_size: int,
                   progress: bool = False):
    device = model_device(model)
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    grad_fn = vmap(grad(_loss_fn(model, buffers, position)), in_dims=(None, 0, 0))
    for start in progress_bar(range(0, tokens.shape[0], chunk_size), desc="per-example grads", disable=not progress):
        yield grad_fn(params, tokens[start:start + chunk_size].to(device), labels[start:start + chunk_size].to(device))


def group_gradients(grads: Mapping[str, Tensor], groups: Groups) -> dict[str, Float[Tensor, "n d"]]:
    """Flatten per-example gradients ``{raw name: [n, ...]}`` into ``{group: [n, d]}``."""
    out = {}
    for group, members in groups.items():
        parts = []
        for raw, index in members:
            key = (slice(None), *index)  # named: mypy reads x[(a, *b)] as 3.11's x[a, *b]
            parts.append(grads[raw][key].reshape(grads[raw].shape[0], -1))
        if parts:
            out[group] = torch.cat(parts, dim=1)
    return out


def _flat_mean(grads: Mapping[str, Tensor], members: list[tuple[str, tuple]]) -> Tensor:
    return torch.cat([grads[raw][index].reshape(-1) for raw, index in members])


def _summarize(group: str, norms: Tensor, cos_cons: Tensor, cos_anti: Tensor, mean_cons: Tensor,
               mean_anti: Tensor, agrees: Tensor) -> dict[str, Any]:
    anti, cons = ~agrees, agrees
    conflict = F.cosine_similarity(mean_cons[None], mean_anti[None], eps=1e-30)[0]
    norm_c = norms[cons].mean() if cons.any() else torch.tensor(float("nan"))
    norm_a = norms[anti].mean() if anti.any() else torch.tensor(float("nan"))
    anti_cos = cos_cons[anti]
    n_consistent, n_anti = int(cons.sum()), int(anti.sum())
    minority = minority_group(n_consistent, n_anti)
    quantiles = (torch.quantile(anti_cos.double(), torch.tensor([0.1, 0.5, 0.9], dtype=torch.double))
                 if anti_cos.numel() else torch.full((3,), float("nan")))
    return {
        "group": group, "conflict_cos": float(conflict),
        "norm_consistent": float(norm_c), "norm_anti": float(norm_a),
        "amplification": float(norm_a / norm_c),
        "mean_grad_norm_consistent": float(mean_cons.norm()), "mean_grad_norm_anti": float(mean_anti.norm()),
        "anti_cos_mean": float(anti_cos.mean()) if anti_cos.numel() else float("nan"),
        "anti_cos_q10": float(quantiles[0]), "anti_cos_q50": float(quantiles[1]),
        "anti_cos_q90": float(quantiles[2]),
        "anti_frac_negative": float((anti_cos < 0).float().mean()) if anti_cos.numel() else float("nan"),
        "cons_cos_mean": float(cos_anti[cons].mean()) if cons.any() else float("nan"),
        "n_consistent": n_consistent, "n_anti": n_anti,
        "minority": minority, "minority_amplification": minority_amplification(float(norm_c), float(norm_a), minority),
    }


def minority_group(n_consistent: float, n_anti: float) -> str:
    """Which shortcut group is the minority of a split, given the two groups' counts (or
    fractions): ``"anti"``, ``"consistent"`` or ``"none"`` (equal)."""
    if n_consistent == n_anti:
        return "none"
    return "anti" if n_anti < n_consistent else "consistent"


def minority_amplification(norm_consistent: float, norm_anti: float, minority: str) -> float:
    """Mean per-example gradient norm of the minority group over that of the majority.

    The shortcut-saturation paper's amplification of the minority (9-17x at r = 0.9).

    Args:
        norm_consistent: Mean per-example gradient norm of shortcut-consistent examples.
        norm_anti: Mean per-example gradient norm of anti-shortcut examples.
        minority: ``"anti"``, ``"consistent"`` or ``"none"`` (see :func:`minority_group`).

    Returns:
        ``norm_anti / norm_consistent`` when the anti-shortcut examples are the minority, its
        inverse when the consistent ones are, NaN when neither group is (``"none"``).

    Raises:
        ValueError: If ``minority`` is not one of the three names.
    """
    if minority not in ("anti", "consistent", "none"):
        raise UserError(f"minority must be 'anti', 'consistent' or 'none', got {minority!r}")
    if minority == "none":
        return float("nan")
    numerator, denominator = (norm_anti, norm_consistent) if minority == "anti" else (norm_consistent, norm_anti)
    if denominator == 0:  # as the tensor ratio of ``amplification``: inf, or NaN for 0 / 0
        return float("nan") if numerator == 0 else float("inf")
    return numerator / denominator


def _cos(x: Tensor, mean: Tensor) -> Tensor:
    return (x @ mean) / (x.norm(dim=1) * mean.norm()).clamp_min(1e-30)


def compute_gradient_conflict(
    grads: Mapping[str, Float[Tensor, "n d"]], agrees: Bool[Tensor, " n"],
) -> AnalysisResult:
    """Gradient-conflict statistics from stored, grouped per-example gradients.

    Args:
        grads: Group name -> per-example flattened gradients [n, d] (see
            :func:`group_gradients`).
        agrees: True for shortcut-consistent examples.

    Returns:
        :class:`AnalysisResult`: one row per group (module docstring) and tensors
        ``norms/<group>``, ``cos_to_consistent/<group>``, ``cos_to_anti/<group>`` [n].
    """
    _check_agrees(agrees, next(iter(grads.values())).shape[0])
    rows, tensors = [], {}
    for group, g in grads.items():
        mean_c, mean_a = g[agrees].mean(0), g[~agrees].mean(0)
        norms, cos_c, cos_a = g.norm(dim=1), _cos(g, mean_c), _cos(g, mean_a)
        rows.append(_summarize(group, norms, cos_c, cos_a, mean_c, mean_a, agrees))
        tensors.update({f"norms/{group}": norms, f"cos_to_consistent/{group}": cos_c,
                        f"cos_to_anti/{group}": cos_a})
    return AnalysisResult(Table(rows), tensors)


def _check_agrees(agrees: Any, n: int) -> None:
    if not isinstance(agrees, Tensor) or agrees.dtype != torch.bool or agrees.shape != (n,):
        raise UserError(f"agrees must be a bool tensor of shape [{n}], got "
                         f"{getattr(agrees, 'dtype', type(agrees).__name__)} {tuple(getattr(agrees, 'shape', ()))}")
    if agrees.all() or not agrees.any():
        raise UserError("agrees must mark at least one shortcut-consistent and one anti-shortcut example")


def _mean_grads(model: HookedModel, tokens: Tensor, labels: Tensor, position: int, chunk: int) -> dict[str, Tensor]:
    device = model_device(model)
    params = [p for p in model.parameters() if p.requires_grad]
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    for start in range(0, tokens.shape[0], chunk):
        logits = model(tokens[start:start + chunk].to(device))
        loss = F.cross_entropy(logits[:, position], labels[start:start + chunk].to(device), reduction="sum")
        # allow_unused: some bridges register parameters the forward does not use (the
        # boot_transformers GPTNeoX bridge holds both split q/k/v and the fused qkv).
        for acc, g in zip(total, torch.autograd.grad(loss, params, allow_unused=True), strict=True):
            if g is not None:
                acc += g
    return {n: t / tokens.shape[0] for n, t in zip(names, total, strict=True)}


def gradient_conflict(
    model: HookedModel,
    splits: Mapping[str, Any],
    split: str = "train",
    readout_position: int = -1,
    n: int | None = 4096,
    chunk_size: int = 256,
    groups: Groups | None = None,
    progress: bool = False,
) -> AnalysisResult:
    """Gradient conflict between shortcut-consistent and anti-shortcut examples of a split.

    Args:
        model: A TransformerLens model.
        splits: Named splits; ``splits[split]`` needs ``.tokens``, ``.labels`` and a bool
            ``.agrees`` (shortcut == label).
        split: Which split.
        readout_position: Position of the loss.
        n: Use at most this many examples (``None``: all).
        chunk_size: Examples per vmap call (bounds memory).
        groups: Parameter groups (default :func:`parameter_groups`).
        progress: Show a progress bar (plain lines where stderr is not a terminal).

    Returns:
        :class:`AnalysisResult` as :func:`compute_gradient_conflict`.
    """
    check_splits(splits, [split], model)
    check_positive_int("n", n, allow_none=True)
    check_positive_int("chunk_size", chunk_size)
    data = splits[split]
    tokens, labels = first_n(data, n)
    agrees = getattr(data, "agrees", None)
    if agrees is None:
        raise UserError(f"split {split!r} has no .agrees (which examples follow the shortcut)")
    agrees = agrees[: tokens.shape[0]].cpu()
    _check_agrees(agrees, tokens.shape[0])
    check_positions([readout_position], tokens.shape[1])
    groups = parameter_groups(model) if groups is None else groups

    was_training = model.training
    model.eval()
    try:
        mean_c = _mean_grads(model, tokens[agrees], labels[agrees], readout_position, chunk_size)
        mean_a = _mean_grads(model, tokens[~agrees], labels[~agrees], readout_position, chunk_size)
        flat_c = {g: _flat_mean(mean_c, m).detach().cpu() for g, m in groups.items() if m}
        flat_a = {g: _flat_mean(mean_a, m).detach().cpu() for g, m in groups.items() if m}
        parts_c = {g: [mean_c[raw][index].reshape(-1) for raw, index in groups[g]] for g in flat_c}
        parts_a = {g: [mean_a[raw][index].reshape(-1) for raw, index in groups[g]] for g in flat_c}
        # Preallocated outputs: many small long-lived tensors between the big per-chunk
        # buffers fragment the heap (peak RSS then grows with the number of chunks).
        n_total = tokens.shape[0]
        norms = {g: torch.empty(n_total) for g in flat_c}
        cos_c = {g: torch.empty(n_total) for g in flat_c}
        cos_a = {g: torch.empty(n_total) for g in flat_c}
        start = 0
        for chunk in _chunked_grads(model, tokens, labels, readout_position, chunk_size, progress):
            # Norms and dot products add up over a group's members: no concatenated copy of
            # the chunk's gradients is made.
            stop = start + next(iter(chunk.values())).shape[0]
            for g in flat_c:
                sq: Any = 0.0  # a tensor once the first member is added
                dot_c: Any = 0.0
                dot_a: Any = 0.0
                for (raw, index), m_c, m_a in zip(groups[g], parts_c[g], parts_a[g], strict=True):
                    key = (slice(None), *index)
                    x = chunk[raw][key].detach()
                    x = x.reshape(x.shape[0], -1)
                    sq = sq + (x * x).sum(1)
                    dot_c = dot_c + x @ m_c
                    dot_a = dot_a + x @ m_a
                nrm = sq.sqrt().cpu()
                norms[g][start:stop] = nrm
                cos_c[g][start:stop] = dot_c.cpu() / (nrm * flat_c[g].norm()).clamp_min(1e-30)
                cos_a[g][start:stop] = dot_a.cpu() / (nrm * flat_a[g].norm()).clamp_min(1e-30)
            start = stop
            del chunk
    finally:
        model.train(was_training)
    rows, tensors = [], {}
    for g in flat_c:
        nrm, cc, ca = norms[g], cos_c[g], cos_a[g]
        rows.append(_summarize(g, nrm, cc, ca, flat_c[g], flat_a[g], agrees))
        tensors.update({f"norms/{g}": nrm, f"cos_to_consistent/{g}": cc, f"cos_to_anti/{g}": ca})
    config = {"split": split, "readout_position": readout_position, "n": n, "chunk_size": chunk_size}
    return AnalysisResult(Table(rows), tensors, config)


__all__ = ["parameter_names", "parameter_groups", "per_example_grads", "group_gradients",
           "compute_gradient_conflict", "gradient_conflict", "minority_group", "minority_amplification"]
