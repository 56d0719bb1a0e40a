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
) -> Any:
    """The SGLD diagnostics in one figure: per-chain loss and distance from ``w*`` over steps,
    R-hat and bulk/tail ESS of every tracked entry against their thresholds, and the
    between-chain share of every tracked entry.

    Args:
        loss_trace: ``[chains, steps]`` minibatch loss before every step.
        distance_trace: ``[chains, steps]`` ``||w - w*||`` (or ``None``).
        convergence: A :class:`~interp_toolkit.analyses.bif.diagnostics.ConvergenceDiagnostics`.
        burn_in: Steps of burn-in (marked).
        title: Figure title (default: the verdict).
        ax: Optional sequence of 4 axes.
        steps_per_point: SGLD steps between the traces' points (for thinned traces).

    Returns:
        The :class:`matplotlib.figure.Figure`.
    """
    from interp_toolkit.plotting import legend_outside, new_panels, style

    from .diagnostics import ESS_MIN, RHAT_MAX

    with style():
        fig, axes = new_panels(4, ax, ncols=2, figsize=(11, 7.5))
        for chain, trace in enumerate(np.asarray(loss_trace, dtype=float)):
            axes[0].plot(np.arange(trace.size) * steps_per_point, trace, lw=0.6, label=f"chain {chain}")
        axes[0].set(title="SGLD minibatch loss", xlabel="SGLD step", ylabel="loss")
        if distance_trace is not None:
            for trace in np.asarray(distance_trace, dtype=float):
                axes[1].plot(np.arange(trace.size) * steps_per_point, trace, lw=0.6)
        axes[1].set(title="distance from the localization point w*", xlabel="SGLD step", ylabel="||w - w*||")
        for panel in axes[:2]:
            if burn_in:
                panel.axvline(burn_in, color="k", ls="--", lw=0.8, label="end of burn-in")
        legend_outside(axes[0])
        rhat = convergence.rhat.double().numpy().reshape(-1)
        bulk = convergence.ess_bulk.double().numpy().reshape(-1)
        tail = convergence.ess_tail.double().numpy().reshape(-1)
        index = np.arange(rhat.size)
        axes[2].scatter(bulk, rhat, s=10, label="bulk ESS")
        axes[2].scatter(tail, rhat, s=10, marker="x", label="tail ESS")
        axes[2].axhline(RHAT_MAX, color="tab:red", lw=1, ls="--", label=f"R-hat {RHAT_MAX}")
        axes[2].axvline(ESS_MIN, color="tab:red", lw=1, ls=":", label=f"ESS {ESS_MIN:.0f}")
        axes[2].set(xscale="log", title=f"tracked entries ({rhat.size}): split R-hat vs ESS",
                    xlabel="effective sample size (all chains)", ylabel="split R-hat")
        legend_outside(axes[2])
        share = convergence.between_chain_share.double().numpy().reshape(-1)
        # entries near 0 have shares of any size: shown clipped to [-3, 3]
        axes[3].bar(index, np.clip(share, -3, 3), color=np.where(np.abs(share) > 0.5, "tab:red", "tab:blue"))
        axes[3].axhline(0, color="k", lw=0.5)
        axes[3].set(title="between-chain share of each tracked entry (red: |share| > 0.5; clipped at 3)",
                    xlabel="tracked entry (row-major)", ylabel="(pooled - mean per chain) / pooled", ylim=(-3.2, 3.2))
        verdict = "converged" if convergence.converged else "NOT converged"
        fig.suptitle(title or f"SGLD diagnostics: {verdict} (max R-hat {convergence.max_rhat:.3f}, "
                     f"min ESS bulk {convergence.min_ess_bulk:.0f} / tail {convergence.min_ess_tail:.0f})")
    return fig
