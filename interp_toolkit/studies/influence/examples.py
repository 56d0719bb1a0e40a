"""Which anti-shortcut training examples drive a run out of its shortcut: the most
influential ones at the onset of phase 2 against random anti-shortcut examples, feature by
feature (:func:`onset_examples`), from the BIF values of the joined study
(:mod:`interp_toolkit.studies.influence.measure`)."""

from __future__ import annotations

from typing import Any

from interp_toolkit.errors import UserError


def example_features(values: Any) -> dict[str, Any]:
    """Features of MPSP sequences ``[n, seq_len]``: position of the (first) max, the max, the
    sum and the number of odd values."""
    import torch

    values = torch.as_tensor(values)
    return {"position_of_max": values.argmax(1), "max": values.max(1).values, "sum": values.sum(1),
            "n_odd": (values % 2).sum(1)}


def onset_examples(values: Any, anti: Any, bif_values: Any, k: int = 50, permutations: int = 10_000,
                   seed: int = 0) -> dict[str, Any]:
    """The ``k`` most helpful anti-shortcut training examples (most negative BIF on the query
    loss) against random anti-shortcut examples, feature by feature.

    For each feature the statistic is the top-``k`` mean minus the mean of all anti-shortcut
    examples, and, for the discrete position / max, the total-variation distance between the
    top-``k`` value counts and the anti-shortcut ones. Its p-value is the share of
    ``permutations`` random ``k``-subsets of the anti-shortcut examples with a statistic at
    least as extreme (two-sided for means), plus one over permutations plus one.

    Args:
        values: The training sequences ``[n, seq_len]``.
        anti: Bool mask of anti-shortcut examples ``[n]``.
        bif_values: Per-example BIF on the query loss ``[n]``.
        k: Examples taken as "most influential".

    Returns:
        ``{"k", "n_anti", "top_index", "features": {name: {top_mean, all_mean, diff, p_mean,
        tv, p_tv, top_counts, all_counts}}}``.
    """
    import torch

    values, anti = torch.as_tensor(values), torch.as_tensor(anti).bool()
    bif_values = torch.as_tensor(bif_values, dtype=torch.float64)
    pool = torch.nonzero(anti).flatten()
    if not 1 <= k < pool.numel():
        raise UserError(f"k must be in [1, {pool.numel() - 1}] (the anti-shortcut examples minus one), got {k}")
    order = torch.argsort(bif_values[pool])
    top = pool[order[:k]]
    features = example_features(values)
    gen = torch.Generator().manual_seed(seed)
    random_sets = torch.stack([pool[torch.randperm(pool.numel(), generator=gen)[:k]] for _ in range(permutations)])
    out: dict[str, Any] = {"k": k, "n_anti": int(pool.numel()), "top_index": top.tolist(), "features": {}}
    for name, feature in features.items():
        feature = feature.double()
        all_mean = feature[pool].mean()
        diff = float(feature[top].mean() - all_mean)
        null = feature[random_sets].mean(1) - all_mean
        entry: dict[str, Any] = {"top_mean": float(feature[top].mean()), "all_mean": float(all_mean), "diff": diff,
                 "p_mean": float(((null.abs() >= abs(diff) - 1e-12).sum() + 1) / (permutations + 1))}
        if name in ("position_of_max", "max"):
            levels = int(feature[pool].max()) + 1
            all_share = torch.bincount(feature[pool].long(), minlength=levels).double() / pool.numel()
            observed = float(_total_variation(feature[top][None].long(), all_share)[0])
            null_tv = _total_variation(feature[random_sets].long(), all_share)
            entry.update(tv=observed, p_tv=float(((null_tv >= observed - 1e-12).sum() + 1) / (permutations + 1)),
                         top_counts=torch.bincount(feature[top].long(), minlength=levels).tolist(),
                         all_counts=torch.bincount(feature[pool].long(), minlength=levels).tolist())
        out["features"][name] = entry
    return out


def _total_variation(samples: Any, reference: Any) -> Any:
    """Total-variation distance between each row's value counts (``[sets, k]`` integers) and
    the ``reference`` distribution over ``0..levels-1``."""
    import torch

    levels = reference.shape[0]
    counts = torch.zeros(samples.shape[0], levels, dtype=torch.float64)
    counts.scatter_add_(1, samples, torch.ones_like(samples, dtype=torch.float64))
    return 0.5 * (counts / samples.shape[1] - reference).abs().sum(-1)


__all__ = ["example_features", "onset_examples"]
