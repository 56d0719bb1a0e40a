"""Where a sweep's jobs run: in this process, in a local process pool, or as Ray tasks, with
one progress bar (and plain log lines) over every evaluation of every run.

Local workers die with the sweep: on Linux each worker asks the kernel for SIGKILL when its
parent dies (``PR_SET_PDEATHSIG``), and on an error or Ctrl-C the parent cancels pending jobs
and terminates its workers. A run that cannot start (e.g. a truncated resume file) fails
alone: the other runs of its job go on, and its row carries the error.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Mapping, Sequence, cast

from interp_toolkit.studies.study import has_outcome, read_outcome, write_outcome
from interp_toolkit.studies.sweep_config import SweepConfig, cell_configs, stop_rule_of
from interp_toolkit.threads import with_threads


def _job_threads(job: Mapping[str, Any], threads: int = 1, *rest: Any, **kwargs: Any) -> int:
    return max(1, threads)


class _ProgressEvents:
    """Callback that forwards evaluations and run ends to a queue the sweep's bar reads."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def on_evaluation(self, run_dir: Path, metrics: dict[str, Any]) -> None:
        self.queue.put(("evaluation", str(run_dir)))

    def on_run_end(self, run_dir: Path, final: dict[str, Any]) -> None:
        self.queue.put(("run_end", str(run_dir)))


