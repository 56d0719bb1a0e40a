"""The figure of the hierarchy study (:func:`plot_hierarchy`;
:mod:`interp_toolkit.studies.bif.hierarchy` computes what it draws)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["HEADLINE", "PAIRS", "plot_hierarchy"]

#: The pair the paper tells the story with, and the pairs drawn thick in panel (c).
HEADLINE = ("dog", "sparrow")
PAIRS = {"dog -> sparrow (share animal)": ("dog", "sparrow"),
         "dog -> cat (share mammal)": ("dog", "cat"),
         "dog -> oak (share only the root)": ("dog", "oak")}


def plot_hierarchy(data: Any, modes: Any, curve: Any, half_times: Any, branch_steps: Any, model_at: Any, steps: Any,
                   bif_q: Any, se_q: Any, learned: Any, transitions: Any, loo: Any, idx: Any, windows: Any,
                   window_bif: Any, causal: Any) -> Any:
    """The seven-panel figure of :func:`~interp_toolkit.studies.bif.hierarchy.hierarchy_study`
    (a matplotlib Figure; no pyplot state, no backend change)."""
    from interp_toolkit.plotting import figure as new_figure
    from interp_toolkit.studies.bif.dln import classical_mds

    figure = new_figure(figsize=(12, 22))
    grid = figure.add_gridspec(7, 5, height_ratios=[1.1, 0.9, 1.3, 0.9, 0.9, 0.9, 0.9])
    x_min, x_max = 100, len(curve) - 1
    level_colors = {0: "tab:gray", 1: "tab:blue", 2: "tab:orange", 3: "tab:green"}

    def mark_branches(ax) -> None:
        for level, step in branch_steps.items():
            if step > 0:
                ax.axvline(step, color=level_colors.get(level, "k"), ls=":", lw=1.2)

    ax = figure.add_subplot(grid[0, :])
    seen = set()
    for k, level in enumerate(modes.levels):
        ax.plot(np.arange(len(curve)), curve[:, k], color=level_colors[level], lw=2,
                label=f"level {level} modes" if level not in seen else None)
        seen.add(level)
    mark_branches(ax)
    ax.set(xscale="log", xlim=(x_min, x_max), ylabel="u^T W2 W1 v",
           title="(a) mode strengths; dotted: steps where the hidden representation branches at each level")
    ax.legend(loc="upper left", fontsize=8)

    snapshots = [min(steps, key=lambda s, q=q: abs(s - q)) for q in (250, 400, 600, 900, 2000)]  # type: ignore[misc]
    for col, step in enumerate(snapshots):
        sub = figure.add_subplot(grid[1, col])
        hidden = model_at(step).W1.weight.detach().T
        coords, _ = classical_mds(hidden, 2)
        for item in data.items:
            k = data.item_index(item)
            sub.scatter(coords[k, 0], coords[k, 1], s=30)
            sub.annotate(item, coords[k].tolist(), fontsize=6)
        sub.set_title(f"(b) MDS, step {step}", fontsize=8)
        sub.set_xticks([])
        sub.set_yticks([])

    ax = figure.add_subplot(grid[2, :])
    for a_name in data.items:
        for b_name in data.items:
            if a_name != b_name:
                level = data.lowest_common_level(idx[a_name], idx[b_name])
                ax.plot(steps, bif_q[:, idx[a_name], idx[b_name]], color=level_colors[level], lw=0.4, alpha=0.5)
    for (label, (a_name, b_name)), color in zip(PAIRS.items(), ("k", "tab:orange", "tab:gray"), strict=True):
        values, errors = bif_q[:, idx[a_name], idx[b_name]], se_q[:, idx[a_name], idx[b_name]]
        ax.plot(steps, values, color=color, lw=2 if a_name == "dog" and b_name == "sparrow" else 1.2, label=label)
        ax.fill_between(steps, values - errors, values + errors, color=color, alpha=0.2)
    mark_branches(ax)
    ax.axhline(0, color="k", lw=0.5)
    ax.set(xscale="log", xlim=(x_min, x_max), ylabel="BIF = -Cov (symlog)",
           title="(c) BIF over training, negative = helpful; thin: every pair, coloured by its lowest common level")
    ax.set_yscale("symlog", linthresh=1e-4)
    ax.legend(fontsize=8)

    ax = figure.add_subplot(grid[3, :])
    for k, level in enumerate(modes.levels):
        ax.plot(steps, learned[:, k], color=level_colors[level], marker=".", lw=1)
    mark_branches(ax)
    ax.axhline(0.5, color="k", lw=0.5, ls="--")
    ax.set(xscale="log", xlim=(x_min, x_max), ylabel="pi(mode learned)",
           title="(d) solution-based phases: fraction of posterior draws past half strength, per mode")

    ax = figure.add_subplot(grid[4, :])
    if transitions:
        t_steps = [t["step"] for t in transitions]
        ax.plot(t_steps, [t["share"] for t in transitions], "o", color="k", label="between share, all pairs")
        null = np.array([t["null_share"] for t in transitions])
        null_std = np.array([t["null_std"] for t in transitions])
        ax.errorbar(t_steps, null, yerr=2 * null_std, fmt="_", color="tab:red", label="Gaussian null ± 2 sd")
        ax.plot(t_steps, [t["dog_sparrow_share"] for t in transitions], "x", color="tab:blue", label="dog -> sparrow")
    ax.set(xscale="log", xlim=(x_min, x_max), ylabel="between / total",
           title="(e) between-phase share where the draws straddle a mode's half strength, vs its null")
    ax.legend(fontsize=8)

    ax = figure.add_subplot(grid[5, :])
    ax.plot([r["step"] for r in loo], [r["retrain_pearson"] for r in loo], "o-", label="retrained LOO, Pearson")
    ax.plot([r["step"] for r in loo], [r["retrain_spearman"] for r in loo], ".-", label="retrained LOO, Spearman")
    local = [r for r in loo if "local_continuation_pearson" in r]
    ax.plot([r["step"] for r in local], [r["local_continuation_pearson"] for r in local], "s--",
            label="local continuation (50 steps), Pearson")
    mark_branches(ax)
    ax.axhline(0, color="k", lw=0.5)
    ax.set(xscale="log", xlim=(x_min, x_max), ylabel="corr(BIF, inclusion effect)",
           title="(f) BIF vs leave-one-out, all 56 pairs + 8 self-terms, per checkpoint")
    ax.legend(fontsize=8)

    ax = figure.add_subplot(grid[6, :])
    i, j = idx[HEADLINE[0]], idx[HEADLINE[1]]
    mids = [(a + b) / 2 for a, b in windows]
    effect = causal.inclusion_effect[:, i, j].numpy()
    values = window_bif[:, i, j].numpy()

    def signed_sqrt(v: np.ndarray) -> np.ndarray:
        return np.sign(v) * np.sqrt(np.abs(v) / max(np.abs(v).max(), 1e-30))

    ax.bar(mids, signed_sqrt(effect), width=80, alpha=0.5, label="inclusion effect at window end")
    ax.plot(mids, signed_sqrt(values), color="C3", marker="o", label="BIF at window midpoint")
    ax.axhline(0, color="k", lw=0.5)
    ax.set(xlabel="training step", ylabel="dog -> sparrow, sign * sqrt(|x| / max|x|)",
           title="(g) causal windows: dog removed only during a 100-step window (linear axis)")
    ax.legend(fontsize=8)
    figure.tight_layout()
    return figure
