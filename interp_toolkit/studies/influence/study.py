"""The influence study of docs/influence.md: which training examples drive an MPSP run out of
its saturated shortcut, over several runs (``examples/influence_study.py`` is its command line).

    python examples/influence_study.py train OUT EPOCHS SEED...   # the demo's task and model
    python examples/influence_study.py measure OUT SEED...        # interp-toolkit influence per run
    python examples/influence_study.py figures OUT DEST           # CSVs, figures, numbers -> DEST
    python examples/influence_study.py outcomes OUT DEST.csv      # every trained run's kind and epochs
    python examples/influence_study.py merge DEST.csv MEASURED... # one table from re-measured checkpoints

``train`` (:func:`train_runs`) trains one run per model seed with the demo's task and model (1
layer, 2 heads, length 5, values 0..9, r = 0.9, 4,096 training examples) for EPOCHS full-batch
epochs, checkpoints every 25 epochs plus log-spaced ones (resumable). ``measure``
(:func:`measure_runs`) runs the influence study (``interp-toolkit influence``'s default sampler:
4 chains x 50 draws after 60 burn-in steps, 2 steps apart; 512 query examples of each split) at
epochs 50, 100, 200, 300, 400 where a run has them (cached per checkpoint: an interrupted
measurement resumes). ``figures`` (:func:`write_figures`) copies each run's ``influence.csv`` to
``DEST/<run>.csv``, regenerates every figure from those CSVs only (``DEST/<run>.png``,
``DEST/summary.png``), and writes ``DEST/numbers.json``: per run its phases, the anti-shortcut
group's BIF on the adversarial loss at the shortcut-phase and onset checkpoints with their
errors, the between-phase share, and for runs that left the shortcut the features of the most
helpful anti-shortcut examples at the onset with their permutation p-values. ``merge``
(:func:`merge_measurements`) joins several ``interp-toolkit influence`` outputs of one run into
one table: a later output's epochs replace the earlier ones' (a checkpoint measured again with
more draws), and every row names its sampler's draws.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

from interp_toolkit.errors import UserError
from interp_toolkit.studies.grid.study import runs_dir

__all__ = ["EPOCHS", "N_QUERY", "RISING_FROM", "measure_runs", "merge_measurements", "run_kind", "table_outcomes",
           "train_runs", "write_figures"]

EPOCHS = (50, 100, 200, 300, 400)


#: Query examples of each split (adv, val) the influence is measured on.
N_QUERY = 512
#: A run without an onset whose final adversarial accuracy is at least this is still climbing:
#: neither a clean leaver nor a control (seed 0 of the first study: 0.23 at epoch 400).
RISING_FROM = 0.2


def train_runs(out: Path, epochs: int, seeds: list[int]) -> None:
    """``train``: one run per model seed under ``OUT/runs/seed<S>`` (the demo's task and model, 4,096
    training examples, full batch, checkpoints every 25 epochs plus log-spaced ones; resumable)."""
    import torch

    from interp_toolkit.model import ModelConfig
    from interp_toolkit.runs.config import TrainConfig
    from interp_toolkit.runs.mpsp import train_mpsp
    from interp_toolkit.studies.demo import DEMO_TASK
    from interp_toolkit.tasks.mpsp import MPSPConfig

    torch.set_num_threads(1)
    for seed in seeds:
        task = MPSPConfig(n_train=4096, **DEMO_TASK)
        model = ModelConfig(n_layers=1, n_heads=2, seed=seed, **task.model_dims())
        result = train_mpsp(task, model, TrainConfig(epochs=epochs, eval_every=10, checkpoint_every=25,
                                                     progress=False), runs_dir(out) / f"seed{seed}")
        print(seed, result.final, flush=True)


def measure_runs(out: Path, seeds: list[int]) -> None:
    """``measure``: :func:`~interp_toolkit.studies.influence.measure.run_influence` on each run at the
    :data:`EPOCHS` it has, into ``OUT/out/seed<S>`` (cached per checkpoint: it resumes)."""
    import torch

    from interp_toolkit.runs.resume import list_checkpoints
    from interp_toolkit.studies.influence.measure import InfluenceConfig, run_influence

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # convergence notes are recorded per checkpoint in the CSV
    for seed in seeds:
        run = runs_dir(out) / f"seed{seed}"
        available = {epoch for epoch, _ in list_checkpoints(run)}
        epochs = tuple(e for e in EPOCHS if e in available)
        result = run_influence(run, InfluenceConfig(epochs=epochs, n_query=N_QUERY), out=out / "out" / f"seed{seed}",
                               progress=False)
        print(seed, result.computed, result.phases, flush=True)


def run_kind(outcome: dict[str, Any]) -> str:
    """``left the shortcut`` (the outcome code found phase 2) or ``no phase 2 (outcome code)``
    (stayed on the shortcut or memorized within the run's epochs: a control, if it stays)."""
    return "left the shortcut" if outcome.get("phase2_onset_epoch") is not None else "no phase 2 (outcome code)"


def table_outcomes(out: Path, dest: Path) -> list[dict[str, Any]]:
    """One row per trained run under ``OUT/runs``: its kind (:func:`run_kind`; ``rising, no
    onset`` for a run still climbing at its end without an onset, neither kind) and the outcome
    code's epochs, written to ``dest`` (CSV)."""
    from interp_toolkit.io import atomic_write_text
    from interp_toolkit.studies.influence.phases import run_outcome

    rows = []
    for run in sorted(runs_dir(out).glob("seed*"), key=lambda p: int(p.name[4:])):
        outcome, metrics, _ = run_outcome(run)
        final = metrics[-1]["adv_acc"]
        kind = run_kind(outcome)
        if kind != "left the shortcut" and final >= RISING_FROM:
            kind = "rising, no onset"
        rows.append({"seed": run.name[4:], "kind": kind, "shortcut_epoch": outcome.get("shortcut_epoch"),
                     "phase2_onset_epoch": outcome.get("phase2_onset_epoch"),
                     "first_100pct_adv_epoch": outcome.get("first_generalized_epoch"),
                     "best_adv_acc_after_shortcut": max(m["adv_acc"] for m in metrics
                                                        if m["epoch"] >= (outcome.get("shortcut_epoch") or 0)),
                     "final_adv_acc": final, "final_epoch": metrics[-1]["epoch"]})
    import csv
    import io

    buffer = io.StringIO()  # the csv module quotes a kind with a comma ("rising, no onset")
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
    atomic_write_text(dest, buffer.getvalue())
    for row in rows:
        print(*row.values(), flush=True)
    return rows


def merge_measurements(dest: Path, measured: list[Path]) -> list[dict[str, Any]]:
    """Join the ``influence.csv`` of each folder in ``measured`` (outputs of ``interp-toolkit
    influence`` on one run) into ``dest``: an epoch measured in a later folder replaces the
    earlier folders' rows of that epoch, rows keep the first table's order, and a ``draws``
    column names the draws per chain each row's sampler took (from the folder's summary)."""
    import csv
    import io

    from interp_toolkit.io import atomic_write_text

    tables, run_dirs = [], set()
    for folder in measured:
        summary = json.loads((folder / "summary.json").read_text())
        run_dirs.add(summary["run_dir"])
        draws = str(summary["settings"]["sampler"]["draws"])
        with open(folder / "influence.csv", newline="", encoding="utf-8") as handle:
            tables.append([{**row, "draws": draws} for row in csv.DictReader(handle)])
    if len(run_dirs) != 1:
        raise UserError(f"merge joins measurements of one run; these measure {sorted(run_dirs)}")
    by_epoch: dict[str, list[dict[str, Any]]] = {}
    for table in tables:
        for epoch in {row["epoch"] for row in table}:
            by_epoch[epoch] = [row for row in table if row["epoch"] == epoch]
    order = {(r["epoch"], r["train_group"], r["query_set"]): i for table in reversed(tables)
             for i, r in enumerate(table)}
    rows = sorted((row for group in by_epoch.values() for row in group),
                  key=lambda r: (int(r["epoch"]), order[(r["epoch"], r["train_group"], r["query_set"])]))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(tables[0][0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(dest, text.getvalue())
    for epoch in sorted(by_epoch, key=int):
        print(f"epoch {epoch}: {by_epoch[epoch][0]['draws']} draws", flush=True)
    return rows


def write_figures(out: Path, dest: Path) -> dict[str, Any]:
    """``figures``: each measured run's ``influence.csv`` copied to ``DEST/<run>.csv``, every figure
    drawn from those copies only, and ``DEST/numbers.json`` (module docstring); returns the numbers."""
    import torch

    from interp_toolkit.analyses.over_checkpoints import splits_from_run
    from interp_toolkit.plotting import save_figure
    from interp_toolkit.studies.influence.examples import onset_examples
    from interp_toolkit.studies.influence.plot import plot_influence, plot_influence_summary
    from interp_toolkit.studies.influence.table import read_influence_csv

    dest.mkdir(parents=True, exist_ok=True)
    runs, kinds, numbers = {}, {}, {}
    for study in sorted((out / "out").glob("seed*")):
        if not (study / "influence.csv").is_file():
            continue
        name = study.name
        summary = json.loads((study / "summary.json").read_text())
        outcome = summary["outcome"]
        shutil.copyfile(study / "influence.csv", dest / f"{name}.csv")
        rows = read_influence_csv(dest / f"{name}.csv")
        runs[name], kinds[name] = rows, run_kind(outcome)
        save_figure(plot_influence(rows, outcome, title=f"{name}: {kinds[name]}"), dest / f"{name}.png")
        anti_adv = {r["epoch"]: r for r in rows if r["train_group"] == "anti" and r["query_set"] == "adv"}
        cons_adv = {r["epoch"]: r for r in rows if r["train_group"] == "consistent" and r["query_set"] == "adv"}
        onset = outcome.get("phase2_onset_epoch")
        entry = {"kind": kinds[name], "phases": summary["phases"],
                 "shortcut_epoch": outcome["shortcut_epoch"], "phase2_onset_epoch": onset,
                 "first_generalized_epoch": outcome["first_generalized_epoch"],
                 "anti_on_adv": {e: [r["bif"], r["stderr"], r["between"], r["amplification"]]
                                 for e, r in sorted(anti_adv.items())},
                 "consistent_on_adv": {e: [r["bif"], r["stderr"]] for e, r in sorted(cons_adv.items())},
                 "most_negative_anti_epoch": min(anti_adv, key=lambda e: anti_adv[e]["bif"]) if anti_adv else None,
                 "largest_amplification_epoch": max(anti_adv, key=lambda e: anti_adv[e]["amplification"])
                 if anti_adv else None}
        if onset is not None and anti_adv:
            # the first measured checkpoint at or after the onset (the onset's own if measured)
            at_onset = min((e for e in anti_adv if e >= onset), default=max(anti_adv))
            record_path = next((study / "cache").glob(f"epoch_{at_onset:06d}_*.json"))
            record = json.loads(record_path.read_text())
            index = torch.tensor(record["train_index"])
            train = splits_from_run(Path(summary["run_dir"]))["train"]
            values, anti = train.values[index], ~train.agrees[index]
            k = max(1, int(anti.sum()) // 10)
            found = onset_examples(values, anti, torch.tensor(record["per_example"]["adv"]["bif"]), k=k)
            entry["onset_examples"] = {"epoch": at_onset, "k": k, "n_anti": found["n_anti"],
                                       "features": found["features"]}
        numbers[name] = entry
    if runs:
        save_figure(plot_influence_summary(runs, kinds), dest / "summary.png")
    (dest / "numbers.json").write_text(json.dumps(numbers, indent=1, sort_keys=True) + "\n")
    return numbers
