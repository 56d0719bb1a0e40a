"""Does the BIF mean something? Leave-one-out and causal-window checks on the deep
linear network (:mod:`interp_toolkit.tasks.dln`).

Sign convention (same as :mod:`interp_toolkit.analyses.bif`): ``BIF(z_i, phi)`` is the
change of ``E[phi]`` per unit *up-weighting* of ``z_i``. The measured counterpart here is
the **inclusion effect**::

    inclusion_effect[i, j] = loss_j(trained with z_i) - loss_j(trained without z_i)

so a negative value means "training on z_i lowers the loss of query j", like a negative
BIF. Removing an example sets its weight to 0 with the loss normalizer kept at ``P``.

Three measurements: :func:`retrain_leave_one_out_effects` (the paper's: retrain from the
same initialization without ``z_i``), :func:`causal_window_effects` (retrain from the same
initialization with ``z_i`` removed only inside a window of steps) and
:func:`local_continuation_effects` (cheaper: continue a few steps from a checkpoint with
and without ``z_i``). All retraining here is plain full-batch gradient descent, vectorized over the
``n + 1`` variants (all examples, and each example left out) with closed-form gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from interp_toolkit.errors import UserError
from interp_toolkit.tasks.dln import DeepLinearNetwork, weighted_steps

__all__ = [
    "CausalWindowResult",
    "batched_gradient_descent",
    "causal_window_effects",
    "compare_windows",
    "local_continuation_effects",
    "retrain_leave_one_out_effects",
    "pearson",
    "spearman",
]


def batched_gradient_descent(
    W1: Float[Tensor, "K hidden n_in"],
    W2: Float[Tensor, "K n_out hidden"],
    inputs: Float[Tensor, "P n_in"],
    targets: Float[Tensor, "P n_out"],
    lr: float,
    steps: int,
    example_weights: Float[Tensor, "K P"] | Callable[[int], Tensor] | None = None,
    start_step: int = 0,
) -> tuple[Float[Tensor, "K hidden n_in"], Float[Tensor, "K n_out hidden"]]:
    """``K`` independent DLNs trained by full-batch GD at once (closed-form gradients).

    Same update as :func:`interp_toolkit.tasks.dln.gradient_descent` on
    ``(1/P) sum_i c_i 1/2 ||y_i - W2 W1 x_i||^2``, for each of the ``K`` weightings.

    Args:
        W1, W2: Initial weights per variant (not modified).
        inputs, targets: The full batch.
        lr: Learning rate.
        steps: GD steps.
        example_weights: ``[K, P]`` weights, or ``step -> [K, P]``; default all ones.
        start_step: Step counter of the first step (passed to a weights function).

    Returns:
        The trained ``(W1, W2)``.
    """
    W1 = W1.detach().clone().double()
    W2 = W2.detach().clone().double()
    X, Y = inputs.double(), targets.double()
    P = X.shape[0]
    K = W1.shape[0]
    for _, c in weighted_steps(steps, example_weights, start_step):
        c = torch.ones(K, P, dtype=torch.float64) if c is None else c.double()
        hidden = torch.einsum("khi,pi->kph", W1, X)
        residual = (torch.einsum("koh,kph->kpo", W2, hidden) - Y) * (c[:, :, None] / P)
        grad_W2 = torch.einsum("kpo,kph->koh", residual, hidden)
        grad_W1 = torch.einsum("kpo,koh,pi->khi", residual, W2, X)
        W1 = W1 - lr * grad_W1
        W2 = W2 - lr * grad_W2
    return W1, W2


def _losses(W1: Tensor, W2: Tensor, inputs: Tensor, targets: Tensor) -> Float[Tensor, "K P"]:
    pred = torch.einsum("koh,khi,pi->kpo", W2, W1, inputs.double())
    return 0.5 * ((pred - targets.double()) ** 2).sum(-1)


def _stack(model: DeepLinearNetwork, K: int) -> tuple[Tensor, Tensor]:
    W1 = model.W1.weight.detach().double()
    W2 = model.W2.weight.detach().double()
    return W1.expand(K, *W1.shape).clone(), W2.expand(K, *W2.shape).clone()


def retrain_leave_one_out_effects(
    initial_model: DeepLinearNetwork,
    inputs: Float[Tensor, "P n_in"],
    targets: Float[Tensor, "P n_out"],
    lr: float,
    steps: list[int],
) -> Float[Tensor, "checkpoints P P"]:
    """Leave-one-out by retraining (the paper's): train from the same initialization with
    and without each example, and compare the query losses at each of ``steps``.

    Args:
        initial_model: The model at step 0 of the run (its initialization).
        inputs, targets: The full batch.
        lr: Learning rate of the run.
        steps: Checkpoint steps (>= 0) at which to measure, in any order.

    Returns:
        ``inclusion_effect[c, i, j] = loss_j(all, step c) - loss_j(without i from step 0,
        step c)``, in the order of ``steps``.
    """
    if not steps or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in steps):
        raise UserError(f"steps must be a non-empty list of integers >= 0, got {steps!r}")
    P = inputs.shape[0]
    weights = torch.ones(P + 1, P, dtype=torch.float64)
    weights[1:] -= torch.eye(P, dtype=torch.float64)  # variant 1 + i drops example i
    W1, W2 = _stack(initial_model, P + 1)
    effects: dict[int, Tensor] = {}
    done = 0
    for step in sorted(set(steps)):
        W1, W2 = batched_gradient_descent(W1, W2, inputs, targets, lr, step - done, weights)
        done = step
        losses = _losses(W1, W2, inputs, targets)
        effects[step] = losses[0][None, :] - losses[1:]
    return torch.stack([effects[s] for s in steps])


def local_continuation_effects(
    model: DeepLinearNetwork,
    inputs: Float[Tensor, "P n_in"],
    targets: Float[Tensor, "P n_out"],
    lr: float,
    steps: int,
) -> Float[Tensor, "P P"]:
    """Local-continuation leave-one-out (a cheaper variant, not the paper's retraining):
    continue training from ``model`` for ``steps`` with and without each example.

    Returns:
        ``inclusion_effect[i, j] = loss_j(all) - loss_j(without i)`` after ``steps`` steps.
    """
    P = inputs.shape[0]
    weights = torch.ones(P + 1, P, dtype=torch.float64)
    weights[1:] -= torch.eye(P, dtype=torch.float64)  # variant 1 + i drops example i
    W1, W2 = batched_gradient_descent(*_stack(model, P + 1), inputs, targets, lr, steps, weights)
    losses = _losses(W1, W2, inputs, targets)
    return losses[0][None, :] - losses[1:]


@dataclass
class CausalWindowResult:
    """Effects of removing each example during each window of training.

    Attributes:
        windows: ``(start, stop)`` steps of each window.
        horizon: Final step of the run.
        inclusion_effect: ``[windows, P, P]``: ``loss_j(baseline) - loss_j(example i
            removed during the window)``, measured at ``horizon`` or at the window's end.
        measure_at: ``"horizon"`` or ``"window_end"``.
    """

    windows: list[tuple[int, int]]
    horizon: int
    inclusion_effect: Float[Tensor, "windows P P"]
    measure_at: str = "horizon"


def causal_window_effects(
    initial_model: DeepLinearNetwork,
    inputs: Float[Tensor, "P n_in"],
    targets: Float[Tensor, "P n_out"],
    lr: float,
    windows: list[tuple[int, int]],
    horizon: int,
    measure_at: str = "horizon",
) -> CausalWindowResult:
    """Causal windows: retrain from the initialization with one example removed only
    during a window of GD steps, and measure the query losses.

    Args:
        initial_model: The model at step 0 of the run.
        inputs, targets: The full batch.
        lr: Learning rate of the run.
        windows: ``(start, stop)`` step windows, ``0 <= start < stop <= horizon``.
        horizon: Final step of the run.
        measure_at: ``"horizon"`` (losses at the end of the run, training normally after
            the window) or ``"window_end"`` (losses right at the end of the window, against
            the baseline at that step).

    Returns:
        The :class:`CausalWindowResult`.
    """
    if measure_at not in ("horizon", "window_end"):
        raise UserError(f"measure_at must be 'horizon' or 'window_end', got {measure_at!r}")
    for start, stop in windows:
        if not 0 <= start < stop <= horizon:
            raise UserError(f"window ({start}, {stop}) must satisfy 0 <= start < stop <= horizon={horizon}")
    P = inputs.shape[0]
    # Baseline states at every window boundary and at the horizon, in one pass.
    marks = sorted({0, horizon, *(s for w in windows for s in w)})
    states: dict[int, tuple[Tensor, Tensor]] = {}
    W1, W2 = _stack(initial_model, 1)
    step = 0
    for mark in marks:
        W1, W2 = batched_gradient_descent(W1, W2, inputs, targets, lr, mark - step)
        states[mark], step = (W1, W2), mark
    effects = []
    drop = torch.ones(P, P, dtype=torch.float64) - torch.eye(P, dtype=torch.float64)
    for start, stop in windows:
        W1, W2 = states[start]
        W1 = W1.expand(P, *W1.shape[1:]).clone()
        W2 = W2.expand(P, *W2.shape[1:]).clone()
        W1, W2 = batched_gradient_descent(W1, W2, inputs, targets, lr, stop - start, drop)
        end = stop if measure_at == "window_end" else horizon
        W1, W2 = batched_gradient_descent(W1, W2, inputs, targets, lr, end - stop)
        baseline = _losses(*states[end], inputs, targets)[0]
        effects.append(baseline[None, :] - _losses(W1, W2, inputs, targets))
    return CausalWindowResult(list(windows), horizon, torch.stack(effects), measure_at)


def pearson(x: Tensor, y: Tensor) -> float:
    """Pearson correlation of two flattened tensors."""
    x = x.double().reshape(-1)
    y = y.double().reshape(-1)
    return float(np.corrcoef(x.numpy(), y.numpy())[0, 1])


def spearman(x: Tensor, y: Tensor) -> float:
    """Spearman rank correlation of two flattened tensors (``scipy.stats.spearmanr``: tied
    values get their average rank; NaN when either input is constant)."""
    from scipy.stats import spearmanr

    x_np = x.detach().double().cpu().reshape(-1).numpy()
    y_np = y.detach().double().cpu().reshape(-1).numpy()
    if x_np.shape != y_np.shape:
        raise UserError(f"spearman needs inputs of one size, got {x_np.size} and {y_np.size}")
    if x_np.size < 2 or np.ptp(x_np) == 0 or np.ptp(y_np) == 0:
        return float("nan")
    return float(spearmanr(x_np, y_np).statistic)


def compare_windows(
    bif_per_window: Float[Tensor, "windows P Q"], effect_per_window: Float[Tensor, "windows P Q"]
) -> dict[str, float]:
    """Does the window where |BIF| peaks coincide with the window whose removal matters most?

    Returns:
        ``peak_agreement`` (fraction of (i, j) pairs whose argmax window over ``|BIF|``
        equals the argmax over ``|effect|``), ``peak_within_one`` (off by at most one
        window), ``chance`` (1 / windows), and ``mean_spearman`` across windows per pair.
    """
    W = bif_per_window.shape[0]
    b = bif_per_window.abs().reshape(W, -1)
    e = effect_per_window.abs().reshape(W, -1)
    pb, pe = b.argmax(0), e.argmax(0)
    rhos = [spearman(b[:, k], e[:, k]) for k in range(b.shape[1])]
    return {
        "peak_agreement": float((pb == pe).double().mean()),
        "peak_within_one": float(((pb - pe).abs() <= 1).double().mean()),
        "chance": 1.0 / W,
        "mean_spearman": float(np.nanmean(rhos)),
    }
