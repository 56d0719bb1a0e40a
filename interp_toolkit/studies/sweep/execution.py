"""Where a sweep's jobs run: in this process or in a local process pool (as Ray tasks:
:mod:`.ray_backend`), with one progress bar (and plain log lines) over every evaluation of
every run.

The device is resolved on the worker (:func:`job_device`): local workers on GPUs are pinned to
one each by ``CUDA_VISIBLE_DEVICES`` (:func:`local_gpu_slots`), Ray tasks ask for a share of a
GPU and use the one Ray assigns. A job that raises or whose worker dies fails alone: its runs
come back as ``error`` rows naming their directories (:func:`failed_rows`) while the other jobs
finish; Ray retries a task whose worker died, and the retry resumes every run from its own
directory. Before a Ray sweep, :func:`~.ray_backend.check_shared_storage` makes sure every node shares the
study directory with the driver.

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
from typing import Any, Mapping, Sequence

from interp_toolkit.errors import UserError
from interp_toolkit.runs import pause
from interp_toolkit.studies.grid.config import SweepConfig, cell_configs, stop_rule_of
from interp_toolkit.studies.grid.study import has_outcome, read_outcome, write_outcome
from interp_toolkit.threads import with_threads


def _job_threads(job: Mapping[str, Any], threads: int = 1, *rest: Any, **kwargs: Any) -> int:
    return max(1, threads)


class _ProgressEvents:
    """Callback that forwards evaluations and run ends to a queue the sweep's bar reads.

    Progress is a view, never a reason to stop training: a queue that fails (Ray's queue
    actor killed, a closed pipe) is dropped, and the runs go on without reporting to it."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def _put(self, item: tuple[str, str]) -> None:
        if self.queue is None:
            return
        try:
            self.queue.put(item)
        except Exception:  # noqa: BLE001 - any failure of the queue: stop reporting, keep training
            self.queue = None

    def on_evaluation(self, run_dir: Path, metrics: dict[str, Any]) -> None:
        self._put(("evaluation", str(run_dir)))

    def on_run_end(self, run_dir: Path, final: dict[str, Any]) -> None:
        self._put(("run_end", str(run_dir)))


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
        self.queue_lost = False  # the events queue failed: drain no more

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
        """Take every event waiting on ``queue``. A queue that fails otherwise than by being
        empty (Ray's queue actor killed) is given up, with one ``note:``: the bar then moves
        as jobs end (:meth:`job_done`), and the sweep goes on."""
        import queue as queue_module

        if self.queue_lost:
            self.maybe_log()
            return
        while True:
            try:
                item = queue.get_nowait()
            except queue_module.Empty:
                self.maybe_log()
                return
            except Exception as err:  # noqa: BLE001 - the queue itself failed: progress is a view only
                from interp_toolkit.errors import notice

                self.queue_lost = True
                notice(f"the sweep's progress queue failed ({type(err).__name__}); training goes on, and progress "
                       "now advances as jobs end")
                return
            self.event(*item)

    def job_done(self, job: Mapping[str, Any]) -> None:
        """A job returned: count its runs (also those already finished before this sweep)."""
        for run in job["runs"]:
            self.event("run_end", run["run_dir"])


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
    from interp_toolkit.io import config_hash
    from interp_toolkit.runs.batched import train_batched
    from interp_toolkit.runs.extend import check_extension_source
    from interp_toolkit.runs.resume import run_dir_state
    from interp_toolkit.runs.trainer import run_identity
    from interp_toolkit.studies.common.outcomes import outcome_of_run
    from interp_toolkit.tasks.mpsp import make_splits, task_modulus

    cfg: SweepConfig = job["sweep"]
    device = resolve_device(job_device(job))  # on the worker: the driver may have no GPU
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
    paused: dict[int, int | None] = {}
    if todo:
        if "pause" in job:  # a campaign: pause at the deadline or on SIGTERM, at an epoch's end
            pause.arm(job["pause"].get("deadline"), flag=job["pause"].get("flag"))
        try:
            if "pause" in job and pause.requested():  # spent before this job began: it waits
                raise pause.TrainingPaused(-1, str(pause.requested()))
            result = train_batched(
                [per_run[i][1] for i in todo], splits, per_run[0][2], [job["runs"][i]["run_dir"] for i in todo],
                [per_run[i][3] for i in todo],
                stop_rule=stop_rule, device=device, extend_from=[job["runs"][i].get("extend_from") for i in todo],
                callbacks=[*(callbacks or []), *([_ProgressEvents(events)] if events is not None else [])],
            )
        except pause.TrainingPaused:
            paused = _write_outcomes_of_finished(job, todo, cfg, modulus)
        else:
            for j, i in enumerate(todo):
                run_dir = Path(job["runs"][i]["run_dir"])
                outcome = outcome_of_run(run_dir, cell["r"], modulus, cfg.outcome_thresholds())
                outcome.update(resumed_from=result.resumed_from[j], stopped_early_at=result.stopped_early_at[j])
                write_outcome(run_dir, outcome)
        finally:
            pause.disarm()
    rows = []
    for i, run in enumerate(job["runs"]):
        if i in failed:
            rows.append({**cell, "seed": run["seed"], "run_dir": run["run_dir"], "error": failed[i]})
            continue
        if i in paused:
            rows.append({**cell, "seed": run["seed"], "run_dir": run["run_dir"], "paused": paused[i]})
            continue
        rows.append({**cell, "seed": run["seed"], "run_dir": run["run_dir"], **read_outcome(run["run_dir"])})
    return rows


