"""Localization strength per checkpoint: the smallest gamma whose prior-only cloud stays local.

The tempered, localized posterior ``p(w) ∝ exp(-n_beta L_n(w)) N(w; w*, I / gamma)`` has a
mean loss no higher than its prior-only part ``N(w*, I / gamma)`` has: raising ``n_beta``
tilts the cloud towards lower loss (``d E[L_n] / d n_beta = -Var(L_n) <= 0``). So if Gaussian
perturbations of ``w*`` of variance ``1 / gamma`` per parameter climb a small fraction of the
gap between the checkpoint's loss and the reference loss (:mod:`.locality`), the exact
posterior is local at *any* ``n_beta``. :func:`local_gamma` measures that climb on a ladder of
``gamma`` (a few perturbations each: forward passes only, no SGLD) and returns the smallest
``gamma`` whose cloud climbs at most ``target`` (a quarter of the gate,
:data:`~.config.CLIMB_MAX`, leaving the rest to SGLD's discretization and finite chains, which
the gate on the actual draws then checks: at half the gate, the custom task's draws climbed 7-11%
of the gap, around the gate). A larger gamma costs no mixing in the prior's directions: the
step size scales with ``1 / gamma``, so their relaxation time in steps stays the same.

The step size follows: ``eps = min(EPS_GAMMA / gamma, EPS_STIFF / (n_beta * lambda_max))``,
``lambda_max`` the largest Hessian eigenvalue of ``L_n`` at ``w*`` (:func:`top_curvature`, power
iteration on Hessian-vector products). In a direction of total curvature ``k`` the SGLD update
is an autoregression ``w <- (1 - eps k / 2) w + sqrt(eps) xi``, whose stationary variance is
``1 / (k (1 - eps k / 4))`` and whose relaxation time is ``2 / (eps k)`` steps. In the
prior-only directions (``k = gamma``, nearly all of them) ``eps k = 0.3``: 8% too wide (4% in
radius), 7 steps. 0.3 rather than 0.1: at 0.1 neither the custom task nor a 1-layer MPSP
checkpoint converged within the default 3,200 steps per chain (R-hat 1.02-1.03), at 0.3 both did
(docs/bif.md, "Locality"). In the likelihood's stiffest direction ``eps k <= 1`` (stable
below 4; at most 33% too wide in that one direction). (A step size too large further from
``w*``, where the curvature is higher, diverges; the adaptive rounds then rerun at a third of it.)

Why per checkpoint: measured on the project's tasks (docs/bif.md, "Locality"), the
gamma that keeps the cloud local spans two orders of magnitude (a 1-layer majority model at
loss 5e-5 is local at gamma 1e4, a 1-layer MPSP model sitting on the shortcut at loss 0.036
needs 1e5), and no fixed setting is both local on the one and not needlessly tight on the other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from interp_toolkit.errors import UserError

from .config import LocalizeConfig, SamplerConfig
from .data import DataLike, LossFn, data_length, index_data, per_example_losses
from .locality import GAP_FLOOR, loss_gap
from .sampler import _select_parameters

__all__ = ["EPS_GAMMA", "EPS_STIFF", "GAMMA_LADDER", "LocalGamma", "local_gamma",
           "localized_sampler", "top_curvature"]

#: ``eps x gamma`` of the derived step size (see the module docstring).
EPS_GAMMA = 0.3
#: ``eps x n_beta x lambda_max``: the step size's bound in the likelihood's stiffest direction.
EPS_STIFF = 1.0
#: The gammas tried, smallest first (half-decades).
GAMMA_LADDER = (1e2, 3e2, 1e3, 3e3, 1e4, 3e4, 1e5, 3e5, 1e6, 3e6, 1e7)


@dataclass
class LocalGamma:
    """The outcome of :func:`local_gamma`.

    Attributes:
        gamma: The chosen localization strength.
        eps: The derived step size (``EPS_GAMMA / gamma``, or less for a stiff likelihood).
        climbs: ``gamma -> climb`` of the prior-only cloud, for every gamma measured.
        target: The climb allowed.
        found: Whether some gamma of the ladder met the target (False: the largest is returned).
        reference: What the reference loss is.
        curvature: ``lambda_max`` of ``L_n`` at ``w*`` (0 when not measured: no ``n_beta``).
        n_beta: The ``n_beta`` the step size was derived for (None: gamma alone).
        notes: What the numbers need read with them.
    """

    gamma: float
    eps: float
    climbs: dict[float, float]
    target: float
    found: bool
    reference: str = ""
    notes: list[str] = field(default_factory=list)
    curvature: float = 0.0
    n_beta: float | None = None

    def describe(self) -> str:
        """One line for a command's output."""
        climb = self.climbs[self.gamma]
        stiff = ("" if self.n_beta is None else
                 f"; eps = min({EPS_GAMMA:g} / gamma, {EPS_STIFF:g} / (n_beta {self.n_beta:.4g} x lambda_max "
                 f"{self.curvature:.3g}))")
        head = (f"gamma {self.gamma:g}, eps {self.eps:.3g} (the smallest gamma whose prior-only cloud climbs at most "
                f"{100 * self.target:g}% of the gap to the {self.reference}: {climb:.1%}{stiff})")
        if not self.found:
            head = (f"gamma {self.gamma:g}, eps {self.eps:.3g}: NO gamma up to {self.gamma:g} keeps the prior-only "
                    f"cloud within {100 * self.target:g}% of the gap (it climbs {climb:.1%}); the checkpoint sits in a "
                    "basin narrower than the ladder reaches")
        return head

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"gamma": self.gamma, "eps": self.eps, "target": self.target, "found": self.found,
                "reference": self.reference, "prior_cloud_climb": {f"{g:g}": c for g, c in self.climbs.items()},
                "curvature": self.curvature, "n_beta": self.n_beta,
                "rule": f"smallest gamma of {[f'{g:g}' for g in GAMMA_LADDER]} whose N(w*, I / gamma) climbs <= "
                        f"target; eps = min({EPS_GAMMA:g} / gamma, {EPS_STIFF:g} / (n_beta * lambda_max))",
                "notes": self.notes}


