"""The worked examples of docs/resilience.md, step by step, on the real engine and a fake clock.

Each test is one example of the section "Worked examples"; when a number changes here, it changes
there too.
"""

from __future__ import annotations

import math

from proxy.engine import Attempt, ConnectionSpec, Engine, NoTarget, ProviderSpec, Target
from proxy.resilience.breaker import BreakerState
from proxy.resilience.clock import FakeClock
from proxy.resilience.outcome import Outcome
from proxy.settings import Settings

S = 1000.0


def engine_for(clock: FakeClock, provider: ProviderSpec, *connections: ConnectionSpec) -> Engine:
    return Engine([provider], list(connections), clock=clock, settings=Settings(clock=clock))


def pick(engine: Engine, target: Target, tried: tuple[str, ...] = ()) -> Attempt:
    decision = engine.select([target], tried=tried)
    assert isinstance(decision, Attempt), decision
    return decision


def test_a_429_with_retry_after_30_on_key_a() -> None:
    clock = FakeClock()
    t0 = clock.now()
    engine = engine_for(
        clock,
        ProviderSpec("openai", "apikey", per_model_quota=False),
        ConnectionSpec("key-a", "openai", priority=1),
        ConnectionSpec("key-b", "openai", priority=2),
    )
    gpt = Target("openai", "gpt-4o-mini")
    key_a = engine.connections["key-a"].health

    # 1. The request goes to key-a (priority 1), which answers 429 Retry-After: 30.
    first = pick(engine, gpt)
    straggler = pick(engine, gpt)  # another request already in flight on key-a
    assert first.connection.id == straggler.connection.id == "key-a"
    recorded = engine.record(first, Outcome.http(429, "Rate limit reached", {"Retry-After": "30"}))
    assert recorded.verdict.fallback
    assert key_a.status(clock.now()) == "cooling"
    assert key_a.rate_limited_until == t0 + 30 * S and key_a.backoff_level == 0
    assert engine.providers["openai"].breaker.failure_count == 0  # a 429 never moves the breaker

    # 2. The same request falls back to key-b, which serves it.
    second = pick(engine, gpt, tried=("key-a",))
    assert second.connection.id == "key-b"
    engine.record(second, Outcome.ok())

    # 3. A second later the straggler's 429 comes back: the level stays, and only the later deadline of
    #    its own hint (t0 + 31 s) moves the end of the cooldown. Without a hint it would change nothing.
    clock.advance(1 * S)
    engine.record(straggler, Outcome.http(429, "Rate limit reached", {"Retry-After": "30"}))
    assert key_a.backoff_level == 0 and key_a.rate_limited_until == t0 + 31 * S

    # 4. Meanwhile every request goes to key-b.
    assert pick(engine, gpt).connection.id == "key-b"
    engine.record(engine.select([gpt], tried=("key-a",)), Outcome.ok())  # type: ignore[arg-type]

    # 5. At t0 + 5 s key-b answers 429 Retry-After: 10 too: both keys cool, key-b until t0 + 15 s.
    clock.advance(4 * S)
    engine.record(pick(engine, gpt), Outcome.http(429, "Rate limit reached", {"Retry-After": "10"}))
    clock.advance(1 * S)  # t0 + 6 s
    decision = engine.select([gpt])
    assert isinstance(decision, NoTarget)
    assert decision.all_waitable and decision.earliest_waitable == t0 + 15 * S
    # With comboCooldownWait on, the request waits 9 s (+50 ms) and is sent to key-b; with it off,
    # the answer is 429 all_targets_cooling with Retry-After: 9.
    assert math.ceil((decision.earliest_recovery - clock.now()) / S) == 9  # type: ignore[operator]

    # 6. At t0 + 31 s key-a is active again without any timer; its next success clears its last error.
    clock.advance(25 * S)
    assert key_a.status(clock.now()) == "active" and key_a.last_error is not None
    engine.record(pick(engine, gpt), Outcome.ok())
    assert key_a.last_error is None


