"""interp_toolkit.lazy.lazy_exports: names imported on first use, cached, listed, refused by name."""

import subprocess
import sys

import pytest

from interp_toolkit.lazy import lazy_exports


def test_names_import_on_first_use_and_are_cached():
    namespace: dict = {}
    builds = []

    def table():
        builds.append(1)
        return {"dumps": "json", "Fraction": ".fractions"}

    getattr_, dir_ = lazy_exports("interp_toolkit_fake", namespace, table)
    assert builds == []  # nothing built before a name is asked for
    import json

    assert getattr_("dumps") is json.dumps and namespace["dumps"] is json.dumps
    with pytest.raises(ModuleNotFoundError):  # relative to the (fake) package
        getattr_("Fraction")
    assert builds == [1]  # the table is built once
    assert {"dumps", "Fraction"} <= set(dir_())
    with pytest.raises(AttributeError, match="module 'interp_toolkit_fake' has no attribute 'nope'"):
        getattr_("nope")
    with pytest.raises(AttributeError):
        getattr_("__wrapped__")  # a dunder probe imports nothing
    assert builds == [1]


def test_the_packages_stay_cheap_to_import():
    code = ("import sys, interp_toolkit, interp_toolkit.studies, interp_toolkit.analyses, "
            "interp_toolkit.analyses.bif; assert 'torch' not in sys.modules, sorted(sys.modules); "
            "from interp_toolkit.analyses import ablation, gradient_conflict; "
            "from interp_toolkit.analyses.bif import sample_sgld; from interp_toolkit.studies import preset; "
            "from interp_toolkit import train; assert 'torch' in sys.modules; print(ablation.__name__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "interp_toolkit.analyses.ablation"  # a submodule resolves to the module
