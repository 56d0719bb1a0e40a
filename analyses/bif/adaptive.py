"""Adaptive chain length: run a BIF, and while its chains have not converged (split R-hat
> 1.01 or an ESS < 100), run it again with chains twice as long, until they converge or a
stated budget of SGLD steps per chain runs out; report which.

Every round is an ordinary BIF at its own sampler config (cached by it, so a rerun is a cache
hit round by round). Each round starts fresh chains at ``w*``: the rounds cost at most twice
the last one. Only ``draws`` and ``burn_in`` grow, so the posterior (``gamma``, ``n_beta``)
stays the one asked for: the estimand never moves. The step size ``eps`` (how fast, and how
finely, SGLD samples that posterior) is kept too, unless SGLD diverges: a diverging step size
samples nothing, so the round is rerun at a third of it (at most :data:`MAX_BACKOFFS` times;
the record names every step size tried). The same holds for a round whose draws failed the
locality gate (:mod:`.locality`) at a gamma derived to be local (the commands' default): the
exact posterior there is local, so draws that climbed are SGLD's discretization heating the
chain (measured: a 1-layer majority model climbed 69% of the loss gap at eps 3e-5, 34% at 2e-5
and 0.3% at 1e-5, same gamma), and the round is rerun at a third of eps. When the budget runs
out first, the last round is returned with its diagnostics and the record says so;
``interp-toolkit bif --calibrate`` (or :func:`calibrate_sampler`) finds a step size that mixes
faster.

No anchor does this: devinterp leaves convergence to the user.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from interp_toolkit.config import Config
from interp_toolkit.errors import UserError

from .config import SamplerConfig

__all__ = ["ROUNDS_DIR", "AdaptiveConfig", "AdaptiveRecord", "check_budget", "keep_final_round", "until_converged"]

#: Folder (inside a command's output folder) caching every round; the last is copied beside it.
ROUNDS_DIR = "rounds"
#: How many times a diverging step size is divided by :data:`BACKOFF` before giving up.
MAX_BACKOFFS = 3
BACKOFF = 3.0

R = TypeVar("R")


@dataclass
class AdaptiveConfig(Config):
    """How long chains may grow.

    Attributes:
        adaptive: Extend the chains until converged (R-hat <= 1.01, ESS >= 100) or the
            budget runs out; --no-adaptive runs the sampler settings once.
        max_steps: Budget: SGLD steps per chain of the longest round (burn-in + draws x
            steps between draws); the rounds double draws and burn-in up to it.
    """

    adaptive: bool = True
    max_steps: int = 3200

    def __post_init__(self) -> None:
        if not isinstance(self.adaptive, bool):
            raise UserError(f"AdaptiveConfig.adaptive must be a bool, got {self.adaptive!r}")
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int) or self.max_steps < 1:
            raise UserError(f"AdaptiveConfig.max_steps must be a positive integer (SGLD steps per chain), "
                             f"got {self.max_steps!r}")


@dataclass
class AdaptiveRecord:
    """What the rounds did.

    Attributes:
        rounds: Per round: ``eps``, ``draws``, ``burn_in``, ``steps_per_chain``, ``diverged``
            and the worst diagnostics (``max_rhat``, ``min_ess_bulk``, ``min_ess_tail``,
            ``converged``; None for a round that diverged).
        stopped: ``"converged"``, ``"budget"`` (the next round would exceed ``max_steps``),
            ``"one_chain"`` (R-hat needs two) or ``"off"`` (one round asked for).
        max_steps: The budget.
    """

    rounds: list[dict[str, Any]] = field(default_factory=list)
    stopped: str = "off"
    max_steps: int = 0

    @property
    def converged(self) -> bool:
        return bool(self.rounds) and bool(self.rounds[-1]["converged"])

    def to_dict(self) -> dict[str, Any]:
        return {"rounds": list(self.rounds), "stopped": self.stopped, "max_steps": self.max_steps,
                "converged": self.converged}

    def describe(self) -> str:
        """One line: converged after which round, or the budget ran out with the diagnostics."""
        last = self.rounds[-1]
        where = f"{last['draws']} draws after {last['burn_in']} burn-in steps per chain"
        lowered = sorted({r["eps"] for r in self.rounds if r["diverged"]}, reverse=True)
        if lowered:
            where += (f" at eps {last['eps']:.3g} (SGLD diverged at eps "
                      f"{', '.join(f'{e:.3g}' for e in lowered)})")
        heated = sorted({r["eps"] for r in self.rounds if r.get("local") is False and r["eps"] != last["eps"]},
                        reverse=True)
        if heated:
            where += (f" at eps {last['eps']:.3g} (the draws left the checkpoint's solution at eps "
                      f"{', '.join(f'{e:.3g}' for e in heated)})")
        if self.stopped == "converged":
            return f"converged at {where} ({len(self.rounds)} round{'s' if len(self.rounds) > 1 else ''})"
        worst = (f"max R-hat {_fmt(last['max_rhat'], 3)}, min ESS bulk {_fmt(last['min_ess_bulk'], 0)} / "
                 f"tail {_fmt(last['min_ess_tail'], 0)}")
        if self.stopped == "one_chain":
            return f"NOT converged at {where}: R-hat needs >= 2 chains (set --chains 4)"
        if self.stopped == "budget":
            return (f"NOT converged: the budget of {self.max_steps} SGLD steps per chain ran out at {where} "
                    f"({worst}); raise max_steps (--max-steps), or find a faster-mixing eps with --calibrate or "
                    "calibrate_sampler")
        return f"{'converged' if last['converged'] else 'NOT converged'} at {where} ({worst}; --no-adaptive)"


def _fmt(value: Any, digits: int) -> str:
    return "n/a" if value is None else f"{float(value):.{digits}f}"


def _summary(config: SamplerConfig, convergence: Any, diverged: bool = False, locality: Any = None) -> dict[str, Any]:
    summary = convergence.summary() if convergence is not None else {}
    return {"eps": config.eps, "draws": config.draws, "burn_in": config.burn_in,
            "steps_per_chain": config.total_steps, "diverged": diverged,
            "local": None if locality is None else bool(locality.local),
            "climb": None if locality is None or not locality.worst_climb == locality.worst_climb
            else float(locality.worst_climb),
            "max_rhat": summary.get("max_rhat"), "min_ess_bulk": summary.get("min_ess_bulk"),
            "min_ess_tail": summary.get("min_ess_tail"), "converged": bool(summary.get("converged", False))}


def check_budget(config: SamplerConfig, adaptive: AdaptiveConfig) -> None:
    """Refuse, before any work, a first round longer than the adaptive budget (it used to run,
    then report the budget as "ran out") and a longest round whose traces the machine cannot hold.

    Raises:
        UserError: Naming the steps per chain, the budget and the flags that set them.
    """
    from .config import check_memory

    if adaptive.adaptive and config.total_steps > adaptive.max_steps:
        raise UserError(f"the first round alone takes {config.total_steps:,} SGLD steps per chain (burn-in "
                        f"{config.burn_in:,} + draws {config.draws:,} x {config.steps_between_draws} between draws), "
                        f"more than the budget max_steps = {adaptive.max_steps:,} (--max-steps): raise the budget, or "
                        "lower draws or burn-in")
    check_memory(config)


def until_converged(run: Callable[[SamplerConfig], R], config: SamplerConfig, adaptive: AdaptiveConfig,
                    convergence_of: Callable[[R], Any] = lambda result: getattr(result, "convergence", None),
                    on_round: Callable[[dict[str, Any]], None] | None = None,
                    local_backoff: bool = False) -> tuple[R, AdaptiveRecord]:
    """``run(config)``, then again with draws and burn-in doubled while it has not converged
    and the next round fits ``adaptive.max_steps`` steps per chain.

    Args:
        run: One BIF at a sampler config (e.g. a ``functools.partial`` of :func:`bif`, or
            of :func:`~interp_toolkit.analyses.bif.lm.lm_bif` over a config).
        config: The first round's settings.
        adaptive: On/off and the budget.
        convergence_of: The :class:`ConvergenceDiagnostics` of a result.
        on_round: Told of each round's summary as it ends (progress lines).
        local_backoff: Rerun a round whose ``result.locality`` (measured) failed the gate at a
            third of eps, as a diverging one (for a gamma derived to be local, e.g. by
            :func:`~.localize.local_gamma`: then only the step size can be to blame).

    Returns:
        The last round's result and the :class:`AdaptiveRecord`. The convergence warnings
        of the rounds before the last are not repeated (the record holds their numbers).
    """
    if not isinstance(adaptive, AdaptiveConfig):
        raise TypeError(f"adaptive must be an AdaptiveConfig, got {type(adaptive).__name__}")
    from .config import SamplerDivergenceError

    check_budget(config, adaptive)
    record = AdaptiveRecord(max_steps=adaptive.max_steps)
    current = config
    backoffs = 0
    while True:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            started = time.perf_counter()
            try:
                result = run(current)
            except SamplerDivergenceError:
                if not adaptive.adaptive or backoffs >= MAX_BACKOFFS:
                    raise
                record.rounds.append(_summary(current, None, diverged=True))
                if on_round is not None:
                    # the round's cost goes to the notice, not the record (a cached rerun reads the same)
                    on_round({**record.rounds[-1], "seconds": time.perf_counter() - started})
                current = dataclasses.replace(current, eps=current.eps / BACKOFF)
                backoffs += 1
                continue
        locality = getattr(result, "locality", None)
        summary = _summary(current, convergence_of(result), locality=locality)
        record.rounds.append(summary)
        if on_round is not None:
            on_round({**summary, "seconds": time.perf_counter() - started})
        heated = (local_backoff and locality is not None and not locality.local
                  and locality.worst_climb == locality.worst_climb)  # measured (not NaN) and failed
        if heated and adaptive.adaptive and backoffs < MAX_BACKOFFS:
            current = dataclasses.replace(current, eps=current.eps / BACKOFF)
            backoffs += 1
            continue
        grown = dataclasses.replace(current, draws=current.draws * 2, burn_in=max(current.burn_in * 2, 1))
        if not adaptive.adaptive:
            record.stopped = "off"
        elif summary["converged"]:
            record.stopped = "converged"
        elif current.chains < 2:  # R-hat needs two chains: no length converges
            record.stopped = "one_chain"
        elif grown.total_steps > adaptive.max_steps:
            record.stopped = "budget"
        else:
            current = grown
            continue
        for warning in caught:  # the last round's warnings reach the caller, at its line
            warnings.warn(warning.message, warning.category, stacklevel=2)
        return result, record


def keep_final_round(rounds_dir: str | Path, out_dir: str | Path, name: str) -> Path:
    """Copy the cached folder ``rounds_dir/name`` of the last round to ``out_dir/name`` (the
    command's result; the rounds stay cached for reruns). Atomic: a temporary copy renamed
    into place; an existing complete copy is kept. Returns ``out_dir/name``."""
    import shutil
    import tempfile

    source, target = Path(rounds_dir) / name, Path(out_dir) / name
    if target.is_dir() and sorted(p.name for p in target.iterdir()) == sorted(p.name for p in source.iterdir()):
        return target
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=out_dir))
    try:
        shutil.copytree(source, staging / name)
        if target.exists():
            shutil.rmtree(target)  # an incomplete copy of an earlier, interrupted call
        (staging / name).rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
