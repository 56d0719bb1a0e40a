"""Stagewise attribution on the hierarchy toy, as the paper tells it: a deep linear network
learns animals vs plants, then mammals vs birds (and trees vs flowers), then the species;
the Bayesian influence of a dog sample on a sparrow sample is helpful (negative) while
animal vs plant is learned and harmful (positive) while mammal vs bird is learned.

:func:`hierarchy_study` runs the whole study (``examples/bif_hierarchical.py`` is its command
line) and writes beside each other in ``out``:

* ``bif_hierarchical.png`` (:func:`~interp_toolkit.studies.bif.hierarchy_plot.plot_hierarchy`):
  (a) mode strengths (and the hidden representation's branch steps, dotted) over training;
  (b) MDS snapshots of the hidden representations; (c) BIF of dog on sparrow, cat and oak per
  checkpoint (every other pair thin, coloured by the level of the items' lowest common node),
  branch steps marked; (d) solution-based phase weights: for each mode, the fraction of
  posterior draws that have learned it; (e) the between-phase share of dog -> sparrow next to
  its Gaussian null; (f) BIF vs leave-one-out by retraining (and the cheaper local
  continuation), correlation per checkpoint; (g) causal windows.
* ``summary.json``: every number quoted in ``docs/bif.md`` (``cluster_phases_vs_null``:
  the 2-means loss split next to its Gaussian null).
* ``dln_run/`` (checkpoints) and ``bif_cache/`` (one cached BIF result per checkpoint): a
  rerun reads them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from interp_toolkit.analyses.bif import (
    SamplerConfig,
    bif,
    cluster_phases,
    phase_share_with_null,
    threshold_phases,
)
from interp_toolkit.analyses.bif.validation import (
    causal_window_effects,
    compare_windows,
    local_continuation_effects,
    pearson,
    retrain_leave_one_out_effects,
    spearman,
)
from interp_toolkit.io import atomic_write_json
from interp_toolkit.plotting import save_figure
from interp_toolkit.studies.bif.dln import (
    DeepLinearNetwork,
    DLNConfig,
    DLNTrainConfig,
    dln_per_example_loss,
    gradient_descent,
    mode_strength_observable,
    mode_strengths,
    train_dln,
)
from interp_toolkit.studies.bif.hierarchy_plot import HEADLINE, PAIRS, plot_hierarchy
from interp_toolkit.tasks.hierarchical import animals_and_plants, svd_modes

__all__ = ["LR", "STEPS", "hidden_branch_steps", "hierarchy_study", "sampler_config", "summary_lines"]

#: Gradient-descent learning rate and steps of the DLN run (this project's choices).
LR = 0.05
STEPS = 2000


def sampler_config(quick: bool) -> SamplerConfig:
    """The SGLD settings of the study (``quick``: fewer draws, for a smoke test)."""
    return SamplerConfig(eps=2e-5, gamma=100.0, n_beta=400.0, chains=4, draws=60 if quick else 200,
                         burn_in=100, steps_between_draws=2, keep_draws=True, progress=False)


def hidden_branch_steps(hidden_by_step: list[torch.Tensor], data: Any) -> tuple[dict[int, int], np.ndarray]:
    """Steps where the hidden representation branches at each level: the distance between
    the centroids of the two children of every node at that level (level 0: the centroid's
    norm) reaches half its final value (mean over the level's nodes).

    Args:
        hidden_by_step: ``[items, hidden]`` hidden representations at steps 0, 1, 2, ...
        data: The hierarchy.
    """
    steps = list(range(len(hidden_by_step)))
    rows = []
    for hidden in hidden_by_step:
        hidden = hidden.double()
        row = [float(hidden.mean(0).norm())]
        for level in range(data.depth):
            gaps = []
            for parent in data.groups[level]:
                children = [g for g in data.groups[level + 1] if set(g) <= set(parent)]
                if len(children) == 2:
                    gaps.append(float((hidden[children[0]].mean(0) - hidden[children[1]].mean(0)).norm()))
            row.append(float(np.mean(gaps)))
        rows.append(row)
    distances = np.array(rows)  # [steps, depth + 1]: level 0 = root, level l = split below level l-1
    branch = {}
    for level in range(distances.shape[1]):
        final = distances[-1, level]
        above = np.nonzero(distances[:, level] >= final / 2)[0]
        branch[level] = int(steps[above[0]]) if above.size else -1
    return branch, distances


def hierarchy_study(out: str | Path, *, quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """The whole hierarchy study: the DLN run, BIF at every checkpoint (and a dense comb before
    every mode's half-strength step), solution-based phases with their Gaussian null, peaks
    against branch steps, leave-one-out by retraining and causal windows. Writes the figure and
    ``summary.json`` under ``out`` (module docstring) and returns the summary.

    Args:
        out: Output directory (the DLN run and the BIF results are cached there).
        quick: Fewer draws and checkpoints (a smoke test, ~1 minute on 2 cores).
        seed: The DLN's initialization seed.
    """
    out = Path(out)
    started = time.time()
    data = animals_and_plants()
    modes = svd_modes(data)
    X, Y = data.inputs, data.targets
    P = data.n_items
    idx = {name: data.item_index(name) for name in data.items}
    model_cfg = DLNConfig(P, 16, data.n_properties, init_scale=1e-3, seed=seed)

    # Dense mode-strength curves (one GD run, every step): half-strength steps per mode.
    # Hidden representations W1 x_i = column i of W1 (one-hot inputs), for the branch steps.
    probe = DeepLinearNetwork(model_cfg)
    strengths = [mode_strengths(probe, modes)]
    hidden_by_step = [probe.W1.weight.detach().T.clone()]

    def record(step: int, model: DeepLinearNetwork) -> None:
        strengths.append(mode_strengths(model, modes))
        hidden_by_step.append(model.W1.weight.detach().T.clone())

    gradient_descent(probe, X, Y, LR, STEPS, on_step=record)
    curve = torch.stack(strengths).numpy()
    half = modes.target_strengths.numpy() / 2
    half_times = [int(np.nonzero(curve[:, k] >= half[k])[0][0]) for k in range(len(half))]

    # Checkpoints: log-spaced, plus a dense comb just before every mode's half-strength step
    # (the posterior runs a few steps ahead of w*, and straddles half strength only there).
    train_cfg = DLNTrainConfig(lr=LR, steps=STEPS, n_checkpoints=16 if quick else 36)
    comb = sorted({t + d for t in half_times for d in ((-8, -4, 0) if quick else range(-12, 1, 3)) if t + d > 0})
    run = train_dln(X, Y, model_cfg, train_cfg, run_dir=out / "dln_run")
    cache: dict[int, dict[str, torch.Tensor]] = {}

    def model_at(step: int) -> DeepLinearNetwork:
        if step in run.checkpoints:
            return run.model_at(step)
        if step not in cache:
            model = run.model_at(0)
            gradient_descent(model, X, Y, LR, step)
            cache[step] = {k: v.clone() for k, v in model.state_dict().items()}
        model = run.model_at(0)
        model.load_state_dict(cache[step])
        return model

    steps = sorted(set(run.checkpoints) | set(comb))
    branch_steps, branch_distances = hidden_branch_steps(hidden_by_step, data)

    # BIF at every step, recording the mode strengths too: the draws' solution-based phases.
    config = sampler_config(quick)
    mode_obs = mode_strength_observable(modes)
    records = []
    for step in steps:
        result = bif(model_at(step), (X, Y), (X, Y), dln_per_example_loss, config,
                     observables={"modes": mode_obs}, cache_dir=out / "bif_cache", cache_tag="dln-animals-plants")
        a, b = result.draws.observable_slices["modes"]
        strengths = result.draws.observables[..., a:b].double()
        learned = (strengths > torch.as_tensor(half, dtype=torch.float64)).double().mean((0, 1))  # per mode
        records.append({"step": step, "result": result, "learned": learned.numpy()})
    bif_q = np.stack([r["result"].observable("query_loss").double().numpy() for r in records])  # [steps, P, P]
    se_q = np.stack([r["result"].stderr[:, :P].double().numpy() for r in records])
    learned = np.stack([r["learned"] for r in records])  # [steps, modes]

    # Phase split by solution (which modes are learned), with the Gaussian null, where the
    # posterior straddles a mode's half strength (some draws on each side).
    def split(draws):
        a, b = draws.observable_slices["modes"]
        return threshold_phases(draws.observables[..., a:b], modes.target_strengths / 2)

    i, j = idx[HEADLINE[0]], idx[HEADLINE[1]]
    transitions = []
    for r in records:
        straddling = [k for k in range(len(half)) if 0.02 < r["learned"][k] < 0.98]
        if not straddling:
            continue
        pair = phase_share_with_null(r["result"].draws, split, index=(i, j), observable="query_loss",
                                     null_repeats=10 if quick else 30)
        overall = phase_share_with_null(r["result"].draws, split, observable="query_loss",
                                        null_repeats=10 if quick else 30)
        between_norm = float(np.linalg.norm(overall.between.numpy()))
        transitions.append({
            "step": r["step"], "modes": straddling, "levels": [modes.levels[k] for k in straddling],
            "learned_fraction": [float(r["learned"][k]) for k in straddling],
            "phase_weights": overall.weights.tolist(),
            "dog_sparrow_between": float(pair.between[i, j]), "dog_sparrow_total": float(pair.total[i, j]),
            "dog_sparrow_share": pair.share, "dog_sparrow_null": pair.null_share, "dog_sparrow_null_std": pair.null_std,
            "share": overall.share, "null_share": overall.null_share, "null_std": overall.null_std,
            "between_frobenius": between_norm,
        })
    # The older split (2-means of the draws' mean training loss) next to its null, at the
    # log-spaced checkpoints: it cuts any posterior in two, phases or not.
    cluster_null = {}
    for r in records:
        if r["step"] in run.checkpoints and r["step"] >= 100:
            share = phase_share_with_null(r["result"].draws, lambda d: cluster_phases(d.statistic, 2),
                                          observable="query_loss", null_repeats=10 if quick else 30)
            cluster_null[r["step"]] = {"weights": share.weights.tolist(), "share": share.share,
                                       "null_share": share.null_share, "null_std": share.null_std}
    # Is the between term largest where pi_U ~ pi_V ~ 0.5? Per mode: the step of the
    # largest between term among the steps straddling it, vs the step closest to 0.5.
    per_mode_peak = {}
    for k in range(len(half)):
        rows = [t for t in transitions if k in t["modes"]]
        if len(rows) < 2:
            continue
        peak = max(rows, key=lambda t: t["between_frobenius"])
        balanced = min(rows, key=lambda t: abs(t["learned_fraction"][t["modes"].index(k)] - 0.5))
        per_mode_peak[k] = {"level": modes.levels[k], "step_largest_between": peak["step"],
                            "step_most_balanced": balanced["step"],
                            "learned_fraction_at_largest_between": peak["learned_fraction"][peak["modes"].index(k)]}

    # BIF peaks vs branch points: most helpful (min) and most harmful (max) step of every
    # pair, against the branch of its lowest common node's level (helpful while that level
    # is learned) and of the level below it (harmful while the pair is being separated).
    pair_rows = []
    for a_name in data.items:
        for b_name in data.items:
            if a_name == b_name:
                continue
            ia, ib = idx[a_name], idx[b_name]
            level = data.lowest_common_level(ia, ib)
            values = bif_q[:, ia, ib]
            helpful, harmful = steps[int(values.argmin())], steps[int(values.argmax())]
            pair_rows.append({"pair": f"{a_name}->{b_name}", "common_level": level,
                              "step_most_helpful": helpful, "step_most_harmful": harmful,
                              "helpful_minus_branch": helpful - branch_steps[level],
                              "harmful_minus_branch": harmful - branch_steps[level + 1],
                              "min": float(values.min()), "max": float(values.max())})
    peak_distance = {}
    for level in range(data.depth):
        rows = [p for p in pair_rows if p["common_level"] == level]
        peak_distance[level] = {
            "pairs": len(rows),
            "median_helpful_minus_branch": float(np.median([p["helpful_minus_branch"] for p in rows])),
            "median_harmful_minus_branch_below": float(np.median([p["harmful_minus_branch"] for p in rows])),
            "median_abs_helpful": float(np.median([abs(p["helpful_minus_branch"]) for p in rows])),
            "median_abs_harmful": float(np.median([abs(p["harmful_minus_branch"]) for p in rows])),
        }

    # Leave-one-out by retraining (the paper's) at every checkpoint, and the cheaper local
    # continuation (50 more steps from the checkpoint with / without each item).
    retrained = retrain_leave_one_out_effects(run.model_at(0), X, Y, LR, steps)
    loo = []
    for k, step in enumerate(steps):
        if step == 0:  # nothing trained yet: every inclusion effect is 0
            continue
        row = {"step": step, "retrain_pearson": pearson(torch.from_numpy(bif_q[k]), retrained[k]),
               "retrain_spearman": spearman(torch.from_numpy(bif_q[k]), retrained[k])}
        if step in run.checkpoints and step >= 20:
            local = local_continuation_effects(model_at(step), X, Y, LR, 50)
            row["local_continuation_pearson"] = pearson(torch.from_numpy(bif_q[k]), local)
        loo.append(row)

    # Causal windows of 100 steps over [0, 1200] (retrained from the start with the item
    # removed only inside the window); BIF at each window's midpoint.
    horizon, width = 1200, 100
    windows = [(s, s + width) for s in range(0, horizon, width)]
    window_bif = torch.stack([
        bif(model_at((s + e) // 2), (X, Y), (X, Y), dln_per_example_loss, config,
            cache_dir=out / "bif_cache", cache_tag="dln-animals-plants-window").bif for s, e in windows])
    causal = {m: causal_window_effects(run.model_at(0), X, Y, LR, windows, horizon, measure_at=m)
              for m in ("window_end", "horizon")}
    causal_summary = {m: compare_windows(window_bif, c.inclusion_effect) for m, c in causal.items()}

    headline = bif_q[:, i, j]
    summary = {
        "seconds": round(time.time() - started, 1),
        "sampler": config.to_dict(),
        "items": data.items,
        "mode_levels": modes.levels,
        "mode_target_strengths": modes.target_strengths.tolist(),
        "mode_half_times": half_times,
        "hidden_branch_steps": branch_steps,
        "steps": steps,
        "dog_sparrow": {"bif": headline.tolist(), "stderr": se_q[:, i, j].tolist(),
                        "step_most_helpful": steps[int(headline.argmin())], "min": float(headline.min()),
                        "step_most_harmful": steps[int(headline.argmax())], "max": float(headline.max())},
        "pairs": {label: {"step_most_helpful": steps[int(bif_q[:, idx[a], idx[b]].argmin())],
                          "min": float(bif_q[:, idx[a], idx[b]].min()),
                          "step_most_harmful": steps[int(bif_q[:, idx[a], idx[b]].argmax())],
                          "max": float(bif_q[:, idx[a], idx[b]].max())} for label, (a, b) in PAIRS.items()},
        "peak_vs_branch_by_common_level": peak_distance,
        "every_pair": pair_rows,
        "phase_transitions": transitions,
        "between_peak_vs_balance_per_mode": per_mode_peak,
        "cluster_phases_vs_null": cluster_null,
        "leave_one_out": loo,
        "causal_windows": causal_summary,
        "checkpoint_steps": sorted(run.checkpoints),
    }
    figure = plot_hierarchy(data, modes, curve, half_times, branch_steps, model_at, steps, bif_q, se_q, learned,
                            transitions, loo, idx, windows, window_bif, causal["window_end"])
    save_figure(figure, out / "bif_hierarchical.png")
    atomic_write_json(out / "summary.json", summary)
    return summary


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """What the example prints of a :func:`hierarchy_study` summary."""
    dog = summary["dog_sparrow"]
    lines = [f"mode half-strength steps: {summary['mode_half_times']} hidden branch steps: "
             f"{summary['hidden_branch_steps']}",
             f"dog -> sparrow: most helpful at step {dog['step_most_helpful']} ({dog['min']:+.2e}), most harmful at "
             f"step {dog['step_most_harmful']} ({dog['max']:+.2e})",
             f"peaks vs branch steps by common level: {summary['peak_vs_branch_by_common_level']}"]
    for t in summary["phase_transitions"]:
        lines.append(f"step {t['step']:5d} modes {t['modes']} learned {np.round(t['learned_fraction'], 2).tolist()}: "
                     f"share {t['share']:+.2f} (null {t['null_share']:+.2f} ± {t['null_std']:.2f}); dog->sparrow "
                     f"{t['dog_sparrow_share']:+.2f} (null {t['dog_sparrow_null']:+.2f} ± "
                     f"{t['dog_sparrow_null_std']:.2f})")
    lines.append(f"between largest vs most balanced step per mode: {summary['between_peak_vs_balance_per_mode']}")
    checkpoints = set(summary["checkpoint_steps"])
    lines.append("LOO by retraining, Pearson per step: " + str(
        {r["step"]: round(r["retrain_pearson"], 2) for r in summary["leave_one_out"] if r["step"] in checkpoints}))
    lines.append(f"causal windows: {summary['causal_windows']}")
    return lines
