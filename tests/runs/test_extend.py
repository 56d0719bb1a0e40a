"""A longer run continued from the same run at fewer epochs ends as training from scratch."""

from __future__ import annotations

import json

import pytest
import torch

from interp_toolkit import ModelConfig, TrainConfig, build_model, load_checkpoint, train
from interp_toolkit.io import read_jsonl
from interp_toolkit.runs.batched import train_batched
from interp_toolkit.runs.extend import FINAL_STATE_NAME, ExtensionError, identity_differences
from interp_toolkit.runs.resume import RESUME_NAME, list_checkpoints
from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits

torch.set_num_threads(1)


def _setup(epochs: int):
    task = MPSPConfig(seq_len=5, n_train=128, n_eval=64, r=0.9)
    splits = make_splits(task)
    cfgs = [ModelConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, seed=s, **task.model_dims()) for s in (0, 1)]
    # Epoch 5 (the short run's end) is on neither schedule of the longer run: it must not appear there.
    train_cfg = TrainConfig(epochs=epochs, lr=3e-3, eval_every=4, checkpoint_every=3, progress=False)
    return {"task": task.to_dict()}, splits, cfgs, train_cfg


def _weights(run_dir):
    return load_checkpoint(list_checkpoints(run_dir)[-1][1])[0].state_dict()


def _extended_and_scratch(tmp_path, name, cfgs, splits, cfg, info, short, **kwargs):
    """Train ``cfgs`` extended from ``short`` and from scratch: (extended result, dirs, scratch dirs)."""
    dirs = [tmp_path / f"{name}{i}" for i in range(len(cfgs))]
    result = train_batched(cfgs, splits, cfg, dirs, [info] * len(cfgs), extend_from=short, **kwargs)
    scratch = [tmp_path / f"{name}_scratch{i}" for i in range(len(cfgs))]
    train_batched(cfgs, splits, cfg, scratch, [info] * len(cfgs), **kwargs)
    return result, dirs, scratch


def _assert_same_history(run_dir, reference):
    assert read_jsonl(run_dir / "metrics.jsonl") == read_jsonl(reference / "metrics.jsonl")
    assert [e for e, _ in list_checkpoints(run_dir)] == [e for e, _ in list_checkpoints(reference)]


def test_train_extended_equals_train_from_scratch(tmp_path):
    info, splits, cfgs, short_cfg = _setup(5)
    long_cfg = TrainConfig(**{**short_cfg.to_dict(), "epochs": 12})
    train(build_model(cfgs[0]), splits, short_cfg, tmp_path / "short", info)
    assert (tmp_path / "short" / FINAL_STATE_NAME).is_file()
    assert not (tmp_path / "short" / RESUME_NAME).exists()

    extended = train(build_model(cfgs[0]), splits, long_cfg, tmp_path / "long", info, extend_from=tmp_path / "short")
    scratch = train(build_model(cfgs[0]), splits, long_cfg, tmp_path / "scratch", info)

    assert extended.resumed_from == 5 and scratch.resumed_from is None
    assert extended.final == scratch.final
    assert read_jsonl(tmp_path / "long" / "metrics.jsonl") == read_jsonl(tmp_path / "scratch" / "metrics.jsonl")
    assert [e for e, _ in list_checkpoints(tmp_path / "long")] == [e for e, _ in list_checkpoints(tmp_path / "scratch")]
    assert 5 not in [m["epoch"] for m in extended.metrics]
    for key, value in _weights(tmp_path / "scratch").items():
        torch.testing.assert_close(_weights(tmp_path / "long")[key], value, atol=0, rtol=0)
    record = json.loads((tmp_path / "long" / "run.json").read_text())
    short_record = json.loads((tmp_path / "short" / "run.json").read_text())
    assert record["key"] == json.loads((tmp_path / "scratch" / "run.json").read_text())["key"]
    assert record["status"] == "finished"
    assert record["extended_from"] == {"run_dir": str(tmp_path / "short"), "key": short_record["key"],
                                       "epochs": 5, "epoch": 5}
    # Every checkpoint is the longer run's own: a rerun is a cache hit, not a foreign directory.
    for _, path in list_checkpoints(tmp_path / "long"):
        assert load_checkpoint(path)[1]["run_key"] == record["key"]
    again = train(build_model(cfgs[0]), splits, long_cfg, tmp_path / "long", info, extend_from=tmp_path / "short")
    assert again.already_finished


