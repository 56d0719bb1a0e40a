"""Checkpoint sources behind one interface: toolkit runs, local HF directories, Hub revisions.

A :class:`CheckpointRef` names one checkpoint and loads it as a TransformerLens
``TransformerBridge``:

* ``kind="toolkit"``: a toolkit ``.safetensors`` checkpoint (:func:`load_checkpoint`);
* ``kind="hf_local"``: a local Hugging Face model directory (``save_pretrained`` output, e.g.
  a ``GPTNeoXForCausalLM``), through ``TransformerBridge.boot_transformers(path)``;
* ``kind="hub"``: a Hub model name and revision (e.g. ``EleutherAI/pythia-14m`` at
  ``step1000``), through ``TransformerBridge.boot_transformers(name, revision=...)``.
  Local directories and Hub names share one loader (:func:`_boot_hf`), so testing a local
  directory exercises the Hub code path too.

:func:`resolve_checkpoints` turns command-line specs into refs::

    runs/my_run                       # toolkit run dir (checkpoints/epoch_*.safetensors)
    runs/my_run/checkpoints/epoch_000100.safetensors
    testbed/checkpoints               # folder of HF dirs (step0/, step1/, ...), sorted by step
    testbed/checkpoints/step512       # one HF dir (has config.json)
    hub:EleutherAI/pythia-14m@step1000,step2000
    hub:EleutherAI/pythia-14m@step{1000..143000:10000}   # a range: step1000, step11000, ..., step141000
    hub:EleutherAI/pythia-14m@pythia                    # Pythia's 154 checkpoints (step0 .. step143000)

A range ``PREFIX{START..STOP:EVERY}SUFFIX`` (``:EVERY`` optional, default 1) expands to
``START, START + EVERY, ...`` up to and including ``STOP`` (:func:`expand_revisions`);
ranges and plain revisions mix freely (``step0,step{512..2000:512}``).
:func:`pythia_revisions` lists Pythia's schedule (:func:`pythia_schedule` its steps, for
any length). Resolving specs never touches the network; loading a Hub revision that is not
cached offline fails with the same :class:`CheckpointLoadError` for every revision of a range.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from interp_toolkit.errors import UserError
from interp_toolkit.runs.layout import CHECKPOINTS

__all__ = [
    "CheckpointLoadError",
    "CheckpointRef",
    "check_hf_weight_files",
    "expand_revisions",
    "hf_local_checkpoints",
    "hub_checkpoints",
    "pythia_revisions",
    "pythia_schedule",
    "resolve_checkpoints",
    "toolkit_checkpoints",
]

KINDS = ("toolkit", "hf_local", "hub")
_STEP = re.compile(r"(\d+)$")
_RANGE = re.compile(r"\{([^{}]*)\}")
_RANGE_BODY = re.compile(r"^\s*(\d+)\s*\.\.\s*(\d+)\s*(?::\s*(\d+)\s*)?$")
#: Most revisions one range may expand to (a typo like ``{0..143000}`` would list 143,001).
MAX_RANGE_REVISIONS = 10_000


class CheckpointLoadError(UserError):
    """A checkpoint could not be found or loaded (the message says how to fix it)."""


def _step_of(text: str) -> int | None:
    match = _STEP.search(text)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class CheckpointRef:
    """One checkpoint of a training run.

    Attributes:
        kind: ``"toolkit"``, ``"hf_local"`` or ``"hub"``.
        location: File or directory path, or Hub model name.
        step: Training step / epoch (the time axis), or ``None`` if unknown.
        revision: Hub revision (branch, tag or commit), ``kind="hub"`` only.
    """

    kind: str
    location: str
    step: int | None = None
    revision: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UserError(f"CheckpointRef.kind must be one of {KINDS}, got {self.kind!r}")
        if not isinstance(self.location, str) or not self.location:
            raise UserError(f"CheckpointRef.location must be a non-empty string, got {self.location!r}")
        if self.revision is not None and self.kind != "hub":
            raise UserError(f"CheckpointRef.revision is for kind 'hub' only, got kind {self.kind!r}")

    @property
    def label(self) -> str:
        """Short human-readable name."""
        if self.kind == "hub":
            return f"{self.location}@{self.revision or 'main'}"
        return Path(self.location).name

    def identity(self) -> dict[str, Any]:
        """JSON-able identity used in cache keys (includes file size and mtime for local files)."""
        ident: dict[str, Any] = {"kind": self.kind, "location": self.location, "revision": self.revision,
                                 "step": self.step}
        if self.kind != "hub":
            path = Path(self.location)
            files = [path] if path.is_file() else sorted(p for p in path.glob("*") if p.is_file())
            ident["files"] = [[p.name, p.stat().st_size, int(p.stat().st_mtime)] for p in files]
        return ident

    def load(self, device: str | torch.device | None = None, offline: bool | None = None) -> Any:
        """Load as a ``TransformerBridge`` in eval mode.

        Args:
            device: Target device (default: CPU).
            offline: For ``kind="hub"``: only use the local HF cache (fail fast, no network).
                ``None``: ``True`` if the ``HF_HUB_OFFLINE`` environment variable is set.

        Raises:
            CheckpointLoadError: Missing file, unloadable directory, or a Hub name that is
                neither cached nor reachable.
        """
        if self.kind == "toolkit":
            from interp_toolkit.checkpoint import load_checkpoint

            if not Path(self.location).is_file():
                raise CheckpointLoadError(f"toolkit checkpoint {self.location} does not exist")
            model, _ = load_checkpoint(self.location, device=device)
            return model
        if self.kind == "hf_local":
            if not (Path(self.location) / "config.json").is_file():
                raise CheckpointLoadError(
                    f"{self.location} is not a Hugging Face model directory (no config.json); "
                    "save one with model.save_pretrained(path)"
                )
            check_hf_weight_files(self.location)
        return _boot_hf(self.location, self.revision, device, offline, hub=self.kind == "hub")


#: Weight files of the pickle format: never loaded (unpickling can run code).
_PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


def check_hf_weight_files(directory: str | Path) -> None:
    """Check a local HF model directory's weight files before anything loads them: every
    ``*.safetensors`` shard complete (its header parses and the file holds all the bytes it
    declares), and no pickle weights (``pytorch_model.bin`` ...) without safetensors ones.

    Raises:
        CheckpointLoadError: Naming the file that is truncated, corrupted or a pickle.
    """
    import json

    directory = Path(directory)
    shards = sorted(directory.glob("*.safetensors"))
    pickles = sorted(p for pattern in _PICKLE_WEIGHTS for p in directory.glob(pattern))
    if pickles and not shards:
        raise CheckpointLoadError(
            f"{pickles[0]} is a pickle weight file, which interp_toolkit never loads because unpickling can run "
            f"arbitrary code; convert it to safetensors where you trust it (model.save_pretrained(path, "
            f"safe_serialization=True)) and pass that directory")
    for shard in shards:
        try:
            with open(shard, "rb") as handle:
                header_len = int.from_bytes(handle.read(8), "little")
                if not 0 < header_len < 100_000_000:
                    raise UserError(f"header length {header_len}")
                header = json.loads(handle.read(header_len))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
            size = shard.stat().st_size
        except (OSError, ValueError, UserError, TypeError, KeyError, AttributeError, IndexError) as err:
            raise CheckpointLoadError(f"weight file {shard} is truncated or corrupted ({err})") from err
        if size < 8 + header_len + end:
            raise CheckpointLoadError(f"weight file {shard} is truncated: it holds {size} bytes, its header declares "
                                      f"{8 + header_len + end}; copy or download it again")


def _boot_hf(name: str, revision: str | None, device: Any, offline: bool | None, hub: bool) -> Any:
    """The one loader for local HF directories and Hub names (``boot_transformers``)."""
    from transformer_lens.model_bridge import TransformerBridge

    if offline is None:
        offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
    where = f"{name}@{revision}" if revision else name
    hint = (
        f"cannot load Hugging Face model {where!r}: it is not in the local HF cache and the Hub "
        "cannot be reached (offline?). Download it where the Hub is reachable "
        f"(`huggingface-cli download {name}{' --revision ' + revision if revision else ''}`) "
        "and copy the cache, or save it with save_pretrained and pass the local directory."
    )
    if hub and offline and not Path(name).is_dir():
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json", revision=revision or "main")
        if not isinstance(cached, str):
            raise CheckpointLoadError(hint)
    try:
        model = TransformerBridge.boot_transformers(name, revision=revision, device=device or "cpu")
    except (OSError, ValueError, EnvironmentError) as err:  # HF raises OSError when offline / missing
        if hub:
            raise CheckpointLoadError(f"{hint} ({type(err).__name__}: {str(err).splitlines()[0][:200]})") from err
        raise CheckpointLoadError(f"cannot load local HF directory {name}: {err}") from err
    model.eval()
    return model


def toolkit_checkpoints(run_dir: str | Path) -> list[CheckpointRef]:
    """All checkpoints of a toolkit run directory, by epoch."""
    from interp_toolkit.runs.trainer import list_checkpoints

    found = list_checkpoints(run_dir)
    if not found:
        raise CheckpointLoadError(f"no toolkit checkpoints under {Path(run_dir) / CHECKPOINTS}")
    return [CheckpointRef("toolkit", str(path), step=epoch) for epoch, path in found]


def hf_local_checkpoints(path: str | Path) -> list[CheckpointRef]:
    """One HF directory, or every HF directory directly inside ``path``, sorted by step.

    The step is the trailing number of the directory name (``step512`` -> 512), or the
    ``"step"`` key of a ``checkpoint.json`` beside its ``config.json`` if there is one.
    """
    path = Path(path)
    if (path / "config.json").is_file():
        dirs = [path]
    else:
        dirs = [d for d in sorted(path.iterdir()) if (d / "config.json").is_file()] if path.is_dir() else []
    if not dirs:
        raise CheckpointLoadError(f"no Hugging Face model directories (with config.json) at {path}")
    refs = []
    for d in dirs:
        step = _step_of(d.name)
        meta = d / "checkpoint.json"
        if meta.is_file():
            import json

            step = json.loads(meta.read_text()).get("step", step)
        refs.append(CheckpointRef("hf_local", str(d), step=step))
    return sorted(refs, key=lambda r: (r.step is None, r.step if r.step is not None else 0, r.location))


def pythia_schedule(total_steps: int, linear_every: int) -> list[int]:
    """Checkpoint steps: 0, powers of two below ``linear_every``, then every ``linear_every``.

    ``pythia_schedule(143000, 1000)`` is Pythia's 154 checkpoints.
    """
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise UserError(f"total_steps must be an integer >= 1, got {total_steps!r}")
    if isinstance(linear_every, bool) or not isinstance(linear_every, int) or linear_every < 1:
        raise UserError(f"linear_every must be an integer >= 1, got {linear_every!r}")
    steps = {0}
    power = 1
    while power < linear_every and power <= total_steps:
        steps.add(power)
        power *= 2
    steps.update(range(linear_every, total_steps + 1, linear_every))
    steps.add(total_steps)
    return sorted(steps)


def pythia_revisions(total_steps: int = 143_000, linear_every: int = 1000) -> list[str]:
    """Pythia's checkpoint revisions: ``step0``, ``step1``, ``step2``, ``step4``, ...,
    ``step512``, then every ``linear_every`` steps to ``total_steps`` (154 by default)."""
    return [f"step{s}" for s in pythia_schedule(total_steps, linear_every)]


def expand_revisions(text: str) -> list[str]:
    """Expand a comma-separated revision list with ``PREFIX{START..STOP:EVERY}`` ranges.

    ``"pythia"`` alone stands for :func:`pythia_revisions`. Duplicates are dropped, order kept.

    Raises:
        CheckpointLoadError: A malformed or empty range (the message shows the expected form).
    """
    if text.strip() == "pythia":
        return pythia_revisions()
    out: list[str] = []
    # split on commas outside braces
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    for part in (p.strip() for p in parts):
        if not part:
            continue
        ranges = _RANGE.findall(part)
        if not ranges and "{" not in part and "}" not in part:
            out.append(part)
            continue
        body = _RANGE_BODY.match(ranges[0]) if len(ranges) == 1 else None
        if body is None:
            raise CheckpointLoadError(
                f"revision range {part!r} is malformed; expected PREFIX{{START..STOP:EVERY}}, e.g. "
                f"step{{1000..143000:10000}}"
            )
        start, stop, every = int(body.group(1)), int(body.group(2)), int(body.group(3) or 1)
        if every < 1 or stop < start:
            raise CheckpointLoadError(
                f"revision range {part!r} is empty: need START <= STOP and EVERY >= 1 (got {start}..{stop}:{every})"
            )
        count = (stop - start) // every + 1
        if count > MAX_RANGE_REVISIONS:
            raise CheckpointLoadError(
                f"revision range {part!r} expands to {count} revisions (> {MAX_RANGE_REVISIONS}); use a larger EVERY"
            )
        span = _RANGE.search(part)
        assert span is not None  # part holds exactly one range (checked above)
        prefix, suffix = part[: span.start()], part[span.end() :]
        out.extend(f"{prefix}{value}{suffix}" for value in range(start, stop + 1, every))
    return list(dict.fromkeys(out))


def hub_checkpoints(name: str, revisions: Sequence[str | None]) -> list[CheckpointRef]:
    """Refs for Hub revisions of ``name`` (step = trailing number of the revision, if any)."""
    if not revisions:
        revisions = [None]
    return [CheckpointRef("hub", name, step=_step_of(r) if r else None, revision=r) for r in revisions]


def resolve_checkpoints(specs: Sequence[str | Path]) -> list[CheckpointRef]:
    """Turn specs (see the module docstring) into checkpoint refs, in the given order.

    Raises:
        CheckpointLoadError: A spec names nothing loadable.
    """
    refs: list[CheckpointRef] = []
    for spec in specs:
        text = str(spec)
        if text.startswith("hub:"):
            name, _, revs = text[4:].partition("@")
            if not name:
                raise CheckpointLoadError(f"hub spec {text!r} has no model name; expected hub:NAME[@REV[,REV...]] (REV "
                                          f"may be a range PREFIX{{START..STOP:EVERY}})")
            refs.extend(hub_checkpoints(name, expand_revisions(revs) if revs else []))
            continue
        path = Path(text)
        if path.is_file() and path.suffix == ".safetensors":
            refs.append(CheckpointRef("toolkit", str(path), step=_step_of(path.stem)))
        elif path.is_dir() and (path / CHECKPOINTS).is_dir() and any((path / CHECKPOINTS).glob("epoch_*.safetensors")):
            refs.extend(toolkit_checkpoints(path))
        elif path.is_dir():
            refs.extend(hf_local_checkpoints(path))
        else:
            raise CheckpointLoadError(
                f"checkpoint spec {text!r} is neither an existing file/directory nor hub:NAME@REV"
            )
    # Before any checkpoint is loaded: a checkpoint listed twice would be measured (and plotted) twice.
    seen: dict[tuple[str, str, str | None], int] = {}
    for ref in refs:
        where = str(Path(ref.location).resolve()) if ref.kind != "hub" else ref.location
        identity = (ref.kind, where, ref.revision)
        seen[identity] = seen.get(identity, 0) + 1
    repeated = [f"{location}{'@' + revision if revision else ''}" for (_, location, revision), count in seen.items()
                if count > 1]
    if repeated:
        raise CheckpointLoadError(f"checkpoints given more than once: {', '.join(repeated)}; expected each "
                                  f"checkpoint once (the specs {[str(s) for s in specs]} overlap)")
    return refs
