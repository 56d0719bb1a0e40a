"""Campaigns: a sweep too long for one machine's stretch of time, carried across machines.

A campaign is a sweep (:func:`~interp_toolkit.studies.sweep.run.run_sweep`) run in sessions:
``interp-toolkit sweep --config X.yaml --state DIR --budget 2h30m``. Each session

1. **restores** every run the grid names from the compact state folder ``DIR`` into the study
   directory, where the study directory lacks it or holds less of it (a fresh machine, a fresh
   clone: the study directory is a scratch copy, ``DIR`` is what survives);
2. trains until the budget is spent or SIGTERM arrives, then **pauses** every run at the end of its
   epoch in flight (:mod:`interp_toolkit.runs.pause`: each saves its exact resume state there);
   jobs not yet started then do not start;
3. **saves** every run's state into ``DIR`` (each file replaced atomically, only when its bytes
   changed) and appends the session to ``DIR/campaign.json`` (wall time, workers, seed-epochs
   trained: what the status projects the cost left from).

A run's state in ``DIR`` is what continuing it exactly needs, and nothing that can be rebuilt:
``run.json``, ``metrics.jsonl``, its checkpoints, and its resume state while it trains (a
finished run keeps its ``outcome.json`` instead; the final state, needed only to extend it to a
longer horizon, is left in the study directory). So a session continues every run
where the last one stopped, on this machine or another, and the runs end byte-identical to
uninterrupted ones (``metrics.jsonl`` and checkpoints; ``tests/studies/test_campaign.py``).

:func:`campaign_status` says where each run stands (epochs done, best adversarial accuracy so far,
the evaluation it met the criterion at, core-hours left at the measured rate), from ``DIR`` alone.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from interp_toolkit.errors import UserError
from interp_toolkit.io import atomic_write_bytes, atomic_write_json
from interp_toolkit.runs import pause
from interp_toolkit.runs.layout import CHECKPOINTS, METRICS, RECORD, RESUME_STATE
from interp_toolkit.studies.grid.config import SweepConfig
from interp_toolkit.studies.grid.study import OUTCOME

#: The campaign's log of sessions, in the state folder.
CAMPAIGN_LOG = "campaign.json"
#: The status table the last session (or ``--status``) wrote, in the state folder.
STATUS_MD = "status.md"
#: The flag a campaign's driver sets on SIGTERM (in the study directory): its workers pause too.
PAUSE_FLAG = ".pause"
_KEPT = (RECORD, METRICS, RESUME_STATE, OUTCOME)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``"2h30m"``, ``"90m"``, ``"45s"``, ``"1.5h"`` or plain seconds (``"600"``) -> seconds."""
    value = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return float(value)
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhd])", value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise UserError(f"budget {text!r} is not a duration; expected e.g. 2h30m, 90m, 45s or a number of seconds")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def _run_files(run_dir: Path, finished: bool) -> dict[str, Path]:
    """``{relative name: path}`` of what a run's state keeps (:mod:`module docs <.campaign>`)."""
    files = {name: run_dir / name for name in _KEPT if (run_dir / name).is_file()}
    if finished:
        files.pop(RESUME_STATE, None)
    else:
        files.pop(OUTCOME, None)
    for ckpt in sorted((run_dir / CHECKPOINTS).glob("*.safetensors")) if (run_dir / CHECKPOINTS).is_dir() else ():
        files[f"{CHECKPOINTS}/{ckpt.name}"] = ckpt
    return files


def _epoch_of(run_dir: Path) -> float:
    """How far a run directory (or its state) got: its resume state's epoch, else its last
    evaluation's (-1: nothing yet; infinity: finished, further than any state)."""
    from interp_toolkit.runs.resume import saved_epoch

    if (run_dir / OUTCOME).is_file():
        return math.inf
    saved = saved_epoch(run_dir) if (run_dir / RESUME_STATE).is_file() else None
    if saved is not None:
        return saved
    lines = (run_dir / METRICS).read_text(encoding="utf-8").splitlines() if (run_dir / METRICS).is_file() else []
    return json.loads(lines[-1])["epoch"] if lines else -1


