"""Self-describing checkpoints: safetensors weights with the model config and metadata
embedded in the file's header, so ``load_checkpoint(path)`` needs no other context.

File format (``*.safetensors``): an artifact of :mod:`interp_toolkit.io` of kind
``"checkpoint"``: TransformerLens-style state-dict keys (``embed.weight``,
``blocks.0.attn.q.weight`` ...), and in the header's JSON metadata ``model_config`` (the
:class:`~interp_toolkit.model.ModelConfig`) and ``metadata`` (the user's: epoch, metrics,
...), plus the digest of every tensor, verified on load. Files of the earlier format 1
(separate header keys, no digests) are still read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from interp_toolkit.errors import CheckpointError, UserError
from interp_toolkit.io import (
    ARTIFACT_KEY,
    load_artifact,
    other_file_kind,
    read_safetensors_header,
    save_artifact,
)
from interp_toolkit.model import ModelConfig, build_model, model_config_of, move_model

# Format 1 (read only): the config and metadata as separate header keys, no digests.
_KEY_FORMAT = "interp_toolkit.format"
_KEY_CONFIG = "interp_toolkit.model_config"
_KEY_META = "interp_toolkit.metadata"
KIND = "checkpoint"


def save_checkpoint(model: Any, path: str | os.PathLike, metadata: dict[str, Any] | None = None) -> Path:
    """Atomically write ``model``'s weights, config and ``metadata`` to one file.

    The file is an artifact of :mod:`interp_toolkit.io` (safetensors whose JSON header holds
    the model config, ``metadata`` and a digest of every tensor, verified on load).

    Args:
        model: A model made by :func:`build_model` or :func:`load_checkpoint`.
        path: Destination file (``.safetensors`` by convention).
        metadata: JSON-serializable extras (epoch, metrics, ...).

    Returns:
        The path written.
    """
    cfg = model_config_of(model)
    try:
        json.dumps(metadata or {}, sort_keys=True)
    except TypeError as err:
        raise UserError(f"checkpoint metadata must be JSON-serializable: {err}") from err
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    return save_artifact(path, tensors, {"model_config": cfg.to_dict(), "metadata": metadata or {}}, kind=KIND)


def read_checkpoint(path: str | os.PathLike) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """Parse a checkpoint file without building a model: (config, tensors, metadata).

    Every tensor is checked against the digest recorded when it was saved.
    """
    from safetensors.torch import load

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    raw = path.read_bytes()
    kind = other_file_kind(raw[:16])
    if kind is not None:  # named for what it is, never "truncated or corrupted"
        raise CheckpointError(f"checkpoint {path} is {kind}; expected a .safetensors checkpoint written by "
                              f"interp_toolkit (save_checkpoint, train or sweep)")
    try:
        header = read_safetensors_header(raw)
    except Exception as err:  # noqa: BLE001 - a file too short or not JSON
        raise CheckpointError(f"checkpoint {path} is truncated or corrupted: {err}") from err
    if ARTIFACT_KEY in header:
        tensors, stored = load_artifact(path, kind=KIND)
        config, metadata = stored.get("model_config"), stored.get("metadata", {})
    elif header.get(_KEY_FORMAT) == "1":  # written before artifacts had digests
        try:
            tensors = load(raw)
            config = json.loads(header[_KEY_CONFIG])
            metadata = json.loads(header.get(_KEY_META, "{}"))
        except Exception as err:  # noqa: BLE001
            raise CheckpointError(f"checkpoint {path} is truncated or corrupted: {err}") from err
    else:
        raise CheckpointError(f"checkpoint {path} is not an interp_toolkit checkpoint (no artifact header)")
    if not isinstance(config, dict):
        raise CheckpointError(f"checkpoint {path} has no model config")
    try:
        cfg = ModelConfig.from_dict(config)
    except (KeyError, ValueError, UserError, TypeError) as err:
        raise CheckpointError(f"checkpoint {path} has an invalid model config: {err}") from err
    return cfg, tensors, metadata


def _safetensors_metadata(path: Path) -> dict[str, Any]:
    """The ``__metadata__`` of a safetensors file's JSON header, read without its tensors.

    Raises:
        OSError, ValueError, AttributeError: The file is missing, truncated or not safetensors.
    """
    with open(path, "rb") as handle:
        header_len = int.from_bytes(handle.read(8), "little")
        if not 0 < header_len < 100_000_000:
            raise UserError(f"header length {header_len}")
        return json.loads(handle.read(header_len)).get("__metadata__") or {}


def recorded_digests(path: str | os.PathLike) -> dict[str, str] | None:
    """The per-tensor digests a checkpoint's header records, read from the header alone and
    checked against the header's own digest; None for a checkpoint of a format without them.

    Raises:
        CheckpointError: Naming the file if its header is unreadable or fails its digest.
    """
    from interp_toolkit.io import verify_header_digest

    path = Path(path)
    try:
        meta = _safetensors_metadata(path)
        header = json.loads(meta[ARTIFACT_KEY]) if ARTIFACT_KEY in meta else None
    except (OSError, ValueError, UserError, TypeError, AttributeError) as err:
        raise CheckpointError(f"checkpoint {path} is truncated or corrupted: {err}") from err
    if not isinstance(header, dict) or not isinstance(header.get("digests"), dict):
        return None
    verify_header_digest(path, header, required=header.get("format", 1) >= 2)
    return dict(header["digests"])


def read_checkpoint_header(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any]]:
    """A checkpoint's ``(model config dict, metadata)`` from its header alone (either
    format), checked against the header's digest where the format records one.

    Raises:
        CheckpointError: Naming the file if it is missing, unreadable or not a checkpoint.
    """
    from interp_toolkit.io import verify_header_digest

    path = Path(path)
    try:
        meta = _safetensors_metadata(path)
        if ARTIFACT_KEY in meta:
            header = json.loads(meta[ARTIFACT_KEY])
            verify_header_digest(path, header, required=header.get("format", 1) >= 2)
            config, metadata = header["metadata"]["model_config"], header["metadata"].get("metadata") or {}
        elif meta.get(_KEY_FORMAT) == "1":
            config, metadata = json.loads(meta[_KEY_CONFIG]), json.loads(meta.get(_KEY_META, "{}"))
        else:
            raise CheckpointError(f"checkpoint {path} is not an interp_toolkit checkpoint (no artifact header)")
    except CheckpointError:
        raise
    except (OSError, ValueError, UserError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"checkpoint {path} is missing, truncated or corrupted: {err}") from err
    if not isinstance(config, dict) or not isinstance(metadata, dict):
        raise CheckpointError(f"checkpoint {path} has a malformed header (config and metadata must be objects)")
    return config, metadata


def load_checkpoint(path: str | os.PathLike, device: str | torch.device | None = None) -> tuple[Any, dict[str, Any]]:
    """Rebuild the model saved in ``path``: ``(model, metadata)``.

    Every tensor is checked after loading: a missing, unexpected or mis-shaped key, or a
    weight that did not actually arrive in the model, raises :class:`CheckpointError`
    naming the file (TransformerLens 4 builds can accept a state dict and load nothing).
    """
    path = Path(path)
    cfg, tensors, metadata = read_checkpoint(path)
    model = build_model(cfg)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {path} does not match its model config: missing keys {missing[:5]}, "
            f"unexpected keys {unexpected[:5]}"
        )
    for key, value in tensors.items():
        if value.shape != expected[key].shape:
            raise CheckpointError(
                f"checkpoint {path}: tensor {key} has shape {tuple(value.shape)}, "
                f"config expects {tuple(expected[key].shape)}"
            )
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as err:
        raise CheckpointError(f"checkpoint {path} could not be loaded: {err}") from err
    loaded = model.state_dict()
    for key, value in tensors.items():
        if not torch.equal(loaded[key].cpu(), value):
            raise CheckpointError(f"checkpoint {path}: tensor {key} was not loaded into the model")
    if device is not None:
        model = move_model(model, device)
    model.eval()
    return model, metadata


__all__ = ["CheckpointError", "load_checkpoint", "read_checkpoint",
           "read_checkpoint_header", "recorded_digests", "save_checkpoint"]
