"""Error types shared by the whole toolkit.

A :class:`UserError` is a problem with what the user gave (a bad value, a missing or
foreign file, a checkpoint of another run): the CLI prints it as one ``error: ...`` line
and exits with status 2. Anything else is a bug.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input from the user; the message names the bad value and what was expected."""
