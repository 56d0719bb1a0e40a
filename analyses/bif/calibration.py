"""Sampler calibration: a small sweep of SGLD step size x localization (x n_beta) at one
checkpoint, with the convergence diagnostics and loss drift of every setting and a
recommendation (the way devinterp users calibrate epsilon / gamma for LLC estimates).

Every setting is ranked by locality first (:mod:`.locality`: its draws climbed at most 10% of
the gap between the checkpoint's loss and the reference loss), then by convergence, then by
whether it keeps the base posterior, then by mixing speed per CPU-second (``min(bulk, tail)
ESS`` per CPU-second of sampling). A setting
that is not local is never recommended: when none is, the recommendation is None and the
reason says what to try. Without a ``reference_loss`` locality is unmeasured and the ranking
says so.

Changing ``gamma`` or ``n_beta`` changes the posterior (the estimand); changing ``eps`` only
changes how fast (and how biased) SGLD samples it. Among equally ranked settings the posterior
of the base config is preferred, and the reason says so when the recommendation moved
``gamma`` or ``n_beta``.
"""

from __future__ import annotations

import itertools
import math
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from interp_toolkit.errors import UserError

from .config import SamplerConfig, SamplerDivergenceError

__all__ = ["Calibration", "CalibrationRow", "calibrate_sampler", "plot_calibration"]


@dataclass
class CalibrationRow:
    """One setting of the sweep.

    Attributes:
        eps, gamma, n_beta: The setting (``n_beta`` resolved).
        diverged: SGLD diverged (the other numbers are NaN).
        converged: The convergence verdict (R-hat <= 1.01, ESS >= 100).
        max_rhat, min_ess_bulk, min_ess_tail: Worst tracked values.
        ess_per_1000_steps: ``min(bulk, tail ESS)`` per 1,000 SGLD steps of all chains (mixing speed).
        loss_drift: Mean sampled loss minus the loss at ``w*`` (the expected loss increase of
            the localized posterior; large means the chains wander off the checkpoint).
        max_sampling_drift: Largest per-chain drift between the sampling halves (in loss std).
        mean_distance: Mean ``||w - w*||`` over the sampling phase.
        seconds: Wall time of the setting.
        warnings: The sampler's and the diagnostics' warnings.
        local: The locality gate passed (None: unmeasured, no reference loss).
        climb: The worst chain's climb, as a fraction of the loss gap (:mod:`.locality`).
        cpu_seconds: CPU time of the setting (this process).
        ess_per_cpu_second: ``min(bulk, tail) ESS`` per CPU-second: what the ranking uses.
    """

    eps: float
    gamma: float
    n_beta: float
    diverged: bool
    converged: bool
    max_rhat: float
    min_ess_bulk: float
    min_ess_tail: float
    ess_per_1000_steps: float
    loss_drift: float
    max_sampling_drift: float
    mean_distance: float
    seconds: float
    warnings: list[str]
    local: bool | None = None
    climb: float = float("nan")
    cpu_seconds: float = float("nan")
    ess_per_cpu_second: float = float("nan")


