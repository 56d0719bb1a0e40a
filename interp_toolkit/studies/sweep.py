"""Seed sweeps of MPSP studies: a grid of cells x seeds, trained K seeds per process.

A study directory holds::

    STUDY_DIR/
      study.json        the latest SweepConfig, its hash and the outcome_thresholds every
                        outcome of the study is scored with; a sweep whose shared settings
                        differ is refused here (one that only grows the grid is welcome);
                        the study's whole grid (the union of every sitting's) and one entry
                        per sitting (when, where, its grid, --extend-from, --recorded), so the
                        directory alone resumes the study (study_sweep, ``sweep --out DIR``)
      runs/<task>_<L>L<H>H_r<r>_wd<wd>_s<seed>_<hash>/
          run.json, metrics.jsonl, checkpoints/, curves.png   (as interp_toolkit.train writes)
          outcome.json  the run's outcome record (interp_toolkit.studies.outcomes)
      outcomes.csv, table.csv, generalization_rate.png, curves_by_cell.png   (see report.py)

Every run directory is keyed by its own configs (task, model, training, run info), so two
runs never share one; rerunning a sweep skips finished runs and resumes interrupted ones
(from their last evaluation). Each job trains the seeds of one cell together with
:func:`interp_toolkit.runs.batched.train_batched`. Backends: ``local`` (a process pool) and
``ray`` (tasks on a Ray cluster; ``pip install interp-toolkit[ray]``).

The study directory is locked while a sweep runs (a second sweep on it is refused naming
the holder's PID). Local workers die with the sweep: on Linux each worker asks the kernel
for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``), and on an error or Ctrl-C the
parent cancels pending jobs and terminates its workers. A run that cannot start (e.g. a
truncated resume file) fails alone: the other runs go on, and the sweep reports it.
"""

from __future__ import annotations

import glob
import itertools
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence, Union

from tqdm.auto import tqdm

from interp_toolkit.callbacks import as_callbacks
from interp_toolkit.config import Config
from interp_toolkit.io import atomic_write_json, config_hash, read_jsonl
from interp_toolkit.threads import with_threads

BACKENDS = ("local", "ray")
#: SweepConfig fields that do not change results (beyond float rounding): not in its key.
_NOT_IN_KEY = ("device",)
#: TrainConfig fields that choose how, not what, to compute: not in run directory names.
_HOW_NOT_WHAT = ("engine", "device")

#: A ratio entry meaning "r = 1/m of each task" (0.5 for parity tasks, 1/3 for mod-3 tasks).
CHANCE = "chance"

#: SweepConfig fields that only score runs (they are re-applied by ``report`` to stored
#: metrics), so they are left out of the study key: changing them never retrains.
OUTCOME_ONLY_FIELDS = ("transient_tolerance", "transient_min_span")

#: SweepConfig fields that only choose which runs exist (or how seeds are batched), not how
#: any run trains: a study directory accepts a sweep that differs from its own only in these,
#: so a study grows by more seeds, ratios or architectures in place (runs are keyed by their
#: own configs and the report pools them by cell).
GRID_FIELDS = ("tasks", "ratios", "n_layers", "n_heads", "weight_decays", "seeds", "seeds_per_process")


