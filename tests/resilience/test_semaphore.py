from __future__ import annotations

import asyncio
import random

import pytest

from proxy.resilience.clock import FakeClock
from proxy.resilience.errors import Withdrawn
from proxy.resilience.events import Event
from proxy.resilience.semaphore import ConnectionSemaphore


async def _spin(turns: int = 5) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


async def test_case_23_cap_1_two_requests_reach_the_upstream_one_after_the_other() -> None:
    sem = ConnectionSemaphore(1)
    log: list[str] = []
    gate = asyncio.Event()
    first_entered = asyncio.Event()

    async def upstream(name: str) -> None:
        log.append(f"enter {name}")
        first_entered.set()
        await gate.wait()
        log.append(f"exit {name}")

    async def request(name: str) -> bool:
        async with sem.slot(queue_depth=20, timeout_ms=30_000) as held:
            await upstream(name)
            return held

    one = asyncio.create_task(request("one"))
    two = asyncio.create_task(request("two"))
    await first_entered.wait()
    await _spin(10)
    assert log == ["enter one"]
    assert (sem.in_use, sem.waiting) == (1, 1)
    assert sem.has_free_slot() is False

    gate.set()
    assert list(await asyncio.gather(one, two)) == [True, True]
    assert log == ["enter one", "exit one", "enter two", "exit two"]
    assert (sem.in_use, sem.waiting) == (0, 0)
    assert sem.has_free_slot() is True


async def test_case_23_full_wait_queue_lets_the_request_through_without_a_slot() -> None:
    events: list[Event] = []
    clock = FakeClock()
    sem = ConnectionSemaphore(1, key="ollama/box", clock=clock, emit=events.append)
    assert await sem.acquire(queue_depth=1, timeout_ms=30_000) is True
    waiter = asyncio.create_task(sem.acquire(queue_depth=1, timeout_ms=30_000))
    await _spin()
    assert sem.waiting == 1

    ran_meanwhile: list[int] = []
    asyncio.get_running_loop().call_soon(ran_meanwhile.append, 1)
    assert await sem.acquire(queue_depth=1, timeout_ms=30_000) is False
    assert ran_meanwhile == []  # decided at once, without waiting
    assert (sem.in_use, sem.waiting) == (1, 1)
    assert [(e.layer, e.key, e.from_, e.to, e.reason, e.ts) for e in events] == [
        ("connection", "ollama/box", "saturated", "fail_open", "wait queue full (1 waiting)", clock.now())
    ]

    sem.release()
    assert await waiter is True
    sem.release()
    assert (sem.in_use, sem.waiting) == (0, 0)


async def test_case_23_wait_timeout_lets_the_request_through_without_a_slot() -> None:
    events: list[Event] = []
    clock = FakeClock()  # the timeout is engine time: the test moves the clock instead of waiting
    sem = ConnectionSemaphore(1, clock=clock, emit=events.append)
    async with sem.slot(queue_depth=20, timeout_ms=30_000) as held:
        assert held is True

        async def second() -> bool:
            async with sem.slot(queue_depth=20, timeout_ms=20) as got:
                assert (sem.in_use, sem.waiting) == (1, 0)
                return got

        waiter = asyncio.create_task(second())
        await _spin()
        assert sem.waiting == 1
        clock.advance(20)
        assert await asyncio.wait_for(waiter, 1.0) is False
        assert sem.in_use == 1  # the fail-open block released nothing
    assert [(e.to, e.reason) for e in events] == [("fail_open", "no slot within 20 ms")]
    assert (sem.in_use, sem.waiting) == (0, 0)


async def test_zero_queue_depth_or_zero_timeout_never_waits() -> None:
    sem = ConnectionSemaphore(1)
    assert await sem.acquire(queue_depth=0, timeout_ms=30_000) is True  # a free slot is still taken
    assert await sem.acquire(queue_depth=0, timeout_ms=30_000) is False
    assert await sem.acquire(queue_depth=20, timeout_ms=0) is False
    assert (sem.in_use, sem.waiting) == (1, 0)


