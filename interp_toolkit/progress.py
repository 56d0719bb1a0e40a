"""Progress bars that suit where they are written: a tqdm bar on a terminal, and plain lines
(one per :data:`STEP_PERCENT` percent, no carriage returns or cursor codes) in a log file or a
pipe, where a redrawn bar would write hundreds of kilobytes of control characters."""

from __future__ import annotations

import sys
import time
from typing import Any, Iterable, Iterator, TextIO

__all__ = ["STEP_PERCENT", "QuietProgress", "progress_bar"]

#: A quiet progress line every this many percent of the total.
STEP_PERCENT = 5


class QuietProgress:
    """tqdm's ``update`` / ``close`` / iteration, written as a plain line per few percent.

    Args:
        iterable: Items to iterate (optional).
        total: The number of updates that is 100% (default ``len(iterable)``).
        desc: The label of each line.
        stream: Where the lines go (default ``sys.stderr``).
        initial: Updates already done (a resumed run).
    """

    def __init__(self, iterable: Iterable[Any] | None = None, total: int | None = None, desc: str = "",
                 stream: TextIO | None = None, initial: int = 0, **_: Any) -> None:
        self.iterable = iterable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total, self.desc, self.n, self.postfix = total, desc, initial, ""
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.perf_counter()
        self._next = self._threshold(initial)

    def _threshold(self, n: int) -> int:
        if not self.total:
            return 2**62
        step = max(1, self.total * STEP_PERCENT // 100)
        return (n // step + 1) * step

    def update(self, n: int = 1) -> None:
        """Count ``n`` more; write a line when a step of :data:`STEP_PERCENT` percent is crossed."""
        self.n += n
        if self.total and self.n >= self._next:
            elapsed = time.perf_counter() - self.started
            postfix = f", {self.postfix}" if self.postfix else ""
            self.stream.write(f"{self.desc}: {100 * self.n / self.total:.0f}% ({self.n}/{self.total}, "
                              f"{elapsed:.0f} s{postfix})\n")
            self.stream.flush()
            self._next = self._threshold(self.n)

    def __iter__(self) -> Iterator[Any]:
        assert self.iterable is not None, "QuietProgress was given no iterable"
        for item in self.iterable:
            yield item
            self.update(1)

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        """Accepted for tqdm's interface; a quiet line carries no postfix dict."""

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        """The text the next lines end with (tqdm's ``set_postfix_str``; e.g. ``runs 3/16``)."""
        self.postfix = str(text)

    def close(self) -> None:
        """Nothing to clear (every line ended with a newline)."""


def progress_bar(iterable: Iterable[Any] | None = None, *, disable: bool = False, **kwargs: Any) -> Any:
    """A tqdm bar where stderr is a terminal, :class:`QuietProgress` lines where it is not, or a
    disabled tqdm bar with ``disable=True`` (tqdm's keyword arguments pass through)."""
    from tqdm.auto import tqdm

    if disable or sys.stderr.isatty():
        return tqdm(iterable, disable=disable, **kwargs)
    return QuietProgress(iterable, **kwargs)
