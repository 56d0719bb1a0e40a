"""Atomic file writes, config hashing, the one tensor digest and the one artifact format.

Nothing half-written is ever left behind: every file goes through a temp file and a rename.

Artifacts (checkpoints, BIF and LM BIF results, DLN states) are single ``.safetensors``
files whose header holds JSON metadata, the :func:`tensor_digest` of every tensor and a
:func:`header_digest` over that JSON (:func:`save_artifact`); :func:`load_artifact` verifies
every digest while reading, in one pass, and raises
:class:`~interp_toolkit.errors.CheckpointError` naming the file and the tensor (or the
header) that does not match. Artifacts of format 1 (before the header digest) are still
read; their metadata is not covered.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from interp_toolkit.errors import CheckpointError, UserError, notice

if TYPE_CHECKING:
    import torch

ARTIFACT_KEY = "interp_toolkit.artifact"
#: 2: the header carries ``header_digest`` (1: tensor digests only; still read).
ARTIFACT_FORMAT = 2
#: The key of the digest over a JSON header's other fields (:func:`header_digest`).
HEADER_DIGEST_KEY = "header_digest"


def _process_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: Read once at import: os.umask can only be read by setting it, which threads would race.
_UMASK = _process_umask()


def remove_orphan_temps(directory: str | os.PathLike) -> list[Path]:
    """Delete the temp files a writer killed mid-write left in ``directory`` (the
    ``.NAME.*.tmp`` of :func:`atomic_write_bytes`; the target itself was never replaced, so
    nothing is lost). Call it only while holding the directory's lock: a live writer's temp
    file has the same name. Returns the paths removed."""
    directory = Path(directory)
    removed = []
    if directory.is_dir():
        for path in directory.glob(".*.tmp"):
            if path.is_file():
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temp file in the same directory and a rename.

    The file gets the permissions a plain ``open(path, "w")`` would give (0666 less the
    umask), not the owner-only 0600 of the temp file, so shared results stay readable.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.filename is None:  # name the file (disk full, ulimit -f)
            raise OSError(err.errno, err.strerror or str(err), str(path)) from err
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialize {type(obj).__name__} to JSON")


def canonical_json(obj: Any) -> str:
    """Deterministic JSON used for hashing configs."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_json_default)


def config_hash(obj: Any, length: int = 12) -> str:
    """Short stable hash of a JSON-able config: same config, same key."""
    return hashlib.sha256(canonical_json(obj).encode("utf-8")).hexdigest()[:length]


def file_digest(path: str | os.PathLike, length: int = 16) -> str:
    """sha256 of a file's bytes (hex, first ``length`` characters): same bytes, same key."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:length]


def append_jsonl(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append one JSON line and fsync (a crash loses at most the line being written)."""
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=True, default=_json_default) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as err:
        if err.filename is None:  # name the file (disk full, ulimit -f)
            raise OSError(err.errno, err.strerror or str(err), str(path)) from err
        raise


def header_digest(header: Mapping[str, Any], length: int = 16) -> str:
    """SHA-256 (hex, ``length`` chars) of a JSON header's canonical form, leaving out its own
    :data:`HEADER_DIGEST_KEY`: what a file's metadata (epochs, run keys, recorded metrics)
    is checked against on read."""
    body = {k: v for k, v in header.items() if k != HEADER_DIGEST_KEY}
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()[:length]


def with_header_digest(header: Mapping[str, Any]) -> dict[str, Any]:
    """``header`` plus its :func:`header_digest` under :data:`HEADER_DIGEST_KEY`."""
    body = {k: v for k, v in header.items() if k != HEADER_DIGEST_KEY}
    # Round-trip first, so tuples and the like digest as the JSON they are stored as.
    body = json.loads(json.dumps(body, sort_keys=True, default=_json_default))
    return {**body, HEADER_DIGEST_KEY: header_digest(body)}


def verify_header_digest(path: str | os.PathLike, header: Mapping[str, Any], required: bool = True) -> None:
    """Raise :class:`CheckpointError` naming ``path`` if ``header``'s recorded digest does not
    match its content (or, with ``required``, is missing)."""
    recorded = header.get(HEADER_DIGEST_KEY)
    if recorded is None:
        if required:
            raise CheckpointError(f"{path}: its header records no {HEADER_DIGEST_KEY} (corrupted file)")
        return
    if recorded != header_digest(header):
        raise CheckpointError(f"{path}: its header (metadata) does not match its recorded digest (corrupted "
                              f"file)")


