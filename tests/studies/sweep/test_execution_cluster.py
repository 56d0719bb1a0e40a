"""Sweeps on a real multi-node Ray cluster on one machine (``ray.cluster_utils.Cluster``): a
head without CPUs or GPUs (the driver's node), a CPU node, and a node that declares two GPUs
(this machine has none, so jobs placed there fall back to its CPU: ``device="auto"``).

One cluster serves the module (Ray's start-up is slow on small machines). Marked slow."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from interp_toolkit.studies.grid.config import preset
from interp_toolkit.studies.sweep.run import run_sweep
from tests.helpers import KillWorkerOnce

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

#: One job per run (4 jobs), so the jobs spread over the nodes.
SETTINGS = dict(seeds_per_process=1, epochs=40)


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    small = {"object_store_memory": 80 * 1024**2, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "num_gpus": 0, **small})
    cpu_node = cluster.add_node(num_cpus=1, num_gpus=0, **small)
    gpu_node = cluster.add_node(num_cpus=1, num_gpus=2, **small)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    # The callbacks below travel by value (Ray's workers need not import this test module).
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        yield {"cpu": cpu_node.node_id, "gpu": gpu_node.node_id}
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def local_study(tmp_path_factory):
    """The same sweep on the local backend, uninterrupted: the reference."""
    study = tmp_path_factory.mktemp("local") / "study"
    return run_sweep(preset("smoke", device="cpu", **SETTINGS), study, workers=1, progress=False)


def _files(run_dir: Path) -> dict[str, bytes]:
    """Every file a run's training writes deterministically: metrics and checkpoints."""
    paths = [run_dir / "metrics.jsonl", *sorted((run_dir / "checkpoints").glob("*"))]
    return {p.name: p.read_bytes() for p in paths}


def test_a_sweep_spread_over_the_nodes_gives_the_local_table(cluster, local_study, tmp_path):
    result = run_sweep(preset("smoke", device="cpu", **SETTINGS), tmp_path / "ray", backend="ray", progress=False)
    assert not result.failed and len(result.rows) == 4
    assert (tmp_path / "ray" / "table.csv").read_text() == (local_study.study_dir / "table.csv").read_text()
    nodes = {where["node_id"] for where in result.placements}
    assert nodes == {cluster["cpu"], cluster["gpu"]}  # both nodes with CPUs took jobs; the head none
    assert all(where["device"] == "cpu" and where["gpu_ids"] == [] for where in result.placements)
    assert not (tmp_path / "ray" / ".shared-storage-check").exists()  # the sentinel check cleaned up


def test_gpu_requesting_jobs_go_to_the_node_that_declares_gpus(cluster, local_study, tmp_path):
    """The driver's node has no GPU; ``auto`` asks for a GPU share because the cluster declares
    GPUs, Ray puts every job on the GPU node and assigns it a GPU id, and the worker (no CUDA
    on this machine) resolves ``auto`` to its CPU."""
    result = run_sweep(preset("smoke", device="auto", **SETTINGS), tmp_path / "gpu", backend="ray", progress=False)
    assert not result.failed and len(result.placements) == 4
    for where in result.placements:
        assert where["node_id"] == cluster["gpu"]
        assert where["gpu_ids"] in (["0"], ["1"]) and where["cuda_visible_devices"] == where["gpu_ids"][0]
        assert where["device"] == "cpu"  # the fallback of auto without CUDA, decided on the worker
    assert (tmp_path / "gpu" / "table.csv").read_text() == (local_study.study_dir / "table.csv").read_text()


def test_a_killed_worker_loses_no_run_and_its_retry_is_byte_identical(cluster, local_study, tmp_path):
    marker = tmp_path / "killed"
    cfg = preset("smoke", device="cpu", **SETTINGS)
    result = run_sweep(cfg, tmp_path / "killed_study", backend="ray", progress=False,
                       callbacks=[KillWorkerOnce(marker, "_r0.9_wd0.1_s0_")])
    assert marker.exists()  # a worker was killed mid-run
    assert not result.failed and len(result.rows) == 4  # and no run was lost
    (killed,) = [row for row in result.rows if row["r"] == 0.9 and row["seed"] == 0]
    assert killed["resumed_from"] == 20  # the retry resumed from the run's own state
    reference = {Path(row["run_dir"]).name: Path(row["run_dir"]) for row in local_study.rows}
    for row in result.rows:
        run_dir = Path(row["run_dir"])
        assert _files(run_dir) == _files(reference[run_dir.name]), run_dir.name
    assert (tmp_path / "killed_study" / "table.csv").read_text() == \
        (local_study.study_dir / "table.csv").read_text()
