"""The engine as a whole: routing decisions, outcome recording across layers, operator actions,
persistence. Fake clock throughout; acceptance case numbers refer to docs/resilience.md#acceptance-cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.engine import Attempt, ConnectionSpec, Engine, NoTarget, ProviderSpec, Target
from proxy.readmodel import ReadModel
from proxy.resilience.breaker import BreakerState
from proxy.resilience.clock import FakeClock
from proxy.resilience.lockout import MAX_LOCKOUT_ENTRIES, NOT_FOUND_BUDGET, LockoutTableStatus
from proxy.resilience.outcome import Outcome
from proxy.settings import Settings
from proxy.store import MemoryStore, SqliteStore, StateStore


def api(engine: Engine) -> ReadModel:
    """The management API's documents of `engine` (what `GET /api/...` answers)."""
    return ReadModel(engine, engine.bus, "test")


def make_engine(
    clock: FakeClock,
    store: StateStore | None = None,
    *,
    lockout: bool = False,
    settings: Settings | None = None,
) -> Engine:
    providers = [
        ProviderSpec("openai", "apikey", per_model_quota=False),
        ProviderSpec("ollama", "local", per_model_quota=True),
        ProviderSpec("agentrouter", "apikey", per_model_quota=False),
    ]
    connections = [
        ConnectionSpec("oa-1", "openai", priority=1, fingerprint="k1"),
        ConnectionSpec("oa-2", "openai", priority=2, fingerprint="k2"),
        ConnectionSpec("ol-1", "ollama"),
        ConnectionSpec("ar-1", "agentrouter"),
    ]
    engine = Engine(
        providers, connections, clock=clock, store=store, settings=settings or Settings(clock=clock)
    )
    if lockout:
        engine.settings.patch({"modelLockout": {"enabled": True}}, "settings")
    return engine


def pick(engine: Engine, *targets: Target, tried: tuple[str, ...] = ()) -> Attempt:
    decision = engine.select(list(targets), tried=tried)
    assert isinstance(decision, Attempt), decision
    return decision


GPT = Target("openai", "gpt-4o")
LLAMA = Target("ollama", "llama3")


def open_ollama_breaker(engine: Engine, clock: FakeClock) -> None:
    """Two 503s (the local profile opens at 2), each after the connection's 2 s cooldown ended,
    on two models (a 503 may lock its model when model lockout is on)."""
    engine.record(pick(engine, Target("ollama", "warmup-a")), Outcome.http(503))
    clock.advance(2_000)
    engine.record(pick(engine, Target("ollama", "warmup-b")), Outcome.http(503))


def test_picks_lowest_priority_then_least_recently_used() -> None:
    clock = FakeClock()
    engine = make_engine(clock)
    first = pick(engine, GPT)
    assert first.connection.spec.id == "oa-1"
    engine.record(first, Outcome.ok())
    # Same priority would rotate by last use; different priority keeps the preferred one.
    clock.advance(10)
    assert pick(engine, GPT).connection.spec.id == "oa-1"


def test_case_3_open_breaker_is_skipped_and_nothing_is_sent() -> None:
    clock = FakeClock()
    engine = make_engine(clock)
    open_ollama_breaker(engine, clock)
    breaker = engine.providers["ollama"].breaker
    assert breaker.state(clock.now()) is BreakerState.OPEN
    decision = engine.select([LLAMA])
    assert isinstance(decision, NoTarget)
    assert [(s.reason, s.retry_at) for s in decision.skips] == [("circuit_open", clock.now() + 15_000)]
    assert decision.breaker_only
    assert engine.connections["ol-1"].in_flight == 0