def _clock_text(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class SweepProgress:
    """One bar over every evaluation of every run; a run's end fills its remaining ones.

    With ``log_every`` (seconds), also a plain line on ``stream`` at most that often (and one
    at the end): readable in the log of a background sweep, where a bar is not.
    """

    def __init__(self, bar: Any, jobs: list[dict[str, Any]], n_runs: int, n_cached: int,
                 log_every: float | None = None, name: str = "sweep", initial: int = 0, stream: Any = None,
                 clock: Any = time.monotonic) -> None:
        self.bar, self.n_runs, self.runs_done = bar, n_runs, n_cached
        self.expected = {run["run_dir"]: job["evaluations_per_run"] for job in jobs for run in job["runs"]}
        self.seen = dict.fromkeys(self.expected, 0)
        self.ended: set[str] = set()
        self.bar.set_postfix_str(f"runs {self.runs_done}/{self.n_runs}")
        self.log_every, self.name, self.clock = log_every, name, clock
        self.stream = stream if stream is not None else sys.stderr
        self.total = initial + sum(self.expected.values())  # evaluations done before + those to come
        self.initial = self.done = initial
        self.started = self.last_log = clock()

    def event(self, kind: str, run_dir: str) -> None:
        if run_dir not in self.expected or run_dir in self.ended:
            return
        if kind == "evaluation" and self.seen[run_dir] < self.expected[run_dir] - 1:
            self.seen[run_dir] += 1  # the last one is counted by the run's end
            self._advance(1)
        elif kind == "run_end":
            self._advance(self.expected[run_dir] - self.seen[run_dir])
            self.ended.add(run_dir)
            self.runs_done += 1
            self.bar.set_postfix_str(f"runs {self.runs_done}/{self.n_runs}")
        self.maybe_log()

    def _advance(self, n: int) -> None:
        self.bar.update(n)
        self.done += n

    def line(self) -> str:
        """``sweep NAME: runs 3/32 done, evaluations 310/3232 (10%), 0:12:05 elapsed, at most ~1:48:40 left``."""
        elapsed = self.clock() - self.started
        text = (f"sweep {self.name}: runs {self.runs_done}/{self.n_runs} done, evaluations {self.done}/{self.total} "
                f"({100 * self.done / max(self.total, 1):.0f}%), {_clock_text(elapsed)} elapsed")
        if self.done > self.initial and self.done < self.total:
            # Early stopping ends runs sooner, so the rate so far bounds the time left from above.
            left = (self.total - self.done) * elapsed / (self.done - self.initial)
            text += f", at most ~{_clock_text(left)} left"
        return text

    def maybe_log(self, force: bool = False) -> None:
        if self.log_every is None:
            return
        now = self.clock()
        if force or now - self.last_log >= self.log_every:
            print(self.line(), file=self.stream, flush=True)
            self.last_log = now

    def drain(self, queue: Any) -> None:
        import queue as queue_module

        while True:
            try:
                self.event(*queue.get_nowait())
            except queue_module.Empty:
                self.maybe_log()
                return

    def job_done(self, job: Mapping[str, Any]) -> None:
        """A job returned: count its runs (also those already finished before this sweep)."""
        for run in job["runs"]:
            self.event("run_end", run["run_dir"])


def _sweep_class(job: Mapping[str, Any]) -> type[SweepConfig]:
    """The SweepConfig class (or subclass) a job was planned with."""
    import importlib

    module, _, name = job.get("sweep_class", "").partition(":")
    if not module:
        return SweepConfig
    found = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return cast("type[SweepConfig]", found)


@with_threads(_job_threads)  # the caller's torch thread count is restored on return
def run_job(job: Mapping[str, Any], threads: int = 1, callbacks: Sequence[Any] | None = None,
            events: Any = None) -> list[dict[str, Any]]:
    """Train one job's seeds together and write each run's ``outcome.json``.

    This is the unit a backend executes (a top-level function, picklable by reference).
    A run whose directory cannot be used (unreadable resume file, another run's files)
    fails alone: its row carries ``error`` (the message naming the file) and no outcome.

    Args:
        job: One entry of :func:`plan_jobs`.
        threads: Torch threads of this worker.
        callbacks: :class:`interp_toolkit.callbacks.Callback` objects passed to the trainer
            (each worker gets its own copy).
        events: Optional queue receiving ``("evaluation" | "run_end", run_dir)`` tuples
            (the sweep's progress bar).

    Returns:
        One outcome row per run: cell fields, seed, run directory and the outcome record.
    """
    from interp_toolkit.devices import resolve_device
    from interp_toolkit.errors import UserError
    from interp_toolkit.io import config_hash
    from interp_toolkit.runs.batched import train_batched
    from interp_toolkit.runs.extend import check_extension_source
    from interp_toolkit.runs.resume import run_dir_state
    from interp_toolkit.runs.trainer import run_identity
    from interp_toolkit.studies.outcomes import outcome_of_run
    from interp_toolkit.tasks.mpsp import make_splits, task_modulus

    cfg = _sweep_class(job).from_dict(job["sweep"])
    device = resolve_device(cfg.device)
    cell = job["cell"]
    modulus = task_modulus(cell["task"])
    per_run = [cell_configs(cfg, cell, run["seed"]) for run in job["runs"]]
    todo = [i for i, run in enumerate(job["runs"]) if not has_outcome(run["run_dir"])]
    failed: dict[int, str] = {}
    stop_rule = stop_rule_of(cfg, cell)
    if todo:
        splits = make_splits(per_run[0][0])
        for i in todo:  # a run that cannot start must not take the job's other runs down
            identity = run_identity(per_run[i][1].to_dict(), per_run[i][2], splits, per_run[i][3])
            try:
                fresh = run_dir_state(job["runs"][i]["run_dir"], config_hash(identity),
                                      per_run[i][2].epochs).status == "fresh"
                source = job["runs"][i].get("extend_from")
                if source and fresh:
                    check_extension_source(source, identity, stop_rule, per_run[i][2].evaluation_epochs())
            except UserError as err:
                failed[i] = str(err)
        todo = [i for i in todo if i not in failed]
    if todo:
        result = train_batched(
            [per_run[i][1] for i in todo], splits, per_run[0][2], [job["runs"][i]["run_dir"] for i in todo],
            [per_run[i][3] for i in todo],
            stop_rule=stop_rule, device=device, extend_from=[job["runs"][i].get("extend_from") for i in todo],
            callbacks=[*(callbacks or []), *([_ProgressEvents(events)] if events is not None else [])],
        )
        for j, i in enumerate(todo):
            run_dir = Path(job["runs"][i]["run_dir"])
            outcome = outcome_of_run(run_dir, cell["r"], modulus, cfg.outcome_thresholds())
            outcome.update(resumed_from=result.resumed_from[j], stopped_early_at=result.stopped_early_at[j])
            write_outcome(run_dir, outcome)
    rows = []
    for i, run in enumerate(job["runs"]):
        if i in failed:
            rows.append({**cell, "seed": run["seed"], "run_dir": run["run_dir"], "error": failed[i]})
            continue
        rows.append({**cell, "seed": run["seed"], "run_dir": run["run_dir"], **read_outcome(run["run_dir"])})
    return rows


def die_with_parent(parent_pid: int | None = None) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; elsewhere a no-op).

    Used as the pool initializer of local sweep workers, so a sweep killed with ``kill -9``
    leaves no worker training on as an orphan.
    """
    import signal

    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the parent's cleanup still applies
        return
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # the parent died before the request took effect


_WORKER_EVENTS: list[Any] = []  # the progress queue of this local worker process


def _init_local_worker(parent_pid: int, events: Any) -> None:
    """Pool initializer of local sweep workers: die with the parent, keep the progress queue."""
    die_with_parent(parent_pid)
    _WORKER_EVENTS[:] = [events]


def _run_job_in_worker(job: Mapping[str, Any], threads: int, callbacks: Sequence[Any]) -> list[dict[str, Any]]:
    return run_job(job, threads, callbacks, _WORKER_EVENTS[0] if _WORKER_EVENTS else None)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel pending jobs and terminate this process's pool workers (no waiting for jobs)."""
    pool.shutdown(wait=False, cancel_futures=True)
    for child in multiprocessing.active_children():
        child.terminate()
    for child in multiprocessing.active_children():
        child.join(timeout=5)
        if child.is_alive():
            child.kill()


