"""Locality of SGLD draws: do they still describe the checkpoint's solution?

A BIF at a checkpoint is a covariance over a *localized* posterior. Converged chains
(:mod:`.diagnostics`) only say that the chains agree with each other; they can agree on a
cloud of models that no longer solve the task (the localization term alone setting the
cloud's size). Locality is measured on every estimate beside convergence:

* **climb**: the draws' mean loss on the posterior data, as the fraction of the gap between
  the checkpoint's loss and a *reference* loss that means "the solution is gone" that the
  draws climbed: ``(mean draw loss - checkpoint loss) / (reference - checkpoint loss)``.
  References: the label-marginal cross-entropy for a classifier (the loss of the best
  constant prediction: ``ln 2`` on balanced binary labels; :func:`label_marginal_loss`), the
  unigram entropy for a language model (:func:`unigram_loss`), the zero map's loss for a
  regression (the deep linear network).
* **radius**: the mean distance ``||w - w*||`` of the draws against the prior-only radius
  ``sqrt(d / gamma)`` (the width of the localization term alone over ``d`` sampled
  parameters): a ratio near 1 means the localization term, not the likelihood, sets the
  cloud's size. Reported, not gated: in a network of 34k parameters most directions are flat,
  so a cloud that keeps 100% accuracy and climbs 0.1% of the gap sits at 1.01 x the radius too
  (measured, docs/bif.md, "Locality"); the radius says *what* holds the cloud, the
  climb whether the cloud still solves the task.
* **accuracy** (classifiers): the draws' mean accuracy on the posterior data against the
  checkpoint's.

The gate (:data:`CLIMB_MAX`): every chain climbed at most 10% of the gap (docs/influence.md,
"Locality", gives the measurements behind it: at the old ``bif`` defaults the draws of a
1-layer majority model climbed 127% of it, at accuracy 72%; at a local setting 0.1%, at 100%).
:func:`sampling_verdict` joins it with convergence into the one label every summary prints:
``converged and local``, ``converged, not local`` or ``not converged``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float
from torch import Tensor

from interp_toolkit.errors import UserError

from .config import CLIMB_MAX

if TYPE_CHECKING:
    from .config import SamplerConfig
    from .sampler import SamplerDiagnostics

__all__ = [
    "CLIMB_MAX", "GAP_FLOOR", "LOCALITY_ADVICE", "Locality", "VERDICTS", "label_marginal_loss", "locality_of",
    "loss_gap", "measure_locality", "sampling_verdict", "unigram_loss",
]

#: The smallest gap the climb is a fraction of, as a fraction of the reference loss (a checkpoint
#: that has learned almost nothing has a vanishing gap: an early deep-linear-network checkpoint).
GAP_FLOOR = 0.10
#: The three labels of :func:`sampling_verdict`.
VERDICTS = ("converged and local", "converged, not local", "not converged")

LOCALITY_ADVICE = ("raise gamma (the localization; the commands' default derives it per checkpoint, "
                   "analyses.bif.localize) and lower eps with it (eps x gamma about 0.1)")


@dataclass
class Locality:
    """How far the draws of a localized posterior moved from the checkpoint's solution.

    Attributes:
        checkpoint_loss: The posterior data's loss at ``w*``.
        reference_loss: The loss that means "the solution is gone" (NaN: none given).
        reference: What the reference is (e.g. ``"label-marginal cross-entropy"``).
        draw_loss: Per chain, the mean loss of the draws on the posterior data.
        climb: Per chain, ``(draw_loss - checkpoint_loss) / (reference_loss - checkpoint_loss)``.
        distance: Per chain, the draws' mean ``||w - w*||``.
        prior_radius: ``sqrt(d / gamma)`` (inf for gamma 0).
        n_parameters: ``d``, the number of sampled parameters.
        checkpoint_accuracy: The posterior data's accuracy at ``w*`` (None: not a classifier).
        draw_accuracy: Per chain, the draws' mean accuracy (None: not a classifier).
        climb_max: The gate's threshold.
        notes: What the numbers need read with them.
    """

    checkpoint_loss: float
    reference_loss: float
    reference: str
    draw_loss: list[float]
    climb: list[float]
    distance: list[float]
    prior_radius: float
    n_parameters: int
    checkpoint_accuracy: float | None = None
    draw_accuracy: list[float] | None = None
    climb_max: float = CLIMB_MAX
    notes: list[str] = field(default_factory=list)

    @property
    def mean_climb(self) -> float:
        """The climb of all draws together (chains weigh equally: they have as many draws)."""
        return _mean(self.climb)

    @property
    def worst_climb(self) -> float:
        """The largest climb of any chain (NaN without a reference)."""
        finite = [c for c in self.climb if math.isfinite(c)]
        return max(finite) if len(finite) == len(self.climb) and finite else float("nan")

    @property
    def radius_ratio(self) -> list[float]:
        """Per chain, the mean distance over the prior-only radius (0 for gamma 0)."""
        return [d / self.prior_radius if math.isfinite(self.prior_radius) else 0.0 for d in self.distance]

    @property
    def worst_radius_ratio(self) -> float:
        """The largest radius ratio of any chain."""
        return max(self.radius_ratio)

    @property
    def failed(self) -> list[str]:
        """What failed the gate, with its value and threshold (empty: local)."""
        out = []
        if not math.isfinite(self.worst_climb):
            out.append("loss climb unmeasured (no reference loss)")
        elif self.worst_climb > self.climb_max:
            worst = max(range(len(self.climb)), key=lambda c: self.climb[c])
            out.append(f"loss climb {self.worst_climb:.1%} of the gap to the {self.reference} in chain {worst} "
                       f"(at most {self.climb_max:.0%})")
        return out

    @property
    def local(self) -> bool:
        """Every chain climbed at most ``climb_max`` of the gap."""
        return not self.failed

    def describe(self) -> str:
        """One line: the numbers of the gate and whether it passed."""
        accuracy = ""
        if self.checkpoint_accuracy is not None and self.draw_accuracy is not None:
            accuracy = f"; accuracy {_mean(self.draw_accuracy):.1%} (checkpoint {self.checkpoint_accuracy:.1%})"
        head = "local" if self.local else "NOT local: " + "; ".join(self.failed)
        return (f"{head} (draws' loss {_mean(self.draw_loss):.4g} against {self.checkpoint_loss:.4g} at the checkpoint "
                f"and {self.reference_loss:.4g} for the {self.reference}: climbed {self.mean_climb:.1%} of the gap; "
                f"||w - w*|| {_mean(self.distance):.3g} = {_mean(self.radius_ratio):.2f} x sqrt(d / gamma)"
                f"{accuracy})")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (NaN and inf as None), with the derived numbers and the verdict."""
        return _clean({
            "local": self.local, "failed": self.failed, "reference": self.reference,
            "checkpoint_loss": self.checkpoint_loss, "reference_loss": self.reference_loss,
            "draw_loss": self.draw_loss, "mean_draw_loss": _mean(self.draw_loss),
            "climb": self.climb, "mean_climb": self.mean_climb, "worst_climb": self.worst_climb,
            "distance": self.distance, "mean_distance": _mean(self.distance), "prior_radius": self.prior_radius,
            "radius_ratio": self.radius_ratio, "worst_radius_ratio": self.worst_radius_ratio,
            "n_parameters": self.n_parameters, "checkpoint_accuracy": self.checkpoint_accuracy,
            "draw_accuracy": self.draw_accuracy,
            "mean_draw_accuracy": None if self.draw_accuracy is None else _mean(self.draw_accuracy),
            "climb_max": self.climb_max, "notes": self.notes,
        })

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Locality":
        """Inverse of :meth:`to_dict` (None read back as NaN / inf where a number is expected)."""
        def num(value: Any, missing: float = float("nan")) -> float:
            return missing if value is None else float(value)

        return cls(
            checkpoint_loss=num(data["checkpoint_loss"]), reference_loss=num(data["reference_loss"]),
            reference=str(data["reference"]), draw_loss=[num(v) for v in data["draw_loss"]],
            climb=[num(v) for v in data["climb"]], distance=[num(v) for v in data["distance"]],
            prior_radius=num(data["prior_radius"], float("inf")), n_parameters=int(data["n_parameters"]),
            checkpoint_accuracy=data.get("checkpoint_accuracy"),
            draw_accuracy=None if data.get("draw_accuracy") is None else [num(v) for v in data["draw_accuracy"]],
            climb_max=float(data.get("climb_max", CLIMB_MAX)),
            notes=list(data.get("notes", [])),
        )


