"""The hierarchy-toy BIF story re-measured with long chains, several sampler seeds and
several DLN initializations, with convergence diagnostics and controls (docs/bif.md).

Stage 1 (``sample``, resumable per sampler seed): for every DLN initialization and every
step of a grid, the DLN is trained by full-batch GD to that step, and every such network is
sampled by SGLD with the library's update rule and settings
(:func:`interp_toolkit.analyses.bif.sample_sgld`: ``w <- w - eps/2 (n_beta grad L(w) + gamma
(w - w*)) + N(0, eps)``, full batch, all chains started at ``w*``), for all networks and
chains at once with the closed-form DLN gradient (checked against autograd at start). The
library's :func:`~interp_toolkit.analyses.bif.bif` runs the same chains ~30x slower here (its
per-step autograd and bookkeeping on a 376-parameter model), which the shared 2-core machine
could not afford at these chain lengths. The per-example losses at every draw, each chain's
loss trace and distance from ``w*`` are written to ``OUT/draws_seed<S>.safetensors``.

Stage 2 (``analyze``): per replica the BIF (pooled over every chain of every seed), its
leave-one-chain-out jackknife error, the between-seed spread, split R-hat / bulk and tail
ESS of every entry (:mod:`interp_toolkit.analyses.bif.diagnostics`), and the claims of
docs/bif.md (dog on sparrow over training, dog on oak / dog on cat as controls, the
branch-point claim, causal windows against a pair-permuted null). Writes small CSV / JSON /
PNG files to ``--docs`` (committed) and prints every number.

    nice -n 19 python examples/bif_hierarchy_remeasure.py sample --out runs/bif_remeasure
    nice -n 19 python examples/bif_hierarchy_remeasure.py calibrate --docs docs/bif
    # the calibrated step size (80x the doc's; same posterior), 4,500-step chains:
    nice -n 19 python examples/bif_hierarchy_remeasure.py sample --out runs/bif_remeasure_eps1.6e-3 \
        --eps 1.6e-3 --burn-in 500 --draws 2000 --steps-between-draws 2
    python examples/bif_hierarchy_remeasure.py analyze --out runs/bif_remeasure_eps1.6e-3 --docs docs/bif/eps1.6e-3
    python examples/bif_hierarchy_remeasure.py analyze --out runs/bif_remeasure --docs docs/bif
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from torch import Tensor

from interp_toolkit.analyses.bif import SamplerConfig
from interp_toolkit.io import load_artifact, save_artifact
from interp_toolkit.tasks.dln import (
    DeepLinearNetwork,
    DLNConfig,
    dln_per_example_loss,
    gradient_descent,
)
from interp_toolkit.tasks.hierarchical import animals_and_plants

LR = 0.05
INITS = (0, 1, 2)
SEEDS = (0, 1, 2)
WINDOW = 100
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


def closed_form_gradients(W1: Tensor, W2: Tensor, X: Tensor, Y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-example losses ``[..., P]`` and the gradients of ``L = mean_p loss_p`` for stacked DLNs."""
    M = W2 @ W1  # [..., out, in]
    error = X @ M.transpose(-1, -2) - Y  # [..., P, out]
    losses = 0.5 * error.pow(2).sum(-1)
    grad_M = error.transpose(-1, -2) @ X / X.shape[0]  # dL/dM [..., out, in]
    return losses, grad_M @ W1.transpose(-1, -2), W2.transpose(-1, -2) @ grad_M


def check_gradients(W1: Tensor, W2: Tensor, X: Tensor, Y: Tensor) -> None:
    """The closed form equals autograd on :class:`DeepLinearNetwork` (the library's model)."""
    model = DeepLinearNetwork(DLNConfig(X.shape[1], W1.shape[-2], Y.shape[1]))
    with torch.no_grad():
        model.W1.weight.copy_(W1[0])
        model.W2.weight.copy_(W2[0])
    dln_per_example_loss(model, (X, Y)).mean().backward()
    losses, g2, g1 = closed_form_gradients(W1[:1], W2[:1], X, Y)
    torch.testing.assert_close(g1[0], model.W1.weight.grad)
    torch.testing.assert_close(g2[0], model.W2.weight.grad)
    torch.testing.assert_close(losses[0], dln_per_example_loss(model, (X, Y)).detach())


