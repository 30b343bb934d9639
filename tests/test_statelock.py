"""The state lock in-process: what a failed start leaves behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from proxy.statelock import StateLock


def test_a_start_that_fails_after_locking_leaves_no_lock_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner record could not be written (a full disk): the start is refused, and both locks
    (the lock file's and the database file's) must go with it, or the next start meets a lock
    that no running instance holds."""
    state = tmp_path / "state.db"

    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(os, "pwrite", full)
        with pytest.raises(OSError):
            StateLock.acquire(state, url="http://127.0.0.1:1", version="test")
    with StateLock.acquire(state, url="http://127.0.0.1:1", version="test") as lock:
        assert lock.path == tmp_path / "state.db.lock"
