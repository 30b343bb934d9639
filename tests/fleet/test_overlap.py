"""The fleet's overlap promises under random interleavings (hypothesis, a real Redis).

Two replicas' runtimes in this process share the machine's Redis (a key prefix per example) and
one FakeClock. A state machine starts attempts on either replica, answers them in any order, lets
the replicas' background work (the worker that writes transitions, the change feed) run for a
random number of loop turns in between, so each replica often decides on a view the other has
already moved past, and sometimes moves time. What must hold, whatever the interleaving:

- the fleet's probe: at most one attempt on the whole fleet holds the probe lease at a time;
- one OPEN per open: the change feed never carries an OPEN for a breaker that was already OPEN;
- later deadline wins: the shared cooldown deadline is the latest one any 429 hint asked for
  (no replica shortens what another set);
- one state: once the background work is done, both memory tiers equal what Redis holds.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from proxy.config import load_config
from proxy.engine import Attempt, NoTarget, Target
from proxy.resilience.breaker import CircuitBreaker
from proxy.resilience.clock import FakeClock
from proxy.resilience.outcome import Outcome
from proxy.runtime import Runtime
from tests.fleet.conftest import REDIS_URL, require_redis

CONFIG = """[server]
port = {port}

[state]
backend = "{url}"
key_prefix = "{prefix}"

[providers.keys]
class = "apikey"
base_url = "http://127.0.0.1:9/v1"

[[providers.keys.connections]]
id = "key-1"
api_key = "sk-overlap-key-1-aaaaaaaa"

[providers.flaky]
class = "apikey"
base_url = "http://127.0.0.1:9/v1"

