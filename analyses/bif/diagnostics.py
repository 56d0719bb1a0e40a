"""Convergence diagnostics of SGLD draws: rank-normalized split R-hat, bulk and tail
effective sample size (ESS), the between-chain share of a BIF entry, and the verdict.

R-hat and ESS follow Vehtari et al. (2021, "Rank-normalization, folding, and localization")
exactly as ArviZ 0.23 computes them (``arviz.rhat(method="rank")``, ``arviz.ess(method=
"bulk")`` / ``"tail"``; tested against ArviZ to 1e-6), in NumPy (and torch's ``ndtri``) so that
``bif()`` imports neither ArviZ (7.5 s here: it pulls xarray and pandas) nor SciPy.

What they are computed on: a BIF entry is a covariance, ``-mean_t (a_t - a_bar)(b_t - b_bar)``
over draws ``t``; its *product trace* ``x_t = (a_t - a_bar)(b_t - b_bar)`` (pooled means) has
the entry as its mean, so the R-hat and ESS of that trace say whether the chains agree on the
entry and how many independent draws it rests on. Only the traces of a few tracked rows and
columns are kept while sampling (``chains x draws x (rows + cols)`` numbers), never all draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from interp_toolkit.errors import UserError

# Vehtari et al. (2021)'s thresholds, defined torch-free for the verdict engine
from .config import ESS_MIN, RHAT_MAX

__all__ = [
    "ConvergenceDiagnostics",
    "ADVICE",
    "ESS_MIN",
    "RHAT_MAX",
    "advice_for",
    "between_chain_share",
    "convergence_diagnostics",
    "ess_bulk",
    "ess_tail",
    "jackknife_stderr",
    "jackknife_stderr_streamed",
    "split_rhat",
    "tracked_indices",
]

#: Rows / columns whose per-draw values are kept for the per-entry diagnostics.
DEFAULT_TRACKED = 16

def advice_for(command: str) -> str:
    """What a convergence warning of ``interp-toolkit COMMAND`` recommends (every SGLD command
    has ``--calibrate``; library callers read :data:`ADVICE`)."""
    return ("run longer chains (raise draws or steps_between_draws, and burn_in; the adaptive rounds' --max-steps), "
            f"or raise eps for faster mixing; `interp-toolkit {command} --calibrate` sweeps eps x gamma and "
            "recommends a local setting")


ADVICE = ("run longer chains (raise draws or steps_between_draws, and burn_in), or raise eps for faster mixing; "
          "analyses.bif.calibrate_sampler (or a command's --calibrate) sweeps eps x gamma and recommends a local "
          "setting")


# --------------------------------------------------------------------------- R-hat / ESS


def _as_chains(values: Any) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2:
        raise UserError(f"expected draws of shape [chains, draws], got {array.shape}")
    return array


def _split_chains(array: np.ndarray) -> np.ndarray:
    half = array.shape[1] // 2
    return np.vstack((array[:, :half], array[:, -half:]))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n of the flattened values, ties sharing their average rank (SciPy's
    ``rankdata(method="average")``, same algorithm)."""
    flat = values.reshape(-1)
    order = np.argsort(flat, kind="mergesort")
    ordered = flat[order]
    first = np.r_[True, ordered[1:] != ordered[:-1]]
    dense = first.cumsum()
    bounds = np.r_[np.nonzero(first)[0], flat.size]
    ranks = np.empty(flat.size)
    ranks[order] = 0.5 * (bounds[dense] + bounds[dense - 1] + 1)
    return ranks


def _z_scale(array: np.ndarray) -> np.ndarray:
    rank = _average_ranks(array)
    rank = (rank - 3 / 8) / (rank.size - 2 * 3 / 8 + 1)  # Blom's offset, as ArviZ
    # the standard normal quantile (SciPy's norm.ppf is the same ndtri); no SciPy import
    return torch.special.ndtri(torch.from_numpy(rank)).numpy().reshape(array.shape)


