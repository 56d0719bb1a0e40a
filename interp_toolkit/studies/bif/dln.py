"""The deep linear network study: its trainer with run records and log-spaced checkpoints,
solution-based phase labels for the BIF, and classical MDS of hidden representations.

The model itself (``DeepLinearNetwork``, ``DLNConfig``, ``gradient_descent``, mode
strengths, the Saxe et al. trajectories) lives in :mod:`interp_toolkit.tasks.dln`, below the
analyses that use it; its names are re-exported here so ``studies.bif.dln`` imports keep working.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor, nn

from interp_toolkit.errors import UserError
from interp_toolkit.io import config_hash, load_artifact, save_artifact, tensor_digest
from interp_toolkit.progress import progress_bar
from interp_toolkit.runs.layout import CHECKPOINTS
from interp_toolkit.runs.record import is_finished, read_run_record, write_record
from interp_toolkit.tasks.dln import (
    DeepLinearNetwork,
    DLNConfig,
    _one_thread,
    dln_per_example_loss,
    fit_initial_strength,
    gradient_descent,
    mode_strength_observable,
    mode_strengths,
    saxe_trajectory,
    weighted_steps,
)
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
        raise UserError(f"fraction must be a number in (0, 1), got {fraction!r}")
    index = list(range(len(modes.S))) if which is None else [int(k) for k in which]
    observable = mode_strength_observable(modes, index)
    thresholds = fraction * modes.target_strengths[index].double()
    fn = observable_phase_fn(observable, thresholds)
    fn.__qualname__ = f"mode_phase_fn({index}, {fraction})"
    return fn


def log_spaced_steps(total_steps: int, n_checkpoints: int) -> list[int]:
    """Step 0, ``total_steps`` and about ``n_checkpoints`` log-spaced steps in between."""
    if total_steps < 1 or n_checkpoints < 2:
        raise UserError(f"need total_steps >= 1 and n_checkpoints >= 2, got {total_steps}, {n_checkpoints}")
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
        progress: Show a progress bar (plain lines where stderr is not a terminal).
    """

    lr: float = 0.05
    steps: int = 2_000
    n_checkpoints: int = 40
    progress: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise UserError(f"DLNTrainConfig.lr must be a finite number > 0, got {self.lr!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise UserError(f"DLNTrainConfig.steps must be a positive integer, got {self.steps!r}")
        if isinstance(self.n_checkpoints, bool) or not isinstance(self.n_checkpoints, int) or self.n_checkpoints < 2:
            raise UserError(f"DLNTrainConfig.n_checkpoints must be an integer >= 2, got {self.n_checkpoints!r}")

    def checkpoint_steps(self) -> list[int]:
        return log_spaced_steps(self.steps, self.n_checkpoints)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
    bar = progress_bar(total=train_cfg.steps - start, desc="DLN GD", disable=not train_cfg.progress, leave=False)

    def on_step(step: int, current: DeepLinearNetwork) -> None:
        bar.update(1)
        keep(step, current)

    losses += gradient_descent(
        model, inputs, targets, train_cfg.lr, train_cfg.steps - start, start_step=start, on_step=on_step
    )
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
