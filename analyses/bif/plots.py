"""Figures of a :class:`BIFResult`."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from interp_toolkit.errors import UserError

from .results import BIFResult


def plot_bif(result: BIFResult, ax: Any = None, row_groups: Mapping[str, Any] | None = None) -> Any:
    """The BIF matrix, its standard error and (with diagnostics) the SGLD loss traces.

    Args:
        result: A :class:`BIFResult`.
        ax: Optional sequence of axes to draw into: 3 when ``result.diagnostics`` is set,
            else 2.
        row_groups: Optional ``name -> boolean mask over the training rows`` (e.g.
            ``{"shortcut-consistent": agrees, "anti-shortcut": ~agrees}``): rows are drawn
            group by group, separated by a line and labelled with the group's name, size and
            mean BIF, so a contrast between the groups can be seen. Every row must be in
            exactly one group.

    Returns:
        The :class:`matplotlib.figure.Figure` drawn on (save it with
        :func:`interp_toolkit.plotting.save_figure`).

    Raises:
        ValueError: If ``row_groups`` masks do not have one entry per training row or do not
            put every row in exactly one group.
    """
    from interp_toolkit.plotting import legend_outside, new_panels, style

    matrix = result.bif.double().numpy()
    stderr = result.stderr.double().numpy()
    order = np.arange(matrix.shape[0])
    bounds: list[tuple[str, int, int, float]] = []  # (name, first row, end row, mean BIF)
    if row_groups:
        masks = {name: np.asarray(mask, dtype=bool).reshape(-1) for name, mask in row_groups.items()}
        for name, mask in masks.items():
            if mask.shape[0] != matrix.shape[0]:
                raise UserError(f"row group {name!r} has {mask.shape[0]} entries; the BIF has {matrix.shape[0]} "
                                 "training rows")
        counts = np.sum(list(masks.values()), axis=0)
        if not np.all(counts == 1):
            raise UserError(f"row_groups must put every training row in exactly one group; {int(np.sum(counts != 1))} "
                             "rows are in none or several")
        order = np.concatenate([np.flatnonzero(mask) for mask in masks.values()])
        start = 0
        for name, mask in masks.items():
            size = int(mask.sum())
            mean = float(np.nanmean(matrix[mask])) if size else float("nan")
            bounds.append((name, start, start + size, mean))
            start += size
    panels = 3 if result.diagnostics is not None else 2
    with style():
        fig, axes = new_panels(panels, ax, ncols=panels, figsize=(4.6 * panels, 3.8))
        bound = float(np.nanmax(np.abs(matrix))) or 1.0
        image = axes[0].imshow(matrix[order], cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto",
                               interpolation="nearest")
        axes[0].set(title="-Corr(loss, observable)" if result.pearson else "BIF = -Cov(loss, observable)",
                    xlabel="observable (query example)", ylabel="training example")
        axes[0].grid(False)
        fig.colorbar(image, ax=axes[0])
        image = axes[1].imshow(stderr[order], cmap="viridis", aspect="auto", interpolation="nearest")
        axes[1].set(title="standard error (across chains)", xlabel="observable (query example)")
        axes[1].grid(False)
        fig.colorbar(image, ax=axes[1])
        if bounds:
            for panel in axes[:2]:
                for _, first, _, _ in bounds[1:]:
                    panel.axhline(first - 0.5, color="black", lw=1.2)
                panel.set_yticks([(first + end - 1) / 2 for _, first, end, _ in bounds],
                                 [f"{name}\n({end - first} rows)" for name, first, end, _ in bounds])
            axes[0].set_ylabel("training example, by group")
            means = "; ".join(f"{name}: {mean:+.3g}" for name, _, _, mean in bounds)
            axes[0].set_title(f"{axes[0].get_title()}\nmean per group: {means}", fontsize="small")
        if result.diagnostics is not None:
            for chain, trace in enumerate(result.diagnostics.loss_trace.numpy()):
                axes[2].plot(trace, lw=0.6, label=f"chain {chain}")
            burn = (result.config or {}).get("burn_in", 0)
            axes[2].axvline(burn, color="k", ls="--", lw=0.8, label="end of burn-in")
            axes[2].set(title="SGLD minibatch loss", xlabel="SGLD step", ylabel="loss")
            legend_outside(axes[2])
        verdict = convergence_label(result.convergence)
        if verdict:
            fig.suptitle(verdict, color="firebrick" if verdict.startswith("NOT") else "black", fontsize="medium")
    return fig


def convergence_label(convergence: Any) -> str:
    """What a BIF figure says of its chains: ``NOT converged (max R-hat 1.07, min ESS 43)``
    when they failed the R-hat / ESS rule, ``converged (...)`` when they passed, ``""``
    without diagnostics."""
    if convergence is None:
        return ""
    summary = convergence.summary()
    rhat, bulk, tail = summary["max_rhat"], summary["min_ess_bulk"], summary["min_ess_tail"]
    ess = None if bulk is None or tail is None else min(bulk, tail)
    numbers = (f"max R-hat {'n/a' if rhat is None else f'{rhat:.3f}'}, "
               f"min ESS {'n/a' if ess is None else f'{ess:.0f}'}")
    if summary["converged"]:
        return f"converged ({numbers})"
    return (f"NOT converged ({numbers}; needs R-hat <= {summary['rhat_max_threshold']} and ESS >= "
            f"{summary['ess_min_threshold']:.0f}): the estimates are not yet reliable")


def plot_diagnostics(
    loss_trace: Any,
    distance_trace: Any,
    convergence: Any,
    burn_in: int = 0,
    title: str | None = None,
    ax: Any = None,
    steps_per_point: int = 1,
    locality: Any = None,
) -> Any:
    """The SGLD diagnostics in one figure: per-chain loss and distance from ``w*`` over steps
    (with the checkpoint's loss, the reference loss, the locality gate's line and the
    prior-only radius), R-hat and bulk/tail ESS of every tracked entry and scalar trace against
    their thresholds (those that fail hollow and named), and the between-chain share of every
    tracked entry.

    Args:
        loss_trace: ``[chains, steps]`` minibatch loss before every step.
        distance_trace: ``[chains, steps]`` ``||w - w*||`` (or ``None``).
        convergence: A :class:`~interp_toolkit.analyses.bif.diagnostics.ConvergenceDiagnostics`.
        burn_in: Steps of burn-in (marked).
        title: Figure title (default: the verdict).
        ax: Optional sequence of 4 axes.
        steps_per_point: SGLD steps between the traces' points (for thinned traces).
        locality: The result's :class:`~.locality.Locality` (lines and the title's verdict).

    Returns:
        The :class:`matplotlib.figure.Figure`.
    """
    from interp_toolkit.plotting import legend_outside, new_panels, style

    from .diagnostics import ESS_MIN, RHAT_MAX

    with style():
        fig, axes = new_panels(4, ax, ncols=2, figsize=(14, 8))  # wide: the legends sit outside
        for chain, trace in enumerate(np.asarray(loss_trace, dtype=float)):
            axes[0].plot(np.arange(trace.size) * steps_per_point, trace, lw=0.6, label=f"chain {chain}")
        axes[0].set(title="SGLD minibatch loss", xlabel="SGLD step", ylabel="loss")
        if locality is not None:
            gap_line = locality.checkpoint_loss + locality.climb_max * (locality.reference_loss
                                                                         - locality.checkpoint_loss)
            axes[0].axhline(locality.checkpoint_loss, color="k", lw=1, label="loss at the checkpoint w*")
            if np.isfinite(locality.reference_loss):
                axes[0].axhline(locality.reference_loss, color="tab:red", lw=1,
                                label=f"{locality.reference} (solution gone)")
                axes[0].axhline(gap_line, color="tab:orange", lw=1, ls="--",
                                label=f"locality gate: {locality.climb_max:.0%} of the gap")
            values = np.asarray(loss_trace, dtype=float)
            low = min(np.nanmin(values), locality.checkpoint_loss)
            if low > 0 and np.nanmax(values) / low > 100:
                axes[0].set_yscale("log")  # a checkpoint at 1e-5 and chance at 0.7 both readable
        if distance_trace is not None:
            for trace in np.asarray(distance_trace, dtype=float):
                axes[1].plot(np.arange(trace.size) * steps_per_point, trace, lw=0.6)
        if locality is not None and np.isfinite(locality.prior_radius):
            axes[1].axhline(locality.prior_radius, color="tab:purple", lw=1, ls="--",
                            label="prior-only radius sqrt(d / gamma)")
            legend_outside(axes[1])
        axes[1].set(title="distance from the localization point w*", xlabel="SGLD step", ylabel="||w - w*||")
        for panel in axes[:2]:
            if burn_in:
                panel.axvline(burn_in, color="k", ls="--", lw=0.8, label="end of burn-in")
        legend_outside(axes[0])
        rhat = convergence.rhat.double().numpy().reshape(-1)
        bulk = convergence.ess_bulk.double().numpy().reshape(-1)
        tail = convergence.ess_tail.double().numpy().reshape(-1)
        index = np.arange(rhat.size)
        def failing(r: np.ndarray, e: np.ndarray) -> np.ndarray:
            return ~((r <= RHAT_MAX) & (e >= ESS_MIN))

        # passing entries filled, failing ones hollow (as on every BIF figure)
        for values, marker, name in ((bulk, "o", "bulk ESS"), (tail, "s", "tail ESS")):
            fails = failing(rhat, values)
            axes[2].scatter(values[~fails], rhat[~fails], s=10, marker=marker, label=f"entries, {name}")
            if fails.any():
                axes[2].scatter(values[fails], rhat[fails], s=24, marker=marker, facecolors="none",
                                edgecolors="tab:red", label=f"entries failing ({name})")
        # the scalar traces (mean losses, distance) are tracked quantities too: drawn and named
        for name, stats in (getattr(convergence, "scalars", None) or {}).items():
            r, e = float(stats["rhat"]), min(float(stats["ess_bulk"]), float(stats["ess_tail"]))
            if not (np.isfinite(r) and np.isfinite(e)):
                continue
            scalar_fails = bool(failing(np.asarray([r]), np.asarray([e]))[0])
            axes[2].scatter([e], [r], s=60, marker="*", facecolors="none" if scalar_fails else "tab:green",
                            edgecolors="tab:red" if scalar_fails else "tab:green")
            axes[2].annotate(name + (" (fails)" if scalar_fails else ""), (e, r), fontsize=7, xytext=(4, 2),
                             textcoords="offset points", color="tab:red" if scalar_fails else "k")
        axes[2].axhline(RHAT_MAX, color="tab:red", lw=1, ls="--", label=f"R-hat {RHAT_MAX}")
        axes[2].axvline(ESS_MIN, color="tab:red", lw=1, ls=":", label=f"ESS {ESS_MIN:.0f}")
        axes[2].set(xscale="log", title=f"tracked entries ({rhat.size}, dots) and scalar traces (stars): "
                                        "split R-hat vs ESS; hollow: failing",
                    xlabel="effective sample size (all chains)", ylabel="split R-hat")
        from matplotlib.ticker import NullFormatter

        axes[2].xaxis.set_minor_formatter(NullFormatter())  # 2x10^2, 3x10^2, ... overprint each other
        legend_outside(axes[2])
        share = convergence.between_chain_share.double().numpy().reshape(-1)
        # entries near 0 have shares of any size: shown clipped to [-3, 3]
        axes[3].bar(index, np.clip(share, -3, 3), color=np.where(np.abs(share) > 0.5, "tab:red", "tab:blue"))
        axes[3].axhline(0, color="k", lw=0.5)
        axes[3].set(title="between-chain share of each tracked entry (red: |share| > 0.5; clipped at 3)",
                    xlabel="tracked entry (row-major)", ylabel="(pooled - mean per chain) / pooled", ylim=(-3.2, 3.2))
        verdict = "converged" if convergence.converged else "NOT converged"
        if locality is not None:
            verdict = f"{verdict}, {'local' if locality.local else 'NOT local'} " \
                      f"(draws climbed {locality.mean_climb:.1%} of the loss gap)"
        failed = not convergence.converged or (locality is not None and not locality.local)
        fig.suptitle(title or f"SGLD diagnostics: {verdict}\nmax R-hat {convergence.max_rhat:.3f}, "
                     f"min ESS bulk {convergence.min_ess_bulk:.0f} / tail {convergence.min_ess_tail:.0f}",
                     color="firebrick" if failed else "black")
    return fig
