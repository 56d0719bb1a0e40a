"""Cell settings, cell specs and the flow of a new config field into cells (no edit needed)."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from typing import Any

import pytest

from interp_toolkit.cli import main
from interp_toolkit.errors import UserError
from interp_toolkit.runs.config import TrainConfig
from interp_toolkit.studies.grid.cells import (
    CELL_FIELDS,
    cell_fields,
    complete_settings,
    extra_settings,
    parse_cell_spec,
    select_runs,
)
from interp_toolkit.studies.grid.config import PRESETS, SweepConfig
from interp_toolkit.studies.grid.outcome_table import read_outcomes_csv
from interp_toolkit.studies.grid.study import OUTCOMES_CSV
from interp_toolkit.studies.sweep.run import run_sweep


@dataclass
class SmoothedTrainConfig(TrainConfig):
    """A TrainConfig with a field of its own (the trainer ignores it: only its flow is tested).

    Attributes:
        label_smoothing: A setting the base config does not have.
    """

    label_smoothing: float = 0.0


@dataclass
class SmoothedSweepConfig(SweepConfig):
    """A sweep whose runs train with :class:`SmoothedTrainConfig`."""

    @classmethod
    def config_classes(cls) -> dict[str, type]:
        return {**SweepConfig.config_classes(), "train": SmoothedTrainConfig}


def _csv_rows(path):
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_a_new_train_field_is_swept_recorded_and_selectable_with_no_other_edit(tmp_path, capsys):
    """The field of a TrainConfig subclass is a grid axis of the sweep, a column of
    outcomes.csv (read back typed) and a key of --where, and it keeps its two values' runs apart."""
    cfg = SmoothedSweepConfig.from_dict({**PRESETS["smoke"], "ratios": [0.9], "seeds": [0], "epochs": 10,
                                         "eval_every": 5, "checkpoint_every": 10,
                                         "grid": {"train.label_smoothing": [0.0, 0.1]}})
    assert [cell["train.label_smoothing"] for cell in cfg.cells()] == [0.0, 0.1]
    study = tmp_path / "study"
    result = run_sweep(cfg, study, workers=1, progress=False)
    assert len(result.rows) == 2 and len({row["run_dir"] for row in result.rows}) == 2
    recorded = {row["train.label_smoothing"]: row for row in read_outcomes_csv(study / OUTCOMES_CSV)}
    assert set(recorded) == {0.0, 0.1}  # a column of outcomes.csv, read back as numbers
    header = list(_csv_rows(study / OUTCOMES_CSV)[0])
    assert header.index("train.label_smoothing") < header.index("r")  # among the cell settings
    table = _csv_rows(study / "table.csv")
    assert sorted(row["train.label_smoothing"] for row in table) == ["0.0", "0.1"]  # two cells, not one

    assert main(["report", str(study), "--out", str(tmp_path / "selected"), "--where",
                 "train.label_smoothing=0.1"]) == 0
    capsys.readouterr()
    (selected,) = read_outcomes_csv(tmp_path / "selected" / OUTCOMES_CSV)
    assert selected["train.label_smoothing"] == 0.1
    assert selected["run_dir"] == recorded[0.1]["run_dir"]
    assert main(["report", str(study), "--out", str(tmp_path / "none"), "--where",
                 "train.label_smoothing=0.5"]) == 2
    assert "train.label_smoothing: 0, 0.1" in capsys.readouterr().err  # the values there, named


def _record(train: dict[str, Any], model: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"run_info": {"task": {"name": "max_parity_sum_parity", "label": "sum_parity", "shortcut": "max",
                                  "seq_len": 5, "n_values": 10, "r": 0.9, "n_train": 256, "n_eval": 128, "seed": 0}},
            "model_config": model or {"n_layers": 1, "n_heads": 2, "d_vocab": 11, "n_ctx": 6, "d_vocab_out": 2,
                                      "d_model": 32, "d_head": 16, "d_mlp": 64, "seed": 0},
            "train_config": train}


def test_extra_settings_are_fields_that_differ_from_their_default():
    default = TrainConfig(epochs=10, checkpoint_every=5, progress=False).to_dict()
    assert extra_settings(_record(default)) == {}  # bookkeeping (checkpoints, progress) and derived d_head: none
    changed = {**default, "betas": [0.9, 0.99], "seed": 3}
    assert extra_settings(_record(changed)) == {"train.betas": (0.9, 0.99), "train.seed": 3}
    wide_heads = {"n_layers": 1, "n_heads": 2, "d_vocab": 11, "n_ctx": 6, "d_vocab_out": 2, "d_model": 32,
                  "d_head": 32, "d_mlp": 64, "seed": 0, "act_fn": "gelu"}
    assert extra_settings(_record(default, wide_heads)) == {"model.d_head": 32, "model.act_fn": "gelu"}


