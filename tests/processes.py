"""`omniroute` as a real process: on a real pseudo-terminal (or none), stopped by real signals.

For what only a whole process shows: what the kernel does when a terminal goes away (SIGHUP, then
EIO on every write and EOF on every read), signal handlers, the exit code, the port and the state
database left behind. Every wait has a deadline and polls a condition: no fixed sleeps.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent

OMNIROUTE = "from omniroute_tui.cli import main; main()"
"""The program `omniroute` runs (what its console script does), for `python -c`."""

# The slave side becomes the controlling terminal of the new session (TIOCSCTTY), as a terminal
# emulator, tmux or sshd arrange it: only then does the kernel send SIGHUP when the terminal goes.
_TAKE_THE_TERMINAL = "import fcntl, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"

STARTUP_S = 30.0
"""Generous: the console imports and starts in about a second, but the machine may be loaded."""


def environment(**extra: str) -> dict[str, str]:
    """The test's environment minus anything that would point omniroute at a real instance or config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMNIROUTE_", "TEXTUAL", "LC_"))}
    for name in ("COLUMNS", "LINES"):  # they would override the terminal's own size
        env.pop(name, None)
    # A capable UTF-8 terminal whatever the machine's own settings (CI has neither TERM nor LANG).
    return {**env, "TERM": "xterm-256color", "LANG": "C.UTF-8", **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)


def serving(port: int, token: str | None = None) -> bool:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/api/monitoring/health", headers=headers, timeout=2)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def port_refuses(port: int) -> bool:
    """Nothing listens on the port any more (a stop has begun), as opposed to a slow answer."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def port_is_free(port: int) -> bool:
    """Could the next `omniroute` bind it? (SO_REUSEADDR as it does: our own closed connections may linger.)"""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def integrity(state: Path) -> str:
    conn = sqlite3.connect(state)
    try:
        result: str = conn.execute("PRAGMA integrity_check").fetchone()[0]
        return result
    finally:
        conn.close()


def exit_code(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """Its exit code once it ends; fails (and kills it) if it is still running after `timeout` s."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"still running {timeout} s later") from None


class Terminal:
    """A pseudo-terminal running `omniroute ARGS` (or another `program`) as the leader of a new session.

    A thread drains the master side (what would be the screen), so the app never blocks on a full
    terminal. `hang_up()` closes the master: what closing the window, `tmux kill-server` or an SSH
    disconnect does. With `controlling=False` the terminal is only the process's stdio, so going
    away sends no SIGHUP: writes fail with EIO, reads see EOF, and nothing else tells it.
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        controlling: bool = True,
        size: tuple[int, int] = (120, 40),
        program: str = OMNIROUTE,
        preexec_fn: Callable[[], object] | None = None,
    ) -> None:
        self.master, slave = os.openpty()
        columns, rows = size
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        code = _TAKE_THE_TERMINAL + program if controlling else program
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, *args],
                stdin=slave,
                stdout=slave,
                stderr=slave,
                start_new_session=True,
                env=env if env is not None else environment(),
                cwd=ROOT,
                preexec_fn=preexec_fn,
            )
        finally:
            os.close(slave)
        self.screen = bytearray()
        self._open = True
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._drain, name="pty-drain", daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        # select with a timeout, never a blocking read: a read in progress keeps the master open
        # after close(), and the hang-up would wait for the app's next write.
        while not self._stop.is_set():
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if ready:
                try:
                    data = os.read(self.master, 65536)
                except OSError:  # EIO: the process closed its last slave descriptor
                    return
                if not data:
                    return
                self.screen.extend(data)

    def send(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def hang_up(self) -> None:
        if self._open:
            self._open = False
            self._stop.set()
            self._reader.join()
            os.close(self.master)

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def close(self) -> None:
        """Test teardown: whatever happened, leave no process and no descriptor behind."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.hang_up()

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_headless(
    args: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], object] | None = None,
) -> subprocess.Popen[bytes]:
    """`omniroute ARGS` with no terminal at all (as systemd runs it); stderr is kept for the test.
    `preexec_fn`: what the parent does before it runs (`nohup` ignores SIGHUP)."""
    return subprocess.Popen(
        [sys.executable, "-c", OMNIROUTE, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env if env is not None else environment(),
        cwd=ROOT,
        preexec_fn=preexec_fn,
    )


class InFlight:
    """One chat completion for provider `alpha` (tests/two_providers.py), from a thread: its
    response, or the error that ended it."""

    def __init__(self, port: int) -> None:
        self.response: httpx.Response | None = None
        self.error: Exception | None = None
        body = {"model": "alpha/m1", "messages": [{"role": "user", "content": "hi"}]}

        def send() -> None:
            try:
                self.response = httpx.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=10
                )
            except httpx.HTTPError as exc:
                self.error = exc

        self.thread = threading.Thread(target=send, daemon=True)
        self.thread.start()

    def result(self) -> httpx.Response:
        self.thread.join(10)
        assert self.response is not None, f"no response: {self.error!r}"
        return self.response
