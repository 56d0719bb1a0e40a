"""interp-toolkit: mechanistic-interpretability studies on TransformerLens 4.

Core objects are re-exported here and imported on first use (``import interp_toolkit`` loads
no torch), tasks live in ``interp_toolkit.tasks`` and analyses in ``interp_toolkit.analyses``.

Worked examples, committed with their outputs (tables and figures show without running them):
``examples/circuit_study.ipynb`` (fingerprints, ablation, patching and gradients of a saved
checkpoint) and ``examples/bif_hierarchy.ipynb`` (Bayesian influence functions on a hierarchy
toy), in the repository beside this package.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _distribution_version

from interp_toolkit.lazy import lazy_exports

try:  # the version lives only in pyproject.toml; installed metadata carries it
    __version__ = _distribution_version("interp-toolkit")
except _PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

# public name -> module that defines it (imported by ``__getattr__`` on first access)
_EXPORTS = {
    "CheckpointError": "interp_toolkit.checkpoint",
    "load_checkpoint": "interp_toolkit.checkpoint",
    "save_checkpoint": "interp_toolkit.checkpoint",
    "ModelConfig": "interp_toolkit.model",
    "build_model": "interp_toolkit.model",
    "model_config_of": "interp_toolkit.model",
    "TrainConfig": "interp_toolkit.runs.config",
    "TrainResult": "interp_toolkit.runs.trainer",
    "evaluate": "interp_toolkit.runs.trainer",
    "list_checkpoints": "interp_toolkit.runs.trainer",
    "train": "interp_toolkit.runs.trainer",
    "UserError": "interp_toolkit.errors",
    "resolve_device": "interp_toolkit.devices",
}


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = ["__version__", *sorted(_EXPORTS)]
