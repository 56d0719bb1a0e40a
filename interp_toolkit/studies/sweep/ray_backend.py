"""The Ray backend of a sweep: a session (:func:`ray_session`), the shared-storage check every
node must pass before a job runs (:func:`check_shared_storage`), and the jobs run as Ray tasks
with retries (:func:`run_ray`). The local pool and what both backends share are
:mod:`.execution`'s.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from interp_toolkit.errors import UserError
from interp_toolkit.studies.sweep.execution import (
    SweepProgress,
    failed_rows,
    placement,
    run_job_here,
)


@contextlib.contextmanager
def ray_session(address: str | None) -> Iterator[Any]:
    """The ``ray`` module, connected: to ``address``, to a Ray already initialized here, or to
    a local Ray started (and shut down on exit) here."""
    try:
        import ray
    except ImportError as err:
        raise UserError("backend 'ray' needs Ray: pip install 'interp-toolkit[ray]'") from err
    started_here = False
    if not ray.is_initialized():
        # no address: a new local Ray ("local"), never a cluster that a stale
        # /tmp/ray/ray_current_cluster file points to (pass "auto" to join a running one)
        ray.init(address=address or "local", include_dashboard=False, ignore_reinit_error=True)
        started_here = True
    try:
        yield ray
    finally:
        if started_here:
            ray.shutdown()


def ray_wants_gpu(ray: Any, device: str) -> bool:
    """Whether a sweep's Ray tasks ask for GPUs: on ``cuda``/``cuda:N``, and on ``auto`` when
    the cluster declares any (the driver's own node may have none)."""
    text = device.strip().lower()
    return text.startswith("cuda") or (text == "auto" and ray.cluster_resources().get("GPU", 0) > 0)


def ray_job_device(device: str, wants_gpu: bool) -> str:
    """The device a Ray task resolves on its worker: ``cuda`` (the GPU Ray assigned it: Ray
    sets ``CUDA_VISIBLE_DEVICES``, so ``cuda:N`` of the driver means nothing there) for
    ``cuda``/``cuda:N``; ``auto`` for ``auto`` with a GPU asked for (the CPU where the node
    turns out to have no CUDA); ``cpu`` when no GPU was asked for (no unaccounted GPU use)."""
    text = device.strip().lower()
    if not wants_gpu:
        return "cpu"
    return "cuda" if text.startswith("cuda") else "auto"


SENTINEL_DIR = ".shared-storage-check"


def _answer_sentinel(check_dir: str, token: str) -> str:
    """On one node: read the driver's sentinel and write this node's answer beside it."""
    from interp_toolkit.io import atomic_write_text

    driver = Path(check_dir) / "driver"
    node = placement().get("node_id") or placement()["host"]
    if not driver.is_file() or driver.read_text() != token:
        return f"{node}: cannot read {driver} written by the driver"
    atomic_write_text(Path(check_dir) / f"node-{node}", token)
    return ""


def verify_sentinels(study_dir: Path, check_dir: Path, token: str, nodes: Mapping[str, str],
                     answers: Mapping[str, str]) -> None:
    """Raise naming ``--out`` unless every node in ``nodes`` (``{node id: address}``) wrote its
    sentinel into ``check_dir`` and the driver reads it back (``answers``: each node's own
    complaint, empty when it saw the driver's file)."""
    problems = []
    for node, address in nodes.items():
        answer = check_dir / f"node-{node}"
        if answers.get(node):
            problems.append(f"node {address}: {answers[node]}")
        elif not answer.is_file() or answer.read_text() != token:
            problems.append(f"node {address} wrote {answer}, which this driver cannot read")
    if problems:
        raise UserError(f"--out {study_dir} is not on storage shared by this driver and every Ray node ("
                        + "; ".join(problems) + "): point --out at a file system every node mounts at the same "
                        "path (NFS, Lustre, a mounted bucket), or the report would miss their runs")


def check_shared_storage(ray: Any, study_dir: Path, timeout: float = 300) -> None:
    """Before any work: a sentinel written by the driver is read on every node that can run
    jobs (one task pinned to each), each writes its own, and the driver reads them back.

    Raises:
        UserError: Naming ``--out`` and the nodes that do not share it with the driver.
    """
    import secrets
    import shutil

    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from interp_toolkit.io import atomic_write_text

    token = secrets.token_hex(8)
    check_dir = study_dir / SENTINEL_DIR / token
    check_dir.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write_text(check_dir / "driver", token)
        nodes = {node["NodeID"]: node.get("NodeManagerAddress", node["NodeID"]) for node in ray.nodes()
                 if node.get("Alive") and node.get("Resources", {}).get("CPU", 0) >= 1}
        answer = ray.remote(num_cpus=0)(_answer_sentinel)
        refs = {node: answer.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                .remote(str(check_dir), token) for node in nodes}
        answers = dict(zip(refs, ray.get(list(refs.values()), timeout=timeout), strict=True))
        verify_sentinels(study_dir, check_dir, token, nodes, answers)
    finally:
        shutil.rmtree(check_dir, ignore_errors=True)
        try:
            (study_dir / SENTINEL_DIR).rmdir()
        except OSError:
            pass  # another check's folder is still there


def _run_job_on_ray(job: Mapping[str, Any], callbacks: Sequence[Any],
                    events: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A Ray task: resolve the device here, on the worker, then :func:`run_job`. A job that
    raises fails alone (no retry: it would fail again); a worker or node that dies is retried."""
    return run_job_here(job, 1, callbacks, events)


def run_ray(ray: Any, jobs: list[dict[str, Any]], progress: SweepProgress, callbacks: Sequence[Any],
            num_gpus: float = 0, retries: int = 3,
            placements: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Run ``jobs`` as Ray tasks of 1 CPU and ``num_gpus`` GPUs each.

    A task whose worker or node dies is retried (``retries`` times) by Ray; the retry resumes
    each run from its own directory, so it ends as an uninterrupted run would. A job that
    raises, or runs out of retries, fails alone: its runs come back as ``error`` rows
    (:func:`failed_rows`) while the other jobs finish.
    """
    placements = placements if placements is not None else []
    remote_job = ray.remote(num_cpus=1, num_gpus=num_gpus, max_retries=retries)(_run_job_on_ray)
    # Imported after the request, which a test checks with a stand-in ray that has no queue.
    from ray.util.queue import Queue as RayQueue

    events = RayQueue()
    pending = {remote_job.remote(job, callbacks, events): job for job in jobs}
    rows: list[dict[str, Any]] = []
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
        progress.drain(events)
        for ref in done:
            job = pending.pop(ref)
            try:
                job_rows, where = ray.get(ref)
            except Exception as err:  # RayTaskError, WorkerCrashedError after the retries, ...
                job_rows, where = failed_rows(job, err), {"error": f"{type(err).__name__}: {err}"}
            rows.extend(job_rows)
            placements.append({**where, "runs": [r["run_dir"] for r in job["runs"]]})
            progress.job_done(job)
    progress.drain(events)
    return rows


__all__ = ["SENTINEL_DIR", "check_shared_storage", "ray_job_device", "ray_session", "ray_wants_gpu", "run_ray",
           "verify_sentinels"]
