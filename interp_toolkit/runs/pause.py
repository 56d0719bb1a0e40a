"""Pausing training at the end of an epoch: a wall-clock budget, or SIGTERM, for a campaign.

A campaign (``interp-toolkit sweep --budget 2h30m --state DIR``) trains runs longer than one
machine's stretch of time, so training must stop on its own, at a point it can continue from
exactly. :func:`arm` sets the deadline (a ``time.time()`` instant) and, in the process's main
thread, makes SIGTERM a pause request instead of an interrupt. :class:`~interp_toolkit.runs.loop.TrainingLoop`
asks :func:`requested` after every epoch's optimizer steps; when it answers yes, every member
still training saves its resume state at that epoch (weights, AdamW moments, the shuffling
generator: nothing is lost but the epoch in flight, which was never started) and the loop raises
:class:`TrainingPaused`. A rerun resumes every run from that state, and ends byte-identical to
an uninterrupted run (``tests/studies/test_campaign.py`` cuts a campaign three times).

Waiting for an epoch's end rather than an evaluation's keeps a SIGTERM's grace short: at most
one epoch (seconds) instead of ``eval_every`` of them.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

_state: dict[str, Any] = {"deadline": None, "signalled": False, "flag": None}


class TrainingPaused(Exception):  # noqa: N818 - a pause, not an error: the name says what happened
    """Training stopped at the end of ``epoch`` on a budget or SIGTERM; every member still
    training saved its resume state there. Not an error: the runs continue on the next call.

    Attributes:
        epoch: The epoch every paused member's resume state ends.
        reason: ``"budget"`` or ``"SIGTERM"``.
    """

    def __init__(self, epoch: int, reason: str) -> None:
        self.epoch, self.reason = epoch, reason
        super().__init__(f"training paused at epoch {epoch} ({reason}); rerun to continue")


def _on_sigterm(signum: int, frame: Any) -> None:
    _state["signalled"] = True


def arm(deadline: float | None, *, flag: str | os.PathLike | None = None, sigterm: bool = True) -> None:
    """Pause at the first epoch end at or after ``deadline`` (``time.time()`` seconds; None:
    no deadline), once the file ``flag`` exists (how a campaign's driver tells its workers of a
    SIGTERM it received), and, with ``sigterm``, at the first epoch end after a SIGTERM to this
    process (installed only in the main thread, where Python delivers signals)."""
    _state["deadline"] = deadline
    _state["signalled"] = False
    _state["flag"] = None if flag is None else Path(flag)
    if sigterm and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


def request() -> None:
    """Ask for a pause at the next epoch end (what SIGTERM does)."""
    _state["signalled"] = True


def disarm() -> None:
    """No deadline, no pending request (SIGTERM's handler is left to whoever installed it)."""
    _state["deadline"] = None
    _state["signalled"] = False
    _state["flag"] = None


def requested() -> str | None:
    """Why training should pause now (``"SIGTERM"`` or ``"budget"``), or None."""
    if _state["signalled"] or (_state["flag"] is not None and _state["flag"].exists()):
        return "SIGTERM"
    deadline = _state["deadline"]
    if deadline is not None and time.time() >= deadline:
        return "budget"
    return None


__all__ = ["TrainingPaused", "arm", "disarm", "request", "requested"]
