"""SweepConfig's sections: flat names of earlier versions, run keys and study keys unchanged."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from interp_toolkit.cli.sweep import parse
from interp_toolkit.errors import UserError
from interp_toolkit.studies.grid.config import PRESETS, SweepConfig, cell_configs, preset
from interp_toolkit.studies.sweep.run import plan_jobs
from interp_toolkit.tasks.mpsp import TASKS, task_modulus

ROOT = Path(__file__).resolve().parents[3]


def test_every_committed_run_is_a_run_of_the_committed_configs():
    """Run directory names hash every config of a run: the configs of examples/reproduction
    (the regime search's in its regime/ folder included), read through the sections, name every
    run of docs/reproduction/outcomes.csv (trained by earlier versions) exactly as it was named
    then."""
    planned = set()
    for path in sorted((ROOT / "examples" / "reproduction").rglob("*.yaml")):
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
    assert (flat.task.seq_len, flat.train.lr, flat.task.seed, tuple(flat.train.betas)) == (
        6, 3e-3, 2, (0.9, 0.98))
    assert flat.train["checkpoint_every"] == 500  # the sweep's own default, kept under a partial section
    assert SweepConfig.from_dict(flat.to_dict()) == flat == SweepConfig.from_dict(flat.flat_dict())
    assert flat.replace(lr=1e-3).train.lr == 1e-3 and flat.replace(lr=1e-3).task.seq_len == 6


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
    parsed = parse(["--preset", "smoke", "--train.seed", "3", "--model.act-fn", "gelu", "--grid",
                    "train.batch_size=64,none", "--seq-len", "6", "--train.lr=0.002"]).sweep
    assert parsed.train["seed"] == 3 and parsed.model["act_fn"] == "gelu" and parsed.task.seq_len == 6
    assert parsed.train["lr"] == 0.002
    assert parsed.grid == {"train.batch_size": [64, None]}


def test_sweep_and_train_spell_every_setting_alike(capsys):
    """One flag style: a section field is --SECTION.FIELD in both commands, and each short flag of
    the shared table means the same field in both."""
    from interp_toolkit.cli import train as train_cli
    from interp_toolkit.cli.flags import SHORT_FLAGS

    for short, nested in SHORT_FLAGS.items():
        assert train_cli.ALIASES[short] == nested  # train takes the shared table as it is
    value = {"--seq-len": "6", "--n-values": "12", "--n-train": "300", "--n-eval": "50", "--data-seed": "4",
             "--d-model": "24", "--d-mlp": "40", "--epochs": "7", "--lr": "0.004", "--batch-size": "32",
             "--eval-every": "3", "--checkpoint-every": "6"}
    for short, text in value.items():
        section, name = SHORT_FLAGS[short][2:].replace("-", "_").split(".")
        by_short = getattr(parse(["--preset", "smoke", short, text]).sweep, section)[name]
        by_nested = getattr(parse(["--preset", "smoke", SHORT_FLAGS[short], text]).sweep, section)[name]
        assert by_short == by_nested == type(by_short)(text), short
        trained = train_cli.parse([SHORT_FLAGS[short], text, "--train.no-progress"])
        assert getattr(getattr(trained, section), name) == by_short, short
    help_text = _help(["--help"])
    assert "--train.seed" in help_text and "--model.act-fn" in help_text and "--train-seed" not in help_text


def _help(argv):
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parse(argv)
    return out.getvalue()


@pytest.mark.parametrize("bad, match", [
    ({"ratios": [1.5]}, "1.5"),
    ({"ratios": ["half"]}, "chance"),
    ({"transient_tolerance": 0}, "transient_tolerance"),
    ({"transient_min_span": 0}, "transient_min_span"),
    ({"ratios": []}, "ratios must be a non-empty list"),
    ({"n_layers": [0]}, "n_layers"),
    ({"seeds": [0, 0]}, "duplicates"),
    ({"tasks": ["nope"]}, "nope"),
    ({"epochs": 0}, "epochs"),
    ({"weight_decays": [-0.1]}, "weight_decays"),
    ({"bogus": 1}, "bogus"),
])
def test_sweep_config_validation(bad, match):
    with pytest.raises(UserError, match=match):
        SweepConfig.from_dict({**preset("smoke").flat_dict(), **bad})


def test_outcome_only_fields_leave_the_study_key_alone():
    base = preset("quick")
    assert preset("quick", transient_min_span=5, transient_tolerance=0.9).key() == base.key()
    assert preset("quick", threshold=0.99).key() != base.key()  # it decides early stopping


def test_presets_follow_the_protocol():
    paper = preset("paper")
    assert paper.task.n_train == 16_384 and paper.train.epochs == 15_000 and len(paper.seeds) >= 30
    assert set(paper.n_layers) == {1, 2} and set(paper.n_heads) == {1, 2}
    assert set(paper.weight_decays) == {0.1, 0.4} and not paper.early_stop
    # the four task variants, r in {0.1, 0.3, 1/m, 0.5, 0.7, 0.9} with 1/m per task
    assert set(paper.tasks) == set(TASKS)
    for task in paper.tasks:
        chance = 1 / task_modulus(task)
        assert sorted(paper.task_ratios(task)) == pytest.approx(sorted({0.1, 0.3, chance, 0.5, 0.7, 0.9}))
    assert {(c["task"], round(c["r"], 6)) for c in paper.cells()} >= {("max_mod3_sum_mod3", 0.333333),
                                                                     ("first_parity_sum_parity", 0.5)}
    thresholds = paper.outcome_thresholds()
    assert (thresholds.threshold, thresholds.transient_tolerance, thresholds.transient_min_span) == (1.0, 0.99, 3)
    quick = preset("quick")
    assert {0.5, 0.9} <= set(quick.ratios) and set(quick.n_layers) == {1, 2}


def test_reproduce_preset_is_the_calibrated_regime_with_fresh_seeds():
    """The reproduce preset keeps the calibration study's settings (examples/reproduction/
    calibration.yaml) for its headline cells, with 16 seeds none of which the calibration used."""
    from pathlib import Path

    from interp_toolkit.cli.sweep import parse

    calibration = parse(["--config", str(Path(__file__).parents[3] / "examples/reproduction/calibration.yaml")]).sweep
    final = preset("reproduce")
    shared = ("tasks", "seq_len", "n_values", "n_train", "n_eval", "data_seed", "d_model", "d_mlp", "epochs", "lr",
              "betas", "eval_every", "early_stop", "threshold")  # flat_dict's names
    assert {k: final.flat_dict()[k] for k in shared} == {k: calibration.flat_dict()[k] for k in shared}
    assert len(final.seeds) >= 16 and not set(final.seeds) & set(calibration.seeds)
    assert {0.5, 0.9} <= set(final.task_ratios("max_parity_sum_parity")) and min(final.ratios) < 0.5
    assert 0.4 in final.weight_decays and set(final.n_layers) == {1, 2}
    assert final.name != calibration.name  # the report keeps the two studies' cells apart


@pytest.mark.parametrize("slice_file, n_runs, extra_seeds", [("final_1L.yaml", 60, range(116, 130)),
                                                             ("final_2L.yaml", 32, ()),
                                                             ("final_1L_below_chance.yaml", 16, ()),
                                                             ("final_1L_r_sweep.yaml", 32, ()),
                                                             ("final_2L_below_chance.yaml", 16, ())])
def test_reproduce_slices_are_runs_of_the_reproduce_preset(slice_file, n_runs, extra_seeds, tmp_path):
    """The slice configs train a subset of the preset's runs, in the same run directories
    (so slices, invocations and the full preset pool in one report). The 1-layer slice grew to the
    paper's 30 seeds per cell: its extra seeds are the preset's runs at more seeds, nothing else."""
    from interp_toolkit.cli.sweep import parse

    part = parse(["--config", str(Path(__file__).parents[3] / "examples/reproduction" / slice_file)]).sweep
    names = {Path(run["run_dir"]).name for job in plan_jobs(part, tmp_path) for run in job["runs"]}
    full_preset = preset("reproduce", seeds=[*preset("reproduce").seeds, *extra_seeds])
    full = {Path(run["run_dir"]).name for job in plan_jobs(full_preset, tmp_path) for run in job["runs"]}
    assert len(names) == n_runs and names <= full
    assert set(part.seeds) - set(preset("reproduce").seeds) == set(extra_seeds)
    assert part.name == preset("reproduce").name


@pytest.mark.parametrize("arm_file, n_layers, n_runs", [("final_1L_wd04.yaml", 1, 8), ("final_2L_wd04.yaml", 2, 16)])
def test_wd04_arms_are_the_reproduce_preset_without_early_stop(arm_file, n_layers, n_runs, tmp_path):
    """Transience needs full runs: each weight-decay-0.4 arm is the preset's wd 0.4 runs of one
    architecture with early stopping off, nothing else changed."""
    from interp_toolkit.cli.sweep import parse

    part = parse(["--config", str(Path(__file__).parents[3] / "examples/reproduction" / arm_file)]).sweep
    assert part.early_stop is False and part.weight_decays == [0.4] and part.n_layers == [n_layers]
    names = {Path(run["run_dir"]).name for job in plan_jobs(part, tmp_path) for run in job["runs"]}
    full = {Path(run["run_dir"]).name
            for job in plan_jobs(preset("reproduce", early_stop=False), tmp_path) for run in job["runs"]}
    assert len(names) == n_runs and names <= full


@pytest.mark.parametrize("length", [6, 7])
def test_length_calibrations_change_only_the_length(length):
    """The length-6 and -7 calibrations are the calibration study at another sequence length."""
    from interp_toolkit.cli.sweep import parse

    root = Path(__file__).parents[3] / "examples/reproduction"
    base = parse(["--config", str(root / "calibration.yaml")]).sweep.flat_dict()
    other = parse(["--config", str(root / f"calibration_len{length}.yaml")]).sweep.flat_dict()
    differing = {k for k in base if base[k] != other[k]}
    assert differing == {"name", "seq_len", "n_layers", "seeds"}
    assert other["seq_len"] == length and other["n_layers"] == [2]
    assert other["name"] == f"reproduction_calibration_len{length}"


def _run_identities(long, short, seed):
    """(short run, long run) identities of each cell of ``long`` at ``seed``: the model, train and
    run-info configs ``--extend-from`` compares to find a run's source, with the train config's
    non-semantic fields kept (the sweep drops them before comparing, so this is stricter)."""
    from interp_toolkit.studies.grid.config import cell_configs

    pairs = []
    for cell in long.cells():
        ident = [{"model": model.to_dict(), "train": train.to_dict(), "info": info}
                 for _, model, train, info in (cell_configs(sweep, cell, seed) for sweep in (short, long))]
        pairs.append((ident[0], ident[1]))
    return pairs


@pytest.mark.parametrize("long_file, short_file", [("final_2L_3000.yaml", "final_2L.yaml"),
                                                  ("final_1L_r_sweep_3000.yaml", "final_1L_r_sweep.yaml"),
                                                  ("final_2L_wd04_3000.yaml", "final_2L_wd04.yaml")])
def test_3000_epoch_configs_continue_their_1000_epoch_slices(long_file, short_file):
    """Their runs are the 1,000-epoch slice's runs at 3,000 epochs: identical but for epochs, so
    `--extend-from` finds each one's source."""
    from interp_toolkit.cli.sweep import parse
    from interp_toolkit.runs.extend import identity_differences

    root = Path(__file__).parents[3] / "examples/reproduction"
    long = parse(["--config", str(root / long_file)]).sweep
    short = parse(["--config", str(root / short_file)]).sweep
    differing = {k for k, v in long.flat_dict().items() if short.flat_dict()[k] != v}
    assert differing <= {"epochs", "seeds"} and (long.train.epochs, short.train.epochs) == (3000, 1000)
    assert set(long.seeds) <= set(short.seeds)
    for short_run, long_run in _run_identities(long, short, long.seeds[0]):
        assert identity_differences(short_run, long_run) == []
        assert identity_differences(short_run, long_run, ignore=()) == ["train.epochs"]


