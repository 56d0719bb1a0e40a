"""The SGLD update as a reusable step (the role of devinterp's ``optim/sgld.py``).

One step of SGLD on the localized, tempered posterior
``p(w) ∝ exp(-n_beta L(w) - gamma/2 ||w - w*||^2)``::

    w <- w - eps/2 (n_beta grad L(w) + gamma (w - w*)) + sqrt(eps) xi,   xi ~ N(0, I)

:class:`SGLD` holds the weights, their gradients and the centre ``w*``, and applies that
update in place under ``no_grad``; the caller computes the loss and its gradient between
steps. :func:`~.sampler.sample_sgld` drives it (chains, minibatches, draws, diagnostics);
any other loop can too. The update is element by element, so it is the same for one chain's
tensors and for a stack of chains: with one generator per chain (``generator`` a sequence),
the weights' leading dimension is the chain, each chain's noise is drawn from its own
generator, and a stacked step equals the chains' separate steps bit for bit
(``tests/analyses/bif/test_sgld.py``).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from interp_toolkit.errors import UserError


class SGLD:
    """The SGLD update over a list of tensors, in place.

    Args:
        params: The sampled tensors (e.g. parameters, or one flat buffer holding all of
            them). With a sequence of generators, each tensor's first dimension is the chain.
        centre: ``w*``, one tensor per entry of ``params`` (same shapes).
        eps: Step size (> 0).
        gamma: Localization strength (>= 0).
        n_beta: Inverse temperature times the number of examples (> 0): the gradient's weight.
        generator: The noise's generator, or one per chain (then every tensor's first
            dimension is that many chains).
        grads: The gradients to step with, one per entry of ``params`` (default: each
            tensor's ``.grad``; a missing one counts as zero). A flat buffer that parameters'
            ``.grad`` are views of is passed here.
    """

    def __init__(self, params: Sequence[Tensor], centre: Sequence[Tensor], *, eps: float, gamma: float,
                 n_beta: float, generator: torch.Generator | Sequence[torch.Generator] | None = None,
                 grads: Sequence[Tensor] | None = None) -> None:
        self.params = list(params)
        self.centre = list(centre)
        if not self.params:
            raise UserError("SGLD needs at least one tensor to sample")
        if len(self.centre) != len(self.params) or any(
                c.shape != p.shape for c, p in zip(self.centre, self.params, strict=True)):
            raise UserError(f"SGLD's centre must match params tensor for tensor, got shapes "
                            f"{[tuple(c.shape) for c in self.centre]} for {[tuple(p.shape) for p in self.params]}")
        if grads is not None and len(grads) != len(self.params):
            raise UserError(f"SGLD's grads must give one tensor per entry of params ({len(self.params)}), "
                            f"got {len(grads)}")
        if not (eps > 0 and math.isfinite(eps)):
            raise UserError(f"SGLD's eps must be a positive finite number, got {eps!r}")
        if not (gamma >= 0 and math.isfinite(gamma)):
            raise UserError(f"SGLD's gamma must be a finite number >= 0, got {gamma!r}")
        if not (n_beta > 0 and math.isfinite(n_beta)):
            raise UserError(f"SGLD's n_beta must be a positive finite number, got {n_beta!r}")
        self.eps, self.gamma, self.n_beta = float(eps), float(gamma), float(n_beta)
        self.sqrt_eps = math.sqrt(self.eps)
        self.grads = None if grads is None else list(grads)
        self.generators = (None if generator is None or isinstance(generator, torch.Generator)
                           else list(generator))
        self.generator = generator if isinstance(generator, torch.Generator) else None
        if self.generators is not None and any(p.ndim == 0 or p.shape[0] != len(self.generators)
                                               for p in self.params):
            raise UserError(f"with one generator per chain ({len(self.generators)}), every tensor's first "
                            f"dimension must be the chain, got shapes {[tuple(p.shape) for p in self.params]}")
        self.sizes = [p[0].numel() if self.generators is not None else p.numel() for p in self.params]
        self.numel = sum(self.sizes)
        self._drift = [torch.empty_like(p) for p in self.params]

    def _noise(self) -> list[Tensor]:
        """One draw of all the noise per chain and step (one RNG call each), split per tensor."""
        like = self.params[0]
        if self.generators is None:
            flat = torch.randn(self.numel, generator=self.generator, device=like.device, dtype=like.dtype)
            return [part.view_as(p) for part, p in zip(flat.split(self.sizes), self.params, strict=True)]
        stacked = torch.stack([torch.randn(self.numel, generator=gen, device=like.device, dtype=like.dtype)
                               for gen in self.generators])
        return [part.view_as(p) for part, p in zip(stacked.split(self.sizes, dim=1), self.params, strict=True)]

    @torch.no_grad()
    def step(self) -> Tensor:
        """Apply one update in place.

        Returns:
            ``||w - w*||`` before the update: a scalar, or one per chain with a generator per
            chain.
        """
        grads = self.grads if self.grads is not None else [
            p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        drift = self._drift
        for d, p, c in zip(drift, self.params, self.centre, strict=True):
            torch.sub(p, c, out=d)
        if self.generators is None:
            distance = torch.stack([d.pow(2).sum() for d in drift]).sum().sqrt() if len(drift) > 1 else drift[0].norm()
        else:
            distance = torch.stack([d.reshape(d.shape[0], -1).pow(2).sum(1) for d in drift]).sum(0).sqrt()
        # drift = gamma (w - w*) + n_beta grad; w <- w - eps/2 drift + sqrt(eps) noise, in
        # this order of operations (what every committed SGLD result was computed with)
        noise = self._noise()
        for d, g, p, xi in zip(drift, grads, self.params, noise, strict=True):
            d.mul_(self.gamma).add_(g, alpha=self.n_beta)
            p.add_(d, alpha=-self.eps / 2).add_(xi, alpha=self.sqrt_eps)
        return distance


__all__ = ["SGLD"]
