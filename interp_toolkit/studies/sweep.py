"""Seed sweeps of MPSP studies: a grid of cells x seeds, trained K seeds per process.

A study directory holds::

    STUDY_DIR/
      study.json        the SweepConfig and its hash (a different sweep is refused here)
      runs/<task>_<L>L<H>H_r<r>_wd<wd>_s<seed>_<hash>/
          run.json, metrics.jsonl, checkpoints/, curves.png   (as interp_toolkit.train writes)
          outcome.json  the run's outcome record (interp_toolkit.studies.outcomes)
      outcomes.csv, table.csv, generalization_rate.png, curves_by_cell.png   (see report.py)

Every run directory is keyed by its own configs (task, model, training, run info), so two
runs never share one; rerunning a sweep skips finished runs and resumes interrupted ones
(from their last evaluation). Each job trains the seeds of one cell together with
:func:`interp_toolkit.runs.batched.train_batched`. Backends: ``local`` (a process pool) and
``ray`` (tasks on a Ray cluster; ``pip install interp-toolkit[ray]``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from tqdm.auto import tqdm

from interp_toolkit.callbacks import as_callbacks
from interp_toolkit.config import reject_unknown_keys
from interp_toolkit.io import atomic_write_json, config_hash

BACKENDS = ("local", "ray")


@dataclass
class SweepConfig:
    """Validated grid of an MPSP study.

    Cells are the product ``tasks x ratios x n_layers x n_heads x weight_decays``; every
    cell is trained with every seed in ``seeds`` (the model-initialization seed; the data
    of a cell is fixed by ``data_seed``, so seeds measure initialization variance).

    Attributes:
        name: Readable study name (used in the default study directory).
        tasks: MPSP task names (``interp_toolkit.tasks.mpsp.TASKS``).
        ratios: Training spurious ratios r, each in [0, 1].
        n_layers: Layer counts.
        n_heads: Head counts.
        weight_decays: AdamW weight decays.
        seeds: Model seeds (an int n means ``0 .. n-1``).
        seq_len, n_values, n_train, n_eval, data_seed: Task settings shared by all cells.
        d_model, d_mlp: Model widths.
        epochs, lr, betas, batch_size, eval_every, checkpoint_every, checkpoint_log_spaced:
            Training settings (see ``TrainConfig``).
        early_stop: Stop a run once it has generalized (saves time; hides transience).
        seeds_per_process: At most this many seeds of one cell are trained together in one
            job (``None``: all of them).
        threshold: Accuracy both val and adv must reach to count as generalized.
    """

    name: str = "mpsp"
    tasks: list[str] = field(default_factory=lambda: ["max_parity_sum_parity"])
    ratios: list[float] = field(default_factory=lambda: [0.5, 0.9])
    n_layers: list[int] = field(default_factory=lambda: [1, 2])
    n_heads: list[int] = field(default_factory=lambda: [2])
    weight_decays: list[float] = field(default_factory=lambda: [0.1])
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    seq_len: int = 10
    n_values: int = 10
    n_train: int = 16_384
    n_eval: int = 2_048
    data_seed: int = 0
    d_model: int = 64
    d_mlp: int = 128
    epochs: int = 2_000
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.98)
    batch_size: int | None = None
    eval_every: int = 10
    checkpoint_every: int | None = 500
    checkpoint_log_spaced: bool = True
    early_stop: bool = False
    seeds_per_process: int | None = None
    threshold: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.seeds, int) and not isinstance(self.seeds, bool):
            if self.seeds < 1:
                raise ValueError(f"SweepConfig.seeds must be a positive count or a list of ints, got {self.seeds!r}")
            self.seeds = list(range(self.seeds))
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise ValueError(f"SweepConfig.name must be a non-empty string without '/', got {self.name!r}")
        for name in ("tasks", "ratios", "n_layers", "n_heads", "weight_decays", "seeds"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
                raise ValueError(f"SweepConfig.{name} must be a non-empty list, got {value!r}")
            if len(set(value)) != len(value):
                raise ValueError(f"SweepConfig.{name} has duplicates: {list(value)!r}")
            setattr(self, name, list(value))
        for name in ("n_layers", "n_heads", "seeds"):
            for item in getattr(self, name):
                if isinstance(item, bool) or not isinstance(item, int) or (name != "seeds" and item < 1):
                    raise ValueError(f"SweepConfig.{name} must hold positive integers (seeds: integers), got {item!r}")
        for wd in self.weight_decays:
            if isinstance(wd, bool) or not isinstance(wd, (int, float)) or wd < 0:
                raise ValueError(f"SweepConfig.weight_decays must hold numbers >= 0, got {wd!r}")
        if self.seeds_per_process is not None and (
            isinstance(self.seeds_per_process, bool) or not isinstance(self.seeds_per_process, int)
            or self.seeds_per_process < 1
        ):
            raise ValueError(f"SweepConfig.seeds_per_process must be a positive integer or None, got {self.seeds_per_process!r}")
        if not isinstance(self.early_stop, bool):
            raise ValueError(f"SweepConfig.early_stop must be a bool, got {self.early_stop!r}")
        if not (isinstance(self.threshold, (int, float)) and 0 < self.threshold <= 1):
            raise ValueError(f"SweepConfig.threshold must be in (0, 1], got {self.threshold!r}")
        self.betas = tuple(float(b) for b in self.betas)
        # Build every cell's configs once: their validation names the bad value.
        for cell in self.cells():
            cell_configs(self, cell, self.seeds[0])

    def cells(self) -> list[dict[str, Any]]:
        """Every grid cell as ``{task, r, n_layers, n_heads, weight_decay}``."""
        return [
            {"task": task, "r": float(r), "n_layers": layers, "n_heads": heads, "weight_decay": float(wd)}
            for task, r, layers, heads, wd in itertools.product(
                self.tasks, self.ratios, self.n_layers, self.n_heads, self.weight_decays)
        ]

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["betas"] = list(self.betas)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SweepConfig":
        """Build from a dict, rejecting unknown keys by name."""
        reject_unknown_keys(cls, data)
        return cls(**dict(data))

    def key(self) -> str:
        """Hash of everything that decides the study's results."""
        return config_hash(self.to_dict(), 8)

    def n_runs(self) -> int:
        return len(self.cells()) * len(self.seeds)


