"""proxy.signals: the first stop signal asks for a clean stop, a second one exits at once, the stop has
a deadline; a terminal that hung up is recognised and let go of."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

import pytest

from proxy.signals import DEADLINE_EXIT_CODE, StopSignals
from tests.processes import Terminal, exit_code, wait_for


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_first_signal_stops_in_the_loop_second_exits_at_once_and_the_stop_has_a_deadline() -> None:
    stops: list[signal.Signals] = []
    exits: list[int] = []
    emergencies: list[bool] = []
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals(
        deadline_s=0.3, emergency=lambda: emergencies.append(True), exit=exits.append
    ) as signals:
        signals.attach(asyncio.get_running_loop(), stops.append)
        os.kill(os.getpid(), signal.SIGTERM)
        await until(lambda: stops == [signal.SIGTERM])
        assert exits == []  # the clean stop is under way: nobody is forced out
        os.kill(os.getpid(), signal.SIGINT)
        await until(lambda: exits == [128 + signal.SIGINT])
        assert stops == [signal.SIGTERM]  # the second signal does not ask again, it ends
        await until(lambda: exits == [128 + signal.SIGINT, DEADLINE_EXIT_CODE])
        assert emergencies == [True, True]
    assert signal.getsignal(signal.SIGTERM) is before


async def test_a_signal_before_attach_stops_as_soon_as_there_is_something_to_stop() -> None:
    stops: list[signal.Signals] = []
    with StopSignals(deadline_s=60, exit=lambda code: None) as signals:
        try:
            os.kill(os.getpid(), signal.SIGHUP)
            await until(lambda: signals.received is signal.SIGHUP)
            assert stops == []
            signals.attach(asyncio.get_running_loop(), stops.append)
            await until(lambda: stops == [signal.SIGHUP])
        finally:
            signals.cancel_deadline()


# Ignores SIGHUP (like `nohup`), waits for the hang-up, then writes to its stdout: on a dead terminal
# that write fails with EIO, unless release_lost_terminal pointed stdout at /dev/null first.
PROGRAM = """
import signal, sys, time
from proxy.signals import release_lost_terminal, terminal_hung_up
signal.signal(signal.SIGHUP, signal.SIG_IGN)
print("ready", flush=True)
while not terminal_hung_up(0):
    time.sleep(0.02)
released = release_lost_terminal() if sys.argv[1] == "release" else None
print("after the hang-up", released, flush=True)
sys.exit(0 if not terminal_hung_up(1) else 3)
"""


@pytest.mark.parametrize(("how", "code"), [("release", 0), ("keep", 1)])
def test_a_lost_terminal_is_recognised_and_replaced_by_dev_null(how: str, code: int) -> None:
    with Terminal([how], program=PROGRAM) as term:
        wait_for(lambda: b"ready" in term.screen, 30, "the program started")
        term.hang_up()
        assert exit_code(term.proc, 10) == code  # 1: the print raised OSError (EIO)


def _full_pty() -> tuple[int, int]:
    """A pseudo-terminal (master, slave) whose screen side is full: nothing reads it, and the
    slave takes no byte more right now (a terminal busy drawing, or a test's reader behind)."""
    import fcntl
    import pty
    import select

    master, slave = pty.openpty()
    flags = fcntl.fcntl(slave, fcntl.F_GETFL)
    fcntl.fcntl(slave, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    while select.select([], [slave], [], 0)[1]:
        try:
            os.write(slave, b"x" * 1024)
        except BlockingIOError:
            break
    fcntl.fcntl(slave, fcntl.F_SETFL, flags)
    return master, slave


def test_the_last_words_of_an_immediate_exit_wait_a_moment_for_a_busy_terminal() -> None:
    """The sequence that takes a console's terminal off the alternate screen, written at an
    immediate exit (a second signal): a terminal that is only behind (its buffer full while the
    emulator catches up) still gets it, where a write that never waits dropped it and left the
    shell in raw mode on the alternate screen. One that never reads again costs the exit at most
    LAST_WORDS_WAIT_S."""
    import select
    import threading
    import time

    from proxy.signals import LAST_WORDS_WAIT_S, last_words

    master, slave = _full_pty()
    screen = bytearray()

    def catch_up() -> None:  # the emulator, a moment later, reads everything
        time.sleep(0.05)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.05)[0]:
                screen.extend(os.read(master, 65536))
            elif b"\x1b[?1049l" in screen:
                return

    reader = threading.Thread(target=catch_up)
    reader.start()
    try:
        last_words(slave, b"\x1b[?1049l")
        reader.join()
        assert b"\x1b[?1049l" in screen
    finally:
        os.close(slave)
        os.close(master)

    master, slave = _full_pty()  # and one that never reads again
    try:
        started = time.monotonic()
        last_words(slave, b"\x1b[?1049l")
        assert time.monotonic() - started < LAST_WORDS_WAIT_S + 0.5
    finally:
        os.close(slave)
        os.close(master)
