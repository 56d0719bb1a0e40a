"""A study directory: its files, the study record, run collection and outcome tables.

A study directory holds::

    STUDY_DIR/
      study.json        the latest SweepConfig, its key and the outcome_thresholds every
                        outcome of the study is scored with; a sweep whose shared settings
                        differ is refused here (one that only grows the grid is welcome);
                        the study's whole grid (the union of every invocation's) and one entry
                        per invocation (when, where, its grid, --extend-from, --recorded), so the
                        directory alone resumes the study (study_sweep, ``sweep --out DIR``)
      runs/<task>_<L>L<H>H_r<r>_wd<wd>_s<seed>_<hash>/
          the run's files (interp_toolkit.runs.layout) and outcome.json, its outcome record
      recorded_outcomes.csv   runs taken from earlier invocations' outcome tables
      outcomes.csv, table.csv, table.md, contrasts.csv, generalization_rate.png,
      curves_by_cell.png   (the report: interp_toolkit.studies.report.write)

This module is the only one that names these files and reads or writes ``study.json``,
``outcome.json`` (the rows of outcome tables: interp_toolkit.studies.grid.outcome_table). A run of a study directory is
any ``runs/*/``
directory with ``run.json`` and ``metrics.jsonl``; :func:`collect_runs` derives its outcome
from ``metrics.jsonl`` with the study's ``outcome_thresholds`` every time and rewrites
``outcome.json`` as a cache, so old study directories are re-scored under the current
definitions without retraining. Rows of an ``outcomes.csv`` are taken as recorded.
"""

from __future__ import annotations

import csv
import glob
import json
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence, overload

from interp_toolkit.errors import UserError, notice
from interp_toolkit.io import atomic_write_json, atomic_write_text
from interp_toolkit.runs.metrics import read_run_metrics
from interp_toolkit.runs.record import has_record, read_record, task_dict
from interp_toolkit.studies.common.near_miss import NEAR_MISS_FIELDS
from interp_toolkit.studies.common.outcomes import (
    OUTCOME_FIELDS,
    OutcomeThresholds,
    compute_outcome,
)
from interp_toolkit.studies.grid.cells import (
    TIED_DATA_SEED,
    run_settings,
)
from interp_toolkit.studies.grid.config import (
    GRID_FIELDS,
    NOT_IN_KEY,
    OUTCOME_ONLY_FIELDS,
    SweepConfig,
)
from interp_toolkit.studies.grid.outcome_table import (
    RUN_FIELDS,
    merge_runs,
    read_outcomes_csv,
    run_clock,
    run_fields,
)

#: The study record: the latest sweep config, its key, the outcome thresholds, the whole grid
#: and one entry per invocation (see :func:`new_study_record`).
STUDY_RECORD = "study.json"
#: Folder of a study's run directories.
RUNS = "runs"
#: A finished run's outcome record, in its run directory (a cache: ``report`` rewrites it).
OUTCOME = "outcome.json"
#: One row per run: its settings, seed, status and outcome (``report`` regenerates every table from it).
OUTCOMES_CSV = "outcomes.csv"
#: Outcome rows of runs taken from earlier invocations' outcome tables (``run_sweep(recorded=...)``);
#: the study's report pools it with the runs.
RECORDED_OUTCOMES = "recorded_outcomes.csv"
#: Report outputs: the rate table (CSV and markdown), contrasts, the comparison with published
#: rates, and the figures' stems (their suffix is the figure format).
TABLE_CSV = "table.csv"
TABLE_MD = "table.md"
CONTRASTS_CSV = "contrasts.csv"
PAPER_COMPARISON_CSV = "paper_comparison.csv"
RATE_FIGURE = "generalization_rate"
CURVES_FIGURE = "curves_by_cell"
#: The report's clock table and figure (``report --clock``): rates against decay clocks.
CLOCK_CSV = "rate_vs_clock.csv"
CLOCK_FIGURE = "rate_vs_clock"


def _parse_study_json(path: Path) -> Any:
    """The JSON of a study record: the one place that parses ``study.json`` (the callers say
    what a missing or malformed one means for them)."""
    return json.loads(path.read_text(encoding="utf-8"))