#: Presets. ``smoke``: ~1 minute on 2 CPU cores, for tests. ``quick``: a small but real
#: study on one laptop in ~15 minutes on 2 CPU cores (see PRESET_NOTES).
#: ``paper``: the source protocol (cluster / GPU scale).
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(
        name="smoke", ratios=[0.5, 0.9], n_layers=[1], n_heads=[2], weight_decays=[0.1],
        seeds=[0, 1], seq_len=5, n_train=256, n_eval=128, d_model=32, d_mlp=64, epochs=40,
        lr=3e-3, eval_every=10, checkpoint_every=20, checkpoint_log_spaced=False,
    ),
    "quick": dict(
        name="quick", ratios=[0.5, 0.9], n_layers=[1, 2], n_heads=[2], weight_decays=[0.1],
        seeds=4, seq_len=5, n_train=4096, n_eval=512, d_model=64, d_mlp=128, epochs=300,
        lr=1e-3, eval_every=20, checkpoint_every=100,
    ),
    "paper": dict(
        name="paper", ratios=[0.1, 0.3, 0.5, 0.7, 0.9], n_layers=[1, 2], n_heads=[1, 2],
        weight_decays=[0.1, 0.4], seeds=30, seq_len=10, n_train=16_384, n_eval=2_048,
        d_model=64, d_mlp=128, epochs=15_000, lr=1e-3, eval_every=50, checkpoint_every=1_000,
        early_stop=False,
    ),
}

