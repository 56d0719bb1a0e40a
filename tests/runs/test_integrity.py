"""Every tensor file a run writes is verified on read: a flipped bit in the resume state, the
final state or a checkpoint (low mantissa bit, exponent bit, a digit of the JSON header) is a
user error naming the file (exit 2), and nothing already in the run directory changes."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from interp_toolkit.cli import main

TINY = ["--task.seq-len", "5", "--task.n-train", "128", "--task.n-eval", "64", "--model.d-model", "16",
        "--model.d-mlp", "16", "--train.eval-every", "1", "--train.checkpoint-every", "3", "--quiet"]


def train_args(run_dir: Path, epochs: int = 6, *extra: str) -> list[str]:
    return ["train", "--train.epochs", str(epochs), "--run-dir", str(run_dir), *TINY, *extra]


def _tensor_span(raw: bytes, name: str) -> tuple[int, int]:
    header_len = int.from_bytes(raw[:8], "little")
    start, end = json.loads(raw[8 : 8 + header_len])[name]["data_offsets"]
    return 8 + header_len + start, 8 + header_len + end


def flip_bit(path: Path, tensor: str, byte: int, bit: int) -> None:
    """Flip one bit of ``tensor``'s first float32 value (byte 0 bit 0: the lowest mantissa bit;
    byte 3 bit 6: an exponent bit)."""
    raw = bytearray(path.read_bytes())
    start, _ = _tensor_span(bytes(raw), tensor)
    raw[start + byte] ^= 1 << bit
    path.write_bytes(bytes(raw))


def change_header_digit(path: Path, after: bytes) -> None:
    """Change the first digit that follows ``after`` inside the file's JSON header (the
    header keeps its length, so the file stays a valid safetensors file)."""
    raw = bytearray(path.read_bytes())
    header_len = int.from_bytes(raw[:8], "little")
    at = raw.index(after, 8, 8 + header_len) + len(after)
    while not chr(raw[at]).isdigit():
        at += 1
    raw[at] = ord(str((int(chr(raw[at])) + 1) % 10))
    path.write_bytes(bytes(raw))


FLIPS = {
    "low_mantissa_bit": lambda path, tensor, key: flip_bit(path, tensor, 0, 0),
    "exponent_bit": lambda path, tensor, key: flip_bit(path, tensor, 3, 6),
    "header_digit": lambda path, tensor, key: change_header_digit(path, key),
}


def digests(run_dir: Path) -> dict[str, str]:
    """sha256 of every file under ``run_dir`` (but the lock file)."""
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != ".lock"}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("integrity") / "finished"
    assert main(train_args(run_dir)) == 0
    return run_dir


def make_interrupted_run(run_dir: Path) -> Path:
    """Train ``run_dir`` through the CLI and stop it (Ctrl-C) after its epoch-3 state is
    saved: resume.safetensors at epoch 3, evaluations 0..3 in metrics.jsonl."""
    import interp_toolkit.loggers as loggers
    from interp_toolkit.callbacks import Callback

    class StopAtThree(Callback):
        def on_evaluation(self, run_dir, metrics):
            if metrics["epoch"] == 3:
                raise KeyboardInterrupt

    original = loggers.loggers_from_flags
    loggers.loggers_from_flags = lambda args: [StopAtThree()]
    try:
        assert main(train_args(run_dir)) == 130
    finally:
        loggers.loggers_from_flags = original
    assert (run_dir / "resume.safetensors").is_file()
    return run_dir


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory) -> Path:
    return make_interrupted_run(tmp_path_factory.mktemp("integrity") / "interrupted")


@pytest.mark.parametrize("flip", sorted(FLIPS))
def test_flipped_resume_state_is_refused_naming_the_file(interrupted_run, tmp_path, flip, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(interrupted_run, run_dir)
    FLIPS[flip](run_dir / "resume.safetensors", "model/embed.weight", b"epoch")
    before = digests(run_dir)
    capsys.readouterr()
    assert main(train_args(run_dir)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "resume.safetensors" in err
    assert digests(run_dir) == before  # nothing resumed from it, nothing rewritten


def test_resume_state_of_the_earlier_unverified_format_is_refused_naming_it(interrupted_run, tmp_path, capsys):
    # format "1" had no digests; it was once read unverified, and now is refused like any other
    run_dir = tmp_path / "run"
    shutil.copytree(interrupted_run, run_dir)
    path = run_dir / "resume.safetensors"
    raw = bytearray(path.read_bytes())
    header_len = int.from_bytes(raw[:8], "little")
    at = raw.index(b"format", 8, 8 + header_len)
    while not chr(raw[at]).isdigit():
        at += 1
    assert chr(raw[at]) == "2"
    raw[at] = ord("1")
    path.write_bytes(bytes(raw))
    before = digests(run_dir)
    capsys.readouterr()
    assert main(train_args(run_dir)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "resume.safetensors" in err and "format '1', expected 2" in err
    assert digests(run_dir) == before


def test_unflipped_resume_state_resumes(interrupted_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(interrupted_run, run_dir)
    capsys.readouterr()
    assert main(train_args(run_dir)) == 0
    assert "resumed from epoch 3" in capsys.readouterr().out


def test_a_writer_killed_mid_write_leaves_no_temp_file_after_the_resume(interrupted_run, finished_run, tmp_path,
                                                                        capsys):
    """kill -9 during an atomic write leaves its ``.NAME.*.tmp`` (the target is untouched): the
    resumed run, holding the lock, removes it and ends byte-identical to an uninterrupted run."""
    run_dir = tmp_path / "run"
    shutil.copytree(interrupted_run, run_dir)
    (run_dir / "checkpoints" / ".epoch_000004.safetensors.r41391.tmp").write_bytes(b"half a checkpoint")
    (run_dir / ".metrics.jsonl.abc.tmp").write_bytes(b"{")
    capsys.readouterr()
    assert main(train_args(run_dir)) == 0
    assert not list(run_dir.rglob("*.tmp"))
    done = {k: v for k, v in digests(run_dir).items() if not k.endswith(".log")}
    reference = {k: v for k, v in digests(finished_run).items() if not k.endswith(".log")}
    assert set(done) == set(reference)


def test_resume_state_with_other_weights_than_its_checkpoint_is_refused(interrupted_run, tmp_path, capsys):
    """A resume state re-digested after an edit passes its own digests; the checkpoint of
    the same epoch (digest-verified) tells it is not this run's history."""
    from interp_toolkit.runs.resume import load_resume_state, save_resume_state

    run_dir = tmp_path / "run"
    shutil.copytree(interrupted_run, run_dir)
    path = run_dir / "resume.safetensors"
    state = load_resume_state(path)
    state["model"]["embed.weight"] = state["model"]["embed.weight"] + 1e-6
    save_resume_state(path, state["epoch"], state["run_key"], state["model"], state["optimizer_state"],
                      state["shuffle_rng"])
    capsys.readouterr()
    assert main(train_args(run_dir)) == 2
    err = capsys.readouterr().err
    assert "resume.safetensors" in err and "epoch_000003.safetensors" in err


