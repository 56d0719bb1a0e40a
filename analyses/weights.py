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
* ``n_params``: how many numbers that is.

Low level: :func:`compute_weight_norms` on a state dict-like mapping and groups.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch
from torch import Tensor

from ._common import AnalysisResult, Table
from .gradients import Groups, parameter_groups


def compute_weight_norms(params: Mapping[str, Tensor], groups: Groups) -> AnalysisResult:
    """Norms of parameter groups.

    Args:
        params: Raw parameter name -> tensor (``dict(model.named_parameters())``).
        groups: Group -> list of (raw name, index) (see
            :func:`interp_toolkit.analyses.gradients.parameter_groups`).

    Returns:
        :class:`AnalysisResult`: one row per non-empty group (``group``, ``norm``,
        ``n_params``) and tensor ``norms`` [group] in row order.

    Raises:
        ValueError: A group names a parameter that ``params`` lacks.
    """
    missing = sorted({raw for members in groups.values() for raw, _ in members} - set(params))
    if missing:
        raise ValueError(f"groups name parameters the model does not have: {missing}; "
                         f"expected names from {sorted(params)[:8]}...")
    rows = []
    with torch.no_grad():
        for group, members in groups.items():
            if not members:
                continue
            square_sum, count = 0.0, 0
            for raw, index in members:
                part = params[raw][index].detach().double()
                square_sum += float((part * part).sum())
                count += part.numel()
            rows.append({"group": group, "norm": math.sqrt(square_sum), "n_params": count})
    norms = torch.tensor([row["norm"] for row in rows], dtype=torch.float64)
    return AnalysisResult(Table(rows), {"norms": norms}, {})


def weight_norms(model: Any, splits: Mapping[str, Any] | None = None, groups: Groups | None = None) -> AnalysisResult:
    """L2 norm of every parameter group of a model (module docstring).

    Args:
        model: A TransformerLens model.
        splits: Unused (the weights alone decide); accepted so that
            :func:`interp_toolkit.analyses.over_checkpoints.over_checkpoints` can run it.
        groups: Parameter groups (default :func:`parameter_groups`).

    Returns:
        :class:`AnalysisResult` (see :func:`compute_weight_norms`).
    """
    groups = parameter_groups(model) if groups is None else groups
    return compute_weight_norms(dict(model.named_parameters()), groups)


__all__ = ["compute_weight_norms", "weight_norms"]