def test_case_16_one_connection_cooling_traffic_flows_through_the_other() -> None:
    clock = FakeClock()
    engine = make_engine(clock)
    attempt = pick(engine, GPT)
    assert attempt.connection.spec.id == "oa-1"
    recorded = engine.record(attempt, Outcome.http(503))
    assert recorded.verdict.fallback is True
    # The same request falls back to the other connection...
    retry = pick(engine, GPT, tried=("oa-1",))
    assert retry.connection.spec.id == "oa-2"
    engine.record(retry, Outcome.ok())
    # ...and later requests avoid the cooling one until its cooldown (3 s) ends.
    clock.advance(2_999)
    assert pick(engine, GPT).connection.spec.id == "oa-2"
    clock.advance(1)
    assert pick(engine, GPT).connection.spec.id == "oa-1"


def test_case_18_lockout_locks_one_model_and_other_models_still_serve() -> None:
    clock = FakeClock()
    disabled = make_engine(clock)
    attempt = pick(disabled, GPT)
    disabled.record(attempt, Outcome.http(404, "model not found"))
    assert len(disabled.lockouts) == 0

    engine = make_engine(clock, lockout=True)
    attempt = pick(engine, Target("openai", "gpt-5", "oa-1"))
    engine.record(attempt, Outcome.http(404))
    assert engine.lockouts.is_locked("openai", "oa-1", "gpt-5", clock.now())
    assert api(engine).lockouts_api()[0]["remainingMs"] == 120_000
    # The connection still serves other models, and the locked model goes to the other key.
    assert pick(engine, Target("openai", "gpt-4o", "oa-1")).connection.spec.id == "oa-1"
    assert pick(engine, Target("openai", "gpt-5")).connection.spec.id == "oa-2"
    assert engine.connections["oa-1"].health.status(clock.now()) == "active"


def test_case_21_local_429_locks_the_model_not_the_connection() -> None:
    clock = FakeClock()
    engine = make_engine(clock)
    attempt = pick(engine, LLAMA)
    engine.record(attempt, Outcome.http(429, headers={"Retry-After": "30"}))
    assert engine.connections["ol-1"].health.status(clock.now()) == "active"
    entry = engine.lockouts.get("ollama", "ol-1", "llama3")
    assert entry is not None and entry.remaining_ms(clock.now()) == 30_000
    assert pick(engine, Target("ollama", "qwen")).connection.spec.id == "ol-1"
    assert engine.providers["ollama"].breaker.failure_count == 0


def test_case_22_reenable_one_and_all_lets_traffic_reach_the_model_again() -> None:
    clock = FakeClock()
    engine = make_engine(clock, lockout=True)
    for model in ("a", "b"):
        for conn in ("oa-1", "oa-2"):
            engine.record(pick(engine, Target("openai", model, conn)), Outcome.http(404))
    assert isinstance(engine.select([Target("openai", "a")]), NoTarget)
    assert engine.reenable("openai", "a", "oa-1") == 1
    assert pick(engine, Target("openai", "a")).connection.spec.id == "oa-1"
    assert engine.reenable_all() == 3
    assert api(engine).lockouts_api() == []
    assert pick(engine, Target("openai", "b")).connection.spec.id == "oa-1"


def test_case_24_25_local_rejections_touch_no_layer() -> None:
    clock = FakeClock()
    engine = make_engine(clock, lockout=True)
    for error in ("request queue full", "execution deadline passed"):
        attempt = pick(engine, GPT)
        recorded = engine.record(attempt, Outcome.local(error))
        assert recorded.verdict.fallback is False
    attempt = pick(engine, GPT)
    engine.record(attempt, Outcome.disconnect())
    assert engine.providers["openai"].breaker.failure_count == 0
    assert engine.connections["oa-1"].health.last_error is None
    assert len(engine.lockouts) == 0
    assert engine.connections["oa-1"].in_flight == 0