def _rhat(array: np.ndarray) -> float:
    n = array.shape[1]
    between = n * np.var(array.mean(axis=1), ddof=1)
    within = np.mean(np.var(array, axis=1, ddof=1))
    return float(np.sqrt((between / within + n - 1) / n))


def split_rhat(draws: Float[np.ndarray, "chains draws"] | Tensor) -> float:
    """Rank-normalized split R-hat (the larger of the bulk and the folded-tail R-hat).

    Args:
        draws: ``[chains, draws]`` values of one scalar (>= 2 chains, >= 4 draws).

    Returns:
        R-hat (1 for chains that agree; NaN for fewer than 2 chains, 4 draws, or NaNs).
    """
    array = _as_chains(draws.detach().cpu().numpy() if isinstance(draws, Tensor) else draws)
    if array.shape[0] < 2 or array.shape[1] < 4 or np.isnan(array).any():
        return float("nan")
    split = _split_chains(array)
    bulk = _rhat(_z_scale(split))
    tail = _rhat(_z_scale(np.abs(split - np.median(split))))
    return max(bulk, tail)


def _autocov(array: np.ndarray) -> np.ndarray:
    n = array.shape[1]
    # any FFT length >= 2n - 1 gives the same (linear) autocovariance: a power of two here,
    # SciPy's next_fast_len in ArviZ (equal up to rounding)
    m = 1 << (2 * n - 1).bit_length()
    centred = array - array.mean(axis=1, keepdims=True)
    spectrum = np.fft.rfft(centred, n=m, axis=1)
    spectrum *= np.conjugate(spectrum)
    return np.fft.irfft(spectrum, n=m, axis=1)[:, :n] / n


def _ess(array: np.ndarray) -> float:
    """ESS of ``[chains, draws]`` by Geyer's initial monotone sequence (ArviZ's ``_ess``)."""
    array = np.asarray(array, dtype=float)
    if np.isnan(array).any():
        return float("nan")
    if np.max(array) - np.min(array) < np.finfo(float).resolution:
        return float(array.size)
    chains, n = array.shape
    acov = _autocov(array)
    mean_var = np.mean(acov[:, 0]) * n / (n - 1.0)
    var_plus = mean_var * (n - 1.0) / n
    if chains > 1:
        var_plus += np.var(array.mean(axis=1), ddof=1)
    rho = np.zeros(n)
    rho_even = 1.0
    rho[0] = rho_even
    rho_odd = 1.0 - (mean_var - np.mean(acov[:, 1])) / var_plus
    rho[1] = rho_odd
    t = 1
    while t < n - 3 and rho_even + rho_odd > 0.0:
        rho_even = 1.0 - (mean_var - np.mean(acov[:, t + 1])) / var_plus
        rho_odd = 1.0 - (mean_var - np.mean(acov[:, t + 2])) / var_plus
        if rho_even + rho_odd >= 0:
            rho[t + 1] = rho_even
            rho[t + 2] = rho_odd
        t += 2
    max_t = t - 2
    if rho_even > 0:
        rho[max_t + 1] = rho_even
    t = 1
    while t <= max_t - 2:  # monotone: no pair sum may exceed the one before it
        if rho[t + 1] + rho[t + 2] > rho[t - 1] + rho[t]:
            rho[t + 1] = (rho[t - 1] + rho[t]) / 2.0
            rho[t + 2] = rho[t + 1]
        t += 2
    total = chains * n
    tau = -1.0 + 2.0 * np.sum(rho[: max_t + 1]) + np.sum(rho[max_t + 1 : max_t + 2])
    tau = max(tau, 1 / np.log10(total))
    return float("nan") if np.isnan(rho).any() else float(total / tau)


def ess_bulk(draws: Float[np.ndarray, "chains draws"] | Tensor) -> float:
    """Bulk ESS: the ESS of the rank-normalized split chains (>= 4 draws; else NaN)."""
    array = _as_chains(draws.detach().cpu().numpy() if isinstance(draws, Tensor) else draws)
    if array.shape[1] < 4 or np.isnan(array).any():
        return float("nan")
    return _ess(_z_scale(_split_chains(array)))


