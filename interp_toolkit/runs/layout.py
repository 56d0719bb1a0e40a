"""Where a run directory keeps its files, shared by the modules that write and read them.

Kept apart from :mod:`interp_toolkit.runs.resume` so that :mod:`interp_toolkit.runs.metrics`
(which :mod:`~interp_toolkit.runs.resume` imports) can name a checkpoint without an import cycle.
"""

from __future__ import annotations

import os
from pathlib import Path


def checkpoint_path(run_dir: str | os.PathLike, epoch: int) -> Path:
    """Where a run saves its checkpoint of ``epoch``."""
    return Path(run_dir) / "checkpoints" / f"epoch_{epoch:06d}.safetensors"


__all__ = ["checkpoint_path"]