async def test_waiters_are_served_in_arrival_order() -> None:
    sem = ConnectionSemaphore(1)
    assert await sem.acquire(queue_depth=20, timeout_ms=30_000)
    order: list[int] = []

    async def waiter(n: int) -> None:
        assert await sem.acquire(queue_depth=20, timeout_ms=30_000)
        order.append(n)
        sem.release()

    tasks = []
    for n in range(5):
        tasks.append(asyncio.create_task(waiter(n)))
        await _spin(1)
    assert sem.waiting == 5
    sem.release()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]
    assert (sem.in_use, sem.waiting) == (0, 0)


async def test_a_waiter_cancelled_as_it_is_handed_the_slot_passes_it_on() -> None:
    sem = ConnectionSemaphore(1)
    assert await sem.acquire(queue_depth=20, timeout_ms=30_000)
    first = asyncio.create_task(sem.acquire(queue_depth=20, timeout_ms=30_000))
    second = asyncio.create_task(sem.acquire(queue_depth=20, timeout_ms=30_000))
    await _spin()
    assert sem.waiting == 2

    sem.release()  # hands the slot to `first`...
    first.cancel()  # ...which is cancelled before it could run
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await second is True
    assert (sem.in_use, sem.waiting) == (1, 0)
    sem.release()
    assert (sem.in_use, sem.waiting) == (0, 0)


async def _cancelled_leaves_no_trace(sem: ConnectionSemaphore, waiter: asyncio.Task[bool]) -> None:
    """Cancel `waiter` (queued behind the one slot held): it sees its cancellation and leaves the
    line, and the held slot is the only thing left to release."""
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (sem.in_use, sem.waiting) == (1, 0)
    sem.release()
    assert (sem.in_use, sem.waiting) == (0, 0)


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    sem = ConnectionSemaphore(1)
    assert await sem.acquire(queue_depth=20, timeout_ms=30_000)
    waiter = asyncio.create_task(sem.acquire(queue_depth=20, timeout_ms=30_000))
    await _spin()
    await _cancelled_leaves_no_trace(sem, waiter)


async def test_set_limit_raise_admits_waiters_and_lower_drains() -> None:
    sem = ConnectionSemaphore(1)
    assert await sem.acquire(queue_depth=20, timeout_ms=30_000)
    waiters = [asyncio.create_task(sem.acquire(queue_depth=20, timeout_ms=30_000)) for _ in range(2)]
    await _spin()
    sem.set_limit(3)
    assert await asyncio.gather(*waiters) == [True, True]
    assert (sem.in_use, sem.waiting) == (3, 0)

    sem.set_limit(1)
    late = asyncio.create_task(sem.acquire(queue_depth=20, timeout_ms=30_000))
    await _spin()
    sem.release()
    sem.release()
    await _spin()
    assert (sem.in_use, sem.waiting, late.done()) == (1, 1, False)  # still over the new cap
    sem.release()
    assert await late is True
    sem.release()
    assert (sem.in_use, sem.waiting) == (0, 0)


def test_limit_below_one_and_extra_release_are_errors() -> None:
    with pytest.raises(ValueError):
        ConnectionSemaphore(0)
    sem = ConnectionSemaphore(2)
    with pytest.raises(ValueError):
        sem.set_limit(0)
    with pytest.raises(RuntimeError):
        sem.release()


