"""Callbacks: watch training, sweeps and SGLD sampling while they run.

A callback is any object with some of the methods of :class:`Callback` (subclass it and
override what you need; the others do nothing). Training calls them after the state they
report is safely on disk, so a callback that raises stops training with the run still
resumable: rerunning the same command continues from the last saved epoch.

Example::

    from interp_toolkit.callbacks import Callback

    class PrintAccuracy(Callback):
        def on_evaluation(self, run_dir, metrics):
            print(run_dir.name, metrics["epoch"], metrics.get("val_acc"))

    train(model, splits, cfg, "runs/demo", callbacks=[PrintAccuracy()])

Ready-made loggers (TensorBoard, Weights & Biases) are in :mod:`interp_toolkit.loggers`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence


class Callback:
    """Base class of callbacks; every hook does nothing unless overridden.

    Training hooks (:func:`interp_toolkit.train`, :func:`interp_toolkit.runs.batched.train_batched`,
    sweeps) receive the run directory first, so one callback can follow many runs at once
    (the batched trainer reports every seed it trains).
    """

    def on_evaluation(self, run_dir: Path, metrics: dict[str, Any]) -> None:
        """After an evaluation was appended to ``run_dir/metrics.jsonl``.

        Args:
            run_dir: The run's directory.
            metrics: The line just logged: ``{"epoch", "<split>_loss", "<split>_acc", ...}``.
        """

    def on_checkpoint(self, run_dir: Path, path: Path, epoch: int) -> None:
        """After a checkpoint file was written.

        Args:
            run_dir: The run's directory.
            path: The checkpoint file (``checkpoints/epoch_NNNNNN.safetensors``).
            epoch: Its epoch.
        """

    def on_run_end(self, run_dir: Path, final: dict[str, Any]) -> None:
        """After a run was marked finished in its ``run.json``.

        Args:
            run_dir: The run's directory.
            final: Its last evaluation (the ``final`` entry of ``run.json``).
        """

    def on_draw(self, chain: int, draw: int, info: dict[str, float]) -> None:
        """After an SGLD draw was recorded.

        Args:
            chain: Chain index.
            draw: Draw index within the chain.
            info: ``{"step", "loss"}``: the SGLD step and the minibatch loss before it.
        """

    def on_chain_end(self, chain: int, diagnostics: dict[str, float]) -> None:
        """After an SGLD chain finished.

        Args:
            chain: Chain index.
            diagnostics: ``{"initial_loss", "n_beta", "mean_loss", "final_loss",
                "burn_in_drift", "sampling_drift"}`` of this chain.
        """


def as_callbacks(callbacks: Callback | Iterable[Any] | None) -> list[Any]:
    """Normalize ``None``, one callback, or an iterable of callbacks to a list.

    Raises:
        TypeError: If an entry has none of the :class:`Callback` hooks.
    """
    if callbacks is None:
        return []
    items = [callbacks] if isinstance(callbacks, Callback) else list(callbacks)
    hooks = [name for name in vars(Callback) if name.startswith("on_")]
    for item in items:
        if not any(callable(getattr(item, name, None)) for name in hooks):
            raise TypeError(
                f"callback {item!r} has none of the hooks {hooks}; subclass "
                "interp_toolkit.callbacks.Callback"
            )
    return items


def dispatch(callbacks: Sequence[Any], hook: str, *args: Any) -> None:
    """Call ``hook(*args)`` on every callback that has it, in order (exceptions propagate)."""
    for callback in callbacks:
        method = getattr(callback, hook, None)
        if method is not None:
            method(*args)


__all__ = ["Callback", "as_callbacks", "dispatch"]
