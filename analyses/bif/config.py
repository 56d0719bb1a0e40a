"""Sampler settings and the divergence error."""

from __future__ import annotations

import math
from dataclasses import dataclass

from interp_toolkit.config import Config


class SamplerDivergenceError(ValueError):
    """SGLD produced a non-finite or exploding loss: the step size is too large."""


# --------------------------------------------------------------------------- config


@dataclass
class SamplerConfig(Config):
    """Validated SGLD settings for sampling a localized tempered posterior.

    Attributes:
        eps: Step size (> 0). The injected noise has variance ``eps``.
        gamma: Localization strength (>= 0) pulling draws back to the checkpoint ``w*``.
        n_beta: ``n * beta``, the inverse temperature times the number of examples (> 0).
            ``None``: ``n / log(n)`` with ``n`` the number of training examples (beta =
            1/log n, the WBIC temperature).
        chains: Independent chains, all started at ``w*`` (>= 1; >= 2 for standard errors).
        draws: Recorded draws per chain (>= 1).
        burn_in: SGLD steps per chain before the first draw (>= 0).
        steps_between_draws: SGLD steps between consecutive draws (>= 1).
        batch_size: Minibatch size of the SGLD gradient; ``None`` for full batch.
        seed: Seed of the noise and minibatch order (same seed, same draws).
        param_patterns: Restrict sampling to parameters whose ``named_parameters`` name
            matches one of these ``fnmatch`` patterns (others stay at ``w*``); ``None``: all.
        eval_batch_size: Batch size used to record per-example losses (>= 1).
        divergence_factor: Raise :class:`SamplerDivergenceError` if the minibatch loss
            exceeds ``divergence_factor * (|initial loss| + 1)`` (> 1).
        keep_draws: Also keep every recorded draw (memory grows with draws).
        pearson: Normalize to ``-Corr`` instead of ``-Cov``.
        progress: Show a tqdm bar.
    """

    eps: float = 1e-4
    gamma: float = 100.0
    n_beta: float | None = None
    chains: int = 4
    draws: int = 100
    burn_in: int = 100
    steps_between_draws: int = 1
    batch_size: int | None = None
    seed: int = 0
    param_patterns: tuple[str, ...] | None = None
    eval_batch_size: int = 1024
    divergence_factor: float = 1e4
    keep_draws: bool = False
    pearson: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        def positive_number(name: str, allow_zero: bool = False) -> None:
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            ok = ok and (value >= 0 if allow_zero else value > 0)
            if not ok:
                bound = ">= 0" if allow_zero else "> 0"
                raise ValueError(f"SamplerConfig.{name} must be a finite number {bound}, got {value!r}")

        def integer(name: str, minimum: int, optional: bool = False) -> None:
            value = getattr(self, name)
            if optional and value is None:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                extra = " or None" if optional else ""
                raise ValueError(f"SamplerConfig.{name} must be an integer >= {minimum}{extra}, got {value!r}")

        positive_number("eps")
        positive_number("gamma", allow_zero=True)
        if self.n_beta is not None:
            positive_number("n_beta")
        integer("chains", 1)
        integer("draws", 1)
        integer("burn_in", 0)
        integer("steps_between_draws", 1)
        integer("batch_size", 1, optional=True)
        integer("seed", 0)
        integer("eval_batch_size", 1)
        positive_number("divergence_factor")
        if self.divergence_factor <= 1:
            raise ValueError(f"SamplerConfig.divergence_factor must be > 1, got {self.divergence_factor!r}")
        if self.param_patterns is not None:
            if isinstance(self.param_patterns, str):
                self.param_patterns = (self.param_patterns,)
            self.param_patterns = tuple(self.param_patterns)
            if not self.param_patterns or not all(isinstance(p, str) and p for p in self.param_patterns):
                raise ValueError(
                    f"SamplerConfig.param_patterns must be None or non-empty strings, got {self.param_patterns!r}"
                )
        for name in ("keep_draws", "pearson", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"SamplerConfig.{name} must be a bool, got {getattr(self, name)!r}")

    @property
    def total_steps(self) -> int:
        """SGLD steps per chain."""
        return self.burn_in + self.draws * self.steps_between_draws

    def resolved_n_beta(self, n_train: int) -> float:
        """``n_beta``, or its default ``n / log(n)`` for ``n`` training examples."""
        if self.n_beta is not None:
            return float(self.n_beta)
        return float(n_train) / math.log(n_train) if n_train > 2 else 1.0