[[providers.flaky.connections]]
id = "flaky-1"
api_key = "sk-overlap-flaky-1-bbbbbbbb"
disable_cooling = true
"""

OUTCOMES = {
    "keys": [Outcome.http(429, "slow down", {"retry-after": str(s)}) for s in (5, 20, 60, 300)]
    + [Outcome.ok()],
    "flaky": [Outcome.http(503)] * 3 + [Outcome.ok()],
}


class FleetOverlap(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.redis = require_redis()
        self.prefix = f"omniroute-test:{uuid.uuid4().hex[:10]}:"
        self.clock = FakeClock()
        self.loop = asyncio.new_event_loop()
        self.tmp = Path(f"/tmp/{self.prefix.replace(':', '-')}")
        self.tmp.mkdir(exist_ok=True)
        self.runtimes: list[Runtime] = []
        for port in (1, 2):  # not served: the port only tells the two replicas' ids apart
            path = self.tmp / f"r{port}.toml"
            path.write_text(CONFIG.format(port=port, url=REDIS_URL, prefix=self.prefix))
            config = load_config(path, {}, explicit=True)
            runtime = Runtime.open(config, None, clock=self.clock, env={})
            self.runtimes.append(runtime)
            self.loop.run_until_complete(runtime.start())
        self.pending: list[tuple[int, Attempt]] = []
        self.expected_until: float | None = None
        """The cooldown deadline of key-1 the hints ask for (the latest still running)."""

    def teardown(self) -> None:
        for runtime in self.runtimes:
            self.loop.run_until_complete(runtime.stop())
        self.loop.close()
        keys = list(self.redis.scan_iter(match=f"{self.prefix}*", count=1000))
        if keys:
            self.redis.delete(*keys)

    def turns(self, n: int) -> None:
        for _ in range(n):
            self.loop.run_until_complete(asyncio.sleep(0))

    # -- steps --------------------------------------------------------------------------------------

    @rule(replica=st.integers(0, 1), provider=st.sampled_from(["keys", "flaky"]), turns=st.integers(0, 3))
    def send(self, replica: int, provider: str, turns: int) -> None:
        runtime = self.runtimes[replica]
        model = "m1"
        decision = runtime.engine.select([Target(provider, model)])
        if isinstance(decision, NoTarget):
            return
        fleet = runtime.fleet
        assert fleet is not None
        if decision.probe and not self.loop.run_until_complete(fleet.take_probe(decision)):
            return  # withdrawn: another replica holds the fleet's probe
        self.pending.append((replica, decision))
        self.turns(turns)

    @precondition(lambda self: self.pending)
    @rule(data=st.data(), turns=st.integers(0, 3))
    def answer(self, data: st.DataObject, turns: int) -> None:
        index = data.draw(st.integers(0, len(self.pending) - 1))
        replica, attempt = self.pending.pop(index)
        outcome = data.draw(st.sampled_from(OUTCOMES[attempt.target.provider]))
        now = self.clock.now()
        if attempt.target.provider == "keys" and outcome.status == 429:
            self._expect(now, int(outcome.headers["retry-after"]))
        elif attempt.target.provider == "keys":
            self.expected_until = None  # a success clears the cooldown
        self.runtimes[replica].engine.record(attempt, outcome)
        self.turns(turns)

    @rule(
        provider=st.sampled_from(["keys", "flaky"]),
        answers=st.lists(st.sampled_from([5, 20, 60, 300]), min_size=2, max_size=5),
        first=st.integers(0, 1),
    )
    def herd(self, provider: str, answers: list[int], first: int) -> None:
        """Requests on both replicas at once, all answered before either replica hears of the others:
        429s with these hints (keys), or 503s (flaky)."""
        started: list[tuple[int, Attempt, int]] = []
        for i, hint in enumerate(answers):
            replica = (first + i) % 2
            decision = self.runtimes[replica].engine.select([Target(provider, "m1")])
            if isinstance(decision, Attempt) and not decision.probe:
                started.append((replica, decision, hint))
        for replica, attempt, hint in started:
            if provider == "keys":
                outcome = Outcome.http(429, "slow down", {"retry-after": str(hint)})
                self._expect(now=self.clock.now(), hint_s=hint)
            else:
                outcome = Outcome.http(503)
            self.runtimes[replica].engine.record(attempt, outcome)

    def _expect(self, now: float, hint_s: int) -> None:
        asked = now + hint_s * 1000
        running = self.expected_until is not None and self.expected_until > now
        self.expected_until = max(asked, self.expected_until or 0) if running else asked

    @rule(seconds=st.sampled_from([1, 10, 40]))
    def time_passes(self, seconds: int) -> None:
        self.settle()
        self.clock.advance(seconds * 1000)

    @rule()
    def settle(self) -> None:
        """Let every replica's worker finish and every feed catch up with the stream."""

        async def done() -> None:
            for runtime in self.runtimes:
                fleet = runtime.fleet
                assert fleet is not None and fleet._jobs is not None
                await fleet._jobs.join()
            last = self.redis.xrevrange(f"{self.prefix}feed", count=1)
            target = last[0][0] if last else "0-0"
            for _ in range(500):
                if all(rt.fleet is not None and rt.fleet._feed_from == target for rt in self.runtimes):
                    return
                await asyncio.sleep(0.002)
            raise AssertionError("the feeds did not catch up")

        self.loop.run_until_complete(done())
        self.check_one_state()

    # -- invariants ---------------------------------------------------------------------------------

    @invariant()
    def one_probe_fleet_wide(self) -> None:
        probes = [a for _, a in self.pending if a.probe]
        assert len(probes) <= 1, probes

    @invariant()
    def one_open_per_open(self) -> None:
        entries = self.redis.xrange(f"{self.prefix}feed")
        opened_from = [
            e["from"]
            for _, fields in entries
            for e in json.loads(fields.get("e", "[]"))
            if e["layer"] == "breaker" and e["to"] == "OPEN"
        ]
        assert "OPEN" not in opened_from

    def check_one_state(self) -> None:
        """Once the background work is done: later deadline wins, and one state everywhere."""
        shared: dict[str, Any] = {}
        for kind, ident in (("c", "key-1"), ("b", "flaky")):
            text = self.redis.hget(f"{self.prefix}{kind}:{ident}", "r")
            shared[ident] = json.loads(text) if text else None
        for runtime in self.runtimes:
            health = runtime.engine.connections["key-1"].health.to_record()
            if shared["key-1"] is not None:
                assert health == shared["key-1"]
            if shared["flaky"] is not None:
                # Lazy recovery (OPEN read after its timeout is HALF_OPEN) is each replica's own, never
                # written: both sides are compared as a read at this instant would show them.
                runtime_breaker = runtime.engine.providers["flaky"].breaker
                assert self._as_read(runtime_breaker.to_record()) == self._as_read(shared["flaky"])
        if self.expected_until is not None and self.expected_until > self.clock.now():
            assert shared["key-1"] is not None
            assert shared["key-1"]["rate_limited_until"] == self.expected_until


def _as_read_impl(self: FleetOverlap, record: dict[str, Any]) -> dict[str, Any]:
    policy = self.runtimes[0].settings.breaker_policy("apikey")
    breaker = CircuitBreaker.from_record(record, policy)
    breaker.state(self.clock.now())
    shown = breaker.to_record()
    shown.pop("last_transition_at")
    return shown


FleetOverlap._as_read = _as_read_impl  # type: ignore[attr-defined]

FleetOverlap.TestCase.settings = settings(
    max_examples=20,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestFleetOverlap = FleetOverlap.TestCase


def test_the_redis_here_answers() -> None:
    """The property test needs the machine's Redis; say how to start one when it is not there."""
    assert isinstance(require_redis(), redis.Redis)
