"""The toy-model story on one time axis: a deep linear network learns the living-things
hierarchy stage by stage, and the Bayesian influence between items changes with it.

Run (CPU, about a minute; results are cached, a rerun is faster)::

    python examples/bif_hierarchical.py --out runs/bif_hierarchical

Writes beside each other in ``--out``:

* ``bif_hierarchical.png``: (a) mode strengths per hierarchy level with the fitted Saxe
  sigmoids, (b) classical-MDS snapshots of the hidden representations, (c) BIF of
  canary on robin (same class), salmon (same kingdom) and oak (other kingdom) per
  checkpoint with standard errors, (d) the within-/between-phase split of canary -> robin,
  (e) causal windows: removal effects of canary on robin per window vs the BIF;
* ``summary.json``: every number quoted (leave-one-out correlations, causal-window
  agreement, BIF extremes and sign changes);
* ``dln_run/`` (checkpoints) and ``bif_cache/`` (one cached BIF result per checkpoint).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from interp_toolkit.analyses.bif import SamplerConfig, bif, cluster_phases, compute_bif
from interp_toolkit.analyses.bif.validation import (
    causal_window_effects,
    compare_windows,
    leave_one_out_effects,
    pearson,
    spearman,
)
from interp_toolkit.io import atomic_write_json
from interp_toolkit.plotting import save_figure
from interp_toolkit.studies.dln import (
    DLNConfig,
    DLNTrainConfig,
    classical_mds,
    dln_per_example_loss,
    fit_initial_strength,
    gradient_descent,
    mode_strengths,
    saxe_trajectory,
    train_dln,
)
from interp_toolkit.tasks.hierarchical import living_things, svd_modes

LR = 0.05
STEPS = 1500
PAIRS = {"canary->robin (same class)": ("canary", "robin"),
         "canary->salmon (same kingdom)": ("canary", "salmon"),
         "canary->oak (other kingdom)": ("canary", "oak")}


def sampler_config(quick: bool) -> SamplerConfig:
    return SamplerConfig(eps=2e-5, gamma=100.0, n_beta=400.0, chains=4, draws=60 if quick else 200,
                         burn_in=100, steps_between_draws=2, keep_draws=True, progress=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/bif_hierarchical")
    parser.add_argument("--quick", action="store_true", help="fewer draws and checkpoints (smoke test)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    started = time.time()
    data = living_things()
    modes = svd_modes(data)
    X, Y = data.inputs, data.targets
    idx = {name: data.item_index(name) for name in data.items}
    model_cfg = DLNConfig(8, 16, 30, init_scale=1e-3, seed=args.seed)
    run = train_dln(X, Y, model_cfg, DLNTrainConfig(lr=LR, steps=STEPS, n_checkpoints=20 if args.quick else 50),
                    run_dir=out / "dln_run")
    steps = sorted(run.checkpoints)

    # (a) dense mode-strength curves and fitted Saxe sigmoids.
    dense_model = run.model_at(0)
    curve = [mode_strengths(dense_model, modes)]
    gradient_descent(dense_model, X, Y, LR, STEPS, on_step=lambda s, m: curve.append(mode_strengths(m, modes)))
    curve = torch.stack(curve)
    t = torch.arange(STEPS + 1)
    fits, half_times = [], []
    for k in range(len(modes.S)):
        s = float(modes.target_strengths[k])
        a0 = fit_initial_strength(t, curve[:, k], s, LR, modes.input_variance)
        fits.append(saxe_trajectory(t, s, a0, LR, modes.input_variance))
        half_times.append(int((curve[:, k] >= s / 2).nonzero()[0]))
    saxe_error = max(float((curve[:, k] - fits[k]).abs().max() / modes.target_strengths[k]) for k in range(len(fits)))

    # (c, d) BIF at every checkpoint, with a 2-phase split of the draws by training loss.
    config = sampler_config(args.quick)
    records = []
    for step in steps:
        result = bif(run.model_at(step), (X, Y), (X, Y), dln_per_example_loss, config,
                     cache_dir=out / "bif_cache", cache_tag="dln-living-things")
        split = compute_bif(result.draws, phases=cluster_phases(result.draws.statistic, 2)).phases
        records.append((step, result, split))
        print(f"step {step:5d}  loss {result.diagnostics.initial_loss:.4f}  "
              + "  ".join(f"{a}->{b} {float(result.bif[idx[a], idx[b]]):+.2e}" for a, b in PAIRS.values()))

    # Leave-one-out at several checkpoints: continue 50 GD steps with / without each item.
    loo = {}
    for step in [s for s in steps if s >= 50][:: max(1, len(steps) // 8)]:
        result = next(r for s, r, _ in records if s == step)
        measured = leave_one_out_effects(run.model_at(step), X, Y, LR, 50)
        loo[step] = {"pearson": pearson(result.bif, measured), "spearman": spearman(result.bif, measured)}

    # (e) causal windows of 100 steps over [0, 1000]; BIF at each window's midpoint.
    horizon, width = 1000, 100
    windows = [(a, a + width) for a in range(0, horizon, width)]
    window_bif = []
    for a, b in windows:
        mid = run.model_at(0)
        gradient_descent(mid, X, Y, LR, (a + b) // 2)
        window_bif.append(bif(mid, (X, Y), (X, Y), dln_per_example_loss, config,
                              cache_dir=out / "bif_cache", cache_tag="dln-living-things").bif)
    window_bif = torch.stack(window_bif)
    causal = {m: causal_window_effects(run.model_at(0), X, Y, LR, windows, horizon, measure_at=m)
              for m in ("window_end", "horizon")}
    causal_summary = {m: compare_windows(window_bif, c.inclusion_effect) for m, c in causal.items()}

    summary = {
        "seconds": round(time.time() - started, 1),
        "sampler": config.to_dict(),
        "mode_levels": modes.levels,
        "mode_target_strengths": modes.target_strengths.tolist(),
        "mode_half_times": half_times,
        "saxe_max_relative_error": saxe_error,
        "leave_one_out_continue_50_steps": loo,
        "causal_windows": causal_summary,
        "pairs": {},
    }
    for label, (a, b) in PAIRS.items():
        values = np.array([float(r.bif[idx[a], idx[b]]) for _, r, _ in records])
        errors = np.array([float(r.stderr[idx[a], idx[b]]) for _, r, _ in records])
        significant = np.abs(values) > 2 * errors
        signs = np.sign(values[significant])
        summary["pairs"][label] = {
            "min": float(values.min()), "step_of_min": steps[int(values.argmin())],
            "max": float(values.max()), "step_of_max": steps[int(values.argmax())],
            "significant_sign_changes": int((np.diff(signs) != 0).sum()),
        }
    save_figure(plot(data, modes, curve, fits, run, steps, records, idx, windows, window_bif,
                     causal["window_end"]), out / "bif_hierarchical.png")
    atomic_write_json(out / "summary.json", summary)
    print(f"wrote {out / 'bif_hierarchical.png'} and {out / 'summary.json'} in {time.time() - started:.0f} s")
    print("leave-one-out (BIF vs measured inclusion effect):",
          {s: round(v["pearson"], 2) for s, v in loo.items()})
    print("causal windows:", causal_summary)


def plot(data, modes, curve, fits, run, steps, records, idx, windows, window_bif, causal, fig=None):
    """The five-panel figure; draws into ``fig`` (a Figure or SubFigure) if given, returns it."""
    import matplotlib

    from interp_toolkit.plotting import figure

    if fig is None:
        fig = figure(figsize=(12, 15), layout="constrained")
    grid = fig.add_gridspec(5, 5, height_ratios=[1.2, 0.9, 1.2, 1.0, 1.0])
    x_min, x_max = 10, STEPS
    # (a) mode strengths.
    ax = fig.add_subplot(grid[0, :])
    colors = matplotlib.colormaps["viridis"](np.linspace(0, 0.85, max(modes.levels) + 1))
    seen = set()
    for k, level in enumerate(modes.levels):
        label = f"level {level}" if level not in seen else None
        seen.add(level)
        ax.plot(np.arange(len(curve)), curve[:, k], color=colors[level], lw=2, label=label)
        ax.plot(np.arange(len(curve)), fits[k], color="k", lw=0.8, ls="--")
    ax.set(xscale="log", xlim=(x_min, x_max), ylabel="mode strength u^T W2 W1 v",
           title="(a) modes learned level by level (dashed: Saxe sigmoid, a0 fitted)")
    ax.legend(loc="upper left")
    # (b) MDS snapshots.
    snapshot_steps = [min(steps, key=lambda s, q=q: abs(s - q)) for q in (150, 250, 350, 600, 1500)]
    markers = {0: "o", 1: "o", 2: "s", 3: "s", 4: "^", 5: "^", 6: "v", 7: "v"}
    item_colors = ["gold", "red", "salmon", "orange", "saddlebrown", "darkgreen", "crimson", "gray"]
    for col, step in enumerate(snapshot_steps):
        sub = fig.add_subplot(grid[1, col])
        _, cache = run.model_at(step).run_with_cache(data.inputs)
        coords, _ = classical_mds(cache["hook_hidden"].detach(), 2)
        for i, name in enumerate(data.items):
            sub.scatter(coords[i, 0], coords[i, 1], c=item_colors[i], marker=markers[i], s=40)
            sub.annotate(name, coords[i].tolist(), fontsize=6)
        sub.set_title(f"(b) MDS, step {step}", fontsize=8)
        sub.set_xticks([])
        sub.set_yticks([])
    # (c) BIF of pairs.
    ax = fig.add_subplot(grid[2, :])
    for label, (a, b) in PAIRS.items():
        values = np.array([float(r.bif[idx[a], idx[b]]) for _, r, _ in records])
        errors = np.array([float(r.stderr[idx[a], idx[b]]) for _, r, _ in records])
        ax.plot(steps, values, marker=".", label=label)
        ax.fill_between(steps, values - errors, values + errors, alpha=0.25)
    ax.axhline(0, color="k", lw=0.5)
    ax.set(xscale="log", xlim=(x_min, x_max), ylabel="BIF = -Cov(loss_i, loss_j) (symlog)",
           title="(c) Bayesian influence per checkpoint (negative: training on canary lowers the query's loss); ±1 SE")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.legend()
    # (d) within / between split of canary -> robin.
    ax = fig.add_subplot(grid[3, :])
    i, j = idx["canary"], idx["robin"]
    ax.plot(steps, [float(s.total[i, j]) for _, _, s in records], color="k", label="total")
    ax.plot(steps, [float(s.within[i, j]) for _, _, s in records], label="within phases")
    ax.plot(steps, [float(s.between[i, j]) for _, _, s in records], label="between phases")
    ax.axhline(0, color="k", lw=0.5)
    ax.set(xscale="log", xlim=(x_min, x_max), ylabel="canary -> robin (symlog)",
           title="(d) split of the draws into 2 phases by training loss: within + between = total")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.legend()
    # (e) causal windows.
    ax = fig.add_subplot(grid[4, :])
    mids = [(a + b) / 2 for a, b in windows]
    effect = causal.inclusion_effect[:, i, j].numpy()
    bif_values = window_bif[:, i, j].numpy()
    def signed_sqrt(v: np.ndarray) -> np.ndarray:  # keeps the sign, compresses the range
        return np.sign(v) * np.sqrt(np.abs(v) / np.abs(v).max())

    ax.bar(mids, signed_sqrt(effect), width=80, alpha=0.5, label="inclusion effect at window end")
    ax.plot(mids, signed_sqrt(bif_values), color="C3", marker="o", label="BIF at window midpoint")
    ax.axhline(0, color="k", lw=0.5)
    ax.set(xlabel="training step", ylabel="canary -> robin, sign * sqrt(|x| / max|x|)",
           title="(e) causal windows: including canary during a 100-step window (linear axis)")
    ax.legend()
    return fig


if __name__ == "__main__":
    main()
