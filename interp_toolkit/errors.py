"""Error types shared by the whole toolkit.

A :class:`UserError` is a problem with what the user gave (a bad value, a missing or
foreign file, a checkpoint of another run): the CLI prints it as one ``error: ...`` line
and exits with status 2. Anything else is a bug: exit 1 and a crash log.

``UserError`` is deliberately not a ``ValueError``: a ``ValueError`` raised inside the
library or a dependency (a shape mismatch in torch, a bad float in numpy) is a bug that must
not read as the user's mistake. Every check of the toolkit's inputs raises ``UserError`` (or
one of its subclasses below); code that catches a library error catches ``UserError``.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user; the message names the bad value and what was expected."""


class CheckpointError(UserError):
    """A stored artifact (checkpoint, BIF result, DLN state) is missing, truncated, corrupted,
    fails its recorded digest, or does not match its config; the message names the file (and
    the tensor, when one is at fault)."""


class TrainingDivergedError(UserError, FloatingPointError):
    """Training produced a non-finite loss or evaluation (e.g. a learning rate far too
    large): a problem with the settings, so a user error, and still a ``FloatingPointError``.
    Nothing non-finite is written: the run directory keeps its last saved state."""


def notice(message: str) -> None:
    """Tell the user, in one ``note: ...`` line on stderr, of something done on their behalf
    (a recomputed cache, dropped lines of a torn file) that changes no result."""
    import sys

    print(f"note: {' '.join(message.split())}", file=sys.stderr, flush=True)


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGINT) stopped training; the run resumes from ``resume_epoch`` on rerun.

    A ``KeyboardInterrupt``, so code that stops on Ctrl-C still stops; the CLI prints
    "interrupted; rerun the same command to resume from epoch N" and exits with 130.

    Attributes:
        run_dir: The interrupted run's directory (None if unknown).
        resume_epoch: The epoch of the last saved state (None if nothing was saved yet).
    """

    def __init__(self, run_dir: object = None, resume_epoch: int | None = None) -> None:
        self.run_dir = run_dir
        self.resume_epoch = resume_epoch
        where = f" from epoch {resume_epoch}" if resume_epoch is not None else ""
        super().__init__(f"training of {run_dir} interrupted; rerun the same command to resume{where}")