def test_a_local_server_that_goes_down() -> None:
    clock = FakeClock()
    t0 = clock.now()
    engine = engine_for(
        clock, ProviderSpec("ollama", "local", per_model_quota=True), ConnectionSpec("ollama-1", "ollama")
    )
    llama = Target("ollama", "llama3")
    breaker = engine.providers["ollama"].breaker
    health = engine.connections["ollama-1"].health
    refused = Outcome.network("cannot connect: Connection refused")

    engine.record(pick(engine, llama), refused)
    assert breaker.state(clock.now()) is BreakerState.DEGRADED  # local: DEGRADED at 1 failure
    assert health.rate_limited_until == t0 + 2 * S  # cooldown 2 s, level 1

    clock.advance(2 * S)
    engine.record(pick(engine, llama), refused)
    assert breaker.state(clock.now()) is BreakerState.OPEN  # OPEN at 2, for 15 s
    assert breaker.retry_after_ms(clock.now()) == 15 * S
    assert health.rate_limited_until == t0 + 6 * S  # cooldown 4 s, level 2

    # While OPEN nothing is sent; after 15 s the first read shows HALF_OPEN and one request probes.
    assert isinstance(engine.select([llama]), NoTarget)
    opened_at = t0 + 2 * S
    periods = []
    for _ in range(8):
        clock.set(opened_at + breaker.effective_reset_timeout_ms())
        periods.append(breaker.effective_reset_timeout_ms() / S)
        assert breaker.state(clock.now()) is BreakerState.HALF_OPEN
        decision = engine.select([llama])
        if isinstance(decision, NoTarget):  # the connection's own cooldown may outlast the open period
            clock.set(health.rate_limited_until)  # type: ignore[arg-type]
            decision = engine.select([llama])
        assert isinstance(decision, Attempt) and decision.probe
        engine.record(decision, refused)
        opened_at = clock.now()
    # Open cycles 1 to 8: the first three last the profile's 15 s, then each doubles, up to x16.
    assert periods == [15, 15, 15, 30, 60, 120, 240, 240]
    assert health.backoff_level == 3  # its cooldowns grew 2, 4, 8, 16 s and stay at 16 s (level 3)

    # The server is back: the next probe succeeds and everything is clean again.
    clock.set(opened_at + breaker.effective_reset_timeout_ms())
    engine.record(pick(engine, llama), Outcome.ok())
    assert breaker.state(clock.now()) is BreakerState.CLOSED
    assert breaker.failure_count == 0 and breaker.open_cycle_count == 0
    assert health.status(clock.now()) == "active" and health.backoff_level == 0


def test_a_model_that_does_not_exist_with_model_lockout_on() -> None:
    clock = FakeClock()
    engine = engine_for(
        clock, ProviderSpec("ollama", "local", per_model_quota=True), ConnectionSpec("ollama-1", "ollama")
    )
    engine.settings.patch({"modelLockout": {"enabled": True}}, "settings")
    typo, llama = Target("ollama", "qwen-typo"), Target("ollama", "llama3")
    not_found = Outcome.http(404, '{"error": "model \'qwen-typo\' not found"}')

    engine.record(pick(engine, typo), not_found)
    entry = engine.lockouts.get("ollama", "ollama-1", "qwen-typo")
    assert entry is not None and entry.reason == "not_found" and entry.remaining_ms(clock.now()) == 120 * S
    assert engine.providers["ollama"].breaker.failure_count == 0
    assert engine.connections["ollama-1"].health.status(clock.now()) == "active"
    pick(engine, llama)  # the connection's other models still serve

    decision = engine.select([typo])  # asked again within 2 minutes: not sent, answered 404 at once
    assert isinstance(decision, NoTarget) and decision.not_found_only and not decision.all_waitable

    locks = []
    for _ in range(5):  # asked again as soon as each lock ends: it escalates, up to maxCooldownMs
        clock.set(entry.expires_at)
        engine.record(pick(engine, typo), not_found)
        locks.append(entry.remaining_ms(clock.now()) / S)
    assert locks == [240, 480, 960, 1800, 1800]


def test_a_key_that_expired() -> None:
    clock = FakeClock()
    engine = engine_for(
        clock,
        ProviderSpec("openai", "apikey", per_model_quota=False),
        ConnectionSpec("key-a", "openai", priority=1, fingerprint="old"),
    )
    gpt = Target("openai", "gpt-4o-mini")
    engine.record(pick(engine, gpt), Outcome.http(401, "Incorrect API key provided"))
    health = engine.connections["key-a"].health
    assert health.status(clock.now()) == "expired"
    clock.advance(24 * 3600 * S)
    decision = engine.select([gpt])  # still expired a day later: nothing to wait for
    assert isinstance(decision, NoTarget) and decision.earliest_recovery is None
    engine.reset_connection("key-a")
    assert health.status(clock.now()) == "active"


def test_a_429_from_a_local_server_locks_the_model_not_the_server() -> None:
    clock = FakeClock()
    engine = engine_for(
        clock, ProviderSpec("ollama", "local", per_model_quota=True), ConnectionSpec("ollama-1", "ollama")
    )
    big, small = Target("ollama", "llama3:70b"), Target("ollama", "llama3:8b")
    engine.record(pick(engine, big), Outcome.http(429, "too many requests", {"Retry-After": "20"}))
    entry = engine.lockouts.get("ollama", "ollama-1", "llama3:70b")
    assert entry is not None and entry.reason == "rate_limited" and entry.remaining_ms(clock.now()) == 20 * S
    assert engine.connections["ollama-1"].health.status(clock.now()) == "active"
    pick(engine, small)