@dataclass
class SweepConfig(Config):
    """Validated grid of an MPSP study.

    Cells are the product ``tasks x ratios x n_layers x n_heads x weight_decays``; every
    cell is trained with every seed in ``seeds`` (the model-initialization seed; the data
    of a cell is fixed by ``data_seed``, so seeds measure initialization variance).

    Attributes:
        name: Readable study name (used in the default study directory).
        tasks: MPSP task names (``interp_toolkit.tasks.mpsp.TASKS``).
        ratios: Training spurious ratios r, each in [0, 1], or ``"chance"`` for r = 1/m of
            each task (m = 2 for parity tasks, 3 for mod-3 tasks; a duplicate is dropped).
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
        threshold: Accuracy that counts as 100% (generalized on the generalization split,
            rule learned on both; see ``interp_toolkit.studies.outcomes``).
        transient_tolerance: A generalized run whose generalization-split accuracy falls
            below this ...
        transient_min_span: ... for at least this many consecutive evaluations is transient.
        device: Where runs train: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA if
            the worker has it). On a GPU every seed of a cell trains in one job (the engine
            splits the batch into passes that fit the GPU's memory) and Ray tasks ask for
            one GPU. Not part of the study's key: results agree up to float rounding.
    """

    name: str = "mpsp"
    tasks: list[str] = field(default_factory=lambda: ["max_parity_sum_parity"])
    ratios: list[Union[float, Literal["chance"]]] = field(default_factory=lambda: [0.5, 0.9])  # noqa: UP007
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
    transient_tolerance: float = 0.99
    transient_min_span: int = 3
    device: str = "auto"

    def __post_init__(self) -> None:
        from interp_toolkit.devices import check_device_name

        check_device_name(self.device)
        if isinstance(self.seeds, int) and not isinstance(self.seeds, bool):
            if self.seeds < 1:
                raise ValueError(f"SweepConfig.seeds must be a positive count or a list of ints, got {self.seeds!r}")
            self.seeds = list(range(self.seeds))
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise ValueError(f"SweepConfig.name must be a non-empty string without '/', got {self.name!r}")
        for name in ("tasks", "n_layers", "n_heads", "weight_decays", "seeds"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
                raise ValueError(f"SweepConfig.{name} must be a non-empty list, got {value!r}")
            if len(set(value)) != len(value):
                raise ValueError(f"SweepConfig.{name} has duplicates: {list(value)!r}")
            setattr(self, name, list(value))
        if isinstance(self.ratios, (str, bytes)) or not isinstance(self.ratios, (list, tuple)) or not self.ratios:
            raise ValueError(f"SweepConfig.ratios must be a non-empty list, got {self.ratios!r}")
        for item in self.ratios:
            if item != CHANCE and (isinstance(item, bool) or not isinstance(item, (int, float))
                                   or not 0.0 <= item <= 1.0):
                raise ValueError(f"SweepConfig.ratios must hold numbers in [0, 1] or {CHANCE!r}, got {item!r}")
        if len(set(self.ratios)) != len(self.ratios):
            raise ValueError(f"SweepConfig.ratios has duplicates: {list(self.ratios)!r}")
        self.ratios = list(self.ratios)
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
        self.outcome_thresholds()  # validates threshold and the transience settings by name
        self.betas = tuple(float(b) for b in self.betas)
        # Build every cell's configs once: their validation names the bad value.
        for cell in self.cells():
            cell_configs(self, cell, self.seeds[0])

    def task_ratios(self, task: str) -> list[float]:
        """The ratios of one task, ``"chance"`` resolved to its 1/m (duplicates dropped)."""
        from interp_toolkit.tasks.mpsp import task_modulus

        out: list[float] = []
        for item in self.ratios:
            r = 1.0 / task_modulus(task) if item == CHANCE else float(item)
            if not any(abs(r - seen) < 1e-9 for seen in out):
                out.append(r)
        return out

    def cells(self) -> list[dict[str, Any]]:
        """Every grid cell as ``{task, r, n_layers, n_heads, weight_decay}``."""
        return [
            {"task": task, "r": r, "n_layers": layers, "n_heads": heads, "weight_decay": float(wd)}
            for task in self.tasks
            for r, layers, heads, wd in itertools.product(
                self.task_ratios(task), self.n_layers, self.n_heads, self.weight_decays)
        ]

    def outcome_thresholds(self) -> Any:
        """The :class:`~interp_toolkit.studies.outcomes.OutcomeThresholds` of this study."""
        from interp_toolkit.studies.outcomes import OutcomeThresholds

        return OutcomeThresholds(threshold=self.threshold, transient_tolerance=self.transient_tolerance,
                                 transient_min_span=self.transient_min_span)

    def key(self) -> str:
        """Hash of everything that decides the study's training (not the outcome-only fields,
        nor where it runs)."""
        data = {k: v for k, v in self.to_dict().items() if k not in OUTCOME_ONLY_FIELDS + _NOT_IN_KEY}
        return config_hash(data, 8)

    def study_key(self) -> str:
        """Hash of the settings a study shares across its grid: :meth:`key` without the
        ``GRID_FIELDS``. Sweeps that differ only in their grid (more seeds, ratios, ...) have
        the same study key, so they share a default study directory and grow it in place."""
        skip = OUTCOME_ONLY_FIELDS + _NOT_IN_KEY + GRID_FIELDS
        return config_hash({k: v for k, v in self.to_dict().items() if k not in skip}, 8)

    def n_runs(self) -> int:
        return len(self.cells()) * len(self.seeds)


#: Presets. ``smoke``: ~1 minute on 2 CPU cores, for tests. ``quick``: a small but real
#: study on one laptop in ~15 minutes on 2 CPU cores (see PRESET_NOTES).
#: ``reproduce``: the regime chosen by the calibration study of docs/reproduction.md.
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
    "reproduce": dict(
        name="reproduce", tasks=["max_parity_sum_parity"], ratios=[0.9, 0.5, 0.1, 0.3, 0.7], n_layers=[2, 1],
        n_heads=[2], weight_decays=[0.1, 0.4], seeds=list(range(100, 116)), seq_len=8, n_values=10, n_train=16_384, n_eval=2_048,
        d_model=64, d_mlp=128, epochs=1_000, lr=1e-3, eval_every=10, checkpoint_every=250,
        checkpoint_log_spaced=True, early_stop=True, seeds_per_process=4, threshold=1.0,
    ),
    "paper": dict(
        name="paper", tasks=["max_parity_sum_parity", "first_parity_sum_parity", "max_mod3_sum_mod3",
                             "first_mod3_sum_mod3"],
        ratios=[0.1, 0.3, CHANCE, 0.5, 0.7, 0.9], n_layers=[1, 2], n_heads=[1, 2],
        weight_decays=[0.1, 0.4], seeds=30, seq_len=10, n_train=16_384, n_eval=2_048,
        d_model=64, d_mlp=128, epochs=15_000, lr=1e-3, eval_every=50, checkpoint_every=1_000,
        early_stop=False, threshold=1.0, transient_tolerance=0.99, transient_min_span=3,
    ),
}

