"""Class-to-class token influence: the quantities of the paper's language-model claims.

The claims are about specific token pairs: the influence of *induction* training tokens on
*induction* query tokens (rising and falling as induction heads form), and of *open*
delimiters on *close* ones against *close* on *open* (a sign flip). Each is one entry of the
``class:class`` reduction of the token-level BIF (:mod:`.lm`),

    influence(A -> B) = mean over train tokens of class A and query tokens of class B of
                        -Cov_w(loss of the train token, loss of the query token)
                      = -Cov_w(mean loss of class A train tokens, mean loss of class B query tokens),

computed here from the classes' mean losses at every draw (``LMBIFResult.train_class_means``
/ ``query_class_means``, ``[chains, draws, classes]``): the pooled estimate over all chains'
draws (population covariance, as everywhere in the toolkit), its leave-one-chain-out
jackknife standard error, and the split R-hat and ``min(bulk, tail)`` ESS of its product
trace ``(a_t - a_bar)(b_t - b_bar)`` (:mod:`.diagnostics`). A *difference* of two such
influences (e.g. ``open->close`` minus ``close->open``) gets its error from the jackknife of
the difference itself (both terms come from the same draws, so their errors are correlated),
and its R-hat / ESS from the difference of the product traces.

Names: a pair is written ``"A->B"`` (``"A:B"`` is accepted), a difference ``"A->B - C->D"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from interp_toolkit.errors import UserError

from .diagnostics import ess_bulk, ess_tail, jackknife_stderr, split_rhat

__all__ = [
    "check_claim_classes",
    "ClassInfluence",
    "DEFAULT_CLAIMS",
    "class_influence",
    "claim_influences",
    "influence_from_class_means",
    "parse_claim",
]

#: The paper's claim quantities on the induction/delimiter corpus (and on any text whose
#: token classes include ``induction``, ``open`` and ``close``).
DEFAULT_CLAIMS = ("induction->induction", "open->close", "close->open", "open->close - close->open")


@dataclass
class ClassInfluence:
    """One class-to-class influence (or a difference of two) at one checkpoint.

    Attributes:
        name: ``"A->B"`` or ``"A->B - C->D"``.
        source, target: Train and query class of the (first) pair.
        minus: The subtracted pair ``"C->D"`` (``None`` for a plain influence).
        bif: The pooled ``-Cov`` (negative: up-weighting class-A training tokens lowers the
            class-B query loss).
        stderr: Leave-one-chain-out jackknife standard error (NaN with one chain).
        rhat: Rank-normalized split R-hat of the product trace.
        ess: ``min(bulk ESS, tail ESS)`` of the product trace, over all chains.
        leave_one_out: The ``chains`` leave-one-chain-out estimates.
    """

    name: str
    source: str
    target: str
    minus: str | None
    bif: float
    stderr: float
    rhat: float
    ess: float
    leave_one_out: Float[Tensor, " chains"]

    @property
    def relative_error(self) -> float:
        """``stderr / |bif|`` (inf at 0)."""
        return self.stderr / abs(self.bif) if self.bif != 0 else math.inf


def parse_claim(name: str) -> tuple[tuple[str, str], tuple[str, str] | None]:
    """``"A->B"`` -> ``((A, B), None)``; ``"A->B - C->D"`` -> ``((A, B), (C, D))``.

    Raises:
        ValueError: Not of those forms (names the expected syntax).
    """
    if not isinstance(name, str):
        raise UserError(f"claim must be a string like 'induction->induction', got {name!r}")

    def pair(text: str) -> tuple[str, str]:
        text = text.strip()
        for sep in ("->", ":"):
            if sep in text:
                source, _, target = text.partition(sep)
                if source.strip() and target.strip() and sep not in target:
                    return source.strip(), target.strip()
        raise UserError(f"claim {name!r}: {text!r} is not a class pair 'SOURCE->TARGET' (or 'SOURCE:TARGET')")

    first, sep, second = name.partition(" - ")
    return pair(first), (pair(second) if sep else None)


def check_claim_classes(claim: str, pair: tuple[str, str], train_classes: Sequence[str],
                        query_classes: Sequence[str]) -> None:
    """Raise ``ValueError`` naming the claim, the missing class and the classes present unless
    ``pair``'s source class is among ``train_classes`` and its target among ``query_classes``."""
    source, target = pair
    if source not in train_classes:
        raise UserError(f"claim {claim!r}: no training tokens of class {source!r}; the recorded training "
                         f"tokens have classes {list(train_classes)}")
    if target not in query_classes:
        raise UserError(f"claim {claim!r}: no query tokens of class {target!r}; the recorded query tokens "
                         f"have classes {list(query_classes)}")


