"""SGLD for many deep linear networks at once: :func:`~.sampler.sample_sgld`'s chains,
update and noise, with the DLN's closed-form gradient, for a stack of networks.

The hierarchy toy (``interp_toolkit.tasks.dln``) has 376 parameters, so the library's
sampler spends its time in per-step autograd and bookkeeping; a step-size ladder with
several initializations, sampler seeds and checkpoints needs hundreds of thousands of steps
per network. :func:`batched_dln_sgld` runs every network x chain of a stack in one set of
batched matmuls and draws the noise exactly as :func:`~.sampler.sample_sgld` does (one
generator per chain seeded from ``config.seed``, the same draw order), so each network's
chains are the library's chains for that network up to float rounding of the gradient
(``tests/analyses/bif/test_dln_fast.py`` checks this against :func:`~.sampler.sample_sgld`
on :class:`~interp_toolkit.tasks.dln.DeepLinearNetwork`). Full batch only, as the toy's
sampler settings are.

    losses = batched_dln_sgld(W1, W2, X, Y, config)["losses"]   # [chains, draws, networks, P]
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from interp_toolkit.errors import UserError

from .config import SamplerConfig, SamplerDivergenceError
from .sampler import _chain_seed


def dln_losses_and_gradients(
    W1: Float[Tensor, "*batch hidden n_in"],
    W2: Float[Tensor, "*batch n_out hidden"],
    X: Float[Tensor, "P n_in"],
    Y: Float[Tensor, "P n_out"],
) -> tuple[Float[Tensor, "*batch P"], Float[Tensor, "*batch hidden n_in"], Float[Tensor, "*batch n_out hidden"]]:
    """Per-example losses ``1/2 ||W2 W1 x - y||^2`` and the gradients of their mean with
    respect to ``W1`` and ``W2``, for a stack of networks (the loss
    :func:`~interp_toolkit.tasks.dln.dln_per_example_loss` gives one network)."""
    M = W2 @ W1  # [..., out, in]
    error = X @ M.transpose(-1, -2) - Y  # [..., P, out]
    losses = 0.5 * error.pow(2).sum(-1)
    grad_M = error.transpose(-1, -2) @ X / X.shape[0]  # d mean_p loss_p / dM
    return losses, W2.transpose(-1, -2) @ grad_M, grad_M @ W1.transpose(-1, -2)


def batched_dln_sgld(
    W1_star: Float[Tensor, "networks hidden n_in"],
    W2_star: Float[Tensor, "networks n_out hidden"],
    X: Float[Tensor, "P n_in"],
    Y: Float[Tensor, "P n_out"],
    config: SamplerConfig,
    trace_every: int = 10,
    seeds: Sequence[int] | None = None,
    observable: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> dict[str, Tensor]:
    """SGLD chains of every network in a stack around its own weights ``w*``.

    The update is the library's, ``w <- w - eps/2 (n_beta grad L(w) + gamma (w - w*)) +
    N(0, eps)`` with ``L`` the mean per-example loss over all of ``X`` (full batch), every
    chain started at ``w*``; draws are taken as :func:`~.sampler.sample_sgld` takes them.
    Network ``r``'s chain ``c`` uses the noise of the library's chain ``c`` at sampler seed
    ``seeds[r]`` (one generator per chain, ``W1`` then ``W2`` in each step's draw). With
    ``seeds=None`` every network uses ``config.seed``: their chains are then driven by the
    same noise, as separate library runs with one seed would be, so estimates of different
    networks are correlated; give each network its own seed wherever they are pooled or
    compared as independent replicates.

    Args:
        W1_star: The centres' first layers (``DeepLinearNetwork.W1.weight``), stacked.
        W2_star: Their second layers.
        X: Inputs of the examples that define the posterior.
        Y: Their targets.
        config: Sampler settings; ``n_beta`` resolves against ``len(X)``; ``batch_size``
            must be None (full batch).
        trace_every: Keep every this many steps of the loss and distance traces.
        seeds: A sampler seed per network (default: ``config.seed`` for all).
        observable: ``(W1 [chains, networks, ...], W2) -> [chains, networks, K]``, recorded
            at every draw (e.g. the map's strength on each data mode, for phase labels).

    Returns:
        ``losses [chains, draws, networks, P]`` (per-example losses at every draw),
        ``distance [chains, draws, networks]`` (``||w - w*||`` at every draw),
        ``loss_trace`` / ``distance_trace [chains, steps // trace_every, networks]`` (before
        each kept step), and with ``observable`` its values ``observables [chains, draws,
        networks, K]``.

    Raises:
        ValueError: Shapes that do not fit, a minibatch config or a bad ``trace_every``.
        SamplerDivergenceError: A non-finite loss at a draw (lower ``eps``).
    """
    if config.batch_size is not None:
        raise UserError(f"batched_dln_sgld is full batch; SamplerConfig.batch_size must be None, got "
                         f"{config.batch_size}")
    if W1_star.ndim != 3 or W2_star.ndim != 3 or W1_star.shape[0] != W2_star.shape[0]:
        raise UserError(f"W1_star and W2_star must be stacks [networks, ., .] of one length, got "
                         f"{tuple(W1_star.shape)} and {tuple(W2_star.shape)}")
    if W2_star.shape[2] != W1_star.shape[1] or X.shape[1] != W1_star.shape[2] or Y.shape[1] != W2_star.shape[1] \
            or X.shape[0] != Y.shape[0]:
        raise UserError(f"shapes do not fit y = W2 W1 x: W1 {tuple(W1_star.shape)}, W2 {tuple(W2_star.shape)}, "
                         f"X {tuple(X.shape)}, Y {tuple(Y.shape)}")
    if isinstance(trace_every, bool) or not isinstance(trace_every, int) or trace_every < 1:
        raise UserError(f"trace_every must be a positive integer, got {trace_every!r}")
    networks = W1_star.shape[0]
    seeds = [config.seed] * networks if seeds is None else [int(seed) for seed in seeds]
    if len(seeds) != networks:
        raise UserError(f"seeds must give one sampler seed per network ({networks}), got {len(seeds)}")
    n_train = X.shape[0]
    n_beta = config.resolved_n_beta(n_train)
    chains = config.chains
    size1 = W1_star[0].numel()
    numel = size1 + W2_star[0].numel()
    # one generator per distinct seed and chain: networks that share a seed share its noise
    distinct = sorted(set(seeds))
    generators: list[list[torch.Generator]] = []
    for seed in distinct:
        row = []
        for chain in range(chains):
            gen = torch.Generator().manual_seed(_chain_seed(seed, chain))
            torch.randperm(n_train, generator=gen)  # the library draws a batch order first, used or not
            row.append(gen)
        generators.append(row)
    which = torch.tensor([distinct.index(seed) for seed in seeds])
    W1 = W1_star.unsqueeze(0).expand(chains, *W1_star.shape).clone()
    W2 = W2_star.unsqueeze(0).expand(chains, *W2_star.shape).clone()
    half, root = config.eps / 2, math.sqrt(config.eps)
    steps = config.total_steps
    losses = torch.empty(chains, config.draws, networks, n_train, dtype=X.dtype)
    distance = torch.empty(chains, config.draws, networks, dtype=X.dtype)
    kept = range(0, steps, trace_every)
    loss_trace = torch.empty(chains, len(kept), networks, dtype=X.dtype)
    distance_trace = torch.empty(chains, len(kept), networks, dtype=X.dtype)
    recorded: Tensor | None = None
    draw = 0
    for step in range(steps):
        per_example, g1, g2 = dln_losses_and_gradients(W1, W2, X, Y)
        d1, d2 = W1 - W1_star, W2 - W2_star
        if step % trace_every == 0:
            loss_trace[:, step // trace_every] = per_example.mean(-1)
            distance_trace[:, step // trace_every] = (d1.pow(2).sum((-1, -2)) + d2.pow(2).sum((-1, -2))).sqrt()
        # one draw of all the noise per chain and step, W1's part first: the library's order
        noise = torch.stack([torch.stack([torch.randn(numel, generator=gen, dtype=X.dtype) for gen in row])
                             for row in generators], dim=1)[:, which]  # [chains, networks, numel]
        W1 += -half * (n_beta * g1 + config.gamma * d1) + root * noise[..., :size1].reshape(W1.shape)
        W2 += -half * (n_beta * g2 + config.gamma * d2) + root * noise[..., size1:].reshape(W2.shape)
        if step >= config.burn_in and (step - config.burn_in + 1) % config.steps_between_draws == 0:
            M = W2 @ W1
            losses[:, draw] = 0.5 * (X @ M.transpose(-1, -2) - Y).pow(2).sum(-1)
            distance[:, draw] = ((W1 - W1_star).pow(2).sum((-1, -2)) + (W2 - W2_star).pow(2).sum((-1, -2))).sqrt()
            if observable is not None:
                value = observable(W1, W2)
                if value.shape[:2] != (chains, networks) or value.ndim != 3:
                    raise UserError(f"observable must return [chains, networks, K] = [{chains}, {networks}, K], "
                                     f"got {tuple(value.shape)}")
                if recorded is None:
                    recorded = torch.empty(chains, config.draws, networks, value.shape[-1], dtype=value.dtype)
                recorded[:, draw] = value
            if not torch.isfinite(losses[:, draw]).all():
                raise SamplerDivergenceError(f"SGLD diverged at draw {draw} (step {step}) at eps {config.eps:g}: "
                                             "lower eps")
            draw += 1
    out = {"losses": losses, "distance": distance, "loss_trace": loss_trace, "distance_trace": distance_trace}
    if recorded is not None:
        out["observables"] = recorded
    return out


__all__ = ["batched_dln_sgld", "dln_losses_and_gradients"]