def study_record_path(study_dir: str | Path) -> Path:
    """Where a study directory's record lives."""
    return Path(study_dir) / STUDY_RECORD


def runs_dir(study_dir: str | Path) -> Path:
    """The folder of a study directory's runs."""
    return Path(study_dir) / RUNS


def is_study_dir(path: str | Path) -> bool:
    """Whether ``path`` is a study directory (a folder holding ``runs/``)."""
    return runs_dir(path).is_dir()


def outcome_path(run_dir: str | Path) -> Path:
    """Where a run's outcome record lives."""
    return Path(run_dir) / OUTCOME


def has_outcome(run_dir: str | Path) -> bool:
    """Whether a run has its outcome record (a sweep reads it as "this run is done")."""
    return outcome_path(run_dir).exists()


@overload
def read_outcome(run_dir: str | Path, missing_ok: Literal[False] = False) -> dict[str, Any]: ...
@overload
def read_outcome(run_dir: str | Path, missing_ok: bool) -> dict[str, Any] | None: ...
def read_outcome(run_dir: str | Path, missing_ok: bool = False) -> dict[str, Any] | None:
    """A run's outcome record; with ``missing_ok``, None when it is absent or unreadable.

    Raises:
        FileNotFoundError: It is absent (without ``missing_ok``).
        UserError: It is not UTF-8 JSON holding an object (naming the file; without
            ``missing_ok``). ``report`` recomputes such a record from ``metrics.jsonl``.
    """
    path = outcome_path(run_dir)
    try:
        outcome = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if missing_ok:
            return None
        raise
    except (OSError, ValueError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        if missing_ok:
            return None
        raise UserError(f"outcome record {path} is unreadable ({err}); `interp-toolkit report` on its study "
                        "recomputes it from metrics.jsonl") from err
    if not isinstance(outcome, dict):
        if missing_ok:
            return None
        raise UserError(f"outcome record {path} must hold a JSON object, got {type(outcome).__name__}; "
                        "`interp-toolkit report` on its study recomputes it from metrics.jsonl")
    return outcome


def write_outcome(run_dir: str | Path, outcome: Mapping[str, Any]) -> None:
    """Write a run's outcome record (atomically)."""
    atomic_write_json(outcome_path(run_dir), dict(outcome))


#: Written by a sweep into a run whose job failed (its worker raised or died past its
#: retries): the report calls the run "failed", not "training"; removed when a sweep starts
#: the run again.
FAILURE = "failure.json"


def write_failure(run_dir: str | Path, error: str) -> None:
    """Record (atomically) that a sweep's job failed this run, with the error."""
    if Path(run_dir).is_dir():
        atomic_write_json(Path(run_dir) / FAILURE, {"status": "failed", "error": str(error)})


def clear_failure(run_dir: str | Path) -> None:
    """Forget a recorded failure (the run is being trained again)."""
    (Path(run_dir) / FAILURE).unlink(missing_ok=True)


def run_status(run_dir: str | Path, record: Mapping[str, Any]) -> str | None:
    """A run's status for a report: its record's, or ``"failed"`` for a run recorded
    running whose sweep job failed (:data:`FAILURE`)."""
    status = record.get("status")
    if status == "running" and (Path(run_dir) / FAILURE).is_file():
        return "failed"
    return status


def report_paths(out_dir: str | Path, figure_format: str = "png") -> dict[str, Path]:
    """Every file a report writes into ``out_dir`` (``outcomes_csv``, ``table_csv``, ``table_md``,
    ``contrasts_csv``, ``paper_csv``, ``rate_png``, ``curves_png``, ``clock_csv``, ``clock_png``; the
    figures in ``figure_format``)."""
    out = Path(out_dir)
    return {"outcomes_csv": out / OUTCOMES_CSV, "table_csv": out / TABLE_CSV, "table_md": out / TABLE_MD,
            "contrasts_csv": out / CONTRASTS_CSV, "rate_png": out / f"{RATE_FIGURE}.{figure_format}",
            "curves_png": out / f"{CURVES_FIGURE}.{figure_format}", "paper_csv": out / PAPER_COMPARISON_CSV,
            "clock_csv": out / CLOCK_CSV, "clock_png": out / f"{CLOCK_FIGURE}.{figure_format}"}


#: Carried over from an existing outcome.json when it is rewritten (training facts, not outcomes).
_CACHE_EXTRA_KEYS = ("resumed_from", "stopped_early_at")


def read_study_record_or_empty(study_dir: str | Path) -> dict[str, Any]:
    """``study.json`` of a study directory as a dict (empty when there is none).

    Raises:
        UserError: It is not UTF-8 JSON holding an object (naming the file).
    """
    study_path = study_record_path(study_dir)
    if not study_path.exists():
        return {}
    try:
        record = _parse_study_json(study_path)
    except (OSError, ValueError, UserError) as err:
        raise UserError(f"study record {study_path} is unreadable ({err}); expected the JSON object a sweep "
                        "writes") from err
    if not isinstance(record, dict):
        raise UserError(f"study record {study_path} holds {type(record).__name__}, not the JSON object a sweep "
                        "writes")
    return record


def read_study_name(study_dir: str | Path) -> str | None:
    """The study's name (``SweepConfig.name`` in ``study.json``), ``None`` without one."""
    return (read_study_record_or_empty(study_dir).get("config") or {}).get("name")


def read_data_seeds(study_dir: str | Path) -> str:
    """The study's ``SweepConfig.data_seeds`` (``"fixed"`` when its record has none)."""
    return str((read_study_record_or_empty(study_dir).get("config") or {}).get("data_seeds") or "fixed")


def read_thresholds(study_dir: str | Path) -> OutcomeThresholds:
    """The study's outcome thresholds: ``study.json``'s ``outcome_thresholds`` if recorded,
    else its config's ``threshold`` (older studies), else the defaults."""
    study = read_study_record_or_empty(study_dir)
    if "outcome_thresholds" in study:
        return OutcomeThresholds.from_dict(study["outcome_thresholds"])
    return OutcomeThresholds.from_dict(study.get("config", {}))


def _task_modulus(task: Mapping[str, Any], run_dir: Path) -> int:
    from interp_toolkit.tasks.mpsp import LABELS, task_modulus

    if task.get("label") in LABELS:
        return LABELS[task["label"]]
    if "name" in task:
        return task_modulus(task["name"])
    raise UserError(f"run {run_dir} records neither a task name nor a label in run.json run_info.task")


def run_near_miss(run_dir: Path, outcome: Mapping[str, Any], status: Any,
                  thresholds: OutcomeThresholds) -> dict[str, Any]:
    """A run's :data:`~interp_toolkit.studies.common.near_miss.NEAR_MISS_FIELDS`, beside the paper's
    criterion (which they leave unchanged).

    Only for finished runs judged on the adversarial split (r > 1/m: the paper's criterion);
    others get None everywhere (a run still training has no best yet; below or at chance the
    criterion is not the adversarial split's). A generalized run's values come from its
    outcome (nothing wrong at its best); a run that is not generalized is read by
    :func:`~interp_toolkit.studies.common.near_miss.near_miss_of_run`, which evaluates one
    checkpoint when the run is within 5 points of the criterion, cached in
    ``RUN/analyses/near_miss_at_best/``.
    """
    from interp_toolkit.runs.record import FINISHED

    empty: dict[str, Any] = dict.fromkeys(NEAR_MISS_FIELDS)
    if status not in FINISHED or outcome.get("generalization_split") != "adv":
        return empty
    if outcome.get("generalized"):
        return {**empty, "best_adv_acc": outcome.get("max_adv_acc"), "n_adv_wrong_at_best": 0,
                "within_1pct": False}
    from interp_toolkit.studies.common.near_miss import near_miss_of_run

    values = near_miss_of_run(run_dir, split="adv", threshold=thresholds.threshold).fields()
    return {**values, "near_miss_groups": values["near_miss_groups"] or None}


def collect_runs(study_dir: str | Path, thresholds: OutcomeThresholds | None = None,
                 rewrite_cache: bool = True) -> list[dict[str, Any]]:
    """One row per run directory under ``study_dir/runs``: settings, seed, outcome.

    The outcome is derived from the run's ``metrics.jsonl`` every time (never read from
    ``outcome.json``, which is rewritten as a cache when ``rewrite_cache``). Each row holds
    :data:`RUN_FIELDS` plus ``source`` (the study directory) and ``has_metrics`` (True):
    its clock over the epochs it trained (:func:`run_clock`) and its near-miss view
    (:func:`run_near_miss`; in ``outcome.json`` too).

    Args:
        study_dir: The study directory.
        thresholds: Outcome settings (default: :func:`read_thresholds` of the study).
        rewrite_cache: Rewrite each finished run's ``outcome.json`` when its content changed
            (unfinished runs never get one: a sweep reads it as "this run is done").
    """
    study_dir = Path(study_dir)
    runs_root = runs_dir(study_dir)
    if not runs_root.is_dir():
        raise UserError(f"{study_dir} is not a study directory (no runs/ folder inside)")
    thresholds = read_thresholds(study_dir) if thresholds is None else thresholds
    study_name = read_study_name(study_dir)
    tied = read_data_seeds(study_dir) == "model"
    rows = []
    for run_dir in sorted(p for p in runs_root.iterdir() if p.is_dir()):
        if not has_record(run_dir):
            continue
        record = read_record(run_dir)
        task = task_dict(record) or {}
        if "r" not in task:
            raise UserError(f"run {run_dir} has no task ratio r in run.json run_info.task")
        metrics = read_run_metrics(run_dir)
        if not metrics:
            continue
        outcome = compute_outcome(metrics, float(task["r"]), _task_modulus(task, run_dir), thresholds)
        outcome = {**outcome, **run_near_miss(run_dir, outcome, record.get("status"), thresholds)}
        # Only finished runs get a cache: a sweep takes outcome.json as "this run is done".
        if rewrite_cache and record.get("status") == "finished":
            cached = read_outcome(run_dir, missing_ok=True) or {}
            if not cached and has_outcome(run_dir):  # a cache: rewritten from the metrics below
                notice(f"{outcome_path(run_dir)} was unreadable (not a JSON object); recomputed it from "
                       "metrics.jsonl")
            fresh = {**outcome, **{k: cached[k] for k in _CACHE_EXTRA_KEYS if k in cached}}
            if fresh != cached:
                write_outcome(run_dir, fresh)
        settings = run_settings(record, thresholds)
        if tied and settings.get("data_seed") == settings.get("seed"):
            # each run's data seed is its model seed: a seed of the cell, not a setting of it
            settings["data_seed"] = TIED_DATA_SEED
        row = {
            **settings, "study": study_name, "status": run_status(run_dir, record),
            "run_dir": str(run_dir),
            **{k: outcome.get(k) for k in OUTCOME_FIELDS + NEAR_MISS_FIELDS}, "source": str(study_dir),
            "has_metrics": True,
        }
        rows.append({**row, **run_clock(row)})
    return rows


def source_kind(path: str | Path) -> str:
    """``"study"`` for a study directory, ``"csv"`` for an outcomes CSV file.

    Raises:
        UserError: the path does not exist or is neither.
    """
    path = Path(path)
    expected = "expected a study directory written by `sweep` or an outcomes.csv file"
    if not path.exists():
        raise UserError(f"report source {path} does not exist; {expected}")
    if path.is_dir():
        if is_study_dir(path):
            return "study"
        what = ("a train run directory (it holds run.json)" if has_record(path)
                else "a directory with no runs/ folder inside")
        raise UserError(f"report source {path} is {what}, not a study directory; {expected} (a report "
                        "folder's outcomes.csv is one)")
    if not path.is_file():
        raise UserError(f"report source {path} is not a regular file (a device, pipe or socket); {expected}")
    if path.suffix.lower() == ".csv":
        return "csv"
    raise UserError(f"report source {path} is neither a study directory nor a .csv file of run outcomes; "
                    f"{expected}")


def read_recorded_runs(paths: Sequence[str | Path]) -> tuple[list[str], dict[str, dict[str, str]]]:
    """Finished runs listed in ``outcomes.csv`` files: ``(header, {run directory name: raw row})``.

    A sweep names a run's directory by a hash of every config (:func:`run_dir_name`), so a
    name in an earlier table is the same run wherever that table was written.

    Raises:
        UserError: a file is missing or is not an outcomes table (naming the file).
    """
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


def write_recorded(study_dir: Path, header: Sequence[str], rows: Sequence[Mapping[str, str]]) -> None:
    """Write the rows of runs taken from earlier tables into ``study_dir``'s :data:`RECORDED_OUTCOMES`."""
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(header), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(study_dir / RECORDED_OUTCOMES, buffer.getvalue())


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
    if study_record_path(exact).is_file():
        return exact
    matches = []
    for record_path in sorted(root.glob(f"{glob.escape(cfg.name)}_*/{STUDY_RECORD}")):
        try:
            record = _parse_study_json(record_path)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue  # not a study this sweep can continue; run_sweep reports unreadable records it is given
        if isinstance(record, dict) and shared_settings_differing(record.get("config"), cfg) == []:
            matches.append(record_path.parent)
    if len(matches) > 1:
        raise UserError(f"several study directories hold sweeps with these settings: "
                         f"{', '.join(str(m) for m in matches)}; choose one (--out, or study_dir=)")
    return matches[0] if matches else current


def shared_settings_differing(recorded: Any, cfg: SweepConfig) -> list[str] | None:
    """Names of the non-grid settings where a study's recorded config and ``cfg`` differ
    (``None`` when the record holds no readable config)."""
    if not isinstance(recorded, dict):
        return None
    ignored = set(GRID_FIELDS) | set(OUTCOME_ONLY_FIELDS) | set(NOT_IN_KEY)
    ours = json.loads(json.dumps(cfg.flat_dict()))  # tuples as lists, as the record stores them
    try:  # a record of any version (flat names or sections) in the same vocabulary as ours
        recorded = json.loads(json.dumps(type(cfg).from_dict(recorded).flat_dict()))
    except (TypeError, ValueError, UserError):  # UserError included: compare the record as written
        pass
    return sorted(k for k in set(ours) | set(recorded) if k not in ignored and ours.get(k) != recorded.get(k))


#: GRID_FIELDS that list values: a study's whole grid is their union over its invocations.
_LISTED_GRID_FIELDS = tuple(name for name in GRID_FIELDS if name not in ("seeds_per_process", "grid"))


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
    study_path = study_record_path(study_dir)
    if not study_path.is_file():
        raise UserError(f"{study_dir} is not a study directory: it has no {STUDY_RECORD} (a sweep writes one when "
                        "it starts)")
    try:
        record = _parse_study_json(study_path)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"study record {study_path} is unreadable ({err})") from err
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
        raise UserError(f"study record {study_path} holds no sweep config; expected the JSON object a sweep "
                        "writes, with a 'config' entry")
    return record