PRESET_NOTES = {
    "smoke": "2 cells x 2 seeds, 256 examples of length 5, d_model 32, 40 epochs: exercises "
             "every stage (batched training, resume, outcomes, report) in about a minute.",
    "quick": "r in {0.5, 0.9} x 1L/2L x 2 heads x 4 seeds = 16 runs, 4,096 examples of length 5, "
             "d_model 64, lr 1e-3, 300 epochs: ~15 min on 2 CPU cores. The smallest setting in "
             "which a calibration run here learned the true rule at all (an earlier 768-example, "
             "lr 3e-3 preset only memorized); not the paper's numbers.",
    "paper": "The source protocol: 16,384 examples, r in {0.1..0.9}, 1L/2L x 1/2 heads, d_model 64, "
             "d_mlp 128, AdamW wd 0.1 and 0.4, 15,000 epochs, 30 seeds, no early stop.",
}


def preset(name: str, **overrides: Any) -> SweepConfig:
    """The ``SweepConfig`` of a named preset, with fields overridden by keyword."""
    if name not in PRESETS:
        raise ValueError(f"unknown sweep preset {name!r}; expected one of {sorted(PRESETS)}")
    return SweepConfig.from_dict({**PRESETS[name], **overrides})


def cell_configs(cfg: SweepConfig, cell: Mapping[str, Any], seed: int) -> tuple[Any, Any, Any, dict[str, Any]]:
    """``(task_cfg, model_cfg, train_cfg, run_info)`` of one run of the sweep."""
    from interp_toolkit.model import ModelConfig
    from interp_toolkit.runs.trainer import TrainConfig
    from interp_toolkit.tasks.mpsp import MPSPConfig

    task_cfg = MPSPConfig.from_task(cell["task"], seq_len=cfg.seq_len, n_values=cfg.n_values, r=cell["r"],
                                    n_train=cfg.n_train, n_eval=cfg.n_eval, seed=cfg.data_seed)
    model_cfg = ModelConfig(n_layers=cell["n_layers"], n_heads=cell["n_heads"], d_model=cfg.d_model,
                            d_mlp=cfg.d_mlp, seed=seed, **task_cfg.model_dims())
    train_cfg = TrainConfig(epochs=cfg.epochs, lr=cfg.lr, betas=cfg.betas, weight_decay=cell["weight_decay"],
                            batch_size=cfg.batch_size, eval_every=cfg.eval_every,
                            checkpoint_every=cfg.checkpoint_every,
                            checkpoint_log_spaced=cfg.checkpoint_log_spaced, progress=False)
    run_info: dict[str, Any] = {"task": {"name": task_cfg.name, **task_cfg.to_dict()}}
    if cfg.early_stop:
        run_info["early_stop"] = {"rule": "generalized", "threshold": cfg.threshold}
    return task_cfg, model_cfg, train_cfg, run_info


def run_dir_name(cell: Mapping[str, Any], seed: int, task_cfg: Any, model_cfg: Any, train_cfg: Any,
                 run_info: Mapping[str, Any]) -> str:
    """Readable name plus a hash of every config: distinct runs, distinct directories."""
    key = config_hash({"task": task_cfg.to_dict(), "model": model_cfg.to_dict(),
                       "train": train_cfg.to_dict(), "info": dict(run_info)}, 8)
    return (f"{cell['task']}_{cell['n_layers']}L{cell['n_heads']}H_r{cell['r']:g}_wd{cell['weight_decay']:g}"
            f"_s{seed}_{key}")


def plan_jobs(cfg: SweepConfig, study_dir: Path) -> list[dict[str, Any]]:
    """One job per (cell, chunk of seeds): everything a worker needs, as plain data."""
    jobs = []
    chunk = cfg.seeds_per_process or len(cfg.seeds)
    for cell in cfg.cells():
        for start in range(0, len(cfg.seeds), chunk):
            seeds = cfg.seeds[start : start + chunk]
            runs = []
            for seed in seeds:
                task_cfg, model_cfg, train_cfg, info = cell_configs(cfg, cell, seed)
                name = run_dir_name(cell, seed, task_cfg, model_cfg, train_cfg, info)
                runs.append({"seed": seed, "run_dir": str(study_dir / "runs" / name)})
            jobs.append({"sweep": cfg.to_dict(), "cell": cell, "runs": runs})
    return jobs


def _job_done(job: Mapping[str, Any]) -> bool:
    return all((Path(run["run_dir"]) / "outcome.json").exists() for run in job["runs"])


