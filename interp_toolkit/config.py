"""One base for every config of the toolkit, and the command-line flags generated from it.

Every config is a ``@dataclass`` deriving from :class:`Config`, which gives it

- ``to_dict()`` / ``from_dict()`` (nested configs included, tuples stored as lists), with
  unknown keys rejected by name (a typo in a config file fails loudly, before any work);
- :meth:`Config.check` for validation messages that name the class, the field, the bad value
  and what was expected (a :class:`~interp_toolkit.errors.UserError`);
- :func:`load_config_file` (JSON or YAML) and :func:`parse_config`, which turns a command
  line into a config with `tyro <https://brentyi.github.io/tyro/>`_: one flag per field
  (``--field-name``, ``--no-flag`` for booleans; help from the class docstring's
  ``Attributes``), so that a new field is a new flag with the same default, plus
  ``--config FILE`` whose values the flags override.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import sys
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence, TypeVar, cast

from interp_toolkit.errors import UserError

C = TypeVar("C", bound="Config")

#: Seeds are integers in [0, SEED_LIMIT): torch generators take 64-bit seeds, and the
#: toolkit derives further seeds by adding offsets, so a margin is kept below 2**63.
SEED_LIMIT = 2**62


def check_seed(name: str, value: Any, what: str) -> None:
    """``ValueError`` naming ``name`` (e.g. ``MPSPConfig.seed``) and ``what`` it seeds unless
    ``value`` is an integer in [0, :data:`SEED_LIMIT`)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < SEED_LIMIT:
        raise UserError(f"{name} ({what}) must be an integer in [0, 2**62), got {value!r}")


def reject_unknown_keys(cls: type, data: Mapping[str, Any]) -> None:
    """Raise ``UserError`` naming every key of ``data`` that is not a field of ``cls``."""
    if not isinstance(data, Mapping):
        raise UserError(f"{cls.__name__} must be given as a mapping of its fields, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UserError(f"unknown {cls.__name__} keys {unknown}; expected a subset of {sorted(known)}")


def _plain(value: Any) -> Any:
    if isinstance(value, Config):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):  # a dict, or a mapping such as a sweep's Section
        return {k: _plain(v) for k, v in value.items()}
    return value


class Config:
    """Base of the toolkit's dataclass configs (derive and decorate with ``@dataclass``)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of every field (nested configs as dicts, tuples as lists)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls: type[C], data: Mapping[str, Any]) -> C:
        """Build from a dict (e.g. a config file), rejecting unknown keys by name.

        Nested config fields accept a dict of their own fields.
        """
        reject_unknown_keys(cls, data)
        values = dict(data)
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            nested = _nested_config_type(cls, f)
            if nested is None or f.name not in values or isinstance(values[f.name], nested):
                continue
            if not isinstance(values[f.name], Mapping):
                raise UserError(f"{cls.__name__}.{f.name} must be a mapping of {nested.__name__} fields, "
                                f"got {values[f.name]!r}")
            values[f.name] = nested.from_dict(values[f.name])
        _check_path_fields(cls, values)
        try:
            return cls(**values)
        except TypeError as err:  # e.g. a missing required field
            raise UserError(f"{cls.__name__}: {err}") from err

    def replace(self: C, **changes: Any) -> C:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]  # C is a dataclass

    def check(self, name: str, ok: bool, expected: str) -> None:
        """Raise a ``UserError`` naming ``Class.name``, its value and ``expected`` unless ``ok``."""
        if not ok:
            raise UserError(f"{type(self).__name__}.{name} must be {expected}, got {getattr(self, name)!r}")


def _path_fields(cls: type) -> set[str]:
    """Names of ``cls``'s fields annotated ``Path`` or ``Optional[Path]``."""
    import typing

    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - unresolvable annotations: no path fields to check
        return set()
    import types

    out = set()
    for name, hint in hints.items():
        optional_path = typing.get_origin(hint) in (typing.Union, types.UnionType) and \
            set(typing.get_args(hint)) == {Path, type(None)}
        if hint is Path or optional_path:
            out.add(name)
    return out


def _check_path_fields(cls: type, values: Mapping[str, Any]) -> None:
    """UserError naming a path field given something other than a non-empty path (a number
    in a config file, an empty string that would mean the current directory)."""
    for name in sorted(_path_fields(cls) & set(values)):
        value = values[name]
        if value is None or isinstance(value, Path):
            continue
        if not isinstance(value, str):
            raise UserError(f"{cls.__name__}.{name} must be a path (a string), got {value!r}")
        if not value.strip():
            raise UserError(f"{cls.__name__}.{name} must be a non-empty path, got {value!r}")


