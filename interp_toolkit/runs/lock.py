"""One writer per run directory and per study directory.

:class:`DirectoryLock` takes an OS file lock (``fcntl.flock``) on ``DIR/.lock``. The
kernel releases it when the holding process exits in any way (normal exit, exception,
``kill -9``), so a lock is never stale; a second writer, in this process or another, is
refused at once with :class:`DirectoryLockedError` naming the holder's PID as the kernel
reports it (``/proc/locks``; the PID the holder writes into the lock file is only a
fallback where that table cannot be read, and is marked as unconfirmed). The holder deletes the lock file when it
releases the
lock (while still holding it), and a taker checks after locking that the file it locked is
still the one at the path, retrying otherwise, so two processes never hold two different
files of the same name; a killed holder leaves its file behind, unlocked and harmless.

Re-entrant within one process: locking a directory this process already holds only
counts up, so a trainer called from a sweep job that holds the same directory works.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any

from interp_toolkit.errors import UserError
from interp_toolkit.runs.layout import LOCK

LOCK_NAME = LOCK

# resolved directory -> [open lock file, hold count]; flock is per open file description,
# so the process keeps one descriptor per directory and counts nested holds on it.
_HELD: dict[Path, list[Any]] = {}
_HELD_GUARD = threading.Lock()


class DirectoryLockedError(UserError):
    """Another process is writing to the directory (its PID is in the message)."""


def _holder_fields(lock_path: Path) -> dict[str, str] | None:
    """The ``pid=... host=...`` fields a holder writes into its lock file (None: no file)."""
    try:
        text = lock_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return dict(part.split("=", 1) for part in text.split() if "=" in part)


#: Where Linux lists every file lock held now, with the holder's PID.
PROC_LOCKS = Path("/proc/locks")


def kernel_lock_holders(lock_path: Path) -> list[int] | None:
    """PIDs holding a ``flock`` on ``lock_path`` now, as the kernel reports them
    (``/proc/locks``, matched by device and inode); None where the kernel's table cannot be
    read (not Linux), so the caller knows it has no answer rather than an empty one."""
    try:
        stat = os.stat(lock_path)
        table = PROC_LOCKS.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    by_inode: list[int] = []
    exact: list[int] = []
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->":  # "->": a waiter, not a holder
            continue
        try:
            pid = int(fields[4])
            inode = int(fields[5].rsplit(":", 1)[1])
        except (ValueError, IndexError):
            continue
        if inode != stat.st_ino or pid <= 0:
            continue
        by_inode.append(pid)
        if fields[5] == device:
            exact.append(pid)
    # Overlay file systems may list the lower device: fall back to the inode alone.
    return sorted(set(exact or by_inode))


def _holder_of(lock_path: Path) -> str:
    """Who holds ``lock_path``: the live PID the kernel reports, never only the text a holder
    wrote (a stale file can name a dead or reused PID that a user would be told to stop)."""
    fields = _holder_fields(lock_path) or {}
    host = f" on {fields['host']}" if fields.get("host") else ""
    pids = kernel_lock_holders(lock_path)
    if pids:
        named = fields.get("pid") in {str(p) for p in pids}
        return "process " + ", ".join(str(p) for p in pids) + (host if named else "")
    if "pid" in fields:
        return f"process {fields['pid']}{host} (as its lock file says; the kernel's lock table could not confirm it)"
    return "an unknown process"


class DirectoryLock:
    """Exclusive lock of a directory for the life of the holder (a context manager).

    Args:
        directory: The directory to lock (created if missing).
        what: How the directory is named in errors (``"run directory"``, ``"study directory"``).

    Raises:
        DirectoryLockedError: On ``acquire`` when another process holds the directory.
    """

    def __init__(self, directory: str | os.PathLike, what: str = "directory") -> None:
        self.directory = Path(directory)
        self.what = what
        self._key: Path | None = None
        self._created_dir = False

    @property
    def lock_path(self) -> Path:
        return self.directory / LOCK_NAME

    def acquire(self) -> "DirectoryLock":
        import fcntl

        if self._key is not None:
            return self
        if self.directory.exists() and not self.directory.is_dir():
            raise UserError(f"{self.what} {self.directory} exists and is not a directory")
        self._created_dir = not self.directory.exists()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(f"cannot create {self.what} {self.directory}: {err.strerror or err}") from err
        key = self.directory.resolve()
        with _HELD_GUARD:
            held = _HELD.get(key)
            if held is not None:
                held[1] += 1
                self._key = key
                return self
            while True:
                try:
                    handle = open(self.lock_path, "a+", encoding="utf-8")  # noqa: SIM115 - held open on purpose
                except OSError as err:
                    raise UserError(f"cannot create the lock file {self.lock_path}: {err.strerror or err}") from err
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    handle.close()
                    self._remove_if_created()
                    raise DirectoryLockedError(
                        f"{self.what} {self.directory} is in use by {_holder_of(self.lock_path)} "
                        f"(lock file {self.lock_path}); wait for it to finish, or stop it first"
                    ) from None
                try:  # the previous holder may have deleted the file between our open and lock
                    if os.stat(self.lock_path).st_ino == os.fstat(handle.fileno()).st_ino:
                        break
                except FileNotFoundError:
                    pass
                handle.close()
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid={os.getpid()} host={socket.gethostname()}\n")
            handle.flush()
            _HELD[key] = [handle, 1]
            self._key = key
        return self

    def release(self) -> None:
        import fcntl

        if self._key is None:
            return
        with _HELD_GUARD:
            held = _HELD[self._key]
            held[1] -= 1
            if held[1] == 0:
                handle = held[0]
                try:
                    self.lock_path.unlink(missing_ok=True)  # still locked: no one else can be using it
                    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
                finally:
                    handle.close()
                del _HELD[self._key]
                self._remove_if_created()
        self._key = None

    def _remove_if_created(self) -> None:
        """A directory this lock created and nothing else wrote to is removed again, so a
        refused or failed command leaves no empty directory behind."""
        if not self._created_dir:
            return
        try:
            if not any(self.directory.iterdir()):
                self.directory.rmdir()
        except OSError:
            pass

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def lock_holder(directory: str | os.PathLike) -> str | None:
    """Who is writing to ``directory`` now, read without touching the lock.

    On this host the kernel's lock table (``/proc/locks``) answers: the PID holding the
    lock, or None. Elsewhere (or without that table) it reads the holder's ``pid=...
    host=...`` line from ``DIR/.lock``: a holder on this host counts only while its process
    is alive; one on another host cannot be checked from here and is reported as is.
    The lock itself is never taken, so a sweep starting at the same moment is not refused.

    Returns:
        ``"process PID on HOST"`` (with ``", another host"`` when HOST is not this one), or
        None when no live process holds the directory.
    """
    lock_path = Path(directory) / LOCK_NAME
    fields = _holder_fields(lock_path) or {}
    host = fields.get("host", "")
    if not host or host == socket.gethostname():
        pids = kernel_lock_holders(lock_path) if lock_path.exists() else []
        if pids is not None:  # the kernel knows: its holder, or nobody
            return f"process {pids[0]} on {socket.gethostname()}" if pids else None
    try:
        pid = int(fields.get("pid", ""))
    except ValueError:
        return None
    if host and host != socket.gethostname():
        return f"process {pid} on {host}, another host"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, owned by another user
        pass
    return f"process {pid} on {host or socket.gethostname()}"


__all__ = ["LOCK_NAME", "DirectoryLock", "DirectoryLockedError", "kernel_lock_holders", "lock_holder"]
