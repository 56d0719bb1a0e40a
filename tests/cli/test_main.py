"""Every subcommand through ``interp_toolkit.cli.main`` (the console-script path).

Success returns 0; a bad value, a missing file or a checkpoint of another task returns 2
with exactly one ``error:`` line on stderr and no traceback. A run trained with non-default
task settings is read back by ``bif``, ``analyze`` and ``info`` through its run record.
"""

from __future__ import annotations

import json

import pytest
import torch

from interp_toolkit.cli import COMMANDS, main
from interp_toolkit.runs.record import read_record
from interp_toolkit.runs.trainer import list_checkpoints
from interp_toolkit.studies.grid.outcome_table import read_outcomes_csv

torch.set_num_threads(1)

# Non-default r, n_train and seq_len (defaults: 0.9, 16384, 10), and a non-default n_values.
TASK = {"r": 0.5, "n_train": 96, "seq_len": 4, "n_values": 6, "n_eval": 32}
TRAIN = ["train", "--r", "0.5", "--n-train", "96", "--seq-len", "4", "--n-values", "6", "--n-eval", "32",
         "--d-model", "16", "--d-mlp", "16", "--epochs", "4", "--eval-every", "2", "--checkpoint-every", "2",
         "--quiet"]
BIF_FAST = [
    "--n-attribution", "8", "--n-query", "4", "--no-adaptive", "--chains", "2", "--draws", "3", "--burn-in", "2",
    "--batch-size", "32", "--eps", "1e-4", "--no-progress",
]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_user_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("cli") / "run"
    assert main([*TRAIN, "--run-dir", str(run)]) == 0
    return run


def test_train_records_the_task_it_trained_on(cli_run):
    task = read_record(cli_run)["run_info"]["task"]
    assert {k: task[k] for k in TASK} == TASK
    assert task["name"] == "max_parity_sum_parity"


def test_info_reads_the_task_from_the_run_record(cli_run, capsys):
    code, out, _ = run_cli(capsys, "info", cli_run)
    assert code == 0
    task = json.loads(out.splitlines()[1].split("task:", 1)[1])
    assert {k: task[k] for k in TASK} == TASK
    last = list_checkpoints(cli_run)[-1][1]
    code, out, _ = run_cli(capsys, "info", last)
    assert code == 0
    run_line = next(line for line in out.splitlines() if line.startswith("run "))
    task = json.loads(run_line.split("task:", 1)[1])
    assert {k: task[k] for k in TASK} == TASK


def test_bif_uses_the_run_records_task_and_writes_it(cli_run, tmp_path, capsys):
    last = list_checkpoints(cli_run)[-1][1]
    code, out, err = run_cli(capsys, "bif", last, "--out", tmp_path / "bif", *BIF_FAST)
    assert code == 0, err
    (folder,) = (tmp_path / "bif").glob("bif_*")
    summary = json.loads((folder / "summary.json").read_text())
    assert {k: summary["task"][k] for k in TASK} == TASK
    assert summary["task_source"] == str(cli_run / "run.json")
    assert "task (" in out and '"n_train": 96' in out


def test_bif_refuses_a_checkpoint_of_another_task(cli_run, tmp_path, capsys):
    from interp_toolkit.tasks.mpsp import MPSPConfig

    last = list_checkpoints(cli_run)[-1][1]
    other = tmp_path / "other.json"
    other.write_text(json.dumps(MPSPConfig(**{**TASK, "seq_len": 5}).to_dict()))
    code, _, err = run_cli(capsys, "bif", last, "--task-config", other, "--out", tmp_path / "o", *BIF_FAST)
    assert_user_error(code, err, "seq_len 4 (requested 5)")
    assert not (tmp_path / "o").exists()
    # the same task config as the record is accepted
    same = tmp_path / "same.json"
    same.write_text(json.dumps(MPSPConfig(**TASK).to_dict()))
    code, _, err = run_cli(capsys, "bif", last, "--task-config", same, "--out", tmp_path / "o", *BIF_FAST)
    assert code == 0, err
    # a loose checkpoint with the task config of another task: the model does not fit it
    loose = tmp_path / "loose.safetensors"
    loose.write_bytes(last.read_bytes())
    code, _, err = run_cli(capsys, "bif", loose, "--task-config", other, "--out", tmp_path / "o2", *BIF_FAST)
    assert_user_error(code, err, "another task", "n_ctx")


def test_analyze_rebuilds_the_run_records_data(cli_run, tmp_path, capsys):
    code, out, err = run_cli(capsys, "analyze", cli_run, "--analysis", "gradients", "--n", "16", "--last",
                             "--out-dir", tmp_path / "a", "--no-plot", "--no-progress")
    assert code == 0, err
    task = json.loads(out.splitlines()[0].split(":", 1)[1])
    assert {k: task[k] for k in TASK} == TASK
    assert (tmp_path / "a" / "gradients_epochs_4.csv").is_file()  # --last: named by its epoch


