"""Request queue per provider+connection (resilience.md §6): concurrency, pacing, admission, deadline.

A request joins one FIFO line. The request at the head waits for a concurrency slot and for the
two rate rules (`min_time_between_requests_ms` since the previous dispatch; at most
`requests_per_minute` dispatches in any rolling 60 s, i.e. a dispatch at `t` no longer counts at
`t + 60 000`), then is dispatched and the next one moves up. Time in the line is bounded only by
`max_queue_depth` (QueueFull at once, before any waiting); `max_wait_ms` is an EXECUTION deadline
that starts at dispatch and ends when the upstream response headers arrive (ExecutionTimeout).

These local rejections are the request's own: this module never touches breaker, cooldown or
lockout state, and the engine must not report them as upstream failures.

`update()` applies at once to admission, concurrency and the rate rules, waking the request at
the head of the line to re-check them.

A request may say, with `still_wanted`, whether it should still be sent: it is asked before every
wait and at dispatch, and `recheck()` (the engine calls it when a connection starts cooling, is
locked or its breaker opens) wakes the head to ask at once. One that is no longer wanted leaves
with `Withdrawn`, unsent and without using a turn of the rate rules, and the next in line is
asked in its turn. Without this, requests admitted a moment before their key started cooling
waited out the pacing (200 ms each, 100 a minute) only to hit the rate-limited upstream again.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

from proxy.resilience.clock import Clock
from proxy.resilience.errors import ExecutionTimeout, QueueFull, Withdrawn

T = TypeVar("T")

_RATE_WINDOW_MS = 60_000.0


@dataclass(frozen=True, slots=True)
class QueueSettings:
    auto_enable_api_key_providers: bool = True
    requests_per_minute: int = 100
    min_time_between_requests_ms: int = 200
    concurrent_requests: int = 10
    max_wait_ms: int = 15_000
    max_queue_depth: int = 0
    """0 = unbounded."""


def check_queue_admission(queued: int, max_queue_depth: int) -> bool:
    """False = reject with QueueFull: `max_queue_depth` requests are already queued."""
    return max_queue_depth <= 0 or queued < max_queue_depth


@dataclass(frozen=True, slots=True)
class Dispatch:
    dispatched_at: float
    """Epoch ms when the limiter let the request go."""
    deadline: float
    """`dispatched_at + max_wait_ms`: the upstream's response headers must arrive by then."""