def test_case_29_agentrouter_quota_403_is_restated_for_client_and_layers() -> None:
    clock = FakeClock()
    engine = make_engine(clock)
    target = Target("agentrouter", "claude")
    recorded = engine.record(pick(engine, target), Outcome.http(403, '{"error": "用户额度不足"}'))
    assert recorded.status == 429
    assert recorded.client_retry_after_ms == 60_000
    # Internally it is an ordinary apikey 429: a 3 s connection cooldown, not 60 s, not terminal.
    health = engine.connections["ar-1"].health
    assert health.status(clock.now()) == "cooling"
    assert health.remaining_ms(clock.now()) == 3_000
    clock.advance(3_000)
    recorded = engine.record(pick(engine, target), Outcome.http(403, "用户额度不足 无权访问"))
    assert recorded.status == 403
    assert recorded.client_retry_after_ms is None


def test_probe_slot_returned_when_attempt_ends_without_verdict() -> None:
    clock = FakeClock()
    engine = make_engine(clock)
    open_ollama_breaker(engine, clock)
    clock.advance(15_000)
    probe = pick(engine, LLAMA)
    assert probe.probe is True
    assert isinstance(engine.select([LLAMA]), NoTarget)  # one probe in flight
    engine.record(probe, Outcome.disconnect())
    second = pick(engine, LLAMA)
    assert second.probe is True
    engine.record(second, Outcome.ok())
    assert engine.providers["ollama"].breaker.state(clock.now()) is BreakerState.CLOSED


def test_no_target_explains_every_skip_and_what_can_be_waited_for() -> None:
    clock = FakeClock()
    engine = make_engine(clock)
    engine.record(pick(engine, GPT), Outcome.http(401, "invalid api key"))
    engine.record(pick(engine, GPT), Outcome.http(429, headers={"retry-after": "2"}))
    decision = engine.select([GPT])
    assert isinstance(decision, NoTarget)
    reasons = {(s.connection_id, s.reason, s.waitable) for s in decision.skips}
    assert reasons == {("oa-1", "expired", False), ("oa-2", "cooling", True)}
    assert decision.earliest_recovery == clock.now() + 2_000
    assert decision.all_waitable is False


def test_combo_order_round_robin_rotates() -> None:
    engine = make_engine(FakeClock())
    targets = [GPT, LLAMA]
    assert engine.order_targets("c", "round-robin", targets) == [GPT, LLAMA]
    assert engine.order_targets("c", "round-robin", targets) == [LLAMA, GPT]
    assert engine.order_targets("c", "priority", targets) == [GPT, LLAMA]


def test_session_pin_keeps_a_session_on_its_connection() -> None:
    clock = FakeClock()
    engine = make_engine(clock)
    engine.settings.patch({"sessionAffinity": {"ttlMs": 60_000}}, "resilience")
    attempt = engine.select([GPT], tried=("oa-1",), session="s1")
    assert isinstance(attempt, Attempt) and attempt.connection.spec.id == "oa-2"
    engine.record(attempt, Outcome.ok(), session="s1")
    again = engine.select([GPT], session="s1")
    assert isinstance(again, Attempt) and again.connection.spec.id == "oa-2" and again.pinned_by_session
    assert pick(engine, GPT).connection.spec.id == "oa-1"  # other sessions are not pinned
    clock.advance(60_001)
    expired = engine.select([GPT], session="s1")
    assert isinstance(expired, Attempt) and expired.connection.spec.id == "oa-1"


def test_operator_actions_emit_events_with_the_cli_command() -> None:
    clock = FakeClock()
    engine = make_engine(clock)
    seen: list[str] = []
    engine.bus.subscribe(lambda e: seen.append(f"{e.layer}:{e.key}") if e.layer == "operator" else None)
    engine.reset_breakers("openai")
    engine.reset_connection()
    engine.set_connection_enabled("oa-2", False)
    engine.reenable("openai", "gpt-4o")
    assert seen == [
        "operator:reset breaker openai",
        "operator:reset connection --all",
        "operator:disable oa-2",
        "operator:reenable openai/gpt-4o",
    ]
    with pytest.raises(KeyError):
        engine.reset_breakers("nope")
    assert pick(engine, GPT).connection.spec.id == "oa-1"
    engine.set_connection_enabled("oa-1", False)
    assert isinstance(engine.select([GPT]), NoTarget)


