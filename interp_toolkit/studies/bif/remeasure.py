"""The hierarchy-toy BIF story re-measured with long chains, several sampler seeds and
several DLN initializations, with convergence diagnostics and controls (docs/bif.md).

Stage 1 (``sample``, resumable per sampler seed): for every DLN initialization and every
step of a grid, the DLN is trained by full-batch GD to that step, and every such network is
sampled by SGLD for all networks and chains at once with the package's batched DLN sampler
(:func:`interp_toolkit.analyses.bif.dln_fast.batched_dln_sgld`: the chains, update and noise of
:func:`interp_toolkit.analyses.bif.sample_sgld`, ``w <- w - eps/2 (n_beta grad L(w) + gamma
(w - w*)) + N(0, eps)``, full batch, all chains started at ``w*``, with the closed-form DLN
gradient; tested against the library's sampler), ~0.8 ms per step for 126 networks x 4 chains
on one core. The per-example losses at every draw, each chain's
loss trace and distance from ``w*`` are written to ``OUT/draws_seed<S>.safetensors``.

Stage 2 (``analyze``, :mod:`interp_toolkit.studies.bif.remeasure_analysis`): per replica
the BIF (pooled over every chain of every seed), its leave-one-chain-out jackknife error, the
between-seed spread, split R-hat / bulk and tail ESS of every entry
(:mod:`interp_toolkit.analyses.bif.diagnostics`), and the claims of docs/bif.md (dog on
sparrow over training, dog on oak / dog on cat as controls, the branch-point claim, causal
windows against a pair-permuted null). Writes small CSV / JSON / PNG files to ``--docs``
(committed) and prints every number.

    # the step-size ladder (docs/bif.md): one rung; the others are eps 8e-4 / 4e-4 / 1e-4 with
    # burn-in 2000 / 4000 / 16000 and draws 4 / 8 / 32 steps apart (chains of 8 / eps steps)
    nice -n 19 python examples/bif_hierarchy_remeasure.py sample --out runs/bif_ladder/eps1.6e-3 --eps 1.6e-3 \
        --burn-in 1000 --draws 2000 --steps-between-draws 2
    python examples/bif_hierarchy_remeasure.py analyze --out runs/bif_ladder/eps1.6e-3 --docs docs/bif/ladder/eps1.6e-3
    python examples/bif_hierarchy_remeasure.py calibrate --docs docs/bif
    # within / between:
    python examples/bif_hierarchy_remeasure.py phases --out runs/bif_ladder/eps1.6e-3 --docs docs/bif/ladder/eps1.6e-3

Stage 3 (``phases``, the same module): at every checkpoint whose draws straddle a mode's
half strength, each draw is labelled by solution (that mode learned or not, from the map's
strength on it, recorded at every draw) and the BIF split into within- and between-phase
terms (law of total covariance), the between-phase share next to its Gaussian null (the same
split applied to Gaussian draws with the draws' mean and covariance:
:func:`interp_toolkit.analyses.bif.phase_share_with_null`).

``examples/bif_hierarchy_remeasure.py`` is the command line of the three stages.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from interp_toolkit.analyses.bif import SamplerConfig
from interp_toolkit.analyses.bif.dln_fast import batched_dln_sgld
from interp_toolkit.io import load_artifact, save_artifact
from interp_toolkit.studies.bif.hierarchy import LR
from interp_toolkit.tasks.dln import (
    DeepLinearNetwork,
    DLNConfig,
    dln_per_example_loss,
    gradient_descent,
)
from interp_toolkit.tasks.hierarchical import animals_and_plants, svd_modes

__all__ = ["HORIZON", "INITS", "LOCALITY_CSV", "NETWORK_SEED_STRIDE", "SEEDS", "STEPS", "WINDOW",
           "calibrate", "load_draws", "locality", "replicas", "sample", "sampler_config"]

#: Each rung's locality table (docs/bif/ladder/eps*/locality.csv), read by the verdict engine.
LOCALITY_CSV = "locality.csv"

INITS = (0, 1, 2, 3, 4, 5)
SEEDS = (0, 1, 2)
WINDOW = 100
#: network r of sampler seed S is sampled with the library's seed NETWORK_SEED_STRIDE * S + r
NETWORK_SEED_STRIDE = 10_000
HORIZON = 1200
#: the causal windows' midpoints, and the steps docs/bif.md quoted (214: most helpful,
#: 384: most harmful, 556 / 800: sign flips between seeds), plus late steps
STEPS = tuple(sorted({*(s + WINDOW // 2 for s in range(0, HORIZON, WINDOW)), 214, 269, 334, 384, 556, 800,
                      1022, 1500, 2000}))


def sampler_config(seed: int, eps: float, burn_in: int = 1000, draws: int = 2000, every: int = 5) -> SamplerConfig:
    """The doc's posterior (gamma 100, n_beta 400); by default chains 11 localization times
    long (``2 / (eps gamma) = 1,000`` steps at the doc's eps; the doc's chains were 500 steps)."""
    return SamplerConfig(eps=eps, gamma=100.0, n_beta=400.0, chains=4, draws=draws, burn_in=burn_in,
                         steps_between_draws=every, seed=seed, keep_draws=True, progress=False)


def replicas(data: Any, inits: tuple[int, ...] = INITS,
             steps: tuple[int, ...] = STEPS) -> tuple[Tensor, Tensor, list[tuple[int, int]]]:
    """Weights of every (init, step) replica: GD from each init, captured at every step.

    Returns:
        ``W1 [R, hidden, items]``, ``W2 [R, properties, hidden]`` and the ``R`` labels
        ``(init, step)``, init-major (``R = len(inits) * len(steps)``).
    """
    W1s, W2s, labels = [], [], []
    for init in inits:
        model = DeepLinearNetwork(DLNConfig(data.n_items, 16, data.n_properties, init_scale=1e-3, seed=init))
        wanted = set(steps)
        captured = {}
        if 0 in wanted:
            captured[0] = (model.W1.weight.detach().clone(), model.W2.weight.detach().clone())

        def keep(step: int, m: DeepLinearNetwork, wanted=wanted, captured=captured) -> None:
            if step in wanted:
                captured[step] = (m.W1.weight.detach().clone(), m.W2.weight.detach().clone())

        gradient_descent(model, data.inputs, data.targets, LR, max(steps), on_step=keep)
        for step in steps:
            W1s.append(captured[step][0])
            W2s.append(captured[step][1])
            labels.append((init, step))
    return torch.stack(W1s), torch.stack(W2s), labels


def sample(out: Path, eps: float, seeds: tuple[int, ...] = SEEDS, burn_in: int = 1000, draws: int = 2000,
           every: int = 5, inits: tuple[int, ...] = INITS) -> None:
    """Stage 1: SGLD draws of every (init, step) replica, one resumable file per sampler seed
    (``OUT/draws_seed<S>.safetensors``; an existing file is skipped)."""
    torch.set_num_threads(1)
    data = animals_and_plants()
    X, Y = data.inputs.float(), data.targets.float()
    W1, W2, labels = replicas(data, inits=inits)
    modes = svd_modes(data)
    U, V = modes.U.float(), modes.V.float()

    def strengths(W1c: torch.Tensor, W2c: torch.Tensor) -> torch.Tensor:
        """Each draw's map on every data mode, u_k^T W2 W1 v_k (for phase labels by solution)."""
        return torch.einsum("ok,cnoi,ik->cnk", U, W2c @ W1c, V)

    for seed in seeds:
        path = out / f"draws_seed{seed}.safetensors"
        if path.exists():
            print(f"seed {seed}: {path} exists, skipped")
            continue
        started = time.time()
        config = sampler_config(seed, eps, burn_in, draws, every)
        # a sampler seed per network, so that the networks' chains are independent replicates
        network_seeds = [NETWORK_SEED_STRIDE * seed + r for r in range(W1.shape[0])]
        tensors = batched_dln_sgld(W1, W2, X, Y, config, trace_every=10, seeds=network_seeds,
                                   observable=strengths)
        save_artifact(path, tensors, {"labels": labels, "sampler": config.to_dict(), "lr": LR, "items": data.items,
                                      "network_seeds": network_seeds,
                                      "seconds": time.time() - started, "trace_every": 10}, kind="bif_remeasure_draws")
        print(f"seed {seed}: {W1.shape[0]} networks x {config.chains} chains x {config.total_steps} steps in "
              f"{time.time() - started:.0f} s -> {path}", flush=True)


