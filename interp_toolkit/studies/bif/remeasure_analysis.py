"""Stages 2 and 3 of the hierarchy re-measurement (:mod:`interp_toolkit.studies.bif.remeasure`):
the claims of docs/bif.md on the stored draws (:func:`analyze`), the within / between-phase
split by solution (:func:`phases`); the figures are in
:mod:`interp_toolkit.studies.bif.remeasure_plot`."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from interp_toolkit.analyses.bif import CoMoments, Draws, estimate_from_moments
from interp_toolkit.analyses.bif.diagnostics import (
    between_chain_share,
    ess_bulk,
    ess_tail,
    split_rhat,
)
from interp_toolkit.analyses.bif.validation import causal_window_effects
from interp_toolkit.io import atomic_write_json, atomic_write_text
from interp_toolkit.plotting import save_figure
from interp_toolkit.studies.bif.hierarchy import hidden_branch_steps
from interp_toolkit.studies.bif.remeasure import HORIZON, STEPS, WINDOW, load_draws
from interp_toolkit.studies.bif.remeasure_plot import PAIRS, diag_figure, plot
from interp_toolkit.tasks.dln import DeepLinearNetwork, DLNConfig, gradient_descent, mode_strengths
from interp_toolkit.tasks.hierarchical import animals_and_plants, svd_modes

__all__ = ["NULL_REPEATS", "analyze", "phases", "report", "timeline"]

NULL_REPEATS = 2000


def timeline(data, init: int, lr: float, steps: int = 2000) -> dict:
    """Mode half-strength steps and hidden-representation branch steps of one initialization."""

    modes = svd_modes(data)
    model = DeepLinearNetwork(DLNConfig(data.n_items, 16, data.n_properties, init_scale=1e-3, seed=init))
    curve = [mode_strengths(model, modes)]
    hidden = [model.W1.weight.detach().T.clone()]

    def record(step: int, m: DeepLinearNetwork) -> None:
        curve.append(mode_strengths(m, modes))
        hidden.append(m.W1.weight.detach().T.clone())

    gradient_descent(model, data.inputs, data.targets, lr, steps, on_step=record)
    curve_np = torch.stack(curve).numpy()
    half = modes.target_strengths.numpy() / 2
    half_times = [int(np.nonzero(curve_np[:, k] >= half[k])[0][0]) for k in range(len(half))]
    branch, _ = hidden_branch_steps(hidden, data)
    return {"mode_half_steps": half_times, "mode_levels": modes.levels, "branch_steps": branch}


def _offsets_summary(helpful: list[int], harmful: list[int], against: str) -> dict[str, Any]:
    """Median and interquartile range of the pairs' most helpful steps minus ``against`` (the
    branch or mode transition of their common level) and most harmful steps minus the one
    below."""
    def iqr(values: list[int]) -> list[float]:
        return [float(np.percentile(values, 25)), float(np.percentile(values, 75))]

    return {f"median_helpful_minus_{against}": float(np.median(helpful)), "iqr_helpful": iqr(helpful),
            f"median_harmful_minus_{against}_below": float(np.median(harmful)), "iqr_harmful": iqr(harmful),
            "n": len(helpful)}


def analyze(out: Path, docs: Path, seeds: tuple[int, ...]) -> None:

    from interp_toolkit.studies.common.statistics import combined_p

    docs.mkdir(parents=True, exist_ok=True)
    data = animals_and_plants()
    idx = {name: data.item_index(name) for name in data.items}
    losses, distance, meta = load_draws(out, seeds)  # [S, C, D, R, P], [S, C, D, R]
    S, C, D, R, P = losses.shape
    labels = [tuple(x) for x in meta["labels"]]
    INITS = sorted({init for init, _ in labels})  # noqa: N806 - the initializations the draws hold
    lr = meta["lr"]
    config = meta["sampler"]
    rows, per_replica = [], {}
    for r, (init, step) in enumerate(labels):
        a = losses[:, :, :, r, :].double()  # [S, C, D, P]
        # the library's estimator (pooled -Cov, jackknife and per-chain errors) without the
        # 8 x 8 entries' diagnostics: those of the three pairs are computed below
        chains_draws = a.reshape(S * C, D, P)
        pooled = estimate_from_moments({(c, 0): CoMoments.from_batch(chains_draws[c], chains_draws[c])
                                        for c in range(S * C)}, S * C, False, False)
        share = between_chain_share(pooled.bif, pooled.per_chain)
        centred = a - a.mean((1, 2), keepdim=True)  # each seed's 4 chains pooled
        per_seed = -torch.einsum("scdi,scdj->sij", centred, centred) / (C * D)  # [S, P, P]
        per_replica[(init, step)] = {"pooled": pooled, "per_seed": per_seed}
        dist = distance[:, :, :, r].double().reshape(S * C, D).numpy()
        for name, (x, y) in PAIRS.items():
            i, j = idx[x], idx[y]
            centred = a.reshape(S * C, D, P) - a.reshape(-1, P).mean(0)
            product = (centred[..., i] * centred[..., j]).numpy()
            rows.append({
                "init": init, "step": step, "pair": name, "bif": float(pooled.bif[i, j]),
                "stderr_jackknife": float(pooled.stderr[i, j]),
                "stderr_per_chain": float(pooled.per_chain_stderr[i, j]),
                "per_seed": [float(v) for v in per_seed[:, i, j]],
                "rhat": split_rhat(product), "ess_bulk": ess_bulk(product), "ess_tail": ess_tail(product),
                "between_chain_share": float(share[i, j]),
                "distance_rhat": split_rhat(dist),
            })
    # per step and pair, over inits and seeds: the mean, and an error from the spread of the
    # S x inits per-seed estimates (it holds between-seed and between-init variation)
    table = []
    for step in STEPS:
        for name in PAIRS:
            sel = [x for x in rows if x["step"] == step and x["pair"] == name]
            seed_values = np.array([v for x in sel for v in x["per_seed"]])
            by_init = np.array([x["bif"] for x in sel])
            mean = float(seed_values.mean())
            se = float(seed_values.std(ddof=1) / np.sqrt(seed_values.size))
            signs = {int(np.sign(v)) for v in by_init}
            table.append({
                "step": step, "pair": name, "mean_bif": mean, "stderr_seeds_inits": se,
                "bif_init": [float(v) for v in by_init],
                "stderr_jackknife_init": [x["stderr_jackknife"] for x in sel],
                "stderr_per_chain_init": [x["stderr_per_chain"] for x in sel],
                "max_rhat": max(x["rhat"] for x in sel), "min_ess_bulk": min(x["ess_bulk"] for x in sel),
                "min_ess_tail": min(x["ess_tail"] for x in sel),
                "between_chain_share_init": [x["between_chain_share"] for x in sel],
                "z": mean / se if se > 0 else float("nan"),
                "sign": ("harmful (+)" if mean > 2 * se and signs == {1} else
                         "helpful (-)" if mean < -2 * se and signs == {-1} else "not resolved"),
            })
    buffer = io.StringIO()
    fields = ["step", "pair", "mean_bif", "stderr_seeds_inits", "z", "sign", "max_rhat", "min_ess_bulk",
              "min_ess_tail", "bif_init", "stderr_jackknife_init", "stderr_per_chain_init", "between_chain_share_init"]
    writer = csv.DictWriter(buffer, fieldnames=fields)
    writer.writeheader()
    for row in table:
        writer.writerow({k: (f"{row[k]:.4g}" if isinstance(row[k], float) else
                             " ".join(f"{v:.3g}" for v in row[k]) if isinstance(row[k], list) else row[k])
                         for k in fields})
    atomic_write_text(docs / "remeasure_pairs.csv", buffer.getvalue())

    # timelines (half-strength and branch steps) per init
    timelines = {init: timeline(data, init, lr) for init in INITS}

    # branch-point claim: per (init, seed), the grid step where dog->sparrow is most harmful /
    # most helpful, and the same for every pair, against its init's branch steps
    i, j = idx["dog"], idx["sparrow"]
    grid = [s for s in STEPS if s >= 100]
    peaks = []
    for init in INITS:
        for s in range(S):
            values = np.array([float(per_replica[(init, st)]["per_seed"][s, i, j]) for st in grid])
            peaks.append({"init": init, "seed": seeds[s], "most_harmful_step": grid[int(values.argmax())],
                          "most_helpful_step": grid[int(values.argmin())], "max": float(values.max()),
                          "min": float(values.min())})
    def peak_steps(init: int, s: int, level: int) -> list[tuple[int, int]]:
        """(most helpful, most harmful) step of every ordered pair whose lowest common node is at
        ``level``, in replica ``init`` and sampler seed ``s``."""
        out = []
        for a_name in data.items:
            for b_name in data.items:
                ia, ib = idx[a_name], idx[b_name]
                if a_name == b_name or data.lowest_common_level(ia, ib) != level:
                    continue
                values = np.array([float(per_replica[(init, st)]["per_seed"][s, ia, ib]) for st in grid])
                out.append((grid[int(values.argmin())], grid[int(values.argmax())]))
        return out

    level_peaks = {}
    for level in range(data.depth):
        offsets_help, offsets_harm = [], []
        for init in INITS:
            branch = timelines[init]["branch_steps"]
            for s in range(S):
                for helpful, harmful in peak_steps(init, s, level):
                    offsets_help.append(helpful - branch[level])
                    offsets_harm.append(harmful - branch[level + 1])
        level_peaks[level] = _offsets_summary(offsets_help, offsets_harm, "branch")

    # the same against the network's own singular-mode transitions: the half-strength step of
    # the modes of a level (median over them), per initialization
    mode_peaks = {}
    for level in range(data.depth):
        offsets_help, offsets_harm = [], []
        for init in INITS:
            half = np.array(timelines[init]["mode_half_steps"], dtype=float)
            levels = np.array(timelines[init]["mode_levels"])
            if not (levels == level).any() or not (levels == level + 1).any():
                continue
            here, below = float(np.median(half[levels == level])), float(np.median(half[levels == level + 1]))
            for s in range(S):
                for helpful, harmful in peak_steps(init, s, level):
                    offsets_help.append(helpful - here)
                    offsets_harm.append(harmful - below)
        if offsets_help:
            mode_peaks[level] = _offsets_summary(offsets_help, offsets_harm, "transition")

    # causal windows vs a pair-permuted null, per init and seed
    windows = [(s0, s0 + WINDOW) for s0 in range(0, HORIZON, WINDOW)]
    gen = np.random.default_rng(0)
    causal = []
    for init in INITS:
        model = DeepLinearNetwork(DLNConfig(data.n_items, 16, data.n_properties, init_scale=1e-3, seed=init))
        effect = causal_window_effects(model, data.inputs, data.targets, lr, windows, HORIZON,
                                       measure_at="window_end").inclusion_effect.numpy()  # [W, P, P]
        for s in [*range(S), None]:
            bifs = np.stack([(per_replica[(init, (a + b) // 2)]["pooled"].bif if s is None else
                              per_replica[(init, (a + b) // 2)]["per_seed"][s]).numpy() for a, b in windows])
            # the paper-style comparison over all windows, and a variant without the first
            # window (steps 0-100, where removing an item changes nothing yet)
            for first in (0, 1):
                peak_effect = np.abs(effect[first:]).reshape(len(windows) - first, -1).argmax(0)
                peak_bif = np.abs(bifs[first:]).reshape(len(windows) - first, -1).argmax(0)
                agreement = float((peak_bif == peak_effect).mean())
                null = np.array([(peak_bif[gen.permutation(peak_bif.size)] == peak_effect).mean()
                                 for _ in range(NULL_REPEATS)])
                causal.append({"init": init, "seed": "all" if s is None else seeds[s],
                               "windows": "all" if first == 0 else "without 0-100", "agreement": agreement,
                               "null_mean": float(null.mean()), "null_p95": float(np.percentile(null, 95)),
                               "p_value": float((np.sum(null >= agreement) + 1) / (null.size + 1)),
                               "peak_window_counts_bif": np.bincount(peak_bif, minlength=len(windows) - first).tolist(),
                               "peak_window_counts_effect": np.bincount(peak_effect,
                                                                        minlength=len(windows) - first).tolist()})

    # one p over the initializations (independent networks): Fisher's method on each one's
    # pooled-over-seeds permutation p
    combined: dict[str, dict[str, Any]] = {}
    for variant in ("all", "without 0-100"):
        p_values = [c["p_value"] for c in causal if c["seed"] == "all" and c["windows"] == variant]
        combined[variant] = {"p_values": p_values, "combined_p": combined_p(p_values)}
    summary = {"sampler": config, "seeds": list(seeds), "inits": list(INITS), "steps": list(STEPS),
               "causal_combined": combined,
               "chains_total": S * C, "draws_per_chain": D, "timelines": timelines, "pairs": table,
               "dog_sparrow_peaks": peaks, "peak_vs_branch_by_common_level": level_peaks,
               "peak_vs_mode_transition_by_common_level": mode_peaks, "causal_windows": causal,
               "replica_convergence": [{k: v for k, v in x.items() if k != "per_seed"} for x in rows]}
    atomic_write_json(docs / "remeasure_summary.json", summary)
    save_figure(plot(table, timelines, causal, config), docs / "remeasure.png")
    diag_figure(out, meta, labels, docs)
    report(table, peaks, level_peaks, causal, timelines)
    print("peak vs mode transition by common level:", mode_peaks)
    for variant, entry in combined.items():
        print(f"causal windows ({variant}) over {len(entry['p_values'])} inits: Fisher combined p "
              f"{entry['combined_p']:.4f}")


def phases(out: Path, docs: Path, seeds: tuple[int, ...], null_repeats: int = 20,
           straddle: tuple[float, float] = (0.1, 0.9)) -> None:
    """Within- and between-phase BIF where the draws straddle a mode's half strength, against
    the Gaussian null; writes ``docs/phases.csv`` and ``docs/phases.json``."""
    from interp_toolkit.analyses.bif import phase_share_with_null, threshold_phases
    from interp_toolkit.io import load_artifact

    data = animals_and_plants()
    modes = svd_modes(data)
    half = (modes.target_strengths / 2).double()
    idx = {name: data.item_index(name) for name in data.items}
    loaded = [load_artifact(out / f"draws_seed{seed}.safetensors", kind="bif_remeasure_draws") for seed in seeds]
    if any("observables" not in tensors for tensors, _ in loaded):
        raise SystemExit(f"{out}: the draws hold no mode strengths (sample them again with this version)")
    labels = [tuple(x) for x in loaded[0][1]["labels"]]
    losses = torch.cat([tensors["losses"] for tensors, _ in loaded]).double()  # [S*C, D, R, P]
    strengths = torch.cat([tensors["observables"] for tensors, _ in loaded]).double()  # [S*C, D, R, K]
    P = losses.shape[-1]
    rows = []
    for r, (init, step) in enumerate(labels):
        learned = (strengths[:, :, r, :] > half).double().mean((0, 1))  # fraction of draws per mode
        for k in range(len(modes.S)):
            if not straddle[0] < float(learned[k]) < straddle[1]:
                continue
            draws = Draws(losses[:, :, r, :], torch.cat([losses[:, :, r, :], strengths[:, :, r, k:k + 1]], -1),
                          {"loss": (0, P), "mode": (P, P + 1)})

            def split(d: Draws, k_half: float = float(half[k])) -> torch.Tensor:
                return threshold_phases(d.observables[..., P:P + 1], k_half)

            for pair, (a, b) in (("all entries", (None, None)), ("dog->sparrow", PAIRS["dog->sparrow"])):
                index = None if a is None or b is None else (idx[a], idx[b])
                share = phase_share_with_null(draws, split, index=index, null_repeats=null_repeats, seed=step,
                                              observable="loss")
                z = ((share.share - share.null_share) / share.null_std
                     if share.null_std and math.isfinite(share.null_std) and share.null_std > 0 else float("nan"))
                entry = (slice(None), slice(None)) if index is None else index
                rows.append({"init": init, "step": step, "mode": k, "mode_level": modes.levels[k],
                             "fraction_learned": float(learned[k]), "entry": pair,
                             # covariance units; for all entries, the sums of squares' roots
                             "between": float(share.between[entry].double().norm()) if index is None
                             else float(share.between[entry]),
                             "total": float(share.total[entry].double().norm()) if index is None
                             else float(share.total[entry]), "share": share.share,
                             "null_share": share.null_share, "null_std": share.null_std, "z": z})
    atomic_write_json(docs / "phases.json", {"null_repeats": null_repeats, "straddle": list(straddle), "rows": rows})
    fields = ["init", "step", "mode", "mode_level", "fraction_learned", "entry", "between", "total", "share",
              "null_share", "null_std", "z"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields)
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (f"{row[k]:.4g}" if isinstance(row[k], float) else row[k]) for k in fields})
    atomic_write_text(docs / "phases.csv", buffer.getvalue())
    for row in rows:
        if row["entry"] in ("all entries", "dog->sparrow"):
            print(f"init {row['init']} step {row['step']:4d} mode {row['mode']} (level {row['mode_level']}, "
                  f"{row['fraction_learned']:.2f} learned) {row['entry']:12s}: between share {row['share']:+.3f}, "
                  f"null {row['null_share']:+.3f} ± {row['null_std']:.3f} (z {row['z']:+.1f})")


def report(table, peaks, level_peaks, causal, timelines) -> None:
    print("timelines:", timelines)
    for t in table:
        print(f"step {t['step']:5d} {t['pair']:13s} {t['mean_bif']:+.2e} ± {t['stderr_seeds_inits']:.1e} "
              f"(z {t['z']:+.1f}) {t['sign']:13s} per init {['%+.1e' % v for v in t['bif_init']]} "
              f"jackknife {['%.1e' % v for v in t['stderr_jackknife_init']]} "
              f"R-hat {t['max_rhat']:.3f} ESS {t['min_ess_bulk']:.0f}/{t['min_ess_tail']:.0f}")
    print(
        "dog->sparrow peaks per (init, seed):",
        [(p["init"], p["seed"], p["most_helpful_step"], p["most_harmful_step"]) for p in peaks],
    )
    print("peak vs branch by common level:", level_peaks)
    for c in causal:
        print(f"causal windows ({c['windows']}) init {c['init']} seed {c['seed']}: agreement {c['agreement']:.2f}, "
              f"null {c['null_mean']:.2f} (95th pct {c['null_p95']:.2f}), p {c['p_value']:.4f}")