def measure_locality(
    draw_loss: Float[Tensor, "chains draws"],
    distance: Float[Tensor, "chains draws"],
    *,
    checkpoint_loss: float,
    reference_loss: float | None,
    reference: str,
    n_parameters: int,
    gamma: float,
    draw_accuracy: Float[Tensor, "chains draws"] | None = None,
    checkpoint_accuracy: float | None = None,
    climb_max: float = CLIMB_MAX,
) -> Locality:
    """The :class:`Locality` of a set of draws.

    Args:
        draw_loss: The posterior data's loss at every draw (the sampler's
            ``SamplerDiagnostics.draw_loss``).
        distance: ``||w - w*||`` at every draw.
        checkpoint_loss: The posterior data's loss at ``w*``.
        reference_loss: The loss meaning "the solution is gone"; None leaves the climb
            unmeasured (the gate then fails, saying so).
        reference: What the reference is, for messages.
        n_parameters: ``d``, the number of sampled parameters.
        gamma: The localization strength (``sqrt(d / gamma)`` is the prior-only radius).
        draw_accuracy, checkpoint_accuracy: The same for accuracy (classifiers).
        climb_max: The gate's threshold.

    Raises:
        UserError: Shapes that disagree.
    """
    draw_loss, distance = torch.as_tensor(draw_loss).double(), torch.as_tensor(distance).double()
    if draw_loss.ndim != 2 or draw_loss.shape != distance.shape:
        raise UserError(f"draw_loss and distance must both be [chains, draws], got {tuple(draw_loss.shape)} and "
                        f"{tuple(distance.shape)}")
    notes = []
    if reference_loss is None or not math.isfinite(reference_loss):
        reference_loss = float("nan")
        climb = [float("nan")] * draw_loss.shape[0]
    else:
        gap, floored = loss_gap(float(checkpoint_loss), float(reference_loss))
        if floored:
            notes.append(f"the checkpoint's loss {checkpoint_loss:.4g} is within {GAP_FLOOR:.0%} of the {reference} "
                         f"{reference_loss:.4g} (it has learned little): the climb is a fraction of "
                         f"{GAP_FLOOR:.0%} of the reference, not of the gap")
        climb = ((draw_loss.mean(1) - float(checkpoint_loss)) / gap).tolist()
    radius = math.sqrt(n_parameters / gamma) if gamma > 0 else float("inf")
    accuracy = None if draw_accuracy is None else torch.as_tensor(draw_accuracy).double().mean(1).tolist()
    return Locality(
        checkpoint_loss=float(checkpoint_loss), reference_loss=float(reference_loss), reference=reference,
        draw_loss=draw_loss.mean(1).tolist(), climb=climb, distance=distance.mean(1).tolist(), prior_radius=radius,
        n_parameters=int(n_parameters), checkpoint_accuracy=checkpoint_accuracy, draw_accuracy=accuracy,
        climb_max=climb_max, notes=notes,
    )


