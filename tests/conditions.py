"""Real failure conditions for files: a file or directory nobody may write, and a small full disk.

Each one is produced for real where the machine allows it, and the test is skipped (saying why)
where it does not; none is faked. As root, mode bits do not stop a write, so an unwritable path
is made immutable (`chattr +i`, which stops root too); as anyone else, `chmod a-w` does it. A full
disk is a small tmpfs mounted for the test (root only).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = ["fill_up", "small_disk", "unwritable"]


def _run(*command: str) -> bool:
    if shutil.which(command[0]) is None:
        return False
    return subprocess.run(command, capture_output=True, timeout=30).returncode == 0


@contextmanager
def unwritable(*paths: Path) -> Iterator[None]:
    """Make each path (file or directory) unwritable for this process, restoring it afterwards."""
    root = os.geteuid() == 0
    done: list[tuple[Path, int]] = []
    try:
        for path in paths:
            mode = path.stat().st_mode
            if root:
                if not _run("chattr", "+i", str(path)):
                    pytest.skip(f"running as root and `chattr +i {path}` is not possible here")
            else:
                path.chmod(stat.S_IMODE(mode) & ~0o222)
            done.append((path, mode))
        yield
    finally:
        for path, mode in reversed(done):
            if root:
                _run("chattr", "-i", str(path))
            else:
                path.chmod(stat.S_IMODE(mode))


@contextmanager
def small_disk(size_kib: int) -> Iterator[Path]:
    """A fresh tmpfs of `size_kib` KiB, unmounted (with everything on it) afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    where = Path(tempfile.mkdtemp(prefix="omniroute-small-disk-"))
    try:
        if not _run("mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs", str(where)):
            pytest.skip("mounting a tmpfs is not permitted here")
        try:
            yield where
        finally:
            _run("umount", "-l", str(where))
    finally:
        where.rmdir()


def fill_up(disk: Path) -> None:
    """Take every free byte of `disk` with one file, so that the next write there fails (ENOSPC)."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (65536, 4096, 1):  # big writes first, then the last partial block
            block = b"\0" * size
            try:
                while True:
                    os.write(fd, block)
            except OSError:
                pass
    finally:
        os.close(fd)
