"""Shared validation for the toolkit's dataclass configs."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping


def reject_unknown_keys(cls: type, data: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming every key of ``data`` that is not a field of ``cls``.

    Used by every config's ``from_dict`` so a typo in a config file fails loudly, before any
    work, instead of being ignored.
    """
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys {unknown}; expected a subset of {sorted(known)}")
