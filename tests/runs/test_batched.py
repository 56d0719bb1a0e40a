"""The batched (vmapped) trainer matches sequential ``train`` and writes train-style runs."""

from __future__ import annotations

import json

import pytest
import torch

from interp_toolkit import ModelConfig, TrainConfig, load_checkpoint, train
from interp_toolkit.errors import UserError
from interp_toolkit.runs.batched import train_batched
from interp_toolkit.runs.optim import StackedAdamW
from interp_toolkit.runs.trainer import list_checkpoints
from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits

torch.set_num_threads(1)


def _setup(epochs: int = 12, batch_size: int | None = None):
    task = MPSPConfig(seq_len=5, n_train=192, n_eval=64, r=0.9)
    splits = make_splits(task)
    cfgs = [ModelConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, seed=s, **task.model_dims())
            for s in (0, 1, 2)]
    train_cfg = TrainConfig(epochs=epochs, lr=3e-3, eval_every=4, checkpoint_every=6,
                            batch_size=batch_size, progress=False)
    return task, splits, cfgs, train_cfg


@pytest.mark.parametrize("batch_size, chunk_size", [(None, None), (64, None), (None, 50)])
def test_batched_matches_sequential_train(tmp_path, batch_size, chunk_size):
    task, splits, cfgs, train_cfg = _setup(batch_size=batch_size)
    info = {"task": task.to_dict()}
    result = train_batched(cfgs, splits, train_cfg, [tmp_path / f"b{i}" for i in range(3)], [info] * 3,
                           chunk_size=chunk_size)
    assert result.already_finished == [False] * 3
    for i, cfg in enumerate(cfgs):
        from interp_toolkit import build_model

        seq = train(build_model(cfg), splits, train_cfg, tmp_path / f"s{i}", info)
        batched_metrics = [json.loads(x) for x in (tmp_path / f"b{i}" / "metrics.jsonl").read_text().splitlines()]
        assert [m["epoch"] for m in batched_metrics] == [m["epoch"] for m in seq.metrics]
        for mb, ms in zip(batched_metrics, seq.metrics, strict=True):
            for key in ms:
                assert mb[key] == pytest.approx(ms[key], abs=2e-4), (i, mb["epoch"], key)
        # final weights and the run record key agree
        batched_model, meta = load_checkpoint(list_checkpoints(tmp_path / f"b{i}")[-1][1])
        assert meta["epoch"] == train_cfg.epochs
        for key, value in seq.model.state_dict().items():
            if key.endswith("attn.k.bias"):
                # softmax is invariant to the key bias: its true gradient is 0 and AdamW turns
                # rounding noise (which differs between summation orders) into +-lr steps
                continue
            torch.testing.assert_close(batched_model.state_dict()[key], value, atol=1e-4, rtol=1e-3)
        with torch.no_grad():
            torch.testing.assert_close(batched_model(splits["adv"].tokens), seq.model(splits["adv"].tokens),
                                       atol=1e-4, rtol=1e-3)
        rec_b = json.loads((tmp_path / f"b{i}" / "run.json").read_text())
        rec_s = json.loads((tmp_path / f"s{i}" / "run.json").read_text())
        assert rec_b["key"] == rec_s["key"] and rec_b["status"] == "finished"
        assert [e for e, _ in list_checkpoints(tmp_path / f"b{i}")] == [
            e for e, _ in list_checkpoints(tmp_path / f"s{i}")
        ]
    # the seeds really differ (otherwise the comparison above proves little)
    m0 = load_checkpoint(list_checkpoints(tmp_path / "b0")[-1][1])[0].state_dict()["embed.weight"]
    m1 = load_checkpoint(list_checkpoints(tmp_path / "b1")[-1][1])[0].state_dict()["embed.weight"]
    assert not torch.allclose(m0, m1)