@pytest.mark.parametrize("flip", sorted(FLIPS))
def test_flipped_final_state_is_refused_by_extend(finished_run, tmp_path, flip, capsys):
    source = tmp_path / "source"
    shutil.copytree(finished_run, source)
    FLIPS[flip](source / "final_state.safetensors", "model/embed.weight", b"epoch")
    target = tmp_path / "longer"
    capsys.readouterr()
    assert main(train_args(target, 9, "--extend-from", str(source))) == 2
    err = capsys.readouterr().err
    assert "final_state.safetensors" in err
    assert not (target / "metrics.jsonl").exists() and not (target / "checkpoints").exists()


def test_final_state_with_other_weights_than_the_last_checkpoint_is_refused(finished_run, tmp_path, capsys):
    from interp_toolkit.runs.resume import load_resume_state, save_resume_state

    source = tmp_path / "source"
    shutil.copytree(finished_run, source)
    path = source / "final_state.safetensors"
    state = load_resume_state(path)
    state["model"]["embed.weight"] = state["model"]["embed.weight"] * 1.001
    save_resume_state(path, state["epoch"], state["run_key"], state["model"], state["optimizer_state"],
                      state["shuffle_rng"])
    capsys.readouterr()
    assert main(train_args(tmp_path / "longer", 9, "--extend-from", str(source))) == 2
    err = capsys.readouterr().err
    assert "final_state.safetensors" in err and "epoch_000006.safetensors" in err


def test_extend_from_a_verified_final_state_trains_on(finished_run, tmp_path, capsys):
    capsys.readouterr()
    assert main(train_args(tmp_path / "longer", 9, "--extend-from", str(finished_run))) == 0
    assert "from epoch 6" in capsys.readouterr().out


@pytest.mark.parametrize("flip", sorted(FLIPS))
@pytest.mark.parametrize("command", ["info", "analyze"])
def test_flipped_checkpoint_is_refused_naming_the_file(finished_run, tmp_path, flip, command, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    checkpoint = run_dir / "checkpoints" / "epoch_000006.safetensors"
    FLIPS[flip](checkpoint, "embed.weight", b"acc")  # the header digit: a recorded accuracy
    argv = ["info", str(checkpoint)] if command == "info" else [
        "analyze", str(run_dir), "--analysis", "weight_norms", "--no-progress"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "epoch_000006.safetensors" in err
    assert not (run_dir / "analyses" / "weight_norms" / "weight_norms.csv").exists()


def test_a_warmup_as_long_as_the_run_is_refused_before_anything_is_written(tmp_path, capsys):
    run_dir = tmp_path / "run"
    capsys.readouterr()
    assert main(train_args(run_dir, 6, "--train.warmup-steps", "100000000000000000000")) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "never reach --lr" in err and "6 optimizer steps" in err
    assert not run_dir.exists() or not any(run_dir.iterdir())
    assert main(train_args(run_dir, 6, "--train.warmup-steps", "5")) == 0  # shorter than the run: trains
