"""A replica's own write can be overtaken before its worker hears the reply: another replica writes
a newer version of the same record, and the change feed brings it first. The replica must end on
the newest record, in its cache and in its memory tier, not on its own older one.

An operator's action can overtake a write still waiting in a replica's queue: the outcome it carries
was decided before the operator acted, so replayed after the action it must not undo it (a reset
connection cooling again for a minute, a re-enabled model locked again), and the replica takes the
operator's word at once, not once its own queue is through.

Found by tests/fleet/test_overlap.py under load (one run in six while other work ran): replica A's
worker wrote a 60 s cooldown as version n, replica B replayed its 300 s hint on it as n + 1, A's
feed delivered both entries while A's write still awaited its reply (so it adopted neither: A had
the job pending), and then A took its own version n as the newest and kept a 60 s cooldown that
the fleet had replaced. Here the overtaking is arranged, not waited for.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.config import load_config
from proxy.engine import Attempt, Target
from proxy.fleet.backend import FleetState
from proxy.resilience.clock import FakeClock
from proxy.resilience.outcome import Outcome
from proxy.runtime import Runtime
from tests.fleet.conftest import REDIS_URL, require_redis
from tests.fleet.test_overlap import CONFIG


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[asyncio.AbstractEventLoop, list[Runtime], Any, str]]:
    redis = require_redis()
    prefix = f"omniroute-test:{uuid.uuid4().hex[:10]}:"
    clock = FakeClock()
    loop = asyncio.new_event_loop()
    runtimes = []
    for port in (1, 2):
        path = tmp_path / f"r{port}.toml"
        path.write_text(CONFIG.format(port=port, url=REDIS_URL, prefix=prefix))
        runtime = Runtime.open(load_config(path, {}, explicit=True), None, clock=clock, env={})
        loop.run_until_complete(runtime.start())
        runtimes.append(runtime)
    try:
        yield loop, runtimes, redis, prefix
    finally:
        for runtime in runtimes:
            loop.run_until_complete(runtime.stop())
        loop.close()
        keys = list(redis.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            redis.delete(*keys)


def fleet_of(runtime: Runtime) -> FleetState:
    assert isinstance(runtime.fleet, FleetState)
    return runtime.fleet


async def caught_up(runtimes: list[Runtime], redis: Any, prefix: str) -> None:
    """Every worker idle and every feed at the stream's last entry."""
    for runtime in runtimes:
        await fleet_of(runtime)._jobs.join()  # type: ignore[union-attr]
    last = redis.xrevrange(f"{prefix}feed", count=1)
    target = last[0][0] if last else "0-0"
    for _ in range(2000):
        if all(fleet_of(rt)._feed_from == target for rt in runtimes):
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the feeds did not catch up")


async def heard_everything(runtime: Runtime, redis: Any, prefix: str) -> None:
    """This replica's feed is at the stream's last entry (its worker may still be busy)."""
    last = redis.xrevrange(f"{prefix}feed", count=1)[0][0]
    while fleet_of(runtime)._feed_from != last:
        await asyncio.sleep(0.001)


def a_429(runtime: Runtime, retry_after_s: int) -> tuple[Attempt, Outcome]:
    decision = runtime.engine.select([Target("keys", "m1")])
    assert isinstance(decision, Attempt), decision
    return decision, Outcome.http(429, "slow down", {"retry-after": str(retry_after_s)})


def test_a_write_overtaken_by_the_feed_leaves_the_newest_record(
    fleet: tuple[asyncio.AbstractEventLoop, list[Runtime], Any, str],
) -> None:
    loop, (a, b), redis, prefix = fleet
    later = a_429(b, 300)  # selected before key-1 cools anywhere
    fleet_a = fleet_of(a)
    written = fleet_a._write

    async def overtaken(*args: Any, **kwargs: Any) -> tuple[int, int, str, str]:
        result = await written(*args, **kwargs)
        # Before A's worker goes on: B records its later hint (a replay on A's version), and A's
        # feed brings both entries.
        b.engine.record(*later)
        await caught_up([b], redis, prefix)
        await heard_everything(a, redis, prefix)
        return result

    fleet_a._write = overtaken  # type: ignore[method-assign]
    a.engine.record(*a_429(a, 60))
    loop.run_until_complete(caught_up([a, b], redis, prefix))
    fleet_a._write = written  # type: ignore[method-assign]

    shared = json.loads(redis.hget(f"{prefix}c:key-1", "r"))
    version = int(redis.hget(f"{prefix}c:key-1", "v"))
    now = a.engine.clock.now()
    assert shared["rate_limited_until"] == pytest.approx(now + 300_000)  # the later hint won
    assert fleet_a._cache[("c", "key-1")] == (shared, version)
    for runtime in (a, b):
        assert runtime.engine.connections["key-1"].health.to_record() == shared


def held_until_the_operator_acts(
    waiting: Runtime,
    operator: Runtime,
    act: Callable[[], object],
    redis: Any,
    prefix: str,
    check: Callable[[], object],
) -> list[object]:
    """Hold `waiting`'s next write until, a millisecond later, the operator acts through `operator`
    and `waiting`'s feed has brought the action; `check()` runs then, its value is returned."""
    own = fleet_of(waiting)
    written = own._write
    seen: list[object] = []

    async def held(*args: Any, **kwargs: Any) -> tuple[int, int, str, str]:
        operator.engine.clock.advance(1)  # type: ignore[attr-defined]
        act()
        await caught_up([operator], redis, prefix)
        await heard_everything(waiting, redis, prefix)
        seen.append(check())
        own._write = written  # type: ignore[method-assign]
        return await written(*args, **kwargs)

    own._write = held  # type: ignore[method-assign]
    return seen


