"""Reading files a user names (configs): every failure is a :class:`UserError` naming the path.

A missing file, a directory, unreadable bytes, non-UTF-8 text, truncated or malformed
JSON/YAML, or a top level that is not a mapping all end in one clear message instead of a
traceback from deep inside ``json`` or ``yaml``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

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
        raise UserError(
            f"{what} {file} is not UTF-8 text (byte {err.start}: {raw[err.start : err.start + 1]!r})"
        ) from err


class DuplicateKeyError(UserError):
    """A mapping in a config file names one key twice (which value was meant cannot be told)."""


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKeyError(f"key {key!r} appears twice in one mapping")
        seen[key] = value
    return seen


def _yaml_loader() -> Any:
    """A safe YAML loader that refuses duplicate keys and reads numbers as YAML 1.2 does:
    ``1e-3`` is a float (YAML 1.1, and so pyyaml, reads it as the string ``'1e-3'``)."""
    import re

    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            keys = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in keys:
                    mark = key_node.start_mark
                    raise DuplicateKeyError(f"key {key!r} appears twice in one mapping (line {mark.line + 1})")
                keys.add(key)
            return super().construct_mapping(node, deep=deep)

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"))
    return Loader


def read_mapping_file(path: str | os.PathLike, what: str = "config file") -> dict[str, Any]:
    """A JSON (or, for ``.yaml``/``.yml``, YAML) file whose top level is a mapping.

    Numbers in YAML are read as YAML 1.2 reads them (``lr: 1e-3`` is a float). A key given
    twice in one mapping is refused (a JSON or YAML reader would silently keep the last).

    Raises:
        UserError: Naming the file when it is unreadable, not UTF-8, malformed, has a
            duplicate key, or is not a mapping.
    """
    file = Path(path)
    text = read_text_file(file, what)
    if file.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as err:  # pragma: no cover - pyyaml ships with transformers
            raise UserError(f"reading the YAML {what} {file} needs pyyaml (pip install pyyaml)") from err
        try:
            data = yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
        except DuplicateKeyError as err:
            raise DuplicateKeyError(f"{what} {file}: {err}; keep one") from err
        except yaml.YAMLError as err:
            where = getattr(err, "problem_mark", None)
            at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
            raise UserError(f"{what} {file} is not valid YAML{at}: {getattr(err, 'problem', None) or err}") from err
    else:
        try:
            data = json.loads(text, object_pairs_hook=_json_pairs)
        except DuplicateKeyError as err:
            raise DuplicateKeyError(f"{what} {file}: {err}; keep one") from err
        except json.JSONDecodeError as err:
            raise UserError(f"{what} {file} is not valid JSON (line {err.lineno}, column {err.colno}: "
                            f"{err.msg}); truncated or malformed?") from err
    if not isinstance(data, dict):
        raise UserError(f"{what} {file} must hold a mapping (key: value pairs), got {type(data).__name__}")
    return data


def check_output_dir(path: str | os.PathLike, flag: str) -> Path:
    """Refuse, before any work, an output folder that cannot be one: an existing file (or
    device, such as ``/dev/null``), or a path below a file. Nothing is created.

    Args:
        path: The folder outputs will be written into.
        flag: The option that gave it (named in the error), e.g. ``--out-dir``.

    Raises:
        UserError: Naming the flag, the path and the file in the way.
    """
    path = Path(path)
    for ancestor in (path, *path.parents):
        if ancestor.exists():
            if not ancestor.is_dir():
                where = "is" if ancestor == path else f"lies below {ancestor}, which is"
                raise UserError(f"{flag} {path} {where} a file, not a folder; expected a folder for the outputs "
                                f"(an existing one or one to create)")
            break
    return path


def check_output_file(path: str | os.PathLike, flag: str, suffixes: Sequence[str]) -> Path:
    """Refuse, before any work, an output file of a kind that is not written (its suffix
    not one of ``suffixes``, e.g. ``x.gif`` for a png/svg/pdf figure), or one that would
    land below a file or replace a folder.

    Raises:
        UserError: Naming the flag, the path and what is expected.
    """
    path = Path(path)
    suffix = path.suffix[1:].lower()
    if suffix and suffix not in suffixes:
        raise UserError(f"{flag} {path} has suffix .{suffix}; expected one of "
                        f"{', '.join('.' + s for s in suffixes)} (or no suffix)")
    if path.is_dir():
        raise UserError(f"{flag} {path} is a folder; expected a file name")
    check_output_dir(path.parent, flag)
    return path


__all__ = ["DuplicateKeyError", "check_output_dir", "check_output_file", "read_mapping_file", "read_text_file"]
