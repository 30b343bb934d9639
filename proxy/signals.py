"""How `omniroute serve` and `omniroute tui` stop on a signal, and outlive their terminal while they do.

SIGTERM (systemd, `kill`), SIGINT (Ctrl+C) and SIGHUP (the terminal went away) all ask for the
clean stop the console's `q` does: the listening socket closes, in-flight requests get
`SHUTDOWN_GRACE_S`, the engine's state is persisted, the database closed, and the exit code is 0.

A clean stop is only as prompt as what it waits for, so two guarantees come on top of it:

- A second signal while stopping exits at once (`os._exit`, code 128 + the signal): whoever sent
  it has decided not to wait. SQLite's WAL keeps the database consistent: every committed batch
  stays, only the last unsaved second of engine state is lost.
- The stop has a deadline. From a thread of its own, so that nothing the main thread waits on
  can hold it: if the process is still there `deadline_s` after the first signal, it exits (code 1).

The handlers are Python-level (`signal.signal`), not `loop.add_signal_handler` ones: those only
queue a callback for the event loop, so a loop that is stuck never runs them. That is how the
console used to ignore SIGTERM once its terminal was gone (issue #19). A Python-level handler runs
in the main thread as soon as it executes Python code again or is interrupted in a wait; from there
it hands the clean stop to the loop with `call_soon_threadsafe`, as `asyncio.Runner` does for Ctrl+C.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import select
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from signal import _HANDLER

__all__ = ["STOP_SIGNALS", "StopSignals", "last_words", "release_lost_terminal", "terminal_hung_up"]

if sys.platform == "win32":
    STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)
else:
    STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

INHERITED_IGNORE = frozenset(STOP_SIGNALS) - {signal.SIGTERM}
"""Stop signals that stay ignored when `serve` started with them ignored (POSIX convention: `nohup`
ignores SIGHUP so that closing the terminal leaves the program running, and a shell starts a
background job with SIGINT ignored). SIGTERM always stops it."""

DEADLINE_EXIT_CODE = 1
"""The clean stop did not finish in time: something failed that the operator cannot fix."""

Stop = Callable[[signal.Signals], object]
"""Asks for the clean stop; runs in the event loop, once, with the signal that asked."""


class StopSignals:
    """Install the stop signals' handlers for the `with` block; `attach` says what a clean stop is.

    A signal that arrives before `attach` (while the instance is still opening) is kept and acted
    on at `attach`; one that arrives after `detach` (the instance has stopped) only arms the deadline.
    """

    def __init__(
        self,
        *,
        deadline_s: float,
        emergency: Callable[[], object] | None = None,
        exit: Callable[[int], object] = os._exit,
        keep_ignored: bool = False,
    ) -> None:
        """`emergency` runs just before an immediate exit (best effort: the console puts the terminal
        back in its normal mode). `exit` is for tests. `keep_ignored`: a signal of INHERITED_IGNORE
        that the process started with ignored stays ignored (`serve`; the console needs its terminal,
        and stops when it goes, whatever it inherited)."""
        self._keep_ignored = keep_ignored
        self.deadline_s = deadline_s
        self.received: signal.Signals | None = None
        self._emergency = emergency
        self._exit = exit
        self._target: tuple[asyncio.AbstractEventLoop, Stop] | None = None
        self._previous: dict[signal.Signals, _HANDLER] = {}
        self._deadline: threading.Timer | None = None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # the only thread that may
            for sig in STOP_SIGNALS:
                if self._keep_ignored and sig in INHERITED_IGNORE and signal.getsignal(sig) is signal.SIG_IGN:
                    continue  # `nohup`, a shell's background job: whoever started it said so
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._target = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        # An armed deadline stays armed: what is left (the loop's teardown, the interpreter's exit)
        # is bounded by it too. Its thread is a daemon, so it never delays an exit that is on time.

    def attach(self, loop: asyncio.AbstractEventLoop, stop: Stop) -> None:
        """From now on a stop signal calls `stop(signal)` in `loop` (at once if one already came)."""
        self._target = (loop, stop)
        if self.received is not None:
            loop.call_soon(stop, self.received)

    def detach(self) -> None:
        self._target = None

    def cancel_deadline(self) -> None:
        """For tests that stop in-process: the deadline would otherwise end the test run."""
        if self._deadline is not None:
            self._deadline.cancel()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if self.received is not None:
            self._exit_now(128 + sig, f"a second {sig.name}: exiting at once")
            return
        self.received = sig
        deadline = threading.Timer(
            self.deadline_s,
            self._exit_now,
            (DEADLINE_EXIT_CODE, f"still stopping {self.deadline_s:g} s after {sig.name}: exiting now"),
        )
        deadline.daemon = True
        deadline.name = "omniroute-stop-deadline"
        deadline.start()
        self._deadline = deadline
        target = self._target
        if target is not None:
            loop, stop = target
            # A loop closed in the meantime: nothing is left to stop (and a handler must not raise).
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop, sig)

    def _exit_now(self, code: int, why: str) -> None:
        if self._emergency is not None:
            with contextlib.suppress(Exception):
                self._emergency()
        last_words(2, f"omniroute: {why}\n".encode())
        self._exit(code)


LAST_WORDS_WAIT_S = 0.5
"""How long the last words of an immediate exit wait for a terminal to take them: one that is only
behind (its buffer full while the emulator draws) takes them in milliseconds, and a console's
terminal left on the alternate screen in raw mode is worse than half a second more of an exit; one
that never reads again is given up on."""


def last_words(fd: int, data: bytes) -> None:
    """Write `data` to `fd` as far as it takes it within LAST_WORDS_WAIT_S, and drop the rest: for
    the last words of an exit that must not hang, not even on a terminal that stopped reading (its
    writes are non-blocking for the while). Never raises."""
    if sys.platform == "win32":
        with contextlib.suppress(OSError, ValueError):
            os.write(fd, data)
        return
    import fcntl
    import time

    deadline = time.monotonic() + LAST_WORDS_WAIT_S
    with contextlib.suppress(OSError, ValueError):
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        try:
            while data:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([], [fd], [], left)[1]:
                    return
                with contextlib.suppress(BlockingIOError):
                    data = data[os.write(fd, data) :]
        finally:
            # (The flags belong to the terminal's open file, which the shell shares.)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags)


def terminal_hung_up(fd: int) -> bool:
    """Is `fd` a terminal that went away? After a hang-up the kernel answers EIO to everything asked
    of it (ENXIO on some BSDs); a file, a pipe or a live terminal answers otherwise."""
    if sys.platform == "win32":
        return False
    import termios

    try:
        termios.tcgetattr(fd)
    except termios.error as exc:
        return bool(exc.args) and exc.args[0] in (errno.EIO, errno.ENXIO)
    return False


def release_lost_terminal() -> bool:
    """Point stdin, stdout and stderr at /dev/null where they are a terminal that hung up (True if any).

    A terminal that went away fails every write with EIO and reads EOF at once, forever. A process
    that outlives it, for the few seconds of a clean stop, does what a daemon does with its stdio,
    so that nothing fails on it: a log line, the console's last frame, the interpreter's final flush
    of stderr (which would otherwise turn exit status 0 into 120).
    """
    lost = [fd for fd in (0, 1, 2) if terminal_hung_up(fd)]
    if lost:
        null = os.open(os.devnull, os.O_RDWR)
        try:
            for fd in lost:
                os.dup2(null, fd)
        finally:
            os.close(null)
    return bool(lost)
