"""SweepConfig's sections: flat names of earlier versions, run keys and study keys unchanged."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from interp_toolkit.cli.sweep import parse
from interp_toolkit.errors import UserError
from interp_toolkit.studies.sweep import plan_jobs
from interp_toolkit.studies.sweep_config import PRESETS, SweepConfig, cell_configs, preset

ROOT = Path(__file__).resolve().parents[2]


def test_every_committed_run_is_a_run_of_the_committed_configs():
    """Run directory names hash every config of a run: the configs of examples/reproduction,
    read through the sections, name every run of docs/reproduction/outcomes.csv (trained by
    earlier versions) exactly as it was named then."""
    planned = set()
    for path in sorted((ROOT / "examples" / "reproduction").glob("*.yaml")):
        cfg = parse(["--config", str(path)]).sweep
        planned |= {Path(run["run_dir"]).name for job in plan_jobs(cfg, Path("/study")) for run in job["runs"]}
    with open(ROOT / "docs" / "reproduction" / "outcomes.csv", newline="", encoding="utf-8") as handle:
        committed = {Path(row["run_dir"]).name for row in csv.DictReader(handle)}
    assert len(committed) > 100 and committed <= planned


def test_flat_names_and_sections_are_one_config():
    flat = SweepConfig.from_dict({"seq_len": 6, "lr": 3e-3, "d_model": 32, "d_mlp": 64, "data_seed": 2,
                                  "batch_size": 128, "n_heads": [1]})
    nested = SweepConfig.from_dict({"task": {"seq_len": 6, "seed": 2}, "model": {"d_model": 32, "d_mlp": 64},
                                    "train": {"lr": 3e-3, "batch_size": 128}, "n_heads": [1]})
    dotted = SweepConfig.from_dict({"task.seq_len": 6, "task.seed": 2, "model.d_model": 32, "model.d_mlp": 64,
                                    "train.lr": 3e-3, "train.batch_size": 128, "n_heads": [1]})
    assert flat == nested == dotted
    assert (flat.seq_len, flat.lr, flat.data_seed, flat.betas) == (6, 3e-3, 2, (0.9, 0.98))
    assert flat.train["checkpoint_every"] == 500  # the sweep's own default, kept under a partial section
    assert SweepConfig.from_dict(flat.to_dict()) == flat == SweepConfig.from_dict(flat.flat_dict())
    assert flat.replace(lr=1e-3).lr == 1e-3 and flat.replace(lr=1e-3).seq_len == 6


def test_a_study_record_of_an_earlier_version_reads_as_the_same_sweep():
    """study.json of earlier versions holds the flat config: the same sweep, key included."""
    cfg = preset("reproduce")
    flat_record = json.loads(json.dumps(cfg.flat_dict()))
    assert SweepConfig.from_dict(flat_record) == cfg
    assert SweepConfig.from_dict(flat_record).key() == cfg.key()
    assert "task" not in flat_record and flat_record["epochs"] == 1000


def test_non_default_section_fields_are_in_the_key_and_grid_axes_are_cells():
    base = preset("smoke")
    other = preset("smoke", **{"train.seed": 1})
    assert other.flat_dict()["train.seed"] == 1 and "train.seed" not in base.flat_dict()
    assert other.study_key() != base.study_key()
    assert preset("smoke", **{"train.engine": "bridge"}).key() == base.key()  # how, not what
    grown = preset("smoke", grid={"train.batch_size": [64, None]})
    assert grown.study_key() == base.study_key()  # a grid axis only grows the grid
    assert len(grown.cells()) == 2 * len(base.cells())
    batch_sizes = {cell_configs(grown, cell, 0)[2].batch_size for cell in grown.cells()}
    assert batch_sizes == {64, None}


@pytest.mark.parametrize("data, match", [
    ({"lr": 1e-3, "train": {"lr": 3e-3}}, "disagree"),
    ({"train": {"weight_decay": 0.4}}, "weight_decays"),
    ({"model": {"n_layers": 2}}, "n_layers"),
    ({"train": {"bogus": 1}}, "bogus"),
    ({"grid": {"train.bogus": [1]}}, "train.bogus"),
    ({"grid": {"train.lr": []}}, "non-empty"),
    ({"optimizer": {}}, "SECTION.FIELD"),
])
def test_bad_sections_are_named(data, match):
    with pytest.raises(UserError, match=match):
        SweepConfig.from_dict({**PRESETS["smoke"], **data})


def test_sweep_flags_cover_every_section_field():
    parsed = parse(["--preset", "smoke", "--train-seed", "3", "--model-act-fn", "gelu", "--grid",
                    "train.batch_size=64,none", "--seq-len", "6"]).sweep
    assert parsed.train["seed"] == 3 and parsed.model["act_fn"] == "gelu" and parsed.seq_len == 6
    assert parsed.grid == {"train.batch_size": [64, None]}
