"""Seed sweeps of MPSP studies: a grid of cells x seeds, trained K seeds per process.

The grid and every run's configs are :class:`~interp_toolkit.studies.grid.config.SweepConfig`'s;
the study directory's files are :mod:`interp_toolkit.studies.grid.study`'s; where jobs run (a
local process pool or Ray) is :mod:`interp_toolkit.studies.sweep.execution`'s. This module plans
the jobs of a sweep (:func:`plan_jobs`, :func:`plan_sweep`) and runs them (:func:`run_sweep`).

Every run directory is keyed by its own configs (task, model, training, run info), so two
runs never share one; rerunning a sweep skips finished runs and resumes interrupted ones
(from their last evaluation). Each job trains the seeds of one cell together with
:func:`interp_toolkit.runs.batched.train_batched`. Backends: ``local`` (a process pool) and
``ray`` (tasks on a Ray cluster; ``pip install interp-toolkit[ray]``).

The study directory is locked while a sweep runs (a second sweep on it is refused naming
the holder's PID). A run that cannot start (e.g. a truncated resume file) fails alone: the
other runs go on, and the sweep reports it.
"""

from __future__ import annotations

import contextlib
import copy
import glob
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from interp_toolkit.callbacks import as_callbacks
from interp_toolkit.errors import UserError
from interp_toolkit.io import atomic_write_json
from interp_toolkit.progress import progress_bar
from interp_toolkit.runs.metrics import read_run_metrics
from interp_toolkit.studies.grid.config import (
    SweepConfig,
    cell_configs,
    run_dir_name,
    stop_rule_of,
)
from interp_toolkit.studies.grid.study import (
    check_study_dir,
    clear_failure,
    default_study_dir,
    has_outcome,
    is_study_dir,
    new_study_record,
    read_outcome,
    read_recorded_runs,
    runs_dir,
    study_record_path,
    write_failure,
    write_recorded,
)
from interp_toolkit.studies.sweep import execution, ray_backend
from interp_toolkit.studies.sweep.execution import SweepProgress

BACKENDS = ("local", "ray")


def _run_status(run: Mapping[str, Any], recorded_runs: Mapping[str, Any]) -> str:
    """``"finished"`` (its outcome is here), ``"recorded"`` (an earlier invocation's table lists it
    as finished), ``"resume"`` (started here), ``"extend"`` (continues a shorter run) or
    ``"new"``: what a sweep does with the run (an entry of a job's ``runs``)."""
    run_dir = Path(run["run_dir"])
    if has_outcome(run_dir):
        return "finished"
    if run_dir.name in recorded_runs:
        return "recorded"
    if run_dir.exists():
        return "resume"
    return "extend" if run.get("extend_from") else "new"


def run_progress(run_dir: str | Path, epochs: int | None = None) -> dict[str, Any]:
    """Where one run directory stands, read without locking or loading anything.

    Returns:
        ``{"run", "running", "epoch", "epochs", "train_acc", "val_acc", "adv_acc",
        "resume_epoch", "finished", "generalized", "trained", "stopped_early_at"}``: the run's
        name; the process writing to it now (:func:`interp_toolkit.runs.lock.lock_holder`) or
        None; its last logged evaluation (None when nothing is logged); its last epoch; the
        epoch its resume state ends (where an interrupted run restarts; None if there is none);
        whether its outcome is written and, if so, whether it generalized (the paper's
        criterion); whether its training is over (its ``run.json`` says finished: a seed that
        stopped early is, while the other seeds of its job train on and its outcome waits for
        the job's end) and the epoch it stopped early at, if it did.
    """
    from interp_toolkit.runs.lock import lock_holder
    from interp_toolkit.runs.record import RunRecordError, is_finished, read_record
    from interp_toolkit.runs.resume import saved_epoch

    run_dir = Path(run_dir)
    evaluations = read_run_metrics(run_dir)  # a line being appended now is left out
    last = evaluations[-1] if evaluations else {}
    outcome = read_outcome(run_dir, missing_ok=True)
    try:
        record = read_record(run_dir)
    except RunRecordError:  # not written yet, or being replaced: say nothing of it
        record = {}
    return {"run": run_dir.name, "running": lock_holder(run_dir), "epoch": last.get("epoch"), "epochs": epochs,
            "train_acc": last.get("train_acc"), "val_acc": last.get("val_acc"), "adv_acc": last.get("adv_acc"),
            "resume_epoch": saved_epoch(run_dir), "finished": isinstance(outcome, dict),
            "generalized": outcome.get("generalized") if isinstance(outcome, dict) else None,
            "trained": is_finished(record), "stopped_early_at": record.get("stopped_early_at")}