async def test_case_23_thousand_mixed_requests_with_cancellations_leave_no_trace() -> None:
    rng = random.Random(23)
    sem = ConnectionSemaphore(3)
    holding = 0
    most_holding = 0
    outcomes = {"slot": 0, "fail_open": 0}

    async def request() -> None:
        nonlocal holding, most_holding
        async with sem.slot(
            queue_depth=rng.choice((0, 2, 20)), timeout_ms=rng.choice((1, 5, 30_000))
        ) as held:
            outcomes["slot" if held else "fail_open"] += 1
            if held:
                holding += 1
                most_holding = max(most_holding, holding)
            try:
                for _ in range(rng.randint(0, 4)):
                    await asyncio.sleep(0)
                if rng.random() < 0.05:
                    await asyncio.sleep(0.002)  # let some wait timers fire
            finally:
                if held:
                    holding -= 1

    tasks: list[asyncio.Task[None]] = []
    for _ in range(1000):
        tasks.append(asyncio.create_task(request()))
        if rng.random() < 0.5:
            await asyncio.sleep(0)
        if rng.random() < 0.3:
            # A recent task: queued, holding, just handed a slot, or already done.
            rng.choice(tasks[-8:]).cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)

    cancelled = sum(isinstance(r, asyncio.CancelledError) for r in results)
    assert [r for r in results if r is not None and not isinstance(r, asyncio.CancelledError)] == []
    assert cancelled > 50
    assert outcomes["slot"] > 100
    assert outcomes["fail_open"] > 100
    assert most_holding == 3
    assert (sem.in_use, sem.waiting, holding) == (0, 0, 0)


async def test_the_wait_timeout_is_engine_time() -> None:
    # Issue #9, item 12: the slot wait's timeout is read on the engine's clock, so 30 s of engine
    # time pass at once on a FakeClock, and real time alone never ends it.
    events: list[Event] = []
    clock = FakeClock()
    sem = ConnectionSemaphore(1, key="box", clock=clock, emit=events.append)
    assert await sem.acquire(queue_depth=20, timeout_ms=30_000) is True
    waiter = asyncio.create_task(sem.acquire(queue_depth=20, timeout_ms=30_000))
    await _spin()
    clock.advance(29_999)
    await _spin()
    assert (waiter.done(), sem.waiting) == (False, 1)
    clock.advance(1)
    assert await asyncio.wait_for(waiter, 1.0) is False
    assert [(e.to, e.reason, e.ts) for e in events] == [("fail_open", "no slot within 30000 ms", clock.now())]
    assert (sem.in_use, sem.waiting) == (1, 0)


async def test_a_waiter_no_longer_wanted_leaves_at_once_on_recheck() -> None:
    """A request waiting for a slot of a connection that was disabled (or started cooling, went
    terminal, had its breaker open) waited for the slot, and was refused only once it came (found
    by a trial): `recheck()` lets it go at once, and the line behind it keeps its order."""
    sem = ConnectionSemaphore(1)
    assert await sem.acquire(queue_depth=10, timeout_ms=60_000)
    wanted = {"a": True, "b": True}
    a = asyncio.create_task(sem.acquire(queue_depth=10, timeout_ms=60_000, still_wanted=lambda: wanted["a"]))
    b = asyncio.create_task(sem.acquire(queue_depth=10, timeout_ms=60_000, still_wanted=lambda: wanted["b"]))
    await asyncio.sleep(0)
    assert sem.waiting == 2
    sem.recheck()  # both still wanted: nothing moves
    await asyncio.sleep(0)
    assert sem.waiting == 2 and not a.done()
    wanted["a"] = False
    sem.recheck()
    with pytest.raises(Withdrawn):
        await a
    assert sem.waiting == 1 and sem.in_use == 1
    sem.release()  # the slot goes to the next in line
    assert await b is True and sem.in_use == 1 and sem.waiting == 0


async def test_a_waiter_cancelled_as_it_is_withdrawn_is_cancelled_and_leaves_no_trace() -> None:
    """The withdrawal and a cancellation (its client left) in the same turn of the loop: the
    cancellation is what the waiter's task sees, not a Withdrawn raised from its handler."""
    sem = ConnectionSemaphore(1)
    assert await sem.acquire(queue_depth=10, timeout_ms=60_000)
    waiter = asyncio.create_task(sem.acquire(queue_depth=10, timeout_ms=60_000, still_wanted=lambda: False))
    await asyncio.sleep(0)
    sem.recheck()
    await _cancelled_leaves_no_trace(sem, waiter)
