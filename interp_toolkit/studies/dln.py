"""Two-layer deep linear network (DLN) on TransformerLens hooks, its full-batch gradient
descent trainer with log-spaced checkpoints, the analytic Saxe et al. mode trajectories,
and classical MDS of hidden representations.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor, nn
from tqdm.auto import tqdm
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from interp_toolkit.io import config_hash, load_artifact, save_artifact, tensor_digest
from interp_toolkit.runs.layout import CHECKPOINTS
from interp_toolkit.runs.record import is_finished, read_run_record, write_record
from interp_toolkit.threads import with_threads

__all__ = [
    "DLNConfig",
    "DLNRun",
    "DLNTrainConfig",
    "DeepLinearNetwork",
    "classical_mds",
    "dln_per_example_loss",
    "fit_initial_strength",
    "gradient_descent",
    "log_spaced_steps",
    "mode_phase_fn",
    "mode_strength_observable",
    "mode_strengths",
    "saxe_trajectory",
    "train_dln",
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
                raise ValueError(f"DLNConfig.{name} must be a positive integer, got {value!r}")
        if not (isinstance(self.init_scale, (int, float)) and math.isfinite(self.init_scale) and self.init_scale > 0):
            raise ValueError(f"DLNConfig.init_scale must be a finite number > 0, got {self.init_scale!r}")
        if self.init not in ("random", "aligned"):
            raise ValueError(f"DLNConfig.init must be 'random' or 'aligned', got {self.init!r}")

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
                    raise ValueError("DLNConfig.init='aligned' needs the SVD modes (modes=svd_modes(dataset))")
                U, V = modes.U.float(), modes.V.float()
                k = U.shape[1]
                if k > cfg.n_hidden or U.shape[0] != cfg.n_out or V.shape[0] != cfg.n_in:
                    raise ValueError(
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
            raise ValueError(f"mode index {k} out of range: the data has {U.shape[1]} modes")
    U, V = U[:, index], V[:, index]

    def observable(model: nn.Module) -> Tensor:
        W = model.W2.weight @ model.W1.weight
        return torch.einsum("ok,oi,ik->k", U, W, V)

    observable.__qualname__ = f"mode_strength_observable({index})"
    return observable


def mode_phase_fn(modes: Any, which: list[int] | None = None, fraction: float = 0.5) -> Callable[[nn.Module], int]:
    """A ``phase_fn`` for :func:`interp_toolkit.analyses.bif.bif`: which data modes a draw has learned.

    A mode ``k`` counts as learned when the network map projected on it,
    ``u_k^T W2 W1 v_k``, exceeds ``fraction`` of its target strength ``s_k / lambda``.
    The label is ``sum_m 2^m [mode which[m] learned]``
    (:func:`interp_toolkit.analyses.bif.threshold_phases`).

    Args:
        modes: :class:`interp_toolkit.tasks.hierarchical.SVDModes` of the data.
        which: Mode indices to classify by (default all).
        fraction: Threshold as a fraction of each target strength (default half strength).

    Returns:
        ``model -> int``.
    """
    from interp_toolkit.analyses.bif.phases import observable_phase_fn

    if not (isinstance(fraction, (int, float)) and 0 < fraction < 1):
        raise ValueError(f"fraction must be a number in (0, 1), got {fraction!r}")
    index = list(range(len(modes.S))) if which is None else [int(k) for k in which]
    observable = mode_strength_observable(modes, index)
    thresholds = fraction * modes.target_strengths[index].double()
    fn = observable_phase_fn(observable, thresholds)
    fn.__qualname__ = f"mode_phase_fn({index}, {fraction})"
    return fn


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
        raise ValueError("the mode never crosses half its target strength inside the given steps")
    j = above[0]
    t_half = t[j - 1] + (s / 2 - a[j - 1]) * (t[j] - t[j - 1]) / (a[j] - a[j - 1])
    rate = 2.0 * lr * input_variance * s
    return s / (1.0 + math.exp(rate * t_half))


def log_spaced_steps(total_steps: int, n_checkpoints: int) -> list[int]:
    """Step 0, ``total_steps`` and about ``n_checkpoints`` log-spaced steps in between."""
    if total_steps < 1 or n_checkpoints < 2:
        raise ValueError(f"need total_steps >= 1 and n_checkpoints >= 2, got {total_steps}, {n_checkpoints}")
    grid = np.geomspace(1, total_steps, n_checkpoints - 1)
    return sorted({0, total_steps, *(int(round(g)) for g in grid)})


@dataclass
class DLNTrainConfig:
    """Full-batch gradient-descent settings.

    Attributes:
        lr: Learning rate (> 0).
        steps: Gradient steps (>= 1).
        n_checkpoints: Approximate number of log-spaced checkpoints (>= 2; 0 and the last
            step always included).
        progress: Show a tqdm bar.
    """

    lr: float = 0.05
    steps: int = 2_000
    n_checkpoints: int = 40
    progress: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"DLNTrainConfig.lr must be a finite number > 0, got {self.lr!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"DLNTrainConfig.steps must be a positive integer, got {self.steps!r}")
        if isinstance(self.n_checkpoints, bool) or not isinstance(self.n_checkpoints, int) or self.n_checkpoints < 2:
            raise ValueError(f"DLNTrainConfig.n_checkpoints must be an integer >= 2, got {self.n_checkpoints!r}")

    def checkpoint_steps(self) -> list[int]:
        return log_spaced_steps(self.steps, self.n_checkpoints)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
                p.add_(p.grad, alpha=-lr)
                p.grad = None
        if on_step is not None:
            on_step(step + 1, model)
    return losses


@dataclass
class DLNRun:
    """A trained DLN and its checkpoints.

    Attributes:
        model: The model at the last step.
        checkpoints: ``step -> state dict`` (cloned tensors), at log-spaced steps.
        losses: Training loss before every step.
        run_dir: Where it was written (if any).
        resumed_from: Step the run resumed from, if it did.
        cache_hit: The run was already finished on disk and only loaded.
    """

    model: DeepLinearNetwork
    checkpoints: dict[int, dict[str, Tensor]]
    losses: list[float]
    run_dir: Path | None = None
    resumed_from: int | None = None
    cache_hit: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def model_at(self, step: int) -> DeepLinearNetwork:
        """A fresh model holding checkpoint ``step``."""
        model = _empty_like(self.model)
        model.load_state_dict(self.checkpoints[step])
        return model


def _empty_like(model: DeepLinearNetwork) -> DeepLinearNetwork:
    cfg = dataclasses.replace(model.cfg, init="random")
    out = DeepLinearNetwork(cfg)
    out.cfg = model.cfg
    return out


def _save_state(path: Path, model: DeepLinearNetwork, metadata: dict[str, Any]) -> None:
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    save_artifact(path, tensors, metadata, kind="dln_state")


@with_threads(_one_thread)  # 1 torch thread; the caller's count is restored on return
def train_dln(
    inputs: Float[Tensor, "P n_in"],
    targets: Float[Tensor, "P n_out"],
    model_cfg: DLNConfig,
    train_cfg: DLNTrainConfig,
    run_dir: str | Path | None = None,
    modes: Any | None = None,
) -> DLNRun:
    """Train a DLN by full-batch GD, keeping log-spaced checkpoints.

    With ``run_dir``, writes ``run.json`` (configs, key, status) and
    ``checkpoints/step_XXXXXX.safetensors`` atomically. A finished run with the same
    config is loaded, not retrained; an unfinished one resumes from its last checkpoint
    (plain GD is deterministic, so the result equals an uninterrupted run). A directory
    holding a different config raises ``ValueError``.

    Args:
        inputs, targets: The full batch.
        model_cfg, train_cfg: Model and optimization settings.
        run_dir: Optional output directory.
        modes: SVD modes, for ``init="aligned"``.

    Returns:
        The :class:`DLNRun`.
    """
    model = DeepLinearNetwork(model_cfg, modes=modes)
    identity = {
        "model": model_cfg.to_dict(),
        "train": {k: v for k, v in train_cfg.to_dict().items() if k != "progress"},
        "data": tensor_digest([inputs, targets]),
        "init_weights": tensor_digest(model.state_dict()),
    }
    key = config_hash(identity)
    ckpt_steps = train_cfg.checkpoint_steps()
    checkpoints: dict[int, dict[str, Tensor]] = {}
    losses: list[float] = []
    start = 0
    resumed_from = None
    if run_dir is not None:
        run_dir = Path(run_dir)
        record = read_run_record(run_dir, key)
        if record is not None:
            for step in ckpt_steps:
                path = run_dir / CHECKPOINTS / f"step_{step:06d}.safetensors"
                if path.exists():
                    checkpoints[step] = load_artifact(path, kind="dln_state")[0]
            losses = list(record.get("losses", []))
            if checkpoints:
                start = max(checkpoints)
                model.load_state_dict(checkpoints[start])
                losses = losses[:start]
                if is_finished(record) and start == train_cfg.steps:
                    return DLNRun(model, checkpoints, losses, run_dir, None, cache_hit=True)
                resumed_from = start if start > 0 else None
        write_record(run_dir, {**identity, "key": key, "status": "running", "losses": losses})

    def keep(step: int, current: DeepLinearNetwork) -> None:
        if step in ckpt_steps and step not in checkpoints:
            checkpoints[step] = {k: v.detach().clone() for k, v in current.state_dict().items()}
            if run_dir is not None:
                _save_state(run_dir / CHECKPOINTS / f"step_{step:06d}.safetensors", current, {"step": step})

    keep(start, model)
    bar = tqdm(total=train_cfg.steps - start, desc="DLN GD", disable=not train_cfg.progress, leave=False)

    def on_step(step: int, current: DeepLinearNetwork) -> None:
        bar.update(1)
        keep(step, current)

    losses += gradient_descent(model, inputs, targets, train_cfg.lr, train_cfg.steps - start, start_step=start, on_step=on_step)
    bar.close()
    if run_dir is not None:
        write_record(run_dir, {**identity, "key": key, "status": "finished", "losses": losses})
    return DLNRun(model, checkpoints, losses, run_dir, resumed_from)


def classical_mds(
    points: Float[Tensor, "n d"], n_components: int = 2
) -> tuple[Float[Tensor, "n k"], Float[Tensor, " k"]]:
    """Classical (Torgerson) multidimensional scaling of Euclidean distances.

    Args:
        points: One row per item (e.g. hidden representations).
        n_components: Output dimensions.

    Returns:
        ``(coordinates, eigenvalues)``: coordinates whose pairwise distances best match
        the input's (exactly, when the points span ``<= n_components`` dimensions), and the
        top eigenvalues of the double-centred Gram matrix (negative ones clipped to 0).
        Signs of axes are fixed so that each axis's largest-magnitude entry is positive.
    """
    X = points.double()
    n = X.shape[0]
    D2 = torch.cdist(X, X) ** 2
    J = torch.eye(n, dtype=torch.float64) - 1.0 / n
    B = -0.5 * J @ D2 @ J
    eigenvalues, eigenvectors = torch.linalg.eigh(B)
    order = torch.argsort(eigenvalues, descending=True)[:n_components]
    values = eigenvalues[order].clamp_min(0)
    vectors = eigenvectors[:, order]
    coords = vectors * values.sqrt()
    flip = torch.sign(coords.gather(0, coords.abs().argmax(0, keepdim=True)))
    coords = coords * torch.where(flip == 0, torch.ones_like(flip), flip)
    return coords.float(), values.float()