def calibrate(docs: Path, step: int = 384, init: int = 0) -> None:
    """The library's calibration sweep (:func:`calibrate_sampler`, i.e. :func:`bif` itself) on
    the DLN at ``step``: eps x gamma at the doc's n_beta, short chains; writes
    ``docs/calibration_step<step>.json`` / ``.png``."""
    from interp_toolkit.analyses.bif import calibrate_sampler, plot_calibration
    from interp_toolkit.io import atomic_write_json
    from interp_toolkit.plotting import save_figure

    torch.set_num_threads(1)
    data = animals_and_plants()
    X, Y = data.inputs, data.targets
    model = DeepLinearNetwork(DLNConfig(data.n_items, 16, data.n_properties, init_scale=1e-3, seed=init))
    gradient_descent(model, X, Y, LR, step)
    base = SamplerConfig(eps=2e-5, gamma=100.0, n_beta=400.0, chains=4, draws=200, burn_in=200,
                         steps_between_draws=3, progress=False)
    started = time.time()
    calibration = calibrate_sampler(model, (X, Y), (X, Y), dln_per_example_loss, base,
                                    eps=[2e-5, 1e-4, 4e-4, 1.6e-3], gamma=[100.0])
    atomic_write_json(docs / f"calibration_step{step}.json",
                      {"step": step, "init": init, "seconds": time.time() - started, **calibration.to_dict()})
    save_figure(plot_calibration(calibration), docs / f"calibration_step{step}.png")
    print(calibration.reason)
    for row in calibration.rows:
        print(row.eps, row.gamma, "diverged" if row.diverged else
              f"R-hat {row.max_rhat:.3f} ESS {row.min_ess_bulk:.0f}/{row.min_ess_tail:.0f} "
              f"ESS/1000 steps {row.ess_per_1000_steps:.2f} loss drift {row.loss_drift:.3g}")


