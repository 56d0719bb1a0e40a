"""SweepConfig.device: validated, outside the study key, and Ray tasks ask for GPUs on CUDA."""

import sys
import types

import pytest

from interp_toolkit.studies.sweep import plan_jobs, run_sweep
from interp_toolkit.studies.sweep_config import cell_configs, preset, run_dir_name


def test_device_is_validated_and_changes_neither_the_study_key_nor_run_directories(tmp_path):
    cpu, cuda = preset("smoke", device="cpu"), preset("smoke", device="cuda")
    assert cpu.key() == cuda.key() == preset("smoke").key()
    assert [r["run_dir"] for j in plan_jobs(cpu, tmp_path) for r in j["runs"]] == \
        [r["run_dir"] for j in plan_jobs(cuda, tmp_path) for r in j["runs"]]
    cell = cpu.cells()[0]
    task_cfg, model_cfg, train_cfg, info = cell_configs(cpu, cell, 0)
    bridge_cfg = type(train_cfg).from_dict({**train_cfg.to_dict(), "engine": "bridge", "device": "cpu"})
    assert run_dir_name(cell, 0, task_cfg, model_cfg, train_cfg, info) == \
        run_dir_name(cell, 0, task_cfg, model_cfg, bridge_cfg, info)
    with pytest.raises(ValueError, match="device must be"):
        preset("smoke", device="gpu0")


class _Stop(Exception):
    pass


@pytest.mark.parametrize("device, gpus", [("cuda", 1), ("cuda:1", 1), ("cpu", 0)])
def test_ray_tasks_ask_for_a_gpu_when_the_device_is_cuda(tmp_path, monkeypatch, device, gpus):
    asked = {}
    fake = types.ModuleType("ray")
    fake.is_initialized = lambda: True
    fake.cluster_resources = lambda: {"CPU": 2}

    def remote(**kwargs):
        asked.update(kwargs)
        raise _Stop  # nothing is trained: only the resource request is checked

    fake.remote = remote
    monkeypatch.setitem(sys.modules, "ray", fake)
    with pytest.raises(_Stop):
        run_sweep(preset("smoke", device=device), tmp_path / "study", backend="ray", progress=False)
    assert asked == {"num_cpus": 1, "num_gpus": gpus}