def refuse_empty_values(argv: Sequence[str]) -> None:
    """UserError naming a flag given an empty value (``--run-dir ''``, ``--run-dir=``): no flag
    takes one, and an empty path would silently mean the current directory."""
    items = list(argv)
    for i, token in enumerate(items):
        if not token.startswith("--"):
            continue
        flag, eq, value = token.partition("=")
        if eq and not value.strip():
            raise UserError(f"{flag} was given an empty value; give a value or leave the flag out")
        if not eq and i + 1 < len(items) and not items[i + 1].strip():
            raise UserError(f"{flag} was given an empty value; give a value or leave the flag out")


def _nested_config_type(cls: type, f: dataclasses.Field) -> type[Config] | None:
    """The ``Config`` subclass a field holds, if its default says so."""
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return type(default) if isinstance(default, Config) else None


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a JSON or YAML (``.yaml``/``.yml``) file holding a mapping.

    Raises:
        UserError: If the file is missing, a directory, not UTF-8, malformed, or not a mapping.
    """
    from interp_toolkit.userfiles import read_mapping_file

    return read_mapping_file(path, "config file")


def split_config_flag(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """``(FILE, rest)`` from an argv holding ``--config FILE`` (or ``--config=FILE``)."""
    rest: list[str] = []
    found = None
    items = list(argv)
    i = 0
    while i < len(items):
        token = items[i]
        if token == "--config":
            if i + 1 >= len(items):
                raise UserError("--config needs a file (JSON or YAML)")
            found = items[i + 1]
            i += 2
            continue
        if token.startswith("--config="):
            found = token.split("=", 1)[1]
        else:
            rest.append(token)
        i += 1
    return found, rest


def required_positional(metavar: str) -> Any:
    """tyro marker of a positional argument a command needs: ``--help`` shows ``METAVAR
    (required)`` instead of ``[{None}|PATH] (default: None)``.

    The field stays ``Optional`` with default ``None`` so that the command, not the parser,
    reports a missing argument (one ``error:`` line naming what is expected). Use it as
    ``run_dir: Annotated[Optional[Path], tyro.conf.Positional, required_positional("RUN_DIR")]``.

    Args:
        metavar: The argument's name in the usage line and help.
    """
    import tyro

    return tyro.conf.arg(metavar=metavar, help_behavior_hint="(required)")


def parse_config(
    cls: type[C],
    argv: Sequence[str],
    *,
    default: C | None = None,
    prog: str | None = None,
    description: str | None = None,
    aliases: Mapping[str, str | Sequence[str]] | None = None,
) -> C:
    """Parse ``argv`` into a ``cls`` with flags generated from its fields (tyro).

    Precedence: ``default`` (or the class defaults), then ``--config FILE`` (JSON/YAML of
    the fields), then the flags. Every command spells its flags alike: a field of a nested
    config is ``--SECTION.FIELD`` (``--sampler.eps``, ``--train.lr``), and also its own name
    (``--eps``) where no other section of the command has a field of that name and the
    command has no flag of that name (:func:`section_short_flags`).

    Args:
        cls: The command's config class.
        argv: The arguments after the subcommand name.
        default: Defaults of this command when they differ from the class's.
        prog, description: For ``--help``.
        aliases: More short flags -> generated flags (``{"--quiet": "--train.no-progress"}``),
            before the section fields' own names.

    Raises:
        SystemExit: On ``--help`` (0) or an unparsable flag (2, after one ``error:`` line).
        UserError: On a bad config file or a value the config's validation rejects.
    """
    import tyro

    config_file, rest = split_config_flag(argv)
    refuse_empty_values(rest)
    shorts = section_short_flags(cls)
    if shorts and description is not None:
        short, nested = next(iter(shorts.items()))
        description = (f"{description.rstrip()} A section's field also takes its own name where no other flag has it "
                       f"({short} = {nested}).")
    aliases = {**shorts, **(aliases or {})}
    used_aliases = {}  # generated flag -> the old spelling the user typed (named in errors)
    for token in rest:
        flag = token.partition("=")[0]
        new = (aliases or {}).get(flag)
        if isinstance(new, str):
            used_aliases[new] = flag
    rest = [expanded for token in rest for expanded in _alias(token, aliases or {})]
    start = default
    if config_file is not None:
        data = default.to_dict() if default is not None else _field_defaults(cls)
        data = _merge(data, load_config_file(config_file))
        try:
            start = cls.from_dict(data)
        except (ValueError, UserError, TypeError) as err:  # UserError included: name the file the bad value came from
            raise UserError(f"config file {config_file}: {err}") from err
    stderr, stdout = io.StringIO(), _Capture(sys.stdout)
    _REAL_OUTPUT.append((sys.stdout, sys.stderr))  # user code run while parsing writes here (uncaptured())
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
            # tyro types its result ``C | None`` for an optional default; it never returns None
            return cast(C, tyro.cli(cls, args=rest, default=start, prog=prog, description=description))
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            message = _one_line(stderr.getvalue())
            for new, old in used_aliases.items():
                message = message.replace(new, f"{old} ({new})")
            print(f"error: {message}", file=sys.stderr)
        else:
            sys.stdout.write(clean_help(stdout.getvalue() + stderr.getvalue()))
        raise
    finally:
        _REAL_OUTPUT.pop()


#: The streams :func:`parse_config` captured, innermost last (user code it runs must not be muted).
_REAL_OUTPUT: list[tuple[Any, Any]] = []


@contextlib.contextmanager
def uncaptured() -> Iterator[None]:
    """Within the block, ``sys.stdout`` and ``sys.stderr`` are the streams the flag parser
    captured, if it is capturing: code of the user's that a config runs while it is parsed
    (a task factory) prints and warns where the user sees it."""
    if not _REAL_OUTPUT:
        yield
        return
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _REAL_OUTPUT[-1]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved



def section_short_flags(cls: type) -> dict[str, str]:
    """``--FIELD -> --SECTION.FIELD`` for the fields of ``cls``'s nested configs (bools also
    ``--no-FIELD``) whose name no other section and no top-level field of ``cls`` has: the
    short spellings of :func:`parse_config` (``--eps`` for ``--sampler.eps``)."""
    import typing

    def dashed(name: str) -> str:
        return name.replace("_", "-")

    hints = typing.get_type_hints(cls)
    top = {f"--{dashed(f.name)}" for f in dataclasses.fields(cls)}
    found: dict[str, list[str]] = {}  # short flag -> the nested flags it could mean
    for f in dataclasses.fields(cls):
        kind = hints.get(f.name)
        if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
            continue
        inner = typing.get_type_hints(kind)
        for g in dataclasses.fields(kind):
            if not g.init:
                continue
            found.setdefault(f"--{dashed(g.name)}", []).append(f"--{f.name}.{dashed(g.name)}")
            if inner.get(g.name) is bool:
                found.setdefault(f"--no-{dashed(g.name)}", []).append(f"--{f.name}.no-{dashed(g.name)}")
    return {short: nested[0] for short, nested in found.items() if len(nested) == 1 and short not in top}


class _Capture(io.StringIO):
    """Captured standard output that looks like the real one to tyro's help formatter (its
    encoding decides box drawing, ``isatty`` colours), so ``--help`` renders as it would."""

    def __init__(self, real: Any) -> None:
        super().__init__()
        self._real = real

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self._real, "encoding", None) or "utf-8")

    def isatty(self) -> bool:
        try:
            return bool(self._real.isatty())
        except (AttributeError, ValueError):
            return False


#: What tyro's help shows of an optional field that no user types: ``{None}|INT`` is ``INT``,
#: ``{None,a,b}`` is ``{a,b}``; docstring markup (````name````) is plain ``name``.
_HELP_NOISE = (("{None}|", ""), ("{None,", "{"), ("``", ""))


def clean_help(text: str) -> str:
    """``--help`` text without what tyro derives from ``Optional`` annotations and docstring
    markup (see :data:`_HELP_NOISE`); a boxed line keeps its right border where it was."""
    out = []
    for line in text.split("\n"):
        cleaned = line
        for noise, plain in _HELP_NOISE:
            cleaned = cleaned.replace(noise, plain)
        removed = len(line) - len(cleaned)
        if removed and cleaned.rstrip().endswith("│"):
            body = cleaned.rstrip()
            cleaned = body[:-1] + " " * removed + "│"
        out.append(cleaned)
    return "\n".join(out)


def _field_defaults(cls: type) -> dict[str, Any]:
    """The defaults of ``cls``'s fields as plain data (nested configs as dicts)."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:
            out[f.name] = _plain(f.default_factory())
        elif f.default is not dataclasses.MISSING:
            out[f.name] = _plain(f.default)
    return out


def _alias(token: str, aliases: Mapping[str, str | Sequence[str]]) -> list[str]:
    flag, eq, value = token.partition("=")
    if flag not in aliases:
        return [token]
    new = aliases[flag]
    if isinstance(new, str):
        return [new + eq + value]
    return list(new)


def _merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _one_line(text: str) -> str:
    """The message of tyro's boxed parse error, on one line."""
    lines = []
    for raw in text.splitlines():
        line = raw.strip().strip("│╭╮╰╯─|+ ").strip()
        if not line or line.lower().startswith(("usage:", "for full helptext", "parsing error")):
            continue
        if set(line) <= set("─━-=_ "):
            continue
        lines.append(line)
    text = " ".join(" ".join(lines).split())
    text = text.split(" Argument helptext:")[0]
    for title in ("Value error ", "Unrecognized options ", "Required options ", "Invalid choice "):
        if text.startswith(title):  # tyro's panel title, repeated by its first line
            text = text[len(title):]
    if text.startswith("Error parsing "):
        text = text[len("Error parsing "):]
    return text or "invalid arguments (see --help)"


__all__ = ["SEED_LIMIT", "Config", "check_seed", "load_config_file", "parse_config", "reject_unknown_keys",
           "split_config_flag", "uncaptured"]