PRESET_NOTES = {
    "smoke": "2 cells x 2 seeds, 256 examples of length 5, d_model 32, 40 epochs: exercises "
             "every stage (batched training, resume, outcomes, report) in about a minute.",
    "quick": "r in {0.5, 0.9} x 1L/2L x 2 heads x 4 seeds = 16 runs, 4,096 examples of length 5, "
             "d_model 64, lr 1e-3, 300 epochs: ~15 min on 2 CPU cores. The smallest setting in "
             "which a calibration run here learned the true rule at all (an earlier 768-example, "
             "lr 3e-3 preset only memorized); not the paper's numbers.",
    "reproduce": "The reproduction regime of docs/reproduction.md: sum parity / max shortcut, length 8, "
                 "values 0..9, 16,384 examples, the paper's widths and optimizer, 16 seeds per cell (100-115: fresh, "
                 "apart from the calibration's 0-3), r in "
                 "{0.9, 0.5 (= 1/m), 0.1, 0.3, 0.7} (headline cells first) x 2L/1L x wd 0.1 and 0.4, 1,000 "
                 "epochs (1/15 of the paper's), a run stopped once it has generalized (so its wd 0.4 cells cannot "
                 "show transience: examples/reproduction/final_1L_wd04.yaml trains them without early stop). "
                 "320 runs: ~65 core-hours "
                 "on these CPUs (2L ~1.3 s, 1L ~0.2 s per seed-epoch); resumable across sittings.",
    "paper": "The source protocol: the four task variants, 16,384 examples, r in {0.1, 0.3, 1/m, 0.5, "
             "0.7, 0.9} (1/m per task), 1L/2L x 1/2 heads, d_model 64, d_mlp 128, AdamW wd 0.1 and 0.4, "
             "15,000 epochs, 30 seeds, no early stop; outcome thresholds: 100%, transient below 0.99 for "
             ">= 3 evaluations.",
}


def preset(name: str, **overrides: Any) -> SweepConfig:
    """The ``SweepConfig`` of a named preset, with fields overridden by keyword."""
    if name not in PRESETS:
        raise ValueError(f"unknown sweep preset {name!r}; expected one of {sorted(PRESETS)}")
    return SweepConfig.from_dict({**PRESETS[name], **overrides})


def cell_configs(cfg: SweepConfig, cell: Mapping[str, Any], seed: int) -> tuple[Any, Any, Any, dict[str, Any]]:
    """``(task_cfg, model_cfg, train_cfg, run_info)`` of one run of the sweep."""
    from interp_toolkit.model import ModelConfig
    from interp_toolkit.runs.config import TrainConfig
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
        # The rule's name is part of the run key: runs stopped under the older, stricter rule
        # (both splits at 100%) are not mistaken for these.
        run_info["early_stop"] = {"rule": "generalized_paper_criterion", "threshold": cfg.threshold}
    return task_cfg, model_cfg, train_cfg, run_info


