"""Progress bars: plain lines, no carriage returns, where stderr is not a terminal."""

from __future__ import annotations

import io

from interp_toolkit.progress import STEP_PERCENT, QuietProgress, progress_bar


def test_quiet_progress_writes_one_plain_line_per_few_percent():
    stream = io.StringIO()
    bar = QuietProgress(total=1000, desc="SGLD", stream=stream)
    for _ in range(1000):
        bar.update(1)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 100 // STEP_PERCENT and "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()
    assert lines[0].startswith("SGLD: 5% (50/1000") and lines[-1].startswith("SGLD: 100% (1000/1000")


def test_quiet_progress_iterates_and_resumes():
    stream = io.StringIO()
    assert list(QuietProgress(range(40), desc="checkpoints", stream=stream)) == list(range(40))
    assert stream.getvalue().splitlines()[-1].startswith("checkpoints: 100% (40/40")
    resumed = io.StringIO()
    bar = QuietProgress(total=100, desc="x", stream=resumed, initial=50)
    bar.update(5)
    assert resumed.getvalue().startswith("x: 55% (55/100")


def test_progress_bar_is_quiet_off_a_terminal(capsys):
    bar = progress_bar(total=10, desc="SGLD")  # pytest's stderr is not a terminal
    assert isinstance(bar, QuietProgress)
    bar.update(10)
    assert capsys.readouterr().err.startswith("SGLD: 100%")
    assert not isinstance(progress_bar(total=10, disable=True), QuietProgress)


def test_quiet_progress_lines_carry_the_postfix_text():
    stream = io.StringIO()
    bar = QuietProgress(total=20, desc="sweep", stream=stream)
    bar.set_postfix_str("runs 3/16")
    bar.update(20)
    assert stream.getvalue().rstrip().endswith("s, runs 3/16)")


def test_training_and_sweeps_write_plain_lines_into_a_log(tmp_path, capsys):
    """The training loop's bar off a terminal: plain lines, no carriage returns."""
    from interp_toolkit.model import ModelConfig
    from interp_toolkit.runs.config import TrainConfig
    from interp_toolkit.runs.mpsp import train_mpsp
    from interp_toolkit.tasks.mpsp import MPSPConfig

    task = MPSPConfig(seq_len=4, n_values=5, r=0.9, n_train=64, n_eval=16)
    model = ModelConfig(n_layers=1, n_heads=1, d_model=16, d_mlp=16, **task.model_dims())
    train_mpsp(task, model, TrainConfig(epochs=40, eval_every=10, progress=True), run_dir=tmp_path / "run")
    err = capsys.readouterr().err
    assert "\r" not in err and "100% (40/40" in err