def test_settings_change_applies_to_existing_breakers_at_once() -> None:
    clock = FakeClock()
    engine = make_engine(clock)
    engine.record(pick(engine, GPT), Outcome.http(500))
    engine.settings.patch({"providerBreaker": {"apikey": {"degradationThreshold": 1}}}, "resilience")
    assert engine.providers["openai"].breaker.state(clock.now()) is BreakerState.DEGRADED


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_case_32_restart_keeps_every_layer(kind: str, tmp_path: Path) -> None:
    clock = FakeClock()
    memory = MemoryStore()

    def open_store() -> StateStore:
        return memory if kind == "memory" else SqliteStore(tmp_path / "state.db")

    store = open_store()
    settings = Settings(clock=clock)
    engine = make_engine(clock, store, lockout=True, settings=settings)
    engine.settings.patch({"providerBreaker": {"local": {"resetTimeoutMs": 20_000}}}, "resilience")
    store.save_settings(engine.settings.document())
    open_ollama_breaker(engine, clock)
    engine.record(pick(engine, GPT), Outcome.http(401, "invalid api key"))  # oa-1 expired
    engine.record(pick(engine, GPT), Outcome.http(503))  # oa-2 cooling 3 s, level 1
    clock.advance(3_000)
    engine.record(pick(engine, Target("openai", "gpt-5", "oa-2")), Outcome.http(404))  # lockout
    engine.record(pick(engine, Target("agentrouter", "x")), Outcome.http(500))  # breaker count 1
    engine.persist()
    store.flush()
    before = (api(engine).breakers_api(), api(engine).connections_api(), api(engine).lockouts_api())
    if kind == "sqlite":
        store.close()

    reopened = open_store()
    stored = reopened.load()
    assert stored.settings is not None
    engine2 = make_engine(clock, reopened, settings=Settings(stored.settings, clock=clock))
    engine2.restore(stored)
    after = (api(engine2).breakers_api(), api(engine2).connections_api(), api(engine2).lockouts_api())
    assert after == before
    assert engine2.settings.breaker_policy("local").reset_timeout_ms == 20_000
    assert engine2.settings.lockout().enabled is True
    assert engine2.providers["ollama"].breaker.state(clock.now()) is BreakerState.OPEN
    assert engine2.connections["oa-1"].health.status(clock.now()) == "expired"
    reopened.close()


def test_a_breaker_that_recovered_lazily_is_persisted_as_it_was_read() -> None:
    # Found by the property test (tests/test_engine_properties.py): OPEN -> HALF_OPEN happens on a
    # read, not on a recorded outcome, so nothing marked the breaker dirty; after a restart it came
    # back OPEN and recovered again at the next read, with another transition time.
    clock = FakeClock()
    store = MemoryStore()
    engine = make_engine(clock, store)
    open_ollama_breaker(engine, clock)
    engine.persist()
    clock.advance(15_000)
    pick(engine, LLAMA)  # this read moves the breaker to HALF_OPEN; the probe then dies with the process
    recovered_at = clock.now()
    clock.advance(5_000)
    engine.persist()
    stored = store.load()
    engine2 = make_engine(clock, store, settings=Settings(stored.settings, clock=clock))
    engine2.restore(stored)
    record = engine2.providers["ollama"].breaker.to_record()
    assert (record["state"], record["last_transition_at"]) == ("HALF_OPEN", recovered_at)