def _sync(source: Path, target: Path, finished: bool) -> int:
    """Make ``target`` hold ``source``'s kept files (atomic per file, only changed bytes
    written; files no longer kept removed); returns the bytes written."""
    files = _run_files(source, finished)
    written = 0
    for name, path in files.items():
        data = path.read_bytes()
        out = target / name
        if not (out.is_file() and out.read_bytes() == data):
            atomic_write_bytes(out, data)
            written += len(data)
    if target.is_dir():
        for old in [p for p in target.rglob("*") if p.is_file()]:
            if old.relative_to(target).as_posix() not in files:
                old.unlink()
    return written


def grid_runs(cfg: SweepConfig, study_dir: Path) -> list[dict[str, Any]]:
    """Every run of the grid in job order: ``{"cell", "seed", "name", "run_dir"}``."""
    from interp_toolkit.studies.sweep.run import plan_jobs

    return [{"cell": dict(job["cell"]), "seed": run["seed"], "name": Path(run["run_dir"]).name,
             "run_dir": Path(run["run_dir"])} for job in plan_jobs(cfg, study_dir) for run in job["runs"]]


def restore_state(cfg: SweepConfig, study_dir: Path, state_dir: Path) -> list[str]:
    """Copy every run of the grid that ``state_dir`` holds further along than ``study_dir`` does
    into ``study_dir`` (so a fresh machine continues it); returns the names restored."""
    from interp_toolkit.runs.lock import lock_holder

    restored = []
    for run in grid_runs(cfg, study_dir):
        saved = state_dir / run["name"]
        if not saved.is_dir() or _epoch_of(saved) <= (_epoch_of(run["run_dir"]) if run["run_dir"].is_dir() else -2):
            continue
        if run["run_dir"].is_dir() and lock_holder(run["run_dir"]):
            raise UserError(f"{run['run_dir']} is being trained now ({lock_holder(run['run_dir'])}); "
                            "stop that sweep before restoring the campaign's state over it")
        finished = (saved / OUTCOME).is_file()
        if run["run_dir"].is_dir():
            shutil.rmtree(run["run_dir"])  # behind the state: the state's files replace it whole
        _sync(saved, run["run_dir"], finished)
        restored.append(run["name"])
    return restored


def save_state(cfg: SweepConfig, study_dir: Path, state_dir: Path) -> int:
    """Copy every run of the grid with a directory in ``study_dir`` into ``state_dir``; returns
    the bytes written (what this save adds to a repository that commits ``state_dir``)."""
    written = 0
    for run in grid_runs(cfg, study_dir):
        if run["run_dir"].is_dir() and (run["run_dir"] / METRICS).is_file():
            written += _sync(run["run_dir"], state_dir / run["name"], (run["run_dir"] / OUTCOME).is_file())
    return written


@contextlib.contextmanager
def sigterm_pauses(flag: Path) -> Iterator[None]:
    """Within the block, SIGTERM to this process pauses the campaign (this process's training
    and, through ``flag``, its workers') instead of ending it; the previous handler comes back after."""
    def handler(signum: int, frame: Any) -> None:
        pause.request()
        flag.parent.mkdir(parents=True, exist_ok=True)
        flag.touch()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _progress(cfg: SweepConfig, study_dir: Path) -> dict[str, int]:
    return {run["name"]: (_run_epoch(run["run_dir"]) if run["run_dir"].is_dir() else 0)
            for run in grid_runs(cfg, study_dir)}


def _run_epoch(run_dir: Path) -> int:
    """Epochs a run directory has trained (finished: its last evaluation)."""
    epoch = _epoch_of(run_dir)
    if epoch == math.inf:
        lines = (run_dir / METRICS).read_text(encoding="utf-8").splitlines()
        return int(json.loads(lines[-1])["epoch"])
    return max(0, int(epoch))


