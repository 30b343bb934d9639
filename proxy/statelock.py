"""One state file, one owner: an exclusive lock on `state.db.lock`, held for the instance's life.

Two instances on one state file each keep their own view of the engine and each write whole
settings documents, so one silently overwrites what the other acknowledged. The lock makes the
second one refuse to start instead.

Why `flock(2)` on a file beside the database: the kernel drops the lock when the process ends,
however it ends (`kill -9` included), so a lock is never stale and nothing needs cleaning up;
whether the file exists says nothing, only whether it is locked does. The file holds JSON
`{pid, url, version, started}`, written as soon as the lock is taken (the socket is bound by
then): the second instance quotes it, and `omniroute status` finds the running instance's address
in it. The file is never deleted: with a deleted lock file, a third process could lock a new file
under the same name while a second still holds the old one.

The database file itself is locked too (`_lock_the_file`): a hard link gives it another name, with
a lock file of its own beside that name.

Only the standard library is imported here: the CLI's read commands use `running_owner`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["HardLinked", "Owner", "StateInUse", "StateLock", "lock_path", "running_owner"]

ACQUIRE_PATIENCE_S = 0.5
"""How long a start retries a held lock: `running_owner` holds a shared lock for microseconds to
test the file, and a start at that very moment must not be refused for it."""
STOP_PATIENCE_S = 10.0
"""How long a start waits for an instance on its state file that is stopping (its in-flight
requests' grace, then its state written and its lock given up): a restart right after a stop must
not be refused for it (exit 2, which a service manager does not retry)."""
_RETRY_S = 0.02


def lock_path(state_path: Path) -> Path:
    """`state.db` → `state.db.lock`, in the same directory: the file's own, with symbolic links
    followed (of the file or of a directory on the way), so that every name of one state file
    that a link makes leads to one lock. (A hard link is another name for the same inode in a
    directory entry of its own: its lock file is its own; the lock on the file itself catches it.)"""
    real = state_path.resolve()
    return real.with_name(real.name + ".lock")


@dataclass(frozen=True, slots=True)
class Owner:
    """What the instance holding a state file wrote about itself (None where unreadable)."""

    pid: int | None
    url: str | None
    version: str | None
    started: str | None
    stopping: bool = False
    """It has begun to stop (`StateLock.mark_stopping`): a start waits for it."""

    @classmethod
    def parse(cls, text: str) -> Owner:
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            return cls(None, None, None, None)
        return cls(
            _typed(data, "pid", int),
            _typed(data, "url", str),
            _typed(data, "version", str),
            _typed(data, "started", str),
            data.get("stopping") is True,
        )

    def describe(self) -> str:
        """`pid 4242, serving on 127.0.0.1:20128`: what an operator needs to find it."""
        parts = [f"pid {self.pid}" if self.pid is not None else "pid unknown"]
        if self.url:
            where = self.url.removeprefix("http://").removeprefix("https://")
            parts.append(f"stopping (it served on {where})" if self.stopping else f"serving on {where}")
        elif self.stopping:
            parts.append("stopping")
        return ", ".join(parts)


class StateInUse(Exception):
    """Another process holds the state file's lock."""

    def __init__(self, state_path: Path, owner: Owner) -> None:
        self.state_path = state_path
        self.owner = owner
        message = (
            f"{state_path} is in use by omniroute ({owner.describe()}); stop that instance first,"
            " or give this one another state file (--state or OMNIROUTE_STATE)"
        )
        if owner.url:  # most often, whoever meets this wanted to look at that instance
            message += f"; to watch it, attach the console: omniroute tui --url {owner.url}"
        super().__init__(message)


class StateLock:
    """The held lock; `release()` (or leaving the `with` block) gives it up. Process exit does too."""

    def __init__(
        self, path: Path, fd: int, file_fd: int | None = None, record: dict[str, Any] | None = None
    ) -> None:
        self.path = path
        self._fd: int | None = fd
        self._file_fd = file_fd
        self._record = record or {}

    @classmethod
    def acquire(
        cls, state_path: Path, *, url: str, version: str, waiting: Callable[[Owner], None] | None = None
    ) -> StateLock:
        """Lock `state_path`'s lock file and the database file itself, and write who holds it;
        `waiting` is told once when the start waits for an instance that is stopping.

        StateInUse when another process holds it; OSError when the lock file cannot be created
        or written (its directory is not writable, the disk is full).
        """
        path = lock_path(state_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        file_fd = None
        try:
            if not _lock_patiently(fd, waiting):
                raise StateInUse(state_path, Owner.parse(_read(fd)))
            owner = {
                "pid": os.getpid(),
                "url": url,
                "version": version,
                "started": datetime.now(UTC).isoformat(timespec="seconds"),
            }
            file_fd = _lock_the_file(state_path)
            _write(fd, owner)
        except BaseException:
            os.close(fd)  # closing drops the lock if we took it
            if file_fd is not None:
                os.close(file_fd)
            raise
        return cls(path, fd, file_fd, owner)

    def mark_stopping(self) -> None:
        """The instance has begun to stop: its record says so, and a start on the same state file
        waits for the lock (STOP_PATIENCE_S) instead of being refused. Best effort: a record that
        cannot be written (a full disk) only costs that start its patience."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                _write(self._fd, {**self._record, "stopping": True})

    def release(self) -> None:
        """Idempotent. The owner record is cleared first, so the file never names a stopped instance."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):  # the lock goes with the descriptor either way
            os.ftruncate(fd, 0)
        os.close(fd)
        file_fd, self._file_fd = self._file_fd, None
        if file_fd is not None:
            os.close(file_fd)

    def __enter__(self) -> StateLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class HardLinked(StateInUse):
    """Another process holds the state file under another name (a hard link): its lock file is
    beside that name, so who it is cannot be read here."""

    def __init__(self, state_path: Path) -> None:
        self.state_path = state_path
        self.owner = Owner(None, None, None, None)
        Exception.__init__(
            self,
            f"{state_path} is in use by another omniroute instance, under another name for the same"
            " file (a hard link); stop that instance first, or give this one another state file"
            " (--state or OMNIROUTE_STATE)",
        )


def _lock_the_file(state_path: Path) -> int | None:
    """Lock the database file itself too, for the name a hard link gives it: another directory
    entry for the same file, with a lock file of its own beside it (and SQLite would keep a
    write-ahead log of its own beside it too). An `flock` on the file is a lock on the file,
    whatever its name; SQLite's own locks are `fcntl` locks, which `flock` does not meet. Raises
    HardLinked when another process holds it; None (no second lock) when the file cannot be opened
    here: the database then says why it cannot be opened, in its own words."""
    try:
        # (O_NONBLOCK: a FIFO at the path would otherwise hold the open until someone writes to it)
        fd = os.open(
            state_path, os.O_RDONLY | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o644
        )
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # not a database: the store says what it is
        os.close(fd)
        return None
    try:
        if not _lock_patiently(fd):
            raise HardLinked(state_path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lock_patiently(fd: int, waiting: Callable[[Owner], None] | None = None) -> bool:
    """Take `fd`'s exclusive lock, retrying for ACQUIRE_PATIENCE_S, and for STOP_PATIENCE_S while its
    holder is stopping (or its record is blank: one that is giving the lock up clears it first);
    False when it stays held."""
    started = time.monotonic()
    told = False
    while not _try_lock(fd, exclusive=True):
        waited = time.monotonic() - started
        if waited >= ACQUIRE_PATIENCE_S:
            owner = Owner.parse(_read(fd))
            if waited >= STOP_PATIENCE_S or not (owner.stopping or owner.pid is None):
                return False
            if waiting is not None and owner.stopping and not told:
                waiting(owner)
                told = True
        time.sleep(_RETRY_S)
    return True


def _write(fd: int, record: dict[str, Any]) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)


def running_owner(state_path: Path) -> Owner | None:
    """The instance holding `state_path`, or None when nothing runs on it (the lock is free)."""
    try:
        fd = os.open(lock_path(state_path), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        if _try_lock(fd, exclusive=False):
            return None  # free: whatever the file says is from an instance that has ended
        return Owner.parse(_read(fd))
    finally:
        os.close(fd)  # also drops the shared lock, if taken


def _read(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode("utf-8", "replace")


def _typed(data: dict[str, Any], key: str, kind: type[Any]) -> Any:
    value = data.get(key)
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


if sys.platform == "win32":

    def _try_lock(fd: int, *, exclusive: bool) -> bool:
        # Windows has no flock: the instance runs without the lock (mandatory byte-range locks
        # would keep the second instance from even reading who holds the file).
        return True

else:
    import fcntl

    def _try_lock(fd: int, *, exclusive: bool) -> bool:
        """Take the lock without waiting; False when another open file description holds it."""
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True
