import dataclasses
import json

import pytest
import torch

from interp_toolkit import TrainConfig, build_model, train
from interp_toolkit.callbacks import Callback, as_callbacks
from interp_toolkit.runs.batched import train_batched
from interp_toolkit.runs.resume import RESUME_NAME
from interp_toolkit.tasks.mpsp import make_splits


@pytest.fixture
def splits(small_task):
    return make_splits(small_task)


class Recorder(Callback):
    def __init__(self):
        self.events = []

    def on_evaluation(self, run_dir, metrics):
        self.events.append(("eval", run_dir.name, metrics["epoch"]))

    def on_checkpoint(self, run_dir, path, epoch):
        assert path.exists()  # told only after the file is on disk
        self.events.append(("ckpt", run_dir.name, epoch))

    def on_run_end(self, run_dir, final):
        assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"
        self.events.append(("end", run_dir.name, final["epoch"]))


def test_train_calls_back_on_every_evaluation_checkpoint_and_end(tmp_path, splits, small_model_cfg):
    cfg = TrainConfig(epochs=6, eval_every=3, checkpoint_every=None, checkpoint_log_spaced=False,
                      progress=False)
    recorder = Recorder()
    result = train(build_model(small_model_cfg), splits, cfg, tmp_path / "run", callbacks=[recorder])
    logged = [m["epoch"] for m in result.metrics]
    assert logged == [0, 3, 6]
    assert [e for e in recorder.events if e[0] == "eval"] == [("eval", "run", e) for e in logged]
    assert [e for e in recorder.events if e[0] == "ckpt"] == [("ckpt", "run", 0), ("ckpt", "run", 6)]
    assert recorder.events[-1] == ("end", "run", 6)


class Boom(Exception):
    pass


class RaiseAtEpoch(Callback):
    def __init__(self, epoch):
        self.epoch = epoch

    def on_evaluation(self, run_dir, metrics):
        if metrics["epoch"] == self.epoch:
            raise Boom


def test_raising_callback_stops_training_resumably(tmp_path, splits, small_model_cfg):
    cfg = TrainConfig(epochs=8, eval_every=2, checkpoint_every=4, progress=False)
    reference = train(build_model(small_model_cfg), splits, cfg, tmp_path / "ref")
    with pytest.raises(Boom):
        train(build_model(small_model_cfg), splits, cfg, tmp_path / "run", callbacks=[RaiseAtEpoch(4)])
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "running"
    assert (tmp_path / "run" / RESUME_NAME).exists()
    resumed = train(build_model(small_model_cfg), splits, cfg, tmp_path / "run")
    assert resumed.resumed_from == 4
    assert resumed.metrics == reference.metrics
    for key, value in reference.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[key], value), key


def test_batched_calls_back_per_member_and_stops_resumably(tmp_path, splits, small_model_cfg):
    cfgs = [dataclasses.replace(small_model_cfg, seed=s) for s in (0, 1)]
    cfg = TrainConfig(epochs=4, eval_every=2, checkpoint_every=None, checkpoint_log_spaced=False,
                      progress=False)
    dirs = [tmp_path / "a", tmp_path / "b"]
    recorder = Recorder()
    train_batched(cfgs, splits, cfg, dirs, callbacks=[recorder])
    for name in ("a", "b"):
        assert [e[2] for e in recorder.events if e[:2] == ("eval", name)] == [0, 2, 4]
        assert [e[2] for e in recorder.events if e[:2] == ("ckpt", name)] == [0, 4]
        assert ("end", name, 4) in recorder.events

    crash_dirs = [tmp_path / "c", tmp_path / "d"]
    with pytest.raises(Boom):
        train_batched(cfgs, splits, cfg, crash_dirs, callbacks=[RaiseAtEpoch(2)])
    for run_dir in crash_dirs:  # every member was saved before the callback ran
        assert (run_dir / RESUME_NAME).exists()
    resumed = train_batched(cfgs, splits, cfg, crash_dirs)
    assert resumed.resumed_from == [2, 2]
    for ref, again in zip(dirs, crash_dirs):
        assert (ref / "metrics.jsonl").read_text() == (again / "metrics.jsonl").read_text()


def test_object_without_hooks_is_refused():
    with pytest.raises(TypeError, match="has none of the hooks"):
        as_callbacks([object()])


class SamplerRecorder(Callback):
    def __init__(self):
        self.draws, self.chain_ends = [], []

    def on_draw(self, chain, draw, info):
        self.draws.append((chain, draw, info["step"], info["loss"]))

    def on_chain_end(self, chain, diagnostics):
        self.chain_ends.append((chain, diagnostics))


def test_sgld_calls_back_on_every_draw_and_chain_end(tmp_path):
    from interp_toolkit.analyses.bif import SamplerConfig, bif

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x = torch.randn(10, 3)

    def loss_fn(m, batch):
        return (m(batch).squeeze(-1) - 1.0) ** 2

    config = SamplerConfig(eps=1e-3, gamma=10.0, chains=2, draws=4, burn_in=3, steps_between_draws=2,
                           progress=False)
    recorder = SamplerRecorder()
    result = bif(model, x, x[:3], loss_fn, config, callbacks=[recorder])
    assert [(c, d) for c, d, _, _ in recorder.draws] == [(c, d) for c in range(2) for d in range(4)]
    trace = result.diagnostics.loss_trace
    for chain, _, step, loss in recorder.draws:  # the minibatch loss of that SGLD step
        assert step >= config.burn_in and loss == float(trace[chain, step])
    assert [c for c, _ in recorder.chain_ends] == [0, 1]
    for chain, diagnostics in recorder.chain_ends:
        assert diagnostics["mean_loss"] == pytest.approx(float(trace[chain].mean()))
        assert diagnostics["initial_loss"] == result.diagnostics.initial_loss
        assert diagnostics["sampling_drift"] == pytest.approx(float(result.diagnostics.sampling_drift[chain]))

    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from interp_toolkit.loggers import TensorBoardLogger

    logger = TensorBoardLogger(log_dir=tmp_path / "sgld")
    bif(model, x, x[:3], loss_fn, config, callbacks=[logger])
    logger.close()
    events = EventAccumulator(str(tmp_path / "sgld"))
    events.Reload()
    assert [s.step for s in events.Scalars("sgld/loss_chain1")] == [d[2] for d in recorder.draws if d[0] == 1]
