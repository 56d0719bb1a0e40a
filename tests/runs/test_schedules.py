"""Warmup, learning-rate schedules and gradient clipping (``TrainConfig``): values at chosen
steps against hand computation, the optimizer really sees them, exact resume mid-schedule,
run keys unchanged at the defaults, the batched trainer (sweeps) matching ``train`` under them,
and the places that cannot take them refuse by name."""

from __future__ import annotations

import json
import math

import pytest
import torch

import interp_toolkit.runs.trainer as training
from interp_toolkit import TrainConfig, build_model, train
from interp_toolkit.errors import UserError
from interp_toolkit.tasks.mpsp import make_splits


@pytest.fixture
def splits(small_task):
    return make_splits(small_task)


def test_warmup_then_cosine_by_hand():
    cfg = TrainConfig(lr=1e-3, warmup_steps=4, lr_schedule="cosine", min_lr_ratio=0.1)
    total = 14  # 4 warmup steps, then 10 decay steps
    assert [cfg.lr_at(s, total) for s in (1, 2, 4)] == pytest.approx([2.5e-4, 5e-4, 1e-3])
    # step 5 is the first decay step (t = 0): the full lr; step 10: t = 5/10
    assert cfg.lr_at(5, total) == pytest.approx(1e-3)
    assert cfg.lr_at(10, total) == pytest.approx(1e-3 * (0.1 + 0.9 * (1 + math.cos(math.pi * 0.5)) / 2))
    assert cfg.lr_at(14, total) == pytest.approx(1e-3 * (0.1 + 0.9 * (1 + math.cos(math.pi * 0.9)) / 2))
    assert min(cfg.lr_at(s, total) for s in range(1, total + 1)) >= 1e-4  # never below the floor


def test_linear_and_constant_by_hand():
    linear = TrainConfig(lr=2e-3, lr_schedule="linear")
    assert [linear.lr_at(s, 5) for s in (1, 3, 5)] == pytest.approx([2e-3, 2e-3 * 0.6, 2e-3 * 0.2])
    constant = TrainConfig(lr=3e-4, warmup_steps=2)
    assert [constant.lr_at(s, 100) for s in (1, 2, 3, 100)] == pytest.approx([1.5e-4, 3e-4, 3e-4, 3e-4])
    assert not TrainConfig().schedules_lr and constant.schedules_lr
    assert TrainConfig(batch_size=64).steps_per_epoch(130) == 3 and TrainConfig().steps_per_epoch(130) == 1


@pytest.mark.parametrize(("field", "value", "named"), [
    ("warmup_steps", -1, "warmup_steps"), ("warmup_steps", 1.5, "warmup_steps"),
    ("lr_schedule", "step", "lr_schedule"), ("min_lr_ratio", 1.5, "min_lr_ratio"),
    ("grad_clip", 0.0, "grad_clip"), ("grad_clip", float("inf"), "grad_clip"),
])
def test_bad_values_are_refused_by_name(field, value, named):
    with pytest.raises(UserError, match=named):
        TrainConfig(**{field: value})
    with pytest.raises(UserError, match="floor of a decaying schedule"):
        TrainConfig(min_lr_ratio=0.1)  # a floor without a decay says nothing


def test_defaults_keep_every_run_key():
    later = {"warmup_steps", "lr_schedule", "min_lr_ratio", "grad_clip"}
    assert not later & set(TrainConfig().to_dict())  # the dict run keys hash is the one of earlier versions
    shown = TrainConfig(warmup_steps=10, grad_clip=1.0).to_dict()
    assert shown["warmup_steps"] == 10 and shown["grad_clip"] == 1.0 and "lr_schedule" not in shown
    assert TrainConfig.from_dict(shown) == TrainConfig(warmup_steps=10, grad_clip=1.0)


