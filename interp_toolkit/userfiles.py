"""Reading files a user names (configs): every failure is a :class:`UserError` naming the path.

A missing file, a directory, unreadable bytes, non-UTF-8 text, truncated or malformed
JSON/YAML, or a top level that is not a mapping all end in one clear message instead of a
traceback from deep inside ``json`` or ``yaml``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from interp_toolkit.errors import UserError


def read_text_file(path: str | os.PathLike, what: str = "file") -> str:
    """The UTF-8 text of ``path``; UserError naming it if it is missing, a directory or unreadable."""
    file = Path(path)
    if not file.exists():
        raise UserError(f"{what} {file} does not exist")
    if file.is_dir():
        raise UserError(f"{what} {file} is a directory; expected a file")
    try:
        raw = file.read_bytes()
    except OSError as err:
        raise UserError(f"cannot read {what} {file}: {err.strerror or err}") from err
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{what} {file} is not UTF-8 text (byte {err.start}: {raw[err.start:err.start + 1]!r})") from err


def read_mapping_file(path: str | os.PathLike, what: str = "config file") -> dict[str, Any]:
    """A JSON (or, for ``.yaml``/``.yml``, YAML) file whose top level is a mapping."""
    file = Path(path)
    text = read_text_file(file, what)
    if file.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as err:  # pragma: no cover - pyyaml ships with transformers
            raise UserError(f"reading the YAML {what} {file} needs pyyaml (pip install pyyaml)") from err
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            where = getattr(err, "problem_mark", None)
            at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
            raise UserError(f"{what} {file} is not valid YAML{at}: {getattr(err, 'problem', None) or err}") from err
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise UserError(f"{what} {file} is not valid JSON (line {err.lineno}, column {err.colno}: "
                            f"{err.msg}); truncated or malformed?") from err
    if not isinstance(data, dict):
        raise UserError(f"{what} {file} must hold a mapping (key: value pairs), got {type(data).__name__}")
    return data


__all__ = ["read_mapping_file", "read_text_file"]