def plan_sweep(cfg: SweepConfig, study_dir: str | Path | None = None,
               recorded: Sequence[str | Path] = (), extend_from: Sequence[str | Path] = ()) -> dict[str, Any]:
    """What :func:`run_sweep` would do with these arguments, touching nothing.

    Also where a study spread over several invocations stands: which process is running it now, and
    how far each run that has a directory here got.

    Returns:
        ``{"study_dir", "exists", "n_runs", "finished", "recorded", "resume", "extend", "new",
        "in_use_by", "runs"}``: the study directory (resolved as ``run_sweep`` would), whether
        it exists, and how many runs are finished there (cache hits), listed as finished in
        ``recorded`` tables (not trained), started there (resumed from their run
        directories), continuing a shorter run of ``extend_from`` or not started;
        ``in_use_by``: the process running a sweep on the study now, or None; ``runs``: one
        dict per run of the grid in job order, ``{"cell", "seed", "run_dir", "status"}`` (one
        of the counted statuses) plus, for a run with a directory here, :func:`run_progress`.

    Raises:
        ValueError, UserError: As ``run_sweep`` would, before any work: a study directory
            holding another sweep, or an unreadable or malformed record or table.
    """
    from interp_toolkit.runs.lock import lock_holder

    study_dir = (Path(study_dir) if study_dir is not None else default_study_dir(cfg)).resolve()
    check_study_dir(cfg, study_dir)
    recorded_runs = read_recorded_runs(recorded)[1] if recorded else {}
    extend_from = check_extend_from(extend_from)
    counts = {"finished": 0, "recorded": 0, "resume": 0, "extend": 0, "new": 0}
    runs = []
    for job in plan_jobs(cfg, study_dir, extend_from):
        for run in job["runs"]:
            status = _run_status(run, recorded_runs)
            counts[status] += 1
            entry = {"cell": dict(job["cell"]), "seed": run["seed"], "run_dir": Path(run["run_dir"]), "status": status}
            if entry["run_dir"].is_dir():
                entry.update(run_progress(entry["run_dir"], cfg.train.epochs))
            runs.append(entry)
    return {"study_dir": study_dir, "exists": study_dir.exists(), "n_runs": cfg.n_runs(), **counts,
            "in_use_by": lock_holder(study_dir), "runs": runs}