def test_rows_without_an_extra_setting_read_as_its_default():
    old = {"task": "t", "r": 0.9}  # an outcomes.csv row of a version without the setting
    new = {"task": "t", "r": 0.9, "train.seed": 3}
    completed = complete_settings([old, new])
    assert completed[0]["train.seed"] == TrainConfig().seed and completed[1]["train.seed"] == 3
    # betas are named in every report, at their default too (the paper states none)
    assert completed[0]["train.betas"] == (0.9, 0.98) == completed[1]["train.betas"]
    # so are the warmup, the lr schedule and its floor, and clipping: none, constant, 0, none
    assert [completed[0][k] for k in ("train.warmup_steps", "train.lr_schedule", "train.min_lr_ratio",
                                      "train.grad_clip")] == [0, "constant", 0.0, None]
    assert cell_fields(completed) == CELL_FIELDS[:-1] + ("train.betas", "train.grad_clip", "train.lr_schedule",
                                                         "train.min_lr_ratio", "train.seed", "train.warmup_steps", "r")
    assert cell_fields([old]) == CELL_FIELDS  # no extra setting: the cells of earlier versions
    assert select_runs(completed, "train.seed=0") == [completed[0]]


def test_cell_specs_accept_section_fields_typed():
    assert parse_cell_spec("L=2,train.seed=3") == {"n_layers": 2, "train.seed": 3}
    assert parse_cell_spec("model.act_fn=gelu,train.batch_size=full") == {"model.act_fn": "gelu",
                                                                          "train.batch_size": None}
    with pytest.raises(UserError, match="SECTION.FIELD"):
        parse_cell_spec("optimizer.lr=0.1")


def test_steps_per_epoch_counts_the_trainers_minibatches_last_partial_included():
    import torch

    from interp_toolkit.runs.config import steps_per_epoch
    from interp_toolkit.runs.trainer import epoch_minibatches
    from interp_toolkit.studies.grid.cells import optimizer_clock

    for n, batch_size in ((10, 3), (10, 5), (10, 10), (10, 64), (16_384, 512), (2_000, 128), (7, None)):
        batches = list(epoch_minibatches(n, batch_size, torch.Generator().manual_seed(0), "cpu"))
        assert steps_per_epoch(n, batch_size) == len(batches), (n, batch_size)
    # 1,000 full-batch epochs at lr 1e-3, wd 0.1: 0.1 decay clocks; batch 512 of 16,384: 32x the steps
    assert optimizer_clock(16_384, None, 1e-3, 0.1, 1_000) == {"steps": 1_000, "lr_x_wd": 0.0001, "decay_clocks": 0.1}
    assert optimizer_clock(16_384, 512, 1e-3, 0.1, 1_000) == {"steps": 32_000, "lr_x_wd": 0.0001, "decay_clocks": 3.2}
    assert optimizer_clock(None, 512, 1e-3, None, 1_000) == {"steps": None, "lr_x_wd": None, "decay_clocks": None}


def test_a_scheduled_run_counts_the_decay_its_learning_rate_actually_applied():
    from interp_toolkit.studies.grid.cells import optimizer_clock, schedule_of

    # 4 steps of warmup then a linear decay to 0 over 6 more: factors by hand
    warm = [1 / 4, 2 / 4, 3 / 4, 4 / 4]
    decay = [1 - k / 6 for k in range(6)]  # t = 0, 1/6, ..., 5/6 before each post-warmup step
    row = {"train.warmup_steps": "4", "train.lr_schedule": "linear", "train.min_lr_ratio": "0.0"}
    clock = optimizer_clock(10, 5, 1e-3, 0.5, 5, schedule=row)  # 2 steps per epoch: 10 steps
    assert clock["steps"] == 10 and clock["lr_x_wd"] == 0.0005
    assert clock["decay_clocks"] == pytest.approx(0.0005 * (sum(warm) + sum(decay)), rel=1e-12)
    # an early-stopped run (3 of 5 planned epochs) counts the lr of its 6 steps on the planned schedule
    early = optimizer_clock(10, 5, 1e-3, 0.5, 3, schedule=row, planned_epochs=5)
    assert early["decay_clocks"] == pytest.approx(0.0005 * (sum(warm) + sum(decay[:2])), rel=1e-12)
    # cosine to a floor of 0.1 over 4 steps, no warmup: 1, (1 + cos(pi/4))/2 ..., each lifted to the floor
    cosine = {"train.lr_schedule": "cosine", "train.min_lr_ratio": 0.1}
    shape = [(1 + math.cos(math.pi * k / 4)) / 2 for k in range(4)]
    assert optimizer_clock(4, None, 1.0, 1.0, 4, schedule=cosine)["decay_clocks"] == pytest.approx(
        sum(0.1 + 0.9 * v for v in shape), rel=1e-12)
    # the defaults (and a row written before these columns existed) keep the constant clock exactly
    assert schedule_of({}) == {"warmup_steps": 0, "lr_schedule": "constant", "min_lr_ratio": 0.0}
    assert optimizer_clock(16_384, 512, 1e-3, 0.7, 300, schedule={"train.lr_schedule": "constant"}) == \
        optimizer_clock(16_384, 512, 1e-3, 0.7, 300) == {"steps": 9_600, "lr_x_wd": 0.0007, "decay_clocks": 6.72}
