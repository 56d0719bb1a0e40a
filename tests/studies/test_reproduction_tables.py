"""The committed reproduction tables (the regime search's clock table included) regenerate byte
for byte from the committed outcomes.csv, with the report commands docs/reproduction.md and its study pages give
for them."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from interp_toolkit.cli import main
from interp_toolkit.studies.grid.study import (
    CLOCK_CSV,
    CONTRASTS_CSV,
    OUTCOMES_CSV,
    PAPER_COMPARISON_CSV,
    TABLE_CSV,
    TABLE_MD,
)

ROOT = Path(__file__).resolve().parents[2]
SOURCE = "docs/reproduction/outcomes.csv"
TABLES = (OUTCOMES_CSV, TABLE_CSV, TABLE_MD, CONTRASTS_CSV, PAPER_COMPARISON_CSV, CLOCK_CSV)


def _documented_commands() -> dict[str, list[str]]:
    """``{output folder: report arguments}`` of every command in docs/reproduction.md (and its study pages) that
    reports the committed outcomes.csv alone into a folder under docs/reproduction."""
    pages = [ROOT / "docs" / "reproduction.md", *sorted((ROOT / "docs" / "reproduction" / "studies").glob("*.md"))]
    text = "\n".join(page.read_text(encoding="utf-8") for page in pages).replace("\\\n", " ")
    commands = {}
    for line in text.splitlines():
        match = re.match(r"\s*interp-toolkit report (.*)$", line)
        if not match:
            continue
        args = shlex.split(match.group(1).split("#")[0])
        out = args[args.index("--out") + 1] if "--out" in args else None
        first_flag = next((i for i, arg in enumerate(args) if arg.startswith("--")), len(args))
        sources = args[:first_flag]  # the docs give the sources first
        if sources == [SOURCE] and out and out.startswith("docs/reproduction"):
            commands[out] = args
    return commands


COMMANDS = _documented_commands()


def test_docs_give_the_commands_of_every_committed_table():
    assert set(COMMANDS) == {"docs/reproduction", "docs/reproduction/headline", "docs/reproduction/regime",
                             "docs/reproduction/claims", "docs/reproduction/r0", "docs/reproduction/axes",
                             "docs/reproduction/axes_clock/2L", "docs/reproduction/axes_clock/1L",
                             "docs/reproduction/confirm_len7"}


@pytest.mark.parametrize("out", sorted(COMMANDS))
def test_committed_tables_regenerate_byte_for_byte(out, tmp_path, capsys):
    args = list(COMMANDS[out])
    args[args.index("--out") + 1] = str(tmp_path)
    args[args.index(SOURCE)] = str(ROOT / SOURCE)
    assert main(["report", *args]) == 0
    capsys.readouterr()
    compared = [name for name in TABLES if (ROOT / out / name).is_file()]
    assert {OUTCOMES_CSV, TABLE_CSV, TABLE_MD, CONTRASTS_CSV} <= set(compared)
    assert (CLOCK_CSV in compared) == ("--clock" in args)  # a clock table is committed with its command
    for name in compared:
        assert (tmp_path / name).read_bytes() == (ROOT / out / name).read_bytes(), f"{out}/{name} differs"