def test_demo_sweep_report_through_main(tmp_path, capsys):
    code, out, err = run_cli(capsys, "demo", "--out", tmp_path / "demo", "--epochs", "2", "--n-train", "64")
    assert code == 0, err
    assert (tmp_path / "demo" / "summary.json").is_file() and "demo run" in out
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    if summary["first_generalized_epoch"] is None:  # 2 epochs: short of 100%, and the printout says how far
        assert summary["near_miss"]["best_adv_acc"] == summary["max_adv_acc"]
        assert f"short of 100%: {summary['near_miss']['text']}" in out and "still wrong" in out
    else:
        assert summary["near_miss"] == {}
    study = tmp_path / "study"
    code, out, err = run_cli(capsys, "sweep", "--preset", "smoke", "--ratios", "0.9", "--layers", "1", "--heads", "1",
                             "--seeds", "1", "--epochs", "2", "--n-train", "64", "--n-eval", "32", "--eval-every",
                             "1", "--workers", "1", "--out", study, "--quiet")
    assert code == 0, err
    assert "1 runs" in out
    code, out, err = run_cli(capsys, "report", study, "--out", tmp_path / "report")
    assert code == 0, err
    assert (tmp_path / "report" / "table.csv").is_file()
    # every run's task and training settings, as the sweep recorded them in run.json
    (row,) = read_outcomes_csv(tmp_path / "report" / "outcomes.csv")
    assert {k: row[k] for k in ("task", "seq_len", "n_values", "n_train", "n_eval", "data_seed", "n_layers", "n_heads",
                                "d_model", "d_mlp", "weight_decay", "lr", "epochs", "eval_every", "early_stop",
                                "r", "seed")} == {
        "task": "max_parity_sum_parity", "seq_len": 5, "n_values": 10, "n_train": 64, "n_eval": 32, "data_seed": 0,
        "n_layers": 1, "n_heads": 1, "d_model": 32, "d_mlp": 64, "weight_decay": 0.1, "lr": 0.003, "epochs": 2,
        "eval_every": 1, "early_stop": False, "r": 0.9, "seed": 0}


def test_bif_lm_through_main(tmp_path, capsys):
    from interp_toolkit.studies.lm.testbed import TestbedConfig, train_testbed
    from interp_toolkit.tasks.induction_corpus import CorpusConfig

    corpus = CorpusConfig(n_sequences=32, seq_len=12, n_ordinary=8, chunk_min=3, chunk_max=4)
    cfg = TestbedConfig(corpus=corpus, n_layers=1, n_heads=1, d_model=8, d_mlp=16, total_steps=2, linear_every=2,
                        batch_size=8, warmup_steps=1)
    train_testbed(cfg, tmp_path / "tb", progress=False)
    code, out, err = run_cli(
        capsys, "bif-lm", tmp_path / "tb" / "checkpoints", "--out", tmp_path / "out", "--n-posterior", "16",
        "--n-train", "2", "--n-query", "2", "--no-adaptive", "--chains", "2", "--draws", "2", "--burn-in", "1",
        "--batch-size", "8", "--no-progress",
    )
    assert code == 0, err
    assert (tmp_path / "out" / "per_class.csv").is_file()


@pytest.mark.parametrize("argv, needles", [
    (["train", "--r", "1.5"], ["r must be a number in [0, 1]"]),
    (["train", "--task", "nonsense"], ["nonsense"]),
    (["train", "--epochs", "0"], ["epochs"]),
    (["train", "--config", "/nonexistent/cfg.yaml"], ["/nonexistent/cfg.yaml"]),
    (["train", "--device", "tpu"], ["'tpu'"]),
    (["info", "/nonexistent/run"], ["/nonexistent/run"]),
    (["demo", "--epochs", "zero"], ["zero"]),
    (["demo", "--seed", "three"], ["three"]),
    (["sweep", "--ratios", "0.5,1.5", "--dry-run"], ["1.5"]),
    (["sweep", "--config", "/nonexistent/sweep.json"], ["/nonexistent/sweep.json"]),
    (["report", "/nonexistent/study"], ["/nonexistent/study"]),
    (["analyze", "/nonexistent/run", "--analysis", "gradients"], ["/nonexistent/run"]),
    (["analyze", "RUN", "--analysis", "nope"], ["nope"]),
    (["mechanism", "/nonexistent/run"], ["/nonexistent/run"]),
    (["mechanism-contrast", "/nonexistent/run", "--out", "/nonexistent/out"], ["/nonexistent/run"]),
    (["bif", "/nonexistent/x.safetensors"], ["/nonexistent/x.safetensors"]),
    (["bif", "CKPT", "--n-query", "0"], ["n_query"]),
    (["bif", "CKPT", "--device", "cuda:x"], ["cuda:x"]),
    (["bif-lm", "/nonexistent/ckpts"], ["/nonexistent/ckpts"]),
    (["influence", "/nonexistent/run"], ["/nonexistent/run"]),
    (["influence", "RUN", "--epochs", "12345"], ["12345"]),
])
def test_user_errors_exit_2_with_one_error_line(argv, needles, cli_run, tmp_path, capsys):
    last = list_checkpoints(cli_run)[-1][1]
    argv = [str(last) if a == "CKPT" else str(cli_run) if a == "RUN" else a for a in argv]
    if argv[0] == "train":
        argv += ["--run-dir", str(tmp_path / "never")]
    code, _, err = run_cli(capsys, *argv)
    assert_user_error(code, err, *needles)
    assert not (tmp_path / "never").exists()


