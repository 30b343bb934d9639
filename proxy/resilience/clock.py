"""Time for the engine: one injectable clock, in epoch milliseconds.

Every rule takes `now` from a `Clock` so that tests move time by hand and never sleep.
`SystemClock` anchors a monotonic clock to the wall clock once at start: readings never jump
backwards within a process (NTP steps cannot reorder deadlines), and they are still epoch
milliseconds, so deadlines can be persisted and read back after a restart. Where there is one, the
monotonic clock is the one that counts the time the machine was suspended (Linux's
CLOCK_BOOTTIME): a laptop that slept a night must not be a night behind the wall clock.

The few places that must wait for a moment (the cooldown-aware retry, the slot wait's timeout,
the request queue's pacing and its execution deadline) wait on the same clock, through
`Clock.call_at`: the event loop does the waiting, but the clock decides when the moment has come.
So a test on a `FakeClock` ends such a wait by advancing the clock, never by sleeping through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None:
        """Never call the callback (a no-op once it has been called)."""
        ...


class Clock(Protocol):
    def now(self) -> float:
        """Milliseconds since the Unix epoch, never decreasing within a process."""
        ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Call `callback` once, on the running event loop, as soon as `now() >= when`.

        Must be called from inside the loop that is to run the callback."""
        ...


_BOOTTIME: int = getattr(time, "CLOCK_BOOTTIME", -1)
"""Linux's monotonic clock that counts suspended time (-1 where there is none: a suspend is then
not counted, as with `time.monotonic`)."""


class SystemClock:
    def __init__(self) -> None:
        # The wall clock's distance from the monotonic one, taken once: a reading is then one
        # addition (a request reads the clock half a dozen times).
        self._offset = 0.0
        self._offset = time.time() * 1000.0 - self.now()

    if _BOOTTIME >= 0:  # (chosen once: a reading is one call)

        def now(self) -> float:
            return time.clock_gettime(_BOOTTIME) * 1000.0 + self._offset

    else:

        def now(self) -> float:
            return time.monotonic() * 1000.0 + self._offset

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        return _LoopTimer(self, asyncio.get_running_loop(), when, callback)


class _LoopTimer:
    """A loop timer for `SystemClock`. The loop's time does not count a suspend and this clock does:
    a timer set before the machine slept fires when the loop's wait ends, and then the clock decides."""

    __slots__ = ("_callback", "_clock", "_handle", "_loop", "_when")

    def __init__(
        self, clock: SystemClock, loop: asyncio.AbstractEventLoop, when: float, callback: Callable[[], None]
    ) -> None:
        self._clock = clock
        self._loop = loop
        self._when = when
        self._callback = callback
        self._handle = loop.call_later(max(0.0, when - clock.now()) / 1000.0, self._fire)

    def _fire(self) -> None:
        remaining = self._when - self._clock.now()
        if remaining > 0:  # the loop may run a timer a hair early: the clock has the last word
            self._handle = self._loop.call_later(remaining / 1000.0, self._fire)
        else:
            self._callback()

    def cancel(self) -> None:
        self._handle.cancel()


class FakeClock:
    """A clock that only moves when told to (tests, benchmarks, snapshots).

    Timers set with `call_at` run when `advance()` or `set()` moves the clock past them, on the
    loop that set them, so a test thread may move the clock of a server running on another thread.
    """

    def __init__(self, start_ms: float = 1_767_225_600_000.0) -> None:  # 2026-01-01T00:00:00Z
        self._now = start_ms
        self._lock = threading.Lock()
        self._timers: list[tuple[float, int, _FakeTimer]] = []
        self._order = itertools.count()
        self._compact_at = 256

    def now(self) -> float:
        return self._now

    def advance(self, ms: float) -> None:
        if ms < 0:
            raise ValueError("a clock never goes backwards")
        self._move(self._now + ms)

    def set(self, ms: float) -> None:
        if ms < self._now:
            raise ValueError("a clock never goes backwards")
        self._move(ms)

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        timer = _FakeTimer(asyncio.get_running_loop(), callback)
        with self._lock:
            if when > self._now:
                heapq.heappush(self._timers, (when, next(self._order), timer))
                self._compact()
                return timer
        timer.schedule()
        return timer

    def _move(self, to: float) -> None:
        due: list[_FakeTimer] = []
        with self._lock:
            self._now = to
            timers = self._timers
            while timers and timers[0][0] <= to:
                due.append(heapq.heappop(timers)[2])
        for timer in due:
            timer.schedule()

    def _compact(self) -> None:
        # Cancelled timers wait in the heap until the clock passes them; a long test that never
        # advances far would keep them all, so drop them once they are most of the heap.
        if len(self._timers) >= self._compact_at:
            self._timers = [t for t in self._timers if not t[2].cancelled]
            heapq.heapify(self._timers)
            self._compact_at = max(256, 2 * len(self._timers))


class _FakeTimer:
    __slots__ = ("_callback", "_loop", "cancelled")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop = loop
        self._callback = callback
        self.cancelled = False

    def schedule(self) -> None:
        if not self.cancelled:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits there any more
                self._loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self._callback()

    def cancel(self) -> None:
        self.cancelled = True


async def sleep_until(clock: Clock, when: float, wakers: set[asyncio.Future[None]] | None = None) -> None:
    """Return once `clock.now() >= when` (at once if it already is), or sooner: while it sleeps, its
    wake-up is in `wakers`, where a caller may resolve it (to end every such sleep early)."""
    if clock.now() >= when:
        return
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    timer = clock.call_at(when, lambda: None if done.done() else done.set_result(None))
    if wakers is not None:
        wakers.add(done)
    try:
        await done
    finally:
        timer.cancel()
        if wakers is not None:
            wakers.discard(done)


def timeout_at(clock: Clock, when: float) -> ClockTimeout:
    """`async with timeout_at(clock, when):` as `asyncio.timeout_at`, but on the engine's clock."""
    return ClockTimeout(clock, when)


class ClockTimeout:
    """`async with ClockTimeout(clock, when):` cancels the block once `clock.now() >= when` and raises
    TimeoutError in its place, like `asyncio.timeout_at` but on the engine's clock.

    The bookkeeping follows asyncio.Timeout: only a cancellation this timer caused becomes a
    TimeoutError; a cancellation from outside (the client went away) stays a cancellation.
    """

    __slots__ = ("_cancelling", "_clock", "_expired", "_task", "_timer", "_when")

    def __init__(self, clock: Clock, when: float) -> None:
        self._clock = clock
        self._when = when
        self._expired = False
        self._timer: Timer | None = None
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0

    def expired(self) -> bool:
        return self._expired

    async def __aenter__(self) -> ClockTimeout:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("timeout_at must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._timer = self._clock.call_at(self._when, self._on_timeout)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if (
            self._expired
            and self._task is not None
            and self._task.uncancel() <= self._cancelling
            and exc_type is asyncio.CancelledError
        ):
            raise TimeoutError from exc

    def _on_timeout(self) -> None:
        if self._task is not None and self._timer is not None:
            self._expired = True
            self._task.cancel()
