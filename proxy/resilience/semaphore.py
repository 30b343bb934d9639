"""Per-connection quota-share semaphore: at most `limit` requests in flight.

The rules: docs/resilience.md#per-connection-concurrency.

It is FAIL-OPEN: a request is never rejected here. When the wait queue already holds
`queue_depth` callers, or the wait outlasts `timeout_ms`, `acquire()` returns False and the
request proceeds without a slot, and one event `saturated -> fail_open` (layer `connection`)
says why. `queue_depth <= 0` or `timeout_ms <= 0` therefore means "never wait": the request
either takes a free slot or proceeds without one.

Waiters are served strictly in arrival order. A released slot is handed directly to the oldest
waiter (the in-use count does not dip), so a newcomer can never barge in between. The hand-off is
a future resolved with True; a timeout resolves it with False from a timer, so a timeout is never
a cancellation and cannot race with a hand-off. The timer runs on the semaphore's clock (the
engine's), so `timeout_ms` is engine time like every other duration. The one real race is a waiter that is cancelled
after its future was resolved with True but before it ran: it owns that slot and passes it on.

A waiter may say what keeps it wanted (`still_wanted`): `recheck()`, which the engine calls when
a connection starts cooling, goes terminal, is disabled or its breaker opens, makes every waiter
no longer wanted leave the line at once with `Withdrawn`, as a request queue's waiters do, rather
than wait for a slot only to be refused once it comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial

from proxy.resilience.clock import Clock, SystemClock
from proxy.resilience.errors import Withdrawn
from proxy.resilience.events import Event


def _no_emit(event: Event) -> None:
    pass


class ConnectionSemaphore:
    """The slots of one connection that declares `max_concurrent`."""

    __slots__ = ("_clock", "_emit", "_in_use", "_key", "_limit", "_waiters", "_wanted")

    def __init__(
        self,
        limit: int,
        *,
        key: str = "",
        clock: Clock | None = None,
        emit: Callable[[Event], None] = _no_emit,
    ) -> None:
        """`key` names the connection in fail-open events (layer `connection`)."""
        _check_limit(limit)
        self._limit = limit
        self._in_use = 0
        self._waiters: deque[asyncio.Future[bool]] = deque()
        self._wanted: dict[asyncio.Future[bool], Callable[[], bool]] = {}
        """The waiters that said what keeps them wanted (`acquire`'s `still_wanted`)."""
        self._key = key
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._emit = emit

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def in_use(self) -> int:
        """Slots held (may exceed `limit` for a while after `set_limit` lowered it)."""
        return self._in_use

    @property
    def waiting(self) -> int:
        """Callers queued for a slot."""
        return len(self._waiters)

    def has_free_slot(self) -> bool:
        return self._in_use < self._limit

    async def acquire(
        self, *, queue_depth: int, timeout_ms: float, still_wanted: Callable[[], bool] | None = None
    ) -> bool:
        """True: a slot is held (call `release()` exactly once). False: proceed WITHOUT a slot.

        Raises only CancelledError, and Withdrawn when a `recheck()` finds `still_wanted()` False
        while it waits; either way the waiter leaves no trace.
        """
        # A free slot implies an empty queue: release() and set_limit() hand slots to waiters
        # first, so taking it here keeps FIFO order.
        if self._in_use < self._limit:
            self._in_use += 1
            return True
        if len(self._waiters) >= queue_depth:
            self._fail_open(f"wait queue full ({len(self._waiters)} waiting)")
            return False
        if timeout_ms <= 0:
            self._fail_open("no slot free and waiting is off (timeout 0)")
            return False

        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        if still_wanted is not None:
            self._wanted[fut] = still_wanted
        clock = self._clock
        timer = (
            clock.call_at(clock.now() + timeout_ms, partial(self._expire, fut))
            if math.isfinite(timeout_ms)
            else None
        )
        try:
            granted = await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None and fut.result():
                self.release()  # handed a slot at the moment of cancellation: pass it on
            else:
                self._discard(fut)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            self._wanted.pop(fut, None)
        if not granted:
            self._fail_open(f"no slot within {timeout_ms:g} ms")
        return granted

    def release(self) -> None:
        if self._in_use <= 0:
            raise RuntimeError("release() without a held slot")
        if self._in_use <= self._limit:
            while self._waiters:
                fut = self._waiters.popleft()
                if not fut.done():  # skip waiters cancelled but not yet cleaned up
                    fut.set_result(True)
                    return
        self._in_use -= 1

    def set_limit(self, limit: int) -> None:
        """Apply a new `max_concurrent` at once: a raise admits waiters, a lower cap drains."""
        _check_limit(limit)
        self._limit = limit
        while self._in_use < self._limit and self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                self._in_use += 1
                fut.set_result(True)

    def recheck(self) -> None:
        """Ask each waiter's `still_wanted` now: the ones no longer wanted leave with Withdrawn
        (cheap when nobody waits)."""
        if not self._wanted:
            return
        for fut, still_wanted in list(self._wanted.items()):
            if not fut.done() and not still_wanted():
                self._discard(fut)
                fut.set_exception(Withdrawn("the connection can no longer take this request"))

    @asynccontextmanager
    async def slot(self, *, queue_depth: int, timeout_ms: float) -> AsyncIterator[bool]:
        """Yield whether a slot is held; release it on exit iff it was acquired."""
        acquired = await self.acquire(queue_depth=queue_depth, timeout_ms=timeout_ms)
        try:
            yield acquired
        finally:
            if acquired:
                self.release()

    def _expire(self, fut: asyncio.Future[bool]) -> None:
        if not fut.done():
            self._discard(fut)
            fut.set_result(False)

    def _discard(self, fut: asyncio.Future[bool]) -> None:
        with contextlib.suppress(ValueError):  # release() may have popped it already
            self._waiters.remove(fut)  # O(queue_depth), and only on a timeout or cancellation

    def _fail_open(self, reason: str) -> None:
        self._emit(
            Event(
                ts=self._clock.now(),
                layer="connection",
                key=self._key,
                from_="saturated",
                to="fail_open",
                reason=reason,
            )
        )


def _check_limit(limit: int) -> None:
    if limit < 1:
        raise ValueError(f"a semaphore needs at least one slot, got {limit}")
