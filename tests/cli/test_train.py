import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from interp_toolkit import list_checkpoints, load_checkpoint
from interp_toolkit.cli import main
from interp_toolkit.errors import UserError
from interp_toolkit.runs.trainer import evaluate
from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits

SMALL = ["--seq-len", "5", "--n-train", "512", "--n-eval", "256", "--d-model", "32", "--d-mlp", "64", "--quiet"]


def test_cli_train_end_to_end_and_checkpoint_reproduces_accuracies(tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["train", "--n-layers", "1", "--r", "0.9", "--epochs", "300", "--eval-every", "25",
                 "--checkpoint-every", "100", "--run-dir", str(run), *SMALL])
    assert code == 0
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["epoch"] == 300
    assert metrics[-1]["train_acc"] > 0.6  # it learned something in 300 epochs
    checkpoints = list_checkpoints(run)
    assert [e for e, _ in checkpoints][-4:] == [100, 128, 200, 256][-4:] or checkpoints[-1][0] == 300
    assert checkpoints[-1][0] == 300
    model, meta = load_checkpoint(checkpoints[-1][1])
    splits = make_splits(MPSPConfig(seq_len=5, n_train=512, n_eval=256, r=0.9))
    reproduced = evaluate(model, splits)
    for key, value in reproduced.items():
        assert value == pytest.approx(metrics[-1][key], abs=1e-6)
    out = capsys.readouterr().out
    assert "trained" in out and "val_acc" in out

    # Rerunning the same command recomputes nothing.
    assert main(["train", "--n-layers", "1", "--r", "0.9", "--epochs", "300", "--eval-every", "25",
                 "--checkpoint-every", "100", "--run-dir", str(run), *SMALL]) == 0
    assert "already finished" in capsys.readouterr().out

    assert main(["info", str(checkpoints[-1][1])]) == 0
    info = capsys.readouterr().out
    assert '"n_layers": 1' in info and "adv_acc" in info and '"epoch": 300' in info
    assert main(["info", str(run)]) == 0
    assert "status finished" in capsys.readouterr().out


