"""Parameter norms over the checkpoints of every finished run of one or more sweep studies.

Why: AdamW's decoupled weight decay multiplies every weight by ``1 - lr * wd`` per step, so a
solution the gradient does not defend shrinks on a timescale of ``1 / (lr * wd)`` steps
(10,000 full-batch epochs at lr 1e-3, wd 0.1). If a memorizing run's norm is still falling
when the horizon ends, the run has not reached the timescale on which weight decay can trade
memorization for the rule. :func:`weight_norm_study` measures that with the toolkit's
``weight_norms`` analysis (cached per checkpoint in each run directory) and writes, under
``out``:

* ``<name>.csv``: one row per run, checkpoint and parameter group (study, cell, seed,
  generalized, lr, weight decay, steps_per_epoch, step, scheduled_lr, pure_decay, epoch, group, norm,
  n_params, and against the run's epoch-0 checkpoint: reference_norm, distance,
  relative_distance, cosine); ``pure_decay`` is the factor decay alone would have applied by
  that step, ``prod(1 - lr_s * wd)`` over the run's steps with its own learning rate
  schedule (``(1 - lr * wd) ** step`` at a constant rate);
* ``<name>_rates.csv``: per run and group, the norm's relative change per optimizer step
  between the last two checkpoints at or after ``from_epoch``, beside the pure-decay rate
  ``-lr * wd`` (with a schedule, its geometric mean over those steps) and as a share of it
  (:func:`decay_share_lines`: medians per cell);
* ``<name>.png``: per cell, each group's norm relative to its initialization (median over
  seeds) against epoch, with pure decay dotted: a group on the dotted curve is one the
  gradient does not defend, a rising one carries the learned solution; below, each group's
  cosine to its initialization (near 1: still mostly the random init).

Steps, not epochs, carry the decay: a minibatch run takes ``ceil(n_train / batch_size)``
steps per epoch (:func:`~interp_toolkit.runs.config.steps_per_epoch`).

``examples/reproduction/weight_norms.py`` is its command line.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interp_toolkit.analyses._common import Table
from interp_toolkit.analyses.over_checkpoints import over_checkpoints
from interp_toolkit.errors import UserError
from interp_toolkit.plotting import save_figure
from interp_toolkit.runs.config import TrainConfig, steps_per_epoch
from interp_toolkit.runs.record import read_record, task_dict
from interp_toolkit.runs.trainer import list_checkpoints
from interp_toolkit.studies.grid.study import has_outcome, read_outcome, runs_dir


def finished_runs(study_dirs: list[Path]) -> list[tuple[Path, Path]]:
    """(study, run directory) of every run with an outcome record, in name order."""
    runs = []
    for study in study_dirs:
        if not runs_dir(study).is_dir():
            raise UserError(f"{study} is not a sweep study directory (expected {runs_dir(study)})")
        runs += [(study, d) for d in sorted(runs_dir(study).iterdir()) if has_outcome(d)]
    if not runs:
        raise UserError(f"no finished runs (with an outcome record) under {', '.join(map(str, study_dirs))}")
    return runs


def pure_decay_factors(train: TrainConfig, per_epoch: int, epochs: list[int]) -> dict[int, float]:
    """Epoch -> the factor by which AdamW's decoupled decay alone shrinks a weight by the end
    of that epoch: ``prod(1 - lr_s * wd)`` over steps ``s = 1 .. epoch * per_epoch``, with the
    run's learning rate schedule (:meth:`TrainConfig.lr_at`)."""
    if not train.schedules_lr:  # one factor, as the closed form every constant-rate figure used
        return {e: (1 - train.lr * train.weight_decay) ** (e * per_epoch) for e in epochs}
    total = train.epochs * per_epoch
    wanted, out, factor = sorted(set(epochs)), {}, 1.0
    step = 0
    for epoch in wanted:
        while step < epoch * per_epoch:
            step += 1
            factor *= 1 - train.lr_at(step, total) * train.weight_decay
        out[epoch] = factor
    return out