class _ProgressEvents:
    """Callback that forwards evaluations and run ends to a queue the sweep's bar reads."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def on_evaluation(self, run_dir: Path, metrics: dict[str, Any]) -> None:
        self.queue.put(("evaluation", str(run_dir)))

    def on_run_end(self, run_dir: Path, final: dict[str, Any]) -> None:
        self.queue.put(("run_end", str(run_dir)))


class _SweepProgress:
    """One bar over every evaluation of every run; a run's end fills its remaining ones."""

    def __init__(self, bar: Any, jobs: list[dict[str, Any]], n_runs: int, n_cached: int) -> None:
        self.bar, self.n_runs, self.runs_done = bar, n_runs, n_cached
        self.expected = {run["run_dir"]: job["evaluations_per_run"] for job in jobs for run in job["runs"]}
        self.seen = dict.fromkeys(self.expected, 0)
        self.ended: set[str] = set()
        self.bar.set_postfix_str(f"runs {self.runs_done}/{self.n_runs}")

    def event(self, kind: str, run_dir: str) -> None:
        if run_dir not in self.expected or run_dir in self.ended:
            return
        if kind == "evaluation" and self.seen[run_dir] < self.expected[run_dir] - 1:
            self.seen[run_dir] += 1  # the last one is counted by the run's end
            self.bar.update(1)
        elif kind == "run_end":
            self.bar.update(self.expected[run_dir] - self.seen[run_dir])
            self.ended.add(run_dir)
            self.runs_done += 1
            self.bar.set_postfix_str(f"runs {self.runs_done}/{self.n_runs}")

    def drain(self, queue: Any) -> None:
        import queue as queue_module

        while True:
            try:
                self.event(*queue.get_nowait())
            except queue_module.Empty:
                return

    def job_done(self, job: Mapping[str, Any]) -> None:
        """A job returned: count its runs (also those already finished before this sweep)."""
        for run in job["runs"]:
            self.event("run_end", run["run_dir"])