def test_batched_dir_is_cache_hit_for_train_and_rerun(tmp_path):
    task, splits, cfgs, train_cfg = _setup(epochs=4)
    dirs = [tmp_path / f"b{i}" for i in range(3)]
    train_batched(cfgs, splits, train_cfg, dirs)
    again = train_batched(cfgs, splits, train_cfg, dirs)
    assert again.already_finished == [True] * 3
    from interp_toolkit import build_model

    cached = train(build_model(cfgs[1]), splits, train_cfg, dirs[1])
    assert cached.already_finished
    # a different run into the same directory is refused
    with pytest.raises(UserError, match="different run"):
        train_batched(cfgs[:1], splits, TrainConfig(epochs=5, progress=False), dirs[:1])


def test_batched_resume_after_crash_matches_uninterrupted(tmp_path):
    task, splits, cfgs, train_cfg = _setup(epochs=12)
    full = train_batched(cfgs, splits, train_cfg, [tmp_path / f"full{i}" for i in range(3)])
    dirs = [tmp_path / f"cut{i}" for i in range(3)]

    def crash_at_epoch_8(metrics):
        if metrics["epoch"] == 8:
            raise KeyboardInterrupt("simulated kill")
        return False

    with pytest.raises(KeyboardInterrupt):
        train_batched(cfgs, splits, train_cfg, dirs, stop_rule=crash_at_epoch_8)
    assert json.loads((dirs[0] / "run.json").read_text())["status"] == "running"
    resumed = train_batched(cfgs[:2], splits, train_cfg, dirs[:2])
    assert resumed.resumed_from == [8, 8]
    # train() understands the batched resume format too
    from interp_toolkit import build_model

    by_train = train(build_model(cfgs[2]), splits, train_cfg, dirs[2])
    assert by_train.resumed_from == 8
    for i in range(3):
        final = json.loads((dirs[i] / "run.json").read_text())["final"]
        for key, value in full.finals[i].items():
            assert final[key] == pytest.approx(value, abs=2e-4), (i, key)
        assert not (dirs[i] / "resume.safetensors").exists()


def test_stacked_adamw_matches_torch_adamw():
    torch.manual_seed(0)
    weights = torch.randn(3, 4, 5)
    grads = [torch.randn(3, 4, 5) for _ in range(4)]
    stacked = {"w": weights.clone()}
    opt = StackedAdamW(stacked, 1e-2, (0.9, 0.98), 0.3)
    for g in grads:
        opt.step(stacked, {"w": g})
    for k in range(3):
        p = torch.nn.Parameter(weights[k].clone())
        ref = torch.optim.AdamW([p], lr=1e-2, betas=(0.9, 0.98), weight_decay=0.3)
        for g in grads:
            p.grad = g[k].clone()
            ref.step()
        torch.testing.assert_close(stacked["w"][k], p.detach(), atol=1e-7, rtol=1e-6)
        sd = opt.member_state_dict(k, ["w"], ref.state_dict()["param_groups"])
        torch.testing.assert_close(sd["state"][0]["exp_avg_sq"], ref.state_dict()["state"][0]["exp_avg_sq"])


def test_batched_rejects_mixed_architectures(tmp_path):
    task, splits, cfgs, train_cfg = _setup()
    other = ModelConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32, seed=3, **task.model_dims())
    with pytest.raises(UserError, match="n_layers"):
        train_batched([cfgs[0], other], splits, train_cfg, [tmp_path / "a", tmp_path / "b"])


def test_early_stop_finishes_decided_members_only(tmp_path):
    task, splits, cfgs, train_cfg = _setup(epochs=12)
    full = train_batched(cfgs, splits, train_cfg, [tmp_path / f"full{i}" for i in range(3)])
    dirs = [tmp_path / f"es{i}" for i in range(3)]

    seen = []

    def stop_member_1_at_8(metrics):
        seen.append(metrics["epoch"])
        return metrics["epoch"] == 8 and len(seen) % 3 == 2  # second member evaluated at epoch 8

    result = train_batched(cfgs, splits, train_cfg, dirs, stop_rule=stop_member_1_at_8)
    assert result.stopped_early_at == [None, 8, None]
    record = json.loads((dirs[1] / "run.json").read_text())
    assert record["status"] == "finished" and record["stopped_early_at"] == 8 and record["final"]["epoch"] == 8
    assert list_checkpoints(dirs[1])[-1][0] == 8
    for i in (0, 2):  # the others are unaffected by removing member 1 from the stack
        assert result.finals[i]["epoch"] == 12
        for key, value in full.finals[i].items():
            assert result.finals[i][key] == pytest.approx(value, abs=2e-4), (i, key)