def measure(runs: list[tuple[Path, Path]], progress: bool = True) -> list[dict]:
    """One row per run, checkpoint and parameter group: the toolkit's ``weight_norms`` analysis
    (cached per checkpoint in each run directory) against the run's epoch-0 checkpoint, with
    the run's study, cell, seed, outcome, lr, weight decay, steps per epoch, optimizer step and
    pure-decay factor at the checkpoint (:func:`pure_decay_factors`)."""
    rows = []
    for i, (study, run_dir) in enumerate(runs, 1):
        record = read_record(run_dir)
        task, model, train = task_dict(record), record["identity"]["model"], record["identity"]["train"]
        if task is None:
            raise UserError(f"run {run_dir} records no task (run_info.task): not a run of a sweep study")
        outcome = read_outcome(run_dir)
        init = dict(list_checkpoints(run_dir)).get(0)
        config = {"reference": str(init)} if init is not None else {}
        result = over_checkpoints("weight_norms", run_dir, config=config, plot=False, progress=False)
        if progress:
            print(f"[{i}/{len(runs)}] {run_dir.name}: {len(result.computed)} computed, "
                  f"{len(result.cache_hits)} cached", flush=True)
        cell = f"{model['n_layers']}L r={task['r']:g} wd={train['weight_decay']:g}"
        train_cfg = TrainConfig.from_dict(train)
        per_epoch = steps_per_epoch(task["n_train"], train_cfg.batch_size)
        decay = pure_decay_factors(train_cfg, per_epoch, [int(r["epoch"]) for r in result.rows])
        for row in result.rows:
            epoch = int(row["epoch"])
            rows.append({"study": study.name, "cell": cell, "seed": model["seed"],
                         "generalized": bool(outcome.get("generalized")), "lr": train["lr"],
                         "weight_decay": train["weight_decay"], "steps_per_epoch": per_epoch,
                         "step": epoch * per_epoch, "scheduled_lr": train_cfg.schedules_lr,
                         "pure_decay": decay[epoch], **row})
    return rows


def _steps(row: dict) -> int:
    """A row's optimizer step; a table written before steps were recorded was full-batch
    (one step per epoch) throughout."""
    return int(row["step"]) if row.get("step") not in (None, "") else int(row["epoch"])


def decay_rates(rows: list[dict], from_epoch: int) -> list[dict]:
    """Per run and group: relative norm change per optimizer step over its last two
    checkpoints at or after ``from_epoch``, and that as a share of pure decay (1: the gradient
    does not defend the group at all; 0: its norm holds; negative: it grows). Pure decay per
    step is ``-lr * wd`` at a constant rate; with a schedule, the geometric mean over those steps,
    ``(pure_decay_to / pure_decay_from) ** (1 / steps) - 1``."""
    by_run_group: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["epoch"] >= from_epoch:
            by_run_group.setdefault((r["study"], r["cell"], r["seed"], r["group"]), []).append(r)
    out = []
    for (study, cell, seed, group), mine in sorted(by_run_group.items()):
        mine.sort(key=lambda r: r["epoch"])
        if len(mine) < 2 or mine[-2]["norm"] == 0:
            continue
        a, b = mine[-2], mine[-1]
        steps = _steps(b) - _steps(a)
        rate = (b["norm"] / a["norm"] - 1) / steps
        pure = -a["lr"] * a["weight_decay"]
        if a.get("scheduled_lr") is True and a["pure_decay"] > 0:  # the geometric mean over the interval
            pure = (b["pure_decay"] / a["pure_decay"]) ** (1 / steps) - 1
        out.append({"study": study, "cell": cell, "seed": seed, "group": group, "generalized": a["generalized"],
                    "from_epoch": a["epoch"], "to_epoch": b["epoch"], "norm_from": a["norm"], "norm_to": b["norm"],
                    "rate_per_step": rate, "pure_decay_rate": pure,
                    "share_of_pure_decay": rate / pure if pure else float("nan")})
    return out


def median_series(rows: list[dict], column: str) -> dict[tuple[str, str], tuple[list[int], list[float]]]:
    """(cell, group) -> epochs and the median over the cell's seeds of ``column``
    (``norm`` is divided by the run's norm at epoch 0; groups that start at zero, such as
    attention output biases, and rows without the column are left out). Only epochs with a
    checkpoint in at least half of the cell's runs are kept: a run that stopped early once it
    generalized has checkpoints at its own final epoch, and a median of one run is not the cell's."""
    init = {(r["study"], r["seed"], r["cell"], r["group"]): r["norm"] for r in rows if r["epoch"] == 0}
    series: dict[tuple[str, str], dict[int, list[float]]] = {}
    for r in rows:
        start = init.get((r["study"], r["seed"], r["cell"], r["group"]))
        if not start or r.get(column) is None:
            continue
        value = r[column] / start if column == "norm" else r[column]
        series.setdefault((r["cell"], r["group"]), {}).setdefault(r["epoch"], []).append(value)
    runs_per_cell: dict[str, set] = {}
    for r in rows:
        runs_per_cell.setdefault(r["cell"], set()).add((r["study"], r["seed"]))
    out = {}
    for (cell, group), by_epoch in series.items():
        epochs = [e for e in sorted(by_epoch) if 2 * len(by_epoch[e]) >= len(runs_per_cell[cell])]
        out[cell, group] = (epochs, [statistics.median(by_epoch[e]) for e in epochs])
    return out