def local_gamma(
    model: nn.Module,
    data: DataLike,
    loss_fn: LossFn,
    *,
    reference_loss: float,
    reference: str = "reference loss",
    config: LocalizeConfig | None = None,
    param_patterns: tuple[str, ...] | None = None,
    seed: int = 0,
    eval_batch_size: int = 1024,
    n_beta: float | None = None,
) -> LocalGamma:
    """The smallest gamma of :data:`GAMMA_LADDER` whose prior-only cloud is local.

    Args:
        model: The checkpoint (its weights are ``w*``; restored afterwards).
        data: The posterior data (its first ``config.max_examples`` examples are used).
        loss_fn: Per-example losses, as for :func:`~.api.bif`.
        reference_loss: The loss meaning "the solution is gone" (:mod:`.locality`).
        reference: Its name, for messages.
        config: Target, probes, examples.
        param_patterns: The sampled parameters (others are not perturbed).
        seed: Seed of the perturbations.
        eval_batch_size: Examples per forward pass.
        n_beta: The sampler's ``n * beta``: the step size then allows for the likelihood's
            stiffest direction at ``w*`` (:func:`top_curvature`); None: ``EPS_GAMMA / gamma``.

    Raises:
        UserError: A non-finite reference loss.
    """
    config = config or LocalizeConfig()
    found = _ladder(model, data, loss_fn, reference_loss, reference, config, param_patterns, seed, eval_batch_size)
    if n_beta is not None:
        n = min(config.max_examples, data_length(data))
        found.curvature = top_curvature(model, index_data(data, slice(0, n)), loss_fn, param_patterns=param_patterns,
                                        seed=seed, eval_batch_size=eval_batch_size)
        found.n_beta = float(n_beta)
        stiff = found.n_beta * abs(found.curvature)
        found.eps = min(EPS_GAMMA / found.gamma, EPS_STIFF / stiff if stiff > 0 else math.inf)
    return found


