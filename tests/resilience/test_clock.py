"""The engine's clock and its timers: waits end when the clock says so, never by real sleeping."""

from __future__ import annotations

import asyncio
import threading
import time
from email.utils import formatdate

import pytest

from proxy.resilience.clock import FakeClock, SystemClock, sleep_until, timeout_at
from proxy.resilience.hints import parse_retry_hint


async def _spin(turns: int = 5) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


async def test_a_fake_clock_timer_runs_when_the_clock_passes_it_and_not_before() -> None:
    clock = FakeClock()
    fired: list[float] = []
    clock.call_at(clock.now() + 1_000, lambda: fired.append(clock.now()))
    clock.advance(999)
    await _spin()
    assert fired == []
    clock.advance(1)
    await _spin()
    assert fired == [clock.now()]
    clock.advance(10_000)
    await _spin()
    assert len(fired) == 1  # once


async def test_a_timer_already_due_runs_at_once_and_a_cancelled_one_never() -> None:
    clock = FakeClock()
    fired: list[str] = []
    clock.call_at(clock.now(), lambda: fired.append("due"))
    clock.call_at(clock.now() + 5, lambda: fired.append("cancelled")).cancel()
    clock.advance(5)
    await _spin()
    assert fired == ["due"]


async def test_a_fake_clock_moved_from_another_thread_wakes_this_loop() -> None:
    clock = FakeClock()
    waiter = asyncio.create_task(sleep_until(clock, clock.now() + 60_000))
    await _spin()
    mover = threading.Thread(target=clock.advance, args=(60_000,))
    mover.start()
    mover.join()
    await asyncio.wait_for(waiter, 1.0)  # a minute of engine time, at once


async def test_cancelled_timers_do_not_pile_up() -> None:
    clock = FakeClock()
    for _ in range(10_000):
        clock.call_at(clock.now() + 60_000, lambda: None).cancel()
    assert len(clock._timers) < 600


async def test_timeout_at_raises_timeout_error_when_the_clock_passes_the_deadline() -> None:
    clock = FakeClock()

    async def block() -> None:
        async with timeout_at(clock, clock.now() + 50) as timeout:
            try:
                await asyncio.Event().wait()
            finally:
                assert timeout.expired()

    task = asyncio.create_task(block())
    await _spin()
    assert not task.done()
    clock.advance(50)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(task, 1.0)


async def test_timeout_at_leaves_an_outside_cancellation_alone() -> None:
    clock = FakeClock()

    async def block() -> None:
        async with timeout_at(clock, clock.now() + 50):
            await asyncio.Event().wait()

    task = asyncio.create_task(block())
    await _spin()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_the_system_clock_runs_a_timer_at_its_time() -> None:
    clock = SystemClock()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await sleep_until(clock, clock.now() + 30)
    assert 0.025 <= loop.time() - started < 1.0
    async with timeout_at(clock, clock.now() + 1_000):
        pass  # a deadline not reached leaves the block alone


def test_the_system_clock_reads_epoch_milliseconds_and_never_goes_back() -> None:
    """`now()` is the wall clock in ms (anchored once, then moved by the monotonic clock): within a
    second of `time.time()` however it is computed, and never smaller than the reading before."""
    import time

    clock = SystemClock()
    readings = [clock.now() for _ in range(10_000)]
    assert readings == sorted(readings)
    assert abs(clock.now() - time.time() * 1000.0) < 1_000.0
    before = clock.now()
    time.sleep(0.02)
    assert 15.0 <= clock.now() - before < 1_000.0


# -- a laptop that sleeps (found by a lifecycle trial) ------------------------------------------------
# time.monotonic() is CLOCK_MONOTONIC, which stops while the machine is suspended: a clock anchored
# to it once is behind the wall clock by every night slept, and whatever it computes from a wall
# time (a Retry-After date, an epoch reset) is off by as much.

SLEPT_S = 8 * 3600.0
"""A night with the lid closed."""


def _suspend(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """From now on the machine has been asleep for `seconds`: CLOCK_REALTIME and CLOCK_BOOTTIME
    moved on by that much while it slept, CLOCK_MONOTONIC (time.monotonic) did not."""
    real_time, real_time_ns = time.time, time.time_ns
    real_gettime, real_gettime_ns = time.clock_gettime, time.clock_gettime_ns
    jumped = {time.CLOCK_REALTIME, getattr(time, "CLOCK_BOOTTIME", time.CLOCK_REALTIME)}
    monkeypatch.setattr(time, "time", lambda: real_time() + seconds)
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + int(seconds * 1e9))
    monkeypatch.setattr(
        time, "clock_gettime", lambda clk: real_gettime(clk) + (seconds if clk in jumped else 0.0)
    )
    monkeypatch.setattr(
        time,
        "clock_gettime_ns",
        lambda clk: real_gettime_ns(clk) + (int(seconds * 1e9) if clk in jumped else 0),
    )


def test_the_clock_reads_the_wall_clock_after_the_machine_slept(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SystemClock()
    before = clock.now()
    _suspend(monkeypatch, SLEPT_S)
    now = clock.now()
    assert now >= before  # never backwards
    wall = time.time() * 1000.0
    assert abs(now - wall) < 5_000, (
        f"after {SLEPT_S / 3600:g} h asleep the engine's clock is {(wall - now) / 3_600_000:.2f} h"
        " behind the wall clock: its deadlines are no longer epoch milliseconds"
    )


def test_a_retry_after_date_30_s_ahead_is_a_30_s_wait_after_the_machine_slept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = SystemClock()
    _suspend(monkeypatch, SLEPT_S)
    # The upstream, on the real (wall) time, says: come back in 30 s.
    headers = {"retry-after": formatdate(time.time() + 30, usegmt=True)}
    hint = parse_retry_hint(headers, "", clock.now())
    assert hint is not None
    assert hint <= 35_000, f"a 30 s Retry-After cools the connection for {hint / 3_600_000:.2f} h"
