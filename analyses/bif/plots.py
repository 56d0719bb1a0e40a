"""Figures of a :class:`BIFResult`."""

from __future__ import annotations

from typing import Any

import numpy as np

from .results import BIFResult


def plot_bif(result: BIFResult, ax: Any = None) -> Any:
    """The BIF matrix, its standard error and (with diagnostics) the SGLD loss traces.

    Args:
        result: A :class:`BIFResult`.
        ax: Optional sequence of axes to draw into: 3 when ``result.diagnostics`` is set,
            else 2.

    Returns:
        The :class:`matplotlib.figure.Figure` drawn on (save it with
        :func:`interp_toolkit.plotting.save_figure`).
    """
    from interp_toolkit.plotting import new_panels, style

    panels = 3 if result.diagnostics is not None else 2
    with style():
        fig, axes = new_panels(panels, ax, ncols=panels, figsize=(4.3 * panels, 3.6))
        matrix = result.bif.double().numpy()
        bound = float(np.nanmax(np.abs(matrix))) or 1.0
        image = axes[0].imshow(matrix, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto",
                               interpolation="nearest")
        axes[0].set(title="-Corr(loss, observable)" if result.pearson else "BIF = -Cov(loss, observable)",
                    xlabel="observable", ylabel="training example")
        axes[0].grid(False)
        fig.colorbar(image, ax=axes[0])
        image = axes[1].imshow(result.stderr.double().numpy(), cmap="viridis", aspect="auto",
                               interpolation="nearest")
        axes[1].set(title="standard error (across chains)", xlabel="observable")
        axes[1].grid(False)
        fig.colorbar(image, ax=axes[1])
        if result.diagnostics is not None:
            for chain, trace in enumerate(result.diagnostics.loss_trace.numpy()):
                axes[2].plot(trace, lw=0.6, label=f"chain {chain}")
            burn = (result.config or {}).get("burn_in", 0)
            axes[2].axvline(burn, color="k", ls="--", lw=0.8, label="end of burn-in")
            axes[2].set(title="SGLD minibatch loss", xlabel="SGLD step", ylabel="loss")
            axes[2].legend()
    return fig
