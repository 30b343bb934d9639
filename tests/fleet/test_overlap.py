"""The fleet's overlap promises under random interleavings (hypothesis, a real Redis).

Two replicas' runtimes in this process share the machine's Redis (a key prefix per example) and
one FakeClock. A state machine starts attempts on either replica, answers them in any order, lets
the replicas' background work (the worker that writes transitions, the change feed) run for a
random number of loop turns in between, so each replica often decides on a view the other has
already moved past, and sometimes moves time. Each outcome and operator action is a microsecond
after the step before it, as on a real clock. What must hold, whatever the interleaving:

- the fleet's probe: at most one attempt on the whole fleet holds the probe lease at a time;
- one OPEN per open: the change feed never carries an OPEN for a breaker that was already OPEN;
- one order: once the background work is done, key-1's shared cooldown is what the cooldown
  rules give for SOME serialization of the outcomes recorded since the replicas last caught up
  (`settle`) that keeps each replica's own order; see below;
- the operator's word stands: an operator's reset of key-1 on one replica comes, in that
  serialization, after every outcome the other replica had recorded before it (one decided
  before the reset, still queued when it lands, must not undo it); outcomes after it may come on
  either side (the replicas had not heard of each other);
- one state: once the background work is done, both memory tiers equal what Redis holds.

What "one order" promises, and what it does not. Each replica's worker replays its operations in
the order they were made, each on the shared record as Redis holds it when its write lands, and a
replica only hears of a record after Redis has it: so Redis applies the outcomes in one order, in
which each replica's come in its own order and after everything that replica had heard of. Two
outcomes on replicas that had not heard of each other are concurrent: neither replica could tell
which came first, and Redis may apply them either way round. So the fleet does not promise the
result of the order the steps ran in here: replica 0 answered 429 then 200 and replica 1, not
having heard of either, a 429 afterwards may end with no cooldown (replica 1's 429 landed between
replica 0's two writes, and the success cleared it, as a success clears a cooldown on one
process). What it promises is that the result is one such serialization's: a 429 replayed on a
later deadline never shortens it (anti-herd, later hint wins), nothing is lost or invented. The
model keeps a log per replica since the last `settle` and checks the shared deadline against
every interleaving of the two logs (`reachable`). Where the order is known the check is exact:
`settle` starts new logs from the one state the fleet then holds, and time moves only in
`time_passes`, which settles first.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from proxy.config import load_config
from proxy.engine import Attempt, NoTarget, Target
from proxy.fleet.backend import FleetState
from proxy.resilience.breaker import CircuitBreaker
from proxy.resilience.clock import FakeClock
from proxy.resilience.outcome import Outcome
from proxy.runtime import Runtime
from tests.fleet.conftest import REDIS_URL, require_redis


@dataclass(frozen=True)
class Reset:
    """An operator's reset of key-1 in a replica's log."""

    others_before: int
    """How many outcomes the other replica had recorded (since `settle`) when it was made."""


Event = tuple[float, int | Reset | None]
"""One key-1 step in the model: (when, the 429's retry-after in seconds; None for a success; or an
operator's reset)."""

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
        self.latency = [0, 0]
        """Loop turns each replica's writes take to reach Redis (`latency`)."""
        for replica, runtime in enumerate(self.runtimes):
            self._delay_writes(replica, runtime)
        self.pending: list[tuple[int, Attempt]] = []
        self.expected_until: float | None = None
        """Key-1's cooldown deadline at the last `settle` (None: not cooling), known for sure there."""
        self.logs: tuple[list[Event], list[Event]] = ([], [])
        """Each replica's key-1 outcomes since the last `settle`, in the order it recorded them."""

    def teardown(self) -> None:
        for runtime in self.runtimes:
            self.loop.run_until_complete(runtime.stop())
        self.loop.close()
        keys = list(self.redis.scan_iter(match=f"{self.prefix}*", count=1000))
        if keys:
            self.redis.delete(*keys)

    def _delay_writes(self, replica: int, runtime: Runtime) -> None:
        fleet = runtime.fleet
        assert isinstance(fleet, FleetState)
        write = fleet._write

        async def delayed(*args: Any, **kwargs: Any) -> tuple[int, int, str, str]:
            for _ in range(self.latency[replica]):
                await asyncio.sleep(0)
            return await write(*args, **kwargs)

        fleet._write = delayed  # type: ignore[method-assign]

    def tick(self) -> float:
        """A microsecond on: the time of the next outcome or operator action."""
        self.clock.advance(0.001)
        return self.clock.now()

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
        now = self.tick()
        if attempt.target.provider == "keys" and outcome.status == 429:
            self.logs[replica].append((now, int(outcome.headers["retry-after"])))
        elif attempt.target.provider == "keys":
            self.logs[replica].append((now, None))  # a success clears the cooldown
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
            now = self.tick()
            if provider == "keys":
                outcome = Outcome.http(429, "slow down", {"retry-after": str(hint)})
                self.logs[replica].append((now, hint))
            else:
                outcome = Outcome.http(503)
            self.runtimes[replica].engine.record(attempt, outcome)

    @rule(replica=st.integers(0, 1), turns=st.integers(0, 8))
    def latency(self, replica: int, turns: int) -> None:
        """One replica's writes now take longer (or less long) to reach Redis than the other's."""
        self.latency[replica] = turns

    @rule(replica=st.integers(0, 1), turns=st.integers(0, 3))
    def operator_resets(self, replica: int, turns: int) -> None:
        """The operator resets key-1 through one replica, whatever the other has queued."""
        self.logs[replica].append((self.tick(), Reset(len(self.logs[1 - replica]))))
        self.runtimes[replica].engine.reset_connection("key-1")
        self.turns(turns)

    @staticmethod
    def _expect(until: float | None, event: Event) -> float | None:
        """Key-1's deadline after one step, on one process: a success or a reset clears it; a 429
        starts one from its hint, or, while one runs, moves it only to a later end."""
        now, hint_s = event
        if hint_s is None or isinstance(hint_s, Reset):
            return None
        asked = now + hint_s * 1000
        running = until is not None and until > now
        return max(asked, until) if running and until is not None else asked

    def reachable(self) -> set[float | None]:
        """Key-1's deadline after every interleaving of the two replicas' logs that keeps each
        replica's own order and puts each reset after what the other replica had recorded before
        it: reachable[i][j] is the set after i steps of replica 0 and j of replica 1, built from
        [i-1][j] and [i][j-1]."""
        first, second = self.logs
        reach: list[list[set[float | None]]] = [
            [set() for _ in range(len(second) + 1)] for _ in range(len(first) + 1)
        ]
        reach[0][0] = {self.expected_until}
        for i in range(len(first) + 1):
            for j in range(len(second) + 1):
                if i and _may_follow(first[i - 1], j):
                    reach[i][j] |= {self._expect(u, first[i - 1]) for u in reach[i - 1][j]}
                if j and _may_follow(second[j - 1], i):
                    reach[i][j] |= {self._expect(u, second[j - 1]) for u in reach[i][j - 1]}
        return reach[len(first)][len(second)]

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
            # (A generous bound: the feeds are real Redis reads by the replicas' own tasks, which a
            # loaded machine slows. With 1 s this test failed once beside a benchmark, as a flaky
            # example hypothesis could not reproduce, and passed when run again.)
            give_up = time.monotonic() + 15.0
            while time.monotonic() < give_up:
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
        """Once the background work is done: one order (the shared deadline is a serialization's), and
        one state everywhere."""
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
        now = self.clock.now()

        def running(until: float | None) -> float | None:
            return until if until is not None and until > now else None

        found = running(shared["key-1"]["rate_limited_until"] if shared["key-1"] is not None else None)
        allowed = {running(u) for u in self.reachable()}
        assert found in allowed, (found, allowed, self.expected_until, self.logs)
        # The replicas caught up: from here the order is known again, and it starts at this state.
        self.expected_until = found
        self.logs = ([], [])


def _may_follow(event: Event, others: int) -> bool:
    """Whether `event` may come right after `others` steps of the other replica."""
    step = event[1]
    return not isinstance(step, Reset) or others >= step.others_before


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
