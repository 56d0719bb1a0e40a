"""One function decides where a run directory stands (``run_dir_state``), for ``train`` and
``train_batched`` alike; one helper writes back a recovered record (``write_recovered_record``)."""

import json

import pytest

from interp_toolkit.callbacks import Callback
from interp_toolkit.errors import UserError
from interp_toolkit.io import config_hash
from interp_toolkit.model import build_model
from interp_toolkit.runs.batched import train_batched
from interp_toolkit.runs.record import read_record, write_recovered_record
from interp_toolkit.runs.resume import (
    RESUME_NAME,
    ForeignRunDirectoryError,
    list_checkpoints,
    run_dir_state,
)
from interp_toolkit.runs.trainer import TrainConfig, run_identity, train
from interp_toolkit.tasks.mpsp import make_splits

CFG = TrainConfig(epochs=6, eval_every=2, checkpoint_every=3, progress=False)


class StopAt(Callback):
    """Raises after the evaluation of ``epoch`` is saved: the run is left resumable there."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_evaluation(self, run_dir, metrics):
        if metrics["epoch"] == self.epoch:
            raise RuntimeError("stopped")


@pytest.fixture
def splits(small_task):
    return make_splits(small_task)


def _key(model_cfg, splits, cfg=CFG):
    return config_hash(run_identity(model_cfg.to_dict(), cfg, splits, None))


def test_fresh_resume_and_finished_states(tmp_path, splits, small_model_cfg):
    key = _key(small_model_cfg, splits)
    run = tmp_path / "run"
    fresh = run_dir_state(run, key, CFG.epochs)
    assert (fresh.status, fresh.start_epoch, fresh.record, fresh.recovered) == ("fresh", 0, None, False)

    with pytest.raises(RuntimeError, match="stopped"):
        train(build_model(small_model_cfg), splits, CFG, run, callbacks=[StopAt(4)])
    resumable = run_dir_state(run, key, CFG.epochs)
    assert (resumable.status, resumable.start_epoch) == ("resume", 4)
    assert resumable.record["status"] == "running" and resumable.resume_state["epoch"] == 4

    result = train(build_model(small_model_cfg), splits, CFG, run)
    assert result.resumed_from == 4  # train() resumed from the state run_dir_state found
    finished = run_dir_state(run, key, CFG.epochs)
    assert (finished.status, finished.recovered) == ("finished", False)
    assert finished.record == read_record(run) and finished.resume_state is None


def test_batched_classifies_with_the_same_function(tmp_path, splits, small_model_cfg):
    with pytest.raises(RuntimeError, match="stopped"):
        train(build_model(small_model_cfg), splits, CFG, tmp_path / "run", callbacks=[StopAt(2)])
    result = train_batched([small_model_cfg], splits, CFG, [tmp_path / "run"])
    assert result.resumed_from == [2] and result.already_finished == [False]
    again = train_batched([small_model_cfg], splits, CFG, [tmp_path / "run"])
    assert again.already_finished == [True]


@pytest.mark.parametrize("trainer", ["train", "batched"])
def test_copy_without_run_json_is_recovered_and_its_record_written_back(tmp_path, splits, small_model_cfg,
                                                                         trainer):
    run = tmp_path / "run"
    train(build_model(small_model_cfg), splits, CFG, run)
    original = read_record(run)
    (run / "run.json").unlink()
    key = _key(small_model_cfg, splits)
    state = run_dir_state(run, key, CFG.epochs)
    assert (state.status, state.recovered) == ("finished", True)
    assert state.record["key"] == key and state.record["final"] == original["final"]
    assert run_dir_state(run, key).status == "fresh"  # without the last epoch nothing is recovered

    if trainer == "train":
        result = train(build_model(small_model_cfg), splits, CFG, run)
        assert result.already_finished and result.final == original["final"]
    else:
        assert train_batched([small_model_cfg], splits, CFG, [run]).already_finished == [True]
    rebuilt = read_record(run)
    for field in ("key", "status", "final", "identity", "train_config", "model_config", "run_info"):
        assert rebuilt[field] == original[field], field
    assert "recovered" in rebuilt


def test_write_recovered_record_completes_the_record(tmp_path):
    recovered = {"key": "k", "status": "finished", "final": {"epoch": 3}}
    written = write_recovered_record(tmp_path, recovered, identity={"a": 1}, model_config={"n_layers": 1},
                                     train_config={"epochs": 3}, run_info=None)
    on_disk = json.loads((tmp_path / "run.json").read_text())
    assert on_disk == written
    assert {k: on_disk[k] for k in recovered} == recovered
    assert on_disk["identity"] == {"a": 1} and on_disk["run_info"] == {} and "torch" in on_disk["versions"]


def test_foreign_and_checkpointless_directories_are_refused(tmp_path, splits, small_model_cfg):
    run = tmp_path / "run"
    train(build_model(small_model_cfg), splits, CFG, run)
    with pytest.raises(ForeignRunDirectoryError, match="different run"):
        run_dir_state(run, "another-key", CFG.epochs)
    for _, path in list_checkpoints(run):
        path.unlink()
    with pytest.raises(UserError, match="holds no checkpoint"):
        run_dir_state(run, _key(small_model_cfg, splits), CFG.epochs)
    assert not (run / RESUME_NAME).exists()