def locality(docs: Path, seed: int = 0, inits: tuple[int, ...] = INITS) -> list[dict[str, Any]]:
    """The locality gate (:mod:`interp_toolkit.analyses.bif.locality`) of one rung of the toy's
    step-size ladder (``docs`` = ``docs/bif/ladder/eps*``), re-measured: every (init, step)
    replica sampled with the rung's own settings (its ``remeasure_summary.json``'s sampler: eps,
    gamma, n_beta, chains, burn-in, draws and thinning) at one sampler seed, its draws' mean loss
    against the checkpoint's and the zero map's (the network that predicts nothing: the DLN's
    "solution gone"), and the distance against sqrt(d / gamma). Writes ``docs/locality.csv``
    (one row per replica) and returns it."""
    import csv
    import io
    import json

    from interp_toolkit.analyses.bif.locality import measure_locality
    from interp_toolkit.io import atomic_write_text

    torch.set_num_threads(1)
    summary = docs / "remeasure_summary.json"
    if not summary.is_file():
        raise FileNotFoundError(f"{summary} does not exist: expected a rung of the ladder (docs/bif/ladder/eps*)")
    stored = json.loads(summary.read_text())["sampler"]
    config = SamplerConfig.from_dict({**stored, "seed": seed, "keep_draws": False, "progress": False})
    eps = config.eps
    data = animals_and_plants()
    X, Y = data.inputs.float(), data.targets.float()
    W1, W2, labels = replicas(data, inits=inits)
    network_seeds = [NETWORK_SEED_STRIDE * seed + r for r in range(W1.shape[0])]
    started = time.time()
    tensors = batched_dln_sgld(W1, W2, X, Y, config, trace_every=1000, seeds=network_seeds)
    seconds = time.time() - started
    reference = float((0.5 * Y.pow(2).sum(-1)).mean())  # the zero map's loss
    checkpoint = (0.5 * (X @ (W2 @ W1).transpose(-1, -2) - Y).pow(2).sum(-1)).mean(-1)  # [networks]
    d = W1[0].numel() + W2[0].numel()
    rows = []
    for r, (init, step) in enumerate(labels):
        found = measure_locality(tensors["losses"][:, :, r].double().mean(-1), tensors["distance"][:, :, r],
                                 checkpoint_loss=float(checkpoint[r]), reference_loss=reference,
                                 reference="zero map's loss", n_parameters=d, gamma=config.gamma)
        rows.append({"eps": eps, "init": init, "step": step, "checkpoint_loss": float(checkpoint[r]),
                     "reference_loss": reference, "mean_draw_loss": sum(found.draw_loss) / len(found.draw_loss),
                     "worst_climb": found.worst_climb, "mean_distance": sum(found.distance) / len(found.distance),
                     "prior_radius": found.prior_radius, "local": found.local})
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()} for row in rows)
    atomic_write_text(docs / LOCALITY_CSV, buffer.getvalue())
    local, worst = sum(row["local"] for row in rows), max(row["worst_climb"] for row in rows)
    print(f"eps {eps:g}: {local}/{len(rows)} replicas local (worst climb {worst:.1%});"
          f" {W1.shape[0]} networks x {config.chains} chains x {config.total_steps} steps in {seconds:.0f} s "
          f"-> {docs / LOCALITY_CSV}", flush=True)
    return rows


def load_draws(out: Path, seeds: tuple[int, ...] = SEEDS) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """``losses [seeds, chains, draws, R, P]``, ``distance [seeds, chains, draws, R]``, metadata."""
    losses, distance = [], []
    meta: dict[str, Any] = {}
    for seed in seeds:
        tensors, meta = load_artifact(out / f"draws_seed{seed}.safetensors", kind="bif_remeasure_draws")
        losses.append(tensors["losses"])
        distance.append(tensors["distance"])
        meta = {**meta, "loss_trace_seed0": meta.get("loss_trace_seed0", tensors["loss_trace"]),
                "distance_trace_seed0": meta.get("distance_trace_seed0", tensors["distance_trace"])}
    return torch.stack(losses), torch.stack(distance), meta