def strict_json(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, +-inf) replaced by None, so that it is
    written as strict JSON (``null``), which every JSON reader accepts, never as a bare
    ``NaN`` token."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def read_verified_entry(path: str | os.PathLike) -> tuple[dict[str, Any] | None, str | None]:
    """A cache entry (a JSON object written with :func:`with_header_digest`) and, when it
    cannot be served, why: ``(entry, None)`` for a verified entry, ``(None, None)`` when
    there is none, ``(None, reason)`` when the file is torn, not UTF-8 JSON, not an object,
    written without a digest or fails it (an edited number is recomputed, never served)."""
    path = Path(path)
    if not path.is_file():
        return None, None
    try:
        entry = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return None, f"unreadable: {err}"
    if not isinstance(entry, dict):
        return None, "not a cache entry"
    problem = digest_problem(entry)
    return (None, problem) if problem is not None else (entry, None)


class CheckpointCache:
    """Per-checkpoint cache entries of one analysis, the one scheme every per-checkpoint cache
    uses: ``folder/epoch_<epoch>_<key>.json``, ``key`` hashing the checkpoint file's digest
    with the settings (a code version among them), each entry written atomically with a
    digest of its content. An entry that is torn, not UTF-8 JSON, edited, or written without
    its digest is recomputed, never served, and :meth:`report` says so in one ``note:`` line.

    Args:
        folder: Where the entries live.
        label: The analysis's name in the note.
    """

    def __init__(self, folder: str | os.PathLike, label: str) -> None:
        self.folder, self.label = Path(folder), label
        self.rejected: list[str] = []

    def path(self, epoch: int, checkpoint: str | os.PathLike, settings: Mapping[str, Any]) -> Path:
        """The entry of ``epoch``'s ``checkpoint`` under ``settings`` (JSON-able)."""
        key = config_hash({"checkpoint": file_digest(checkpoint), **settings})
        return self.folder / f"epoch_{epoch:06d}_{key}.json"

    def read(self, path: Path, epoch: int) -> dict[str, Any] | None:
        """The verified entry at ``path`` without its digest field, or None (missing, or
        failed its check: remembered for :meth:`report`)."""
        entry, problem = read_verified_entry(path)
        if problem is not None:
            self.rejected.append(f"epoch {epoch} ({problem})")
        return {k: v for k, v in entry.items() if k != HEADER_DIGEST_KEY} if entry is not None else None

    def write(self, path: Path, entry: Mapping[str, Any]) -> Path:
        """Store ``entry`` atomically with the digest of its content."""
        return atomic_write_json(path, with_header_digest(entry))

    def report(self) -> None:
        """One ``note:`` line naming the entries that failed their check (none: silent)."""
        if self.rejected:
            n = len(self.rejected)
            notice(f"{self.label}: recomputed {n} cache entr{'y' if n == 1 else 'ies'} in {self.folder} "
                   f"that failed their check: {'; '.join(self.rejected)}")


def digest_problem(data: Mapping[str, Any]) -> str | None:
    """Why ``data`` (a JSON object written with :func:`with_header_digest`) fails its content
    digest: ``"written without a content digest"`` or ``"content does not match its digest"``;
    None when it passes."""
    if HEADER_DIGEST_KEY not in data:
        return "written without a content digest"
    if data[HEADER_DIGEST_KEY] != header_digest(data):
        return "content does not match its digest"
    return None