def test_the_optimizer_steps_at_the_scheduled_rates_and_clips(tmp_path, splits, small_model_cfg, monkeypatch):
    cfg = TrainConfig(epochs=6, eval_every=3, batch_size=64, warmup_steps=3, lr_schedule="cosine",
                      min_lr_ratio=0.2, grad_clip=0.05, progress=False)
    seen, norms = [], []
    real_step = torch.optim.AdamW.step

    def spying_step(self, *args, **kwargs):
        seen.append(self.param_groups[0]["lr"])
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", spying_step)
    train(build_model(small_model_cfg), splits, cfg, tmp_path / "run")
    per_epoch = cfg.steps_per_epoch(len(splits["train"].labels))
    total = cfg.epochs * per_epoch
    assert len(seen) == total
    assert seen == pytest.approx([cfg.lr_at(s, total) for s in range(1, total + 1)])
    assert max(norms) <= 0.05 * (1 + 1e-5)  # clipped before every step
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["train_config"]["lr_schedule"] == "cosine" and record["train_config"]["grad_clip"] == 0.05


class Interrupt(Exception):
    pass


def test_resume_mid_schedule_is_exact(tmp_path, splits, small_model_cfg, monkeypatch):
    cfg = TrainConfig(epochs=16, eval_every=4, checkpoint_every=8, batch_size=64, warmup_steps=5,
                      lr_schedule="linear", min_lr_ratio=0.1, grad_clip=0.5, progress=False)
    reference = train(build_model(small_model_cfg), splits, cfg, tmp_path / "ref")
    real_evaluate = training.evaluate
    calls = {"n": 0}

    def crashing_evaluate(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 4:  # past the warmup, inside the decay
            raise Interrupt
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(training, "evaluate", crashing_evaluate)
    with pytest.raises(Interrupt):
        train(build_model(small_model_cfg), splits, cfg, tmp_path / "run")
    monkeypatch.setattr(training, "evaluate", real_evaluate)
    resumed = train(build_model(small_model_cfg), splits, cfg, tmp_path / "run")
    assert resumed.resumed_from is not None and 0 < resumed.resumed_from < cfg.epochs
    ref_state, state = reference.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(ref_state[k], state[k]) for k in ref_state)
    assert resumed.metrics == reference.metrics


def test_a_schedule_cannot_be_extended(tmp_path, splits, small_model_cfg):
    from interp_toolkit.runs.extend import ExtensionError

    short = TrainConfig(epochs=4, eval_every=2, lr_schedule="cosine", progress=False)
    train(build_model(small_model_cfg), splits, short, tmp_path / "short")
    longer = TrainConfig(epochs=8, eval_every=2, lr_schedule="cosine", progress=False)
    with pytest.raises(ExtensionError, match="lr_schedule 'cosine'"):
        train(build_model(small_model_cfg), splits, longer, tmp_path / "long", extend_from=tmp_path / "short")


def test_member_clipping_is_torch_clipping_of_each_member():
    from interp_toolkit.runs.optim import clip_member_grads_

    gen = torch.Generator().manual_seed(0)
    shapes = {"a": (3, 4, 5), "b": (3, 7), "c": (3, 2, 2, 2)}
    stacked = {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}
    for name in shapes:
        stacked[name][1] *= 1e-3  # member 1 is under the limit: left as it is
    expected, expected_norms = [], []
    for k in range(3):  # each member alone, through torch's own clipping
        tensors = [stacked[name][k].clone().requires_grad_() for name in shapes]
        for t in tensors:
            t.grad = t.detach().clone()
        expected_norms.append(float(torch.nn.utils.clip_grad_norm_(tensors, 2.0)))
        expected.append([t.grad for t in tensors])
    assert expected_norms[1] < 2.0 < min(expected_norms[0], expected_norms[2])
    norms = clip_member_grads_(stacked, 2.0)
    assert norms.tolist() == pytest.approx(expected_norms, rel=1e-6)
    for k in range(3):
        for name, grad in zip(shapes, expected[k], strict=True):
            torch.testing.assert_close(stacked[name][k], grad, atol=1e-7, rtol=1e-6)
    clipped = torch.linalg.vector_norm(torch.cat([stacked[name][0].flatten() for name in shapes]))
    assert float(clipped) == pytest.approx(2.0, rel=1e-5)