def _write_outcomes_of_finished(job: Mapping[str, Any], todo: Sequence[int], cfg: SweepConfig,
                                modulus: int) -> dict[int, int | None]:
    """After a pause: the outcome of every run of ``todo`` whose training is over (stopped early
    before the pause); returns ``{index: epoch its resume state ends}`` of the others."""
    from interp_toolkit.runs.record import is_finished, read_record
    from interp_toolkit.runs.resume import saved_epoch
    from interp_toolkit.studies.common.outcomes import outcome_of_run

    paused: dict[int, int | None] = {}
    for i in todo:
        run_dir = Path(job["runs"][i]["run_dir"])
        try:
            record = read_record(run_dir)
        except UserError:  # not started: its group had not begun
            record = {}
        if not is_finished(record):
            paused[i] = saved_epoch(run_dir) if run_dir.is_dir() else None
            continue
        outcome = outcome_of_run(run_dir, job["cell"]["r"], modulus, cfg.outcome_thresholds())
        outcome.update(resumed_from=record.get("resumed_from"), stopped_early_at=record.get("stopped_early_at"))
        write_outcome(run_dir, outcome)
    return paused


def job_device(job: Mapping[str, Any]) -> str:
    """The device string a job trains on: the one its backend chose (``job["device"]``: a
    worker pinned to one GPU sees it as ``cuda``) or else the sweep's ``device``."""
    return str(job.get("device") or job["sweep"].device or "auto")


def failed_rows(job: Mapping[str, Any], error: BaseException | str) -> list[dict[str, Any]]:
    """One ``error`` row per run of a job that failed as a whole (its worker raised or died),
    naming the run directory to inspect; the run resumes from there when the sweep is rerun."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    text = " ".join(text.split())
    if len(text) > 2_000:
        text = text[:2_000] + " ..."
    return [{**job["cell"], "seed": run["seed"], "run_dir": run["run_dir"], "error": f"job failed: {text}"}
            for run in job["runs"]]


def placement() -> dict[str, Any]:
    """Where this process runs: host, PID, ``CUDA_VISIBLE_DEVICES`` and (in a Ray task) the
    Ray node and GPU ids assigned to it."""
    import socket

    out: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(),
                           "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        context = ray.get_runtime_context()
        out.update(node_id=context.get_node_id(), gpu_ids=[str(g) for g in ray.get_gpu_ids()])
    return out


def local_gpu_slots(device: str, jobs_per_gpu: int) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` values for the local pool's workers (one each, dealt in turn),
    or None when the sweep trains on the CPU here.

    ``cuda:N`` pins every worker to the N-th visible GPU; ``cuda`` and ``auto`` (with CUDA
    here) spread them over every visible GPU; each GPU appears ``jobs_per_gpu`` times.
    """
    from interp_toolkit.devices import resolve_device

    resolved = resolve_device(device)
    if resolved.type != "cuda":
        return None
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else \
        [str(i) for i in range(torch.cuda.device_count())]
    gpus = [ids[resolved.index]] if resolved.index is not None else ids
    return deal_gpu_slots(gpus, jobs_per_gpu)