def run_dir_name(cell: Mapping[str, Any], seed: int, task_cfg: Any, model_cfg: Any, train_cfg: Any,
                 run_info: Mapping[str, Any]) -> str:
    """Readable name plus a hash of every config: distinct runs, distinct directories."""
    train = {k: v for k, v in train_cfg.to_dict().items() if k not in _HOW_NOT_WHAT}
    key = config_hash({"task": task_cfg.to_dict(), "model": model_cfg.to_dict(),
                       "train": train, "info": dict(run_info)}, 8)
    return (f"{cell['task']}_{cell['n_layers']}L{cell['n_heads']}H_r{cell['r']:g}_wd{cell['weight_decay']:g}"
            f"_s{seed}_{key}")


def plan_jobs(cfg: SweepConfig, study_dir: Path, extend_from: Sequence[str | Path] = ()) -> list[dict[str, Any]]:
    """One job per (cell, chunk of seeds): everything a worker needs, as plain data.

    Jobs run in this order: every cell's first chunk of seeds, then every cell's second, ...
    So a study stopped part-way (a sitting's budget spent) has its cells at balanced seed
    counts, each one comparable with the others, rather than some cells done and others empty.
    With ``extend_from`` (study directories), a run whose directory does not exist yet
    gets ``extend_from``: the finished run there it continues (:func:`extension_source`).
    """
    jobs = []
    chunk = cfg.seeds_per_process or len(cfg.seeds)
    for start in range(0, len(cfg.seeds), chunk):
        for cell in cfg.cells():
            seeds = cfg.seeds[start : start + chunk]
            runs = []
            for seed in seeds:
                task_cfg, model_cfg, train_cfg, info = cell_configs(cfg, cell, seed)
                name = run_dir_name(cell, seed, task_cfg, model_cfg, train_cfg, info)
                run: dict[str, Any] = {"seed": seed, "run_dir": str(study_dir / "runs" / name)}
                if extend_from and not (study_dir / "runs" / name).exists():
                    source = extension_source(extend_from, name, model_cfg, train_cfg, info, stop_rule_of(cfg, cell))
                    if source is not None:
                        run["extend_from"] = str(source)
                runs.append(run)
            jobs.append({"sweep": cfg.to_dict(), "cell": cell, "runs": runs})
    return jobs


def stop_rule_of(cfg: SweepConfig, cell: Mapping[str, Any]) -> Callable[[dict[str, Any]], bool] | None:
    """The early stop of a cell's runs: stop once generalized (the paper's criterion at
    ``cfg.threshold``) when ``cfg.early_stop``, else None."""
    from interp_toolkit.studies.outcomes import generalization_stop_rule
    from interp_toolkit.tasks.mpsp import task_modulus

    return generalization_stop_rule(cell["r"], task_modulus(cell["task"]), cfg.threshold) if cfg.early_stop else None


def _run_folders(study: str | Path) -> Path:
    study = Path(study)
    return study / "runs" if (study / "runs").is_dir() else study


def check_extend_from(paths: Sequence[str | Path]) -> list[Path]:
    """``paths`` as study directories (or folders of run directories) to extend runs from.

    Raises:
        UserError: Naming a path that is not a directory.
    """
    from interp_toolkit.errors import UserError

    out = []
    for path in paths:
        path = Path(path)
        if not path.is_dir():
            raise UserError(f"--extend-from {path}: not a directory; expected a study directory (holding runs/) "
                            f"of a sweep with fewer epochs")
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
    from interp_toolkit.errors import UserError
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


#: File in a study directory holding the outcome rows of runs taken from earlier sittings'
#: outcome tables (``run_sweep(recorded=...)``); the study's report pools it with the runs.
RECORDED_OUTCOMES = "recorded_outcomes.csv"


