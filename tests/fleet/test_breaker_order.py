"""A replica's breaker outcomes reach the fleet in the order it made them, however fast they come.

One request on one replica: its first attempt fails (the provider's breaker leaves CLOSED) and its
fallback succeeds (the breaker closes again), both before the replica's worker has written the
failure to Redis. The success was then judged by the shared record alone, which still said a
healthy CLOSED, and dropped as "changing nothing"; the failure landed after it, and the whole
fleet (the replica that served included, adopting the shared record) stayed DEGRADED with one
failure counted toward opening. Found by a fleet trial.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from proxy.engine import Attempt, Target
from proxy.resilience.clock import FakeClock
from proxy.resilience.outcome import Outcome
from proxy.runtime import Runtime
from tests.fleet.test_overtaken import caught_up, fleet

__all__ = ["fleet"]  # (the fixture, imported to be used here)


def test_a_failure_then_a_success_on_one_replica_leave_the_fleets_breaker_closed(
    fleet: tuple[asyncio.AbstractEventLoop, list[Runtime], Any, str],
) -> None:
    loop, runtimes, redis, prefix = fleet
    served = runtimes[0].engine
    clock = served.clock
    assert isinstance(clock, FakeClock)
    for outcome in (Outcome.http(503), Outcome.ok()):  # no loop turn between: the worker waits
        attempt = served.select([Target("flaky", "m1")])
        assert isinstance(attempt, Attempt)
        clock.advance(0.001)
        served.record(attempt, outcome)
    assert served.providers["flaky"].breaker.state(clock.now()).value == "CLOSED"
    loop.run_until_complete(caught_up(runtimes, redis, prefix))
    shared = json.loads(redis.hget(f"{prefix}b:flaky", "r") or "{}")
    assert (shared.get("state"), shared.get("failure_count")) == ("CLOSED", 0), shared
    assert [rt.engine.providers["flaky"].breaker.state(clock.now()).value for rt in runtimes] == [
        "CLOSED",
        "CLOSED",
    ]
