"""Thread policy: tiny work runs on one torch thread and the caller's setting survives."""

import pytest
import torch

from interp_toolkit.threads import TINY_STEP_FLOPS, threads_for, torch_threads, with_threads


def test_with_threads_sets_the_count_inside_and_restores_it_after_errors_too():
    seen = []

    @with_threads(lambda n: n)
    def work(n):
        seen.append(torch.get_num_threads())
        if n == 3:
            raise RuntimeError("boom")
        return n

    with torch_threads(2):
        assert work(1) == 1 and torch.get_num_threads() == 2
        with pytest.raises(RuntimeError, match="boom"):
            work(3)
        assert torch.get_num_threads() == 2
    assert seen == [1, 3]


def test_threads_for_is_one_for_tiny_work_only():
    assert threads_for(TINY_STEP_FLOPS / 10) == 1
    assert threads_for(TINY_STEP_FLOPS * 10) is None
    assert threads_for(1.0, "meta") is None  # not a CPU: CPU threads are not the bottleneck


def test_dln_training_uses_one_thread_and_restores_the_callers(tmp_path, monkeypatch):
    import interp_toolkit.studies.bif.dln as dln
    import interp_toolkit.tasks.dln as dln_model  # the model and its GD step live here
    from interp_toolkit.tasks.hierarchical import living_things

    seen = []
    real_step = dln_model.dln_per_example_loss

    def spying_loss(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real_step(*args, **kwargs)

    monkeypatch.setattr(dln_model, "dln_per_example_loss", spying_loss)
    data = living_things()
    with torch_threads(2):
        dln.train_dln(data.inputs, data.targets, dln.DLNConfig(8, 16, 30, seed=2),
                      dln.DLNTrainConfig(lr=0.05, steps=20, n_checkpoints=3), run_dir=tmp_path / "run")
        assert torch.get_num_threads() == 2
    assert seen and set(seen) == {1}