class _KillAfterFirstEvaluation:
    """A callback that stops training right after the epoch-0 evaluation is logged and saved,
    where a kill -9 of the sweep leaves every run: one metrics line, a resume state at epoch 0."""

    def on_evaluation(self, run_dir, metrics):
        if metrics["epoch"] == 0:
            raise KeyboardInterrupt("simulated kill after the first evaluation")


def test_batched_resume_from_a_state_saved_at_epoch_0_matches_uninterrupted(tmp_path):
    from safetensors.torch import load_file

    task, splits, cfgs, train_cfg = _setup(epochs=12)
    full_dirs = [tmp_path / f"full{i}" for i in range(3)]
    train_batched(cfgs, splits, train_cfg, full_dirs)
    dirs = [tmp_path / f"cut{i}" for i in range(3)]
    with pytest.raises(KeyboardInterrupt):
        train_batched(cfgs, splits, train_cfg, dirs, callbacks=[_KillAfterFirstEvaluation()])
    for run_dir in dirs:
        assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1
        assert (run_dir / "resume.safetensors").is_file()
    # the first member starts over alone; the other two resume from their epoch-0 state
    (dirs[0] / "resume.safetensors").unlink()
    (dirs[0] / "metrics.jsonl").unlink()
    resumed = train_batched(cfgs, splits, train_cfg, dirs)
    assert resumed.resumed_from == [None, 0, 0]
    for run_dir, full in zip(dirs, full_dirs):
        assert (run_dir / "metrics.jsonl").read_bytes() == (full / "metrics.jsonl").read_bytes()
        assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"
        ours, theirs = list_checkpoints(run_dir), list_checkpoints(full)
        assert [e for e, _ in ours] == [e for e, _ in theirs]
        for (_, a), (_, b) in zip(ours, theirs):
            ta, tb = load_file(a), load_file(b)
            assert sorted(ta) == sorted(tb) and all(torch.equal(ta[k], tb[k]) for k in ta)


@pytest.mark.parametrize("batch_size", [None, 64])
def test_a_stacked_seed_is_the_same_bytes_as_train(tmp_path, batch_size):
    """One run key, one set of bytes: a seed trained in a stack (a sweep's job) writes the
    metrics.jsonl and checkpoint files ``train()`` writes for it alone, with no tolerance."""
    from interp_toolkit import build_model
    from interp_toolkit.runs.layout import METRICS

    task, splits, cfgs, train_cfg = _setup(batch_size=batch_size)
    info = {"task": task.to_dict()}
    train_batched(cfgs[:2], splits, train_cfg, [tmp_path / f"b{i}" for i in range(2)], [info] * 2)
    for i, cfg in enumerate(cfgs[:2]):
        train(build_model(cfg), splits, train_cfg, tmp_path / f"s{i}", info)
        stacked, alone = tmp_path / f"b{i}", tmp_path / f"s{i}"
        assert (stacked / METRICS).read_bytes() == (alone / METRICS).read_bytes(), i
        pairs = list(zip(list_checkpoints(stacked), list_checkpoints(alone), strict=True))
        assert len(pairs) == 7
        for (epoch_b, path_b), (epoch_s, path_s) in pairs:
            assert epoch_b == epoch_s and path_b.read_bytes() == path_s.read_bytes(), (i, epoch_b)
        rec_b, rec_s = (json.loads((d / "run.json").read_text()) for d in (stacked, alone))
        assert rec_b["key"] == rec_s["key"]