def run_job(job: Mapping[str, Any], threads: int = 1, callbacks: Sequence[Any] | None = None,
            events: Any = None) -> list[dict[str, Any]]:
    """Train one job's seeds together and write each run's ``outcome.json``.

    This is the unit a backend executes (a top-level function, picklable by reference).

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
    import torch

    from interp_toolkit.runs.batched import train_batched
    from interp_toolkit.studies.outcomes import generalization_stop_rule, outcome_of_run
    from interp_toolkit.tasks.mpsp import make_splits

    torch.set_num_threads(max(1, threads))
    cfg = SweepConfig.from_dict(job["sweep"])
    cell = job["cell"]
    per_run = [cell_configs(cfg, cell, run["seed"]) for run in job["runs"]]
    todo = [i for i, run in enumerate(job["runs"]) if not (Path(run["run_dir"]) / "outcome.json").exists()]
    if todo:
        splits = make_splits(per_run[0][0])
        result = train_batched(
            [per_run[i][1] for i in todo], splits, per_run[0][2], [job["runs"][i]["run_dir"] for i in todo],
            [per_run[i][3] for i in todo],
            stop_rule=generalization_stop_rule(cfg.threshold) if cfg.early_stop else None,
            callbacks=[*(callbacks or []), *([_ProgressEvents(events)] if events is not None else [])],
        )
        for j, i in enumerate(todo):
            run_dir = Path(job["runs"][i]["run_dir"])
            outcome = outcome_of_run(run_dir, cell["r"], threshold=cfg.threshold)
            outcome.update(resumed_from=result.resumed_from[j], stopped_early_at=result.stopped_early_at[j])
            atomic_write_json(run_dir / "outcome.json", outcome)
    rows = []
    for run in job["runs"]:
        outcome = json.loads((Path(run["run_dir"]) / "outcome.json").read_text())
        rows.append({**cell, "seed": run["seed"], "run_dir": run["run_dir"], **outcome})
    return rows


def _run_local(jobs: list[dict[str, Any]], workers: int, threads: int, progress: _SweepProgress,
               callbacks: Sequence[Any]) -> list[dict[str, Any]]:

    rows: list[dict[str, Any]] = []
    if workers == 1:
        for job in jobs:
            rows.extend(run_job(job, threads, callbacks, _LiveEvents(progress)))
            progress.job_done(job)
        return rows
    context = multiprocessing.get_context("spawn")  # fork + torch threads is unsafe
    with context.Manager() as manager, ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        events = manager.Queue()
        futures = {pool.submit(run_job, job, threads, callbacks, events): job for job in jobs}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            progress.drain(events)
            for future in done:
                rows.extend(future.result())
                progress.job_done(futures[future])
    return rows


class _LiveEvents:
    """A queue stand-in that updates the bar at once (single-process sweeps)."""

    def __init__(self, progress: _SweepProgress) -> None:
        self.progress = progress

    def put(self, item: tuple[str, str]) -> None:
        self.progress.event(*item)


def _run_ray(jobs: list[dict[str, Any]], address: str | None, progress: _SweepProgress,
             callbacks: Sequence[Any]) -> list[dict[str, Any]]:
    try:
        import ray
    except ImportError as err:
        raise ValueError("backend 'ray' needs Ray: pip install 'interp-toolkit[ray]'") from err
    started_here = False
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, ignore_reinit_error=True)
        started_here = True
    try:
        from ray.util.queue import Queue as RayQueue

        events = RayQueue()
        remote_job = ray.remote(num_cpus=1)(run_job)
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


@dataclass
class SweepResult:
    """What :func:`run_sweep` returns."""

    study_dir: Path
    rows: list[dict[str, Any]]
    n_cached: int
    seconds: float


def default_study_dir(cfg: SweepConfig, root: str | Path = "runs/sweeps") -> Path:
    return Path(root) / f"{cfg.name}_{cfg.key()}"


def run_sweep(
    cfg: SweepConfig,
    study_dir: str | Path | None = None,
    backend: str = "local",
    workers: int | None = None,
    address: str | None = None,
    progress: bool = True,
    report: bool = True,
    callbacks: Sequence[Any] | None = None,
) -> SweepResult:
    """Run (or finish) a sweep; each run's directory is keyed by its config.

    Args:
        cfg: The grid.
        study_dir: Where the study lives (default ``runs/sweeps/<name>_<hash>``). A
            directory holding a different sweep raises ``ValueError``.
        backend: ``"local"`` (process pool) or ``"ray"``.
        workers: Local processes (default: CPU count, at most one per job).
        address: Ray cluster address (default: an existing ``ray.init`` or a local one).
        progress: Show a tqdm bar over every run's evaluations (it advances per
            evaluation; a run that ends early fills its remaining ones).
        report: Write the report (table, plots) into ``study_dir`` at the end.
        callbacks: :class:`interp_toolkit.callbacks.Callback` objects given to every run's
            trainer, e.g. ``[TensorBoardLogger()]`` (``tensorboard --logdir STUDY_DIR`` then
            shows every run). Process-pool and Ray workers get pickled copies.

    Returns:
        A :class:`SweepResult` with one outcome row per run, sorted by cell and seed.
    """
    if not isinstance(cfg, SweepConfig):
        raise TypeError(f"run_sweep expects a SweepConfig, got {type(cfg).__name__}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be a positive integer or None, got {workers!r}")
    study_dir = Path(study_dir) if study_dir is not None else default_study_dir(cfg)
    study_dir = study_dir.resolve()
    study_path = study_dir / "study.json"
    if study_path.exists():
        existing = json.loads(study_path.read_text())
        if existing.get("key") != cfg.key():
            raise ValueError(
                f"study directory {study_dir} holds a different sweep (key {existing.get('key')}, this "
                f"sweep's key {cfg.key()}); choose another directory"
            )
    atomic_write_json(study_path, {"key": cfg.key(), "config": cfg.to_dict(), "format": 1})

    started = time.perf_counter()
    jobs = plan_jobs(cfg, study_dir)
    cached_jobs = [job for job in jobs if _job_done(job)]
    todo = [job for job in jobs if not _job_done(job)]
    rows: list[dict[str, Any]] = []
    for job in cached_jobs:
        rows.extend(run_job_cached(job))
    n_cached = len(rows)
    callbacks = as_callbacks(callbacks)
    evaluations = len(cell_configs(cfg, jobs[0]["cell"], cfg.seeds[0])[2].evaluation_epochs())
    for job in todo:
        job["evaluations_per_run"] = evaluations
    bar = tqdm(total=cfg.n_runs() * evaluations, initial=n_cached * evaluations, unit="eval",
               desc=f"sweep {cfg.name} [{backend}]", disable=not progress, file=sys.stderr)
    tracker = _SweepProgress(bar, todo, cfg.n_runs(), n_cached)
    if todo:
        if backend == "ray":
            rows.extend(_run_ray(todo, address, tracker, callbacks))
        else:
            n_workers = min(workers or os.cpu_count() or 1, len(todo))
            threads = max(1, (os.cpu_count() or 1) // n_workers)
            rows.extend(_run_local(todo, n_workers, threads, tracker, callbacks))
    bar.close()
    rows.sort(key=lambda row: (row["task"], row["n_layers"], row["n_heads"], row["weight_decay"],
                               row["r"], row["seed"]))
    if report:
        from interp_toolkit.studies.report import write_report

        write_report(study_dir, print_table=False)
    return SweepResult(study_dir, rows, n_cached, time.perf_counter() - started)


def run_job_cached(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Outcome rows of a job whose runs are all finished (no torch import)."""
    rows = []
    for run in job["runs"]:
        outcome = json.loads((Path(run["run_dir"]) / "outcome.json").read_text())
        rows.append({**job["cell"], "seed": run["seed"], "run_dir": run["run_dir"], **outcome})
    return rows