def run_sweep(
    cfg: SweepConfig,
    study_dir: str | Path | None = None,
    backend: str = "local",
    workers: int | None = None,
    address: str | None = None,
    progress: bool = True,
    report: bool = True,
    callbacks: Sequence[Any] | None = None,
    recorded: Sequence[str | Path] = (),
    log_every: float | None = None,
    extend_from: Sequence[str | Path] = (),
    jobs_per_gpu: int | None = None,
    retries: int = 3,
    pausable: bool = False,
    pause_at: float | None = None,
    pause_flag: str | Path | None = None,
) -> SweepResult:
    """Run (or finish) a sweep; each run's directory is keyed by its config.

    Args:
        cfg: The grid.
        study_dir: Where the study lives (default :func:`default_study_dir`:
            ``runs/sweeps/<name>_<hash of the settings shared across the grid>``). A
            directory holding a sweep with other shared settings (name, task or training
            settings) raises ``ValueError``; one whose sweep differs only in its grid
            (``GRID_FIELDS``: more seeds, ratios, ...) is extended in place.
        backend: ``"local"`` (process pool) or ``"ray"``.
        workers: Local processes (default: CPU count, at most one per job).
        address: Ray cluster address (default: an existing ``ray.init`` or a local one).
        progress: Show a progress bar over every run's evaluations (plain lines where stderr
            is not a terminal; it advances per evaluation, and a run that ends early fills its
            remaining ones).
        report: Write the report (table, plots) into ``study_dir`` at the end.
        callbacks: :class:`interp_toolkit.callbacks.Callback` objects given to every run's
            trainer, e.g. ``[TensorBoardLogger()]`` (``tensorboard --logdir STUDY_DIR`` then
            shows every run). Process-pool and Ray workers get pickled copies.
        recorded: Outcome tables of earlier invocations (``outcomes.csv`` of ``report``, e.g.
            ``docs/reproduction/outcomes.csv``): a run of this grid listed there as finished
            is not trained again (unless its directory is here already); its row is kept in
            ``study_dir/recorded_outcomes.csv``, which the study's report pools with the runs.
            So a study spread over machines or sessions resumes from committed tables.
        log_every: Also print a plain progress line to stderr at most every this many
            seconds, and one at the end (runs done, evaluations, time elapsed and at most left):
            for the log of a background sweep, where a bar is unreadable. Independent of
            ``progress``.
        extend_from: Study directories of the same sweep at fewer epochs (``--extend-from``):
            a run not started here continues the same run there from its final state
            (:mod:`interp_toolkit.runs.extend`) instead of from epoch 0, and ends as training
            from scratch would; one that stopped early there is finished here at once. So a
            study's horizon grows (1,000 -> 3,000 epochs) without retraining what it has.
        jobs_per_gpu: Jobs sharing one GPU (each Ray task asks for ``1 / jobs_per_gpu`` of
            one; the local pool runs this many workers per GPU). Default: the rule of
            :func:`interp_toolkit.studies.sweep.resources.jobs_per_gpu`.
        retries: Times a job whose worker died is run again (Ray: its task, on any node; the
            local pool: in a fresh pool); the retry resumes every run from its directory.
        pausable: A campaign's sweep (:mod:`interp_toolkit.studies.sweep.campaign`): SIGTERM
            pauses every run at its next epoch end (:mod:`interp_toolkit.runs.pause`) instead of
            interrupting it; the paused runs are the result's ``paused`` rows.
        pause_at: With ``pausable``: pause at the first epoch end at or after this
            ``time.time()`` instant as well (a wall-clock budget).
        pause_flag: With ``pausable``: a file whose appearance pauses every worker (the
            driver's SIGTERM handler creates it: :func:`~interp_toolkit.studies.sweep.campaign.sigterm_pauses`).

    A job that fails (raises, or its worker dies past the retries) fails alone: its runs are
    in the result's ``failed`` rows, naming their directories, while the other jobs finish.
    With ``backend="ray"``, every node must share ``study_dir`` with the driver: a sentinel
    checks it before any work (``UserError`` naming the directory otherwise).

    Returns:
        A :class:`SweepResult` with one outcome row per run trained or found here, sorted
        by cell and seed (``n_recorded``: runs taken from ``recorded``).
    """
    if not isinstance(cfg, SweepConfig):
        raise TypeError(f"run_sweep expects a SweepConfig, got {type(cfg).__name__}")
    if backend not in BACKENDS:
        raise UserError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise UserError(f"workers must be a positive integer or None, got {workers!r}")
    if jobs_per_gpu is not None and (isinstance(jobs_per_gpu, bool) or not isinstance(jobs_per_gpu, int)
                                     or jobs_per_gpu < 1):
        raise UserError(f"jobs_per_gpu must be a positive integer or None, got {jobs_per_gpu!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise UserError(f"retries must be an integer >= 0, got {retries!r}")
    if log_every is not None and (isinstance(log_every, bool) or not isinstance(log_every, (int, float))
                                  or not log_every > 0):
        raise UserError(f"log_every must be a positive number of seconds or None, got {log_every!r}")
    study_dir = Path(study_dir) if study_dir is not None else default_study_dir(cfg)
    study_dir = study_dir.resolve()
    recorded_table = read_recorded_runs(recorded) if recorded else ([], {})
    extend_from = check_extend_from(extend_from)
    check_study_dir(cfg, study_dir)  # before the lock: a foreign directory gets no .lock file either
    from interp_toolkit.runs.lock import DirectoryLock

    with DirectoryLock(study_dir, "study directory"):
        with contextlib.ExitStack() as stack:
            ray = stack.enter_context(ray_backend.ray_session(address)) if backend == "ray" else None
            return _run_sweep_locked(cfg, study_dir, backend, workers, ray, progress, report, callbacks,
                                     recorded_table, log_every, extend_from, recorded, jobs_per_gpu, retries,
                                     {"deadline": pause_at, "flag": None if pause_flag is None else str(pause_flag)}
                                     if pausable or pause_at is not None else None)


@dataclass
class _Resources:
    """How a sweep's jobs are sized and placed (see :mod:`interp_toolkit.studies.sweep.resources`)."""

    seeds_per_job: int
    device: str  # the device string each job resolves on its worker
    gpu_slots: list[str] | None = None  # local pool: one CUDA_VISIBLE_DEVICES per worker
    num_gpus: float = 0.0  # Ray: the GPU share each task asks for


def _resources(cfg: SweepConfig, ray: Any, jobs_per_gpu_override: int | None) -> _Resources:
    from interp_toolkit.studies.sweep.resources import jobs_per_gpu, seeds_per_job

    if ray is not None:
        wants_gpu = ray_backend.ray_wants_gpu(ray, cfg.device)
        k = seeds_per_job(cfg, on_gpu=wants_gpu)
        share = 1.0 / jobs_per_gpu(cfg, k, jobs_per_gpu_override) if wants_gpu else 0.0
        return _Resources(k, ray_backend.ray_job_device(cfg.device, wants_gpu), num_gpus=share)
    if execution.local_gpu_slots(cfg.device, 1) is None:
        return _Resources(seeds_per_job(cfg), cfg.device)
    k = seeds_per_job(cfg, on_gpu=True)
    slots = execution.local_gpu_slots(cfg.device, jobs_per_gpu(cfg, k, jobs_per_gpu_override))
    # A worker pinned to one GPU (CUDA_VISIBLE_DEVICES) sees it as "cuda"; "auto" stays "auto".
    return _Resources(k, "cuda" if cfg.device.startswith("cuda") else cfg.device, gpu_slots=slots)


def _run_sweep_locked(cfg: SweepConfig, study_dir: Path, backend: str, workers: int | None,
                      ray: Any, progress: bool, report: bool,
                      callbacks: Sequence[Any] | None,
                      recorded_table: tuple[list[str], dict[str, dict[str, str]]] = ([], {}),
                      log_every: float | None = None, extend_from: Sequence[Path] = (),
                      recorded: Sequence[str | Path] = (), jobs_per_gpu: int | None = None,
                      retries: int = 3, pause: Mapping[str, Any] | None = None) -> SweepResult:
    """:func:`run_sweep` once ``study_dir`` is locked by this process (``ray``: the connected
    module for the Ray backend, else None)."""
    check_study_dir(cfg, study_dir)
    if ray is not None:  # before any work: workers writing to their own disks would lose runs
        ray_backend.check_shared_storage(ray, study_dir)
    atomic_write_json(study_record_path(study_dir), new_study_record(cfg, study_dir, extend_from, recorded))

    started = time.perf_counter()
    runs_dir(study_dir).mkdir(parents=True, exist_ok=True)  # a study directory, even if all is recorded
    resources = _resources(cfg, ray, jobs_per_gpu)
    jobs = plan_jobs(cfg, study_dir, extend_from, seeds=resources.seeds_per_job)
    for job in jobs:
        job["device"] = resources.device
        if pause is not None:
            job["pause"] = dict(pause)
    header, recorded_runs = recorded_table
    taken: list[dict[str, str]] = []
    if recorded_runs:
        for job in jobs:
            keep = []
            for run in job["runs"]:
                if _run_status(run, recorded_runs) == "recorded":
                    taken.append(recorded_runs[Path(run["run_dir"]).name])
                else:
                    keep.append(run)
            job["runs"] = keep
        jobs = [job for job in jobs if job["runs"]]
        if taken:
            write_recorded(study_dir, header, taken)
    n_recorded = len(taken)
    # A run with its outcome here is cached, also inside a job that trains new seeds beside it
    # (a study grown by seeds without seeds_per_process): run_job does not train it again.
    finished = {run["run_dir"] for job in jobs for run in job["runs"] if _run_status(run, {}) == "finished"}
    cached_jobs: list[dict[str, Any]] = []
    todo: list[dict[str, Any]] = []
    for job in jobs:
        (cached_jobs if all(run["run_dir"] in finished for run in job["runs"]) else todo).append(job)
    rows: list[dict[str, Any]] = []
    for job in cached_jobs:
        rows.extend(run_job_cached(job))
    n_cached = len(finished)
    callbacks = as_callbacks(callbacks)
    evaluations = len(cell_configs(cfg, cfg.cells()[0], cfg.seeds[0])[2].evaluation_epochs())
    for job in todo:
        job["evaluations_per_run"] = evaluations
    bar = progress_bar(total=cfg.n_runs() * evaluations, initial=(n_cached + n_recorded) * evaluations, unit="eval",
               desc=f"sweep {cfg.name} [{backend}]", disable=not progress, file=sys.stderr)
    to_train = [{**job, "runs": [run for run in job["runs"] if run["run_dir"] not in finished]} for job in todo]
    tracker = SweepProgress(bar, to_train, cfg.n_runs(), n_cached + n_recorded, log_every=log_every, name=cfg.name,
                             initial=(n_cached + n_recorded) * evaluations)
    placements: list[dict[str, Any]] = []
    for job in to_train:  # trained again: a failure recorded by an earlier sweep no longer holds
        for run in job["runs"]:
            clear_failure(run["run_dir"])
    if todo:
        if ray is not None:
            rows.extend(ray_backend.run_ray(ray, todo, tracker, callbacks, resources.num_gpus, retries, placements))
        else:
            # On GPUs one worker per GPU slot (jobs_per_gpu per GPU); on CPUs one process per
            # core, each on 1 torch thread (small per-op work: threads only add contention).
            slots = resources.gpu_slots
            n_workers = min(workers or (len(slots) if slots else os.cpu_count() or 1), len(todo))
            rows.extend(execution.run_local(todo, n_workers, 1, tracker, callbacks, slots, placements, retries))
        tracker.maybe_log(force=True)
    bar.close()
    failed = [row for row in rows if "error" in row]
    for row in failed:  # so the report says "failed", not "training"
        write_failure(row["run_dir"], row["error"])
    paused = [row for row in rows if "paused" in row and "error" not in row]
    rows = [row for row in rows if "error" not in row and "paused" not in row]
    rows.sort(key=lambda row: (row["task"], row["n_layers"], row["n_heads"], row["weight_decay"],
                               row["r"], row["seed"], row["run_dir"]))
    if report:
        from interp_toolkit.studies.report.write import write_report

        write_report(study_dir, print_table=False)
    return SweepResult(study_dir, rows, n_cached, time.perf_counter() - started, failed, n_recorded, placements,
                       paused)


def run_job_cached(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Outcome rows of a job whose runs are all finished (no torch import)."""
    rows = []
    for run in job["runs"]:
        rows.append({**job["cell"], "seed": run["seed"], "run_dir": run["run_dir"], **read_outcome(run["run_dir"])})
    return rows


@dataclass
class SweepResult:
    """What :func:`run_sweep` returns.

    Attributes:
        study_dir: The study directory (resolved).
        rows: One outcome row per run trained or found finished here, sorted by cell and seed.
        n_cached: Runs that were finished here before this sweep started (not trained again).
        seconds: Wall time of the sweep.
        failed: Rows of runs that could not start or whose job failed (``error`` names the
            reason, ``run_dir`` the directory to inspect; rerunning the sweep resumes them).
        n_recorded: Runs taken from ``recorded`` outcome tables (not trained, not in ``rows``).
        placements: One entry per job run here: where it ran (host, PID,
            ``CUDA_VISIBLE_DEVICES``; on Ray its node and GPU ids), the device it resolved on
            its worker, and its run directories.
        paused: Rows of a campaign's runs paused on its budget or SIGTERM (``paused``: the epoch
            their resume state ends; rerunning the sweep continues them from there).
    """

    study_dir: Path
    rows: list[dict[str, Any]]
    n_cached: int
    seconds: float
    failed: list[dict[str, Any]] = field(default_factory=list)
    n_recorded: int = 0
    placements: list[dict[str, Any]] = field(default_factory=list)
    paused: list[dict[str, Any]] = field(default_factory=list)


def plan_jobs(cfg: SweepConfig, study_dir: Path, extend_from: Sequence[str | Path] = (),
              seeds: int | None = None) -> list[dict[str, Any]]:
    """One job per (cell, chunk of seeds): everything a worker needs, picklable.

    A job is ``{"sweep": cfg, "cell": ..., "runs": [{"seed", "run_dir"[, "extend_from"]}]}``:
    ``sweep`` is the typed config (of ``cfg``'s own class) holding the job's seeds only.

    A chunk holds ``seeds`` seeds (default: :func:`~interp_toolkit.studies.sweep.resources.seeds_per_job`
    for CPUs: ``cfg.seeds_per_process`` if set, else a few hours of one core).

    Jobs run in this order: every cell's first chunk of seeds, then every cell's second, ...
    So a study stopped part-way (an invocation's budget spent) has its cells at balanced seed
    counts, each one comparable with the others, rather than some cells done and others empty.
    With ``extend_from`` (study directories), a run whose directory does not exist yet
    gets ``extend_from``: the finished run there it continues (:func:`extension_source`).
    """
    from interp_toolkit.studies.sweep.resources import seeds_per_job

    jobs = []
    chunk = seeds if seeds is not None else seeds_per_job(cfg)
    for start in range(0, len(cfg.seeds), chunk):
        for cell in cfg.cells():
            runs = []
            for seed in cfg.seeds[start : start + chunk]:
                task_cfg, model_cfg, train_cfg, info = cell_configs(cfg, cell, seed)
                name = run_dir_name(cell, seed, task_cfg, model_cfg, train_cfg, info)
                run: dict[str, Any] = {"seed": seed, "run_dir": str(runs_dir(study_dir) / name)}
                if extend_from and not (runs_dir(study_dir) / name).exists():
                    source = extension_source(extend_from, name, model_cfg, train_cfg, info, stop_rule_of(cfg, cell))
                    if source is not None:
                        run["extend_from"] = str(source)
                runs.append(run)
            # The typed config itself (a subclass travels as itself, pickled by reference),
            # holding the job's own seeds only: a worker rebuilds its runs' configs from the
            # cell and seed. A shallow copy shares the sections; a copy of every seed per job
            # grew planning with the square of the seed count (20,000 seeds: minutes).
            job_sweep = copy.copy(cfg)
            job_sweep.seeds = [run["seed"] for run in runs]
            jobs.append({"sweep": job_sweep, "cell": cell, "runs": runs})
    return jobs


def _run_folders(study: str | Path) -> Path:
    return runs_dir(study) if is_study_dir(study) else Path(study)


def check_extend_from(paths: Sequence[str | Path]) -> list[Path]:
    """``paths`` as study directories (or folders of run directories) to extend runs from.

    Raises:
        UserError: Naming a path that is not a directory, is a train run directory, or is a
            folder holding no run directory (the sweep would find nothing to extend there).
    """
    from interp_toolkit.runs.record import has_record

    expected = "expected a study directory (holding runs/) of a sweep with fewer epochs"
    out = []
    for path in paths:
        path = Path(path)
        if not path.is_dir():
            raise UserError(f"--extend-from {path}: not a directory; {expected}")
        if has_record(path):
            raise UserError(f"--extend-from {path} is a train run directory (it holds run.json); {expected} "
                            "(to extend one run, use `train --extend-from`)")
        if not is_study_dir(path) and not any(has_record(p) for p in path.iterdir() if p.is_dir()):
            raise UserError(f"--extend-from {path} holds neither runs/ nor any run directory; {expected}")
        out.append(path)
    return out


def extension_source(extend_from: Sequence[str | Path], name: str, model_cfg: Any, train_cfg: Any,
                     info: Mapping[str, Any], stop_rule: Callable[[dict[str, Any]], bool] | None = None) -> Path | None:
    """The finished run in the ``extend_from`` studies that the sweep's run ``name`` continues.

    A source passes :func:`~interp_toolkit.runs.extend.check_extension_source` for this run,
    its data fingerprints aside (they follow from the task config in ``info``; the trainer
    checks them too): the same run at fewer epochs, finished, continuable under ``stop_rule``
    (the sweep's early stop). Of several, the one with the most epochs. None if there is none.
    """
    from interp_toolkit.runs.extend import check_extension_source
    from interp_toolkit.runs.trainer import _NON_SEMANTIC

    target = {"model": model_cfg.to_dict(),
              "train": {k: v for k, v in train_cfg.to_dict().items() if k not in _NON_SEMANTIC},
              "info": dict(info)}
    prefix = name.rsplit("_", 1)[0] + "_"
    best: tuple[int, Path] | None = None
    for folder in (_run_folders(p) for p in extend_from):
        for candidate in sorted(folder.glob(glob.escape(prefix) + "*")):
            try:
                plan = check_extension_source(candidate, target, stop_rule, train_cfg.evaluation_epochs(),
                                              ignore=("train.epochs", "data"))
            except UserError:
                continue  # not a run this one continues
            epochs = int(plan.record["identity"]["train"]["epochs"])
            if best is None or epochs > best[0]:
                best = (epochs, candidate)
    return best[1] if best else None


__all__ = ["BACKENDS", "SweepResult", "check_extend_from", "extension_source", "plan_jobs",
           "plan_sweep", "run_job_cached", "run_progress", "run_sweep"]
