"""The state lock in-process: what a failed start leaves behind, and a start meeting an instance
that is stopping."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest

from proxy.statelock import ACQUIRE_PATIENCE_S, StateInUse, StateLock, running_owner


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


def test_a_start_waits_for_an_instance_on_its_state_file_that_is_stopping(tmp_path: Path) -> None:
    """A restart right after a stop (the old instance still giving its requests their grace) was
    refused with exit 2, which a service manager takes for a setup it must not retry (found by a
    lifecycle trial). An instance that is stopping says so in its lock, and a start waits for it."""
    state = tmp_path / "state.db"
    old = StateLock.acquire(state, url="http://127.0.0.1:1", version="test")
    old.mark_stopping()
    owner = running_owner(state)
    assert owner is not None and owner.stopping
    assert owner.describe() == f"pid {os.getpid()}, stopping (it served on 127.0.0.1:1)"
    stopped = threading.Timer(3 * ACQUIRE_PATIENCE_S, old.release)  # its grace, then its stop
    stopped.start()
    started = time.monotonic()
    try:
        with StateLock.acquire(state, url="http://127.0.0.1:2", version="test"):
            assert time.monotonic() - started >= 2 * ACQUIRE_PATIENCE_S
            owner = running_owner(state)
            assert owner is not None and (owner.url, owner.stopping) == ("http://127.0.0.1:2", False)
    finally:
        stopped.join()


def test_a_start_does_not_wait_for_an_instance_that_serves(tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    with StateLock.acquire(state, url="http://127.0.0.1:1", version="test"):
        started = time.monotonic()
        with pytest.raises(StateInUse, match=r"pid \d+, serving on 127\.0\.0\.1:1"):
            StateLock.acquire(state, url="http://127.0.0.1:2", version="test")
        assert time.monotonic() - started < ACQUIRE_PATIENCE_S + 1.0
