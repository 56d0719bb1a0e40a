"""A checkpoint of another run is refused by every reader of a run's checkpoints, in the
current format and in format 1 (which records no run key): ``analyze`` and ``mechanism``
exit 2 naming the file, as ``bif`` does."""

from __future__ import annotations

import json
import shutil

import pytest

from interp_toolkit.checkpoint import read_checkpoint
from interp_toolkit.cli import main

from ..runs.test_integrity import train_args


def write_format_1(source, target, drop_run_key: bool = True) -> None:
    """Rewrite checkpoint ``source`` as a format-1 file (separate header keys, no digests)."""
    from safetensors.torch import save

    cfg, tensors, metadata = read_checkpoint(source)
    if drop_run_key:
        metadata = {k: v for k, v in metadata.items() if k != "run_key"}
    target.write_bytes(save(tensors, metadata={"interp_toolkit.format": "1",
                                               "interp_toolkit.model_config": json.dumps(cfg.to_dict()),
                                               "interp_toolkit.metadata": json.dumps(metadata)}))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("belongs")
    assert main(train_args(root / "parity")) == 0
    assert main(train_args(root / "mod3", 6, "--task-name", "first_mod3_sum_mod3")) == 0
    return root / "parity", root / "mod3"


COMMANDS = {
    "analyze": lambda run: ["analyze", str(run), "--analysis", "weight_norms", "--no-progress", "--no-plot"],
    "mechanism": lambda run: ["mechanism", str(run), "--no-progress"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("checkpoint_format", ["current", "format_1"])
def test_checkpoint_of_another_task_is_refused(runs, tmp_path, command, checkpoint_format, capsys):
    parity, mod3 = runs
    run_dir = tmp_path / "parity"
    shutil.copytree(parity, run_dir)
    planted = run_dir / "checkpoints" / "epoch_000006.safetensors"
    foreign = mod3 / "checkpoints" / "epoch_000006.safetensors"
    if checkpoint_format == "format_1":
        write_format_1(foreign, planted)
    else:
        shutil.copyfile(foreign, planted)
    capsys.readouterr()
    assert main(COMMANDS[command](run_dir)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "epoch_000006.safetensors" in err
    assert ("d_vocab_out" in err) if checkpoint_format == "format_1" else ("belongs to run" in err)


def test_format_1_copy_of_the_runs_own_checkpoint_is_analysed(runs, tmp_path, capsys):
    parity, _ = runs
    run_dir = tmp_path / "parity"
    shutil.copytree(parity, run_dir)
    checkpoint = run_dir / "checkpoints" / "epoch_000006.safetensors"
    write_format_1(checkpoint, checkpoint)
    capsys.readouterr()
    assert main(COMMANDS["analyze"](run_dir)) == 0
    assert "6 checkpoint(s) computed" in capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("target", ["epoch_000005", "epoch_000004"])  # off and on the run's schedule
def test_checkpoint_renamed_to_another_epoch_is_refused(runs, tmp_path, command, target, capsys):
    parity, _ = runs
    run_dir = tmp_path / "parity"
    shutil.copytree(parity, run_dir)
    shutil.rmtree(run_dir / "analyses", ignore_errors=True)
    shutil.copyfile(run_dir / "checkpoints" / "epoch_000003.safetensors",
                    run_dir / "checkpoints" / f"{target}.safetensors")
    before = sorted(p.name for p in run_dir.rglob("*"))
    capsys.readouterr()
    assert main(COMMANDS[command](run_dir)) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1
    assert f"{target}.safetensors is named epoch {int(target[6:])} but its header records epoch 3" in captured.err
    assert sorted(p.name for p in run_dir.rglob("*")) == before  # refused before any work


def test_checkpoint_off_the_runs_schedule_is_refused(runs, tmp_path):
    from interp_toolkit.checkpoint import load_checkpoint, save_checkpoint
    from interp_toolkit.errors import CheckpointError
    from interp_toolkit.runs.record import check_checkpoint_belongs, read_record

    parity, _ = runs
    run_dir = tmp_path / "parity"
    shutil.copytree(parity, run_dir)
    model, metadata = load_checkpoint(run_dir / "checkpoints" / "epoch_000003.safetensors")
    planted = save_checkpoint(model, run_dir / "checkpoints" / "epoch_000005.safetensors",
                              metadata={**metadata, "epoch": 5})  # header and name agree: 5
    with pytest.raises(CheckpointError, match="epoch 5, which is not on the schedule of the run it sits in "
                                              r"\(0, 1, 2, 3, 4, 6\)"):
        check_checkpoint_belongs(planted, run_dir)
    check_checkpoint_belongs(run_dir / "checkpoints" / "epoch_000004.safetensors", run_dir)  # its own: fine
    # an early stop's last checkpoint is on the schedule
    record = read_record(run_dir)
    (run_dir / "run.json").write_text(json.dumps({**record, "stopped_early_at": 5}))
    check_checkpoint_belongs(planted, run_dir)


def test_info_names_a_checkpoint_that_does_not_belong_to_the_run(runs, tmp_path, capsys):
    parity, mod3 = runs
    run_dir = tmp_path / "parity"
    shutil.copytree(parity, run_dir)
    planted = run_dir / "checkpoints" / "epoch_000006.safetensors"
    shutil.copyfile(mod3 / "checkpoints" / "epoch_000006.safetensors", planted)
    capsys.readouterr()
    assert main(["info", str(planted)]) == 0
    out = capsys.readouterr().out
    assert f"run {run_dir}: this checkpoint does not belong to it" in out and "belongs to run" in out
    assert "task: {" not in out  # the run's task is never shown beside a model that cannot serve it
    assert main(["info", str(run_dir / "checkpoints" / "epoch_000003.safetensors")]) == 0
    assert f"run {run_dir}  task: " in capsys.readouterr().out