def test_changed_credential_clears_terminal_state_on_restore() -> None:
    clock = FakeClock()
    store = MemoryStore()
    engine = make_engine(clock, store)
    engine.restore(store.load())  # first start: remembers each credential's fingerprint
    engine.record(pick(engine, GPT), Outcome.http(401, "invalid api key"))
    engine.persist()
    stored = store.load()
    providers = [ProviderSpec("openai", "apikey", per_model_quota=False)]
    fresh = Engine(
        providers,
        [
            ConnectionSpec("oa-1", "openai", fingerprint="new-key"),
            ConnectionSpec("oa-2", "openai", fingerprint="k2"),
        ],
        clock=clock,
        store=store,
    )
    fresh.restore(stored)
    assert fresh.connections["oa-1"].health.status(clock.now()) == "active"


# -- client-chosen model names and the lockout table (issue #20 item 6) ------------------------------


def made_up_404s(engine: Engine, names: range, connection: str = "oa-1") -> None:
    """What a client asking for `openai/made-up-<n>` does: one 404 on `connection` per name."""
    for n in names:
        engine.record(pick(engine, Target("openai", f"made-up-{n}", connection)), Outcome.http(404))


def test_made_up_names_keep_within_the_budget_and_evicted_rows_leave_the_store() -> None:
    clock = FakeClock()
    store = MemoryStore()
    engine = make_engine(clock, store, lockout=True)
    engine.record(pick(engine, Target("ollama", "llama3")), Outcome.http(429))  # a real (quota) lock
    made_up_404s(engine, range(NOT_FOUND_BUDGET))
    engine.persist()
    assert len(store.load().lockouts) == NOT_FOUND_BUDGET + 1

    clock.advance(1_000)
    made_up_404s(engine, range(NOT_FOUND_BUDGET, NOT_FOUND_BUDGET + 10))
    engine.persist()
    rows = {(r["connection_id"], r["model"]) for r in store.load().lockouts}
    assert rows == {("ol-1", "llama3")} | {("oa-1", f"made-up-{n}") for n in range(10, NOT_FOUND_BUDGET + 10)}
    assert engine.lockout_table_status() == LockoutTableStatus(
        size=NOT_FOUND_BUDGET + 1,
        capacity=MAX_LOCKOUT_ENTRIES,
        not_found=NOT_FOUND_BUDGET,
        not_found_budget=NOT_FOUND_BUDGET,
        evicted=10,
        refused=0,
    )
    assert api(engine).health_api()["lockoutTable"] == {
        "size": NOT_FOUND_BUDGET + 1,
        "capacity": MAX_LOCKOUT_ENTRIES,
        "full": False,
        "notFound": NOT_FOUND_BUDGET,
        "notFoundBudget": NOT_FOUND_BUDGET,
        "evicted": 10,
        "refused": 0,
    }


def test_an_over_budget_store_is_trimmed_on_restore_and_the_store_follows() -> None:
    clock = FakeClock()
    store = MemoryStore()
    records = [  # a store from before the budget: 120 not_found rows for oa-1
        {
            "provider": "openai",
            "connection_id": "oa-1",
            "model": f"made-up-{n}",
            "reason": "not_found",
            "status": 404,
            "failure_count": 1,
            "locked_at": clock.now() + n,
            "expires_at": clock.now() + n + 120_000,
            "last_cooldown_ms": 120_000.0,
            "last_failure_at": clock.now() + n,
        }
        for n in range(NOT_FOUND_BUDGET + 20)
    ]
    store.save_lockouts(records, [])
    engine = make_engine(clock, store, lockout=True)
    engine.restore(store.load())
    assert len(engine.lockouts) == NOT_FOUND_BUDGET
    engine.persist()
    kept = sorted(r["model"] for r in store.load().lockouts)
    assert kept == sorted(f"made-up-{n}" for n in range(20, NOT_FOUND_BUDGET + 20))


