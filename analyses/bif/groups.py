"""Group reductions of a BIF: the influence of a *group* of training examples on a query set.

The mean BIF of the rows in a group onto the mean loss of a query set is, by linearity of the
covariance, the BIF of the group's mean loss on the query set's mean loss::

    mean_{i in G, j in Q} -Cov(l_i, q_j) = -Cov(mean_{i in G} l_i, mean_{j in Q} q_j)

So a group reduction is recorded as one extra attribution row per group (its mean loss at every
draw; :func:`group_loss_fn`), and :func:`~interp_toolkit.analyses.bif.bif` gives it the same
leave-one-chain-out jackknife error and within/between-phase split as any entry (the mean of
per-entry standard errors would not be the reduction's error). :func:`reduce_draws` is the
same reduction on stored draws, from raw covariances (a reference for tests and for draws kept
with ``keep_draws``).
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch
from jaxtyping import Bool, Float
from torch import Tensor, nn

from interp_toolkit.errors import UserError

__all__ = ["check_groups", "group_loss_fn", "jackknife_reduction", "reduce_draws", "trace_bif"]


def check_groups(groups: Mapping[str, Bool[Tensor, " n"]], n: int) -> dict[str, Tensor]:
    """Validate group masks over ``n`` examples: non-empty boolean masks of length ``n``.

    Raises:
        ValueError: Naming the group and what was expected.
    """
    if not groups:
        raise UserError("give at least one group (name -> boolean mask over the attribution examples)")
    checked = {}
    for name, mask in groups.items():
        mask = torch.as_tensor(mask)
        if mask.dtype != torch.bool or mask.ndim != 1 or mask.shape[0] != n:
            raise UserError(f"group {name!r} must be a boolean mask of shape [{n}], got "
                             f"{mask.dtype} of shape {list(mask.shape)}")
        if not bool(mask.any()):
            raise UserError(f"group {name!r} is empty: a group reduction needs at least one example")
        checked[name] = mask
    return checked


def group_loss_fn(per_example: Callable[[nn.Module], Tensor],
                  groups: Mapping[str, Bool[Tensor, " n"]]) -> Callable[[nn.Module], Tensor]:
    """An ``attribution_fn`` for :func:`bif`: every example's loss, then each group's mean loss.

    Args:
        per_example: ``model -> Float[Tensor, "n"]`` per-example losses of the attribution set.
        groups: ``name -> mask [n]``; the result's last ``len(groups)`` rows are the groups
            in this order.

    Returns:
        ``model -> Float[Tensor, "n + len(groups)"]``.
    """
    names = list(groups)
    masks = [groups[name] for name in names]

    def losses_and_group_means(model: nn.Module) -> Tensor:
        losses = per_example(model).reshape(-1)
        means = [losses[mask.to(losses.device)].mean() for mask in masks]
        return torch.cat([losses, torch.stack(means)])

    losses_and_group_means.__qualname__ = f"group_loss_fn({','.join(names)})"
    return losses_and_group_means


def reduce_draws(attribution: Float[Tensor, "chains draws n_a"], observable: Float[Tensor, "chains draws n_b"],
                 groups: Mapping[str, Bool[Tensor, " n_a"]],
                 query_sets: Mapping[str, Bool[Tensor, " n_b"]]) -> dict[tuple[str, str], Float[Tensor, " 2"]]:
    """Group-mean BIF and its leave-one-chain-out jackknife error from stored draws.

    ``-Cov`` over all draws pooled (population covariance), averaged over the rows of the
    group and the columns of the query set; the error is the jackknife over chains of that
    average (NaN for one chain).

    Returns:
        ``(group, query set) -> tensor([bif, stderr])``.
    """
    chains = attribution.shape[0]
    groups = check_groups(groups, attribution.shape[-1])
    query_sets = check_groups(query_sets, observable.shape[-1])

    def neg_cov(a: Tensor, b: Tensor) -> Tensor:
        a = a.reshape(-1, a.shape[-1]).double()
        b = b.reshape(-1, b.shape[-1]).double()
        return -((a - a.mean(0)).T @ (b - b.mean(0))) / a.shape[0]

    out = {}
    for group, g in groups.items():
        for query, q in query_sets.items():
            full = float(neg_cov(attribution, observable)[g][:, q].mean())
            if chains < 2:
                out[(group, query)] = torch.tensor([full, float("nan")])
                continue
            leave_out = torch.stack([
                neg_cov(attribution[[c for c in range(chains) if c != k]],
                        observable[[c for c in range(chains) if c != k]])[g][:, q].mean()
                for k in range(chains)])
            stderr = jackknife_reduction(leave_out)
            out[(group, query)] = torch.tensor([full, float(stderr)])
    return out


def jackknife_reduction(leave_one_out: Float[Tensor, " chains"]) -> Tensor:
    """Jackknife standard error from the ``chains`` leave-one-out estimates:
    ``sqrt((C - 1) / C * sum (theta_k - mean theta)^2)``, in float64
    (:func:`~interp_toolkit.analyses.bif.diagnostics.jackknife_stderr`, the toolkit's one)."""
    from .diagnostics import jackknife_stderr

    return jackknife_stderr(leave_one_out.double())


def trace_bif(a: Float[Tensor, "chains draws"], b: Float[Tensor, "chains draws"]) -> tuple[float, float]:
    """``-Cov(a, b)`` of two scalar traces over all draws pooled (population covariance) and its
    leave-one-chain-out jackknife error (NaN for one chain).

    With ``a`` a group's mean loss and ``b`` a query set's mean loss at every draw, this is the
    group-mean BIF with its error (by the linearity above), from ``2 x chains x draws`` numbers.
    """
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    if a.ndim != 2 or a.shape != b.shape:
        raise UserError(f"trace_bif needs two [chains, draws] traces of one shape, got {tuple(a.shape)} and "
                        f"{tuple(b.shape)}")

    def neg_cov(x: Tensor, y: Tensor) -> Tensor:
        x, y = x.reshape(-1), y.reshape(-1)
        return -((x - x.mean()) * (y - y.mean())).mean()

    chains = a.shape[0]
    full = float(neg_cov(a, b))
    if chains < 2:
        return full, float("nan")
    keep = [[c for c in range(chains) if c != k] for k in range(chains)]
    leave_out = torch.stack([neg_cov(a[rows], b[rows]) for rows in keep])
    return full, float(jackknife_reduction(leave_out))
