"""The engine's promises under overlap, checked by a stateful property test (hypothesis).

A `RuleBasedStateMachine` drives one engine on a FakeClock through random steps: attempts started
and finished in any order (so they overlap), outcomes of every kind, progress reports of probes,
time passing, operator actions, settings changes, and restarts through the real SQLite store
(some with a changed credential). After every step the invariants below must hold.

Attempts take every slot the pipeline takes: the connection's in-flight count (select), the
breaker's probe slot, the request queue's slot (apikey connections) and the concurrency slot of
a connection with `max_concurrent`. The queue and the semaphore are asyncio objects; with the
settings used here they never wait, so their coroutines are run to completion in place.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from proxy.engine import Attempt, ConnectionSpec, Engine, ProviderSpec, Target
from proxy.resilience.breaker import BreakerState
from proxy.resilience.clock import FakeClock
from proxy.resilience.limiter import Ticket
from proxy.resilience.lockout import NOT_FOUND
from proxy.resilience.outcome import Outcome
from proxy.resilience.semaphore import ConnectionSemaphore
from proxy.settings import Settings
from proxy.store import SqliteStore

MAX_LOCKOUTS = 6  # small, so the cap, pruning and not_found eviction all happen
PROVIDERS = [
    ProviderSpec("ap", "apikey", per_model_quota=False),
    ProviderSpec("lo", "local", per_model_quota=True),
]
CONNECTIONS = ["ap-1", "ap-2", "lo-1"]
MODELS = ["m1", "m2", "m3"]
SESSIONS = [None, "s1", "s2"]

# Weighted by repetition: the outcomes that move the layers most come up most.
OUTCOMES = [
    *[Outcome.ok()] * 4,
    *[Outcome.http(503)] * 4,
    Outcome.http(503),
    Outcome.http(500),
    Outcome.http(408),
    Outcome.http(429),
    Outcome.http(429, "slow down", {"retry-after": "7"}),
    Outcome.http(429, "Quota exceeded for quota metric 'Requests per minute'"),
    Outcome.http(401, "Incorrect API key provided"),
    Outcome.http(402),
    Outcome.http(403, "Your account has been suspended"),
    Outcome.http(403, "insufficient_quota"),
    Outcome.http(403, "Invalid API key"),
    Outcome.http(403, "you do not have access to model m1"),
    Outcome.http(404),
    Outcome.http(404, "not found", {"retry-after": "900"}),
    Outcome.http(400, "model not found"),
    Outcome.http(400, "bad request"),
    Outcome.network(),
    Outcome.stall(),
    Outcome.disconnect(),
    Outcome.local("request queue full"),
]

SETTINGS_PATCHES: list[tuple[dict[str, Any], str]] = [
    ({"modelLockout": {"enabled": True}}, "settings"),
    ({"modelLockout": {"enabled": False}}, "settings"),
    ({"modelLockout": {"baseCooldownMs": 5000, "maxCooldownMs": 60000}}, "settings"),
    ({"modelLockout": {"useExponentialBackoff": False}}, "settings"),
    ({"connectionCooldown": {"apikey": {"baseCooldownMs": 0}}}, "resilience"),
    ({"connectionCooldown": {"apikey": {"baseCooldownMs": 3000}}}, "resilience"),
    ({"connectionCooldown": {"local": {"baseCooldownMs": 1000, "maxBackoffSteps": 1}}}, "resilience"),
    ({"providerBreaker": {"apikey": {"degradationThreshold": 1, "failureThreshold": 2}}}, "resilience"),
    ({"providerBreaker": {"local": {"resetTimeoutMs": 60000}}}, "resilience"),
    ({"sessionAffinity": {"ttlMs": 60000}}, "resilience"),
    ({"sessionAffinity": {"ttlMs": 0}}, "resilience"),
]
# The request queue never makes a request wait here, so its coroutine runs to completion in place.
NEVER_WAIT = {
    "requestQueue": {
        "minTimeBetweenRequestsMs": 0,
        "requestsPerMinute": 1_000_000,
        "concurrentRequests": 10_000,
    }
}

T = TypeVar("T")


def run_now(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that must finish without waiting for anything."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise AssertionError("it waited")


@dataclass(eq=False)
class Open:
    """One attempt in flight and the slots it holds."""

    attempt: Attempt
    session: str | None
    ticket: Ticket | None
    semaphore: ConnectionSemaphore | None


def specs(fingerprints: dict[str, str]) -> list[ConnectionSpec]:
    return [
        ConnectionSpec("ap-1", "ap", priority=1, fingerprint=fingerprints["ap-1"]),
        ConnectionSpec("ap-2", "ap", priority=2, max_concurrent=1, fingerprint=fingerprints["ap-2"]),
        ConnectionSpec("lo-1", "lo", max_concurrent=2, fingerprint=fingerprints["lo-1"]),
    ]


class EngineUnderOverlap(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="engine-props-"))
        self.clock = FakeClock()
        self.fingerprints = {cid: "k0" for cid in CONNECTIONS}
        self.store = SqliteStore(self.dir / "state.db")
        settings_ = Settings(clock=self.clock)
        settings_.patch(NEVER_WAIT, "resilience")
        self.store.save_settings(settings_.document())
        self.engine = self._engine(settings_)
        self.open: list[Open] = []
        # What the current step may do besides the rules (reset by `_step`):
        self.may_end_terminal: set[str] = set()
        """Connections whose terminal state this step may end: operator reset, changed credential."""
        self.may_shorten_cooldown: set[str] = set()
        """Connections whose cooldown this step may end early: those, or a success."""
        self.may_lift_lock: set[tuple[str, str, str]] | None = set()
        """Triples this step may unlock or decay (a success, a re-enable); None: every triple."""
        self.hinted: set[tuple[str, str, str]] = set()
        """Triples that got an outcome with an explicit retry hint in this step."""
        self._remember()

    def _engine(self, settings_: Settings) -> Engine:
        return Engine(
            PROVIDERS,
            specs(self.fingerprints),
            clock=self.clock,
            store=self.store,
            settings=settings_,
            max_lockouts=MAX_LOCKOUTS,
        )

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ steps

    @initialize(lockout=st.booleans())
    def start_with(self, lockout: bool) -> None:
        self._step()
        if lockout:
            self.engine.settings.patch({"modelLockout": {"enabled": True}}, "settings")
            self.store.save_settings(self.engine.settings.document())

    @rule(
        provider=st.sampled_from(["ap", "lo"]),
        model=st.sampled_from([*MODELS, "made-up-1", "made-up-2", "made-up-3"]),
        pinned=st.sampled_from([None, *CONNECTIONS]),
        session=st.sampled_from(SESSIONS),
    )
    def start(self, provider: str, model: str, pinned: str | None, session: str | None) -> None:
        self._step()
        self._start(provider, model, pinned, session)

    @rule(
        provider=st.sampled_from(["ap", "lo"]),
        model=st.sampled_from(MODELS),
        outcomes=st.lists(st.sampled_from(OUTCOMES), min_size=2, max_size=6),
        alike=st.booleans(),
        data=st.data(),
    )
    def burst(
        self, provider: str, model: str, outcomes: list[Outcome], alike: bool, data: st.DataObject
    ) -> None:
        """A herd: requests in flight together, answered in any order, all alike or each its own way."""
        self._step()
        if alike:
            outcomes = [outcomes[0]] * len(outcomes)
        started = [(self._start(provider, model, None, None), outcome) for outcome in outcomes]
        in_flight = [(o, outcome) for o, outcome in started if o is not None]
        for n, (done, outcome) in enumerate(data.draw(st.permutations(in_flight))):
            self._finish(done, outcome)
            if n == 0:
                # The first answer may lock, cool or open; the invariants then judge the herd
                # that follows against the state it left.
                self._remember()

    def _start(self, provider: str, model: str, pinned: str | None, session: str | None) -> Open | None:
        engine = self.engine
        if pinned is not None and engine.connections[pinned].spec.provider != provider:
            pinned = None
        decision = engine.select([Target(provider, model, pinned)], session=session)
        if not isinstance(decision, Attempt):
            return None
        conn = decision.connection
        # What the pipeline does: queue place, wait (a probe's lease holds), slot, dispatch.
        limiter = engine.limiter_for(conn, decision.provider)
        ticket = limiter.admit() if limiter is not None else None
        engine.probe_waiting(decision)
        held = None
        if conn.semaphore is not None and run_now(conn.semaphore.acquire(queue_depth=0, timeout_ms=0)):
            held = conn.semaphore
        if ticket is not None:
            run_now(ticket.dispatch())
        engine.probe_alive(decision)
        opened = Open(decision, session, ticket, held)
        self.open.append(opened)
        return opened

    @precondition(lambda self: self.open)
    @rule(data=st.data())
    def progress(self, data: st.DataObject) -> None:
        """A sign of life: response headers, or one more chunk of a stream."""
        self._step()
        self.engine.probe_alive(data.draw(st.sampled_from(self.open)).attempt)

    @precondition(lambda self: self.open)
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES))
    def finish(self, data: st.DataObject, outcome: Outcome) -> None:
        self._step()
        self._finish(data.draw(st.sampled_from(self.open)), outcome)

    def _finish(self, done: Open, outcome: Outcome) -> None:
        self.open.remove(done)
        attempt = done.attempt
        triple = (attempt.provider.spec.id, attempt.connection.spec.id, attempt.target.model)
        if outcome.is_success:
            self.may_shorten_cooldown.add(attempt.connection.spec.id)  # a success clears a cooldown
            if self.may_lift_lock is not None:  # ...and decays its triple's lock
                self.may_lift_lock.add(triple)
        if outcome.headers:
            self.hinted.add(triple)
        try:
            self.engine.record(attempt, outcome, session=done.session)
        finally:
            if done.semaphore is not None:
                done.semaphore.release()
            if done.ticket is not None:
                done.ticket.release()

    @rule(ms=st.sampled_from([1, 999, 2_000, 3_000, 15_000, 30_000, 120_000, 600_000]))
    def advance(self, ms: int) -> None:
        self._step()
        self.clock.advance(ms)

    @rule(provider=st.sampled_from([None, "ap", "lo"]))
    def reset_breakers(self, provider: str | None) -> None:
        self._step()
        self.engine.reset_breakers(provider)

    @rule(connection=st.sampled_from([None, *CONNECTIONS]))
    def reset_connection(self, connection: str | None) -> None:
        self._step()
        reset = CONNECTIONS if connection is None else [connection]
        self.may_end_terminal.update(reset)
        self.may_shorten_cooldown.update(reset)
        self.engine.reset_connection(connection)

    @rule(connection=st.sampled_from(CONNECTIONS), enabled=st.booleans())
    def enable(self, connection: str, enabled: bool) -> None:
        self._step()
        self.engine.set_connection_enabled(connection, enabled)

    @rule(provider=st.sampled_from(["ap", "lo"]), model=st.sampled_from(MODELS), one=st.booleans())
    def reenable(self, provider: str, model: str, one: bool) -> None:
        self._step()
        self.may_lift_lock = None
        connection = next(c for c in CONNECTIONS if c.startswith(provider)) if one else None
        self.engine.reenable(provider, model, connection)

    @rule()
    def reenable_all(self) -> None:
        self._step()
        self.may_lift_lock = None
        self.engine.reenable_all()

    @rule(patch=st.sampled_from(SETTINGS_PATCHES))
    def change_settings(self, patch: tuple[dict[str, Any], str]) -> None:
        self._step()
        self.engine.settings.patch(*patch)
        self.store.save_settings(self.engine.settings.document())

    @rule(new_key=st.sampled_from([None, *CONNECTIONS]))
    def restart(self, new_key: str | None) -> None:
        """Persist, close, and open the same database in a new engine; attempts die with the process.

        With `new_key`, that connection's credential changed in the config meanwhile."""
        self._step()
        before = self._snapshot()
        self.engine.persist()
        self.store.close()
        self.open.clear()
        if new_key is not None:
            self.fingerprints[new_key] += "+"
            self.may_end_terminal.add(new_key)
            self.may_shorten_cooldown.add(new_key)
        self.store = SqliteStore(self.dir / "state.db")
        stored = self.store.load()
        self.engine = self._engine(Settings(stored.settings, clock=self.clock))
        self.engine.restore(stored)
        after = self._snapshot()
        if new_key is not None:  # a changed credential voids a terminal verdict, and only that
            before["connections"][new_key] = after["connections"][new_key]
        assert after == before

    # ------------------------------------------------------------------ invariants

    @invariant()
    def no_slot_without_an_attempt_holding_it(self) -> None:
        for cid, conn in self.engine.connections.items():
            mine = [o for o in self.open if o.attempt.connection is conn]
            assert conn.in_flight == len(mine), cid
            if conn.semaphore is not None:
                assert conn.semaphore.in_use == sum(o.semaphore is not None for o in mine), cid
                assert conn.semaphore.waiting == 0
            if conn.limiter is not None:
                assert conn.limiter.running == sum(o.ticket is not None for o in mine), cid
                assert conn.limiter.queued == 0

    @invariant()
    def at_most_one_probe_per_provider_and_never_one_without_its_attempt(self) -> None:
        now = self.clock.now()
        for pid, provider in self.engine.providers.items():
            breaker = provider.breaker
            ticket = breaker.probe_ticket
            owners = [
                o
                for o in self.open
                if o.attempt.provider is provider
                and o.attempt.probe
                and o.attempt.probe_ticket == ticket
                and ticket
            ]
            assert len(owners) <= 1, pid
            slot_taken = breaker.state(now) is BreakerState.HALF_OPEN and not breaker.can_execute(now)
            if slot_taken:
                assert owners, f"{pid}: a probe slot is held by no attempt"

    @invariant()
    def terminal_states_end_only_by_operator_or_credential(self) -> None:
        for cid, conn in self.engine.connections.items():
            if self.terminal[cid] is not None and cid not in self.may_end_terminal:
                assert conn.health.terminal is not None, cid

    @invariant()
    def cooldown_deadlines_never_move_earlier(self) -> None:
        for cid, conn in self.engine.connections.items():
            health = conn.health
            was = self.cooling[cid]
            if was is None or cid in self.may_shorten_cooldown or health.terminal is not None:
                continue
            assert health.rate_limited_until is not None and health.rate_limited_until >= was, cid

    @invariant()
    def lockouts_stay_within_the_cap_and_keep_every_active_lock(self) -> None:
        table = self.engine.lockouts
        assert len(table) <= MAX_LOCKOUTS
        now = self.clock.now()
        for key, (expires_at, reason, _) in self.locked.items():
            if now >= expires_at or reason == NOT_FOUND:
                continue  # expired by time, or a not_found lock (those may be evicted)
            if self.may_lift_lock is None or key in self.may_lift_lock:
                continue
            entry = table.get(*key)
            assert entry is not None, f"active lock {key} dropped"
            assert entry.expires_at >= expires_at, f"lock {key} cut short"

    @invariant()
    def a_locked_triple_only_hears_from_requests_in_flight(self) -> None:
        """Routing sends nothing to a locked triple, so every failure it records while locked is
        from a request in flight when it locked: it neither counts nor moves the lock, unless it
        carries a longer explicit hint (anti-thundering-herd)."""
        now = self.clock.now()
        for key, (expires_at, _, count) in self.locked.items():
            entry = self.engine.lockouts.get(*key)
            if now >= expires_at or entry is None:
                continue
            if self.may_lift_lock is None or key in self.may_lift_lock:
                continue
            assert entry.failure_count == count, f"{key}: a herd failure counted"
            if key not in self.hinted:
                assert entry.expires_at == expires_at, f"{key}: a herd failure moved the lock"

    # ------------------------------------------------------------------ helpers

    def _step(self) -> None:
        """Every step starts here: remember the state the invariants compare the step's result to,
        and persist, as the server does every 250 ms (so a change that is never marked dirty
        leaves the database behind, and the next restart shows it)."""
        self.may_end_terminal = set()
        self.may_shorten_cooldown = set()
        self.may_lift_lock = set()
        self.hinted = set()
        self._remember()
        self.engine.persist()

    def _remember(self) -> None:
        now = self.clock.now()
        conns = self.engine.connections
        self.terminal = {cid: c.health.terminal for cid, c in conns.items()}
        self.cooling = {
            cid: c.health.rate_limited_until
            for cid, c in conns.items()
            if c.health.rate_limited_until is not None and c.health.rate_limited_until > now
        } | {cid: None for cid, c in conns.items() if not c.health.remaining_ms(now)}
        self.locked = {
            (e.provider, e.connection_id, e.model): (e.expires_at, e.reason, e.failure_count)
            for e in self.engine.lockouts.active(now)
        }

    def _snapshot(self) -> dict[str, Any]:
        """Everything persisted, read through the engine as the API reads it (lazy recovery applied)."""
        engine = self.engine
        now = self.clock.now()
        for provider in engine.providers.values():
            provider.breaker.state(now)
        return {
            "breakers": {p: r.breaker.to_record() for p, r in engine.providers.items()},
            "connections": {c: r.health.to_record() for c, r in engine.connections.items()},
            "lockouts": sorted((e.to_record() for e in engine.lockouts.active(now)), key=repr),
            "lockout_keys": sorted(engine.lockouts.keys()),
            "pins": {s: p for s, p in engine.pins.items() if p[1] > now},
            "settings": engine.settings.document(),
        }


EngineUnderOverlap.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_engine_under_overlap = EngineUnderOverlap.TestCase
