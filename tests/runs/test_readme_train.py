"""The README's "In Python" run (``train`` on ``make_splits``' splits) works with every command
that reads a run's task, and ``train`` takes a ``TransformerBridge`` built without ``build_model``."""

from __future__ import annotations

import json

import pytest

from interp_toolkit.cli import main
from interp_toolkit.errors import UserError


def readme_run(run_dir, epochs: int = 4):
    """The README snippet's code at small sizes (same calls, same order)."""
    from interp_toolkit import (
        ModelConfig,
        TrainConfig,
        build_model,
        list_checkpoints,
        load_checkpoint,
        train,
    )
    from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits

    task = MPSPConfig(r=0.9, n_train=64, n_eval=32)
    splits = make_splits(task)
    model = build_model(ModelConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32, **task.model_dims()))
    result = train(model, splits, TrainConfig(epochs=epochs, checkpoint_every=2), run_dir=run_dir)
    epoch, path = list_checkpoints(run_dir)[-1]
    model, metadata = load_checkpoint(path)
    _, cache = model.run_with_cache(splits["adv"].tokens[:8],
                                    names_filter=lambda name: name.endswith("hook_pattern"))
    assert cache["blocks.1.attn.hook_pattern"].shape[:2] == (8, 2)
    return task, result


def test_readme_run_records_task_like_train_mpsp(tmp_path):
    from interp_toolkit import ModelConfig, TrainConfig
    from interp_toolkit.runs.mpsp import train_mpsp

    task, result = readme_run(tmp_path / "my_run")
    record = json.loads((tmp_path / "my_run" / "run.json").read_text())
    model_cfg = ModelConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32, **task.model_dims())
    train_mpsp(task, model_cfg, TrainConfig(epochs=4, checkpoint_every=2), tmp_path / "mpsp_run")
    mpsp_record = json.loads((tmp_path / "mpsp_run" / "run.json").read_text())
    assert record["run_info"]["task"] == mpsp_record["run_info"]["task"] == {"name": task.name, **task.to_dict()}
    # the key is computed from the caller's run_info: a run made before the task was recorded
    # automatically keeps its key, so rerunning the snippet is a finished-run hit
    assert record["key"] != mpsp_record["key"]
    assert record["identity"]["info"] == {}
    again = readme_run(tmp_path / "my_run")[1]
    assert again.already_finished


def test_readme_run_works_with_analyze_mechanism_and_bif(tmp_path, capsys):
    run_dir = tmp_path / "my_run"
    readme_run(run_dir)
    code = main(["analyze", str(run_dir), "--analysis", "fingerprints", "--no-progress", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert (run_dir / "analyses" / "fingerprints" / "fingerprints.csv").exists()
    code = main(["mechanism", str(run_dir), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 0, err
    code = main(["bif", str(run_dir), "--out", str(tmp_path / "bif"), "--n-attribution", "8", "--n-query", "4",
                 "--no-adaptive", "--chains", "2", "--draws", "4", "--burn-in", "0", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert '"r": 0.9' in captured.out and 'checkpoint: ' in captured.out


def test_finished_run_without_task_gets_it_and_keeps_its_key(tmp_path):
    """A run made before ``train`` recorded the splits' task: rerunning it adds the task."""
    run_dir = tmp_path / "old_run"
    readme_run(run_dir)
    path = run_dir / "run.json"
    record = json.loads(path.read_text())
    key = record["key"]
    record["run_info"] = {}
    path.write_text(json.dumps(record))
    assert readme_run(run_dir)[1].already_finished
    record = json.loads(path.read_text())
    assert record["key"] == key and record["run_info"]["task"]["r"] == 0.9


def test_train_accepts_a_bridge_built_without_build_model(tmp_path):
    from transformer_lens.model_bridge import TransformerBridge

    from interp_toolkit import ModelConfig, TrainConfig, list_checkpoints, load_checkpoint, train
    from interp_toolkit.model import bridge_config
    from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits

    task = MPSPConfig(r=0.9, n_train=32, n_eval=16)
    splits = make_splits(task)
    model_cfg = ModelConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, seed=5, **task.model_dims())
    derived = TransformerBridge.boot_native(bridge_config(model_cfg))
    train(derived, splits, TrainConfig(epochs=2), run_dir=tmp_path / "derived")
    loaded, _ = load_checkpoint(list_checkpoints(tmp_path / "derived")[-1][1])
    assert loaded.interp_config == model_cfg
    given = TransformerBridge.boot_native(bridge_config(model_cfg))
    result = train(given, splits, TrainConfig(epochs=2), run_dir=tmp_path / "given", model_config=model_cfg)
    assert result.final["epoch"] == 2


def test_train_refuses_a_model_config_that_does_not_describe_the_model(tmp_path):
    import torch
    from transformer_lens.model_bridge import TransformerBridge

    from interp_toolkit import ModelConfig, TrainConfig, train
    from interp_toolkit.model import bridge_config
    from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits

    task = MPSPConfig(r=0.9, n_train=32, n_eval=16)
    splits = make_splits(task)
    model_cfg = ModelConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, **task.model_dims())
    model = TransformerBridge.boot_native(bridge_config(model_cfg))
    wider = ModelConfig(n_layers=1, n_heads=2, d_model=32, d_mlp=32, **task.model_dims())
    with pytest.raises(UserError, match="does not describe the model"):
        train(model, splits, TrainConfig(epochs=1), run_dir=tmp_path / "r", model_config=wider)
    with pytest.raises(UserError, match="has no interp_toolkit ModelConfig"):
        train(torch.nn.Linear(2, 2), splits, TrainConfig(epochs=1), run_dir=tmp_path / "s")
    assert not (tmp_path / "r").exists() and not (tmp_path / "s").exists()
