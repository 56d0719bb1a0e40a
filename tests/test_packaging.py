"""The wheel installs tasks/ and analyses/ under interp_toolkit, never as top-level packages."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(ROOT)], check=True, capture_output=True)
    (wheel,) = out.glob("interp_toolkit-*.whl")
    return wheel


def test_wheel_layout(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "interp_toolkit/tasks/mpsp.py" in names
    assert "interp_toolkit/analyses/__init__.py" in names
    top_level = {name.split("/")[0] for name in names}
    assert "tasks" not in top_level and "analyses" not in top_level
    assert "interp_toolkit/py.typed" in names  # PEP 561: type checkers use the annotations
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "interp-toolkit = interp_toolkit.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_wheel_holds_every_module_of_the_source_tree(wheel):
    # setuptools lists packages by hand (pyproject [tool.setuptools] packages): a subpackage
    # left off that list installs without its modules, which no import in the repo would show
    names = set(zipfile.ZipFile(wheel).namelist())
    homes = {"interp_toolkit": "interp_toolkit", "tasks": "interp_toolkit/tasks", "analyses": "interp_toolkit/analyses"}
    sources = {f"{home}/{path.relative_to(ROOT / top).as_posix()}"
               for top, home in homes.items() for path in (ROOT / top).rglob("*.py")
               if "__pycache__" not in path.parts}
    assert len(sources) > 100
    assert sorted(sources - names) == []


def test_installed_wheel_imports_from_outside_repo(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    code = (
        "import importlib.util, interp_toolkit, interp_toolkit.tasks, interp_toolkit.analyses\n"
        "from interp_toolkit.tasks.mpsp import make_split\n"
        f"assert interp_toolkit.__file__.startswith({str(target)!r}), interp_toolkit.__file__\n"
        f"assert interp_toolkit.tasks.__file__.startswith({str(target)!r})\n"
        "assert importlib.util.find_spec('tasks') is None\n"
        "assert importlib.util.find_spec('analyses') is None\n"
        "import importlib.metadata as md\n"
        "assert interp_toolkit.__version__ == md.version('interp-toolkit'), interp_toolkit.__version__\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_version_is_written_only_in_pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    import interp_toolkit

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert interp_toolkit.__version__ == declared
    assert f'"{declared}"' not in (ROOT / "interp_toolkit" / "__init__.py").read_text()


def test_tests_never_import_example_scripts():
    """Tests test the package; an example is a script that calls it and is run as a user runs
    it (a subprocess), so that what a test checks lives in the package, importable by users."""
    import re

    loader = re.compile(r"spec_from_file_location|run_path|import_module\([^)]*examples")
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path == Path(__file__).resolve():
            continue
        text = path.read_text(encoding="utf-8")
        for match in loader.finditer(text):
            line = text[text.rfind("\n", 0, match.start()) + 1: text.find("\n", match.end())]
            window = text[match.start(): match.start() + 200] + line
            if "examples" in window or "EXAMPLE" in window:
                offenders.append(f"{path.relative_to(ROOT)}: {line.strip()}")
    assert not offenders, offenders


def test_every_module_of_the_package_stays_under_600_lines():
    # a module past this has grown two purposes; split it by purpose (the architecture review)
    sizes = {str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
             for top in ("interp_toolkit", "tasks", "analyses") for path in (ROOT / top).rglob("*.py")
             if "__pycache__" not in path.parts}
    assert len(sizes) > 100
    assert {path: n for path, n in sizes.items() if n > 600} == {}