def study_sweep(study_dir: str | Path) -> dict[str, Any]:
    """The sweep a study directory holds, for resuming or growing it with nothing else at hand.

    A study spread over several invocations may have run a few seeds or cells at a time; its
    ``study.json`` keeps the union of their grids and each invocation's ``--extend-from`` and
    ``--recorded`` paths. (A study last run before these were recorded knows only its last
    invocation's grid and none of its paths.)

    Returns:
        ``{"config": SweepConfig, "extend_from": [Path], "recorded": [Path]}``: the latest
        invocation's settings over the study's whole grid (``seeds_per_process`` as last run),
        and every path the invocations extended from or took recorded outcomes from, in order.

    Raises:
        UserError: No readable study record, or a config in it that is not a valid
            ``SweepConfig`` (naming the file and the setting).
    """
    record = read_study_record(study_dir)
    grid = _recorded_grid(record)
    data = {**record["config"], **{name: grid[name] for name in _LISTED_GRID_FIELDS if grid.get(name)}}
    try:
        cfg = SweepConfig.from_dict(data)
    except (TypeError, ValueError, UserError) as err:
        raise UserError(f"study record {study_record_path(study_dir)}: {err}") from err
    paths: dict[str, list[Path]] = {"extend_from": [], "recorded": []}
    for invocation in invocations_of(record):
        for key, found in paths.items():
            found += [Path(p) for p in (invocation.get(key) or []) if Path(p) not in found]
    return {"config": cfg, **paths}