def ess_tail(draws: Float[np.ndarray, "chains draws"] | Tensor, prob: tuple[float, float] = (0.05, 0.95)) -> float:
    """Tail ESS: the smaller ESS of the indicators ``x <= q_5%`` and ``x <= q_95%`` (split chains)."""
    array = _as_chains(draws.detach().cpu().numpy() if isinstance(draws, Tensor) else draws)
    if array.shape[1] < 4 or np.isnan(array).any():
        return float("nan")
    out = []
    for p in prob:
        quantile = np.quantile(array, p)  # R's type 7 (linear), as ArviZ's mquantiles(alphap=betap=1)
        out.append(_ess(_split_chains(array <= quantile)))
    return min(out)


# --------------------------------------------------------------------------- errors


def jackknife_stderr(leave_one_out: Float[Tensor, "chains ..."]) -> Float[Tensor, "..."]:
    """Jackknife standard error ``sqrt((C - 1) / C * sum_c (theta_-c - mean)^2)`` from the ``C``
    leave-one-chain-out estimates (NaN for fewer than 2)."""
    count = leave_one_out.shape[0]
    if count < 2:
        return torch.full_like(leave_one_out[0], float("nan"))
    centred = leave_one_out - leave_one_out.mean(0)
    return (centred.pow(2).sum(0) * ((count - 1) / count)).sqrt()


def jackknife_stderr_streamed(leave_one_out: Iterable[Tensor]) -> Tensor:
    """:func:`jackknife_stderr` of estimates that arrive one at a time (Welford's update in
    float64: two matrices of memory however many chains; the token-level BIF's reductions)."""
    count, mean, m2 = 0, None, None
    for estimate in leave_one_out:
        estimate = estimate.double()
        count += 1
        if mean is None or m2 is None:  # both None until the first estimate
            mean, m2 = estimate.clone(), torch.zeros_like(estimate)
            continue
        delta = estimate - mean
        mean.add_(delta, alpha=1.0 / count)
        m2.addcmul_(delta, estimate - mean)
    if m2 is None:
        raise UserError("jackknife_stderr_streamed needs at least one leave-one-out estimate")
    if count < 2:
        return torch.full_like(m2, float("nan"))
    return m2.mul_((count - 1) / count).sqrt_()


def between_chain_share(total: Tensor, per_chain: Tensor) -> Tensor:
    """The share of the pooled estimate that is between-chain covariance.

    With equal draws per chain the pooled ``-Cov`` is the mean of the chains' own ``-Cov``
    plus the between-chain term ``-(1/C) sum_c (mu_c - mu)(nu_c - nu)``; the share is that term
    over the pooled value (``(total - mean_c per_chain) / total``; NaN where the total is 0).
    Near 0: the chains agree on their means; large: the pooled value is mostly chains that sit
    at different places, which the per-chain spread does not see.
    """
    between = total - per_chain.mean(0)
    return torch.where(total != 0, between / total, torch.full_like(total, float("nan")))


# --------------------------------------------------------------------------- the verdict


def tracked_indices(n: int, limit: int = DEFAULT_TRACKED) -> list[int]:
    """Up to ``limit`` evenly spaced indices of ``range(n)`` (all of them when ``n <= limit``)."""
    if n <= limit:
        return list(range(n))
    return sorted({int(round(k)) for k in np.linspace(0, n - 1, limit)})


