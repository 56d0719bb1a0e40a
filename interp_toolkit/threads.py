"""Torch thread counts chosen by the work, restored on return.

On small CPU workloads (the deep linear network, the small MPSP models of tests and
laptop presets, sweep workers that already use one process per core) extra OpenMP
threads cost more than they give: every tiny op pays a fork/join, and on a busy machine
spinning threads fight for cores (measured on a loaded 2-core machine: 1,500 DLN steps took
72 s with 2 threads, 0.86 s with 1). Library calls that run such work use
:func:`torch_threads`, which sets the count for the duration of the call and restores the
caller's setting afterwards, so a user's ``torch.set_num_threads`` is never overridden
for good.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeVar

from interp_toolkit.errors import UserError

if TYPE_CHECKING:  # imported where threads are set: decorating a function (at import) needs no torch
    import torch

#: Below this many floating-point operations per optimizer step a workload counts as tiny
#: and runs on one thread (per-op work under ~1 ms on one core of these machines, where a
#: fork/join and cache traffic of a second thread cost as much as they save).
TINY_STEP_FLOPS = 5e7


@contextlib.contextmanager
def torch_threads(n_threads: int | None) -> Iterator[None]:
    """Run the block with ``n_threads`` torch threads; restore the caller's count after.

    Args:
        n_threads: Threads for the block (``None``: leave the current setting alone).

    Raises:
        ValueError: If ``n_threads`` is not a positive integer or None.
    """
    if n_threads is not None and (isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads < 1):
        raise UserError(f"n_threads must be a positive integer or None, got {n_threads!r}")
    import torch

    previous = torch.get_num_threads()
    if n_threads is not None and n_threads != previous:
        torch.set_num_threads(n_threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)


def threads_for(step_flops: float, device: str | torch.device = "cpu") -> int | None:
    """Threads a workload of ``step_flops`` per step should use: 1 if tiny, else ``None``.

    ``None`` means "the caller's setting" (large CPU work parallelizes well; GPU work does
    not care about CPU threads beyond the one driving it).
    """
    import torch

    if torch.device(device).type != "cpu":
        return None
    return 1 if step_flops < TINY_STEP_FLOPS else None


F = TypeVar("F", bound=Callable[..., Any])


def with_threads(choose: Callable[..., int | None]) -> Callable[[F], F]:
    """Decorator: run the function under ``torch_threads(choose(*args, **kwargs))``.

    ``choose`` sees the call's arguments and returns a thread count or ``None`` (leave the
    caller's setting). If it raises, the count is left alone and the function runs (and
    reports bad arguments itself).
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                n_threads = choose(*args, **kwargs)
            except Exception:  # noqa: BLE001 - the wrapped function validates its own inputs
                n_threads = None
            with torch_threads(n_threads):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


__all__ = ["TINY_STEP_FLOPS", "threads_for", "torch_threads", "with_threads"]
