import pytest
import torch

from interp_toolkit.model import ModelConfig
from interp_toolkit.tasks.mpsp import MPSPConfig


@pytest.fixture(autouse=True)
def _one_thread():
    # Tests are tiny; more threads only add contention on 2-core CI machines.
    torch.set_num_threads(1)


@pytest.fixture
def small_task() -> MPSPConfig:
    return MPSPConfig(seq_len=5, n_values=10, r=0.9, n_train=256, n_eval=128, seed=0)


@pytest.fixture
def small_model_cfg(small_task) -> ModelConfig:
    return ModelConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, **small_task.model_dims())


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A finished 6-epoch run of a 1-layer attention-only model (checkpoints 0, 1, 2, 3, 4, 6)."""
    from interp_toolkit.model import build_model
    from interp_toolkit.runs.trainer import TrainConfig, train
    from interp_toolkit.tasks.mpsp import make_splits

    task = MPSPConfig(seq_len=5, n_values=10, n_train=128, n_eval=64, r=0.75)
    splits = make_splits(task)
    cfg = ModelConfig(n_layers=1, n_heads=2, d_model=16, attn_only=True, **task.model_dims())
    run_dir = tmp_path_factory.mktemp("runs") / "tiny"
    train(build_model(cfg), splits, TrainConfig(epochs=6, eval_every=1, checkpoint_every=3, progress=False,
                                                lr=1e-2), run_dir,
          run_info={"task": {"name": task.name, **task.to_dict()}})
    return run_dir, splits
