"""Sampler settings and the divergence error."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

from interp_toolkit.config import Config
from interp_toolkit.errors import UserError

#: The locality gate (:mod:`.locality`): the largest fraction of the gap between the
#: checkpoint's loss and the reference loss that any chain's draws may climb.
CLIMB_MAX = 0.10
#: Convergence thresholds of Vehtari et al. (2021): R-hat above 1.01 or fewer than 100 effective
#: draws (over all chains) marks an estimate as not converged (here, torch-free, so that the
#: verdict engine reads the same numbers as the sampler).
RHAT_MAX = 1.01
ESS_MIN = 100.0


class SamplerDivergenceError(UserError):
    """SGLD produced a non-finite or exploding loss: the step size is too large."""


# --------------------------------------------------------------------------- config

# devinterp's name (``sample``, ``SamplerConfig``, the ``SGLD`` optimizer's keywords) -> this
# toolkit's SamplerConfig field, for the same SGLD update (docs/migrating.md: "Coming from TransformerLens 3
# / devinterp").
DEVINTERP_NAMES: dict[str, str] = {
    "lr": "eps",
    "localization": "gamma",
    "nbeta": "n_beta",
    "n_beta": "n_beta",
    "num_chains": "chains",
    "num_draws": "draws",
    "num_burnin_steps": "burn_in",
    "num_steps_bw_draws": "steps_between_draws",
    "batch_size": "batch_size",
    "init_seed": "seed",
}


@dataclass
class SamplerConfig(Config):
    """Validated SGLD settings for sampling a localized tempered posterior.

    (The attributes are written without markup: the ``bif`` and ``bif-lm`` commands show them
    as their flags' help.)

    Attributes:
        eps: Step size (> 0). The injected noise has variance eps.
        gamma: Localization strength (>= 0) pulling draws back to the checkpoint w*.
        n_beta: n * beta, the inverse temperature times the number of examples (> 0).
            None: n / log(n) with n the number of training examples (beta =
            1/log n, the WBIC temperature).
        chains: Independent chains, all started at w* (>= 1; >= 2 for standard errors).
        draws: Recorded draws per chain (>= 1).
        burn_in: SGLD steps per chain before the first draw (>= 0).
        steps_between_draws: SGLD steps between consecutive draws (>= 1).
        batch_size: Minibatch size of the SGLD gradient; None for full batch.
        seed: Seed of the noise and minibatch order (same seed, same draws).
        param_patterns: Restrict sampling to parameters whose named_parameters name
            matches one of these fnmatch patterns (others stay at w*); None: all.
        eval_batch_size: Batch size used to record per-example losses (>= 1).
        divergence_factor: Raise SamplerDivergenceError if the minibatch loss
            exceeds divergence_factor * (|initial loss| + 1) (> 1).
        keep_draws: Also keep every recorded draw (memory grows with draws).
        pearson: Normalize to -Corr instead of -Cov.
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
                raise UserError(f"SamplerConfig.{name} must be a finite number {bound}, got {value!r}")

        def integer(name: str, minimum: int, optional: bool = False) -> None:
            value = getattr(self, name)
            if optional and value is None:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                extra = " or None" if optional else ""
                raise UserError(f"SamplerConfig.{name} must be an integer >= {minimum}{extra}, got {value!r}")

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
            raise UserError(f"SamplerConfig.divergence_factor must be > 1, got {self.divergence_factor!r}")
        if self.param_patterns is not None:
            if isinstance(self.param_patterns, str):
                self.param_patterns = (self.param_patterns,)
            self.param_patterns = tuple(self.param_patterns)
            if not self.param_patterns or not all(isinstance(p, str) and p for p in self.param_patterns):
                raise UserError(
                    f"SamplerConfig.param_patterns must be None or non-empty strings, got {self.param_patterns!r}"
                )
        for name in ("keep_draws", "pearson", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"SamplerConfig.{name} must be a bool, got {getattr(self, name)!r}")

    @classmethod
    def from_devinterp(cls, optimizer_kwargs: Mapping[str, Any] | None = None, **settings: Any) -> "SamplerConfig":
        """A config from devinterp's setting names (``lr``, ``localization``, ``nbeta`` or
        ``n_beta``, ``num_chains``, ``num_draws``, ``num_burnin_steps``,
        ``num_steps_bw_draws``, ``batch_size``, ``init_seed``: :data:`DEVINTERP_NAMES`), for
        the same SGLD update. This toolkit's own field names are accepted beside them.
        Settings not given keep this toolkit's defaults, not devinterp's (devinterp:
        ``localization=0``, ``batch_size=32``).

        Args:
            optimizer_kwargs: devinterp's ``optimizer_kwargs`` dict (``lr``,
                ``localization``, ``nbeta``), merged with ``settings``.
            **settings: The settings by devinterp's or this toolkit's names.

        Returns:
            The equivalent :class:`SamplerConfig`.

        Raises:
            ValueError: A name neither devinterp's nor a field here (named with the accepted
                ones), or one setting given twice with different values (e.g. ``lr`` and
                ``eps``, or ``nbeta`` and ``n_beta``).
        """
        own = {f.name for f in fields(cls)}
        given: list[tuple[str, Any]] = list((optimizer_kwargs or {}).items()) + list(settings.items())
        unknown = sorted(name for name, _ in given if name not in DEVINTERP_NAMES and name not in own)
        if unknown:
            raise UserError(
                f"SamplerConfig.from_devinterp got unknown setting(s) {unknown}; expected devinterp's "
                f"{sorted(DEVINTERP_NAMES)} or SamplerConfig's {sorted(own)}")
        values: dict[str, Any] = {}
        source: dict[str, str] = {}
        for name, value in given:
            field_name = DEVINTERP_NAMES.get(name, name)
            if field_name in values and values[field_name] != value:
                raise UserError(
                    f"SamplerConfig.from_devinterp got {field_name} twice with different values: "
                    f"{source[field_name]}={values[field_name]!r} and {name}={value!r}")
            values[field_name], source[field_name] = value, name
        return cls(**values)

    @property
    def total_steps(self) -> int:
        """SGLD steps per chain."""
        return self.burn_in + self.draws * self.steps_between_draws

    def resolved_n_beta(self, n_train: int) -> float:
        """``n_beta``, or its default ``n / log(n)`` for ``n`` training examples."""
        if self.n_beta is not None:
            return float(self.n_beta)
        return float(n_train) / math.log(n_train) if n_train > 2 else 1.0






@dataclass
class LocalizeConfig(Config):
    """How gamma and eps are chosen per checkpoint.

    Attributes:
        auto: Derive gamma per checkpoint (the smallest of 1e2, 3e2, ..., 1e7 whose prior-only
            cloud N(w*, I / gamma) climbs at most target of the loss gap) and eps = min(0.3 /
            gamma, 1 / (n_beta x the largest Hessian eigenvalue at the checkpoint));
            --localize.no-auto keeps --gamma and --eps as given.
        target: The largest climb of the prior-only cloud, as a fraction of the gap between the
            checkpoint's loss and the reference loss (0 < target < 1; default a quarter of the gate's 0.1).
        probes: Gaussian perturbations per gamma (>= 1).
        max_examples: Posterior examples their loss is measured on (>= 1; the first ones).
    """

    auto: bool = True
    target: float = CLIMB_MAX / 4  # a quarter of the gate: the rest is SGLD's (.localize)
    probes: int = 8
    max_examples: int = 2048

    def __post_init__(self) -> None:
        self.check("auto", isinstance(self.auto, bool), "a bool")
        self.check("target", isinstance(self.target, (int, float)) and not isinstance(self.target, bool)
                   and 0 < self.target < 1, "a number in (0, 1)")
        for name in ("probes", "max_examples"):
            value = getattr(self, name)
            self.check(name, isinstance(value, int) and not isinstance(value, bool) and value >= 1, "an integer >= 1")


#: Per-draw float64 values the estimators keep besides the sampler's own traces: the tracked
#: entries (analyses.bif.diagnostics.DEFAULT_TRACKED squared) and the scalar traces, rounded up.
_PER_DRAW_VALUES = 16 * 16 + 16


def physical_memory_bytes() -> int | None:
    """The machine's physical memory (None where the OS does not say)."""
    import os

    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def trace_bytes(config: "SamplerConfig") -> int:
    """Bytes the per-step and per-draw traces of ``config`` take (float64): the loss and
    distance of every step, and per draw the locality numbers and the tracked diagnostics."""
    return 8 * config.chains * (2 * config.total_steps + (3 + _PER_DRAW_VALUES) * config.draws)


def check_memory(config: "SamplerConfig", available: int | None = None) -> None:
    """Refuse a chain length whose traces alone exceed half the machine's memory, before any
    work (``--draws 99999999999`` used to start, then die allocating 51 TB).

    Raises:
        UserError: Naming chains, draws and steps, the bytes needed and the memory there is.
    """
    available = physical_memory_bytes() if available is None else available
    need = trace_bytes(config)
    if available is not None and need > available // 2:
        raise UserError(f"{config.chains} chains x {config.draws:,} draws ({config.total_steps:,} SGLD steps per "
                        f"chain) need {need / 2**30:,.1f} GiB for their traces alone, more than half of this "
                        f"machine's {available / 2**30:,.1f} GiB: lower draws or chains")
