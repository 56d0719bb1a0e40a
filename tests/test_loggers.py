"""The loggers write what metrics.jsonl holds, read back with each tool's own reader."""

import json
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from interp_toolkit import TrainConfig, build_model, train
from interp_toolkit.errors import UserError
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
    with pytest.raises(UserError, match="mode must be one of"):
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


def _wandb_run_records(run_dir: Path) -> list[list]:
    """Records of each offline W&B run under ``run_dir``, oldest first, once each is finished."""
    from wandb.proto import wandb_internal_pb2

    runs = []
    for log in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        deadline = time.monotonic() + 60
        while True:
            records = []
            for raw in _wandb_records(log):
                record = wandb_internal_pb2.Record()
                record.ParseFromString(raw)
                records.append(record)
            if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        runs.append(records)
    return runs


def _of_type(records: list, kind: str) -> list:
    return [getattr(r, kind) for r in records if r.WhichOneof("record_type") == kind]


def test_wandb_resumed_run_continues_the_same_wandb_run(tmp_path, splits, small_model_cfg, monkeypatch):
    """The W&B run id is the run key, with resume="allow": a run interrupted and resumed
    writes two offline logs of one W&B run (``wandb sync`` joins them), in the given group."""
    pytest.importorskip("wandb")
    from interp_toolkit.runs import trainer

    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    cfg = TrainConfig(epochs=6, eval_every=2, checkpoint_every=2, checkpoint_log_spaced=False, progress=False)
    real_evaluate, calls = trainer.evaluate, {"n": 0}

    class Crash(Exception):
        pass

    def crashing_evaluate(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 2:
            raise Crash
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(trainer, "evaluate", crashing_evaluate)
    first = WandbLogger(project="toolkit-test", mode="offline", group="study-a", entity="lab")
    with pytest.raises(Crash):
        train(build_model(small_model_cfg), splits, cfg, run_dir, callbacks=[first])
    first.close()
    monkeypatch.setattr(trainer, "evaluate", real_evaluate)
    resumed = train(build_model(small_model_cfg), splits, cfg, run_dir,
                    callbacks=[WandbLogger(project="toolkit-test", mode="offline", group="study-a", entity="lab")])
    assert resumed.resumed_from is not None
    key = json.loads((run_dir / "run.json").read_text())["key"]
    runs = _wandb_run_records(run_dir)
    assert len(runs) == 2
    for records in runs:
        (run,) = _of_type(records, "run")
        assert (run.run_id, run.project, run.entity, run.run_group) == (key, "toolkit-test", "lab", "study-a")
    epochs = [[json.loads(i.value_json) for h in _of_type(records, "history") for i in h.item
               if ("/".join(i.nested_key) or i.key) == "epoch"] for records in runs]
    assert epochs[0] == [0, 2] and epochs[1][-1] == 6, epochs  # the second log continues the first


def test_wandb_log_analysis_adds_tables_and_figures(tmp_path, splits, small_model_cfg, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    train(build_model(small_model_cfg), splits, TrainConfig(**THREE_EVALS), run_dir)
    key = json.loads((run_dir / "run.json").read_text())["key"]
    table = run_dir / "fingerprints.csv"
    table.write_text("epoch,component,qk_rho\n0,L0H0,0.5\n4,L0H0,\n")
    figure = run_dir / "fingerprints.png"
    from interp_toolkit.plotting import figure as new_figure

    fig = new_figure(figsize=(2, 2))
    fig.add_subplot().plot([0, 1], [0, 1])
    fig.savefig(figure)
    logger = WandbLogger(project="toolkit-test", mode="offline")
    artifact = logger.log_analysis(run_dir, "fingerprints", [table, figure])
    assert artifact.name.startswith(f"{key}-fingerprints") and artifact.type == "analysis"
    (records,) = _wandb_run_records(run_dir)
    (run,) = _of_type(records, "run")
    assert run.run_id == key
    (logged,) = [a for a in _of_type(records, "artifact") if a.type == "analysis"]
    assert logged.name == f"{key}-fingerprints"
    assert sorted(entry.path for entry in logged.manifest.contents) == ["fingerprints.csv", "fingerprints.png"]
    media = {("/".join(i.nested_key) or i.key): json.loads(i.value_json)
             for h in _of_type(records, "history") for i in h.item}
    assert media["fingerprints/tables/fingerprints/_type"] == "table-file"
    assert media["fingerprints/figures/fingerprints/_type"] == "image-file"
    with pytest.raises(UserError, match="missing"):
        logger.log_analysis(run_dir, "fingerprints", [run_dir / "nope.csv"])


def test_tensorboard_hparams_of_each_run(tmp_path, splits, small_model_cfg, small_task):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    run_dir = tmp_path / "run"
    train(build_model(small_model_cfg), splits, TrainConfig(**THREE_EVALS, lr=3e-3), run_dir,
          callbacks=[TensorBoardLogger()], run_info={"task": {"name": small_task.name, **small_task.to_dict()}})
    events = EventAccumulator(str(run_dir))
    events.Reload()
    content = {tag: plugin_data_pb2.HParamsPluginData.FromString(raw)
               for tag, raw in events.PluginTagToContent("hparams").items()}
    start = next(c.session_start_info for c in content.values() if c.HasField("session_start_info"))
    assert start.hparams["train.lr"].number_value == pytest.approx(3e-3)
    assert start.hparams["task.r"].number_value == pytest.approx(small_task.r)
    assert start.hparams["model.n_layers"].number_value == small_model_cfg.n_layers
    assert start.hparams["train.betas"].string_value == "[0.9, 0.98]"
    experiment = next(c.experiment for c in content.values() if c.HasField("experiment"))
    metric_tags = {m.name.tag for m in experiment.metric_infos}
    assert {"accuracy/val", "accuracy/adv", "loss/train"} <= metric_tags
    assert metric_tags <= set(events.Tags()["scalars"])  # the metrics are the run's own scalars


def test_loggers_from_flags_pass_project_entity_group():
    pytest.importorskip("wandb")
    from types import SimpleNamespace

    from interp_toolkit.loggers import loggers_from_flags

    args = SimpleNamespace(tensorboard=True, wandb="offline", wandb_project="p", wandb_entity="e",
                           wandb_group=None)
    tensorboard, wandb_logger = loggers_from_flags(args, group="study")
    assert isinstance(tensorboard, TensorBoardLogger) and tensorboard.hparams
    assert (wandb_logger.project, wandb_logger.entity, wandb_logger.group, wandb_logger.mode) == (
        "p", "e", "study", "offline")
    assert loggers_from_flags(SimpleNamespace(wandb="offline"))[0].project == "interp-toolkit"
    with pytest.raises(UserError, match="group must be a non-empty string or None, got ''"):
        WandbLogger(group="")


def test_cli_train_wandb_flags(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from interp_toolkit.cli import main

    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    assert main(["train", "--epochs", "2", "--eval-every", "1", "--seq-len", "5", "--n-train", "64",
                 "--n-eval", "32", "--d-model", "16", "--d-mlp", "32", "--no-log-checkpoints", "--quiet",
                 "--wandb", "offline", "--wandb-project", "cli-project", "--wandb-entity", "lab",
                 "--wandb-group", "study-b", "--run-dir", str(run_dir)]) == 0
    (records,) = _wandb_run_records(run_dir)
    (run,) = _of_type(records, "run")
    key = json.loads((run_dir / "run.json").read_text())["key"]
    assert (run.run_id, run.project, run.entity, run.run_group) == (key, "cli-project", "lab", "study-b")


def test_cli_sweep_groups_wandb_runs_by_study_and_writes_tensorboard_hparams(tmp_path, monkeypatch):
    """``sweep --wandb`` puts every run of a study in one W&B group, the study directory's
    name unless --wandb-group says otherwise; ``--tensorboard`` gives each run its hparams."""
    pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from interp_toolkit.cli import main

    monkeypatch.setenv("WANDB_SILENT", "true")
    study = tmp_path / "study_a"
    assert main(["sweep", "--preset", "smoke", "--seeds", "1", "--epochs", "4", "--out", str(study),
                 "--workers", "1", "--quiet", "--wandb", "offline", "--wandb-project", "sweeps",
                 "--tensorboard"]) == 0
    import wandb

    wandb.teardown()  # the W&B service writes the offline logs asynchronously: let it finish first
    run_dirs = sorted(p.parent for p in study.glob("runs/*/run.json"))
    assert len(run_dirs) == 2
    for run_dir in run_dirs:
        (records,) = _wandb_run_records(run_dir)
        (run,) = _of_type(records, "run")
        assert (run.run_group, run.project, run.run_id) == (
            "study_a", "sweeps", json.loads((run_dir / "run.json").read_text())["key"])
        (events,) = run_dir.glob("**/events.out.tfevents.*")
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        assert "_hparams_/session_start_info" in accumulator.PluginTagToContent("hparams")


def test_cli_analyze_and_mechanism_log_their_files_to_the_runs_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from interp_toolkit.cli import main

    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    assert main(["train", "--epochs", "4", "--eval-every", "2", "--checkpoint-every", "2", "--seq-len", "5",
                 "--n-train", "128", "--n-eval", "64", "--d-model", "16", "--d-mlp", "32", "--no-log-checkpoints",
                 "--quiet", "--run-dir", str(run_dir)]) == 0
    key = json.loads((run_dir / "run.json").read_text())["key"]
    assert main(["analyze", str(run_dir), "--analysis", "fingerprints", "--n", "32", "--no-progress",
                 "--wandb", "offline", "--wandb-project", "analyses"]) == 0
    assert main(["mechanism", str(run_dir), "--grad-n", "64", "--fingerprint-n", "32", "--patching-n", "16",
                 "--ablation-n", "32", "--no-progress", "--wandb", "offline", "--wandb-project", "analyses"]) == 0
    import wandb

    wandb.teardown()  # the W&B service writes the offline logs asynchronously: let it finish first
    artifacts = {}
    for records in _wandb_run_records(run_dir):
        (run,) = _of_type(records, "run")
        assert (run.run_id, run.project) == (key, "analyses")  # the training run's W&B run, resumed
        for artifact in _of_type(records, "artifact"):
            if artifact.type == "analysis":  # (W&B stores each logged table as an artifact of its own too)
                artifacts[artifact.name] = sorted(entry.path for entry in artifact.manifest.contents)
    assert artifacts == {f"{key}-fingerprints": ["fingerprints.csv", "fingerprints.png"],
                         f"{key}-mechanism": ["mechanism.csv", "mechanism.json", "mechanism.png"]}


def test_wandb_config_uses_tensorboards_hyperparameter_names_and_sgld_steps(tmp_path, splits, small_model_cfg,
                                                                           monkeypatch):
    pytest.importorskip("wandb")
    from interp_toolkit.loggers import hparams_of_record

    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    train(build_model(small_model_cfg), splits, TrainConfig(**THREE_EVALS, lr=3e-3), run_dir,
          callbacks=[WandbLogger(project="test", mode="offline")])
    (records,) = _wandb_run_records(run_dir)
    config = {item.key: json.loads(item.value_json)
              for source in [*_of_type(records, "config"), *(r.config for r in _of_type(records, "run"))]
              for item in source.update}
    expected = hparams_of_record(json.loads((run_dir / "run.json").read_text()))
    assert {k: config[k]["value"] if isinstance(config[k], dict) else config[k] for k in expected} == expected
    assert "train.lr" in config and "train_config" not in config
    # SGLD draws are plotted against the SGLD step
    sgld = tmp_path / "sgld"
    logger = WandbLogger(project="test", mode="offline", log_dir=sgld)
    logger.on_draw(0, 0, {"loss": 1.5, "step": 10})
    logger.close()
    (sgld_records,) = _wandb_run_records(sgld)
    metrics = {m.name or m.glob_name: m.step_metric for m in _of_type(sgld_records, "metric")}
    assert metrics.get("sgld/*") == "sgld/step" and "sgld/step" in metrics, metrics
