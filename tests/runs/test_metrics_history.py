"""``metrics.jsonl`` and ``run.json`` are checked when read back: a hand-edited or torn
history is a user error naming the file and line, or (on resume) is repaired from the run's
own checkpoints with a one-line notice; a record set to "finished" mid-run is refused."""

from __future__ import annotations

import json
import shutil

import pytest

from interp_toolkit.cli import main
from interp_toolkit.runs.metrics import MetricsError, read_metrics

from .test_integrity import digests, make_interrupted_run, train_args


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("history") / "finished"
    assert main(train_args(run_dir)) == 0
    return run_dir


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory):
    return make_interrupted_run(tmp_path_factory.mktemp("history") / "interrupted")


def _edit_line(path, number, **changes):
    lines = path.read_text().splitlines()
    row = json.loads(lines[number - 1])
    row.update(changes)
    lines[number - 1] = json.dumps(row, sort_keys=True)
    path.write_text("\n".join(lines) + "\n")


BAD_ROWS = {
    "accuracy_above_one": {"adv_acc": 1.1953},
    "negative_accuracy": {"val_acc": -0.1},
    "nan_loss": {"train_loss": float("nan")},
    "infinite_loss": {"val_loss": float("inf")},
    "epoch_not_increasing": {"epoch": 1},
    "epoch_not_an_integer": {"epoch": "3"},
}


@pytest.mark.parametrize("fault", sorted(BAD_ROWS))
def test_bad_row_is_a_user_error_naming_file_and_line(finished_run, tmp_path, fault, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    _edit_line(run_dir / "metrics.jsonl", 4, **BAD_ROWS[fault])
    with pytest.raises(MetricsError, match=r"metrics\.jsonl line 4"):
        read_metrics(run_dir / "metrics.jsonl")
    capsys.readouterr()
    assert main(["mechanism", str(run_dir), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "metrics.jsonl line 4" in err


def test_garbage_line_and_binary_file_name_the_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"epoch": 0, "train_acc": 0.5}\nnot json\n{"epoch": 2}\n')
    with pytest.raises(MetricsError, match=r"metrics\.jsonl line 2: not JSON"):
        read_metrics(path)
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(MetricsError, match="metrics.jsonl is not UTF-8"):
        read_metrics(path)


def test_a_line_being_appended_is_left_out(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"epoch": 0, "train_acc": 0.5}\n{"epoch": 1, "tra')
    assert read_metrics(path) == [{"epoch": 0, "train_acc": 0.5}]


def _resume(run_dir, capsys):
    capsys.readouterr()
    code = main(train_args(run_dir))
    captured = capsys.readouterr()
    return code, captured.err


def test_resume_drops_a_torn_last_line_and_says_so(interrupted_run, finished_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(interrupted_run, run_dir)
    with open(run_dir / "metrics.jsonl", "a") as handle:
        handle.write('{"epoch": 4, "train_acc": 0.')
    code, err = _resume(run_dir, capsys)
    assert code == 0
    assert "note: " in err and "dropped 1 line(s)" in err and "torn last line" in err
    assert (run_dir / "metrics.jsonl").read_bytes() == (finished_run / "metrics.jsonl").read_bytes()


def test_resume_restores_a_hand_edited_row_from_its_checkpoint(interrupted_run, finished_run, tmp_path, capsys):
    """Epoch 3's line (a checkpoint epoch) edited to adv_acc 1.1953: dropped, restored from
    the checkpoint's metadata, and the run ends byte-identical to the uninterrupted one."""
    run_dir = tmp_path / "run"
    shutil.copytree(interrupted_run, run_dir)
    _edit_line(run_dir / "metrics.jsonl", 4, adv_acc=1.1953)
    code, err = _resume(run_dir, capsys)
    assert code == 0
    assert "dropped 1 line(s)" in err and "restored the evaluation(s) of epoch(s) [3]" in err
    assert (run_dir / "metrics.jsonl").read_bytes() == (finished_run / "metrics.jsonl").read_bytes()


def test_resume_restores_a_stale_short_copy_from_the_checkpoints(interrupted_run, finished_run, tmp_path, capsys):
    """metrics.jsonl replaced by an older copy holding epoch 0 only: epochs 1-3 (all
    checkpoint epochs of this schedule) are restored, and the notice says so."""
    run_dir = tmp_path / "run"
    shutil.copytree(interrupted_run, run_dir)
    path = run_dir / "metrics.jsonl"
    path.write_text(path.read_text().splitlines()[0] + "\n")
    code, err = _resume(run_dir, capsys)
    assert code == 0
    assert "restored the evaluation(s) of epoch(s) [1, 2, 3]" in err
    assert path.read_bytes() == (finished_run / "metrics.jsonl").read_bytes()


def test_resume_refuses_a_history_it_cannot_restore(interrupted_run, tmp_path, capsys):
    """Epoch 1's line missing and no checkpoint of epoch 1 to restore it from: refused,
    naming the file and the epoch, and nothing changed."""
    run_dir = tmp_path / "run"
    shutil.copytree(interrupted_run, run_dir)
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], *lines[2:]]) + "\n")
    (run_dir / "checkpoints" / "epoch_000001.safetensors").unlink()
    before = digests(run_dir)
    code, err = _resume(run_dir, capsys)
    assert code == 2
    assert "metrics.jsonl lacks the evaluation of epoch 1" in err
    assert digests(run_dir) == before


def test_record_set_to_finished_mid_run_is_refused(interrupted_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(interrupted_run, run_dir)
    record = json.loads((run_dir / "run.json").read_text())
    record["status"] = "finished"
    (run_dir / "run.json").write_text(json.dumps(record))
    before = digests(run_dir)
    code, err = _resume(run_dir, capsys)
    assert code == 2
    assert "run.json says the run finished" in err
    assert digests(run_dir) == before
    # with a forged final evaluation too, metrics.jsonl and the checkpoints contradict it
    record["final"] = {"epoch": 6, "train_acc": 1.0}
    (run_dir / "run.json").write_text(json.dumps(record))
    code, err = _resume(run_dir, capsys)
    assert code == 2 and "finished at epoch 6" in err


def test_extend_refuses_a_source_recorded_finished_mid_run(interrupted_run, tmp_path, capsys):
    source = tmp_path / "source"
    shutil.copytree(interrupted_run, source)
    record = json.loads((source / "run.json").read_text())
    record["status"] = "finished"
    (source / "run.json").write_text(json.dumps(record))
    capsys.readouterr()
    assert main(train_args(tmp_path / "longer", 9, "--extend-from", str(source))) == 2
    assert "run.json says the run finished" in capsys.readouterr().err
