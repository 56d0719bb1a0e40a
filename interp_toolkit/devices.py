"""Device strings: one resolver for every command and library entry point."""

from __future__ import annotations

from typing import Any

from interp_toolkit.errors import UserError

DEVICE_CHOICES = "cpu, cuda, cuda:N or auto"


def resolve_device(device: Any = "cpu") -> Any:
    """A ``torch.device`` for ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"``.

    ``"auto"`` (or ``None``) picks the first GPU when CUDA is available, else the CPU.

    Raises:
        UserError: Naming the value when it is not one of those, when CUDA is asked for
            but unavailable, or when the GPU index does not exist.
    """
    import torch

    if isinstance(device, torch.device):
        if device.type == "cpu":
            return device  # "cpu:0" and the like: already a CPU device
        device = str(device)
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, str):
        raise UserError(f"device must be a string ({DEVICE_CHOICES}), got {device!r}")
    text = device.strip().lower()
    if text == "cpu":
        return torch.device("cpu")
    if text == "cuda" or text.startswith("cuda:"):
        index_text = text[5:] if text.startswith("cuda:") else None
        if index_text is not None and not index_text.isdigit():
            raise UserError(f"device {device!r} is not valid; expected {DEVICE_CHOICES}")
        if not torch.cuda.is_available():
            raise UserError(f"device {device!r} asked for CUDA, but CUDA is not available here "
                            "(use --device cpu or auto)")
        if index_text is not None and int(index_text) >= torch.cuda.device_count():
            raise UserError(f"device {device!r}: there are only {torch.cuda.device_count()} CUDA device(s)")
        return torch.device(text)
    raise UserError(f"device {device!r} is not valid; expected {DEVICE_CHOICES}")


def check_device_name(device: Any) -> None:
    """Check a device string's form without needing the device (configs are validated on
    machines that may lack it; :func:`resolve_device` checks availability at run time).

    ``None`` passes (it means "the default"; see :func:`resolve_device`).

    Raises:
        UserError: Naming the value unless it is ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.
    """
    if device is None:
        return
    text = device.strip().lower() if isinstance(device, str) else None
    if text in ("cpu", "cuda", "auto") or (text is not None and text.startswith("cuda:") and text[5:].isdigit()):
        return
    raise UserError(f"device must be one of {DEVICE_CHOICES}, got {device!r}")


__all__ = ["DEVICE_CHOICES", "check_device_name", "resolve_device"]