def run_campaign(cfg: SweepConfig, study_dir: str | Path, state_dir: str | Path, budget: float | None = None,
                 workers: int | None = None, progress: bool = True, log_every: float | None = None,
                 callbacks: Sequence[Any] | None = None, recorded: Sequence[str | Path] = ()) -> dict[str, Any]:
    """One session of a campaign (:mod:`module docs <.campaign>`): restore, train until
    ``budget`` seconds have passed (None: to the end) or SIGTERM, pause, save.

    Returns:
        ``{"result", "restored", "bytes_saved", "session"}``: the
        :class:`~interp_toolkit.studies.sweep.run.SweepResult`, the runs restored from
        ``state_dir``, the bytes this save wrote there, and the session's log entry.
    """
    from interp_toolkit.studies.sweep.run import run_sweep

    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget < 0):
        raise UserError(f"budget must be a number of seconds >= 0 or None, got {budget!r}")
    study_dir, state_dir = Path(study_dir).resolve(), Path(state_dir).resolve()
    if state_dir == study_dir or study_dir in state_dir.parents:
        raise UserError(f"--state {state_dir} must lie outside the study directory {study_dir} "
                        "(it is what survives it)")
    state_dir.mkdir(parents=True, exist_ok=True)
    flag = study_dir / PAUSE_FLAG
    flag.unlink(missing_ok=True)
    restored = restore_state(cfg, study_dir, state_dir)
    before = _progress(cfg, study_dir)
    started, clock = time.time(), pause.time.time()
    deadline = None if budget is None else clock + budget
    try:
        with sigterm_pauses(flag):
            result = run_sweep(cfg, study_dir, workers=workers, progress=progress, report=False, callbacks=callbacks,
                               recorded=recorded, log_every=log_every, pausable=True, pause_at=deadline,
                               pause_flag=flag)
    finally:
        flag.unlink(missing_ok=True)
        bytes_saved = save_state(cfg, study_dir, state_dir)
    after = _progress(cfg, study_dir)
    runs = {run["name"]: run for run in grid_runs(cfg, study_dir)}
    trained: dict[str, int] = {}
    for name, epoch in after.items():
        layers = str(runs[name]["cell"]["n_layers"])
        trained[layers] = trained.get(layers, 0) + max(0, epoch - before.get(name, 0))
    session = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "host": socket.gethostname(),
               "wall_s": round(time.time() - started, 1), "workers": _workers_used(result, workers),
               "seed_epochs_by_layers": trained, "paused": len(result.paused), "bytes_saved": bytes_saved}
    log = _read_log(state_dir)
    log["sessions"].append(session)
    atomic_write_json(state_dir / CAMPAIGN_LOG, log)
    write_status(cfg, state_dir)
    return {"result": result, "restored": restored, "bytes_saved": bytes_saved, "session": session}


def _workers_used(result: Any, workers: int | None) -> int:
    hosts = {(p.get("host"), p.get("pid")) for p in result.placements}
    return max(1, min(len(hosts) or 1, workers or os.cpu_count() or 1))


def _read_log(state_dir: Path) -> dict[str, Any]:
    path = state_dir / CAMPAIGN_LOG
    if not path.is_file():
        return {"sessions": []}
    try:
        log = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{path} is not a campaign log ({err}); restore it from the repository") from None
    if not isinstance(log, dict) or not isinstance(log.get("sessions"), list):
        raise UserError(f"{path} is not a campaign log (expected an object with a 'sessions' list)")
    return log


def core_seconds_per_seed_epoch(state_dir: str | Path) -> dict[str, float]:
    """``{n_layers: core-seconds per seed-epoch}`` measured over the campaign's sessions that
    trained one architecture only (wall time x workers / seed-epochs)."""
    spent: dict[str, list[float]] = {}
    for session in _read_log(Path(state_dir))["sessions"]:
        trained = {k: v for k, v in session.get("seed_epochs_by_layers", {}).items() if v > 0}
        if len(trained) == 1:
            (layers, epochs), = trained.items()
            cost = spent.setdefault(layers, [0.0, 0.0])
            cost[0] += float(session["wall_s"]) * int(session["workers"])
            cost[1] += epochs
    return {layers: seconds / epochs for layers, (seconds, epochs) in spent.items() if epochs}


