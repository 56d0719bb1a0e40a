"""The one training loop (``runs.loop.TrainingLoop``): both trainers hand it their members, and
it drives them by the schedule, the clip bound and the evaluation plan of the config."""

from __future__ import annotations

import pytest
import torch

from interp_toolkit import ModelConfig, TrainConfig, build_model, train
from interp_toolkit.runs import loop as loop_module
from interp_toolkit.runs.batched import StackedMembers, train_batched
from interp_toolkit.runs.trainer import ModelMember
from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits

torch.set_num_threads(1)


def _setup():
    task = MPSPConfig(seq_len=5, n_train=96, n_eval=32, r=0.9)
    cfg = ModelConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, seed=0, **task.model_dims())
    train_cfg = TrainConfig(epochs=4, lr=2e-3, batch_size=32, eval_every=2, checkpoint_every=4, warmup_steps=3,
                            lr_schedule="cosine", min_lr_ratio=0.1, grad_clip=0.5, progress=False)
    return make_splits(task), cfg, train_cfg


@pytest.mark.parametrize("members", [ModelMember, StackedMembers])
def test_both_trainers_step_through_the_one_loop_at_the_scheduled_rate(tmp_path, monkeypatch, members):
    splits, model_cfg, train_cfg = _setup()
    seen: list[tuple[float | None, float | None]] = []
    evaluated: list[int] = []
    update, evaluate = members.update, members.evaluate

    def spy_update(self, lr, clip):
        seen.append((lr, clip))
        return update(self, lr, clip)

    def spy_evaluate(self, found_splits):
        evaluated.append(len(seen))
        return evaluate(self, found_splits)

    monkeypatch.setattr(members, "update", spy_update)
    monkeypatch.setattr(members, "evaluate", spy_evaluate)
    runs = []
    monkeypatch.setattr(loop_module.TrainingLoop, "run",
                        lambda self, device, run=loop_module.TrainingLoop.run: runs.append(self) or run(self, device))
    if members is ModelMember:
        train(build_model(model_cfg), splits, train_cfg, tmp_path / "run")
    else:
        train_batched([model_cfg], splits, train_cfg, [tmp_path / "run"])
    assert len(runs) == 1 and isinstance(runs[0].members, members)
    per_epoch = 3  # 96 examples in batches of 32
    total = train_cfg.epochs * per_epoch
    assert [lr for lr, _ in seen] == [train_cfg.lr_at(step, total) for step in range(1, total + 1)]
    assert seen[0][0] == pytest.approx(train_cfg.lr / 3) and min(lr for lr, _ in seen) >= 0.1 * train_cfg.lr
    assert {clip for _, clip in seen} == {0.5}
    # every planned evaluation (epoch 0 before any step), after that epoch's last step
    assert evaluated == [epoch * per_epoch for epoch in train_cfg.evaluation_epochs()]
    assert len(evaluated) >= 3
