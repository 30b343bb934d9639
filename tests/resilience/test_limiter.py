from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from proxy.resilience.clock import FakeClock, SystemClock
from proxy.resilience.errors import AdmissionError, ExecutionTimeout, QueueFull, Withdrawn
from proxy.resilience.limiter import Dispatch, QueueSettings, RequestLimiter, check_queue_admission

T0 = 1_767_225_600_000.0  # FakeClock's default start


async def _spin(turns: int = 10) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


def _fake_sleep(clock: FakeClock, slept: list[float]) -> Callable[[float], Awaitable[None]]:
    """A sleep that records its argument (seconds) and moves the fake clock instead of waiting."""

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(seconds * 1000)
        await asyncio.sleep(0)

    return sleep


@pytest.mark.parametrize(
    ("queued", "max_depth", "admitted"),
    [(0, 0, True), (50_000, 0, True), (0, 2, True), (1, 2, True), (2, 2, False), (3, 2, False)],
)
def test_check_queue_admission(queued: int, max_depth: int, admitted: bool) -> None:
    assert check_queue_admission(queued, max_depth) is admitted


def test_queue_settings_defaults_follow_the_spec() -> None:
    assert QueueSettings() == QueueSettings(
        auto_enable_api_key_providers=True,
        requests_per_minute=100,
        min_time_between_requests_ms=200,
        concurrent_requests=10,
        max_wait_ms=15_000,
        max_queue_depth=0,
    )


async def test_case_24_queue_depth_2_concurrency_1_fourth_request_is_rejected_at_once() -> None:
    settings = QueueSettings(
        requests_per_minute=1_000_000,
        min_time_between_requests_ms=0,
        concurrent_requests=1,
        max_queue_depth=2,
    )
    limiter = RequestLimiter(settings, FakeClock())
    log: list[str] = []
    gates = {n: asyncio.Event() for n in (1, 2, 3)}

    async def request(n: int) -> None:
        async with limiter.slot():
            log.append(f"start {n}")
            await gates[n].wait()
            log.append(f"end {n}")

    tasks = []
    for n in (1, 2, 3):
        tasks.append(asyncio.create_task(request(n)))
        await _spin()
    assert log == ["start 1"]
    assert (limiter.running, limiter.queued) == (1, 2)

    ran_meanwhile: list[int] = []
    asyncio.get_running_loop().call_soon(ran_meanwhile.append, 1)
    with pytest.raises(QueueFull) as raised:
        async with limiter.slot():
            log.append("start 4")
    assert ran_meanwhile == []  # raised before the event loop ran anything else
    assert raised.value.code == "RATE_LIMIT_QUEUE_FULL"
    assert isinstance(raised.value, AdmissionError)  # a local rejection: never an upstream failure
    assert log == ["start 1"]
    assert (limiter.running, limiter.queued) == (1, 2)

    for n in (1, 2, 3):
        gates[n].set()
    await asyncio.gather(*tasks)
    assert log == ["start 1", "end 1", "start 2", "end 2", "start 3", "end 3"]
    assert (limiter.running, limiter.queued) == (0, 0)


async def test_case_24_a_freed_queue_place_admits_again() -> None:
    settings = QueueSettings(min_time_between_requests_ms=0, concurrent_requests=1, max_queue_depth=1)
    limiter = RequestLimiter(settings, FakeClock())
    gate = asyncio.Event()

    async def request() -> None:
        async with limiter.slot():
            await gate.wait()

    first = asyncio.create_task(request())
    second = asyncio.create_task(request())
    await _spin()
    with pytest.raises(QueueFull):
        async with limiter.slot():
            pass
    gate.set()
    await asyncio.gather(first, second)
    async with limiter.slot() as dispatch:
        assert isinstance(dispatch, Dispatch)


async def test_case_25_an_upstream_that_never_answers_times_out_after_max_wait_ms() -> None:
    limiter = RequestLimiter(QueueSettings(max_wait_ms=50), SystemClock())
    never = asyncio.Event()
    loop = asyncio.get_running_loop()
    async with limiter.slot() as dispatch:
        assert dispatch.deadline - dispatch.dispatched_at == 50
        started = loop.time()
        with pytest.raises(ExecutionTimeout) as raised:
            await limiter.within_deadline(dispatch, never.wait())
        elapsed_ms = (loop.time() - started) * 1000
    assert 40 <= elapsed_ms < 1000
    assert raised.value.code == "RATE_LIMIT_EXECUTION_TIMEOUT"
    assert str(raised.value) == "no upstream response within 50 ms of dispatch"
    assert (limiter.running, limiter.queued) == (0, 0)