@dataclass
class Calibration:
    """The sweep and its recommendation.

    Attributes:
        rows: One :class:`CalibrationRow` per setting.
        recommended: Index of the recommended row (``None`` if every setting diverged).
        reason: Why that row (and whether it changed the posterior).
        base: The base config (``to_dict``).
    """

    rows: list[CalibrationRow]
    recommended: int | None
    reason: str
    base: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (NaN as None)."""
        def clean(v: Any) -> Any:
            return None if isinstance(v, float) and not math.isfinite(v) else v

        return {"rows": [{k: clean(v) for k, v in asdict(r).items()} for r in self.rows],
                "recommended": self.recommended, "reason": self.reason, "base": self.base,
                "recommended_setting": None if self.recommended is None else
                {k: getattr(self.rows[self.recommended], k) for k in ("eps", "gamma", "n_beta")}}


def _check_grid(name: str, values: Sequence[float], allow_zero: bool = False) -> list[float]:
    values = list(values)
    ok = bool(values) and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                              and (v >= 0 if allow_zero else v > 0) for v in values)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise UserError(f"{name} must be a non-empty list of finite numbers {bound}, got {values!r}")
    return [float(v) for v in values]


def calibrate_sampler(
    model: Any,
    train_data: Any,
    query_data: Any,
    loss_fn: Any,
    base: SamplerConfig,
    eps: Sequence[float],
    gamma: Sequence[float] | None = None,
    n_beta: Sequence[float] | None = None,
    **bif_kwargs: Any,
) -> Calibration:
    """Run :func:`~interp_toolkit.analyses.bif.bif` at every ``eps x gamma x n_beta`` setting.

    Args:
        model, train_data, query_data, loss_fn: As for :func:`bif`.
        base: Every other sampler setting (chains, draws, burn-in, seed, ...).
        eps: Step sizes to try (> 0).
        gamma: Localization strengths (>= 0); default ``[base.gamma]``.
        n_beta: Inverse temperatures x n (> 0); default ``[base.n_beta]`` (``None``: n / log n).
        **bif_kwargs: Passed to :func:`bif` (``attribution_data``, ``observables``, ...; no
            ``cache_dir``: the sweep is not cached).

    Returns:
        The :class:`Calibration`. Recommendation: among settings that neither diverged nor
        drift while drawing (every chain's drift between the sampling halves below 2 std),
        only local ones (when ``bif_kwargs`` give a ``reference_loss``); converged ones first,
        then those at the base posterior (its ``gamma`` and ``n_beta``: another gamma is another
        estimand), then the fastest mixing per CPU-second (``ess_per_cpu_second``). None when no
        setting is local.

    Raises:
        ValueError: A grid is empty or holds an invalid value (before any sampling).
    """
    from .api import bif

    eps_grid = _check_grid("eps", eps)
    gamma_grid = _check_grid("gamma", gamma if gamma is not None else [base.gamma], allow_zero=True)
    n_beta_grid = list(n_beta) if n_beta is not None else [base.n_beta]
    if n_beta is not None:
        n_beta_grid = _check_grid("n_beta", n_beta)
    if "cache_dir" in bif_kwargs:
        raise UserError("calibrate_sampler does not cache: drop cache_dir")
    rows = []
    steps_total = base.chains * base.total_steps
    for e, g, nb in itertools.product(eps_grid, gamma_grid, n_beta_grid):
        config = SamplerConfig.from_dict({**base.to_dict(), "eps": e, "gamma": g, "n_beta": nb,
                                          "keep_draws": False, "progress": False})
        started, cpu_started = time.time(), time.process_time()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = bif(model, train_data, query_data, loss_fn, config, **bif_kwargs)
        except SamplerDivergenceError as err:
            nan = float("nan")
            rows.append(CalibrationRow(e, g, float(nb) if nb is not None else nan, True, False, nan, nan, nan, nan,
                                       nan, nan, nan, time.time() - started, [str(err)], local=False,
                                       cpu_seconds=time.process_time() - cpu_started))
            continue
        diag, conv = result.diagnostics, result.convergence
        assert diag is not None and conv is not None  # bif() sets both when it samples (no cache here)
        sampling = diag.loss_trace[:, config.burn_in:]
        distance = diag.distance_trace[:, config.burn_in:] if diag.distance_trace is not None else None
        min_ess = min(conv.min_ess_bulk, conv.min_ess_tail)
        cpu = time.process_time() - cpu_started
        locality = result.locality
        measured = locality is not None and bif_kwargs.get("reference_loss") is not None
        rows.append(CalibrationRow(
            eps=e, gamma=g, n_beta=diag.n_beta, diverged=False, converged=conv.converged, max_rhat=conv.max_rhat,
            min_ess_bulk=conv.min_ess_bulk, min_ess_tail=conv.min_ess_tail,
            ess_per_1000_steps=1000.0 * min_ess / steps_total if math.isfinite(min_ess) else float("nan"),
            loss_drift=float(sampling.mean()) - diag.initial_loss,
            max_sampling_drift=float(diag.sampling_drift.abs().max()),
            mean_distance=float(distance.mean()) if distance is not None else float("nan"),
            seconds=time.time() - started,
            warnings=[str(w.message) for w in caught],
            local=bool(locality.local) if measured and locality is not None else None,
            climb=locality.worst_climb if locality is not None else float("nan"),
            cpu_seconds=cpu,
            ess_per_cpu_second=min_ess / cpu if math.isfinite(min_ess) and cpu > 0 else float("nan"),
        ))
    return Calibration(rows, *_recommend(rows, base), base=base.to_dict())


def _recommend(rows: list[CalibrationRow], base: SamplerConfig) -> tuple[int | None, str]:
    usable = [i for i, r in enumerate(rows) if not r.diverged and r.max_sampling_drift < 2.0]
    if not usable:
        usable = [i for i, r in enumerate(rows) if not r.diverged]
        if not usable:
            return None, "every setting diverged: lower eps (or raise gamma)"
    measured = any(rows[i].local is not None for i in usable)
    if measured:
        local = [i for i in usable if rows[i].local]
        if not local:
            least = min(usable, key=lambda i: rows[i].climb if math.isfinite(rows[i].climb) else math.inf)
            r = rows[least]
            return None, (f"NO setting was local (the least climb: {r.climb:.0%} of the loss gap at eps {r.eps:g}, "
                          f"gamma {r.gamma:g}; the gate allows 10%): none is recommended. Try larger gamma "
                          f"(e.g. {10 * max(x.gamma for x in rows):g}) with eps about 0.1 / gamma, or the commands' "
                          "--localize.auto, which derives gamma per checkpoint")
        usable = local

    def at_base(r: CalibrationRow) -> bool:
        return r.gamma == base.gamma and (base.n_beta is None or r.n_beta == base.n_beta)

    def key(i: int) -> tuple[bool, bool, float]:
        r = rows[i]
        speed = r.ess_per_cpu_second if math.isfinite(r.ess_per_cpu_second) else -1.0
        # the base posterior before speed: a faster setting of another gamma measures another estimand
        return (r.converged, at_base(r), speed)

    best = max(usable, key=key)
    r = rows[best]
    parts = [f"eps {r.eps:g}, gamma {r.gamma:g}, n_beta {r.n_beta:g}:"]
    parts.append(f"local (climbed {r.climb:.1%} of the loss gap)," if measured else
                 "locality unmeasured (no reference_loss),")
    parts.append("converged" if r.converged else
                 f"NOT converged at this chain length (max R-hat {r.max_rhat:.3f}, min ESS "
                 f"{min(r.min_ess_bulk, r.min_ess_tail):.0f}): lengthen the chains")
    parts.append(f"fastest mixing ({r.ess_per_cpu_second:.3g} ESS per CPU-second, {r.ess_per_1000_steps:.2f} per "
                 "1,000 steps)")
    if not at_base(r):
        parts.append("NOTE: gamma / n_beta differ from the base config, so the posterior differs")
    return best, " ".join(parts)


def plot_calibration(calibration: Calibration, ax: Any = None) -> Any:
    """Min ESS per 1,000 steps and max R-hat of every setting, recommended one circled.

    Args:
        calibration: A :class:`Calibration`.
        ax: Optional sequence of 2 axes.

    Returns:
        The :class:`matplotlib.figure.Figure`.
    """
    import numpy as np

    from interp_toolkit.plotting import legend_outside, new_panels, style

    from .diagnostics import RHAT_MAX

    rows = calibration.rows
    labels = [
        f"eps {r.eps:.2g}\ngamma {r.gamma:g}" + (f"\nnb {r.n_beta:g}" if len({x.n_beta for x in rows}) > 1 else "")
        for r in rows
    ]
    x = np.arange(len(rows))
    with style():
        fig, axes = new_panels(2, ax, ncols=2, figsize=(max(8.0, 1.1 * len(rows) * 2), 4.2))
        speed = [r.ess_per_1000_steps if not r.diverged else 0.0 for r in rows]
        colors = ["tab:gray" if r.diverged else ("tab:green" if r.converged else "tab:orange") for r in rows]
        # a setting that is not local is drawn hollow: it is never recommended
        hollow = [r.local is False and not r.diverged for r in rows]
        faces = ["none" if h else c for h, c in zip(hollow, colors, strict=True)]
        axes[0].bar(x, speed, color=faces, edgecolor=colors, hatch=None)
        axes[0].set(title="mixing: min(bulk, tail) ESS per 1,000 SGLD steps\n(green: converged, orange: not, gray: "
                          "diverged; hollow: not local)",
                    ylabel="ESS / 1,000 steps")
        rhat = [r.max_rhat if not r.diverged else np.nan for r in rows]
        axes[1].bar(x, np.asarray(rhat) - 1.0, bottom=1.0, color=faces, edgecolor=colors)
        axes[1].axhline(RHAT_MAX, color="tab:red", ls="--", lw=1, label=f"R-hat {RHAT_MAX}")
        axes[1].set(title="max split R-hat of the tracked entries", ylabel="R-hat")
        legend_outside(axes[1])
        for panel in axes:
            panel.set_xticks(x, labels, fontsize=7)
            if calibration.recommended is not None:
                panel.get_xticklabels()[calibration.recommended].set_fontweight("bold")
                panel.axvspan(calibration.recommended - 0.45, calibration.recommended + 0.45, color="tab:green",
                              alpha=0.12, lw=0)
        fig.suptitle("SGLD calibration (shaded: recommended)" if calibration.recommended is not None else
                     "SGLD calibration: NO setting recommended (none was local)")
    return fig
