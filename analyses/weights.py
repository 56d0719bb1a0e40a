"""Parameter norms per component: the slow variable of weight-decay-driven transitions.

Under AdamW's decoupled weight decay every step multiplies the weights by ``1 - lr * wd``, so
a solution the gradient does not defend shrinks on a timescale of ``1 / (lr * wd)`` steps
(10,000 at lr 1e-3 and wd 0.1). A memorizing run whose norms are still falling has not
reached that timescale; over a run's checkpoints (``over_checkpoints("weight_norms", ...)``)
the norms show where a run is on it.

Rows, one per parameter group of :func:`interp_toolkit.analyses.gradients.parameter_groups`
(``all``, ``embed``, ``L{l}H{h}.QK``, ``L{l}H{h}.OV``, ``mlp{l}``, ``unembed``, ``ln``,
``other``):

* ``norm``: L2 norm of the group's parameters (a head's QK: its rows of W_Q and W_K and
  their biases; its OV: its rows of W_V and columns of W_O);
* ``n_params``: how many numbers that is;
* with a ``reference`` (e.g. the run's initialization, ``checkpoints/epoch_000000.safetensors``):
  ``reference_norm``, ``distance`` (L2 norm of the difference), ``relative_distance``
  (distance / reference norm) and ``cosine`` (between the group's parameters and the
  reference's). A cosine near 1 after training says the weights are still mostly their
  initialization, which weight decay removes on its ``1 / (lr * wd)`` timescale.

Low level: :func:`compute_weight_norms` on a state dict-like mapping and groups.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import Tensor

from interp_toolkit.errors import UserError
from interp_toolkit.io import file_digest
from interp_toolkit.model import HookedModel

from ._common import AnalysisResult, Table
from .gradients import Groups, parameter_groups


def compute_weight_norms(params: Mapping[str, Tensor], groups: Groups,
                         reference: Mapping[str, Tensor] | None = None) -> AnalysisResult:
    """Norms of parameter groups, and their distance and cosine to a reference.

    Args:
        params: Raw parameter name -> tensor (``dict(model.named_parameters())``).
        groups: Group -> list of (raw name, index) (see
            :func:`interp_toolkit.analyses.gradients.parameter_groups`).
        reference: The same parameters of a reference model (e.g. the initialization).

    Returns:
        :class:`AnalysisResult`: one row per non-empty group (module docstring) and tensor
        ``norms`` [group] in row order (with a reference also ``distances`` [group]).

    Raises:
        ValueError: A group names a parameter that ``params`` (or ``reference``) lacks, or a
            reference tensor's shape differs from the parameter's.
    """
    names = {raw for members in groups.values() for raw, _ in members}
    for label, mapping in (("the model", params), ("the reference", reference)):
        if mapping is None:
            continue
        missing = sorted(names - set(mapping))
        if missing:
            raise UserError(f"groups name parameters {label} does not have: {missing}; "
                             f"expected names from {sorted(mapping)[:8]}...")
    if reference is not None:
        shapes = [f"{raw}: {tuple(params[raw].shape)} vs reference {tuple(reference[raw].shape)}"
                  for raw in sorted(names) if params[raw].shape != reference[raw].shape]
        if shapes:
            raise UserError(f"reference parameters differ in shape from the model's: {shapes}")
    rows = []
    with torch.no_grad():
        for group, members in groups.items():
            if not members:
                continue
            sums = {"w": 0.0, "ref": 0.0, "dot": 0.0, "diff": 0.0}
            count = 0
            for raw, index in members:
                part = params[raw][index].detach().double().cpu()
                sums["w"] += float((part * part).sum())
                count += part.numel()
                if reference is not None:
                    ref = reference[raw][index].detach().double().cpu()
                    sums["ref"] += float((ref * ref).sum())
                    sums["dot"] += float((part * ref).sum())
                    sums["diff"] += float(((part - ref) ** 2).sum())
            row: dict[str, Any] = {"group": group, "norm": math.sqrt(sums["w"]), "n_params": count}
            if reference is not None:
                ref_norm, distance = math.sqrt(sums["ref"]), math.sqrt(sums["diff"])
                both = row["norm"] * ref_norm
                row.update({"reference_norm": ref_norm, "distance": distance,
                            "relative_distance": distance / ref_norm if ref_norm else math.nan,
                            "cosine": sums["dot"] / both if both else math.nan})
            rows.append(row)
    tensors = {"norms": torch.tensor([row["norm"] for row in rows], dtype=torch.float64)}
    if reference is not None:
        tensors["distances"] = torch.tensor([row["distance"] for row in rows], dtype=torch.float64)
    return AnalysisResult(Table(rows), tensors, {})


def weight_norms(model: HookedModel, splits: Mapping[str, Any] | None = None, groups: Groups | None = None,
                 reference: str | os.PathLike | Any | None = None) -> AnalysisResult:
    """L2 norm of every parameter group of a model, and its distance and cosine to a
    reference model (module docstring).

    Args:
        model: A TransformerLens model.
        splits: Unused (the weights alone decide); accepted so that
            :func:`interp_toolkit.analyses.over_checkpoints.over_checkpoints` can run it.
        groups: Parameter groups (default :func:`parameter_groups`).
        reference: A model of the same architecture, or the path of a checkpoint of one
            (``run_dir/checkpoints/epoch_000000.safetensors``: the initialization). As a
            path it is JSON-able, so ``over_checkpoints(..., config={"reference": path})``
            caches by it (by the path, not the file's bytes: checkpoints are not rewritten).

    Returns:
        :class:`AnalysisResult` (see :func:`compute_weight_norms`).

    Raises:
        ValueError: ``reference`` is not a model, an existing checkpoint file, or None; or its
            parameters do not match the model's.
    """
    groups = parameter_groups(model) if groups is None else groups
    reference_params = None
    if reference is not None:
        if isinstance(reference, (str, os.PathLike)):
            path = Path(reference)
            if not path.is_file():
                raise UserError(
                    f"reference checkpoint {str(reference)!r} does not exist (expected a "
                    f".safetensors file written by the toolkit, e.g. checkpoints/epoch_000000.safetensors)"
                )
            reference_params = _checkpoint_params(str(path.resolve()), file_digest(path, length=64))
        elif hasattr(reference, "named_parameters"):
            reference_params = dict(reference.named_parameters())
        else:
            raise UserError(f"reference must be a model or a checkpoint path, got {type(reference).__name__}")
    return compute_weight_norms(dict(model.named_parameters()), groups, reference_params)


@functools.lru_cache(maxsize=4)
def _checkpoint_params(path: str, digest: str) -> dict[str, Tensor]:
    """A checkpoint's parameters, loaded once: ``over_checkpoints`` compares every checkpoint of
    a run with the same reference (keyed by the file's digest too, so a rewritten file is
    loaded again)."""
    from interp_toolkit.checkpoint import load_checkpoint

    model, _ = load_checkpoint(path)
    return {name: p.detach() for name, p in model.named_parameters()}


__all__ = ["compute_weight_norms", "weight_norms"]