def deal_gpu_slots(gpus: Sequence[str], jobs_per_gpu: int) -> list[str]:
    """Worker slots over ``gpus``: one per job that runs at once, the GPUs dealt in turn
    (``["0", "1"]``, 2 -> ``["0", "1", "0", "1"]``), so N workers spread over the GPUs."""
    if jobs_per_gpu < 1 or not gpus:
        raise UserError(f"deal_gpu_slots needs GPUs and jobs_per_gpu >= 1, got {list(gpus)!r}, {jobs_per_gpu!r}")
    return [gpu for _ in range(jobs_per_gpu) for gpu in gpus]


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


def take_gpu_slot(slots: Any, timeout: float = 5) -> str | None:
    """Pin this worker process to the next GPU of the pool's ``slots`` queue (sets
    ``CUDA_VISIBLE_DEVICES`` before CUDA starts here, so ``cuda`` is that GPU); None if no
    slot is left or none were given."""
    import queue as queue_module

    if slots is None:
        return None
    try:
        gpu = slots.get(timeout=timeout)
    except queue_module.Empty:
        return None
    os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    return str(gpu)


def _init_local_worker(parent_pid: int, events: Any, slots: Any = None) -> None:
    """Pool initializer of local sweep workers: die with the parent, keep the progress queue,
    take a GPU slot (when the sweep trains on GPUs)."""
    die_with_parent(parent_pid)
    _WORKER_EVENTS[:] = [events]
    take_gpu_slot(slots)