def campaign_status(cfg: SweepConfig, state_dir: str | Path) -> list[dict[str, Any]]:
    """Where every run of the grid stands, read from ``state_dir`` alone.

    Returns:
        One dict per run in job order: ``name``, ``r``, ``n_layers``, ``weight_decay``, ``seed``,
        ``epochs_done``, ``horizon``, ``best_adv_acc`` (None before any evaluation), ``met_at``
        (the first evaluation meeting the criterion, None: not yet), ``state`` (``finished``,
        ``paused`` or ``not started``) and ``core_hours_left`` (the epochs it may still train at
        the campaign's measured rate for its architecture; 0 once met or finished; None when no
        session has measured the rate).
    """
    from interp_toolkit.studies.common.outcomes import generalization_stop_rule
    from interp_toolkit.studies.grid.config import stop_rule_of
    from interp_toolkit.tasks.mpsp import task_modulus

    state_dir = Path(state_dir)
    rates = core_seconds_per_seed_epoch(state_dir)
    rows = []
    for run in grid_runs(cfg, state_dir):
        cell, saved = run["cell"], state_dir / run["name"]
        rule = stop_rule_of(cfg, cell) or generalization_stop_rule(cell["r"], task_modulus(cell["task"]), cfg.threshold)
        metrics = [json.loads(line) for line in (saved / METRICS).read_text(encoding="utf-8").splitlines()
                   if line.strip()] if (saved / METRICS).is_file() else []
        finished = (saved / OUTCOME).is_file()
        done = _run_epoch(saved) if saved.is_dir() and metrics else 0
        met = next((m["epoch"] for m in metrics if rule(m)), None)
        accs = [m["adv_acc"] for m in metrics if "adv_acc" in m]
        left_epochs = 0 if finished or met is not None else cfg.train.epochs - done
        rate = rates.get(str(cell["n_layers"]))
        rows.append({"name": run["name"], "r": cell["r"], "n_layers": cell["n_layers"],
                     "weight_decay": cell["weight_decay"], "seed": run["seed"], "epochs_done": done,
                     "horizon": cfg.train.epochs, "best_adv_acc": max(accs) if accs else None, "met_at": met,
                     "state": "finished" if finished else ("paused" if metrics else "not started"),
                     "core_hours_left": None if left_epochs and rate is None else left_epochs * (rate or 0) / 3600})
    return rows


def status_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """:func:`campaign_status` as a markdown table, with a totals line."""
    lines = ["| layers | r | wd | seed | epochs done | best adv acc | criterion met at | state | core-hours left |",
             "|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for row in rows:
        best = "-" if row["best_adv_acc"] is None else f"{row['best_adv_acc']:.4f}"
        met_at = "not yet" if row["met_at"] is None else f"epoch {row['met_at']:,}"
        left = "?" if row["core_hours_left"] is None else f"{row['core_hours_left']:.1f}"
        lines.append(f"| {row['n_layers']}L | {row['r']:g} | {row['weight_decay']:g} | {row['seed']} | "
                     f"{row['epochs_done']:,} / {row['horizon']:,} | {best} | {met_at} | {row['state']} | {left} |")
    known = [row["core_hours_left"] for row in rows if row["core_hours_left"] is not None]
    met = sum(row["met_at"] is not None for row in rows)
    unknown = len(rows) - len(known)
    finished = sum(r["state"] == "finished" for r in rows)
    lines.append(f"\n{len(rows)} runs: {met} met the criterion, {finished} finished; "
                 f"at most {sum(known):.1f} core-hours left at the measured rate"
                 + (f" (and {unknown} runs of an architecture not measured yet)" if unknown else ""))
    return "\n".join(lines) + "\n"


def write_status(cfg: SweepConfig, state_dir: str | Path) -> Path:
    """Write :func:`status_table` to ``state_dir/status.md``; returns its path."""
    path = Path(state_dir) / STATUS_MD
    atomic_write_bytes(path, status_table(campaign_status(cfg, state_dir)).encode())
    return path


__all__ = ["CAMPAIGN_LOG", "PAUSE_FLAG", "STATUS_MD", "campaign_status", "core_seconds_per_seed_epoch",
           "grid_runs", "parse_duration", "restore_state", "run_campaign", "save_state", "sigterm_pauses",
           "status_table", "write_status"]
