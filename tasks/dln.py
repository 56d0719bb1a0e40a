"""The two-layer deep linear network (DLN) model: the network on TransformerLens hooks, its
per-example loss, mode strengths, plain full-batch gradient descent and the analytic Saxe et
al. mode trajectories.

The model sits here, beside the hierarchical data it learns and below the analyses that use
it (:mod:`interp_toolkit.analyses.bif.validation`); the study-level parts (the trainer with
run records and checkpoints, phase labels for the BIF, MDS of hidden representations) are
in :mod:`interp_toolkit.studies.bif.dln`.

Model: ``y_hat = W2 (W1 x)`` with ``W1: [hidden, in]``, ``W2: [out, hidden]`` (no biases),
hook points ``hook_hidden`` (the hidden layer ``W1 x``) and ``hook_output``.

Training loss (full batch over ``P`` examples, optional per-example weights ``c_i``)::

    L(W) = (1/P) sum_i c_i * 1/2 ||y_i - W2 W1 x_i||^2

With one-hot inputs (``Sigma_x = I / P``) and a balanced, aligned start of strength ``a0``,
gradient descent with learning rate ``eta`` drives each SVD mode ``a(t) = u^T W2 W1 v`` of
the map along the logistic (Saxe, McClelland & Ganguli 2014, 2019)::

    a(t) = s e^{r t} / (e^{r t} - 1 + s / a0),   r = 2 eta lambda s,

with ``s`` the mode's target strength (singular value of ``Y^T``) and ``lambda = 1/P``.
Stronger modes (coarser hierarchy levels) are learned first.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from interp_toolkit.errors import UserError
from interp_toolkit.threads import with_threads

__all__ = [
    "DLNConfig",
    "DeepLinearNetwork",
    "dln_per_example_loss",
    "fit_initial_strength",
    "gradient_descent",
    "mode_strength_observable",
    "mode_strengths",
    "saxe_trajectory",
    "weighted_steps",
]


@dataclass
class DLNConfig:
    """Validated DLN shape and initialization.

    Attributes:
        n_in, n_hidden, n_out: Layer widths (>= 1).
        init_scale: Small-initialization scale (> 0): std of the random weights, or the
            initial mode strength ``a0`` of an aligned start.
        init: ``"random"`` (i.i.d. Gaussian, std ``init_scale``) or ``"aligned"`` (balanced
            start along the given SVD modes, each of strength ``init_scale``; needs
            ``modes`` in :meth:`DeepLinearNetwork.__init__`).
        seed: Seed of the random initialization.
    """

    n_in: int = 8
    n_hidden: int = 16
    n_out: int = 30
    init_scale: float = 1e-3
    init: str = "random"
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("n_in", "n_hidden", "n_out"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"DLNConfig.{name} must be a positive integer, got {value!r}")
        if not (isinstance(self.init_scale, (int, float)) and math.isfinite(self.init_scale) and self.init_scale > 0):
            raise UserError(f"DLNConfig.init_scale must be a finite number > 0, got {self.init_scale!r}")
        if self.init not in ("random", "aligned"):
            raise UserError(f"DLNConfig.init must be 'random' or 'aligned', got {self.init!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class DeepLinearNetwork(HookedRootModule):
    """``y = W2 W1 x`` with hook points on the hidden layer and the output."""

    def __init__(self, cfg: DLNConfig, modes: Any | None = None) -> None:
        """Build and initialize.

        Args:
            cfg: Shape and initialization.
            modes: An object with ``U [out, k]`` and ``V [in, k]`` (e.g.
                :class:`interp_toolkit.tasks.hierarchical.SVDModes`), required for
                ``init="aligned"``.
        """
        super().__init__()
        self.cfg = cfg
        self.W1 = nn.Linear(cfg.n_in, cfg.n_hidden, bias=False)
        self.W2 = nn.Linear(cfg.n_hidden, cfg.n_out, bias=False)
        self.hook_hidden = HookPoint()
        self.hook_output = HookPoint()
        self.setup()
        gen = torch.Generator().manual_seed(cfg.seed)
        with torch.no_grad():
            if cfg.init == "random":
                self.W1.weight.copy_(torch.randn(cfg.n_hidden, cfg.n_in, generator=gen) * cfg.init_scale)
                self.W2.weight.copy_(torch.randn(cfg.n_out, cfg.n_hidden, generator=gen) * cfg.init_scale)
            else:
                if modes is None:
                    raise UserError("DLNConfig.init='aligned' needs the SVD modes (modes=svd_modes(dataset))")
                U, V = modes.U.float(), modes.V.float()
                k = U.shape[1]
                if k > cfg.n_hidden or U.shape[0] != cfg.n_out or V.shape[0] != cfg.n_in:
                    raise UserError(
                        f"aligned init: modes U {tuple(U.shape)}, V {tuple(V.shape)} do not fit a "
                        f"{cfg.n_in}-{cfg.n_hidden}-{cfg.n_out} network"
                    )
                Q, _ = torch.linalg.qr(torch.randn(cfg.n_hidden, k, generator=gen))
                root = math.sqrt(cfg.init_scale)
                self.W1.weight.copy_(root * Q @ V.T)
                self.W2.weight.copy_(root * U @ Q.T)

    def forward(self, x: Float[Tensor, "batch n_in"]) -> Float[Tensor, "batch n_out"]:
        hidden = self.hook_hidden(self.W1(x))
        return self.hook_output(self.W2(hidden))

    def network_map(self) -> Float[Tensor, "n_out n_in"]:
        """The end-to-end linear map ``W2 W1``."""
        return self.W2.weight @ self.W1.weight


def dln_per_example_loss(
    model: nn.Module, batch: tuple[Float[Tensor, "batch n_in"], Float[Tensor, "batch n_out"]]
) -> Float[Tensor, " batch"]:
    """``1/2 ||y - model(x)||^2`` per example (a ``loss_fn`` for :mod:`analyses.bif`)."""
    x, y = batch
    return 0.5 * ((model(x) - y) ** 2).sum(-1)


def mode_strengths(model: DeepLinearNetwork, modes: Any) -> Float[Tensor, " k"]:
    """``a_k = u_k^T W2 W1 v_k`` for every SVD mode."""
    with torch.no_grad():
        W = model.network_map().double()
        return torch.einsum("ok,oi,ik->k", modes.U.double(), W, modes.V.double()).float()


def mode_strength_observable(modes: Any, which: list[int] | None = None) -> Callable[[nn.Module], Tensor]:
    """An observable ``model -> a[which]`` (mode strengths ``u_k^T W2 W1 v_k``), for
    recording at every SGLD draw (``bif(..., observables={"modes": ...})``)."""
    U, V = modes.U.float(), modes.V.float()
    index = list(range(U.shape[1])) if which is None else [int(k) for k in which]
    for k in index:
        if not 0 <= k < U.shape[1]:
            raise UserError(f"mode index {k} out of range: the data has {U.shape[1]} modes")
    U, V = U[:, index], V[:, index]

    def observable(model: nn.Module) -> Tensor:
        if not isinstance(model, DeepLinearNetwork):
            raise TypeError(f"mode_strength_observable needs a DeepLinearNetwork, got {type(model).__name__}")
        return torch.einsum("ok,oi,ik->k", U, model.network_map(), V)

    observable.__qualname__ = f"mode_strength_observable({index})"
    return observable


def saxe_trajectory(
    steps: Float[Tensor, " t"] | np.ndarray,
    target_strength: float,
    initial_strength: float,
    lr: float,
    input_variance: float,
) -> Float[Tensor, " t"]:
    """Analytic mode strength ``a(t)`` of a 2-layer linear network (Saxe et al.).

    Args:
        steps: Gradient-descent steps ``t`` (treated as continuous time ``eta * t``).
        target_strength: ``s``, the asymptotic strength (singular value of the map to learn).
        initial_strength: ``a0 > 0`` at ``t = 0`` (balanced, aligned start).
        lr: Learning rate ``eta``.
        input_variance: ``lambda`` with ``Sigma_x = lambda I``.

    Returns:
        ``s e^{rt} / (e^{rt} - 1 + s/a0)`` with ``r = 2 eta lambda s``.
    """
    t = torch.as_tensor(steps, dtype=torch.float64)
    s, a0 = float(target_strength), float(initial_strength)
    rate = 2.0 * lr * input_variance * s
    # Stable form: s / (1 + (s/a0 - 1) e^{-rt}).
    return (s / (1.0 + (s / a0 - 1.0) * torch.exp(-rate * t))).float()


def fit_initial_strength(
    steps: Float[Tensor, " t"] | np.ndarray,
    strengths: Float[Tensor, " t"] | np.ndarray,
    target_strength: float,
    lr: float,
    input_variance: float,
) -> float:
    """Effective ``a0`` of a random (unaligned) start, from the half-strength time.

    Solves ``a(t_half) = s/2`` for ``a0`` in :func:`saxe_trajectory`
    (``a0 = s / (1 + e^{r t_half})``), with ``t_half`` linearly interpolated.

    Raises:
        ValueError: The mode never reaches half its target strength.
    """
    t = np.asarray(torch.as_tensor(steps, dtype=torch.float64))
    a = np.asarray(torch.as_tensor(strengths, dtype=torch.float64))
    s = float(target_strength)
    above = np.nonzero(a >= s / 2)[0]
    if above.size == 0 or above[0] == 0:
        raise UserError("the mode never crosses half its target strength inside the given steps")
    j = above[0]
    t_half = t[j - 1] + (s / 2 - a[j - 1]) * (t[j] - t[j - 1]) / (a[j] - a[j - 1])
    rate = 2.0 * lr * input_variance * s
    return s / (1.0 + math.exp(rate * t_half))


def _one_thread(*args: Any, **kwargs: Any) -> int:
    return 1  # DLN steps are tiny: a second thread cost ~100x on a busy 2-core machine


def weighted_steps(
    steps: int, example_weights: Tensor | Callable[[int], Tensor] | None = None, start_step: int = 0
) -> Iterator[tuple[int, Tensor | None]]:
    """The steps of a full-batch GD run and the example weights ``c`` of each.

    The one step loop of every DLN trainer (:func:`gradient_descent`, and the vectorized
    retraining of :func:`interp_toolkit.analyses.bif.validation.batched_gradient_descent`).

    Args:
        steps: Number of steps.
        example_weights: ``c`` for every step, a function ``step -> c`` (e.g. removing an
            example only during a window of steps), or None (all ones).
        start_step: Step counter of the first step.

    Yields:
        ``(step, c)`` for ``step = start_step .. start_step + steps - 1``; ``c`` is None
        where every example has weight 1.
    """
    for offset in range(steps):
        step = start_step + offset
        yield step, example_weights(step) if callable(example_weights) else example_weights


@with_threads(_one_thread)  # 1 torch thread; the caller's count is restored on return
def gradient_descent(
    model: DeepLinearNetwork,
    inputs: Float[Tensor, "P n_in"],
    targets: Float[Tensor, "P n_out"],
    lr: float,
    steps: int,
    example_weights: Float[Tensor, " P"] | Callable[[int], Tensor] | None = None,
    start_step: int = 0,
    on_step: Callable[[int, DeepLinearNetwork], None] | None = None,
) -> list[float]:
    """Plain full-batch GD in place on ``(1/P) sum_i c_i 1/2 ||y_i - y_hat_i||^2``.

    Removing example ``i`` means ``c_i = 0`` with the normalizer kept at ``P``, so the
    other examples' gradients are unchanged.

    Args:
        model: Trained in place.
        inputs, targets: The full batch.
        lr: Learning rate.
        steps: Number of steps.
        example_weights: ``c`` (default all ones), or a function ``step -> c`` (for
            removing an example only during a window of steps).
        start_step: Step counter of the first step (for ``example_weights`` functions).
        on_step: Called as ``on_step(step_after, model)`` after every step.

    Returns:
        The loss before each step.
    """
    P = inputs.shape[0]
    losses = []
    params = [model.W1.weight, model.W2.weight]
    for step, weights in weighted_steps(steps, example_weights, start_step):
        for p in params:
            p.grad = None
        per_example = dln_per_example_loss(model, (inputs, targets))
        loss = (per_example if weights is None else per_example * weights).sum() / P
        loss.backward()
        losses.append(float(loss.detach()))
        if not math.isfinite(losses[-1]):
            raise FloatingPointError(f"DLN training diverged at step {step} (loss {losses[-1]}); lower lr (now {lr})")
        with torch.no_grad():
            for p in params:
                assert p.grad is not None  # loss.backward() above filled it
                p.add_(p.grad, alpha=-lr)
                p.grad = None
        if on_step is not None:
            on_step(step + 1, model)
    return losses
