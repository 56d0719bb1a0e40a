import json

import pytest
import torch

import interp_toolkit.runs.trainer as training
from interp_toolkit import TrainConfig, build_model, list_checkpoints, load_checkpoint, train
from interp_toolkit.errors import UserError
from interp_toolkit.tasks.mpsp import make_splits


@pytest.fixture
def splits(small_task):
    return make_splits(small_task)


def _weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def test_train_writes_run_directory(tmp_path, splits, small_model_cfg):
    cfg = TrainConfig(epochs=20, eval_every=5, checkpoint_every=10, progress=False)
    result = train(build_model(small_model_cfg), splits, cfg, tmp_path / "run", run_info={"task": "x"})
    run = tmp_path / "run"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics] == [0, 1, 2, 4, 5, 8, 10, 15, 16, 20]
    assert {"train_acc", "val_acc", "adv_acc", "train_loss", "val_loss", "adv_loss"} <= set(metrics[0])
    assert [e for e, _ in list_checkpoints(run)] == cfg.checkpoint_epochs() == [0, 1, 2, 4, 8, 10, 16, 20]
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "finished"
    assert record["train_config"]["lr"] == cfg.lr
    assert record["model_config"]["n_layers"] == 1
    assert {"torch", "transformer_lens", "interp_toolkit"} <= set(record["versions"])
    assert record["run_info"] == {"task": "x"}
    assert (run / "curves.png").stat().st_size > 1000
    assert not (run / "resume.safetensors").exists()
    assert result.final == metrics[-1]
    # Training moved the loss.
    assert metrics[-1]["train_loss"] < metrics[0]["train_loss"]


def test_logged_accuracy_matches_checkpoint(tmp_path, splits, small_model_cfg):
    cfg = TrainConfig(epochs=12, eval_every=4, checkpoint_every=4, checkpoint_log_spaced=False, progress=False)
    train(build_model(small_model_cfg), splits, cfg, tmp_path)
    for epoch, path in list_checkpoints(tmp_path):
        model, meta = load_checkpoint(path)
        assert meta["epoch"] == epoch
        assert training.evaluate(model, splits) == {k: v for k, v in meta["metrics"].items() if k != "epoch"}


class Interrupt(Exception):
    pass


@pytest.mark.parametrize("batch_size,crash_after", [(None, 3), (64, 5), (64, 1)])
def test_resume_reproduces_uninterrupted_run(tmp_path, splits, small_model_cfg, monkeypatch, batch_size, crash_after):
    cfg = TrainConfig(epochs=24, eval_every=4, checkpoint_every=8, batch_size=batch_size, progress=False)
    reference = train(build_model(small_model_cfg), splits, cfg, tmp_path / "ref")

    real_evaluate = training.evaluate
    calls = {"n": 0}

    def crashing_evaluate(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > crash_after:
            raise Interrupt
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(training, "evaluate", crashing_evaluate)
    with pytest.raises(Interrupt):
        train(build_model(small_model_cfg), splits, cfg, tmp_path / "run")
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "running"
    monkeypatch.setattr(training, "evaluate", real_evaluate)

    resumed = train(build_model(small_model_cfg), splits, cfg, tmp_path / "run")
    assert resumed.resumed_from is not None
    assert _same(_weights(resumed.model), _weights(reference.model))
    assert resumed.metrics == reference.metrics


def test_finished_run_is_not_retrained(tmp_path, splits, small_model_cfg, monkeypatch):
    cfg = TrainConfig(epochs=6, eval_every=3, progress=False)
    first = train(build_model(small_model_cfg), splits, cfg, tmp_path)
    stamp = (tmp_path / "metrics.jsonl").stat().st_mtime_ns

    def forbidden(*args, **kwargs):
        raise AssertionError("a finished run was retrained")

    monkeypatch.setattr(torch.optim.AdamW, "step", forbidden)
    again = train(build_model(small_model_cfg), splits, cfg, tmp_path)
    assert again.already_finished
    assert _same(_weights(again.model), _weights(first.model))
    assert (tmp_path / "metrics.jsonl").stat().st_mtime_ns == stamp


def test_different_run_in_same_directory_is_refused(tmp_path, splits, small_model_cfg):
    train(build_model(small_model_cfg), splits, TrainConfig(epochs=2, progress=False), tmp_path)
    with pytest.raises(UserError, match="holds a different run"):
        train(build_model(small_model_cfg), splits, TrainConfig(epochs=3, progress=False), tmp_path)


def test_bad_inputs_fail_before_work(tmp_path, splits, small_model_cfg):
    model = build_model(small_model_cfg)
    with pytest.raises(UserError, match="no 'train' split"):
        train(model, {"val": splits["val"]}, TrainConfig(progress=False), tmp_path / "a")
    with pytest.raises(UserError, match="epochs"):
        TrainConfig(epochs=0)
    with pytest.raises(UserError, match="lr"):
        TrainConfig(lr=-1.0)
    with pytest.raises(UserError, match="betas"):
        TrainConfig(betas=(0.9, 1.5))
    with pytest.raises(UserError, match="unknown TrainConfig keys"):
        TrainConfig.from_dict({"epochz": 3})
    assert not (tmp_path / "a").exists()


def test_diverging_training_raises(tmp_path, splits, small_model_cfg):
    with pytest.raises(FloatingPointError, match="lower lr"):
        model = build_model(small_model_cfg)
        with torch.no_grad():
            next(model.parameters()).fill_(float("nan"))
        train(model, splits, TrainConfig(epochs=3, progress=False), tmp_path)


def test_data_fingerprint_is_the_one_tensor_digest_and_keeps_old_run_keys():
    import hashlib

    from interp_toolkit.io import tensor_digest
    from interp_toolkit.runs.trainer import fingerprint
    from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits

    split = make_splits(MPSPConfig(seq_len=4, n_train=64, n_eval=16))["train"]
    old = hashlib.sha256()  # the recipe run keys were made with before io.tensor_digest existed
    for tensor in (split.tokens, split.labels):
        old.update(str(tuple(tensor.shape)).encode())
        old.update(tensor.to("cpu", torch.long).contiguous().numpy().tobytes())
    assert fingerprint(split) == tensor_digest([split.tokens, split.labels]) == old.hexdigest()[:16]
    assert tensor_digest([split.tokens.int(), split.labels]) == fingerprint(split)  # int32 is the same data
    changed = split.tokens.clone()
    changed[0, 0] += 1
    assert tensor_digest([changed, split.labels]) != fingerprint(split)


def test_epoch_minibatches_full_batch_and_shuffled():
    gen = torch.Generator().manual_seed(3)
    state = gen.get_state()
    assert list(training.epoch_minibatches(10, None, gen, "cpu")) == [slice(None)]
    assert torch.equal(gen.get_state(), state)  # full batch draws nothing: resume states stay comparable
    batches = list(training.epoch_minibatches(10, 4, gen, "cpu"))
    assert [len(b) for b in batches] == [4, 4, 2]
    expected = torch.randperm(10, generator=torch.Generator().manual_seed(3))
    assert torch.equal(torch.cat(batches), expected)