def test_batched_extension_equals_batched_from_scratch(tmp_path):
    info, splits, cfgs, short_cfg = _setup(5)
    long_cfg = TrainConfig(**{**short_cfg.to_dict(), "epochs": 12})
    short = [tmp_path / f"short{i}" for i in range(2)]
    train_batched(cfgs, splits, short_cfg, short, [info] * 2)
    result, long, scratch = _extended_and_scratch(tmp_path, "long", cfgs, splits, long_cfg, info, short)
    assert result.resumed_from == [5, 5]
    for i in range(2):
        _assert_same_history(long[i], scratch[i])
        for key, value in _weights(scratch[i]).items():
            torch.testing.assert_close(_weights(long[i])[key], value, atol=0, rtol=0)
        assert json.loads((long[i] / "run.json").read_text())["extended_from"]["run_dir"] == str(short[i])


def test_a_run_stopped_early_is_the_longer_run_too(tmp_path):
    info, splits, cfgs, short_cfg = _setup(10)
    long_cfg = TrainConfig(**{**short_cfg.to_dict(), "epochs": 20})

    def stop_at_8(metrics):  # stands for "generalized": decided by the trajectory alone
        return metrics["epoch"] >= 8

    short = [tmp_path / f"short{i}" for i in range(2)]
    train_batched(cfgs, splits, short_cfg, short, [info] * 2, stop_rule=stop_at_8)
    result, long, scratch = _extended_and_scratch(tmp_path, "long", cfgs, splits, long_cfg, info, short,
                                                  stop_rule=stop_at_8)
    assert result.already_finished == [True, True]  # nothing was trained
    for i in range(2):
        record = json.loads((long[i] / "run.json").read_text())
        assert record["status"] == "finished" and record["stopped_early_at"] == 8
        assert record["key"] == json.loads((scratch[i] / "run.json").read_text())["key"]
        _assert_same_history(long[i], scratch[i])
        assert (long[i] / FINAL_STATE_NAME).is_file()  # so it can be extended with another stop rule

    # Without the stop rule, the same source is trained on from where it stopped.
    result, on, full = _extended_and_scratch(tmp_path, "on", cfgs, splits, long_cfg, info, short)
    assert result.resumed_from == [8, 8]
    for i in range(2):
        _assert_same_history(on[i], full[i])


def test_a_stop_rule_firing_inside_the_source_history_is_refused(tmp_path):
    info, splits, cfgs, short_cfg = _setup(10)
    long_cfg = TrainConfig(**{**short_cfg.to_dict(), "epochs": 20})
    train_batched(cfgs[:1], splits, short_cfg, [tmp_path / "short"], [info])
    with pytest.raises(ExtensionError, match="ends it at epoch 4, inside that run's history"):
        train_batched(cfgs[:1], splits, long_cfg, [tmp_path / "long"], [info],
                      stop_rule=lambda m: m["epoch"] >= 4, extend_from=[tmp_path / "short"])
    assert not (tmp_path / "long").exists() or not [p for p in (tmp_path / "long").iterdir() if p.name != ".lock"]
    # Epoch 10 (the source's end) is no evaluation of the 20-epoch run (4, 8, 9, 12, ...): a rule
    # firing from epoch 10 on stops that run at 12, so it trains on from the source's state.
    later = train_batched(cfgs[:1], splits, long_cfg, [tmp_path / "at12"], [info],
                          stop_rule=lambda m: m["epoch"] >= 10, extend_from=[tmp_path / "short"])
    scratch = train_batched(cfgs[:1], splits, long_cfg, [tmp_path / "scratch"], [info],
                            stop_rule=lambda m: m["epoch"] >= 10)
    assert later.resumed_from == [10] and later.stopped_early_at == scratch.stopped_early_at == [12]
    _assert_same_history(tmp_path / "at12", tmp_path / "scratch")
    # Firing first at the source's last evaluation, on the longer run's schedule: it stops there too.
    twelve = TrainConfig(**{**short_cfg.to_dict(), "epochs": 12})
    train_batched(cfgs[:1], splits, twelve, [tmp_path / "short12"], [info])
    done = train_batched(cfgs[:1], splits, long_cfg, [tmp_path / "at12b"], [info],
                         stop_rule=lambda m: m["epoch"] >= 12, extend_from=[tmp_path / "short12"])
    assert done.already_finished == [True]
    assert json.loads((tmp_path / "at12b" / "run.json").read_text())["stopped_early_at"] == 12
    _assert_same_history(tmp_path / "at12b", tmp_path / "scratch")