@dataclass
class ConvergenceDiagnostics:
    """Whether the chains of one BIF result agree and how many independent draws it rests on.

    Attributes:
        rows, cols: The tracked attribution rows and observable columns.
        rhat, ess_bulk, ess_tail: ``[len(rows), len(cols)]``: rank-normalized split R-hat and
            bulk / tail ESS of every tracked entry's product trace.
        between_chain_share: ``[len(rows), len(cols)]``: share of each tracked entry that is
            between-chain covariance (:func:`between_chain_share`).
        scalars: ``name -> {"rhat", "ess_bulk", "ess_tail"}`` of scalar traces (the draws' mean
            attribution loss, each observable's mean, the distance from ``w*``).
        max_rhat, min_ess_bulk, min_ess_tail: Worst values over entries and scalars.
        converged: ``max_rhat <= RHAT_MAX`` and both minimum ESS ``>= ESS_MIN``.
        warnings: What failed and which settings to change (empty when converged).
    """

    rows: list[int]
    cols: list[int]
    rhat: Float[Tensor, "rows cols"]
    ess_bulk: Float[Tensor, "rows cols"]
    ess_tail: Float[Tensor, "rows cols"]
    between_chain_share: Float[Tensor, "rows cols"]
    scalars: dict[str, dict[str, float]] = field(default_factory=dict)
    max_rhat: float = float("nan")
    min_ess_bulk: float = float("nan")
    min_ess_tail: float = float("nan")
    converged: bool = False
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The JSON summary (worst values, the flag, the warnings)."""
        return {"converged": self.converged, "max_rhat": _finite_or_none(self.max_rhat),
                "min_ess_bulk": _finite_or_none(self.min_ess_bulk), "min_ess_tail": _finite_or_none(self.min_ess_tail),
                "median_between_chain_share": _finite_or_none(float(np.nanmedian(self.between_chain_share.numpy())))
                if self.between_chain_share.numel() else None,
                "rhat_max_threshold": RHAT_MAX, "ess_min_threshold": ESS_MIN, "warnings": list(self.warnings)}

    def tensors(self) -> dict[str, Tensor]:
        """Tensors for an artifact (``convergence.*``)."""
        return {"convergence.rhat": self.rhat, "convergence.ess_bulk": self.ess_bulk,
                "convergence.ess_tail": self.ess_tail, "convergence.between_chain_share": self.between_chain_share}

    def metadata(self) -> dict[str, Any]:
        """The JSON part, for an artifact."""
        return {"rows": self.rows, "cols": self.cols, "scalars": self.scalars, "max_rhat": self.max_rhat,
                "min_ess_bulk": self.min_ess_bulk, "min_ess_tail": self.min_ess_tail,
                "converged": self.converged, "warnings": self.warnings}

    @classmethod
    def from_artifact(cls, tensors: dict[str, Tensor], meta: dict[str, Any]) -> "ConvergenceDiagnostics":
        """Rebuild from :meth:`tensors` and :meth:`metadata`."""
        return cls(rows=list(meta["rows"]), cols=list(meta["cols"]), rhat=tensors["convergence.rhat"],
                   ess_bulk=tensors["convergence.ess_bulk"], ess_tail=tensors["convergence.ess_tail"],
                   between_chain_share=tensors["convergence.between_chain_share"], scalars=dict(meta["scalars"]),
                   max_rhat=meta["max_rhat"], min_ess_bulk=meta["min_ess_bulk"], min_ess_tail=meta["min_ess_tail"],
                   converged=bool(meta["converged"]), warnings=list(meta["warnings"]))


def _finite_or_none(value: float) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def _scalar_diagnostics(trace: np.ndarray) -> dict[str, float]:
    return {"rhat": split_rhat(trace), "ess_bulk": ess_bulk(trace), "ess_tail": ess_tail(trace)}


def convergence_diagnostics(
    attribution: Float[Tensor, "chains draws rows"],
    observables: Float[Tensor, "chains draws cols"],
    rows: Sequence[int],
    cols: Sequence[int],
    per_chain: Float[Tensor, "chains rows cols"] | None = None,
    scalars: dict[str, Float[Tensor, "chains draws"]] | None = None,
    rhat_max: float = RHAT_MAX,
    ess_min: float = ESS_MIN,
    advice: str = ADVICE,
) -> ConvergenceDiagnostics:
    """Diagnostics of tracked BIF entries from their per-draw values.

    Args:
        attribution: Per-draw values of the tracked attribution rows.
        observables: Per-draw values of the tracked observable columns.
        rows, cols: Their indices in the full matrix (for the record).
        per_chain: The chains' own estimates of the tracked entries (for the between-chain
            share); default: computed from the traces.
        scalars: Extra scalar traces ``[chains, draws]`` to diagnose (e.g. mean losses).
        rhat_max, ess_min: Thresholds of the verdict.
        advice: What the warnings recommend (the settings and command that help the caller).

    Returns:
        The :class:`ConvergenceDiagnostics` (warnings name the settings to change).
    """
    a = attribution.double()
    b = observables.double()
    chains, draws = a.shape[:2]
    centred_a = a - a.reshape(-1, a.shape[-1]).mean(0)
    centred_b = b - b.reshape(-1, b.shape[-1]).mean(0)
    products = torch.einsum("cti,ctj->ijct", centred_a, centred_b).numpy()  # [rows, cols, chains, draws]
    k_a, k_b = a.shape[-1], b.shape[-1]
    rhat = torch.full((k_a, k_b), float("nan"), dtype=torch.float64)
    bulk = torch.full_like(rhat, float("nan"))
    tail = torch.full_like(rhat, float("nan"))
    for i in range(k_a):
        for j in range(k_b):
            trace = products[i, j]
            rhat[i, j] = split_rhat(trace)
            bulk[i, j] = ess_bulk(trace)
            tail[i, j] = ess_tail(trace)
    total = -torch.from_numpy(products.mean((2, 3)))
    if per_chain is None:
        ca = a - a.mean(1, keepdim=True)
        cb = b - b.mean(1, keepdim=True)
        per_chain = -torch.einsum("cti,ctj->cij", ca, cb) / draws
    share = between_chain_share(total, per_chain.double())
    scalar_stats = {name: _scalar_diagnostics(trace.double().numpy()) for name, trace in (scalars or {}).items()}
    all_rhat = [float(x) for x in rhat.reshape(-1)] + [s["rhat"] for s in scalar_stats.values()]
    all_bulk = [float(x) for x in bulk.reshape(-1)] + [s["ess_bulk"] for s in scalar_stats.values()]
    all_tail = [float(x) for x in tail.reshape(-1)] + [s["ess_tail"] for s in scalar_stats.values()]

    def worst(values: list[float], fn: Any) -> float:
        finite = [v for v in values if math.isfinite(v)]
        return float(fn(finite)) if finite else float("nan")

    # every tracked quantity by name, so that a warning names the one that failed
    names = [f"entry (row {r}, column {c})" for r in rows for c in cols] + list(scalar_stats)

    def worst_name(values: list[float], fn: Any) -> str:
        finite = [(v, n) for v, n in zip(values, names, strict=True) if math.isfinite(v)]
        return fn(finite)[1] if finite else "n/a"

    max_rhat, min_bulk, min_tail = worst(all_rhat, max), worst(all_bulk, min), worst(all_tail, min)
    notes = []
    if chains < 2:
        notes.append(f"R-hat needs >= 2 chains (got {chains}): set chains >= 2 (4 recommended)")
    elif not math.isfinite(max_rhat) or max_rhat > rhat_max:
        bad = sum(v > rhat_max for v in all_rhat if math.isfinite(v))
        notes.append(f"chains disagree: max split R-hat {max_rhat:.3f} > {rhat_max} on {worst_name(all_rhat, max)} "
                     f"({bad} of {len(all_rhat)} tracked quantities); {advice}")
    if not (math.isfinite(min_bulk) and math.isfinite(min_tail)) or min(min_bulk, min_tail) < ess_min:
        weakest = worst_name(all_bulk, min) if min_bulk <= min_tail else worst_name(all_tail, min)
        notes.append(f"too few effective draws: min bulk ESS {min_bulk:.0f}, min tail ESS {min_tail:.0f} < "
                     f"{ess_min:.0f} over {chains} chains x {draws} draws (fewest on {weakest}); {advice}")
    return ConvergenceDiagnostics(
        rows=[int(r) for r in rows], cols=[int(c) for c in cols], rhat=rhat, ess_bulk=bulk, ess_tail=tail,
        between_chain_share=share, scalars=scalar_stats, max_rhat=max_rhat, min_ess_bulk=min_bulk,
        min_ess_tail=min_tail, converged=not notes, warnings=notes,
    )