class RequestLimiter:
    """The queue of one provider+connection. Counters are read by the TUI's Queue tab."""

    __slots__ = (
        "_clock",
        "_gate",
        "_last_dispatch",
        "_queued",
        "_recent",
        "_running",
        "_settings",
        "_sleep",
        "_wake",
    )

    def __init__(
        self,
        settings: QueueSettings,
        clock: Clock,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`sleep` takes SECONDS (tests pass one that advances a FakeClock)."""
        self._settings = settings
        self._clock = clock
        self._sleep = sleep
        # asyncio.Lock is FIFO-fair and passes itself on when a woken waiter is cancelled: it is
        # the line. Only its holder (the head) ever waits for a slot or a rate rule.
        self._gate = asyncio.Lock()
        self._wake: asyncio.Future[None] | None = None
        self._recent: deque[float] = deque(maxlen=settings.requests_per_minute)
        self._last_dispatch = -math.inf
        self._queued = 0
        self._running = 0

    @property
    def queued(self) -> int:
        """Requests admitted but not yet dispatched."""
        return self._queued

    @property
    def running(self) -> int:
        """Requests dispatched whose `slot()` block has not exited yet."""
        return self._running

    @property
    def settings(self) -> QueueSettings:
        return self._settings

    def update(self, settings: QueueSettings) -> None:
        self._settings = settings
        if settings.requests_per_minute != self._recent.maxlen:
            self._recent = deque(self._recent, maxlen=settings.requests_per_minute)  # keeps the newest
        self._poke()  # a raised concurrency limit or a lower rate may free the head at once

    def recheck(self) -> None:
        """Wake the head of the line to ask its `still_wanted` now (cheap when nobody waits)."""
        self._poke()

    @asynccontextmanager
    async def slot(self, still_wanted: Callable[[], bool] | None = None) -> AsyncIterator[Dispatch]:
        """Wait (FIFO) for a concurrency slot and the rate rules; hold the slot until the block exits.

        Raises QueueFull at once, before waiting, when `max_queue_depth > 0` and that many
        requests are already queued; Withdrawn when `still_wanted()` says False before dispatch.
        """
        if not check_queue_admission(self._queued, self._settings.max_queue_depth):
            raise QueueFull(f"request queue full ({self._queued} queued)")
        self._queued += 1
        try:
            async with self._gate:
                await self._wait_for_turn(still_wanted)
                # No await from here to `yield`: the dispatch and the slot are taken atomically.
                now = self._clock.now()
                self._record_dispatch(now)
                self._running += 1
        finally:
            self._queued -= 1
        try:
            yield Dispatch(dispatched_at=now, deadline=now + self._settings.max_wait_ms)
        finally:
            self._running -= 1
            self._poke()

    async def within_deadline(self, dispatch: Dispatch, awaitable: Awaitable[T]) -> T:
        """Await the upstream call up to its response headers; past the deadline raise ExecutionTimeout."""
        budget_ms = dispatch.deadline - dispatch.dispatched_at
        remaining_ms = dispatch.deadline - self._clock.now()
        if remaining_ms <= 0:
            _discard(awaitable)
            raise ExecutionTimeout(f"no upstream response within {budget_ms:g} ms of dispatch")
        timeout = asyncio.timeout(remaining_ms / 1000.0)
        try:
            async with timeout:
                return await awaitable
        except TimeoutError:
            if timeout.expired():  # ours, not a TimeoutError raised by the upstream call itself
                raise ExecutionTimeout(f"no upstream response within {budget_ms:g} ms of dispatch") from None
            raise

    async def _wait_for_turn(self, still_wanted: Callable[[], bool] | None) -> None:
        while True:
            if still_wanted is not None and not still_wanted():
                raise Withdrawn("the connection can no longer take this request")
            settings = self._settings  # re-read: update() may change it while we wait
            if self._running >= settings.concurrent_requests:
                await self._nap(None)
                continue
            delay_ms = self._rate_delay(self._clock.now(), settings)
            if delay_ms <= 0:
                return
            await self._nap(delay_ms / 1000.0)

    async def _nap(self, seconds: float | None) -> None:
        """Wait until poked (a slot freed, new settings, a recheck) or, given `seconds`, that long."""
        wake = self._wake = asyncio.get_running_loop().create_future()
        try:
            if seconds is None:
                await wake
                return
            # The sleep runs as its own task so that a poke can cut it short; only the head of the
            # line ever sleeps, so this is one task at a time per connection, and only when pacing.
            sleeper = asyncio.ensure_future(self._sleep(seconds))
            try:
                await asyncio.wait((wake, sleeper), return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
        finally:
            self._wake = None

    def _rate_delay(self, now: float, settings: QueueSettings) -> float:
        ready_at = self._last_dispatch + settings.min_time_between_requests_ms
        recent = self._recent
        if len(recent) >= settings.requests_per_minute:
            ready_at = max(ready_at, recent[0] + _RATE_WINDOW_MS)
        return ready_at - now

    def _record_dispatch(self, now: float) -> None:
        self._last_dispatch = now
        recent = self._recent
        # The deque holds at most `requests_per_minute` entries (maxlen) and none older than the
        # window, so memory follows the actual rate, not the configured ceiling.
        cutoff = now - _RATE_WINDOW_MS
        while recent and recent[0] <= cutoff:
            recent.popleft()
        recent.append(now)

    def _poke(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)


def _discard(awaitable: Awaitable[object]) -> None:
    """Drop an upstream call that will never be awaited, without a 'never awaited' warning."""
    if inspect.iscoroutine(awaitable):
        awaitable.close()
    elif isinstance(awaitable, asyncio.Future):
        awaitable.cancel()