def read_recorded_runs(paths: Sequence[str | Path]) -> tuple[list[str], dict[str, dict[str, str]]]:
    """Finished runs listed in ``outcomes.csv`` files: ``(header, {run directory name: raw row})``.

    A sweep names a run's directory by a hash of every config (:func:`run_dir_name`), so a
    name in an earlier table is the same run wherever that table was written.

    Raises:
        UserError: a file is missing or is not an outcomes table (naming the file).
    """
    import csv

    from interp_toolkit.errors import UserError
    from interp_toolkit.studies.report import read_outcomes_csv

    header: list[str] = []
    runs: dict[str, dict[str, str]] = {}
    for path in map(Path, paths):
        if not path.is_file():
            raise UserError(f"recorded outcomes {path} is not a file; expected an outcomes.csv written by "
                            "`interp-toolkit report` or `sweep`")
        read_outcomes_csv(path)  # validates the columns and every value, naming file, line and column
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            header += [k for k in reader.fieldnames or [] if k not in header]
            for row in reader:
                if row.get("status") == "finished" and row.get("run_dir"):
                    runs[Path(row["run_dir"]).name] = row
    return header, runs


def _write_recorded(study_dir: Path, header: Sequence[str], rows: Sequence[Mapping[str, str]]) -> None:
    import csv
    import io

    from interp_toolkit.io import atomic_write_text

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(header), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(study_dir / RECORDED_OUTCOMES, buffer.getvalue())


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


class _SweepProgress:
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

    cfg = SweepConfig.from_dict(job["sweep"])
    device = resolve_device(cfg.device)
    cell = job["cell"]
    modulus = task_modulus(cell["task"])
    per_run = [cell_configs(cfg, cell, run["seed"]) for run in job["runs"]]
    todo = [i for i, run in enumerate(job["runs"]) if not (Path(run["run_dir"]) / "outcome.json").exists()]
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
            atomic_write_json(run_dir / "outcome.json", outcome)
    rows = []
    for i, run in enumerate(job["runs"]):
        if i in failed:
            rows.append({**cell, "seed": run["seed"], "run_dir": run["run_dir"], "error": failed[i]})
            continue
        outcome = json.loads((Path(run["run_dir"]) / "outcome.json").read_text())
        rows.append({**cell, "seed": run["seed"], "run_dir": run["run_dir"], **outcome})
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