# ----------------------------------------------------------------------------- CLI


def _parse_list(text: str, kind: type) -> list[Any]:
    try:
        return [kind(item) for item in text.split(",") if item.strip()]
    except ValueError as err:
        raise ValueError(f"could not parse {text!r} as a comma-separated list of {kind.__name__}") from err


def _load_sweep_file(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"sweep config file {path} does not exist")
    if file.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(file.read_text())
    else:
        data = json.loads(file.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"sweep config file {path} must hold a mapping of SweepConfig fields")
    return data


def sweep_config_from_args(args: Any) -> SweepConfig:
    """Preset, then config file, then flags (later wins)."""
    data: dict[str, Any] = dict(PRESETS[args.preset]) if args.preset else {}
    if args.config:
        data.update(_load_sweep_file(args.config))
    lists = {"tasks": ("tasks", str), "ratios": ("ratios", float), "layers": ("n_layers", int),
             "heads": ("n_heads", int), "weight_decays": ("weight_decays", float)}
    for flag, (key, kind) in lists.items():
        if getattr(args, flag) is not None:
            data[key] = _parse_list(getattr(args, flag), kind)
    if args.seeds is not None:
        data["seeds"] = _parse_list(args.seeds, int) if "," in args.seeds else int(args.seeds)
    for flag in ("name", "epochs", "n_train", "n_eval", "seq_len", "n_values", "d_model", "d_mlp", "lr",
                 "eval_every", "checkpoint_every", "seeds_per_process", "data_seed", "batch_size"):
        if getattr(args, flag) is not None:
            data[flag] = getattr(args, flag)
    if args.early_stop is not None:
        data["early_stop"] = args.early_stop
    return SweepConfig.from_dict(data)


def cmd_sweep(args: Any) -> int:
    """``interp-toolkit sweep``."""
    try:
        cfg = sweep_config_from_args(args)
        if args.dry_run:
            print(json.dumps(cfg.to_dict(), indent=2))
            print(f"{len(cfg.cells())} cells x {len(cfg.seeds)} seeds = {cfg.n_runs()} runs")
            return 0
        from interp_toolkit.loggers import loggers_from_flags

        result = run_sweep(cfg, args.out, backend=args.backend, workers=args.workers, address=args.address,
                           progress=not args.quiet, report=False, callbacks=loggers_from_flags(args))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"study {result.study_dir}: {len(result.rows)} runs ({result.n_cached} cached) in {result.seconds:.0f} s")
    from interp_toolkit.studies.report import write_report

    write_report(result.study_dir, print_table=True)
    return 0


