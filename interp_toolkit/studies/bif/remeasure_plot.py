"""The figures of the hierarchy re-measurement (:mod:`interp_toolkit.studies.bif.remeasure_analysis`
computes what they draw): :func:`plot` (the claims), :func:`diag_figure` (one replica's chains),
:func:`replot` (the claims' figure again from a committed ``summary.json``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from interp_toolkit.analyses.bif import Draws, compute_bif
from interp_toolkit.plotting import save_figure

__all__ = ["PAIRS", "PREVIOUS", "diag_figure", "plot", "replot"]

PAIRS = {"dog->sparrow": ("dog", "sparrow"), "dog->oak": ("dog", "oak"), "dog->cat": ("dog", "cat")}
#: docs/bif.md before this re-measurement (4 chains x 200 draws, 500-step chains, 1 seed, 1 init)
PREVIOUS = {214: (-5.2e-3, 1.5e-3), 384: (1.09e-3, 0.08e-3)}
NULL_REPEATS = 2000



def diag_figure(out: Path, meta: dict, labels: list, docs: Path, init: int = 0, step: int = 384) -> None:
    """The diagnostics figure of one network (seed 0's chains) at the doc's headline step."""
    from interp_toolkit.analyses.bif import plot_diagnostics
    from interp_toolkit.io import load_artifact

    r = labels.index((init, step))
    tensors, seed_meta = load_artifact(out / "draws_seed0.safetensors", kind="bif_remeasure_draws")
    a = tensors["losses"][:, :, r, :].double()
    result = compute_bif(Draws(a, a))
    loss_trace = tensors["loss_trace"][:, :, r].numpy()
    distance_trace = tensors["distance_trace"][:, :, r].numpy()
    every = seed_meta["trace_every"]
    fig = plot_diagnostics(
        loss_trace,
        distance_trace,
        result.convergence,
        burn_in=meta["sampler"]["burn_in"],
        steps_per_point=every,
        title=f"DLN init {init}, step {step}, sampler seed 0, 4 chains x "
        f"{meta['sampler']['burn_in'] + meta['sampler']['draws'] * meta['sampler']['steps_between_draws']}"
        f" steps: {'converged' if result.convergence.converged else 'NOT converged'} (max "
        f"R-hat {result.convergence.max_rhat:.3f}, min ESS {result.convergence.min_ess_bulk:.0f})",
    )
    save_figure(fig, docs / f"diagnostics_step{step}.png")


def plot(table: list[dict], timelines: dict, causal: list[dict], config: dict):
    from interp_toolkit.plotting import figure as new_figure

    fig = new_figure(figsize=(11, 10))
    grid = fig.add_gridspec(3, 2, height_ratios=[1.3, 0.8, 0.9])
    ax = fig.add_subplot(grid[0, :])
    colors = {"dog->sparrow": "k", "dog->oak": "tab:gray", "dog->cat": "tab:orange"}
    for name, color in colors.items():
        sel = [t for t in table if t["pair"] == name]
        steps = np.array([t["step"] for t in sel])
        mean = np.array([t["mean_bif"] for t in sel])
        se = np.array([t["stderr_seeds_inits"] for t in sel])
        ax.errorbar(steps, mean, yerr=2 * se, color=color, marker="o", ms=3, capsize=2, label=f"{name} (mean, ±2 SE)")
    for step, (value, previous_se) in PREVIOUS.items():
        ax.errorbar([step], [value], yerr=[2 * previous_se], color="tab:red", marker="x", capsize=3, ls="none")
    ax.plot([], [], "x", color="tab:red", label="dog->sparrow, previous page (1 seed, 500-step chains)")
    for b in timelines[0]["branch_steps"].values():
        if b > 0:
            ax.axvline(b, color="tab:blue", ls=":", lw=1)
    ax.axhline(0, color="k", lw=0.5)
    ax.set(xscale="log", xlim=(40, 2100), yscale="symlog", xlabel="GD step of the checkpoint",
           ylabel="BIF = -Cov (symlog; negative = helpful)",
           title=(f"Re-measured, eps {config['eps']:g}: {len({c['init'] for c in causal})} DLN inits x "
                  f"{len({c['seed'] for c in causal}) - 1} "
                  f"sampler seeds x 4 chains of {config['burn_in'] + config['draws'] * config['steps_between_draws']}"
                  " steps (dotted: init 0's branch steps)"))
    ax.set_yscale("symlog", linthresh=1e-4)
    ax.legend(fontsize=8, loc="lower right")

    ax = fig.add_subplot(grid[1, 0])
    sel = [t for t in table if t["pair"] == "dog->sparrow"]
    ax.plot([t["step"] for t in sel], [t["max_rhat"] for t in sel], "o-", ms=3, label="max split R-hat "
                                                                                      f"({len(sel[0]['bif_init'])} "
                                                                                      "inits)")
    ax.axhline(1.01, color="tab:red", ls="--", lw=1, label="1.01")
    ax.set(xscale="log", ylabel="R-hat", title="dog->sparrow: convergence per checkpoint")
    twin = ax.twinx()
    twin.plot([t["step"] for t in sel], [min(t["min_ess_bulk"], t["min_ess_tail"]) for t in sel], "s--", ms=3,
              color="tab:green", label="min ESS (bulk, tail)")
    twin.axhline(100, color="tab:green", ls=":", lw=1)
    twin.set_ylabel(f"ESS ({4 * (len({c['seed'] for c in causal}) - 1)} chains)")
    twin.grid(False)
    lines, names = ax.get_legend_handles_labels()
    lines2, names2 = twin.get_legend_handles_labels()
    ax.legend(lines + lines2, names + names2, fontsize=7)

    ax = fig.add_subplot(grid[1, 1])
    for name, color in colors.items():
        sel = [t for t in table if t["pair"] == name]
        ax.plot([t["step"] for t in sel], [np.median(t["between_chain_share_init"]) for t in sel], "o-", ms=3,
                color=color, label=name)
    ax.axhline(0, color="k", lw=0.5)
    ax.set(xscale="log", ylim=(-3, 3), ylabel="(pooled - mean per chain) / pooled",
           title="between-chain share (median over inits)")
    ax.legend(fontsize=7)

    ax = fig.add_subplot(grid[2, :])
    pooled = [c for c in causal if c["seed"] == "all"]
    per_seed = [c for c in causal if c["seed"] != "all"]
    x = np.arange(len(pooled))
    per_seed = [c for p in pooled for c in per_seed if c["init"] == p["init"] and c["windows"] == p["windows"]]
    ax.bar(x - 0.2, [c["agreement"] for c in pooled], width=0.4, label="agreement, BIF pooled over seeds")
    ax.scatter(np.repeat(x, len(per_seed) // len(pooled)) + 0.2, [c["agreement"] for c in per_seed], color="k",
               s=12, label="agreement, one sampler seed")
    ax.errorbar(x, [c["null_mean"] for c in pooled],
                yerr=[[0] * len(pooled), [c["null_p95"] - c["null_mean"] for c in pooled]],
                fmt="_", color="tab:red", capsize=4, label="pair-permuted null: mean, 95th percentile")
    ax.axhline(1 / 12, color="k", ls=":", lw=1, label="chance 1/12 (uniform windows)")
    ax.set_xticks(x, [f"init {c['init']}\n{c['windows']} windows" for c in pooled], fontsize=8)
    ax.set(ylabel="peak window agreement", title="causal windows: window of largest |BIF| = window whose removal "
                                                 "matters most")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def replot(docs: Path) -> None:
    """Redraw ``remeasure.png`` from ``remeasure_summary.json`` (no recomputation)."""
    import json

    summary = json.loads((docs / "remeasure_summary.json").read_text())
    timelines = {int(k): {**v, "branch_steps": {int(a): b for a, b in v["branch_steps"].items()}}
                 for k, v in summary["timelines"].items()}
    save_figure(plot(summary["pairs"], timelines, summary["causal_windows"], summary["sampler"]),
                docs / "remeasure.png")