def plot(rows: list[dict]) -> Any:
    """Per cell: each group's median norm over its initialization's, and its cosine to it.

    Toolkit style (:mod:`interp_toolkit.plotting`): one colour per head or layer (a head's QK
    solid and OV dashed, as in the mechanism figure), the whole model thick black, pure decay
    dotted, one legend right of the panels.
    """
    from matplotlib.lines import Line2D

    from interp_toolkit.plotting import component_colors, figure, legend_outside, style

    curves = median_series(rows, "norm")
    cosines = median_series(rows, "cosine")
    cells = sorted({cell for cell, _ in curves})
    groups = sorted({group for _, group in curves}, key=lambda g: (g != "all", g))
    colors = component_colors(g.split(".")[0] for g in groups if g != "all")
    n_rows = 2 if cosines else 1
    with style():
        fig = figure(figsize=(4.6 * len(cells) + 2.2, 3.6 * n_rows), layout="constrained")
        grid = fig.subplots(n_rows, len(cells), sharey="row", sharex="col", squeeze=False)
        axes = grid[0]
        for column, cell in enumerate(cells):
            ax = axes[column]
            for group in groups:
                if (cell, group) not in curves:
                    continue
                line = dict(color="black", lw=2.5) if group == "all" else dict(color=colors[group.split(".")[0]],
                                                                               lw=1.2)
                line.update(marker=".", label=group, ls="--" if group.endswith(".OV") else "-")
                ax.plot(*curves[cell, group], **line)
                if (cell, group) in cosines:
                    grid[1][column].plot(*cosines[cell, group], **line)
            mine = [r for r in rows if r["cell"] == cell]
            lr, wd, end = mine[0]["lr"], mine[0]["weight_decay"], max(r["epoch"] for r in mine)
            decay = {int(r["epoch"]): r["pure_decay"] for r in mine if r.get("pure_decay") not in (None, "")}
            per_epoch = int(mine[0].get("steps_per_epoch") or 1)
            if decay:  # the run's own schedule, at its checkpoints
                xs = sorted(decay)
                ax.plot(xs, [decay[x] for x in xs], ":", color="black", lw=2,
                        label="pure decay, prod(1 - lr wd) per step")
            else:  # a table from before steps were recorded: full batch, constant rate
                xs = list(range(0, end + 1, max(1, end // 100)))
                ax.plot(xs, [(1 - lr * wd) ** x for x in xs], ":", color="black", lw=2,
                        label=f"pure decay (1-{lr * wd:g})^step")
            n_seeds = len({(r["study"], r["seed"]) for r in mine})
            ax.set_title(f"{cell} ({n_seeds} seeds, median)")
            grid[-1][column].set_xlabel("epoch (one full-batch step each)" if per_epoch == 1
                                        else f"epoch ({per_epoch} optimizer steps each)")
        axes[0].set_ylabel("parameter norm / its norm at initialization")
        if cosines:
            grid[1][0].set_ylabel("cosine to the initialization")
        handles, labels = axes[-1].get_legend_handles_labels()
        handles.append(Line2D([], [], color="grey", ls="--", label="(dashed: a head's OV, solid: its QK)"))
        legend_outside(axes[-1], handles=handles, ncol=1 if len(handles) <= 16 else 2)
    return fig


def replot(csv_path: Path) -> Path:
    """Redraw ``<name>.png`` beside a ``<name>.csv`` that :func:`weight_norm_study` wrote, from the table alone."""
    rows = Table.from_csv(csv_path).rows
    if not rows or "norm" not in rows[0]:
        raise UserError(f"{csv_path} is not a weight_norms table (no rows or no norm column)")
    return save_figure(plot(rows), csv_path.with_suffix(".png"))


@dataclass
class WeightNormStudy:
    """What :func:`weight_norm_study` wrote: the norm table, the decay-rate table (None when no
    run has two checkpoints from ``from_epoch`` on), the figure, and the rates themselves."""

    table: Path
    rates_table: Path | None
    figure: Path
    rates: list[dict]


def weight_norm_study(studies: list[Path], out: Path, name: str = "weight_norms", from_epoch: int = 500,
                      progress: bool = True) -> WeightNormStudy:
    """Measure every finished run of ``studies`` and write ``<name>.csv``, ``<name>_rates.csv``
    and ``<name>.png`` under ``out`` (module docstring). Bad input is refused before any work."""
    if isinstance(from_epoch, bool) or not isinstance(from_epoch, int) or from_epoch < 0:
        raise UserError(f"from_epoch must be an integer >= 0, got {from_epoch!r}")
    runs = finished_runs([Path(s) for s in studies])
    rows = measure(runs, progress=progress)
    rates = decay_rates(rows, from_epoch)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table = Table(rows).to_csv(out / f"{name}.csv")
    rates_table = Table(rates).to_csv(out / f"{name}_rates.csv") if rates else None
    return WeightNormStudy(table, rates_table, save_figure(plot(rows), out / f"{name}.png"), rates)


def decay_share_lines(rates: list[dict]) -> list[str]:
    """Per cell, the median over seeds of each group's share of pure decay, one line each."""
    lines = []
    for cell in sorted({r["cell"] for r in rates}):
        shares: dict[str, list[float]] = {}
        for rate in rates:
            if rate["cell"] == cell:
                shares.setdefault(rate["group"], []).append(rate["share_of_pure_decay"])
        text = ", ".join(f"{group} {statistics.median(v):+.2f}" for group, v in sorted(shares.items()))
        lines.append(f"{cell}: {text}")
    return lines