def sgld_chains(W1_star: Tensor, W2_star: Tensor, X: Tensor, Y: Tensor, config: SamplerConfig) -> dict[str, Tensor]:
    """SGLD (the library's update, full batch) of every network x chain at once."""
    gen = torch.Generator().manual_seed(1_000_003 * config.seed + 12_345)
    shape = (config.chains, *W1_star.shape[:1])
    W1c = W1_star.expand(*shape, *W1_star.shape[1:]).clone()
    W2c = W2_star.expand(*shape, *W2_star.shape[1:]).clone()
    half, root = config.eps / 2, math.sqrt(config.eps)
    steps = config.total_steps
    losses = torch.empty(config.chains, config.draws, *W1_star.shape[:1], X.shape[0])
    distance = torch.empty(config.chains, config.draws, W1_star.shape[0])
    loss_trace = torch.empty(config.chains, steps, W1_star.shape[0])
    distance_trace = torch.empty(config.chains, steps, W1_star.shape[0])
    draw = 0
    for step in range(steps):
        per_example, g2, g1 = closed_form_gradients(W1c, W2c, X, Y)
        d1, d2 = W1c - W1_star, W2c - W2_star
        loss_trace[:, step] = per_example.mean(-1)
        distance_trace[:, step] = (d1.pow(2).sum((-1, -2)) + d2.pow(2).sum((-1, -2))).sqrt()
        W1c += -half * (config.n_beta * g1 + config.gamma * d1) + root * torch.randn(W1c.shape, generator=gen)
        W2c += -half * (config.n_beta * g2 + config.gamma * d2) + root * torch.randn(W2c.shape, generator=gen)
        if step >= config.burn_in and (step - config.burn_in + 1) % config.steps_between_draws == 0:
            M = W2c @ W1c
            losses[:, draw] = 0.5 * (X @ M.transpose(-1, -2) - Y).pow(2).sum(-1)
            distance[:, draw] = ((W1c - W1_star).pow(2).sum((-1, -2)) + (W2c - W2_star).pow(2).sum((-1, -2))).sqrt()
            draw += 1
    if not torch.isfinite(losses).all():
        raise FloatingPointError(f"SGLD diverged at eps {config.eps}: lower eps")
    # the per-step traces are thinned to every 10th step (the figure's resolution)
    return {"losses": losses, "distance": distance, "loss_trace": loss_trace[:, ::10].contiguous(),
            "distance_trace": distance_trace[:, ::10].contiguous()}


def replicas(data, inits=INITS, steps=STEPS) -> tuple[Tensor, Tensor, list[tuple[int, int]]]:
    """Weights of every (init, step) replica: GD from each init, captured at every step."""
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


def sample(out: Path, eps: float, seeds=SEEDS, burn_in: int = 1000, draws: int = 2000, every: int = 5) -> None:
    torch.set_num_threads(1)
    data = animals_and_plants()
    X, Y = data.inputs.float(), data.targets.float()
    W1, W2, labels = replicas(data)
    check_gradients(W1, W2, X, Y)
    for seed in seeds:
        path = out / f"draws_seed{seed}.safetensors"
        if path.exists():
            print(f"seed {seed}: {path} exists, skipped")
            continue
        started = time.time()
        config = sampler_config(seed, eps, burn_in, draws, every)
        tensors = sgld_chains(W1, W2, X, Y, config)
        save_artifact(path, tensors, {"labels": labels, "sampler": config.to_dict(), "lr": LR, "items": data.items,
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


def load_draws(out: Path, seeds=SEEDS) -> tuple[Tensor, Tensor, dict]:
    """``losses [seeds, chains, draws, R, P]``, ``distance [seeds, chains, draws, R]``, metadata."""
    losses, distance, meta = [], [], None
    for seed in seeds:
        tensors, meta = load_artifact(out / f"draws_seed{seed}.safetensors", kind="bif_remeasure_draws")
        losses.append(tensors["losses"])
        distance.append(tensors["distance"])
        meta = {**meta, "loss_trace_seed0": meta.get("loss_trace_seed0", tensors["loss_trace"]),
                "distance_trace_seed0": meta.get("distance_trace_seed0", tensors["distance_trace"])}
    return torch.stack(losses), torch.stack(distance), meta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("sample", "calibrate", "analyze", "replot"))
    parser.add_argument("--out", default="runs/bif_remeasure")
    parser.add_argument("--docs", default="docs/bif")
    parser.add_argument("--eps", type=float, default=2e-5)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--burn-in", type=int, default=1000)
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--steps-between-draws", type=int, default=5)
    args = parser.parse_args()
    out = Path(args.out)
    if args.stage == "sample":
        sample(out, args.eps, tuple(args.seeds), args.burn_in, args.draws, args.steps_between_draws)
    elif args.stage == "calibrate":
        calibrate(Path(args.docs))
    elif args.stage == "replot":
        from bif_hierarchy_analysis import replot  # noqa: PLC0415 (sibling module of the example)

        replot(Path(args.docs))
    else:
        from bif_hierarchy_analysis import analyze  # noqa: PLC0415

        analyze(out, Path(args.docs), tuple(args.seeds))


if __name__ == "__main__":
    main()