def loss_gap(checkpoint_loss: float, reference_loss: float) -> tuple[float, bool]:
    """``(gap, floored)``: the loss gap a climb is a fraction of, ``reference - checkpoint``,
    floored at :data:`GAP_FLOOR` of the reference (``floored`` then True). A checkpoint that
    has learned (almost) nothing holds no solution to leave, and a fraction of a vanishing gap
    would be noise; the gate and the gamma ladder (:mod:`.localize`) read the same gap."""
    gap = reference_loss - checkpoint_loss
    floor = GAP_FLOOR * abs(reference_loss)
    if gap < floor:
        return max(floor, 1e-12), True
    return gap, False


def locality_of(diagnostics: "SamplerDiagnostics", config: "SamplerConfig", reference_loss: float | None,
                reference: str) -> Locality:
    """The :class:`~.locality.Locality` of a sampler run's draws (its ``draw_loss``,
    ``draw_distance`` and ``draw_accuracy``)."""
    assert diagnostics.draw_loss is not None and diagnostics.draw_distance is not None  # sample_sgld fills them
    return measure_locality(
        diagnostics.draw_loss, diagnostics.draw_distance, checkpoint_loss=diagnostics.initial_loss,
        reference_loss=reference_loss, reference=reference, n_parameters=int(diagnostics.n_parameters or 0),
        gamma=config.gamma, draw_accuracy=diagnostics.draw_accuracy,
        checkpoint_accuracy=diagnostics.initial_accuracy)


def sampling_verdict(converged: bool, locality: Locality | None) -> str:
    """``converged and local``, ``converged, not local`` or ``not converged`` (no locality
    measured counts as not local: a verdict needs both gates)."""
    if not converged:
        return VERDICTS[2]
    return VERDICTS[0] if locality is not None and locality.local else VERDICTS[1]


def label_marginal_loss(labels: Tensor, n_classes: int | None = None) -> float:
    """The cross-entropy of the best constant prediction (the empirical label distribution):
    a classifier's loss once its solution is gone (``ln 2`` for balanced binary labels)."""
    labels = torch.as_tensor(labels).reshape(-1).long()
    if labels.numel() == 0:
        raise UserError("label_marginal_loss needs at least one label")
    counts = torch.bincount(labels, minlength=n_classes or 0).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


def unigram_loss(tokens: Tensor) -> float:
    """The per-token cross-entropy of the unigram distribution of the predicted tokens
    (every token after the first of each row): a language model's loss once everything it
    learned beyond token frequencies is gone."""
    tokens = torch.as_tensor(tokens)
    targets = (tokens[:, 1:] if tokens.ndim == 2 else tokens).reshape(-1).long()
    return label_marginal_loss(targets)


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value
