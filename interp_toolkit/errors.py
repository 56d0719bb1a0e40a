"""Error types shared by the whole toolkit.

A :class:`UserError` is a problem with what the user gave (a bad value, a missing or
foreign file, a checkpoint of another run): the CLI prints it as one ``error: ...`` line
and exits with status 2. Anything else is a bug.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input from the user; the message names the bad value and what was expected."""


class CheckpointError(UserError):
    """A stored artifact (checkpoint, BIF result, DLN state) is missing, truncated, corrupted,
    fails its recorded digest, or does not match its config; the message names the file (and
    the tensor, when one is at fault)."""