def test_an_operator_reset_is_not_undone_by_a_failure_decided_before_it(
    fleet: tuple[asyncio.AbstractEventLoop, list[Runtime], Any, str],
) -> None:
    loop, (a, b), redis, prefix = fleet
    in_flight = a_429(b, 60)  # a second request on key-1, sent before it cooled
    b.engine.record(*a_429(b, 60))
    loop.run_until_complete(caught_up([a, b], redis, prefix))
    assert not a.engine.connections["key-1"].health.is_eligible(a.engine.clock.now())

    health = b.engine.connections["key-1"].health
    seen = held_until_the_operator_acts(
        b,
        a,
        lambda: a.engine.reset_connection("key-1"),
        redis,
        prefix,
        lambda: health.is_eligible(b.engine.clock.now()),
    )
    b.engine.clock.advance(1)  # type: ignore[attr-defined]
    b.engine.record(*in_flight)  # its 429 is queued on B when the operator resets key-1 through A
    loop.run_until_complete(caught_up([a, b], redis, prefix))

    assert seen == [True]  # B took the reset at once, though its own write was still queued
    shared = json.loads(redis.hget(f"{prefix}c:key-1", "r"))
    assert shared["rate_limited_until"] is None and shared["backoff_level"] == 0
    for runtime in (a, b):
        assert runtime.engine.connections["key-1"].health.to_record() == shared


def test_an_operator_reenable_is_not_undone_by_a_failure_decided_before_it(
    fleet: tuple[asyncio.AbstractEventLoop, list[Runtime], Any, str],
) -> None:
    loop, (a, b), redis, prefix = fleet
    for runtime in (a, b):
        runtime.engine.settings.patch({"modelLockout": {"enabled": True}}, "settings")
    first, in_flight = (b.engine.select([Target("keys", "m1")]) for _ in range(2))
    assert isinstance(first, Attempt) and isinstance(in_flight, Attempt)
    b.engine.record(first, Outcome.http(404, "model not found"))
    loop.run_until_complete(caught_up([a, b], redis, prefix))
    assert a.engine.lockouts.get("keys", "key-1", "m1") is not None

    seen = held_until_the_operator_acts(
        b,
        a,
        lambda: a.engine.reenable("keys", "m1"),
        redis,
        prefix,
        lambda: b.engine.lockouts.get("keys", "key-1", "m1"),
    )
    b.engine.clock.advance(1)  # type: ignore[attr-defined]
    # (sent before the lock, its failure would change nothing but for its longer hint)
    b.engine.record(in_flight, Outcome.http(404, "model not found", {"retry-after": "86400"}))
    loop.run_until_complete(caught_up([a, b], redis, prefix))

    assert seen == [None]
    assert redis.hget(f"{prefix}l:keys:key-1:m1", "r") in ("", None)
    for runtime in (a, b):
        assert runtime.engine.lockouts.get("keys", "key-1", "m1") is None


def test_an_older_operator_reset_landing_late_does_not_undo_what_came_after_a_newer_one(
    fleet: tuple[asyncio.AbstractEventLoop, list[Runtime], Any, str],
) -> None:
    """Two operators reset key-1 a millisecond apart, through B and then A; A's key then answers a
    429. B's reset reaches Redis last (its write was slow): it was made before A's, which already
    cleared all it could clear, so landing late it must not clear the 429 that came after A's reset
    (on one process the two resets come first, in their order, and the 429 after them).

    Found by tests/fleet/test_overlap.py (one run, flaky by timing): B's older reset landed after
    A's reset and A's 429 and cleared the cooldown, which no order of the three could give."""
    loop, (a, b), redis, prefix = fleet
    later = a_429(a, 60)  # selected before anyone resets anything: key-1 is usable

    def operator_then_a_429() -> None:
        a.engine.reset_connection("key-1")
        a.engine.clock.advance(1)  # type: ignore[attr-defined]
        a.engine.record(*later)

    held_until_the_operator_acts(b, a, operator_then_a_429, redis, prefix, lambda: None)
    b.engine.reset_connection("key-1")  # B's operator acts first; its write is held meanwhile
    loop.run_until_complete(caught_up([a, b], redis, prefix))

    shared = json.loads(redis.hget(f"{prefix}c:key-1", "r"))
    now = a.engine.clock.now()
    assert shared["rate_limited_until"] == pytest.approx(now + 60_000)  # A's 429 stands
    for runtime in (a, b):
        assert runtime.engine.connections["key-1"].health.to_record() == shared


@pytest.mark.parametrize("garbage", ["{not json", '{"state": "WEIRD"}', "[1, 2]"])
def test_a_shared_record_no_replica_can_read_is_replaced_by_the_next_transition(
    fleet: tuple[asyncio.AbstractEventLoop, list[Runtime], Any, str], garbage: str
) -> None:
    """Another writer broke key-1's shared record (and moved its version on): the next transition
    takes it for absent and writes a good one, which every replica then shares, rather than fail
    to share that record for ever (the operator's reset included)."""
    loop, (a, b), redis, prefix = fleet
    redis.hset(f"{prefix}c:key-1", mapping={"v": 500, "r": garbage})
    a.engine.record(*a_429(a, 60))
    loop.run_until_complete(caught_up([a, b], redis, prefix))

    shared = json.loads(redis.hget(f"{prefix}c:key-1", "r"))
    assert int(redis.hget(f"{prefix}c:key-1", "v")) > 500
    assert shared["rate_limited_until"] == pytest.approx(a.engine.clock.now() + 60_000)
    for runtime in (a, b):
        assert runtime.engine.connections["key-1"].health.to_record() == shared
