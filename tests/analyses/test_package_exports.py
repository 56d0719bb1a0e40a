"""Every name of the analysis table (docs/analyses.md) imports from ``interp_toolkit.analyses`` as
written, and a module named as its function is callable as that function."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "docs" / "analyses.md"


def _table_names() -> list[str]:
    text = README.read_text(encoding="utf-8")
    table = text.split("| module | high level | what it measures |", 1)[1].split("\n\n", 1)[0]
    names = []
    for row in table.splitlines()[2:]:
        high_level = row.split("|")[2]
        names += re.findall(r"`([a-z_]+)(?:\(|`)", high_level)
    return sorted(set(names))


def test_the_table_names_the_analyses():
    assert {"ablation", "gradient_conflict", "minimal_pair_patching", "fingerprints", "weight_norms",
            "near_misses"} <= set(_table_names())


@pytest.mark.parametrize("name", _table_names())
def test_each_name_imports_from_the_package_and_is_callable(name):
    analyses = importlib.import_module("interp_toolkit.analyses")
    value = getattr(analyses, name)
    assert callable(value), name


@pytest.mark.parametrize("name", ["ablation", "fingerprints", "near_misses", "over_checkpoints"])
def test_a_module_named_as_its_function_calls_it(name, monkeypatch):
    module = importlib.import_module(f"interp_toolkit.analyses.{name}")
    calls = []
    monkeypatch.setattr(module, name, lambda *args, **kwargs: calls.append((args, kwargs)) or "result")
    from interp_toolkit import analyses

    assert getattr(analyses, name) is module  # the module, once imported, is what the package holds
    assert module(1, key=2) == "result" and calls == [((1,), {"key": 2})]


def test_an_unknown_name_is_an_attribute_error():
    from interp_toolkit import analyses

    with pytest.raises(AttributeError, match="has no attribute 'no_such_analysis'"):
        analyses.no_such_analysis  # noqa: B018