def test_cli_config_file_and_overrides(tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_text(
        "task_name: first_mod3_sum_mod3\n"
        "task: {seq_len: 4, n_train: 128, n_eval: 64, r: 0.2}\n"
        "model: {n_layers: 2, n_heads: 1, d_model: 16, d_mlp: 16}\n"
        "train: {epochs: 5, eval_every: 5}\n"
        f"run_dir: {tmp_path / 'from_file'}\n"
    )
    assert main(["train", "--config", str(config), "--epochs", "4", "--quiet"]) == 0
    record = json.loads((tmp_path / "from_file" / "run.json").read_text())
    assert record["train_config"]["epochs"] == 4
    assert record["model_config"]["n_layers"] == 2 and record["model_config"]["d_vocab_out"] == 3
    assert record["run_info"]["task"]["name"] == "first_mod3_sum_mod3"


def test_cli_bad_values_are_reported(tmp_path, capsys):
    assert main(["train", "--r", "1.5", "--run-dir", str(tmp_path / "x"), "--quiet"]) == 2
    assert "r must be a number in [0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"garbage")
    assert main(["info", str(bad)]) == 2
    assert "bad.safetensors" in capsys.readouterr().err
    assert main(["train", "--task", "nonsense"]) == 2


def test_killed_cli_run_resumes_to_identical_weights(tmp_path):
    args = ["train", "--epochs", "120", "--eval-every", "5", "--checkpoint-every", "40", *SMALL]
    cmd = [sys.executable, "-m", "interp_toolkit.cli"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([*cmd, *args, "--run-dir", str(tmp_path / "ref")], check=True, env=env, capture_output=True)

    run = tmp_path / "run"
    proc = subprocess.Popen([*cmd, *args, "--run-dir", str(run)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = run / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 6:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert json.loads((run / "run.json").read_text())["status"] == "running"

    done = subprocess.run([*cmd, *args, "--run-dir", str(run)], check=True, env=env,
                          capture_output=True, text=True)
    assert "resumed from epoch" in done.stdout
    ref_model, _ = load_checkpoint(Path(tmp_path / "ref" / "checkpoints" / "epoch_000120.safetensors"))
    model, _ = load_checkpoint(run / "checkpoints" / "epoch_000120.safetensors")
    for key, value in ref_model.state_dict().items():
        assert torch.equal(value, model.state_dict()[key]), key
    assert (run / "metrics.jsonl").read_text() == (tmp_path / "ref" / "metrics.jsonl").read_text()


def test_train_flags_are_generated_from_the_configs_and_old_names_still_work():
    from interp_toolkit.cli.train import ALIASES, parse
    from interp_toolkit.model import ModelConfig
    from interp_toolkit.runs.trainer import TrainConfig

    old = parse(["--r", "0.5", "--seq-len", "4", "--n-layers", "2", "--d-model", "16", "--epochs", "7",
                 "--no-layernorm", "--quiet", "--no-log-checkpoints", "--data-seed", "3", "--model-seed", "4",
                 "--task", "first_mod3_sum_mod3"])
    new = parse(["--task.r", "0.5", "--task.seq-len", "4", "--model.n-layers", "2", "--model.d-model", "16",
                 "--train.epochs", "7", "--model.normalization", "None", "--train.no-progress",
                 "--train.no-checkpoint-log-spaced", "--task.seed", "3", "--model.seed", "4",
                 "--task-name", "first_mod3_sum_mod3"])
    assert old.to_dict() == new.to_dict()
    assert (old.task.r, old.task.seq_len, old.task.seed, old.task.name) == (0.5, 4, 3, "first_mod3_sum_mod3")
    assert (old.model.n_layers, old.model.d_head, old.model.normalization, old.model.seed) == (2, 8, None, 4)
    assert old.model.n_ctx == 5 and old.model.d_vocab_out == 3  # follow the task
    assert not old.train.progress and not old.train.checkpoint_log_spaced
    # fields that never had a hand-written flag are flags too, with the config's default
    parsed = parse(["--model.act-fn", "gelu", "--train.readout-position", "-2"])
    assert parsed.model.act_fn == "gelu" and parsed.train.readout_position == -2
    assert parsed.train.eval_batch_size == TrainConfig().eval_batch_size
    assert parsed.model.d_mlp == ModelConfig(n_layers=1, n_heads=1, d_vocab=2, n_ctx=2).d_mlp
    from interp_toolkit.cli.flags import SHORT_FLAGS

    assert {k: ALIASES[k] for k in SHORT_FLAGS} == SHORT_FLAGS  # the shared table, unchanged


def test_train_has_one_device_option_reaching_train_config(tmp_path):
    from interp_toolkit.cli.train import command_config_class, parse

    assert "device" not in {f.name for f in dataclasses.fields(command_config_class())}
    assert parse([]).train.device is None  # trains on the CPU (train_mpsp's default)
    assert parse(["--device", "cpu"]).train.device == "cpu"
    assert parse(["--train.device", "auto"]).train.device == "auto"
    config = tmp_path / "train.yaml"
    config.write_text("train: {epochs: 3, device: cpu}\n")
    parsed = parse(["--config", str(config)])
    assert parsed.train.device == "cpu" and parsed.train.epochs == 3
    config.write_text("device: cpu\ntrain: {epochs: 3}\n")  # the layout of 0.x files before train.device
    with pytest.raises(UserError, match="device"):
        parse(["--config", str(config)])


def test_cli_train_extend_from_a_shorter_run(tmp_path, capsys):
    tiny = ["--seq-len", "4", "--n-train", "128", "--n-eval", "64", "--d-model", "16", "--d-mlp", "16",
            "--eval-every", "5", "--quiet"]
    assert main(["train", "--epochs", "10", "--run-dir", str(tmp_path / "short"), *tiny]) == 0
    capsys.readouterr()
    assert main(["train", "--epochs", "20", "--run-dir", str(tmp_path / "long"), "--extend-from",
                 str(tmp_path / "short"), *tiny]) == 0
    assert f"extended {tmp_path / 'short'} from epoch 10" in capsys.readouterr().out
    assert main(["train", "--epochs", "20", "--run-dir", str(tmp_path / "scratch"), *tiny]) == 0
    assert (tmp_path / "long" / "metrics.jsonl").read_text() == (tmp_path / "scratch" / "metrics.jsonl").read_text()
    assert main(["info", str(tmp_path / "long")]) == 0
    assert f"extended from: {tmp_path / 'short'}" in capsys.readouterr().out
    # Not the same run at fewer epochs: one error line naming what differs, nothing written.
    assert main(["train", "--epochs", "20", "--lr", "0.01", "--run-dir", str(tmp_path / "bad"), "--extend-from",
                 str(tmp_path / "short"), *tiny]) == 2
    err = capsys.readouterr().err
    assert "train.lr" in err and "Traceback" not in err
    assert not [p for p in (tmp_path / "bad").rglob("*") if p.name != ".lock"]


def test_cli_train_records_the_initialization_and_extreme_count_settings(tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["train", "--seq-len", "4", "--n-values", "4", "--n-train", "64", "--n-eval", "32",
                 "--d-model", "16", "--d-mlp", "16", "--n-layers", "1", "--n-heads", "2", "--epochs", "1",
                 "--quiet", "--model.init", "torch", "--model.init-scale", "0.5", "--task.extreme-train", "2",
                 "--run-dir", str(run)])
    assert code == 0, capsys.readouterr()
    record = json.loads((run / "run.json").read_text())
    assert record["model_config"]["init"] == "torch" and record["model_config"]["init_scale"] == 0.5
    assert record["run_info"]["task"]["extreme_train"] == 2
    task = MPSPConfig.from_dict({k: v for k, v in record["run_info"]["task"].items() if k != "name"})
    assert int(((make_splits(task)["train"].values % 2) == 1).all(-1).sum()) == 2
