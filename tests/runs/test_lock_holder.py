"""The lock names its live holder as the kernel reports it, not the PID text in the file:
a stale ``.lock`` naming another (live, unrelated) process must not send the user after it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from interp_toolkit.runs.lock import (
    LOCK_NAME,
    DirectoryLock,
    DirectoryLockedError,
    kernel_lock_holders,
    lock_holder,
)

# Takes the flock without rewriting the file (as a holder killed between locking and writing
# its line, or a foreign tool, leaves it), then waits.
_HOLD = ("import fcntl, sys, time\n"
         "handle = open(sys.argv[1], 'a+')\n"
         "fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
         "print('held', flush=True)\n"
         "time.sleep(60)\n")


@pytest.fixture
def stale_file_live_holder(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    lock_path = folder / LOCK_NAME
    # The text names this test's parent process: alive, and not the holder.
    lock_path.write_text(f"pid={os.getppid()} host={socket.gethostname()}\n")
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(lock_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield folder, holder.pid
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="the kernel's lock table is Linux's /proc/locks")
def test_refusal_names_the_kernels_holder_not_the_files_text(stale_file_live_holder):
    folder, pid = stale_file_live_holder
    assert kernel_lock_holders(folder / LOCK_NAME) == [pid]
    with pytest.raises(DirectoryLockedError) as refused:
        DirectoryLock(folder, "run directory").acquire()
    message = str(refused.value)
    assert f"process {pid}" in message and f"process {os.getppid()}" not in message
    assert lock_holder(folder) == f"process {pid} on {socket.gethostname()}"


def test_without_the_kernels_table_the_files_pid_is_marked_unconfirmed(stale_file_live_holder, monkeypatch,
                                                                        tmp_path):
    import interp_toolkit.runs.lock as lock

    folder, _ = stale_file_live_holder
    monkeypatch.setattr(lock, "PROC_LOCKS", tmp_path / "no-such-table")
    with pytest.raises(DirectoryLockedError, match="could not confirm it"):
        DirectoryLock(folder, "run directory").acquire()