@pytest.mark.parametrize("long_file, short_file", [
    ("axes_c_len8_b512_wd0.1_1500ep_2L.yaml", "axes_c_len8_b512_wd0.1_750ep_2L.yaml"),
    ("axes_c_len8_b512_wd0.1_1500ep_1L.yaml", "axes_c_len8_b512_wd0.1_750ep_1L.yaml"),
    ("axes_d_len6_n32k_wd0.1_2L_confirm_1500ep.yaml", "axes_d_len6_n32k_wd0.1_2L_confirm.yaml"),
    ("axes_d_len6_n32k_wd0.1_1L_confirm_1500ep.yaml", "axes_d_len6_n32k_wd0.1_1L_confirm.yaml")])
def test_regime_extensions_continue_the_runs_of_the_study_they_name(long_file, short_file):
    """A regime config that trains a study on (``extend_from``) names that study's folder, and
    its runs are that study's runs but for the horizon, so every one of them is extended rather
    than started again."""
    from interp_toolkit.cli.sweep import parse
    from interp_toolkit.runs.extend import identity_differences

    root = Path(__file__).parents[3] / "examples/reproduction/regime"
    long_args, short_args = (parse(["--config", str(root / name)]) for name in (long_file, short_file))
    long, short = long_args.sweep, short_args.sweep
    assert long_args.extend_from == [short_args.out]
    differing = {k for k, v in long.flat_dict().items() if short.flat_dict()[k] != v}
    assert differing <= {"name", "epochs", "seeds"} and long.train.epochs > short.train.epochs
    assert set(short.seeds) <= set(long.seeds)
    for short_run, long_run in _run_identities(long, short, short.seeds[0]):
        assert identity_differences(short_run, long_run) == []