def test_sweeps_train_with_a_schedule_and_clipping_as_train_does(tmp_path, splits, small_model_cfg, monkeypatch):
    """The batched trainer (sweeps) at warmup + cosine + clipping: every member follows train()
    at the same settings, and a group killed mid-schedule resumes to the uninterrupted result."""
    import dataclasses

    from interp_toolkit.runs.batched import train_batched
    from interp_toolkit.studies.grid.config import SweepConfig

    cfg = TrainConfig(epochs=8, eval_every=2, checkpoint_every=4, batch_size=64, warmup_steps=4,
                      lr_schedule="cosine", min_lr_ratio=0.1, grad_clip=0.2, lr=3e-3, progress=False)
    models = [dataclasses.replace(small_model_cfg, seed=seed) for seed in (0, 1)]
    batched = train_batched(models, splits, cfg, [tmp_path / f"b{i}" for i in range(2)])
    for i, model_cfg in enumerate(models):
        alone = train(build_model(model_cfg), splits, cfg, tmp_path / f"s{i}")
        for key, value in alone.final.items():
            assert batched.finals[i][key] == pytest.approx(value, abs=2e-4), (i, key)
        record = json.loads((tmp_path / f"b{i}" / "run.json").read_text())
        assert record["key"] == json.loads((tmp_path / f"s{i}" / "run.json").read_text())["key"]
    assert batched.finals[0] != batched.finals[1]  # the seeds differ, so the comparison means something

    def crash_at_epoch_4(metrics):
        if metrics["epoch"] == 4:  # past the warmup (4 steps), inside the decay
            raise KeyboardInterrupt("simulated kill")
        return False

    cut = [tmp_path / f"cut{i}" for i in range(2)]
    with pytest.raises(KeyboardInterrupt):
        train_batched(models, splits, cfg, cut, stop_rule=crash_at_epoch_4)
    resumed = train_batched(models, splits, cfg, cut)
    assert resumed.resumed_from == [4, 4]
    uninterrupted = [load(tmp_path / f"b{i}") for i in range(2)]
    for i in range(2):
        assert resumed.finals[i] == batched.finals[i]
        state = load(cut[i])
        assert all(torch.equal(state[k], uninterrupted[i][k]) for k in state)

    # a sweep takes these settings (it was refused before the batched trainer had them)
    sweep = SweepConfig(
        train={"warmup_steps": 10, "grad_clip": 1.0}, grid={"train.lr_schedule": ["constant", "cosine"]}
    )
    assert sweep.train["warmup_steps"] == 10


def load(run_dir):
    from interp_toolkit import load_checkpoint
    from interp_toolkit.runs.trainer import list_checkpoints

    return load_checkpoint(list_checkpoints(run_dir)[-1][1])[0].state_dict()


def test_a_sweep_cell_trains_at_its_schedule(tmp_path):
    """Through run_sweep: a grid over the schedule gives each run its own, recorded in its run."""
    from interp_toolkit.studies.grid.config import preset
    from interp_toolkit.studies.sweep.run import run_sweep

    cfg = preset("smoke", seeds=[0], ratios=[0.9], epochs=4, n_train=64, **{"train.warmup_steps": 2,
                                                                          "train.grad_clip": 1.0},
                 grid={"train.lr_schedule": ["constant", "cosine"]})
    result = run_sweep(cfg, tmp_path / "study", workers=1, progress=False, report=False)
    assert len(result.rows) == 2
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "study").rglob("run.json"))]
    schedules = sorted(r["train_config"].get("lr_schedule", "constant") for r in records)
    assert schedules == ["constant", "cosine"]
    assert all(r["train_config"]["warmup_steps"] == 2 and r["train_config"]["grad_clip"] == 1.0 for r in records)
    assert all(r["status"] == "finished" for r in records)
