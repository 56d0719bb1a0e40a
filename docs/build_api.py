"""Build the HTML API reference from the docstrings with pdoc (``make docs``).

    python docs/build_api.py [OUT_DIR]      # default build/api; open OUT_DIR/index.html

Every public module of the installed package is documented (private ``_name`` modules are
skipped); pdoc's own warnings (unresolvable names, broken references) are turned into
errors, so a clean exit means the reference built without warnings.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import warnings
from pathlib import Path


def public_modules() -> list[str]:
    """Every public module of the packages listed in ``pyproject.toml``, sorted.

    The package list comes from ``[tool.setuptools] packages`` because some of them are
    mapped from other directories (``tasks/``, ``analyses/``) or have no ``__init__.py``,
    which a plain ``pkgutil.walk_packages`` would miss.
    """
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    names: set[str] = set()
    for package in pyproject["tool"]["setuptools"]["packages"]:
        names.add(package)
        module = importlib.import_module(package)
        for export in getattr(module, "__all__", ()):
            getattr(module, export)  # resolve lazy exports: pdoc reads a module's __dict__
        for info in pkgutil.iter_modules(module.__path__, prefix=f"{package}."):
            if not any(part.startswith("_") for part in info.name.split(".")):
                names.add(info.name)
    return sorted(names)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]) if argv else Path("build/api")
    import pdoc
    import pdoc.extract
    import pdoc.render

    pdoc.render.configure(docformat="google", footer_text="interp-toolkit API reference")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # pdoc reports problems as UserWarning
        # pdoc documents a package's submodules itself unless its __all__ leaves them out:
        # pass only the modules no earlier spec covers (a repeated module is a warning).
        specs: list[str] = []
        covered: set[str] = set()
        for name in public_modules():
            if name not in covered:
                covered.update(pdoc.extract.walk_specs([name]))
                specs.append(name)
        # A walked package can still bring its private modules along: drop them.
        pdoc.pdoc(*specs, r"!.*\._", output_directory=out)
    write_index(out, public_modules())
    print(f"API reference: {out / 'index.html'}")
    return 0


def write_index(out: Path, modules: list[str]) -> Path:
    """The landing page: every documented module (a page pdoc wrote under ``out``) with the
    first line of its docstring, grouped by package, instead of pdoc's redirect to the top
    package (which lists none of them)."""
    import html

    rows = []
    for name in modules:
        page = out / (name.replace(".", "/") + ".html")
        if not page.is_file():
            continue
        doc = (importlib.import_module(name).__doc__ or "").strip().split("\n\n", 1)[0]
        summary = " ".join(doc.split())
        depth = name.count(".")
        rows.append(f'<li style="margin-left:{1.5 * depth}em"><a href="{page.relative_to(out).as_posix()}">'
                    f"<code>{html.escape(name)}</code></a> {html.escape(summary)}</li>")
    text = ("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>interp-toolkit API reference</title>"
            "</head>\n<body style=\"font-family:sans-serif;max-width:60em;margin:2em auto\">\n"
            "<h1>interp-toolkit API reference</h1>\n<p>Every public module, with the first line of its "
            "docstring. Search is on each module's page.</p>\n<ul style=\"list-style:none;padding:0\">\n"
            + "\n".join(rows) + "\n</ul>\n</body></html>\n")
    path = out / "index.html"
    path.write_text(text, encoding="utf-8")
    return path


if __name__ == "__main__":
    sys.exit(main())