def test_data_seeds_follow_the_model_seed_or_stay_fixed():
    from interp_toolkit.studies.grid.config import SweepConfig, cell_configs

    fixed = SweepConfig(n_layers=[1], ratios=[0.9], seeds=[3, 4])
    tied = SweepConfig(n_layers=[1], ratios=[0.9], seeds=[3, 4], data_seeds="model")
    cell = fixed.cells()[0]
    assert [cell_configs(fixed, cell, s)[0].seed for s in (3, 4)] == [0, 0]  # one dataset
    assert [cell_configs(tied, tied.cells()[0], s)[0].seed for s in (3, 4)] == [3, 4]  # a dataset per seed
    assert "data_seeds" not in fixed.flat_dict() and tied.flat_dict()["data_seeds"] == "model"
    assert fixed.key() != tied.key() and fixed.study_key() != tied.study_key()
    with pytest.raises(UserError, match="data_seeds"):
        SweepConfig(data_seeds="fresh")
    with pytest.raises(UserError, match="task.seed"):
        SweepConfig(data_seeds="model", grid={"task.seed": [0, 1]})


def test_a_dataset_per_seed_means_a_job_per_seed():
    """Stacked seeds share one dataset: with data_seeds 'model' no job stacks two seeds."""
    from interp_toolkit.studies.grid.config import SweepConfig
    from interp_toolkit.studies.sweep.resources import seeds_per_job

    assert seeds_per_job(SweepConfig(seeds=[1, 2, 3], seeds_per_process=3)) == 3
    assert seeds_per_job(SweepConfig(seeds=[1, 2, 3], seeds_per_process=3, data_seeds="model")) == 1
    assert seeds_per_job(SweepConfig(seeds=[1, 2, 3], data_seeds="model"), on_gpu=True) == 1


