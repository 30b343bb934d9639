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
import uuid
from pathlib import Path

from proxy.config import load_config
from proxy.engine import Attempt, Target
from proxy.resilience.clock import FakeClock
from proxy.resilience.outcome import Outcome
from proxy.runtime import Runtime
from tests.fleet.conftest import REDIS_URL, require_redis
from tests.fleet.test_overlap import CONFIG


def test_a_failure_then_a_success_on_one_replica_leave_the_fleets_breaker_closed(tmp_path: Path) -> None:
    redis = require_redis()
    prefix = f"omniroute-test:{uuid.uuid4().hex[:10]}:"
    clock = FakeClock()
    loop = asyncio.new_event_loop()
    runtimes: list[Runtime] = []
    try:
        for port in (1, 2):  # not served: the port only tells the two replicas' ids apart
            path = tmp_path / f"r{port}.toml"
            path.write_text(CONFIG.format(port=port, url=REDIS_URL, prefix=prefix))
            runtime = Runtime.open(load_config(path, {}, explicit=True), None, clock=clock, env={})
            runtimes.append(runtime)
            loop.run_until_complete(runtime.start())
        served = runtimes[0].engine
        for outcome in (Outcome.http(503), Outcome.ok()):  # no loop turn between: the worker waits
            attempt = served.select([Target("flaky", "m1")])
            assert isinstance(attempt, Attempt)
            clock.advance(0.001)
            served.record(attempt, outcome)
        assert served.providers["flaky"].breaker.state(clock.now()).value == "CLOSED"

        async def settled() -> None:
            for runtime in runtimes:
                assert runtime.fleet is not None and runtime.fleet._jobs is not None
                await runtime.fleet._jobs.join()
            await asyncio.sleep(0.2)  # the feed, to the other replica

        loop.run_until_complete(settled())
        shared = json.loads(redis.hget(f"{prefix}b:flaky", "r") or "{}")
        assert (shared.get("state"), shared.get("failure_count")) == ("CLOSED", 0), shared
        assert [rt.engine.providers["flaky"].breaker.state(clock.now()).value for rt in runtimes] == [
            "CLOSED",
            "CLOSED",
        ]
    finally:
        for runtime in runtimes:
            loop.run_until_complete(runtime.stop())
        loop.close()
        keys = list(redis.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            redis.delete(*keys)
