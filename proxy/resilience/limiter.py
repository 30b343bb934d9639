"""Request queue per provider+connection: concurrency, pacing, admission, deadline.

For operators: docs/resilience.md#request-queue.

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

Every duration here is engine time: the pacing waits and the execution deadline end when the
limiter's clock (the engine's) says so, so a FakeClock test moves them by advancing the clock.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from proxy.resilience.clock import Clock, sleep_until, timeout_at
from proxy.resilience.errors import ExecutionTimeout, QueueFull, Withdrawn
from proxy.resilience.tunable import tunable

T = TypeVar("T")

_RATE_WINDOW_MS = 60_000.0


@dataclass(frozen=True, slots=True)
class QueueSettings:
    auto_enable_api_key_providers: bool = field(
        default=True, metadata=tunable(help="Turn the request queue on for every API-key connection")
    )
    requests_per_minute: int = field(
        default=100,
        metadata=tunable(min=1, max=1_000_000, help="Requests each provider connection may start per minute"),
    )
    min_time_between_requests_ms: int = field(
        default=200,
        metadata=tunable(min=0, max=3_600_000, help="Minimum gap between two dispatches on one connection"),
    )
    concurrent_requests: int = field(
        default=10, metadata=tunable(min=1, max=10_000, help="Requests in flight at once per connection")
    )
    max_wait_ms: int = field(
        default=15_000,
        metadata=tunable(
            min=1, max=30_000, help="Execution deadline from dispatch to response headers (504 past it)"
        ),
    )
    max_queue_depth: int = field(
        default=0,
        metadata=tunable(
            min=0,
            max=100_000,
            help="Queued requests per connection before 429 RATE_LIMIT_QUEUE_FULL (0 = unbounded)",
        ),
    )
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
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        """`sleep`, if given, takes SECONDS and replaces the wait on the clock for the pacing rules
        (tests pass one that records the delays and advances a FakeClock)."""
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

    def admit(self) -> Ticket:
        """Join the queue: the request counts as queued until its ticket is dispatched or released.

        Raises QueueFull at once, before waiting, when `max_queue_depth > 0` and that many
        requests are already queued. Admission and dispatch are two steps so that a request can
        wait for something else in between (its connection's concurrency slot) while it holds its
        place: time queued never counts against the execution deadline, which starts at dispatch.
        """
        if not check_queue_admission(self._queued, self._settings.max_queue_depth):
            raise QueueFull(f"request queue full ({self._queued} queued)")
        self._queued += 1
        return Ticket(self)

    @asynccontextmanager
    async def slot(self, still_wanted: Callable[[], bool] | None = None) -> AsyncIterator[Dispatch]:
        """`admit()`, then wait (FIFO) for a concurrency slot and the rate rules; hold the slot
        until the block exits. Withdrawn when `still_wanted()` says False before dispatch."""
        ticket = self.admit()
        try:
            yield await ticket.dispatch(still_wanted)
        finally:
            ticket.release()

    async def within_deadline(self, dispatch: Dispatch, awaitable: Awaitable[T]) -> T:
        """Await the upstream call up to its response headers; past the deadline raise ExecutionTimeout."""
        budget_ms = dispatch.deadline - dispatch.dispatched_at
        if dispatch.deadline <= self._clock.now():
            _discard(awaitable)
            raise ExecutionTimeout(f"no upstream response within {budget_ms:g} ms of dispatch")
        timeout = timeout_at(self._clock, dispatch.deadline)
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
            now = self._clock.now()
            delay_ms = self._rate_delay(now, settings)
            if delay_ms <= 0:
                return
            await self._nap(now + delay_ms)

    async def _nap(self, until_ms: float | None) -> None:
        """Wait until poked (a slot freed, new settings, a recheck) or, given `until_ms`, until the
        clock reaches it."""
        wake = self._wake = asyncio.get_running_loop().create_future()
        try:
            if until_ms is None:
                await wake
                return
            # The sleep runs as its own task so that a poke can cut it short; only the head of the
            # line ever sleeps, so this is one task at a time per connection, and only when pacing.
            if self._sleep is not None:
                sleeping = self._sleep(max(until_ms - self._clock.now(), 0.0) / 1000.0)
            else:
                sleeping = sleep_until(self._clock, until_ms)
            sleeper = asyncio.ensure_future(sleeping)
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


class Ticket:
    """One request's place in a limiter: queued, then running, then released (exactly once)."""

    __slots__ = ("_limiter", "_state")

    def __init__(self, limiter: RequestLimiter) -> None:
        self._limiter = limiter
        self._state = _QUEUED

    async def dispatch(self, still_wanted: Callable[[], bool] | None = None) -> Dispatch:
        """Wait (FIFO) for a concurrency slot and the rate rules, then take the slot: the execution
        deadline starts now. A wait that ends in an exception (a cancellation, Withdrawn) releases
        the ticket."""
        if self._state is not _QUEUED:
            raise RuntimeError("a ticket is dispatched once")
        limiter = self._limiter
        try:
            async with limiter._gate:
                await limiter._wait_for_turn(still_wanted)
                # No await from here on: the dispatch and the slot are taken atomically.
                now = limiter._clock.now()
                limiter._record_dispatch(now)
                limiter._queued -= 1
                limiter._running += 1
                self._state = _RUNNING
        finally:
            if self._state is _QUEUED:
                self.release()
        return Dispatch(dispatched_at=now, deadline=now + limiter._settings.max_wait_ms)

    def release(self) -> None:
        """Leave the queue, or give the concurrency slot back; a no-op the second time."""
        limiter = self._limiter
        if self._state is _QUEUED:
            limiter._queued -= 1
        elif self._state is _RUNNING:
            limiter._running -= 1
            limiter._poke()
        self._state = _RELEASED


_QUEUED = "queued"
_RUNNING = "running"
_RELEASED = "released"


def _discard(awaitable: Awaitable[object]) -> None:
    """Drop an upstream call that will never be awaited, without a 'never awaited' warning."""
    if inspect.iscoroutine(awaitable):
        awaitable.close()
    elif isinstance(awaitable, asyncio.Future):
        awaitable.cancel()