def test_every_command_is_covered():
    covered = {"train", "info", "demo", "sweep", "report", "analyze", "mechanism", "mechanism-contrast", "bif",
               "bif-lm", "influence"}
    assert set(COMMANDS) == covered


def test_interrupt_exits_130_and_bugs_exit_1_with_a_log(cli_run, tmp_path, monkeypatch, capsys):
    import interp_toolkit.cli.info as info

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(info, "run_config", interrupted)
    code, _, err = run_cli(capsys, "info", cli_run)
    assert code == 130 and err.strip() == "interrupted; rerun the same command to resume"

    def buggy(args):
        raise RuntimeError("boom")

    monkeypatch.setattr(info, "run_config", buggy)
    monkeypatch.setenv("INTERP_TOOLKIT_LOG_DIR", str(tmp_path / "logs"))
    code, _, err = run_cli(capsys, "info", cli_run)
    assert code == 1 and "boom" in err and "Traceback" not in err
    (log,) = (tmp_path / "logs").glob("crash-*.log")
    assert str(log) in err and "RuntimeError: boom" in log.read_text()


def test_help_is_cheap_and_lists_every_command(capsys):
    import subprocess
    import sys

    code = ("import sys, interp_toolkit.cli as c; rc = c.main(['bif', '--help']); "
            "print('torch' in sys.modules, 'transformer_lens' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "False False"  # --help imports no heavy library
    assert "--task-config" in done.stdout
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0 and all(name in out for name in COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_of_every_command_imports_no_torch(command):
    """``train``, ``demo`` and ``sweep`` take their flags from MPSPConfig, ModelConfig and
    TrainConfig: those modules import no torch, so no ``--help`` waits for it."""
    import subprocess
    import sys

    code = (f"import sys, interp_toolkit.cli as c; rc = c.main([{command!r}, '--help']); "
            "print(rc, 'torch' in sys.modules, 'transformer_lens' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "0 False False"
    assert f"usage: interp-toolkit {command}" in done.stdout
    if command == "train":
        assert "--train.epochs" in done.stdout and "--model.n-layers" in done.stdout and "--task.r" in done.stdout


def test_analyze_names_match_the_registry():
    from interp_toolkit.analyses.ablation import METHODS
    from interp_toolkit.analyses.over_checkpoints import ANALYSES
    from interp_toolkit.cli.analyze import ABLATION_METHODS, ANALYSIS_NAMES
    from interp_toolkit.cli.train import TASK_NAMES
    from interp_toolkit.tasks.mpsp import TASKS

    assert sorted(ANALYSIS_NAMES) == sorted(ANALYSES)
    assert tuple(ABLATION_METHODS) == tuple(METHODS)
    assert sorted(TASK_NAMES) == sorted(TASKS)


def test_old_standalone_entry_points_go_through_main(capsys):
    from interp_toolkit.cli.bif import main as bif_main
    from interp_toolkit.cli.bif_lm import main as bif_lm_main

    capsys.readouterr()
    assert bif_main(["/nonexistent/x.safetensors"]) == 2
    assert_user_error(2, capsys.readouterr().err, "/nonexistent/x.safetensors")
    assert bif_lm_main(["/nonexistent/ckpts"]) == 2
    assert_user_error(2, capsys.readouterr().err, "/nonexistent/ckpts")


def test_interrupted_train_names_the_epoch_it_resumes_from(cli_run, monkeypatch, capsys):
    import interp_toolkit.cli.train as train_cli

    def interrupted(cfg):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_cli, "run_config", interrupted)
    code, _, err = run_cli(capsys, *TRAIN, "--run-dir", cli_run)
    assert code == 130
    assert err.strip() == "interrupted; rerun the same command to resume from epoch 4"


def test_analyze_weight_norms(cli_run, tmp_path, capsys):
    code, out, err = run_cli(capsys, "analyze", cli_run, "--analysis", "weight_norms", "--last",
                             "--out-dir", tmp_path / "w", "--no-plot", "--no-progress")
    assert code == 0, err
    assert "weight_norms: 1 checkpoint(s) computed" in out
    header = (tmp_path / "w" / "weight_norms_epochs_4.csv").read_text().splitlines()[0]
    assert header == "epoch,group,norm,n_params"
    code, _, err = run_cli(capsys, "analyze", cli_run, "--analysis", "weight_norms", "--n", "16")
    assert_user_error(code, err, "weight_norms", "'n'")


@pytest.mark.parametrize("command", ["train", "bif", "influence", "mechanism"])
def test_the_help_of_a_command_for_any_task_says_so(command, capsys):
    """Commands that run on a task of the user's own do not read as MPSP-only."""
    assert main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "task of your own" in text, text[:400]
    assert "An MPSP run directory" not in text and "of an MPSP run." not in text
    assert "MPSP" not in COMMANDS[command][1] or "task of your own" in COMMANDS[command][1]