def cmd_report(args: Any) -> int:
    """``interp-toolkit report STUDY_DIR``."""
    from interp_toolkit.studies.report import write_report

    try:
        write_report(args.study_dir, out_dir=args.out, print_table=True,
                     figure_format=getattr(args, "format", "png"))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def add_sweep_parsers(subparsers: Any) -> None:
    """Register the ``sweep`` and ``report`` subcommands on an argparse subparsers object."""
    from interp_toolkit.loggers import add_logger_flags

    p = subparsers.add_parser(
        "sweep", help="run a seed sweep of MPSP cells (resumable, cached per run)",
        description="Run a grid of MPSP cells x seeds. Finished runs are reused, interrupted ones "
        "resume. Presets: " + "; ".join(f"{k}: {v}" for k, v in PRESET_NOTES.items()),
    )
    p.add_argument("--preset", choices=sorted(PRESETS), help="start from a preset (default: smoke "
                   "unless --config is given)")
    p.add_argument("--config", help="JSON or YAML file of SweepConfig fields (overrides the preset)")
    p.add_argument("--out", help="study directory (default runs/sweeps/<name>_<hash>)")
    p.add_argument("--backend", choices=BACKENDS, default="local", help="local process pool or Ray")
    p.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    p.add_argument("--workers", type=int, help="local processes (default: CPU count)")
    p.add_argument("--name")
    p.add_argument("--tasks", help="comma-separated MPSP task names")
    p.add_argument("--ratios", help="comma-separated spurious ratios, e.g. 0.1,0.5,0.9")
    p.add_argument("--layers", help="comma-separated layer counts, e.g. 1,2")
    p.add_argument("--heads", help="comma-separated head counts, e.g. 1,2")
    p.add_argument("--weight-decays", dest="weight_decays", help="comma-separated weight decays")
    p.add_argument("--seeds", help="a count n (seeds 0..n-1) or a comma-separated list")
    p.add_argument("--seeds-per-process", dest="seeds_per_process", type=int,
                   help="at most this many seeds trained together per job")
    for flag, kind in (("epochs", int), ("n-train", int), ("n-eval", int), ("seq-len", int), ("n-values", int),
                       ("d-model", int), ("d-mlp", int), ("lr", float), ("eval-every", int),
                       ("checkpoint-every", int), ("data-seed", int), ("batch-size", int)):
        p.add_argument(f"--{flag}", dest=flag.replace("-", "_"), type=kind)
    p.add_argument("--early-stop", dest="early_stop", action="store_true", default=None,
                   help="stop a run once it has generalized")
    p.add_argument("--no-early-stop", dest="early_stop", action="store_false")
    p.add_argument("--dry-run", action="store_true", help="print the grid and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_logger_flags(p)
    p.set_defaults(func=_cmd_sweep_with_default_preset)

    p = subparsers.add_parser("report", help="generalization-rate table and plots of a study directory",
                              description="Write table.csv (rate per cell, n seeds, 95%% Wilson interval), "
                              "outcomes.csv and PNG plots beside them, and print the table.")
    p.add_argument("study_dir", help="a study directory written by `sweep`")
    p.add_argument("--out", help="where to write the report (default: the study directory)")
    p.add_argument("--format", choices=("png", "svg", "pdf"), default="png",
                   help="figure file format (default png)")
    p.set_defaults(func=cmd_report)


def _cmd_sweep_with_default_preset(args: Any) -> int:
    if args.preset is None and args.config is None:
        args.preset = "smoke"
    return cmd_sweep(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point (``python -m interp_toolkit.studies.sweep sweep ...``)."""
    import argparse

    parser = argparse.ArgumentParser(prog="interp-toolkit")
    sub = parser.add_subparsers(dest="command", required=True)
    add_sweep_parsers(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["BACKENDS", "PRESETS", "PRESET_NOTES", "SweepConfig", "SweepResult", "add_sweep_parsers",
           "cell_configs", "plan_jobs", "preset", "run_job", "run_sweep"]