def _canonical(pair: tuple[str, str]) -> str:
    return f"{pair[0]}->{pair[1]}"


def _pair_pieces(a: Tensor, b: Tensor) -> tuple[float, Tensor, Tensor]:
    """Estimate, leave-one-chain-out estimates and product trace of ``-Cov(a, b)`` from
    ``[chains, draws]`` traces (population covariance over the pooled draws)."""
    a, b = a.double(), b.double()
    chains = a.shape[0]
    product = (a - a.mean()) * (b - b.mean())
    estimate = -float(product.mean())
    loo = torch.empty(chains, dtype=torch.float64)
    for left_out in range(chains):
        keep = [c for c in range(chains) if c != left_out]
        ak, bk = a[keep], b[keep]
        loo[left_out] = -((ak - ak.mean()) * (bk - bk.mean())).mean()
    return estimate, loo, product


def influence_from_class_means(
    train_class_means: Float[Tensor, "chains draws k_a"],
    query_class_means: Float[Tensor, "chains draws k_b"],
    train_labels: Sequence[str],
    query_labels: Sequence[str],
    claim: str,
) -> ClassInfluence:
    """One claim quantity from the classes' mean losses at every draw.

    Args:
        train_class_means, query_class_means: Mean loss of each train / query class at
            every draw.
        train_labels, query_labels: Class names of their last axis.
        claim: ``"A->B"`` or ``"A->B - C->D"`` (:func:`parse_claim`).

    Returns:
        The :class:`ClassInfluence`.

    Raises:
        ValueError: Bad shapes, or a class that is not among the labels (names the classes
            there are).
    """
    first, second = parse_claim(claim)
    if train_class_means.ndim != 3 or query_class_means.ndim != 3 or \
            train_class_means.shape[:2] != query_class_means.shape[:2]:
        raise UserError(f"class means must be [chains, draws, classes] with equal chains and draws, got "
                         f"{tuple(train_class_means.shape)} and {tuple(query_class_means.shape)}")
    train_labels, query_labels = list(train_labels), list(query_labels)
    if train_class_means.shape[-1] != len(train_labels) or query_class_means.shape[-1] != len(query_labels):
        raise UserError(f"{len(train_labels)} / {len(query_labels)} labels for {train_class_means.shape[-1]} / "
                         f"{query_class_means.shape[-1]} classes")

    def pieces(pair: tuple[str, str]) -> tuple[float, Tensor, Tensor]:
        source, target = pair
        check_claim_classes(claim, pair, train_labels, query_labels)
        return _pair_pieces(train_class_means[..., train_labels.index(source)],
                            query_class_means[..., query_labels.index(target)])

    estimate, loo, product = pieces(first)
    name = _canonical(first)
    if second is not None:
        estimate2, loo2, product2 = pieces(second)
        estimate, loo, product = estimate - estimate2, loo - loo2, product - product2
        name = f"{name} - {_canonical(second)}"
    trace = product.numpy()
    chains = trace.shape[0]
    rhat = split_rhat(trace) if chains > 1 else float("nan")
    ess = min(ess_bulk(trace), ess_tail(trace))
    stderr = float(jackknife_stderr(loo[:, None])[0]) if chains > 1 else float("nan")
    return ClassInfluence(name=name, source=first[0], target=first[1],
                          minus=None if second is None else _canonical(second), bif=estimate, stderr=stderr,
                          rhat=float(rhat), ess=float(ess), leave_one_out=loo)


def class_influence(result: Any, claim: str) -> ClassInfluence:
    """One claim quantity of an :class:`~interp_toolkit.analyses.bif.lm.LMBIFResult`.

    Args:
        result: A token-level BIF result (sampled by :func:`~.lm.lm_bif`, or loaded).
        claim: ``"A->B"`` (influence of class-A training tokens on class-B query tokens) or
            ``"A->B - C->D"``.

    Raises:
        ValueError: The result has no per-draw class means (an older format: recompute),
            is a ``-Corr`` result, or lacks a class.
    """
    if getattr(result, "train_class_means", None) is None or getattr(result, "query_class_means", None) is None:
        raise UserError("this LM BIF result has no per-draw class mean losses (saved by an older version): "
                         "recompute it with lm_bif")
    if getattr(result, "pearson", False):
        raise UserError("class influences are -Cov; this result is -Corr (sampler.pearson=True): rerun without it")
    return influence_from_class_means(result.train_class_means, result.query_class_means,
                                      result.train_class_labels, result.query_class_labels, claim)


def claim_influences(result: Any, claims: Sequence[str] = DEFAULT_CLAIMS) -> list[ClassInfluence]:
    """:func:`class_influence` for every claim (in order)."""
    return [class_influence(result, claim) for claim in claims]