def test_a_target_locked_only_for_not_found_is_not_found_not_waitable() -> None:
    clock = FakeClock()
    engine = make_engine(clock, lockout=True)
    for conn in ("oa-1", "oa-2"):
        engine.record(pick(engine, Target("openai", "made-up", conn)), Outcome.http(404))
    decision = engine.select([Target("openai", "made-up")])
    assert isinstance(decision, NoTarget)
    assert [(s.reason, s.lock_reason) for s in decision.skips] == [
        ("locked", "not_found"),
        ("locked", "not_found"),
    ]
    assert decision.not_found_only is True
    assert decision.all_waitable is False

    # One candidate that will recover by itself (a quota lock on a local model) makes it a 429 again.
    engine.record(pick(engine, Target("ollama", "made-up")), Outcome.http(429))
    both = engine.select([Target("openai", "made-up"), Target("ollama", "made-up")])
    assert isinstance(both, NoTarget)
    assert both.not_found_only is False


# -- a clock stepped back between two runs (found by a lifecycle trial) ---------------------------------
# A laptop that booted with its clock two hours ahead (a dual-boot's RTC in local time, NTP not yet
# synchronised when the user service started) opens a breaker and cools a key; NTP then steps the
# clock back, and the service restarts (a reboot, an upgrade). The stored deadlines are "counted
# from when it opened", which is now two hours in the future: the provider stays OPEN and the key
# cooling for two hours, until an operator resets them by hand. A stored time later than the
# clock can only come from a clock that moved back; restoring it should not outlast what the
# policy could ever have set from now.

STEPPED_BACK_MS = 2 * 3_600_000.0
LONGEST_PLAUSIBLE_MS = 5 * 60_000.0
"""Far above one breaker reset (15 s for a local provider) or one cooldown (3 s for an API key)."""


def test_deadlines_written_by_a_clock_that_was_ahead_do_not_outlast_it(tmp_path: Path) -> None:
    ahead = FakeClock(1_767_225_600_000.0 + STEPPED_BACK_MS)
    store = SqliteStore(tmp_path / "state.db")
    engine = make_engine(ahead, store)
    open_ollama_breaker(engine, ahead)
    engine.record(pick(engine, Target("openai", "gpt-4o", "oa-2")), Outcome.http(503))  # oa-2 cools 3 s
    engine.persist()
    assert store.flush()
    store.close()

    corrected = FakeClock(1_767_225_600_000.0 + 5_000)  # the restart, once NTP stepped the clock back
    store = SqliteStore(tmp_path / "state.db")
    try:
        stored = store.load()
        restarted = make_engine(corrected, store)
        restarted.restore(stored)
        view = ReadModel(restarted, restarted.bus, "test")
        breaker = next(b for b in view.breakers_api() if b["provider"] == "ollama")
        cooling = next(c for c in view.connections_api() if c["id"] == "oa-2")
        assert breaker["retryAfterMs"] <= LONGEST_PLAUSIBLE_MS, (
            f"breaker OPEN for {breaker['retryAfterMs'] / 3_600_000:.2f} h after the clock stepped back"
        )
        assert cooling["cooldownRemainingMs"] <= LONGEST_PLAUSIBLE_MS, (
            f"key cooling for {cooling['cooldownRemainingMs'] / 3_600_000:.2f} h after the clock stepped back"
        )
    finally:
        store.close()


def test_stored_times_are_moved_back_only_when_the_clock_went_back_since() -> None:
    from proxy.engine.persistence import rewound
    from proxy.store import StoredState

    now = 1_767_225_600_000.0
    cooling = {"last_error_at": now - 500.0, "rate_limited_until": now + 3_000.0, "status": "cooling"}
    state = StoredState(connections={"k": cooling}, pins={"s": ("k", now + 60_000.0)})
    assert rewound(state, now) is state  # nothing happened in the future: as written
    later = {"last_error_at": now + 3_600_000.0, "rate_limited_until": now + 3_603_000.0, "status": "cooling"}
    moved = rewound(StoredState(connections={"k": later}, pins={"s": ("k", now + 3_660_000.0)}), now)
    assert moved.connections["k"] == {
        "last_error_at": now,
        "rate_limited_until": now + 3_000.0,
        "status": "cooling",
    }
    assert moved.pins == {"s": ("k", now + 60_000.0)}
