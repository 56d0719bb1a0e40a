"""Your own task as a first-class task: a factory of splits, recorded in the run.

A *task factory* is a function that takes keyword settings and returns the named splits
of a task (``{"train": split, "val": split, ...}``); each split has ``.tokens``
``[n, pos]`` (token ids) and ``.labels`` ``[n]`` (class ids, read at the last position).
:class:`CustomTask` names a factory and its settings; a run trained on it
(``interp-toolkit train --task-factory SPEC``, or :func:`interp_toolkit.runs.mpsp.run_task`)
records both in ``run.json`` (``run_info.task``), so ``info``, ``analyze``, ``mechanism``,
``bif`` and ``influence`` rebuild its splits (checked against the run's data
fingerprints) with no code of yours on their command lines.

A factory is named by a spec:

- ``package.module:function``: an importable module (the current directory is searched
  first, as ``python -m`` does);
- ``path/to/file.py:function``: a Python file (recorded as an absolute path);
- ``name``: an entry point of group ``interp_toolkit.tasks`` of an installed distribution
  (``[project.entry-points."interp_toolkit.tasks"] sorted = "mypkg.tasks:make_splits"``).

What the analyses use beyond ``tokens`` and ``labels``, each optional (a command that
needs one names it when a task lacks it):

- ``split.agrees`` ``[n]`` (bool): the example's shortcut feature agrees with its label.
  The gradient-conflict panels, ``mechanism`` and ``influence`` need it on ``train``;
  ``mechanism`` also needs a ``val`` split where every example agrees and an ``adv``
  split where none does.
- ``split.minimal_pairs(seed=0)``: pairs of examples one token apart whose agreement with
  the shortcut flips (an object with ``source`` and ``target`` splits, ``len()`` and
  ``head(n)``, like :class:`interp_toolkit.tasks.mpsp.MinimalPairs`); cross-split
  patching needs it on its source split.

The model's sizes follow the data: ``n_ctx`` is the token length, ``d_vocab`` one more than
the largest token id and ``d_vocab_out`` one more than the largest label of any split;
return a :class:`TaskSplits` with ``d_vocab`` / ``d_vocab_out`` to reserve more.
The worked example is ``examples/custom_task.py``; the guide is docs/custom_tasks.md.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from interp_toolkit.errors import UserError

#: Entry-point group under which installed distributions register task factories.
ENTRY_POINT_GROUP = "interp_toolkit.tasks"


class TaskSplits(dict):
    """The splits a factory returns, with the vocabulary sizes a model needs when they are
    larger than the data shows (a token or class that no example uses).

    Args:
        splits: Split name -> split.
        d_vocab: Input vocabulary size (default: one more than the largest token id).
        d_vocab_out: Number of classes (default: one more than the largest label).
    """

    def __init__(self, splits: Mapping[str, Any], d_vocab: int | None = None, d_vocab_out: int | None = None):
        super().__init__(splits)
        self.d_vocab = d_vocab
        self.d_vocab_out = d_vocab_out


def _spec_error(spec: str, why: str) -> UserError:
    return UserError(f"task factory {spec!r}: {why}; expected 'package.module:function', "
                     f"'path/to/file.py:function' or the name of a {ENTRY_POINT_GROUP!r} entry point")


def _raised(spec: str, doing: str, err: BaseException) -> UserError:
    """The factory's own failure, named as the factory's (not the toolkit's)."""
    lines = str(err).strip().splitlines()
    last = lines[-1] if lines else ""
    where = ""
    if isinstance(err, SyntaxError) and err.filename:
        where = f" ({err.filename}, line {err.lineno})"
    return UserError(f"task factory {spec!r} failed while {doing}: {type(err).__name__}: {last}{where}")


@contextlib.contextmanager
def _importable(folder: Path | None) -> Iterator[None]:
    """``folder`` first on ``sys.path`` within the block (a factory file's helpers beside it)."""
    entry = str(folder) if folder is not None else None
    added = entry is not None and entry not in sys.path
    if added:
        sys.path.insert(0, str(entry))
    try:
        yield
    finally:
        if added and entry in sys.path:
            sys.path.remove(str(entry))


def _factory_folder(spec: str) -> Path | None:
    module, sep, _ = spec.rpartition(":")
    if sep and module.endswith(".py"):
        return Path(module).parent
    return Path.cwd() if sep else None  # a module spec is looked up beside the caller, as `python -m`


def call_factory(spec: str, factory: Callable[..., Any], settings: Mapping[str, Any]) -> Any:
    """``factory(**settings)`` run as the user's code: its prints and warnings reach the user
    (outside the flag parser's capture), its folder is importable, and what it must not change is
    checked. UserError naming the factory when it raises, exits, or changes the working folder
    or torch's default dtype (both restored first: neither is part of a run's identity, so a run
    would silently depend on them)."""
    import torch

    from interp_toolkit.config import uncaptured

    cwd, dtype = os.getcwd(), torch.get_default_dtype()
    try:
        with uncaptured(), _importable(_factory_folder(spec)):
            made = factory(**settings)
    except SystemExit as err:
        raise UserError(f"task factory {spec!r} called sys.exit({err.code!r}); a factory must return its "
                        "splits (or raise an exception naming what is wrong)") from None
    except Exception as err:  # noqa: BLE001 - the user's code: any failure is reported as theirs
        raise _raised(spec, "building its splits", err) from err
    finally:
        changed_cwd, changed_dtype = os.getcwd(), torch.get_default_dtype()
        os.chdir(cwd)
        torch.set_default_dtype(dtype)
    if changed_cwd != cwd:
        raise UserError(f"task factory {spec!r} changed the working folder from {cwd} to {changed_cwd}; a factory "
                        "must leave it (run directories and relative paths are resolved against it): use absolute "
                        "paths instead of os.chdir")
    if changed_dtype != dtype:
        raise UserError(f"task factory {spec!r} changed torch's default dtype from {dtype} to {changed_dtype}; a "
                        "factory must leave it (a run's dtype is not its factory's to set): create tensors with an "
                        "explicit dtype instead of torch.set_default_dtype")
    return made


def normalize_spec(spec: str) -> str:
    """``spec`` as a run records it: a file path made absolute, anything else as given."""
    if not isinstance(spec, str) or not spec.strip():
        raise _spec_error(str(spec), "empty")
    module, sep, function = spec.rpartition(":")
    if sep and module.endswith(".py"):
        return f"{Path(module).expanduser().resolve()}:{function}"
    return spec


def _load_file(path: Path, spec: str) -> Any:
    if not path.is_file():
        raise _spec_error(spec, f"file {path} does not exist")
    name = f"interp_toolkit_task_{abs(hash(str(path)))}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise _spec_error(spec, f"{path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        with _importable(path.parent):
            module_spec.loader.exec_module(module)
    except SystemExit as err:
        del sys.modules[name]
        raise UserError(f"task factory {spec!r}: importing {path} called sys.exit({err.code!r})") from None
    except Exception as err:  # noqa: BLE001 - the user's file: any failure is reported as theirs
        del sys.modules[name]
        raise _raised(spec, f"importing {path}", err) from err
    return module


def _import_module(name: str, spec: str) -> Any:
    cwd = str(Path.cwd())
    added = cwd not in sys.path
    if added:  # as `python -m` would: a module beside the caller is found
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name and name.startswith(err.name):
            raise _spec_error(spec, f"no module named {err.name!r} (searched from {cwd})") from err
        raise _raised(spec, f"importing {name}", err) from err
    except SystemExit as err:
        raise UserError(f"task factory {spec!r}: importing {name} called sys.exit({err.code!r})") from None
    except Exception as err:  # noqa: BLE001 - the user's module: any failure is reported as theirs
        raise _raised(spec, f"importing {name}", err) from err
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def resolve_factory(spec: str) -> Callable[..., Mapping[str, Any]]:
    """The factory function a spec names (see the module docstring).

    Raises:
        ValueError: Naming the spec, when it names no module, file, function or entry point.
    """
    spec = normalize_spec(spec)
    module_name, sep, function = spec.rpartition(":")
    if not sep:
        from importlib.metadata import entry_points

        found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == spec]
        if not found:
            known = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
            raise _spec_error(spec, f"no entry point of that name (installed: {known or 'none'})")
        try:
            factory = found[0].load()
        except Exception as err:  # noqa: BLE001 - the distribution's code
            raise _raised(spec, f"loading entry point {found[0].value!r}", err) from err
    else:
        if not module_name or not function:
            raise _spec_error(spec, "module or function missing")
        module = (_load_file(Path(module_name), spec) if module_name.endswith(".py")
                  else _import_module(module_name, spec))
        factory = getattr(module, function, None)
        if factory is None:
            raise _spec_error(spec, f"{module_name} has no attribute {function!r}")
    if not callable(factory):
        raise _spec_error(spec, f"{factory!r} is not callable")
    return factory


def check_settings(spec: str, factory: Callable[..., Any], settings: Mapping[str, Any]) -> None:
    """ValueError naming settings the factory does not accept (before it runs)."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return
    params = signature.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    accepted = [p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                      inspect.Parameter.KEYWORD_ONLY)]
    unknown = sorted(set(settings) - set(accepted))
    if unknown:
        raise UserError(f"task factory {spec!r} does not accept settings {unknown}; it accepts {accepted}")


def check_splits(spec: str, splits: Any) -> None:
    """UserError, before anything is trained or written, unless a factory's result is a
    non-empty mapping of string split names (one of them ``train``) to splits whose ``tokens``
    ``[n, pos]`` and ``labels`` ``[n]`` are ``torch.int64`` CPU tensors with n >= 1 and pos >= 1,
    non-negative ids, and an optional ``agrees`` that is a bool tensor ``[n]``. The message names
    the split, the attribute, and its shape, dtype or device."""
    import torch

    if not isinstance(splits, Mapping) or not splits:
        raise UserError(f"task factory {spec!r} returned {type(splits).__name__}; expected a non-empty mapping "
                        "of split name -> split (with .tokens [n, pos] and .labels [n])")
    odd = [key for key in splits if not isinstance(key, str) or not key]
    if odd:
        raise UserError(f"task factory {spec!r} returned split names {odd!r}; expected non-empty strings "
                        "('train', 'val', 'adv', ...)")
    if "train" not in splits:
        raise UserError(f"task factory {spec!r} returned splits {sorted(splits)}; expected one named 'train'")
    for name, split in splits.items():
        where = f"split {name!r} of task factory {spec!r}"
        tokens, labels = getattr(split, "tokens", None), getattr(split, "labels", None)
        if not isinstance(tokens, torch.Tensor) or not isinstance(labels, torch.Tensor):
            raise UserError(f"{where} needs tensors .tokens and .labels, got "
                            f"{type(tokens).__name__} and {type(labels).__name__}")
        for attr, tensor in (("tokens", tokens), ("labels", labels)):
            if tensor.device.type != "cpu":
                raise UserError(f"{where}: .{attr} is on device {tensor.device}; expected CPU tensors (the toolkit "
                                "moves them to --device itself; return them with .cpu())")
            if tensor.dtype != torch.int64:
                raise UserError(f"{where}: .{attr} has dtype {tensor.dtype}; expected torch.int64 ids (convert "
                                f"with .long(): no other dtype is converted for you, so what trains is what you "
                                "returned)")
        if tokens.dim() != 2 or labels.dim() != 1 or tokens.shape[0] != labels.shape[0] or tokens.shape[0] == 0:
            raise UserError(f"{where}: expected .tokens [n, pos] and .labels [n] with n >= 1, got "
                            f"{tuple(tokens.shape)} and {tuple(labels.shape)}")
        if tokens.shape[1] == 0:
            raise UserError(f"{where}: .tokens {tuple(tokens.shape)} has no positions; expected [n, pos] with pos >= 1")
        if int(tokens.min()) < 0 or int(labels.min()) < 0:
            raise UserError(f"{where} holds a negative token id or label (min token {int(tokens.min())}, "
                            f"min label {int(labels.min())}); expected ids >= 0")
        agrees = getattr(split, "agrees", None)
        if agrees is None:
            continue
        if not isinstance(agrees, torch.Tensor) or agrees.shape != labels.shape:
            raise UserError(f"{where}: .agrees must be a bool tensor [n] like .labels {tuple(labels.shape)}, got "
                            f"{tuple(agrees.shape) if isinstance(agrees, torch.Tensor) else type(agrees).__name__}")
        if agrees.dtype != torch.bool or agrees.device.type != "cpu":
            raise UserError(f"{where}: .agrees has dtype {agrees.dtype} on {agrees.device}; expected a CPU bool "
                            "tensor (True where the shortcut agrees with the label; e.g. agrees == 1)")


@dataclass
class CustomTask:
    """A task made by a factory function (see the module docstring).

    Attributes:
        factory: The factory's spec (a file path is recorded absolute).
        settings: Keyword arguments of the factory (JSON-able: they are recorded).
        name: What run names and tables call the task (default: the factory function's name).
    """

    factory: str
    settings: dict[str, Any] = field(default_factory=dict)
    name: str = ""

    def __post_init__(self) -> None:
        import json

        self.factory = normalize_spec(self.factory)
        if not isinstance(self.settings, Mapping):
            raise UserError(f"task settings must be a mapping of factory keyword -> value, got {self.settings!r}")
        self.settings = dict(self.settings)
        try:
            json.dumps(self.settings, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise UserError(f"task settings must be JSON values (they are recorded in run.json): {err}") from err
        if not self.name:
            self.name = self.factory.rpartition(":")[2] or self.factory
        self._splits: TaskSplits | None = None

    def to_dict(self) -> dict[str, Any]:
        """What a run records as its task (``run_info.task``)."""
        return {"name": self.name, "factory": self.factory, "settings": dict(self.settings)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CustomTask":
        unknown = sorted(set(data) - {"name", "factory", "settings"})
        if unknown or "factory" not in data:
            raise UserError(f"a custom task record holds name, factory and settings; got keys {sorted(data)}")
        return cls(factory=data["factory"], settings=dict(data.get("settings") or {}), name=data.get("name") or "")

    def splits(self) -> TaskSplits:
        """The factory's splits (built once per instance, then reused)."""
        if self._splits is None:
            factory = resolve_factory(self.factory)
            check_settings(self.factory, factory, self.settings)
            made = call_factory(self.factory, factory, self.settings)
            check_splits(self.factory, made)
            self._splits = made if isinstance(made, TaskSplits) else TaskSplits(made)
        return self._splits

    def model_dims(self) -> dict[str, int]:
        """``d_vocab``, ``n_ctx`` and ``d_vocab_out`` of a model for these splits."""
        splits = self.splits()
        n_ctx = max(int(s.tokens.shape[1]) for s in splits.values())
        d_vocab = max(int(s.tokens.max()) for s in splits.values()) + 1
        d_vocab_out = max(int(s.labels.max()) for s in splits.values()) + 1
        return {"d_vocab": max(d_vocab, splits.d_vocab or 0), "n_ctx": n_ctx,
                "d_vocab_out": max(d_vocab_out, splits.d_vocab_out or 0)}

    @property
    def modulus(self) -> int:
        """The number of classes (chance accuracy is 1 / modulus, as for MPSP's m)."""
        return self.model_dims()["d_vocab_out"]

    def agrees(self, split: str = "train") -> Any:
        """``split``'s ``.agrees``; ValueError naming it when the task does not say which
        examples follow its shortcut."""
        splits = self.splits()
        if split not in splits:
            raise UserError(f"task {self.name!r} has no {split!r} split (it has {sorted(splits)})")
        agrees = getattr(splits[split], "agrees", None)
        if agrees is None:
            raise UserError(f"task {self.name!r} ({self.factory}): split {split!r} has no .agrees (a bool tensor "
                             "[n]: the shortcut agrees with the label), which the spurious ratio r and the shortcut "
                             "analyses need; "
                             "see docs/custom_tasks.md")
        return agrees

    @property
    def r(self) -> float:
        """The spurious ratio of the training split: the fraction of ``train.agrees``."""
        return float(self.agrees("train").float().mean())


def split_subset(split: Any, index: Any) -> Any:
    """The examples of ``split`` at ``index``: its own ``subset`` when it has one, else a
    split of its ``tokens``, ``labels`` and ``agrees`` (when present) at ``index``."""
    if callable(getattr(split, "subset", None)):
        return split.subset(index)
    from types import SimpleNamespace

    agrees = getattr(split, "agrees", None)
    return SimpleNamespace(tokens=split.tokens[index], labels=split.labels[index],
                           agrees=None if agrees is None else agrees[index])


def describe_task(task: Mapping[str, Any] | None) -> str:
    """A recorded task (``run_info.task``) in a few words, from whatever keys it has: a custom
    task's name and its factory settings (``majority (n_bits=7, r=0.9)``), an MPSP task's name,
    r, length and n; never a key the task does not record (no ``None``)."""
    if not isinstance(task, Mapping) or not task:
        return "task not recorded"
    if is_custom_record(task):
        settings = task.get("settings") or {}
        inner = ", ".join(f"{k}={v}" for k, v in sorted(settings.items()))
        name = task.get("name") or str(task.get("factory"))
        return f"{name} ({inner})" if inner else str(name)
    parts = [str(task.get("name") or "max_parity_sum_parity")]
    for key, label in (("r", "r = {}"), ("seq_len", "seq_len {}"), ("n_train", "n_train {}")):
        if task.get(key) is not None:
            parts.append(label.format(task[key]))
    return ", ".join(parts)


def is_custom_record(task: Mapping[str, Any] | None) -> bool:
    """Whether a recorded task (``run_info.task``) is a custom task's."""
    return isinstance(task, Mapping) and "factory" in task


def task_splits(task: Any) -> Mapping[str, Any]:
    """The splits of an ``MPSPConfig`` or a :class:`CustomTask`."""
    if isinstance(task, CustomTask):
        return task.splits()
    from interp_toolkit.tasks.mpsp import make_splits

    return make_splits(task)


__all__ = ["ENTRY_POINT_GROUP", "CustomTask", "TaskSplits", "check_settings", "check_splits", "describe_task",
           "is_custom_record",
           "normalize_spec", "resolve_factory", "split_subset", "task_splits"]