def new_study_record(cfg: SweepConfig, study_dir: Path, extend_from: Sequence[Path],
                  recorded: Sequence[str | Path]) -> dict[str, Any]:
    """``study.json`` after this invocation: ``cfg`` as the latest config, the grid grown by its
    values, and this invocation appended to the earlier ones."""
    import socket
    from datetime import datetime, timezone

    earlier: dict[str, Any] = {}
    study_path = study_record_path(study_dir)
    if study_path.is_file():  # check_study_dir has read it: the same sweep but for its grid
        earlier = _parse_study_json(study_path)
    ours = _grid_of(json.loads(json.dumps(cfg.to_dict())))  # tuples as lists, as the record stores them
    invocation = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": socket.gethostname(),
               "grid": ours,
               "extend_from": [str(Path(p).resolve()) for p in extend_from],
               "recorded": [str(Path(p).resolve()) for p in recorded]}
    return {"key": cfg.key(), "config": cfg.to_dict(), "format": 1,
            "outcome_thresholds": cfg.outcome_thresholds().to_dict(),
            "grid": _merged_grid(_recorded_grid(earlier), ours), "invocations": [*invocations_of(earlier), invocation]}


def invocations_of(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A study record's ``sweep`` invocations, in order."""
    return list(record.get("invocations") or [])


def check_study_dir(cfg: SweepConfig, study_dir: str | Path) -> None:
    """Refuse a study directory that holds another sweep (any shared setting differs).

    Raises:
        UserError: It is a train run directory (it holds ``run.json``), or its ``study.json``
            is unreadable or not a JSON object.
        ValueError: It holds a sweep whose settings outside ``GRID_FIELDS`` differ (naming them).
    """
    if has_record(study_dir):  # a sweep would write its study among the run's own files
        raise UserError(f"{study_dir} is a train run directory (it holds run.json); expected a study directory "
                        "(a new one, or one written by `sweep`)")
    study_path = study_record_path(study_dir)
    if not study_path.exists():
        return
    try:
        existing = _parse_study_json(study_path)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"study record {study_path} is unreadable ({err}); choose another directory") from err
    if not isinstance(existing, dict):
        raise UserError(f"study record {study_path} holds {type(existing).__name__}, not the JSON object a "
                        "sweep writes; choose another directory")
    if existing.get("key") != cfg.key():
        differing = shared_settings_differing(existing.get("config"), cfg)
        if differing is None or differing:
            detail = (f"settings that differ: {', '.join(differing)}" if differing
                      else f"key {existing.get('key')}, this sweep's key {cfg.key()}")
            raise UserError(
                f"study directory {study_dir} holds a different sweep ({detail}); choose another "
                f"directory (a sweep may differ from a study's only in its grid: {', '.join(GRID_FIELDS)})"
            )


__all__ = ["CONTRASTS_CSV", "CURVES_FIGURE", "OUTCOME", "OUTCOMES_CSV", "PAPER_COMPARISON_CSV",
           "RATE_FIGURE", "RECORDED_OUTCOMES", "RUNS", "RUN_FIELDS", "STUDY_RECORD", "TABLE_CSV",
           "TABLE_MD", "check_study_dir", "collect_runs", "default_study_dir", "has_outcome",
           "is_study_dir", "merge_runs", "new_study_record", "outcome_path", "read_outcome",
           "read_outcomes_csv", "read_recorded_runs", "read_study_name", "read_study_record",
           "read_study_record_or_empty", "read_thresholds", "report_paths", "run_clock", "run_fields",
           "run_near_miss",
           "runs_dir", "shared_settings_differing", "source_kind", "study_record_path",
           "study_sweep", "write_outcome", "write_recorded"]
