"""What identifies a callable in an analysis's cache key: its name and bound arguments
(:func:`callable_key`) and, for a user's own analysis, a digest of its code
(:func:`code_digest`), so an edited function recomputes instead of serving a stale result."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import marshal
from typing import Any, Callable

from interp_toolkit.errors import UserError


def callable_key(fn: Callable[..., Any]) -> dict[str, Any]:
    """What identifies a callable in the cache key: its qualified name and, for a
    ``functools.partial``, its bound arguments (which must be JSON-able)."""
    bound: dict[str, Any] = {}
    while isinstance(fn, functools.partial):
        bound = {**fn.keywords, **bound}
        if fn.args:
            bound["__args__"] = list(fn.args)
        fn = fn.func
    key = {"name": f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}", "bound": bound}
    try:
        json.dumps(key)
    except TypeError as err:
        raise UserError(f"arguments bound to the analysis must be JSON-serializable (cache key): {err}") from err
    return key


def code_digest(fn: Callable[..., Any]) -> str:
    """A digest of a callable's code: its source where Python can read it (so any edit of the
    function, its defaults or its docstring changes it), else its compiled code and constants.
    Part of the cache key of a user's own analysis, so an edited function recomputes."""
    try:
        payload = inspect.getsource(fn).encode()
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        try:
            payload = marshal.dumps(code) if code is not None else repr(fn).encode()
        except ValueError:
            payload = repr(fn).encode()
    defaults = repr(getattr(fn, "__defaults__", None)) + repr(getattr(fn, "__kwdefaults__", None))
    return hashlib.sha256(payload + defaults.encode()).hexdigest()[:16]


__all__ = ["callable_key", "code_digest"]
