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