def read_digested_json(path: str | os.PathLike, expected: str) -> dict[str, Any]:
    """A JSON object written with :func:`with_header_digest`, verified.

    Args:
        path: The file.
        expected: What it should be, for the error (e.g. "the contrast.json of ...").

    Raises:
        UserError: Naming the file when it is unreadable, not UTF-8, not JSON, not an object,
            written without a digest, or its content does not match the digest.
    """
    path = Path(path)
    text = read_utf8(path, expected, UserError)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{path} is not JSON ({err.msg} at line {err.lineno} column {err.colno}); expected "
                        f"{expected}") from err
    if not isinstance(data, dict):
        raise UserError(f"{path} holds a JSON {type(data).__name__}, not {expected}")
    problem = digest_problem(data)
    if problem == "written without a content digest":
        raise UserError(f"{path} records no content digest ({HEADER_DIGEST_KEY}), so an edit cannot be told from "
                        f"what was written; it is not {expected} as this version writes it (regenerate it)")
    if problem is not None:
        raise UserError(f"{path}: its content does not match the digest written with it (the file was edited or "
                        f"corrupted); regenerate it")
    return data


def read_utf8(path: Path, expected: str, error: type[Exception]) -> str:
    """The text of ``path``; a file that is not UTF-8 raises ``error`` naming the file, the
    first bad byte and what it was expected to be (``expected``, e.g. "a metrics.jsonl a
    trainer wrote"); an unreadable one raises ``error`` with the system's reason."""
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); it is not {expected}") from err
    except OSError as err:
        raise error(f"cannot read {path}: {err.strerror or err}") from err


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a JSONL file, ignoring a trailing partial line left by a crash."""
    records: list[dict[str, Any]] = []
    path = Path(path)
    if not path.exists():
        return records
    text = read_utf8(path, "a JSONL file interp_toolkit wrote", UserError)
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


def _tensor_bytes(tensor: "torch.Tensor") -> bytes:
    import torch

    t = tensor.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        t = t.float()
    elif not t.dtype.is_floating_point and not t.dtype.is_complex and t.dtype != torch.bool:
        t = t.long()  # int32 and int64 tensors of the same values are the same data
    return t.numpy().tobytes()


def tensor_digest(tensors: "torch.Tensor | Iterable[torch.Tensor] | Mapping[str, torch.Tensor]",
                  extra: Any = None, length: int = 16) -> str:
    """The toolkit's one tensor digest: SHA-256 of shapes and values (hex, ``length`` chars).

    Used for run keys (data fingerprints), cache keys (models, data) and the per-tensor
    digests of artifacts. A mapping is digested by sorted name (names included); integer
    tensors are read as int64 and bfloat16 as float32, so equal data gives equal digests.

    Args:
        tensors: One tensor, a sequence, or a name -> tensor mapping.
        extra: JSON-able context appended to the digest (e.g. class names).
        length: Hex characters kept.
    """
    import torch

    digest = hashlib.sha256()
    if isinstance(tensors, torch.Tensor):
        items: list[tuple[str | None, torch.Tensor]] = [(None, tensors)]
    elif isinstance(tensors, Mapping):
        items = [(name, tensors[name]) for name in sorted(tensors)]
    else:
        items = [(None, t) for t in tensors]
    for name, tensor in items:
        if name is not None:
            digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(_tensor_bytes(tensor))
    if extra is not None:
        digest.update(json.dumps(extra, sort_keys=True, default=_json_default).encode())
    return digest.hexdigest()[:length]


def save_artifact(path: str | os.PathLike, tensors: Mapping[str, "torch.Tensor"], metadata: Mapping[str, Any],
                  kind: str) -> Path:
    """Atomically write ``tensors`` and JSON ``metadata`` as one safetensors file.

    The header records ``kind``, the metadata and the :func:`tensor_digest` of every tensor,
    which :func:`load_artifact` verifies.
    """
    from safetensors.torch import save

    cpu = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
    header = {"format": ARTIFACT_FORMAT, "kind": kind, "metadata": dict(metadata),
              "digests": {name: tensor_digest(t) for name, t in cpu.items()}}
    try:
        text = json.dumps(with_header_digest(header), sort_keys=True, default=_json_default)
    except TypeError as err:
        raise UserError(f"{kind} metadata must be JSON-serializable: {err}") from err
    return atomic_write_bytes(path, save(cpu, metadata={ARTIFACT_KEY: text}))


#: Leading bytes of file kinds that are given as safetensors by mistake, and their names.
_OTHER_KINDS = (
    (b"PK\x03\x04", "a zip archive (what torch.save writes by default), not safetensors"),
    (b"\x93NUMPY", "a NumPy .npy file, not safetensors"),
    (b"\x1f\x8b", "a gzip file, not safetensors"),
)


def other_file_kind(raw: bytes) -> str | None:
    """What a file that is not safetensors is, from its first bytes ("a pickle file (what
    torch.save writes with _use_new_zipfile_serialization=False), not safetensors", ...), or
    None when it could be safetensors (or is of no kind recognized here)."""
    if not raw:
        return "an empty file, not safetensors"
    for magic, name in _OTHER_KINDS:
        if raw.startswith(magic):
            return name
    if raw[0] == 0x80 and len(raw) > 1 and 2 <= raw[1] <= 5:  # PROTO opcode of pickle protocols 2-5
        return ("a pickle file (torch.save's legacy format, or pickle.dump), not safetensors; interp_toolkit never "
                "unpickles, since that can run arbitrary code")
    return None


def read_safetensors_header(raw: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file's bytes (``{}`` if none).

    Raises:
        ValueError: Saying what the file is when it is recognizably another kind (a pickle,
            a zip archive, ...); json or other errors for a truncated or corrupted file.
    """
    kind = other_file_kind(raw[:16])
    if kind is not None:
        raise UserError(f"it is {kind}")
    header_len = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + header_len]).get("__metadata__", {}) or {}


