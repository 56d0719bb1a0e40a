"""The committed mechanism contrasts (docs/reproduction/mechanism_contrast/) regenerate byte for
byte from their own contrast.json, and docs/reproduction.md and its study pages give the command of each."""

from __future__ import annotations

from pathlib import Path

import pytest

from interp_toolkit.studies.mechanism.contrast import read_contrast
from interp_toolkit.studies.mechanism.contrast_data import FILES
from interp_toolkit.studies.mechanism.contrast_plot import write_contrast

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = sorted(p.parent for p in (ROOT / "docs" / "reproduction" / "mechanism_contrast").glob("*/contrast.json"))


def test_there_are_committed_contrasts():
    assert len(FOLDERS) >= 2


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_committed_contrast_tables_regenerate_from_their_summary(folder, tmp_path):
    write_contrast(read_contrast(folder / FILES["summary"]), tmp_path)
    for name in ("by_epoch", "windows", "runs"):
        assert (tmp_path / FILES[name]).read_bytes() == (folder / FILES[name]).read_bytes(), name


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_docs_give_the_command_of_every_committed_contrast(folder):
    pages = [ROOT / "docs" / "reproduction.md", *sorted((ROOT / "docs" / "reproduction" / "studies").glob("*.md"))]
    text = "\n".join(page.read_text(encoding="utf-8") for page in pages).replace("\\\n", " ")
    out = folder.relative_to(ROOT).as_posix()
    assert any(line.lstrip().startswith("interp-toolkit mechanism-contrast ") and f"--out {out}" in line
               for line in text.splitlines()), out