def _run_job_in_worker(job: Mapping[str, Any], threads: int,
                       callbacks: Sequence[Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    return run_job_here(job, threads, callbacks, _WORKER_EVENTS[0] if _WORKER_EVENTS else None)


def run_job_here(job: Mapping[str, Any], threads: int, callbacks: Sequence[Any],
                  events: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """:func:`run_job` on this worker, with where it ran; a job that raises comes back as
    :func:`failed_rows` (the other jobs go on), its worker's placement still recorded."""
    from interp_toolkit.devices import resolve_device

    where = placement()
    try:
        where["device"] = str(resolve_device(job_device(job)))  # here, on the worker
        return run_job(job, threads, callbacks, events), where
    except Exception as err:
        return failed_rows(job, err), {**where, "error": f"{type(err).__name__}: {err}"}


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
              callbacks: Sequence[Any], gpu_slots: Sequence[str] | None = None,
              placements: list[dict[str, Any]] | None = None, retries: int = 3) -> list[dict[str, Any]]:
    """Run ``jobs`` in this process (``workers == 1`` and no GPU slots) or a spawned pool.

    A job that raises fails alone: its runs come back as ``error`` rows (:func:`failed_rows`)
    and the other jobs go on. A worker that dies (killed, out of memory) breaks the pool, and
    with it every job in flight there, and which of them was on the dead worker cannot be
    told: those jobs run again, each in a pool of its own (still ``workers`` at a time), where
    a death is the job's own and counts against its ``retries``; past them it is reported as
    failed. So a job that kills its worker fails alone, never its neighbours, and every rerun
    resumes its runs from their directories. With ``gpu_slots`` (:func:`local_gpu_slots`),
    each worker takes one ``CUDA_VISIBLE_DEVICES`` value at start. ``placements`` receives
    one entry per job: where it ran (:func:`placement`) and its device.
    """
    from concurrent.futures.process import BrokenProcessPool

    rows: list[dict[str, Any]] = []
    placements = placements if placements is not None else []
    if workers == 1 and not gpu_slots:
        for job in jobs:
            job_rows, where = run_job_here(job, threads, callbacks, _LiveEvents(progress))
            rows.extend(job_rows)  # a failed job's rows carry its error: reported at the end
            placements.append({**where, "runs": [r["run_dir"] for r in job["runs"]]})
            progress.job_done(job)
        return rows
    context = multiprocessing.get_context("spawn")  # fork + torch threads is unsafe
    # Per-evaluation progress comes back on a plain queue handed to each worker at start (no
    # Manager process: nothing but the workers, which die with this process, is spawned).
    events = context.Queue()
    deaths = [0] * len(jobs)  # worker deaths while the job ran alone: its own

    def new_pool(size: int, first_slot: int = 0) -> ProcessPoolExecutor:
        slots = None
        if gpu_slots:  # pools side by side take different slots: ``first_slot`` is this pool's first
            slots = context.Queue()
            for i in range(size):
                slots.put(gpu_slots[(first_slot + i) % len(gpu_slots)])
        return ProcessPoolExecutor(max_workers=size, mp_context=context, initializer=_init_local_worker,
                                   initargs=(os.getpid(), events, slots))

    def finish(index: int, job_rows: list[dict[str, Any]], where: dict[str, Any]) -> None:
        rows.extend(job_rows)
        placements.append({**where, "runs": [r["run_dir"] for r in jobs[index]["runs"]]})
        progress.job_done(jobs[index])

    def run_round(pools: list[tuple[ProcessPoolExecutor, list[int]]], alone: bool) -> list[int]:
        """Run each pool's jobs; returns the jobs a dead worker broke (to run again, alone)."""
        broken: list[int] = []
        try:
            futures = {pool.submit(_run_job_in_worker, jobs[i], threads, callbacks): i
                       for pool, indices in pools for i in indices}
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                progress.drain(events)
                for future in done:
                    index = futures[future]
                    try:
                        job_rows, where = future.result()
                    except BrokenProcessPool as err:  # a worker died: this job's, if it ran alone
                        if alone:
                            deaths[index] += 1
                        if deaths[index] <= retries:
                            broken.append(index)
                            continue
                        job_rows, where = failed_rows(jobs[index], err), {"error": f"{type(err).__name__}: {err}"}
                    finish(index, job_rows, where)
        except BaseException:
            for pool, _ in pools:
                _stop_workers(pool)  # Ctrl-C: no worker goes on alone
            raise
        for pool, _ in pools:
            pool.shutdown(wait=True)
        progress.drain(events)
        return broken

    # First every job in one shared pool; whatever a worker death broke there runs again
    # alone, in rounds of up to ``workers`` single-worker pools.
    todo = run_round([(new_pool(min(workers, len(jobs))), list(range(len(jobs))))], alone=False) if jobs else []
    while todo:
        batch, todo = sorted(todo)[:workers], sorted(todo)[workers:]
        todo += run_round([(new_pool(1, k), [i]) for k, i in enumerate(batch)], alone=True)
    events.close()
    return rows


class _LiveEvents:
    """A queue stand-in that updates the bar at once (single-process sweeps)."""

    def __init__(self, progress: SweepProgress) -> None:
        self.progress = progress

    def put(self, item: tuple[str, str]) -> None:
        self.progress.event(*item)


__all__ = ["SweepProgress", "deal_gpu_slots", "die_with_parent", "failed_rows", "job_device", "local_gpu_slots",
           "placement", "run_job", "run_job_here", "run_local", "take_gpu_slot"]