def is_artifact(path: str | os.PathLike, kind: str | None = None) -> bool:
    """Whether ``path`` is an artifact (of ``kind``) written by :func:`save_artifact`; reads the
    header only. A cache written in an earlier format is not one (it is recomputed)."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            header_len = int.from_bytes(handle.read(8), "little")
            if not 0 < header_len < 100_000_000:
                return False
            meta = json.loads(handle.read(header_len)).get("__metadata__") or {}
        header = json.loads(meta[ARTIFACT_KEY])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return kind is None or header.get("kind") == kind


def load_artifact(path: str | os.PathLike, kind: str | None = None) -> tuple[dict[str, "torch.Tensor"], dict[str, Any]]:
    """Read an artifact written by :func:`save_artifact`: ``(tensors, metadata)``.

    Raises:
        CheckpointError: Naming the file if it is missing, truncated, not an artifact (of
            ``kind``), and naming the tensor whose bytes do not match the recorded digest.
    """
    from safetensors.torch import load

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{kind or 'artifact'} file {path} does not exist")
    raw = path.read_bytes()
    try:
        tensors = load(raw)
        header = json.loads(read_safetensors_header(raw)[ARTIFACT_KEY])
    except KeyError as err:
        raise CheckpointError(f"{path} is not an interp_toolkit artifact (no {ARTIFACT_KEY} header)") from err
    except Exception as err:  # noqa: BLE001 - safetensors raises several types for bad files
        raise CheckpointError(f"{path} is truncated or corrupted: {err}") from err
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} is truncated or corrupted: its {ARTIFACT_KEY} header is not a JSON object")
    version = header.get("format", 1)
    if version not in (1, ARTIFACT_FORMAT):
        raise CheckpointError(f"{path} has artifact format {version!r}, expected 1 or {ARTIFACT_FORMAT} "
                              f"(corrupted, or written by a newer interp_toolkit)")
    verify_header_digest(path, header, required=version >= 2)
    if kind is not None and header.get("kind") != kind:
        raise CheckpointError(f"{path} holds a {header.get('kind')!r} artifact, expected {kind!r}")
    verify_digests(path, tensors, header.get("digests") or {})
    return tensors, header.get("metadata") or {}


def verify_digests(path: str | os.PathLike, tensors: Mapping[str, "torch.Tensor"], digests: Mapping[str, str]) -> None:
    """Check every tensor against its recorded digest (one pass); raise naming file and tensor."""
    missing = sorted(set(digests) - set(tensors))
    if missing:
        raise CheckpointError(f"{path}: tensor {missing[0]} is recorded but missing from the file")
    for name, tensor in tensors.items():
        if name not in digests:
            raise CheckpointError(f"{path}: tensor {name} has no recorded digest")
        if tensor_digest(tensor) != digests[name]:
            raise CheckpointError(f"{path}: tensor {name} does not match its recorded digest (corrupted file)")