async def test_case_25_time_queued_before_dispatch_does_not_count() -> None:
    clock = FakeClock()
    settings = QueueSettings(min_time_between_requests_ms=0, concurrent_requests=1, max_wait_ms=50)
    limiter = RequestLimiter(settings, clock)
    release_a = asyncio.Event()

    async def request_a() -> None:
        async with limiter.slot():
            await release_a.wait()

    async def answers_in(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "headers"

    a = asyncio.create_task(request_a())
    await _spin()
    b_dispatch: list[Dispatch] = []

    async def request_b() -> str:
        async with limiter.slot() as dispatch:
            b_dispatch.append(dispatch)
            return await limiter.within_deadline(dispatch, answers_in(0.02))

    b = asyncio.create_task(request_b())
    await _spin()
    assert limiter.queued == 1
    clock.advance(100)  # B waits 100 ms behind A: twice its whole budget
    release_a.set()
    assert await b == "headers"
    await a
    assert b_dispatch == [Dispatch(dispatched_at=T0 + 100, deadline=T0 + 150)]


async def test_case_25_real_time_queued_does_not_count_either() -> None:
    settings = QueueSettings(min_time_between_requests_ms=0, concurrent_requests=1, max_wait_ms=50)
    limiter = RequestLimiter(settings, SystemClock())
    loop = asyncio.get_running_loop()

    async def request_a() -> None:
        async with limiter.slot():
            await asyncio.sleep(0.1)

    a = asyncio.create_task(request_a())
    await _spin()
    queued_at = loop.time()
    async with limiter.slot() as dispatch:
        dispatched_at = loop.time()
        with pytest.raises(ExecutionTimeout):
            await limiter.within_deadline(dispatch, asyncio.Event().wait())
        timed_out_at = loop.time()
    await a
    assert (dispatched_at - queued_at) * 1000 >= 90
    assert 40 <= (timed_out_at - dispatched_at) * 1000 < 1000


async def test_past_the_deadline_the_upstream_call_is_never_started() -> None:
    clock = FakeClock()
    limiter = RequestLimiter(QueueSettings(max_wait_ms=50), clock)
    started: list[int] = []

    async def upstream() -> None:
        started.append(1)

    async with limiter.slot() as dispatch:
        clock.advance(50)
        with pytest.raises(ExecutionTimeout):
            await limiter.within_deadline(dispatch, upstream())
    assert started == []


async def test_a_timeout_raised_by_the_upstream_call_itself_is_not_an_execution_timeout() -> None:
    limiter = RequestLimiter(QueueSettings(max_wait_ms=10_000), SystemClock())

    async def upstream() -> None:
        raise TimeoutError("connect timeout")

    async with limiter.slot() as dispatch:
        with pytest.raises(TimeoutError) as raised:
            await limiter.within_deadline(dispatch, upstream())
    assert not isinstance(raised.value, ExecutionTimeout)
    assert str(raised.value) == "connect timeout"


async def test_min_time_between_requests_spaces_dispatches_200_ms_apart() -> None:
    clock = FakeClock()
    slept: list[float] = []
    settings = QueueSettings(min_time_between_requests_ms=200, requests_per_minute=1_000)
    limiter = RequestLimiter(settings, clock, sleep=_fake_sleep(clock, slept))
    dispatched: list[float] = []

    async def request() -> None:
        async with limiter.slot() as dispatch:
            dispatched.append(dispatch.dispatched_at)

    await asyncio.gather(*(request() for _ in range(3)))
    assert dispatched == [T0, T0 + 200, T0 + 400]
    assert slept == [0.2, 0.2]


async def test_requests_per_minute_2_third_request_waits_until_60_s_after_the_first() -> None:
    clock = FakeClock()
    slept: list[float] = []
    settings = QueueSettings(min_time_between_requests_ms=0, requests_per_minute=2)
    limiter = RequestLimiter(settings, clock, sleep=_fake_sleep(clock, slept))
    dispatched: list[float] = []

    async def request() -> None:
        async with limiter.slot() as dispatch:
            dispatched.append(dispatch.dispatched_at)

    await request()
    clock.advance(10_000)
    await asyncio.gather(request(), request(), request())
    assert dispatched == [T0, T0 + 10_000, T0 + 60_000, T0 + 70_000]
    assert slept == [50.0, 10.0]


async def test_update_raising_concurrency_releases_the_head_at_once() -> None:
    settings = QueueSettings(min_time_between_requests_ms=0, concurrent_requests=1)
    limiter = RequestLimiter(settings, FakeClock())
    gate = asyncio.Event()
    started: list[int] = []

    async def request(n: int) -> None:
        async with limiter.slot():
            started.append(n)
            await gate.wait()

    tasks = [asyncio.create_task(request(n)) for n in (1, 2, 3)]
    await _spin()
    assert started == [1]
    limiter.update(QueueSettings(min_time_between_requests_ms=0, concurrent_requests=3))
    await _spin()
    assert started == [1, 2, 3]
    assert (limiter.running, limiter.queued) == (3, 0)
    gate.set()
    await asyncio.gather(*tasks)


async def test_update_applies_a_new_queue_depth_and_rate() -> None:
    clock = FakeClock()
    slept: list[float] = []
    limiter = RequestLimiter(
        QueueSettings(min_time_between_requests_ms=0), clock, sleep=_fake_sleep(clock, slept)
    )
    limiter.update(QueueSettings(min_time_between_requests_ms=0, requests_per_minute=1))
    async with limiter.slot():
        pass
    async with limiter.slot() as second:
        assert second.dispatched_at == T0 + 60_000
    assert limiter.settings.requests_per_minute == 1


async def test_cancelled_requests_leave_no_slot_and_no_queue_entry() -> None:
    settings = QueueSettings(min_time_between_requests_ms=0, concurrent_requests=1, max_queue_depth=2)
    limiter = RequestLimiter(settings, FakeClock())
    gate = asyncio.Event()
    served: list[int] = []

    async def request(n: int) -> None:
        async with limiter.slot():
            served.append(n)
            await gate.wait()

    running = asyncio.create_task(request(1))
    head = asyncio.create_task(request(2))
    behind = asyncio.create_task(request(3))
    await _spin()
    assert (limiter.running, limiter.queued) == (1, 2)
    head.cancel()  # waiting for the slot
    running.cancel()  # holding the slot
    await _spin()
    assert served == [1, 3]
    assert (limiter.running, limiter.queued) == (1, 0)
    gate.set()
    await behind
    for task in (head, running):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert (limiter.running, limiter.queued) == (0, 0)


async def test_the_slot_is_released_when_the_block_raises() -> None:
    limiter = RequestLimiter(QueueSettings(concurrent_requests=1), FakeClock())
    with pytest.raises(ValueError):
        async with limiter.slot():
            assert limiter.running == 1
            raise ValueError("upstream blew up")
    assert (limiter.running, limiter.queued) == (0, 0)


async def test_a_queued_request_no_longer_wanted_leaves_at_once_and_uses_no_turn() -> None:
    """The request at the head sleeps on the pacing rule; its connection stops being usable (it
    started cooling): `recheck()` wakes it, it leaves with Withdrawn, and so does everyone behind it
    that is not wanted either, without sleeping and without taking a dispatch from the rate rules."""
    clock = FakeClock()
    limiter = RequestLimiter(QueueSettings(min_time_between_requests_ms=60_000), clock)
    usable = True
    outcomes: list[str] = []

    async def request(n: int) -> None:
        try:
            async with limiter.slot(still_wanted=lambda: usable):
                outcomes.append(f"{n} dispatched")
        except Withdrawn:
            outcomes.append(f"{n} withdrawn")

    first = asyncio.create_task(request(1))
    await _spin()
    rest = [asyncio.create_task(request(n)) for n in (2, 3, 4)]
    await _spin()
    assert outcomes == ["1 dispatched"] and limiter.queued == 3  # 2 sleeps a minute; 3 and 4 wait behind
    usable = False
    limiter.recheck()
    async with asyncio.timeout(1.0):  # real time: the minute of pacing is not waited
        await asyncio.gather(first, *rest)
    assert outcomes == ["1 dispatched", "2 withdrawn", "3 withdrawn", "4 withdrawn"]
    assert (limiter.running, limiter.queued) == (0, 0)
    usable = True
    clock.advance(60_000)  # only the one real dispatch counts for pacing
    async with asyncio.timeout(1.0), limiter.slot(still_wanted=lambda: usable) as dispatch:
        assert dispatch.dispatched_at == T0 + 60_000


async def test_a_request_waiting_for_a_concurrency_slot_is_withdrawn_on_recheck() -> None:
    limiter = RequestLimiter(
        QueueSettings(min_time_between_requests_ms=0, concurrent_requests=1), FakeClock()
    )
    gate = asyncio.Event()
    usable = True

    async def holder() -> None:
        async with limiter.slot():
            await gate.wait()

    async def waiter() -> None:
        async with limiter.slot(still_wanted=lambda: usable):
            raise AssertionError("dispatched although its connection was no longer usable")

    holding = asyncio.create_task(holder())
    await _spin()
    waiting = asyncio.create_task(waiter())
    await _spin()
    assert limiter.queued == 1
    usable = False
    limiter.recheck()
    with pytest.raises(Withdrawn):
        async with asyncio.timeout(1.0):
            await waiting
    assert (limiter.running, limiter.queued) == (1, 0)
    gate.set()
    await holding


async def test_the_execution_deadline_is_engine_time() -> None:
    # Issue #9, item 12: the deadline ends when the engine's clock passes it, not after real time.
    clock = FakeClock()
    limiter = RequestLimiter(QueueSettings(max_wait_ms=15_000), clock)
    async with limiter.slot() as dispatch:
        call = asyncio.create_task(limiter.within_deadline(dispatch, asyncio.Event().wait()))
        await _spin()
        clock.advance(14_999)
        await _spin()
        assert not call.done()
        clock.advance(1)
        with pytest.raises(ExecutionTimeout):
            await asyncio.wait_for(call, 1.0)


async def test_the_pacing_wait_is_engine_time() -> None:
    clock = FakeClock()
    limiter = RequestLimiter(QueueSettings(min_time_between_requests_ms=60_000), clock)
    async with limiter.slot() as first:
        pass
    second = asyncio.create_task(_dispatch_time(limiter))
    await _spin()
    clock.advance(59_999)
    await _spin()
    assert not second.done()
    clock.advance(1)
    assert await asyncio.wait_for(second, 1.0) == first.dispatched_at + 60_000


async def _dispatch_time(limiter: RequestLimiter) -> float:
    async with limiter.slot() as dispatch:
        return dispatch.dispatched_at


async def test_a_ticket_is_queued_then_running_then_released_once() -> None:
    clock = FakeClock()
    limiter = RequestLimiter(QueueSettings(min_time_between_requests_ms=0, max_queue_depth=2), clock)
    first, second = limiter.admit(), limiter.admit()
    assert (limiter.queued, limiter.running) == (2, 0)
    with pytest.raises(QueueFull):
        limiter.admit()  # a place held before dispatch counts against the depth
    dispatch = await first.dispatch()
    assert dispatch == Dispatch(dispatched_at=T0, deadline=T0 + 15_000)
    assert (limiter.queued, limiter.running) == (1, 1)
    second.release()  # leaves the queue without ever being dispatched
    first.release()
    first.release()
    second.release()
    assert (limiter.queued, limiter.running) == (0, 0)


async def test_a_ticket_cancelled_while_waiting_for_its_turn_leaves_the_queue() -> None:
    limiter = RequestLimiter(
        QueueSettings(min_time_between_requests_ms=0, concurrent_requests=1), FakeClock()
    )
    holder = limiter.admit()
    await holder.dispatch()
    waiter = limiter.admit()
    waiting = asyncio.create_task(waiter.dispatch())
    await _spin()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert (limiter.queued, limiter.running) == (0, 1)
    waiter.release()  # still safe: the ticket was already released
    holder.release()
    assert (limiter.queued, limiter.running) == (0, 0)
