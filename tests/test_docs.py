"""User-facing text: no internal remarks; the API reference builds without warnings."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Pointers that mean nothing to a user: tracker numbers, files outside the repository,
# notes to the people who built it.
INTERNAL = re.compile(r"\(issue ?\d+\)|issue \d+'s|\bshared/FACTS\.md|/work/|\blead wires\b", re.IGNORECASE)


def _user_facing_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
    for package in ("interp_toolkit", "analyses", "tasks", "examples"):
        files += sorted((ROOT / package).rglob("*.py"))
    return files


def test_docs_and_docstrings_have_no_internal_remarks():
    found = []
    for path in _user_facing_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if INTERNAL.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_changelog_follows_keep_a_changelog():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "keepachangelog.com" in text
    assert re.search(r"^## \[Unreleased\]", text, re.MULTILINE)
    assert re.search(r"^## \[0\.1\.0\] - \d{4}-\d{2}-\d{2}", text, re.MULTILINE)


@pytest.mark.slow  # imports every module (~15-60 s on the shared machine)
def test_api_reference_builds_without_warnings(tmp_path):
    pytest.importorskip("pdoc")
    result = subprocess.run([sys.executable, "-W", "error::UserWarning", str(ROOT / "docs" / "build_api.py"),
                             str(tmp_path / "api")], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warn" not in result.stderr.lower(), result.stderr[-3000:]
    pages = {p.relative_to(tmp_path / "api").as_posix() for p in (tmp_path / "api").rglob("*.html")}
    for page in ("interp_toolkit.html", "interp_toolkit/callbacks.html", "interp_toolkit/loggers.html",
                 "interp_toolkit/plotting.html", "interp_toolkit/runs/trainer.html",
                 "interp_toolkit/analyses/bif/sampler.html", "interp_toolkit/tasks/mpsp.html"):
        assert page in pages, sorted(pages)
    assert not any("/_" in page for page in pages)  # private modules stay out
    index = (tmp_path / "api" / "index.html").read_text()
    for page in ("interp_toolkit/runs/trainer.html", "interp_toolkit/analyses/bif/sampler.html",
                 "interp_toolkit/tasks/mpsp.html"):
        assert f'href="{page}"' in index  # the landing page lists the modules
    trainer = (tmp_path / "api" / "interp_toolkit" / "runs" / "trainer.html").read_text()
    assert "callbacks" in trainer and "plot_training_curves" in trainer


#: Words of a work diary, not of a report: the project speaks of its studies, never of when or
#: by whom they were run, or what machines were lent.
DIARY = re.compile(r"(?<!`)\bsittings?\b(?!`)|\blent\b|\bno GPU was\b", re.IGNORECASE)  # quoted in backticks: allowed
MACHINE_PATH = re.compile(r"(^|[\s,\"'=(])/(work|tmp|home|root|Users)/")


def _tracked(pattern: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", pattern], capture_output=True, text=True, cwd=ROOT, check=False)
    return [ROOT / line for line in out.stdout.splitlines() if line]


def test_the_docs_speak_of_studies_not_of_sittings_or_lent_machines():
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = [f"{page.relative_to(ROOT)}:{n}: {line.strip()}" for page in pages
             for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1) if DIARY.search(line)]
    assert not found, "\n".join(found)
    names = [p for p in _tracked("*") if "sitting" in p.name.lower()]
    assert not names, names


def test_no_committed_table_holds_a_path_of_the_machine_that_wrote_it():
    tables = [p for pattern in ("docs/*.csv", "docs/*.json") for p in _tracked(pattern)]
    if not tables:  # not a git checkout (an sdist): read the folder
        tables = [*(ROOT / "docs").rglob("*.csv"), *(ROOT / "docs").rglob("*.json")]
    assert any(p.name == "outcomes.csv" for p in tables)
    found = [str(p.relative_to(ROOT)) for p in tables if MACHINE_PATH.search(p.read_text(encoding="utf-8"))]
    assert not found, found


def test_the_reproduction_report_is_a_report():
    lines = (ROOT / "docs" / "reproduction.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 450, len(lines)
    headings = [line for line in lines if line.startswith("## ")]
    assert "## Verdicts" in headings and len(headings) <= 12, headings


#: An ALL_CAPS_WITH_UNDERSCORES word in prose (outside code) is a placeholder left for a number
#: or a sentence unless the code defines it (a constant, an environment variable it reads).
PLACEHOLDER = re.compile(r"\b[A-Z]{2,}(?:_[A-Z0-9]+)+\b")


def test_no_page_holds_an_unfilled_placeholder():
    code = "\n".join(p.read_text(encoding="utf-8") for pattern in ("*.py",) for p in _tracked(pattern))
    found = []
    for page in [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        text = re.sub(r"`[^`]*`", "", text)  # inline code, also across a line break
        found += [f"{page.relative_to(ROOT)}: {word}" for word in PLACEHOLDER.findall(text) if word not in code]
    assert not found, found
