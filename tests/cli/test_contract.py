"""The command line's shape: help text has one source, a closed pipe ends quietly, and the
library (not ``interp_toolkit.cli``) holds what a command does."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

from interp_toolkit.cli import COMMANDS, main


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_one_line_help_has_one_source(command):
    module = importlib.import_module(COMMANDS[command][0])
    assert not hasattr(module, "HELP"), f"{module.__name__}.HELP repeats COMMANDS[{command!r}]"
    assert isinstance(module.DESCRIPTION, str) and module.DESCRIPTION


def test_top_level_help_lists_the_commands_help(capsys):
    assert main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for name, (_, help_text) in COMMANDS.items():
        assert f"{name} {help_text}" in out


@pytest.mark.parametrize("lines", [10, 100_000])
def test_output_into_a_closed_pipe_ends_quietly(lines):
    """``interp-toolkit ... | head`` where head stopped reading: status 1, nothing on stderr
    (no traceback, no crash log, no 'Exception ignored' at the interpreter's exit), whether
    the pipe breaks while the command prints (100,000 lines) or at the last flush (10)."""
    code = ("import sys, interp_toolkit.cli.info as info; from interp_toolkit.cli import main; "
            f"info.run_config = lambda args: print('row\\n' * {lines}, end='') or 0; "
            "sys.exit(main(['info', 'anything']))")
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will ever read: the first write fails with EPIPE
    try:
        done = subprocess.run([sys.executable, "-c", code], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    finally:
        os.close(write_end)
    assert done.returncode == 1, done.stderr
    assert done.stderr == ""


def test_a_broken_pipe_inside_a_command_is_not_reported_as_a_bug(monkeypatch, capsys, tmp_path):
    import interp_toolkit.cli.info as info_command

    def reader_gone(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setenv("INTERP_TOOLKIT_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setattr(info_command, "run_config", reader_gone)
    assert main(["info", "anything"]) == 1
    assert capsys.readouterr().err == ""
    assert not (tmp_path / "logs").exists()  # no crash log: not a bug


def test_demo_and_info_import_no_other_command():
    """A command module imports the library, not another command's module."""
    code = ("import sys, interp_toolkit.cli.demo, interp_toolkit.cli.info; "
            "print(sorted(m for m in sys.modules if m.startswith('interp_toolkit.cli.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['interp_toolkit.cli.demo', 'interp_toolkit.cli.info']"
