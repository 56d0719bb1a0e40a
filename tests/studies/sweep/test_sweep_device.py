"""SweepConfig.device: validated, outside the study key, and Ray tasks ask for GPUs on CUDA."""

import sys
import types

import pytest

from interp_toolkit.errors import UserError
from interp_toolkit.studies.grid.config import cell_configs, preset, run_dir_name
from interp_toolkit.studies.sweep import ray_backend
from interp_toolkit.studies.sweep.run import plan_jobs, run_sweep


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
    with pytest.raises(UserError, match="device must be"):
        preset("smoke", device="gpu0")


class _Stop(Exception):
    pass


def _fake_ray(monkeypatch, resources):
    """A stand-in ray: connected, with ``resources``; its ``remote`` records the task's request
    (and the device its jobs resolve on the worker) and stops the sweep before any training."""

    asked = {}
    fake = types.ModuleType("ray")
    fake.is_initialized = lambda: True
    fake.cluster_resources = lambda: dict(resources)

    def remote(**kwargs):
        asked.update(kwargs)

        def wrap(function):
            class Task:
                @staticmethod
                def remote(job, *args):
                    asked["job_device"] = job["device"]
                    asked["job_seeds"] = len(job["runs"])
                    raise _Stop  # nothing is trained: only the request is checked
            return Task

        return wrap

    fake.remote = remote
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(ray_backend, "check_shared_storage", lambda ray, study_dir: asked.update(checked=study_dir))
    queue_module = types.ModuleType("ray.util.queue")
    queue_module.Queue = lambda: None
    monkeypatch.setitem(sys.modules, "ray.util", types.ModuleType("ray.util"))
    monkeypatch.setitem(sys.modules, "ray.util.queue", queue_module)
    return asked


@pytest.mark.parametrize("device, cluster_gpus, job_device", [
    ("cuda", 0, "cuda"), ("cuda:1", 0, "cuda"), ("auto", 2, "auto"), ("auto", 0, "cpu"), ("cpu", 2, "cpu")])
def test_ray_tasks_ask_for_a_gpu_share_and_resolve_the_device_on_the_worker(tmp_path, monkeypatch, device,
                                                                            cluster_gpus, job_device):
    """A CPU-only driver (no CUDA here) asks for GPUs when the sweep's device is CUDA, or auto
    on a cluster declaring GPUs; ``cuda:N`` becomes the GPU Ray assigns (``cuda`` there)."""
    from interp_toolkit.studies.sweep.resources import jobs_per_gpu

    asked = _fake_ray(monkeypatch, {"CPU": 2, "GPU": cluster_gpus})
    cfg = preset("smoke", device=device)
    with pytest.raises(_Stop):
        run_sweep(cfg, tmp_path / "study", backend="ray", progress=False)
    wants_gpu = job_device != "cpu"
    share = 1 / jobs_per_gpu(cfg, len(cfg.seeds)) if wants_gpu else 0
    assert (asked["num_cpus"], asked["num_gpus"], asked["max_retries"]) == (1, share, 3)
    assert 0 < share < 1 or not wants_gpu  # smoke's tiny jobs share a GPU
    assert asked["job_device"] == job_device and asked["checked"] == (tmp_path / "study").resolve()


def test_jobs_per_gpu_can_be_set_and_is_validated(tmp_path, monkeypatch):
    asked = _fake_ray(monkeypatch, {"CPU": 2})
    with pytest.raises(_Stop):
        run_sweep(preset("smoke", device="cuda"), tmp_path / "study", backend="ray", progress=False,
                  jobs_per_gpu=4, retries=5)
    assert (asked["num_gpus"], asked["max_retries"]) == (0.25, 5)
    with pytest.raises(UserError, match="jobs_per_gpu must be a positive integer or None, got 0"):
        run_sweep(preset("smoke"), tmp_path / "other", jobs_per_gpu=0)
    with pytest.raises(UserError, match="retries must be an integer >= 0, got -1"):
        run_sweep(preset("smoke"), tmp_path / "other", retries=-1)
