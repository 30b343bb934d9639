"""A HALF_OPEN probe whose client leaves while Redis answers the lease request.

`select` admitted the attempt as the provider's probe (its connection's slot taken, the breaker's
probe slot held) and the pipeline awaits the fleet's lease (`SET NX PX`) before sending it. A client
that goes away at that await cancels the request there: nothing may stay taken. Before, the
connection's in-flight count kept the slot for the life of the process, and the lease Redis had
already granted kept every replica from probing the provider until it expired (the probe timeout).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.engine import Attempt, Target
from proxy.fleet.scripts import TAKE_PROBE
from proxy.resilience.outcome import Outcome
from proxy.runtime import Runtime
from tests.fleet.test_overtaken import caught_up, fleet, fleet_of

__all__ = ["fleet"]  # (the fixture, imported to be used here)

FLAKY = Target("flaky", "m1")


def a_probe(runtime: Runtime) -> Attempt:
    """Fail the provider until its breaker opens, then wait (on the fake clock) for its probe."""
    engine = runtime.engine
    for _ in range(50):
        decision = engine.select([FLAKY])
        if not isinstance(decision, Attempt):
            break
        engine.record(decision, Outcome.network("connection refused"))
    assert [s.reason for s in decision.skips] == ["circuit_open"], decision
    for _ in range(600):
        engine.clock.advance(1000)  # type: ignore[attr-defined]
        decision = engine.select([FLAKY])
        if isinstance(decision, Attempt):
            assert decision.probe
            return decision
    raise AssertionError("the breaker never let a probe through")


def test_a_probe_cancelled_while_redis_grants_its_lease_gives_back_the_slot_and_the_lease(
    fleet: tuple[asyncio.AbstractEventLoop, list[Runtime], Any, str],
) -> None:
    loop, (a, _), redis, prefix = fleet
    probe = a_probe(a)
    loop.run_until_complete(caught_up([a], redis, prefix))  # the fleet knows the breaker is open
    connection = probe.connection
    assert connection.in_flight == 1
    fleet_a = fleet_of(a)
    assert fleet_a._r is not None
    granted = fleet_a._r.eval
    lease = f"{prefix}probe:flaky"
    read: list[Any] = []

    async def reply_still_on_its_way(script: str, *args: Any, **kwargs: Any) -> Any:
        answer = await granted(script, *args, **kwargs)
        if script != TAKE_PROBE:  # (the replica's other scripts)
            return answer
        read.append(answer)  # Redis has granted the lease...
        await asyncio.Event().wait()  # ...and the client leaves before the reply is read

    release = fleet_a._release
    released = asyncio.Event()

    async def release_when_let(*args: Any) -> bool:
        await released.wait()
        return await release(*args)

    fleet_a._r.eval = reply_still_on_its_way  # type: ignore[method-assign]
    fleet_a._release = release_when_let  # type: ignore[method-assign]
    try:
        taking = loop.create_task(fleet_a.take_probe(probe))
        for _ in range(2000):
            if read:
                break
            loop.run_until_complete(asyncio.sleep(0.001))
        assert read == [[1, 0]] and redis.get(lease) is not None
        taking.cancel()
        with pytest.raises(asyncio.CancelledError):
            loop.run_until_complete(taking)
        fleet_a._r.eval = granted  # type: ignore[method-assign]
        assert connection.in_flight == 0
        # Before the lease is given back, the next request finds this replica's slot free and the
        # fleet's lease taken (by the request that left): it is refused, as when another replica
        # probes.
        refused = a.engine.select([FLAKY])
        assert isinstance(refused, Attempt) and refused.probe
        assert not loop.run_until_complete(fleet_a.take_probe(refused))
        assert connection.in_flight == 0
        released.set()
        loop.run_until_complete(caught_up([a], redis, prefix))
    finally:
        fleet_a._r.eval = granted  # type: ignore[method-assign]
        fleet_a._release = release  # type: ignore[method-assign]

    assert redis.get(lease) is None
    # Once it is given back, the next request probes at once, from this replica too: nobody waits
    # for the lease of a request that left to run out.
    again = a.engine.select([FLAKY])
    assert isinstance(again, Attempt) and again.probe
    assert loop.run_until_complete(fleet_a.take_probe(again))