@torch.no_grad()
def _ladder(model: nn.Module, data: DataLike, loss_fn: LossFn, reference_loss: float, reference: str,
            config: LocalizeConfig, param_patterns: tuple[str, ...] | None, seed: int,
            eval_batch_size: int) -> LocalGamma:
    if not math.isfinite(reference_loss):
        raise UserError(f"local_gamma needs a finite reference_loss, got {reference_loss!r}")
    n = min(config.max_examples, data_length(data))
    subset = index_data(data, slice(0, n))
    losses = per_example_losses(loss_fn, subset, eval_batch_size)
    params = [p for _, p in _select_parameters(model, param_patterns)]
    centre = [p.detach().clone() for p in params]
    was_training = model.training
    model.eval()
    notes = []
    try:
        checkpoint_loss = float(losses(model).double().mean())
        gap, floored = loss_gap(checkpoint_loss, reference_loss)  # the gate's own gap
        if floored:
            notes.append(f"the checkpoint's loss {checkpoint_loss:.4g} is within {GAP_FLOOR:.0%} of the {reference} "
                         f"{reference_loss:.4g} (it has learned little): the cloud's climb is a fraction of "
                         f"{GAP_FLOOR:.0%} of the reference, as the gate's is")
        gen = torch.Generator().manual_seed(seed)
        climbs: dict[float, float] = {}
        for gamma in GAMMA_LADDER:
            total = 0.0
            for _ in range(config.probes):
                for p, c in zip(params, centre, strict=True):
                    noise = torch.randn(c.shape, generator=gen, dtype=torch.float64).to(c.device, c.dtype)
                    p.copy_(c + noise / math.sqrt(gamma))
                total += float(losses(model).double().mean())
            climbs[gamma] = (total / config.probes - checkpoint_loss) / gap
            if climbs[gamma] <= config.target:
                return LocalGamma(gamma, EPS_GAMMA / gamma, climbs, config.target, True, reference, notes)
        gamma = GAMMA_LADDER[-1]
        return LocalGamma(gamma, EPS_GAMMA / gamma, climbs, config.target, False, reference, notes)
    finally:
        for p, c in zip(params, centre, strict=True):
            p.copy_(c)
        model.train(was_training)


def localized_sampler(sampler: SamplerConfig, found: LocalGamma) -> SamplerConfig:
    """``sampler`` with the derived gamma and eps."""
    return SamplerConfig.from_dict({**sampler.to_dict(), "gamma": found.gamma, "eps": found.eps})


def top_curvature(model: nn.Module, data: DataLike, loss_fn: LossFn, *, param_patterns: tuple[str, ...] | None = None,
                  iterations: int = 12, seed: int = 0, eval_batch_size: int = 1024) -> float:
    """The largest Hessian eigenvalue of the mean loss over ``data`` at the model's weights
    (power iteration on Hessian-vector products over the sampled parameters; the weights are
    not changed). Negative curvature is returned as measured (the power iteration finds the
    eigenvalue of largest magnitude)."""
    params = [p for _, p in _select_parameters(model, param_patterns)]
    saved = [p.requires_grad for p in params]
    was_training = model.training
    model.eval()
    n = data_length(data)
    gen = torch.Generator().manual_seed(seed + 1)
    vector = [torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.device, p.dtype) for p in params]

    def hvp(v: list[torch.Tensor]) -> list[torch.Tensor]:
        out = [torch.zeros_like(p) for p in params]
        for start in range(0, n, eval_batch_size):
            batch = index_data(data, slice(start, min(n, start + eval_batch_size)))
            loss = loss_fn(model, batch).sum() / n
            # (a parameter the loss does not use, e.g. a bridge's unused weight, has no curvature)
            grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
            dot = sum((g * x).sum() for g, x in zip(grads, v, strict=True) if g is not None)
            if not isinstance(dot, torch.Tensor) or not dot.requires_grad:
                continue
            for acc, h in zip(out, torch.autograd.grad(dot, params, allow_unused=True), strict=True):
                if h is not None:
                    acc.add_(h)
        return out

    try:
        for p in params:
            p.requires_grad_(True)
        value = 0.0
        for _ in range(iterations):
            norm = math.sqrt(sum(float((x.double() ** 2).sum()) for x in vector))
            if norm == 0.0:
                return 0.0
            vector = [x / norm for x in vector]
            product = hvp(vector)
            value = sum(float((h.double() * x.double()).sum()) for h, x in zip(product, vector, strict=True))
            vector = [h.detach() for h in product]
        return value
    finally:
        for p, flag in zip(params, saved, strict=True):
            p.requires_grad_(flag)
        model.train(was_training)