def test_bad_sources_are_refused_before_anything_is_written(tmp_path):
    info, splits, cfgs, short_cfg = _setup(5)
    train(build_model(cfgs[0]), splits, short_cfg, tmp_path / "short", info)
    long_cfg = TrainConfig(**{**short_cfg.to_dict(), "epochs": 12})

    other_lr = TrainConfig(**{**long_cfg.to_dict(), "lr": 1e-3})
    with pytest.raises(ExtensionError, match=r"another run.*train\.lr"):
        train(build_model(cfgs[0]), splits, other_lr, tmp_path / "a", info, extend_from=tmp_path / "short")
    with pytest.raises(ExtensionError, match=r"another run.*model\.seed"):
        train(build_model(cfgs[1]), splits, long_cfg, tmp_path / "b", info, extend_from=tmp_path / "short")
    with pytest.raises(ExtensionError, match="trains 5 epochs and this run 5"):
        train(build_model(cfgs[0]), splits, short_cfg, tmp_path / "c", info, extend_from=tmp_path / "short")
    with pytest.raises(ExtensionError, match="not a run directory"):
        train(build_model(cfgs[0]), splits, long_cfg, tmp_path / "d", info, extend_from=tmp_path / "nowhere")
    (tmp_path / "short" / FINAL_STATE_NAME).unlink()
    with pytest.raises(ExtensionError, match=f"no {FINAL_STATE_NAME}"):
        train(build_model(cfgs[0]), splits, long_cfg, tmp_path / "e", info, extend_from=tmp_path / "short")
    # In a batch, one bad source stops the call before any member's directory is written.
    train(build_model(cfgs[1]), splits, short_cfg, tmp_path / "short1", info)
    with pytest.raises(ExtensionError, match="no final_state"):
        train_batched(cfgs[::-1], splits, long_cfg, [tmp_path / "f1", tmp_path / "f0"], [info] * 2,
                      extend_from=[tmp_path / "short1", tmp_path / "short"])
    for name in "abcdef":
        leftovers = [p for p in tmp_path.glob(f"{name}*") for p in p.rglob("*") if p.name != ".lock"]
        assert leftovers == [], name


def test_an_extension_killed_before_its_state_is_saved_is_redone(tmp_path, monkeypatch):
    import interp_toolkit.runs.extend as extend

    info, splits, cfgs, short_cfg = _setup(5)
    long_cfg = TrainConfig(**{**short_cfg.to_dict(), "epochs": 12})
    train(build_model(cfgs[0]), splits, short_cfg, tmp_path / "short", info)
    real_save = extend.save_resume_state

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed while extending")

    monkeypatch.setattr(extend, "save_resume_state", killed)
    with pytest.raises(KeyboardInterrupt):
        train(build_model(cfgs[0]), splits, long_cfg, tmp_path / "long", info, extend_from=tmp_path / "short")
    assert (tmp_path / "long" / "metrics.jsonl").exists() and not (tmp_path / "long" / RESUME_NAME).exists()
    monkeypatch.setattr(extend, "save_resume_state", real_save)
    again = train(build_model(cfgs[0]), splits, long_cfg, tmp_path / "long", info, extend_from=tmp_path / "short")
    scratch = train(build_model(cfgs[0]), splits, long_cfg, tmp_path / "scratch", info)
    assert again.resumed_from == 5
    assert read_jsonl(tmp_path / "long" / "metrics.jsonl") == read_jsonl(tmp_path / "scratch" / "metrics.jsonl")
    assert again.final == scratch.final


def test_identity_differences_names_nested_fields():
    a = {"train": {"epochs": 5, "lr": 1e-3, "betas": (0.9, 0.98)}, "data": {"train": "x"}}
    b = {"train": {"epochs": 9, "lr": 1e-3, "betas": [0.9, 0.98]}, "data": {"train": "y"}}
    assert identity_differences(a, b) == ["data.train"]
    assert identity_differences(a, b, ignore=("train.epochs", "data")) == []
    assert identity_differences(a, {**b, "data": a["data"], "info": {"x": 1}}) == ["info.x"]
