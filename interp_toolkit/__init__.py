"""interp-toolkit: mechanistic-interpretability studies on TransformerLens 4.

Core objects are re-exported here; tasks live in ``interp_toolkit.tasks`` and analyses
in ``interp_toolkit.analyses``.
"""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _distribution_version

try:  # the version lives only in pyproject.toml; installed metadata carries it
    __version__ = _distribution_version("interp-toolkit")
except _PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

from interp_toolkit.checkpoint import CheckpointError, load_checkpoint, save_checkpoint  # noqa: E402
from interp_toolkit.model import ModelConfig, build_model, model_config_of  # noqa: E402
from interp_toolkit.runs.trainer import TrainConfig, TrainResult, evaluate, list_checkpoints, train  # noqa: E402

__all__ = [
    "__version__",
    "CheckpointError",
    "ModelConfig",
    "TrainConfig",
    "TrainResult",
    "build_model",
    "evaluate",
    "list_checkpoints",
    "load_checkpoint",
    "model_config_of",
    "save_checkpoint",
    "train",
]