def test_sections_are_typed_partial_configs_that_read_as_mappings():
    import pickle

    from interp_toolkit.model import ModelConfig
    from interp_toolkit.runs.config import TrainConfig
    from interp_toolkit.studies.grid.config import Section

    cfg = SweepConfig.from_dict({"seq_len": 6, "lr": 2e-3, "model": {"d_model": 32}})
    assert isinstance(cfg.train, Section) and cfg.train.config_class is TrainConfig
    # a mapping as config files spell it, and attributes as the config spells them
    assert cfg.train["lr"] == cfg.train.lr == 2e-3 and cfg.task.seq_len == 6
    assert "weight_decay" not in cfg.train and "n_layers" not in cfg.model  # per-run fields are not settings
    built = cfg.train.build(weight_decay=0.3, progress=False)
    assert isinstance(built, TrainConfig) and (built.lr, built.weight_decay, built.checkpoint_every) == (2e-3, 0.3, 500)
    assert isinstance(cfg.model.build(n_layers=1, n_heads=2, seed=0, d_vocab=12, n_ctx=7, d_vocab_out=2), ModelConfig)
    with pytest.raises(AttributeError, match="read-only"):
        cfg.train.lr = 1.0
    with pytest.raises(AttributeError, match="no setting 'learning_rate'"):
        cfg.train.learning_rate  # noqa: B018
    # JSON as before (study records), equal after a round trip and across processes (pickled to workers)
    assert cfg.to_dict()["train"] == dict(cfg.train) and isinstance(cfg.to_dict()["train"], dict)
    again = SweepConfig.from_dict(cfg.to_dict())
    assert again == cfg and again.key() == cfg.key()
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert cfg.replace(lr=1e-3).train.lr == 1e-3 and cfg.train.lr == 2e-3


def test_a_section_names_a_bad_field_and_a_per_run_one():
    with pytest.raises(UserError, match=r"unknown TrainConfig keys \['learning_rate'\] in SweepConfig.train"):
        SweepConfig.from_dict({"train": {"learning_rate": 1e-3}})
    with pytest.raises(UserError, match=r"SweepConfig.train.weight_decay is set per run \(set weight_decays instead\)"):
        SweepConfig.from_dict({"train": {"weight_decay": 0.1}})
    with pytest.raises(UserError, match="SweepConfig.model must be a mapping"):
        SweepConfig.from_dict({"model": [1, 2]})
