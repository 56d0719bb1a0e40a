"""Packages whose public names are imported on first use (PEP 562), written once.

``interp_toolkit``, ``interp_toolkit.studies``, ``interp_toolkit.analyses`` and
``interp_toolkit.analyses.bif`` keep ``import`` cheap (no torch until a name is used) with the
module-level ``__getattr__`` and ``__dir__`` that :func:`lazy_exports` returns.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping, MutableMapping, Sequence

ExportTable = Mapping[str, str]


def lazy_exports(
    package: str,
    namespace: MutableMapping[str, Any],
    exports: ExportTable | Callable[[], ExportTable],
    submodules: Sequence[str] = (),
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a package that imports its public names on use.

    Args:
        package: The package's ``__name__``.
        namespace: Its ``globals()``: a name, once imported, is stored there, so later lookups
            (and pdoc, which reads ``__dict__``) skip ``__getattr__``.
        exports: Public name -> defining module (absolute, or relative to ``package`` with a
            leading dot), or a function returning that table (built on first use, e.g. from the
            submodules' ``__all__``).
        submodules: Names that resolve to the submodule itself.

    Returns:
        ``(__getattr__, __dir__)``; an unknown name raises ``AttributeError`` naming the package.
    """
    table: dict[str, str] | None = None

    def export_table() -> dict[str, str]:
        nonlocal table
        if table is None:
            table = dict(exports() if callable(exports) else exports)
        return table

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):  # dunder probes (copy, inspect, pickle) import nothing
            raise AttributeError(name)
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        module = export_table().get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *submodules, *export_table()})

    return __getattr__, __dir__


__all__ = ["lazy_exports"]
