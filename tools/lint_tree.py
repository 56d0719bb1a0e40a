"""Lay the installed package's module tree out as links, for tools that read files, not imports.

    python tools/lint_tree.py [OUT]      # default build/lint; then run mypy / lint-imports there

``interp_toolkit.tasks`` and ``interp_toolkit.analyses`` live in ``tasks/`` and ``analyses/``
(``[tool.setuptools.package-dir]`` in pyproject.toml), and the editable install finds them
with an import hook, which mypy and import-linter (both walk folders) do not run. This script
builds ``OUT/interp_toolkit/`` with one symbolic link per entry of ``interp_toolkit/`` and
one per mapped package, so both see the package as it is installed. Links point at the
working tree: edits show at once, and rerunning refreshes the set of entries (kept links
let mypy's cache in ``OUT`` stay warm).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(out: Path) -> Path:
    """Create or refresh ``out/interp_toolkit``; returns it."""
    import tomllib  # Python 3.11+, as docs/build_api.py; the lint runs on the project's 3.11

    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    root_name = "interp_toolkit"
    tree = out / root_name
    tree.mkdir(parents=True, exist_ok=True)
    wanted: dict[str, Path] = {
        entry.name: entry for entry in (ROOT / package_dir[root_name]).iterdir() if entry.name != "__pycache__"
    }
    for name, folder in package_dir.items():
        parts = name.split(".")
        if len(parts) == 2 and parts[0] == root_name:  # interp_toolkit.tasks -> tasks/
            wanted[parts[1]] = ROOT / folder
    for link in tree.iterdir():
        if not link.is_symlink() or link.name not in wanted or link.resolve() != wanted[link.name].resolve():
            if link.is_symlink() or link.is_file():
                link.unlink()
            else:
                raise SystemExit(f"{link} is a folder, not a link: remove {tree} and rerun")
    for name, target in wanted.items():
        if not (tree / name).is_symlink():
            (tree / name).symlink_to(target)
    return tree


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "build" / "lint"))