def _run_local(jobs: list[dict[str, Any]], workers: int, threads: int, progress: _SweepProgress,
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

    def __init__(self, progress: _SweepProgress) -> None:
        self.progress = progress

    def put(self, item: tuple[str, str]) -> None:
        self.progress.event(*item)


def _run_ray(jobs: list[dict[str, Any]], address: str | None, progress: _SweepProgress,
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
        from ray.util.queue import Queue as RayQueue

        # A task asks for a GPU when the sweep's device is CUDA ("auto": when the cluster has one).
        wants_gpu = device.startswith("cuda") or (device == "auto" and ray.cluster_resources().get("GPU", 0) > 0)
        events = RayQueue()
        remote_job = ray.remote(num_cpus=1, num_gpus=1 if wants_gpu else 0)(run_job)
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
    """What :func:`run_sweep` returns.

    Attributes:
        study_dir: The study directory (resolved).
        rows: One outcome row per run trained or found finished here, sorted by cell and seed.
        n_cached: Runs that were finished here before this sweep started (not trained again).
        seconds: Wall time of the sweep.
        failed: Rows of runs that could not start (``error`` names the reason).
        n_recorded: Runs taken from ``recorded`` outcome tables (not trained, not in ``rows``).
    """

    study_dir: Path
    rows: list[dict[str, Any]]
    n_cached: int
    seconds: float
    failed: list[dict[str, Any]] = field(default_factory=list)
    n_recorded: int = 0


def default_study_dir(cfg: SweepConfig, root: str | Path = "runs/sweeps") -> Path:
    """Where a sweep lives when no directory is given: ``root/<name>_<study key>``.

    The study key leaves out the grid, so a sweep grown by more seeds, ratios or
    architectures lands in the study it grows and its finished runs are cache hits.
    Studies started before that kept the whole grid in their name (``root/<name>_<key>``);
    until the new directory exists, the sweep continues such a study: the one holding
    this exact sweep, else the only one holding a sweep with the same shared settings.

    Raises:
        ValueError: If several such older studies match and none holds this exact sweep
            (pass the directory to use).
    """
    root = Path(root)
    current = root / f"{cfg.name}_{cfg.study_key()}"
    if current.exists():
        return current
    exact = root / f"{cfg.name}_{cfg.key()}"
    if (exact / "study.json").is_file():
        return exact
    matches = []
    for record_path in sorted(root.glob(f"{glob.escape(cfg.name)}_*/study.json")):
        try:
            record = json.loads(record_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue  # not a study this sweep can continue; run_sweep reports unreadable records it is given
        if isinstance(record, dict) and _shared_settings_differing(record.get("config"), cfg) == []:
            matches.append(record_path.parent)
    if len(matches) > 1:
        raise ValueError(f"several study directories hold sweeps with these settings: "
                         f"{', '.join(str(m) for m in matches)}; choose one (--out, or study_dir=)")
    return matches[0] if matches else current


def _shared_settings_differing(recorded: Any, cfg: SweepConfig) -> list[str] | None:
    """Names of the non-grid settings where a study's recorded config and ``cfg`` differ
    (``None`` when the record holds no readable config)."""
    if not isinstance(recorded, dict):
        return None
    ignored = set(GRID_FIELDS) | set(OUTCOME_ONLY_FIELDS) | set(_NOT_IN_KEY)
    ours = json.loads(json.dumps(cfg.to_dict()))  # tuples as lists, as the record stores them
    return sorted(k for k in set(ours) | set(recorded) if k not in ignored and ours.get(k) != recorded.get(k))


#: GRID_FIELDS that list values: a study's whole grid is their union over its sittings.
_LISTED_GRID_FIELDS = tuple(name for name in GRID_FIELDS if name != "seeds_per_process")


def _grid_of(cfg_dict: Mapping[str, Any]) -> dict[str, list]:
    return {name: list(cfg_dict.get(name) or []) for name in _LISTED_GRID_FIELDS}


def _recorded_grid(record: Mapping[str, Any]) -> dict[str, list]:
    """A study record's whole grid (a record older than ``grid`` knows only its config's)."""
    grid = record.get("grid")
    return grid if isinstance(grid, dict) else _grid_of(record.get("config") or {})


def _merged_grid(earlier: Mapping[str, Any], ours: Mapping[str, list]) -> dict[str, list]:
    """``earlier``'s grid grown by the values of ``ours`` it lacks, field by field (earlier first)."""
    merged = {}
    for name in _LISTED_GRID_FIELDS:
        values = list(earlier.get(name) or [])
        values += [value for value in ours[name] if value not in values]
        merged[name] = sorted(values) if name == "seeds" else values
    return merged


def read_study_record(study_dir: str | Path) -> dict[str, Any]:
    """A study directory's ``study.json``, checked to hold a sweep config.

    Raises:
        UserError: There is none, or it is unreadable or holds no readable config (naming
            the file and what was expected).
    """
    from interp_toolkit.errors import UserError

    study_path = Path(study_dir) / "study.json"
    if not study_path.is_file():
        raise UserError(f"{study_dir} is not a study directory: it has no study.json (a sweep writes one when "
                        "it starts)")
    try:
        record = json.loads(study_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"study record {study_path} is unreadable ({err})") from err
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
        raise UserError(f"study record {study_path} holds no sweep config; expected the JSON object a sweep "
                        "writes, with a 'config' entry")
    return record


def study_sweep(study_dir: str | Path) -> dict[str, Any]:
    """The sweep a study directory holds, for resuming or growing it with nothing else at hand.

    A study spread over sittings may have run a few seeds or cells at a time; its
    ``study.json`` keeps the union of their grids and each sitting's ``--extend-from`` and
    ``--recorded`` paths. (A study last run before these were recorded knows only its last
    sitting's grid and none of its paths.)

    Returns:
        ``{"config": SweepConfig, "extend_from": [Path], "recorded": [Path]}``: the latest
        sitting's settings over the study's whole grid (``seeds_per_process`` as last run),
        and every path the sittings extended from or took recorded outcomes from, in order.

    Raises:
        UserError: No readable study record, or a config in it that is not a valid
            ``SweepConfig`` (naming the file and the setting).
    """
    from interp_toolkit.errors import UserError

    record = read_study_record(study_dir)
    grid = _recorded_grid(record)
    data = {**record["config"], **{name: grid[name] for name in _LISTED_GRID_FIELDS if grid.get(name)}}
    try:
        cfg = SweepConfig.from_dict(data)
    except (TypeError, ValueError) as err:
        raise UserError(f"study record {Path(study_dir) / 'study.json'}: {err}") from err
    paths: dict[str, list[Path]] = {"extend_from": [], "recorded": []}
    for sitting in record.get("sittings") or []:
        for key, found in paths.items():
            found += [Path(p) for p in (sitting.get(key) or []) if Path(p) not in found]
    return {"config": cfg, **paths}


def _study_record(cfg: SweepConfig, study_dir: Path, extend_from: Sequence[Path],
                  recorded: Sequence[str | Path]) -> dict[str, Any]:
    """``study.json`` after this sitting: ``cfg`` as the latest config, the grid grown by its
    values, and this sitting appended to the earlier ones."""
    import socket
    from datetime import datetime, timezone

    earlier: dict[str, Any] = {}
    study_path = study_dir / "study.json"
    if study_path.is_file():  # check_study_dir has read it: the same sweep but for its grid
        earlier = json.loads(study_path.read_text(encoding="utf-8"))
    ours = _grid_of(json.loads(json.dumps(cfg.to_dict())))  # tuples as lists, as the record stores them
    sitting = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": socket.gethostname(),
               "grid": ours,
               "extend_from": [str(Path(p).resolve()) for p in extend_from],
               "recorded": [str(Path(p).resolve()) for p in recorded]}
    return {"key": cfg.key(), "config": cfg.to_dict(), "format": 1,
            "outcome_thresholds": cfg.outcome_thresholds().to_dict(),
            "grid": _merged_grid(_recorded_grid(earlier), ours), "sittings": [*(earlier.get("sittings") or []), sitting]}


def check_study_dir(cfg: SweepConfig, study_dir: str | Path) -> None:
    """Refuse a study directory that holds another sweep (any shared setting differs).

    Raises:
        UserError: Its ``study.json`` is unreadable.
        ValueError: It holds a sweep whose settings outside ``GRID_FIELDS`` differ (naming them).
    """
    from interp_toolkit.errors import UserError

    study_path = Path(study_dir) / "study.json"
    if not study_path.exists():
        return
    try:
        existing = json.loads(study_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"study record {study_path} is unreadable ({err}); choose another directory") from err
    if existing.get("key") != cfg.key():
        differing = _shared_settings_differing(existing.get("config"), cfg)
        if differing is None or differing:
            detail = (f"settings that differ: {', '.join(differing)}" if differing
                      else f"key {existing.get('key')}, this sweep's key {cfg.key()}")
            raise ValueError(
                f"study directory {study_dir} holds a different sweep ({detail}); choose another "
                f"directory (a sweep may differ from a study's only in its grid: {', '.join(GRID_FIELDS)})"
            )


def _run_status(run: Mapping[str, Any], recorded_runs: Mapping[str, Any]) -> str:
    """``"finished"`` (its outcome is here), ``"recorded"`` (an earlier sitting's table lists it
    as finished), ``"resume"`` (started here), ``"extend"`` (continues a shorter run) or
    ``"new"``: what a sweep does with the run (an entry of a job's ``runs``)."""
    run_dir = Path(run["run_dir"])
    if (run_dir / "outcome.json").exists():
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
    evaluations = read_jsonl(run_dir / "metrics.jsonl")  # a line being appended now is left out
    last = evaluations[-1] if evaluations else {}
    outcome = None
    try:
        outcome = json.loads((run_dir / "outcome.json").read_text())
    except (OSError, ValueError):
        pass
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

    Also where a study spread over sittings stands: which process is running it now, and
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
                entry.update(run_progress(entry["run_dir"], cfg.epochs))
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
        progress: Show a tqdm bar over every run's evaluations (it advances per
            evaluation; a run that ends early fills its remaining ones).
        report: Write the report (table, plots) into ``study_dir`` at the end.
        callbacks: :class:`interp_toolkit.callbacks.Callback` objects given to every run's
            trainer, e.g. ``[TensorBoardLogger()]`` (``tensorboard --logdir STUDY_DIR`` then
            shows every run). Process-pool and Ray workers get pickled copies.
        recorded: Outcome tables of earlier sittings (``outcomes.csv`` of ``report``, e.g.
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

    Returns:
        A :class:`SweepResult` with one outcome row per run trained or found here, sorted
        by cell and seed (``n_recorded``: runs taken from ``recorded``).
    """
    if not isinstance(cfg, SweepConfig):
        raise TypeError(f"run_sweep expects a SweepConfig, got {type(cfg).__name__}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be a positive integer or None, got {workers!r}")
    if log_every is not None and (isinstance(log_every, bool) or not isinstance(log_every, (int, float))
                                  or not log_every > 0):
        raise ValueError(f"log_every must be a positive number of seconds or None, got {log_every!r}")
    study_dir = Path(study_dir) if study_dir is not None else default_study_dir(cfg)
    study_dir = study_dir.resolve()
    recorded_table = read_recorded_runs(recorded) if recorded else ([], {})
    extend_from = check_extend_from(extend_from)
    from interp_toolkit.runs.lock import DirectoryLock

    with DirectoryLock(study_dir, "study directory"):
        return _run_sweep_locked(cfg, study_dir, backend, workers, address, progress, report, callbacks,
                                 recorded_table, log_every, extend_from, recorded)


def _run_sweep_locked(cfg: SweepConfig, study_dir: Path, backend: str, workers: int | None,
                      address: str | None, progress: bool, report: bool,
                      callbacks: Sequence[Any] | None,
                      recorded_table: tuple[list[str], dict[str, dict[str, str]]] = ([], {}),
                      log_every: float | None = None, extend_from: Sequence[Path] = (),
                      recorded: Sequence[str | Path] = ()) -> SweepResult:
    """:func:`run_sweep` once ``study_dir`` is locked by this process."""
    check_study_dir(cfg, study_dir)
    atomic_write_json(study_dir / "study.json", _study_record(cfg, study_dir, extend_from, recorded))

    started = time.perf_counter()
    (study_dir / "runs").mkdir(parents=True, exist_ok=True)  # a study directory, even if all is recorded
    jobs = plan_jobs(cfg, study_dir, extend_from)
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
            _write_recorded(study_dir, header, taken)
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
    bar = tqdm(total=cfg.n_runs() * evaluations, initial=(n_cached + n_recorded) * evaluations, unit="eval",
               desc=f"sweep {cfg.name} [{backend}]", disable=not progress, file=sys.stderr)
    to_train = [{**job, "runs": [run for run in job["runs"] if run["run_dir"] not in finished]} for job in todo]
    tracker = _SweepProgress(bar, to_train, cfg.n_runs(), n_cached + n_recorded, log_every=log_every, name=cfg.name,
                             initial=(n_cached + n_recorded) * evaluations)
    if todo:
        if backend == "ray":
            rows.extend(_run_ray(todo, address, tracker, callbacks, cfg.device))
        else:
            from interp_toolkit.devices import resolve_device

            # One job per GPU at a time (it holds every seed of its cell); on CPUs one process
            # per core, each on 1 torch thread (small per-op work: threads only add contention).
            on_gpu = resolve_device(cfg.device).type == "cuda"
            n_workers = min(workers or (1 if on_gpu else os.cpu_count() or 1), len(todo))
            rows.extend(_run_local(todo, n_workers, 1, tracker, callbacks))
        tracker.maybe_log(force=True)
    bar.close()
    failed = [row for row in rows if "error" in row]
    rows = [row for row in rows if "error" not in row]
    rows.sort(key=lambda row: (row["task"], row["n_layers"], row["n_heads"], row["weight_decay"],
                               row["r"], row["seed"]))
    if report:
        from interp_toolkit.studies.report import write_report

        write_report(study_dir, print_table=False)
    return SweepResult(study_dir, rows, n_cached, time.perf_counter() - started, failed, n_recorded)


def run_job_cached(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Outcome rows of a job whose runs are all finished (no torch import)."""
    rows = []
    for run in job["runs"]:
        outcome = json.loads((Path(run["run_dir"]) / "outcome.json").read_text())
        rows.append({**job["cell"], "seed": run["seed"], "run_dir": run["run_dir"], **outcome})
    return rows


__all__ = ["BACKENDS", "CHANCE", "GRID_FIELDS", "OUTCOME_ONLY_FIELDS", "PRESETS", "PRESET_NOTES", "RECORDED_OUTCOMES", "SweepConfig",
           "SweepResult", "cell_configs", "check_study_dir", "check_extend_from", "default_study_dir", "extension_source", "plan_sweep", "plan_jobs", "preset", "read_recorded_runs", "read_study_record", "run_job", "run_progress", "run_sweep",
           "stop_rule_of", "study_sweep"]
