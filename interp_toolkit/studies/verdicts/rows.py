"""The pieces every verdict row is made of (:mod:`interp_toolkit.studies.verdicts.table` for
the shortcut-saturation claims, :mod:`interp_toolkit.studies.verdicts.bif` for the
stagewise-attribution ones): the columns, one row, number formatting, file names."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from interp_toolkit.studies.verdicts import rules

#: The paper's headline counts (30 seeds per cell: this project's reading of its rounded
#: percentages, not a number it states).
HEADLINE = {"1L": (10 / 30, 0.0), "2L": (0.0, 23 / 30)}  # (r = 0.5, r = 0.9)

#: The repository the committed tables live in.
ROOT = Path(__file__).resolve().parents[3]

#: ``horizon``: how long the runs behind a row trained, and the paper's horizon beside it;
#: ``test``: the test behind ``p`` and ``power`` (rate contrasts: the Fisher exact test, with
#: the Newcombe interval in ``low`` / ``high``).
FIELDS = ["paper", "claim", "regime", "settings", "horizon", "cells", "difference", "low", "high", "p", "test",
          "power", "verdict", "why", "files"]

def rel(root: Path, path: Path) -> str:
    """``path`` relative to the repository ``root`` (as the tables name their files)."""
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def read_rows(path: Path, required: Sequence[str] = ()) -> list[dict[str, str]]:
    """The rows of a committed CSV, as text, read strictly: UserError naming the file (and the
    line) when it is missing, not UTF-8, not a CSV, has no header or no rows, lacks a column of
    ``required``, or holds a torn row (fewer or more fields than its header). A verdict is
    never drawn from part of a table."""
    from interp_toolkit.errors import UserError

    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path} does not exist (or is not a file); the verdicts read it")
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            header = reader.fieldnames
            if not header:
                raise UserError(f"{path} is empty; expected a CSV with a header and one row per entry")
            missing = [c for c in required if c not in header]
            if missing:
                raise UserError(f"{path} lacks the columns {missing}; expected those of the table it was written as")
            rows = []
            for row in reader:
                if None in row or any(v is None for v in row.values()):
                    raise UserError(f"{path}, line {reader.line_num}: a torn row ({len(header)} columns in the "
                                    "header, a different number here); the file was cut or edited")
                rows.append(row)
    except UnicodeDecodeError as err:
        raise UserError(f"{path} is not UTF-8 text (byte {err.start}: {err.reason})") from err
    except csv.Error as err:
        raise UserError(f"{path} is not a readable CSV ({err})") from err
    if not rows:
        raise UserError(f"{path} has a header but no rows; expected one row per entry")
    return rows


def fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def fmt_rhat(value: Any) -> str:
    """A split R-hat to 3 decimals (the gate is 1.01: ``1.009`` and ``1.014`` must read apart, and
    ``1.000`` not as an exact 1)."""
    return f"{value:.3f}" if isinstance(value, (int, float)) and math.isfinite(value) else ""


def fmt_ess(value: Any) -> str:
    """An effective sample size as a whole number with thousands separators."""
    return f"{value:,.0f}" if isinstance(value, (int, float)) and math.isfinite(value) else ""


def verdict_row(paper: str, claim: str, regime: str, settings: str, cells: str, verdict: str, why: str,
                files: Sequence[str], result: Mapping[str, Any] | None = None, horizon: str = "") -> dict[str, str]:
    """One verdict row (:data:`FIELDS`): the verdict is named with its regime, the interval,
    p and its test come from ``result`` (a contrast) when there is one."""
    result = result or {}
    return {"paper": paper, "claim": claim, "regime": regime, "settings": settings, "horizon": horizon,
            "cells": cells, "test": str(result.get("test", "")),
            "difference": fmt(result.get("difference")), "low": fmt(result.get("low")),
            "high": fmt(result.get("high")), "p": fmt(result.get("p", result.get("fisher_p"))),
            "power": fmt(result.get("power"), 2), "verdict": rules.in_regime(verdict, regime), "why": why,
            "files": " ".join(files)}


__all__ = ["FIELDS", "HEADLINE", "ROOT", "fmt", "read_rows", "rel", "verdict_row"]
