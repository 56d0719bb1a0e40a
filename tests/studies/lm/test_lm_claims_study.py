"""interp_toolkit.studies.lm.claims_study (the claims study of examples/lm_bif_claims.py):
checkpoint order, sampler settings, resumed rows, the report, and the command line's refusals."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from interp_toolkit.errors import UserError
from interp_toolkit.studies.lm import claims_study as example
from interp_toolkit.studies.lm.claims_study import ClaimsStudyConfig

ROOT = Path(__file__).resolve().parents[3]


def test_transition_checkpoints_come_first_then_the_coarse_grid():
    steps = [0, 1, 2, 4, 8, 16, *range(25, 1001, 25)]
    scores = {s: 0.03 if s < 400 else (0.5 if s == 400 else 0.8) for s in steps}
    refs = [SimpleNamespace(step=s) for s in steps]
    order = [r.step for r in example.prioritized(refs, scores, coarse=100)]
    # 10%..90% of the rise (0.03 -> 0.8) is steps 400..425, widened by 50 steps each side,
    # from the formation step (400, the end of the steepest interval) outward
    assert order[:6] == [400, 375, 425, 350, 450, 475]
    assert order[6:] == [0, 100, 200, 300, 500, 600, 700, 800, 900, 1000]
    assert len(order) == len(set(order))


def test_sampler_settings_come_from_the_calibration_unless_given(tmp_path):
    args = ClaimsStudyConfig(out=tmp_path, chains=8, draws=200, burn_in=200)
    assert (example.sampler_config(args).eps, example.sampler_config(args).gamma) == (1e-4, 100.0)
    (tmp_path / "calibration.json").write_text(json.dumps({"recommended_setting": {"eps": 3e-4, "gamma": 300.0}}))
    config = example.sampler_config(args)
    assert (config.eps, config.gamma, config.chains, config.draws, config.burn_in) == (3e-4, 300.0, 8, 200, 200)
    args.eps = 1e-3
    assert example.sampler_config(args).eps == 1e-3 and example.sampler_config(args).gamma == 300.0


def _seed_study(study, seed, eps=1e-3, total_steps=200):
    from interp_toolkit.analyses.bif import SamplerConfig
    from interp_toolkit.analyses.bif.lm import LMBIFConfig

    rows = [{"step": step, "seed": seed, "series": "induction->induction", "source_class": "induction",
             "target_class": "induction", "minus": None, "bif": bif, "stderr": 0.1, "rhat": 1.01, "ess": 300.0,
             "induction_score": score}
            for step, bif, score in ((0, -0.1, 0.03), (100, -2.0, 0.5), (200, -0.5, 0.8))]
    config = LMBIFConfig(SamplerConfig(eps=eps, chains=8, draws=400, burn_in=200),
                         reductions=("class:class", "class:all"))
    example.write_seed_rows(study / f"seed{seed}", config, rows)
    (study / f"seed{seed}" / "testbed").mkdir(parents=True, exist_ok=True)
    testbed = example.testbed_config(seed, total_steps, 100)
    (study / f"seed{seed}" / "testbed" / "testbed.json").write_text(json.dumps({"config": testbed.to_dict()}))


def test_report_merges_seeds_and_writes_verdicts(tmp_path, capsys):
    from interp_toolkit.studies.lm.claims import read_claims_csv

    for seed in (0, 1):
        _seed_study(tmp_path / "study", seed)
    verdicts = example.report_claims(tmp_path / "study", tmp_path / "docs")
    assert len(read_claims_csv(tmp_path / "docs" / "claims.csv")) == 6
    assert json.loads((tmp_path / "docs" / "claims_study.json").read_text()) == {
        "total_steps": 200, "checkpoint_every": 100,
        "sampler": {"chains": 8, "draws": 400, "burn_in": 200, "eps": 1e-3, "gamma": 100.0}}
    assert verdicts == json.loads((tmp_path / "docs" / "verdicts.json").read_text())
    assert [r["verdict"] for r in verdicts["induction->induction"]["rise_and_fall"]] == ["rise and fall"] * 2
    assert (tmp_path / "docs" / "claim_induction_to_induction.png").is_file()
    assert "induction->induction seed 1: rise and fall (peak -2.00e+00 at step 100" in capsys.readouterr().out


def test_a_run_on_some_steps_keeps_the_rows_of_the_same_settings(tmp_path):
    from interp_toolkit.analyses.bif import SamplerConfig
    from interp_toolkit.analyses.bif.lm import LMBIFConfig
    from interp_toolkit.studies.lm.claims import write_claims_csv

    config = LMBIFConfig(SamplerConfig(eps=1e-3), reductions=("class:class", "class:all"))
    assert example.earlier_rows(tmp_path, config) == []  # nothing yet
    row = {"step": 375, "seed": 1, "series": "induction->induction", "source_class": "induction",
           "target_class": "induction", "minus": None, "bif": -0.004, "stderr": 0.001, "rhat": 1.02, "ess": 300.0,
           "induction_score": 0.4}
    write_claims_csv([row], tmp_path / "claims.csv")
    assert example.earlier_rows(tmp_path, config) == []  # a CSV without its settings record is not trusted
    example.write_seed_rows(tmp_path, config, [row])
    kept = example.earlier_rows(tmp_path, config)
    assert [(r["step"], r["bif"]) for r in kept] == [(375, -0.004)]
    other = LMBIFConfig(SamplerConfig(eps=1e-4), reductions=("class:class", "class:all"))
    assert example.earlier_rows(tmp_path, other) == []  # measured with other settings: not mixed in
    assert [(r["step"], r["bif"]) for r in example.earlier_rows(tmp_path, config)] == [(375, -0.004)]  # read only


def test_steps_not_on_the_checkpoint_schedule_are_refused_before_any_work(tmp_path):
    args = ClaimsStudyConfig(out=tmp_path, steps=[375, 380], seeds=[0])
    with pytest.raises(UserError, match=r"--steps \[380\]: the testbed has no checkpoint there"):
        example.run_claims(args)
    assert list(tmp_path.iterdir()) == []  # nothing trained, nothing written


@pytest.mark.parametrize("argv, needle", [
    (["--stage", "run", "--coarse", "0"], "argument --coarse: expected an integer >= 1, got 0"),
    (["--stage", "run", "--checkpoint-every", "0"], "argument --checkpoint-every: expected an integer >= 1, got 0"),
    (["--stage", "run", "--total-steps", "10000", "--checkpoint-every", "250", "--steps", "9900", "--out", "OUT"],
     "--steps [9900]: the testbed has no checkpoint there"),
    (["--stage", "run", "--chains", "0"], "argument --chains: expected an integer >= 2, got 0"),
    (["--stage", "run", "--eps", "inf"], "argument --eps: expected a positive finite number, got inf"),
    (["--stage", "run", "--out", "/dev/null"], "--out /dev/null is a file, not a folder"),
    (["--stage", "run", "--steps", "99999", "--out", "OUT"], "--steps [99999]: the testbed has no checkpoint there"),
    (["--stage", "report", "--out", "OUT", "--docs", "DOCS"], "holds no seed*/claims.csv to report"),
    (["--stage", "bogus"], "argument --stage: invalid choice: 'bogus'"),
])
def test_bad_arguments_exit_2_with_one_error_line_before_any_work(argv, needle, tmp_path):
    import subprocess
    import sys

    argv = [str(tmp_path / "out") if a == "OUT" else str(tmp_path / "docs") if a == "DOCS" else a for a in argv]
    (tmp_path / "out").mkdir()
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "lm_bif_claims.py"), *argv],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["out"]  # nothing trained, nothing written


@pytest.mark.parametrize("settings, needle", [
    ({"chains": 1}, "ClaimsStudyConfig.chains must be an integer >= 2, got 1"),
    ({"seeds": []}, "ClaimsStudyConfig.seeds must be a non-empty list"),
    ({"eps": float("nan")}, "ClaimsStudyConfig.eps must be a positive finite number or None, got nan"),
    ({"total_steps": 0}, "ClaimsStudyConfig.total_steps must be an integer >= 1, got 0"),
    ({"checkpoint_every": 0}, "ClaimsStudyConfig.checkpoint_every must be an integer >= 1, got 0"),
])
def test_the_study_config_refuses_bad_settings_by_name(settings, needle):
    with pytest.raises(UserError, match=needle):
        ClaimsStudyConfig(**settings)


def test_a_longer_testbed_keeps_the_committed_schedule_and_adds_to_it():
    short, long = example.testbed_config(0), example.testbed_config(0, 4000)
    assert short.total_steps == 1000 and long.total_steps == 4000
    assert set(short.checkpoint_steps) <= set(long.checkpoint_steps) and long.checkpoint_steps[-1] == 4000


def test_a_long_testbed_can_space_its_checkpoints_wider_and_is_a_new_testbed():
    sparse = example.testbed_config(0, 10000, 250)
    assert sparse.checkpoint_steps[-3:] == [9500, 9750, 10000] and 9900 not in sparse.checkpoint_steps
    assert sparse.to_dict() != example.testbed_config(0, 10000).to_dict()  # a different config: its own cache
    assert example.testbed_config(0).checkpoint_steps == example.testbed_config(0, 1000, 25).checkpoint_steps


def test_a_report_of_seeds_measured_differently_is_refused_naming_the_setting(tmp_path):
    _seed_study(tmp_path / "study", 0)
    _seed_study(tmp_path / "study", 1, eps=3e-4)
    with pytest.raises(UserError, match="the seeds' sampler settings differ"):
        example.report_claims(tmp_path / "study", tmp_path / "docs")
    assert not (tmp_path / "docs").exists()  # refused before anything is written
