"""The verdict engine reads strictly: on a copy of the repository's docs, every damaged input
ends in one ``error:`` line (exit 2) naming the file, and no published table is rewritten."""

from __future__ import annotations

import csv
import io
import shutil
from pathlib import Path

import pytest

from interp_toolkit.studies.verdicts.table import main

ROOT = Path(__file__).resolve().parents[3]
OUTCOMES = "docs/reproduction/outcomes.csv"
PUBLISHED = ["docs/reproduction/verdicts.csv", "docs/reproduction.md", "docs/bif/verdicts.csv", "docs/bif.md",
             "docs/lm_bif.md", "docs/influence.md"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("pristine")
    shutil.copytree(ROOT / "docs", repo / "docs", ignore=shutil.ignore_patterns("*.png", "*.safetensors", "state"))
    return repo


@pytest.fixture
def repo(pristine, tmp_path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(pristine, copy)
    return copy


def _published(repo: Path) -> dict[str, bytes]:
    return {name: (repo / name).read_bytes() for name in PUBLISHED}


def _refused(repo: Path, capsys, *named: str) -> None:
    before = _published(repo)
    capsys.readouterr()
    code = main([str(repo)])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "nothing was rewritten" in lines[0], err
    for word in named:
        assert word in lines[0], (word, lines[0])
    assert _published(repo) == before


def test_an_intact_copy_regenerates_to_the_same_bytes(repo, capsys):
    before = _published(repo)
    assert main([str(repo)]) == 0, capsys.readouterr().err
    assert _published(repo) == before


@pytest.mark.parametrize("damage, named", [
    (lambda text: "", ["outcomes.csv", "empty"]),
    (lambda text: text.splitlines(keepends=True)[0], ["outcomes.csv", "no rows"]),
    (lambda text: text[: len(text) // 2], ["outcomes.csv", "torn row"]),
])
def test_a_cut_outcomes_table_is_refused(repo, capsys, damage, named):
    path = repo / OUTCOMES
    path.write_text(damage(path.read_text(encoding="utf-8")), encoding="utf-8")
    _refused(repo, capsys, *named)


def test_bad_bytes_and_a_missing_file_are_refused_by_name(repo, capsys):
    path = repo / OUTCOMES
    path.write_bytes(path.read_bytes()[:200] + b"\xff" + path.read_bytes()[200:])
    _refused(repo, capsys, "outcomes.csv", "not UTF-8")
    path.unlink()
    _refused(repo, capsys, "outcomes.csv")


def test_a_flag_edited_apart_from_its_accuracy_is_refused(repo, capsys):
    path = repo / OUTCOMES
    rows = list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))
    target = next(r for r in rows if r["status"] == "finished" and r["generalized"] == "False"
                  and float(r["r"]) > 0.6 and float(r["max_adv_acc"]) < 0.9)
    target["generalized"] = "True"
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(out.getvalue(), encoding="utf-8")
    _refused(repo, capsys, "generalized is True but max_adv_acc", target["max_adv_acc"])


def test_a_page_without_its_markers_is_refused(repo, capsys):
    page = repo / "docs" / "reproduction.md"
    page.write_text(page.read_text(encoding="utf-8").replace("<!-- verdicts:begin -->", ""), encoding="utf-8")
    before = page.read_bytes()
    capsys.readouterr()
    assert main([str(repo)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "markers" in err, err
    assert page.read_bytes() == before


def test_it_needs_a_repository_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # not a repository: no fallback into the package's own checkout
    assert main([]) == 2
    assert "not an interp-toolkit repository" in capsys.readouterr().err
    assert main(["a", "b"]) == 2
    assert "one argument" in capsys.readouterr().err
