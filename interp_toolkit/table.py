"""The tidy table every analysis returns (rows of dicts, CSV and pandas), without torch.

Defined here, in the core, so that reading a cached result (a CSV, a cache entry) needs
no torch import; :mod:`interp_toolkit.analyses` re-exports it.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from interp_toolkit.io import atomic_write_text


@dataclass
class Table:
    """A tidy table: a list of rows (dicts) with the same keys.

    Attributes:
        rows: One dict per row; every row has the keys in ``columns``.
    """

    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def columns(self) -> list[str]:
        """Column names in first-seen order."""
        seen: dict[str, None] = {}
        for row in self.rows:
            for key in row:
                seen.setdefault(key, None)
        return list(seen)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    def where(self, **conditions: Any) -> "Table":
        """Rows whose columns equal every given value."""
        return Table([r for r in self.rows if all(r.get(k) == v for k, v in conditions.items())])

    def column(self, name: str) -> list[Any]:
        """All values of one column."""
        return [r.get(name) for r in self.rows]

    def to_csv_text(self) -> str:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=self.columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        return buffer.getvalue()

    def to_csv(self, path: str | Path) -> Path:
        """Write the table as CSV atomically; returns the path."""
        return atomic_write_text(path, self.to_csv_text())

    def to_pandas(self) -> Any:
        """The table as a :class:`pandas.DataFrame` (columns in :attr:`columns` order).

        Missing values (a row without a column) become NaN/None. Needs pandas.
        """
        try:
            import pandas as pd
        except ImportError as err:
            raise ImportError("Table.to_pandas needs pandas: pip install pandas") from err
        return pd.DataFrame.from_records(self.rows, columns=self.columns)

    @classmethod
    def from_csv(cls, path: str | Path) -> "Table":
        """Read a CSV written by :meth:`to_csv` (numbers parsed back to int/float)."""
        with open(path, newline="", encoding="utf-8") as handle:
            return cls([{k: _parse(v) for k, v in row.items()} for row in csv.DictReader(handle)])


def _parse(value: str) -> Any:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    if value in ("True", "False"):
        return value == "True"
    return value


__all__ = ["Table"]
