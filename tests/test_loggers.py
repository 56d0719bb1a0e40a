"""The loggers write what metrics.jsonl holds, read back with each tool's own reader."""

import json
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from interp_toolkit import TrainConfig, build_model, train
from interp_toolkit.loggers import TensorBoardLogger, WandbLogger, metric_tag
from interp_toolkit.tasks.mpsp import make_splits

# Three evaluations: epochs 0, 2, 4 (no log-spaced checkpoints adding more).
THREE_EVALS = dict(epochs=4, eval_every=2, checkpoint_every=None, checkpoint_log_spaced=False,
                   progress=False)


@pytest.fixture
def splits(small_task):
    return make_splits(small_task)


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_metric_tags_group_splits_by_quantity():
    assert metric_tag("val_acc") == "accuracy/val"
    assert metric_tag("adv_loss") == "loss/adv"
    assert metric_tag("lr") == "lr"


def test_tensorboard_scalars_equal_metrics_jsonl(tmp_path, splits, small_model_cfg):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    train(build_model(small_model_cfg), splits, TrainConfig(**THREE_EVALS), run_dir,
          callbacks=[TensorBoardLogger()])
    metrics = _metrics(run_dir)
    assert [m["epoch"] for m in metrics] == [0, 2, 4]
    assert list(run_dir.glob("events.out.tfevents.*")), "no event file in the run directory"
    events = EventAccumulator(str(run_dir))
    events.Reload()
    keys = [k for k in metrics[0] if k != "epoch"]
    assert sorted(events.Tags()["scalars"]) == sorted(metric_tag(k) for k in keys)
    for key in keys:
        scalars = events.Scalars(metric_tag(key))
        assert [s.step for s in scalars] == [m["epoch"] for m in metrics]
        # TensorBoard stores float32: equal to the logged value at that precision.
        assert [s.value for s in scalars] == [float(np.float32(m[key])) for m in metrics]


_BLOCK = 32_768  # the .wandb transaction log uses LevelDB's log format


def _wandb_records(path: Path):
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:  # full record
            yield chunk
        elif kind == 2:  # first fragment
            pending = chunk
        elif kind == 3:  # middle
            pending += chunk
        elif kind == 4:  # last
            yield pending + chunk
            pending = b""


def test_wandb_offline_history_equals_metrics_jsonl(tmp_path, splits, small_model_cfg, monkeypatch):
    pytest.importorskip("wandb")
    from wandb.proto import wandb_internal_pb2

    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    train(build_model(small_model_cfg), splits, TrainConfig(**THREE_EVALS), run_dir,
          callbacks=[WandbLogger(project="test", mode="offline")])
    metrics = _metrics(run_dir)
    logs = list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(logs) == 1, logs
    # The W&B service writes the log asynchronously: finish() can return before the last
    # records (final history row, exit) are on disk. Wait for the exit record.
    deadline = time.monotonic() + 60
    while True:
        records = []
        for raw in _wandb_records(logs[0]):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            records.append(record)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    history = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            history.append({k: v for k, v in items.items() if not k.startswith("_")})
    expected = [{"epoch": m["epoch"], **{metric_tag(k): v for k, v in m.items() if k != "epoch"}}
                for m in metrics]
    assert history == expected


def test_wandb_logger_rejects_unknown_mode():
    pytest.importorskip("wandb")
    with pytest.raises(ValueError, match="mode must be one of"):
        WandbLogger(mode="offlin")


def test_cli_train_tensorboard_flag_writes_events(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from interp_toolkit.cli import main

    run_dir = tmp_path / "run"
    assert main(["train", "--epochs", "2", "--eval-every", "1", "--seq-len", "5", "--n-train", "64",
                 "--n-eval", "32", "--d-model", "16", "--d-mlp", "32", "--no-log-checkpoints", "--quiet",
                 "--tensorboard", "--run-dir", str(run_dir)]) == 0
    events = EventAccumulator(str(run_dir))
    events.Reload()
    assert [s.step for s in events.Scalars("accuracy/val")] == [m["epoch"] for m in _metrics(run_dir)]
