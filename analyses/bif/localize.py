"""Localization strength per checkpoint: the smallest gamma whose prior-only cloud stays local.

The tempered, localized posterior ``p(w) ∝ exp(-n_beta L_n(w)) N(w; w*, I / gamma)`` has a
mean loss no higher than its prior-only part ``N(w*, I / gamma)`` has: raising ``n_beta``
tilts the cloud towards lower loss (``d E[L_n] / d n_beta = -Var(L_n) <= 0``). So if Gaussian
perturbations of ``w*`` of variance ``1 / gamma`` per parameter climb a small fraction of the
gap between the checkpoint's loss and the reference loss (:mod:`.locality`), the exact
posterior is local at *any* ``n_beta``. :func:`local_gamma` measures that climb on a ladder of
``gamma`` (a few perturbations each: forward passes only, no SGLD) and returns the smallest
``gamma`` whose cloud climbs at most ``target`` (half the gate, :data:`.locality.CLIMB_MAX`,
leaving the other half to SGLD's discretization and finite chains, which the gate on the
actual draws then checks).

The step size follows: ``eps = EPS_GAMMA / gamma``. In the prior's directions the SGLD update
is an autoregression ``w <- (1 - eps gamma / 2) w + sqrt(eps) xi``, whose stationary variance
is ``1 / (gamma (1 - eps gamma / 4))`` and whose relaxation time is ``2 / (eps gamma)``
steps: at ``eps gamma = 0.1``, 2.6% too wide and 20 steps, short against the default 100
burn-in steps. (A step size too large for the likelihood's stiff directions diverges; the
adaptive rounds then rerun at a third of it.)

Why per checkpoint: measured on the project's tasks (docs/influence.md, "Locality"), the
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

from interp_toolkit.config import Config
from interp_toolkit.errors import UserError

from .config import SamplerConfig
from .data import DataLike, LossFn, data_length, index_data, per_example_losses
from .locality import CLIMB_MAX
from .sampler import _select_parameters

__all__ = ["EPS_GAMMA", "GAMMA_LADDER", "LocalGamma", "LocalizeConfig", "local_gamma", "localized_sampler"]

#: ``eps x gamma`` of the derived step size (see the module docstring).
EPS_GAMMA = 0.1
#: The gammas tried, smallest first (half-decades).
GAMMA_LADDER = (1e2, 3e2, 1e3, 3e3, 1e4, 3e4, 1e5, 3e5, 1e6, 3e6, 1e7)


@dataclass
class LocalizeConfig(Config):
    """How gamma and eps are chosen per checkpoint.

    Attributes:
        auto: Derive gamma per checkpoint (the smallest of 1e2, 3e2, ..., 1e7 whose prior-only
            cloud N(w*, I / gamma) climbs at most target of the loss gap) and eps = 0.1 / gamma;
            --localize.no-auto keeps --gamma and --eps as given.
        target: The largest climb of the prior-only cloud, as a fraction of the gap between the
            checkpoint's loss and the reference loss (0 < target < 1; default half the gate's 0.1).
        probes: Gaussian perturbations per gamma (>= 1).
        max_examples: Posterior examples their loss is measured on (>= 1; the first ones).
    """

    auto: bool = True
    target: float = CLIMB_MAX / 2
    probes: int = 8
    max_examples: int = 2048

    def __post_init__(self) -> None:
        self.check("auto", isinstance(self.auto, bool), "a bool")
        self.check("target", isinstance(self.target, (int, float)) and not isinstance(self.target, bool)
                   and 0 < self.target < 1, "a number in (0, 1)")
        for name in ("probes", "max_examples"):
            value = getattr(self, name)
            self.check(name, isinstance(value, int) and not isinstance(value, bool) and value >= 1, "an integer >= 1")


@dataclass
class LocalGamma:
    """The outcome of :func:`local_gamma`.

    Attributes:
        gamma: The chosen localization strength.
        eps: The derived step size ``EPS_GAMMA / gamma``.
        climbs: ``gamma -> climb`` of the prior-only cloud, for every gamma measured.
        target: The climb allowed.
        found: Whether some gamma of the ladder met the target (False: the largest is returned).
        reference: What the reference loss is.
    """

    gamma: float
    eps: float
    climbs: dict[float, float]
    target: float
    found: bool
    reference: str = ""
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """One line for a command's output."""
        climb = self.climbs[self.gamma]
        head = (f"gamma {self.gamma:g}, eps {self.eps:.3g} (the smallest gamma whose prior-only cloud climbs at most "
                f"{self.target:.0%} of the gap to the {self.reference}: {climb:.1%})")
        if not self.found:
            head = (f"gamma {self.gamma:g}, eps {self.eps:.3g}: NO gamma up to {self.gamma:g} keeps the prior-only "
                    f"cloud within {self.target:.0%} of the gap (it climbs {climb:.1%}); the checkpoint sits in a "
                    "basin narrower than the ladder reaches")
        return head

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"gamma": self.gamma, "eps": self.eps, "target": self.target, "found": self.found,
                "reference": self.reference, "prior_cloud_climb": {f"{g:g}": c for g, c in self.climbs.items()},
                "rule": f"smallest gamma of {[f'{g:g}' for g in GAMMA_LADDER]} whose N(w*, I / gamma) climbs <= "
                        f"target; eps = {EPS_GAMMA:g} / gamma", "notes": self.notes}


@torch.no_grad()
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

    Raises:
        UserError: A non-finite reference loss.
    """
    config = config or LocalizeConfig()
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
        gap = reference_loss - checkpoint_loss
        if gap <= 0:
            notes.append(f"the checkpoint's loss {checkpoint_loss:.4g} is not below the {reference} "
                         f"{reference_loss:.4g}: nothing to stay near; gamma is the ladder's smallest")
            gamma = GAMMA_LADDER[0]
            return LocalGamma(gamma, EPS_GAMMA / gamma, {gamma: 0.0}, config.target, True, reference, notes)
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
