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
