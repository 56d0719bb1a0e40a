"""The verdict engine: every claim of both papers judged from committed data by stated rules.

A verdict is one of :data:`VERDICTS` and names its regime R (the settings the runs share).
The rules, applied in this order:

1. **Scope**: a claim about 2-layer models is judged on 2-layer runs (1-layer cells may sit
   beside it as this project's variant, under their own claim). No run of the claim's kind in
   R: ``not tested in R``.
2. **Rate contrasts** (a generalization rate higher in one cell than in another): with the
   difference ``d = rate_a - rate_b``, its 95% Newcombe interval and the two-sided Fisher p, the
   claim is ``reproduced in R`` when ``d`` has the paper's sign and the interval excludes 0,
   with at least :data:`MIN_SEEDS` seeds per cell (fewer: ``inconclusive``). Otherwise it is
   ``not reproduced in R`` only when the same rule had at least :data:`POWER_MIN` power to see
   the paper's effect at the cell sizes used, else ``inconclusive in R``. Power is exact: both
   binomials are enumerated at the paper's rates (:func:`detection_power`). A claim whose paper
   gives no rates is powered at the headline's effect (this project's choice, named in the row).
3. **SGLD claims** need converged chains on the quantities they rest on (split R-hat <=
   :data:`RHAT_MAX` and ESS >= :data:`ESS_MIN`); otherwise ``inconclusive`` whatever the sign.
4. **Rise and fall** needs checkpoints after the peak: a peak at the last checkpoint
   measured cannot show a fall (``inconclusive``).
5. **Observability**: a claim about what generalizing runs do (transience, the second phase)
   is ``inconclusive`` when no run generalized.

:func:`rate_verdict`, :func:`convergence_gate`, :func:`after_peak` and :func:`observed` are the
rules; :mod:`interp_toolkit.studies.verdicts.table` lists the claims and computes
``docs/reproduction/verdicts.csv`` from the committed tables.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Iterable, Mapping, Sequence

from interp_toolkit.errors import UserError
from interp_toolkit.studies.common.statistics import fisher_exact_p, newcombe_interval

#: The four verdicts (each followed by "in R").
VERDICTS = ("reproduced", "not reproduced", "inconclusive", "not tested")
#: Power a "not reproduced" needs (to see the paper's effect at the cell sizes used).
POWER_MIN = 0.8
#: The convergence rule of every SGLD verdict (the toolkit's own, analyses/bif/diagnostics.py).
RHAT_MAX = 1.01
ESS_MIN = 100.0
ALPHA = 0.05
#: Fewest seeds per cell for a rate verdict either way (the paper's effect sizes make a few
#: seeds look powerful, but a cell this small says little about a rate).
MIN_SEEDS = 8


def _check_cell(name: str, k: int, n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UserError(f"{name}: n must be an integer >= 1, got {n!r}")
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= n:
        raise UserError(f"{name}: k must be an integer in [0, n={n}], got {k!r}")


def detects(k_a: int, n_a: int, k_b: int, n_b: int, sign: int) -> bool:
    """The detection rule: ``k_a/n_a - k_b/n_b`` has ``sign`` (+1 or -1) and its 95% Newcombe
    interval excludes 0."""
    diff, low, high = newcombe_interval(k_a, n_a, k_b, n_b)
    return (low > 0.0) if sign > 0 else (high < 0.0)


@functools.lru_cache(maxsize=4096)
def detection_power(n_a: int, n_b: int, p_a: float, p_b: float) -> float:
    """Exact probability that :func:`detects` sees ``p_a - p_b``'s sign when the true rates are
    ``p_a`` and ``p_b`` and the cells hold ``n_a`` and ``n_b`` seeds: the sum over every
    ``(k_a, k_b)`` of the two binomial probabilities where the rule detects.

    Raises:
        ValueError: bad sizes or rates, or ``p_a == p_b`` (no effect to detect).
    """
    from scipy.stats import binom

    _check_cell("detection_power", 0, n_a)
    _check_cell("detection_power", 0, n_b)
    for name, p in (("p_a", p_a), ("p_b", p_b)):
        if not (isinstance(p, (int, float)) and 0.0 <= p <= 1.0):
            raise UserError(f"detection_power: {name} must be a rate in [0, 1], got {p!r}")
    if p_a == p_b:
        raise UserError(f"detection_power: the rates are equal ({p_a}); there is no effect to detect")
    sign = 1 if p_a > p_b else -1
    probs_a = binom.pmf(range(n_a + 1), n_a, p_a)
    probs_b = binom.pmf(range(n_b + 1), n_b, p_b)
    power = 0.0
    for k_a in range(n_a + 1):
        for k_b in range(n_b + 1):
            if probs_a[k_a] * probs_b[k_b] > 0 and detects(k_a, n_a, k_b, n_b, sign):
                power += float(probs_a[k_a] * probs_b[k_b])
    return min(1.0, power)


def rate_verdict(k_a: int, n_a: int, k_b: int, n_b: int, paper_a: float, paper_b: float) -> dict[str, Any]:
    """Rule 2 on one contrast: cell a (``k_a`` of ``n_a`` seeds generalized) against cell b,
    the paper's rates ``paper_a`` and ``paper_b`` giving the sign and the effect to power.

    Returns:
        ``verdict`` (without "in R"), ``difference``, ``low``, ``high``, ``fisher_p``,
        ``power`` and ``why`` (one sentence).
    """
    _check_cell("cell a", k_a, n_a)
    _check_cell("cell b", k_b, n_b)
    sign = 1 if paper_a > paper_b else -1
    diff, low, high = newcombe_interval(k_a, n_a, k_b, n_b)
    p = fisher_exact_p(k_a, n_a, k_b, n_b)
    power = detection_power(n_a, n_b, float(paper_a), float(paper_b))
    row = {"difference": diff, "low": low, "high": high, "fisher_p": p, "power": power}
    if min(n_a, n_b) < MIN_SEEDS:
        return {**row, "verdict": "inconclusive",
                "why": f"a cell of {min(n_a, n_b)} seed{'s' if min(n_a, n_b) != 1 else ''} "
                       f"(a rate verdict needs {MIN_SEEDS} per cell)"}
    if detects(k_a, n_a, k_b, n_b, sign):
        # The verdict is about the direction; whether the paper's size fits is said beside it.
        effect = float(paper_a) - float(paper_b)
        size = ("the paper's difference ({:+.2f}) lies inside it" if low <= effect <= high
                else "the paper's difference ({:+.2f}) lies outside it: the direction, not the size").format(effect)
        return {**row, "verdict": "reproduced",
                "why": f"the difference has the paper's sign and its 95% interval excludes 0; {size}"}
    if power >= POWER_MIN:
        return {**row, "verdict": "not reproduced",
                "why": f"not detected, with {power:.0%} power to detect the paper's effect at these cell sizes"}
    return {**row, "verdict": "inconclusive",
            "why": f"not detected, but the cells had only {power:.0%} power to detect the paper's effect "
                   f"(a 'not reproduced' needs {POWER_MIN:.0%})"}


def seeds_for_power(p_a: float, p_b: float, target: float = POWER_MIN, limit: int = 400) -> int | None:
    """The smallest equal cell size with ``target`` power for ``p_a`` vs ``p_b`` (what an
    ``inconclusive`` would take), or None above ``limit`` seeds per cell."""
    n = 2
    while n <= limit:
        if detection_power(n, n, p_a, p_b) >= target:
            return n
        n += 1 if n < 40 else 8
    return None


def converged(rhat: float | None, ess: float | None) -> bool:
    """R-hat <= 1.01 and ESS >= 100 (a missing or NaN value fails)."""
    if rhat is None or ess is None:
        return False
    rhat, ess = float(rhat), float(ess)
    return math.isfinite(rhat) and math.isfinite(ess) and rhat <= RHAT_MAX and ess >= ESS_MIN


def convergence_gate(diagnostics: Iterable[tuple[float | None, float | None]]) -> dict[str, Any]:
    """Rule 3: ``passed`` when every ``(rhat, ess)`` the claim rests on converged.

    Returns:
        ``passed``, ``n`` (quantities), ``n_converged``, ``max_rhat``, ``min_ess``.
    """
    pairs = list(diagnostics)
    if not pairs:
        return {"passed": False, "n": 0, "n_converged": 0, "max_rhat": None, "min_ess": None}
    ok = [converged(r, e) for r, e in pairs]
    rhats = [float(r) for r, _ in pairs if r is not None and math.isfinite(float(r))]
    esses = [float(e) for _, e in pairs if e is not None and math.isfinite(float(e))]
    return {"passed": all(ok), "n": len(pairs), "n_converged": sum(ok),
            "max_rhat": max(rhats) if rhats else None, "min_ess": min(esses) if esses else None}


def locality_gate(rows: Iterable[Mapping[str, Any]] | None) -> dict[str, Any]:
    """Rule 3b: an SGLD verdict needs local chains too (:mod:`interp_toolkit.analyses.bif.locality`:
    the draws climbed at most 10% of the gap between the checkpoint's loss and the loss with the
    solution gone). ``rows`` are the locality rows the claim rests on (a ``local`` and a
    ``worst_climb`` value each); None: locality was never measured for them.

    Returns:
        ``passed``, ``measured``, ``n``, ``n_local``, ``worst_climb``.
    """
    if rows is None:
        return {"passed": False, "measured": False, "n": 0, "n_local": 0, "worst_climb": None}
    rows = list(rows)
    flags = [str(r["local"]) == "True" for r in rows]
    climbs = [float(r["worst_climb"]) for r in rows if r.get("worst_climb") not in (None, "", "nan")]
    return {"passed": bool(rows) and all(flags), "measured": bool(rows), "n": len(rows), "n_local": sum(flags),
            "worst_climb": max(climbs) if climbs else None}


def regate(verdict: str, why: str, gate: Mapping[str, Any]) -> tuple[str, str]:
    """A verdict read from SGLD estimates, after the locality gate: ``reproduced`` and ``not
    reproduced`` stand only on local chains; otherwise ``inconclusive``, saying why (unmeasured,
    or how many rows failed) and what it would take. ``inconclusive`` and ``not tested`` stay."""
    if gate["passed"]:
        climb = "n/a" if gate["worst_climb"] is None else f"{gate['worst_climb']:.1%}"
        return verdict, f"{why}; local chains ({gate['n_local']}/{gate['n']}, worst climb {climb} of the loss gap)"
    if verdict not in ("reproduced", "not reproduced"):
        return verdict, why
    if not gate["measured"]:
        return "inconclusive", (f"{verdict} on converged chains, but their locality was never measured (an SGLD "
                                "verdict needs local chains: re-measure the rows it reads with the locality gate, "
                                f"which bif, bif-lm and influence now record); {why}")
    climb = "n/a" if gate["worst_climb"] is None else f"{gate['worst_climb']:.0%}"
    return "inconclusive", (f"{verdict} on converged chains, but {gate['n'] - gate['n_local']} of {gate['n']} "
                            f"checkpoints' draws were not local (worst climb {climb} of the loss gap; at most 10%): "
                            f"re-measure at a local setting; {why}")


def after_peak(steps: Sequence[float], values: Sequence[float], by_magnitude: bool = True) -> dict[str, Any]:
    """Rule 4: where the peak (largest ``|value|``, or largest value) sits and whether any
    checkpoint comes after it (``observable``: a fall can be seen)."""
    if len(steps) != len(values) or not steps:
        raise UserError(f"after_peak needs as many values as steps (>= 1), got {len(steps)} and {len(values)}")
    order = sorted(range(len(steps)), key=lambda i: steps[i])
    keyed = [abs(values[i]) if by_magnitude else values[i] for i in order]
    peak = order[max(range(len(order)), key=lambda j: keyed[j])]
    last = order[-1]
    return {"peak_step": steps[peak], "last_step": steps[last], "observable": steps[peak] < steps[last],
            "after_peak": sum(1 for i in order if steps[i] > steps[peak])}


def observed(n_generalized: int) -> bool:
    """Rule 5: a claim about generalizing runs can be judged only if some run generalized."""
    return n_generalized > 0


def in_regime(verdict: str, regime: str) -> str:
    """``"reproduced in R1"``: the verdict with its regime."""
    if verdict not in VERDICTS:
        raise UserError(f"unknown verdict {verdict!r}; expected one of {VERDICTS}")
    return f"{verdict} in {regime}"


def holm_family(rows: Sequence[Mapping[str, Any]], key: str = "fisher_p") -> list[float]:
    """Holm-adjusted ``key`` of rows read together as one family."""
    from interp_toolkit.studies.common.statistics import holm_adjust

    return holm_adjust([float(r[key]) for r in rows])


__all__ = [
    "ALPHA", "ESS_MIN", "MIN_SEEDS", "POWER_MIN", "RHAT_MAX", "VERDICTS", "after_peak", "convergence_gate", "converged",
    "detection_power", "detects", "holm_family", "in_regime", "observed", "rate_verdict", "seeds_for_power",
]
