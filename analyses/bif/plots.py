"""Figures of a :class:`BIFResult`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from interp_toolkit.io import atomic_write_bytes

from .results import BIFResult


def plot_bif(result: BIFResult, path: str | Path) -> Path:
    """Save a PNG: the BIF matrix, its standard error, and the SGLD loss traces."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    panels = 3 if result.diagnostics is not None else 2
    fig, axes = plt.subplots(1, panels, figsize=(4.5 * panels, 4))
    matrix = result.bif.double().numpy()
    bound = float(np.nanmax(np.abs(matrix))) or 1.0
    im = axes[0].imshow(matrix, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto")
    axes[0].set(title="-Corr" if result.pearson else "BIF = -Cov", xlabel="observable", ylabel="training example")
    fig.colorbar(im, ax=axes[0])
    im = axes[1].imshow(result.stderr.double().numpy(), cmap="viridis", aspect="auto")
    axes[1].set(title="standard error", xlabel="observable")
    fig.colorbar(im, ax=axes[1])
    if result.diagnostics is not None:
        for chain, trace in enumerate(result.diagnostics.loss_trace.numpy()):
            axes[2].plot(trace, lw=0.6, label=f"chain {chain}")
        burn = (result.config or {}).get("burn_in", 0)
        axes[2].axvline(burn, color="k", ls="--", lw=0.8)
        axes[2].set(title="SGLD minibatch loss", xlabel="step")
    fig.tight_layout()
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
    return path
