"""The verdict engine: every claim of both papers judged from committed data by stated rules.

A verdict is one of :data:`VERDICTS` and names its regime R (the settings the runs share).
The rules, applied in this order:

1. **Scope**: a claim about 2-layer models is judged on 2-layer runs (1-layer cells may sit
   beside it as this project's variant, under their own claim). No run of the claim's kind in
   R: ``not tested in R``.
2. **Rate contrasts** (a generalization rate higher in one cell than in another): with the
   difference ``d = rate_a - rate_b``, the two-sided Fisher exact p (:data:`TEST`) and the 95%
   Newcombe interval beside it, the claim is ``reproduced in R`` only when the exact test
   rejects at :data:`ALPHA` and ``d`` has the paper's sign, with at least :data:`MIN_SEEDS`
   seeds per cell (fewer: ``inconclusive``). Otherwise it is ``not reproduced in R`` only when
   that same test had at least :data:`POWER_MIN` power to see the paper's effect at the cell
   sizes used *and* the runs trained to the paper's horizon (:data:`PAPER_HORIZON_EPOCHS`),
   else ``inconclusive in R``. Power is exact: both binomials are enumerated at the paper's
   rates and every table is put to the Fisher test (:func:`detection_power`); "seeds per cell
   for 80%" is computed for the same rule and never advises fewer than :data:`MIN_SEEDS`.
   A claim whose paper gives no rates is powered at an effect this project chose (named in
   the row).
2b. **Horizon**: the paper's criterion is met at any time within its horizon, so a count can
   only grow with training. Short of that horizon, an undetected contrast is ``not
   reproduced`` only where the cell the paper puts low already rejects the paper's rate for it
   (an exact one-sided binomial test at :data:`ALPHA`; at a paper rate of 0, any success):
   no longer training can restore that rate. Otherwise it is ``inconclusive``, "not reached
   within H epochs" when both cells sit at 0. Every row names its horizon.
2c. **Search seeds**: a row on the seeds of the search that selected its setting is
   ``exploratory`` whatever its numbers (a regime chosen on search seeds is decided on fresh
   ones); the numbers stay in the row.
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

# The convergence rule of every SGLD verdict is the sampler's own (analyses/bif/config.py).
from interp_toolkit.analyses.bif.config import ESS_MIN, RHAT_MAX
from interp_toolkit.errors import UserError
from interp_toolkit.studies.common.statistics import fisher_exact_p, newcombe_interval

#: The four verdicts (each followed by "in R").
VERDICTS = ("reproduced", "not reproduced", "inconclusive", "not tested", "exploratory")
#: Power a "not reproduced" needs (to see the paper's effect at the cell sizes used).
POWER_MIN = 0.8
ALPHA = 0.05
#: The exact test every rate verdict, its power and its seed advice rest on.
TEST = "two-sided Fisher exact test"
#: A signed SGLD estimate is "measured" at |z| >= this (paper B's sign, rise, fall and growth rules).
Z_MIN = 2.0
#: Checkpoints after the peak that a converged, unmeasured fall needs before it is "not
#: reproduced" (a fall that is there has room to show on a schedule like the testbed's).
MIN_AFTER_PEAK = 8
#: The shortcut-saturation paper's horizon: "100% adversarial accuracy at any time within
#: 15,000 epochs".
PAPER_HORIZON_EPOCHS = 15_000
#: Fewest seeds per cell for a rate verdict either way (the paper's effect sizes make a few
#: seeds look powerful, but a cell this small says little about a rate).
MIN_SEEDS = 8


def _check_cell(name: str, k: int, n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UserError(f"{name}: n must be an integer >= 1, got {n!r}")
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= n:
        raise UserError(f"{name}: k must be an integer in [0, n={n}], got {k!r}")


@functools.lru_cache(maxsize=512)
def fisher_table(n_a: int, n_b: int) -> tuple[tuple[float, ...], ...]:
    """Two-sided Fisher exact p of every table ``(k_a of n_a, k_b of n_b)``: ``[k_a][k_b]``.

    Conditional on the total ``K = k_a + k_b``, ``k_a`` is hypergeometric; the two-sided p sums
    the probabilities of the tables no more likely than the observed one (with scipy's relative
    tolerance of 1e-7 for ties), which is ``scipy.stats.fisher_exact``'s p (tested entry by entry).
    """
    import numpy as np
    from scipy.stats import hypergeom

    _check_cell("fisher_table", 0, n_a)
    _check_cell("fisher_table", 0, n_b)
    total = n_a + n_b
    table = np.ones((n_a + 1, n_b + 1))
    for k in range(total + 1):
        support = np.arange(max(0, k - n_b), min(k, n_a) + 1)
        pmf = hypergeom.pmf(support, total, n_a, k)
        # p of each observed k_a: the mass of every table at most as likely (row i of the matrix)
        p = np.where(pmf[None, :] <= pmf[:, None] * (1 + 1e-7), pmf[None, :], 0.0).sum(axis=1)
        table[support, k - support] = np.minimum(p, 1.0)
    return tuple(tuple(float(v) for v in row) for row in table)


def detects(k_a: int, n_a: int, k_b: int, n_b: int, sign: int) -> bool:
    """The detection rule: ``k_a/n_a - k_b/n_b`` has ``sign`` (+1 or -1) and the two-sided
    Fisher exact test rejects equal rates at :data:`ALPHA`."""
    _check_cell("cell a", k_a, n_a)
    _check_cell("cell b", k_b, n_b)
    diff = k_a / n_a - k_b / n_b
    return (diff > 0 if sign > 0 else diff < 0) and fisher_table(n_a, n_b)[k_a][k_b] < ALPHA


@functools.lru_cache(maxsize=4096)
def detection_power(n_a: int, n_b: int, p_a: float, p_b: float) -> float:
    """Exact probability that :func:`detects` sees ``p_a - p_b``'s sign when the true rates are
    ``p_a`` and ``p_b`` and the cells hold ``n_a`` and ``n_b`` seeds: the sum over every
    ``(k_a, k_b)`` of the two binomial probabilities where the Fisher test rejects with that sign.

    Raises:
        UserError: bad sizes or rates, or ``p_a == p_b`` (no effect to detect).
    """
    import numpy as np
    from scipy.stats import binom

    _check_cell("detection_power", 0, n_a)
    _check_cell("detection_power", 0, n_b)
    for name, p in (("p_a", p_a), ("p_b", p_b)):
        if not (isinstance(p, (int, float)) and 0.0 <= p <= 1.0):
            raise UserError(f"detection_power: {name} must be a rate in [0, 1], got {p!r}")
    if p_a == p_b:
        raise UserError(f"detection_power: the rates are equal ({p_a}); there is no effect to detect")
    sign = 1 if p_a > p_b else -1
    probs = np.outer(binom.pmf(range(n_a + 1), n_a, p_a), binom.pmf(range(n_b + 1), n_b, p_b))
    k_a, k_b = np.meshgrid(np.arange(n_a + 1), np.arange(n_b + 1), indexing="ij")
    diff = k_a / n_a - k_b / n_b
    hit = (np.asarray(fisher_table(n_a, n_b)) < ALPHA) & ((diff > 0) if sign > 0 else (diff < 0))
    return min(1.0, float(probs[hit].sum()))


def binomial_above(k: int, n: int, rate: float) -> float:
    """Exact one-sided binomial p of ``k`` or more successes in ``n`` at ``rate`` (0 successes
    are expected at a rate of 0, so any success gives p = 0)."""
    from scipy.stats import binom

    _check_cell("binomial_above", k, n)
    return float(binom.sf(k - 1, n, rate)) if k > 0 else 1.0


def rate_verdict(k_a: int, n_a: int, k_b: int, n_b: int, paper_a: float, paper_b: float, *,
                 horizon: float | None = None, paper_horizon: float = PAPER_HORIZON_EPOCHS) -> dict[str, Any]:
    """Rules 2 and 2b on one contrast: cell a (``k_a`` of ``n_a`` seeds succeeded) against cell
    b, the paper's rates ``paper_a`` and ``paper_b`` giving the sign and the effect to power.

    Args:
        horizon: Epochs the runs trained (their criterion could be met at any time up to it);
            None: the paper's horizon (a contrast of rates alone, no training behind it).
        paper_horizon: The paper's horizon in the same unit.

    Returns:
        ``verdict`` (without "in R"), ``difference``, ``low``, ``high`` (Newcombe), ``fisher_p``,
        ``power`` (of the Fisher rule at the paper's rates), ``test`` and ``why`` (one sentence).
    """
    _check_cell("cell a", k_a, n_a)
    _check_cell("cell b", k_b, n_b)
    if horizon is not None and not (isinstance(horizon, (int, float)) and horizon > 0):
        raise UserError(f"rate_verdict: horizon must be a positive number of epochs, got {horizon!r}")
    sign = 1 if paper_a > paper_b else -1
    diff, low, high = newcombe_interval(k_a, n_a, k_b, n_b)
    p = fisher_exact_p(k_a, n_a, k_b, n_b)
    power = detection_power(n_a, n_b, float(paper_a), float(paper_b))
    row = {"difference": diff, "low": low, "high": high, "fisher_p": p, "power": power, "test": TEST}
    short = horizon is not None and horizon < paper_horizon
    within = f" within {horizon:,.0f} epochs (the paper's horizon: {paper_horizon:,.0f})" if short else ""
    if min(n_a, n_b) < MIN_SEEDS:
        return {**row, "verdict": "inconclusive",
                "why": f"a cell of {min(n_a, n_b)} seed{'s' if min(n_a, n_b) != 1 else ''} "
                       f"(a rate verdict needs {MIN_SEEDS} per cell)"}
    if detects(k_a, n_a, k_b, n_b, sign):
        # The verdict is about the direction; whether the paper's size fits is said beside it.
        effect = float(paper_a) - float(paper_b)
        size = ("the paper's difference ({:+.2f}) lies inside the 95% interval" if low <= effect <= high
                else "the paper's difference ({:+.2f}) lies outside the 95% interval: the direction, not the "
                     "size").format(effect)
        return {**row, "verdict": "reproduced",
                "why": f"the Fisher exact test rejects equal rates (p = {p:.3g} < {ALPHA}) with the paper's "
                       f"sign{within}; {size}"}
    low_cell = (k_b, n_b, paper_b) if sign > 0 else (k_a, n_a, paper_a)
    rejects_low = binomial_above(*low_cell)
    if short:
        k, n, rate = low_cell
        if rejects_low < ALPHA:
            return {**row, "verdict": "not reproduced",
                    "why": f"not detected (Fisher p = {p:.3g}), and the cell the paper puts at {rate:.0%} already "
                           f"has {k}/{n}{within} (exact binomial p = {rejects_low:.2g}): a count that only grows "
                           "with training cannot return to the paper's rate at any horizon"}
        if k_a == k_b == 0:
            return {**row, "verdict": "inconclusive",
                    "why": f"not reached{within}: both cells at 0, so the contrast is undecided until the "
                           "runs train to the paper's horizon"}
        return {**row, "verdict": "inconclusive",
                "why": f"not detected (Fisher p = {p:.3g}){within}: the power at the paper's rates holds at its "
                       "horizon only"}
    if power >= POWER_MIN:
        return {**row, "verdict": "not reproduced",
                "why": f"not detected (Fisher p = {p:.3g}), with {power:.0%} power for the Fisher test to detect "
                       "the paper's effect at these cell sizes"}
    return {**row, "verdict": "inconclusive",
            "why": f"not detected (Fisher p = {p:.3g}), but the Fisher test had only {power:.0%} power to detect "
                   f"the paper's effect at these cell sizes (a 'not reproduced' needs {POWER_MIN:.0%})"}


def seeds_for_power(p_a: float, p_b: float, target: float = POWER_MIN, limit: int = 400) -> int | None:
    """The smallest equal cell size, at least :data:`MIN_SEEDS`, at which the Fisher rule has
    ``target`` power for ``p_a`` vs ``p_b`` (what an ``inconclusive`` would take), or None above
    ``limit`` seeds per cell."""
    n = MIN_SEEDS
    while n <= limit:
        if detection_power(n, n, p_a, p_b) >= target:
            return n
        n += 1 if n < 60 else 8
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
    "ALPHA", "ESS_MIN", "MIN_AFTER_PEAK", "MIN_SEEDS", "PAPER_HORIZON_EPOCHS", "POWER_MIN", "RHAT_MAX", "TEST",
    "VERDICTS", "after_peak", "binomial_above", "convergence_gate", "converged", "detection_power", "detects",
    "fisher_table", "holm_family", "in_regime", "observed", "rate_verdict", "seeds_for_power", "Z_MIN",
]