def run_local(jobs: list[dict[str, Any]], workers: int, threads: int, progress: SweepProgress,
               callbacks: Sequence[Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if workers == 1:
        for job in jobs:
            rows.extend(run_job(job, threads, callbacks, _LiveEvents(progress)))
            progress.job_done(job)
        return rows
    context = multiprocessing.get_context("spawn")  # fork + torch threads is unsafe
    # Per-evaluation progress comes back on a plain queue handed to each worker at start (no
    # Manager process: nothing but the workers, which die with this process, is spawned).
    events = context.Queue()
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_init_local_worker,
                               initargs=(os.getpid(), events))
    try:
        futures = {pool.submit(_run_job_in_worker, job, threads, callbacks): job for job in jobs}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            progress.drain(events)
            for future in done:
                rows.extend(future.result())
                progress.job_done(futures[future])
    except BaseException:
        _stop_workers(pool)  # Ctrl-C or a failed job: no worker goes on alone
        raise
    pool.shutdown(wait=True)
    events.close()
    return rows


class _LiveEvents:
    """A queue stand-in that updates the bar at once (single-process sweeps)."""

    def __init__(self, progress: SweepProgress) -> None:
        self.progress = progress

    def put(self, item: tuple[str, str]) -> None:
        self.progress.event(*item)


def run_ray(jobs: list[dict[str, Any]], address: str | None, progress: SweepProgress,
             callbacks: Sequence[Any], device: str = "cpu") -> list[dict[str, Any]]:
    try:
        import ray
    except ImportError as err:
        raise ValueError("backend 'ray' needs Ray: pip install 'interp-toolkit[ray]'") from err
    started_here = False
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, ignore_reinit_error=True)
        started_here = True
    try:
        # A task asks for a GPU when the sweep's device is CUDA ("auto": when the cluster has one).
        wants_gpu = device.startswith("cuda") or (device == "auto" and ray.cluster_resources().get("GPU", 0) > 0)
        remote_job = ray.remote(num_cpus=1, num_gpus=1 if wants_gpu else 0)(run_job)
        # Imported after the request, which a test checks with a stand-in ray that has no queue.
        from ray.util.queue import Queue as RayQueue

        events = RayQueue()
        pending = {remote_job.remote(job, 1, callbacks, events): job for job in jobs}
        rows: list[dict[str, Any]] = []
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            progress.drain(events)
            for ref in done:
                rows.extend(ray.get(ref))
                progress.job_done(pending.pop(ref))
        return rows
    finally:
        if started_here:
            ray.shutdown()


__all__ = ["SweepProgress", "die_with_parent", "run_job", "run_local", "run_ray"]
