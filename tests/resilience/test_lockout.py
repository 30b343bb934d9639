from __future__ import annotations

import pytest

from proxy.readmodel import lockout_of
from proxy.resilience.clock import FakeClock
from proxy.resilience.events import Event
from proxy.resilience.lockout import (
    ESCALATION_GRACE_MS,
    MAX_LOCKOUT_ENTRIES,
    NOT_FOUND_BUDGET,
    LockoutEntry,
    LockoutSettings,
    LockoutTable,
    LockoutTableStatus,
)

ENABLED = LockoutSettings(enabled=True)
START = 1_767_225_600_000.0  # FakeClock's default start, 2026-01-01T00:00:00Z


def make_table(**kwargs: int) -> tuple[LockoutTable, list[Event]]:
    events: list[Event] = []
    return LockoutTable(emit=events.append, **kwargs), events


def make_dropping_table(**kwargs: int) -> tuple[LockoutTable, list[Event], list[tuple[str, str, str]]]:
    """A table that also records what it reports through `on_drop`."""
    events: list[Event] = []
    dropped: list[tuple[str, str, str]] = []
    return LockoutTable(emit=events.append, on_drop=dropped.append, **kwargs), events, dropped


def fail(
    table: LockoutTable,
    now: float,
    settings: LockoutSettings = ENABLED,
    *,
    provider: str = "ollama",
    connection: str = "c1",
    model: str = "llama3:8b",
    status: int | None = 404,
    reason: str = "not_found",
    hint_ms: float | None = None,
) -> LockoutEntry | None:
    return table.record_failure(
        provider, connection, model, now, settings, status=status, reason=reason, hint_ms=hint_ms
    )


def models(table: LockoutTable) -> list[str]:
    """The models of every entry held, sorted."""
    keys = table.keys()
    return sorted(model for _, _, model in keys)


def fail_real(
    table: LockoutTable, now: float, *, connection: str = "c1", model: str, hint_ms: float | None = None
) -> LockoutEntry | None:
    """A lock for a real reason (a per-model quota): never evicted, unlike a not_found one."""
    return fail(
        table, now, connection=connection, model=model, status=429, reason="rate_limited", hint_ms=hint_ms
    )


# -- settings ------------------------------------------------------------------------------------


def test_settings_counts_only_listed_statuses_when_enabled() -> None:
    assert LockoutSettings().counts(404) is False  # off by default
    assert ENABLED.counts(404) is True
    assert ENABLED.counts(429) is True
    assert ENABLED.counts(500) is False
    assert ENABLED.counts(400) is False


def test_settings_empty_error_codes_means_the_default_list() -> None:
    settings = LockoutSettings(enabled=True, error_codes=())
    assert [s for s in (403, 404, 429, 500, 502, 503, 504) if settings.counts(s)] == [
        403,
        404,
        429,
        502,
        503,
        504,
    ]


def test_settings_custom_error_codes_replace_the_default_list() -> None:
    settings = LockoutSettings(enabled=True, error_codes=(500, 404))
    assert settings.counts(500) is True
    assert settings.counts(404) is True
    assert settings.counts(429) is False


def test_listed_but_disabled_lockout_counts_nothing() -> None:
    settings = LockoutSettings(enabled=False, error_codes=(404, 503))
    assert settings.counts(404) is False
    assert settings.counts(503) is False


# -- acceptance cases ----------------------------------------------------------------------------


def test_case_18_disabled_locks_nothing_enabled_locks_the_triple_for_120s() -> None:
    clock = FakeClock()
    table, events = make_table()

    disabled = LockoutSettings()
    if disabled.counts(404):  # what the caller does: it only records outcomes that count
        fail(table, clock.now(), disabled)
    assert len(table) == 0
    assert table.is_locked("ollama", "c1", "llama3:8b", clock.now()) is False
    assert events == []

    assert ENABLED.counts(404) is True
    entry = fail(table, clock.now())
    assert entry is not None
    assert entry.expires_at - entry.locked_at == 120_000
    assert table.is_locked("ollama", "c1", "llama3:8b", clock.now()) is True
    # Other models on the same connection, and the same model elsewhere, still serve.
    assert table.is_locked("ollama", "c1", "qwen2.5:7b", clock.now()) is False
    assert table.is_locked("ollama", "c2", "llama3:8b", clock.now()) is False
    assert table.is_locked("lmstudio", "c1", "llama3:8b", clock.now()) is False

    clock.advance(119_999)
    assert table.is_locked("ollama", "c1", "llama3:8b", clock.now()) is True
    clock.advance(1)
    assert table.is_locked("ollama", "c1", "llama3:8b", clock.now()) is False  # lazy expiry, no timer
    assert events == [
        Event(
            ts=START,
            layer="lockout",
            key="ollama:c1:llama3:8b",
            from_="unlocked",
            to="locked",
            reason="404 not_found, 120000ms",
        )
    ]


def test_case_19_escalation_120_240_480_capped_at_max_cooldown() -> None:
    clock = FakeClock()
    table, _ = make_table()
    cooldowns = []
    counts = []
    for _ in range(7):
        entry = fail(table, clock.now())
        assert entry is not None
        cooldowns.append(entry.expires_at - clock.now())
        counts.append(entry.failure_count)
        clock.advance(entry.last_cooldown_ms)  # fail again right when the lock ends
    assert cooldowns == [120_000, 240_000, 480_000, 960_000, 1_800_000, 1_800_000, 1_800_000]
    assert counts == [1, 2, 3, 4, 5, 6, 7]


def test_case_19_without_exponential_backoff_every_lock_is_base() -> None:
    clock = FakeClock()
    table, _ = make_table()
    flat = LockoutSettings(enabled=True, use_exponential_backoff=False)
    cooldowns = []
    for _ in range(4):
        entry = fail(table, clock.now(), flat)
        assert entry is not None
        cooldowns.append(entry.last_cooldown_ms)
        clock.advance(entry.last_cooldown_ms)
    assert cooldowns == [120_000, 120_000, 120_000, 120_000]
    entry = table.get("ollama", "c1", "llama3:8b")
    assert entry is not None
    assert entry.failure_count == 4


def test_case_19_failure_outside_escalation_window_restarts_at_count_1() -> None:
    clock = FakeClock()
    table, _ = make_table()
    fail(table, clock.now())
    # The window is the last cooldown plus 30 minutes, measured from the last failure.
    clock.advance(120_000 + ESCALATION_GRACE_MS + 1)
    entry = fail(table, clock.now())
    assert entry is not None
    assert entry.failure_count == 1
    assert entry.last_cooldown_ms == 120_000


def test_case_19_failure_at_the_window_edge_still_escalates() -> None:
    clock = FakeClock()
    table, _ = make_table()
    fail(table, clock.now())
    clock.advance(120_000 + ESCALATION_GRACE_MS)
    entry = fail(table, clock.now())
    assert entry is not None
    assert entry.failure_count == 2
    assert entry.last_cooldown_ms == 240_000


def test_max_backoff_steps_caps_the_exponent() -> None:
    clock = FakeClock()
    table, _ = make_table()
    settings = LockoutSettings(enabled=True, max_backoff_steps=2, max_cooldown_ms=3_600_000)
    cooldowns = []
    for _ in range(5):
        entry = fail(table, clock.now(), settings)
        assert entry is not None
        cooldowns.append(entry.last_cooldown_ms)
        clock.advance(entry.last_cooldown_ms)
    assert cooldowns == [120_000, 240_000, 480_000, 480_000, 480_000]


def test_hint_replaces_the_computed_cooldown_and_is_capped_at_max() -> None:
    clock = FakeClock()
    table, events = make_table()
    entry = fail(table, clock.now(), model="a", status=429, reason="rate_limited", hint_ms=20_000)
    assert entry is not None
    assert entry.expires_at == START + 20_000
    entry = fail(table, clock.now(), model="b", status=429, reason="rate_limited", hint_ms=5 * 3_600_000)
    assert entry is not None
    assert entry.expires_at == START + 1_800_000
    assert [e.reason for e in events] == ["429 rate_limited, 20000ms", "429 rate_limited, 1800000ms"]


def test_an_existing_longer_lock_is_kept() -> None:
    clock = FakeClock()
    table, events = make_table()
    fail(table, clock.now(), status=429, reason="quota", hint_ms=1_800_000)
    clock.advance(60_000)
    entry = fail(table, clock.now(), status=429, reason="rate_limited", hint_ms=5_000)
    assert entry is not None
    assert entry.failure_count == 2
    assert entry.expires_at == START + 1_800_000  # a short hint does not cut the long lock
    assert entry.locked_at == START  # still the same lock
    assert entry.reason == "rate_limited"
    assert (events[-1].from_, events[-1].to) == ("locked", "locked")


def test_case_19_ten_concurrent_failures_give_one_base_length_lock() -> None:
    # Anti-thundering-herd (issue #9, item 4): the ten requests were all in flight when the first
    # answer locked the triple, so the other nine say nothing new about the model.
    clock = FakeClock()
    table, events = make_table()
    sent = clock.now()
    clock.advance(800)
    for _ in range(10):
        entry = table.record_failure(
            "ollama", "c1", "m", clock.now(), ENABLED, status=404, reason="not_found", started_at=sent
        )
        clock.advance(5)
    assert entry is not None
    assert (entry.failure_count, entry.last_cooldown_ms) == (1, 120_000)
    assert entry.expires_at == START + 800 + 120_000
    assert len(events) == 1


def test_a_herd_failure_with_a_longer_hint_extends_the_lock_without_counting() -> None:
    clock = FakeClock()
    table, events = make_table()
    sent = clock.now()
    table.record_failure(
        "p", "c", "m", clock.now(), ENABLED, status=429, reason="rate_limited", started_at=sent
    )
    clock.advance(1_000)
    for hint, until in ((60_000, START + 120_000), (300_000, START + 1_000 + 300_000)):
        entry = table.record_failure(
            "p",
            "c",
            "m",
            clock.now(),
            ENABLED,
            status=429,
            reason="rate_limited",
            hint_ms=hint,
            started_at=sent,
        )
        assert entry is not None
        assert (entry.failure_count, entry.expires_at, entry.locked_at) == (1, until, START)
    assert [(e.from_, e.to) for e in events] == [("unlocked", "locked"), ("locked", "locked")]
    assert events[-1].reason == "429 rate_limited, extended by retry hint to 300000ms"


def test_a_failure_of_a_request_sent_after_the_lock_still_escalates() -> None:
    clock = FakeClock()
    table, _ = make_table()
    fail(table, clock.now())
    clock.advance(1_000)
    entry = table.record_failure(
        "ollama",
        "c1",
        "llama3:8b",
        clock.now(),
        ENABLED,
        status=404,
        reason="not_found",
        started_at=clock.now(),
    )
    assert entry is not None
    assert (entry.failure_count, entry.expires_at) == (2, START + 1_000 + 240_000)


def test_locked_at_restarts_when_the_previous_lock_had_expired() -> None:
    clock = FakeClock()
    table, events = make_table()
    fail(table, clock.now())
    clock.advance(150_000)
    entry = fail(table, clock.now())
    assert entry is not None
    assert entry.locked_at == START + 150_000
    assert entry.expires_at == START + 150_000 + 240_000
    assert [(e.from_, e.to) for e in events] == [("unlocked", "locked"), ("unlocked", "locked")]


def test_network_error_lock_reason_has_no_status() -> None:
    clock = FakeClock()
    table, events = make_table()
    fail(table, clock.now(), status=None, reason="network_error")
    assert events[0].reason == "network_error, 120000ms"


def test_case_20_success_decay_4_2_1_0_then_deleted() -> None:
    clock = FakeClock()
    table, events = make_table()
    for _ in range(4):
        fail(table, clock.now())
    entry = table.get("ollama", "c1", "llama3:8b")
    assert entry is not None
    assert entry.failure_count == 4
    assert table.is_locked("ollama", "c1", "llama3:8b", clock.now()) is True

    counts = []
    for _ in range(2):
        table.record_success("ollama", "c1", "llama3:8b", clock.now())
        counts.append(entry.failure_count)
    assert counts == [2, 1]
    assert len(table) == 1
    table.record_success("ollama", "c1", "llama3:8b", clock.now())
    assert table.get("ollama", "c1", "llama3:8b") is None
    assert len(table) == 0
    # Re-enabled even though its timer (960 s) has not run out.
    assert table.is_locked("ollama", "c1", "llama3:8b", clock.now()) is False
    assert table.for_connection("ollama", "c1", clock.now()) == []
    assert events[-1] == Event(
        ts=START,
        layer="lockout",
        key="ollama:c1:llama3:8b",
        from_="locked",
        to="unlocked",
        reason="success_decay",
    )


def test_success_on_an_unknown_triple_changes_nothing() -> None:
    clock = FakeClock()
    table, events = make_table()
    fail(table, clock.now(), model="a")
    table.record_success("ollama", "c1", "b", clock.now())
    assert len(table) == 1
    assert len(events) == 1


def test_case_22_reenable_one_triple() -> None:
    clock = FakeClock()
    table, events = make_table()
    fail(table, clock.now(), connection="c1", model="m")
    fail(table, clock.now(), connection="c2", model="m")
    assert table.reenable("ollama", "m", clock.now(), connection_id="c1") == 1
    assert table.is_locked("ollama", "c1", "m", clock.now()) is False
    assert table.is_locked("ollama", "c2", "m", clock.now()) is True
    assert table.reenable("ollama", "m", clock.now(), connection_id="c1") == 0  # already gone
    assert events[-1] == Event(
        ts=START, layer="lockout", key="ollama:c1:m", from_="locked", to="unlocked", reason="operator"
    )


def test_case_22_reenable_one_model_across_connections() -> None:
    clock = FakeClock()
    table, events = make_table()
    fail(table, clock.now(), connection="c1", model="m")
    fail(table, clock.now(), connection="c2", model="m")
    fail(table, clock.now(), connection="c1", model="other")
    fail(table, clock.now(), provider="lmstudio", connection="c1", model="m")
    assert table.reenable("ollama", "m", clock.now()) == 2
    assert table.is_locked("ollama", "c1", "m", clock.now()) is False
    assert table.is_locked("ollama", "c2", "m", clock.now()) is False
    assert table.is_locked("ollama", "c1", "other", clock.now()) is True
    assert table.is_locked("lmstudio", "c1", "m", clock.now()) is True
    assert sorted(e.key for e in events if e.reason == "operator") == ["ollama:c1:m", "ollama:c2:m"]


def test_case_22_reenable_all_empties_the_table() -> None:
    clock = FakeClock()
    table, events = make_table()
    fail(table, clock.now(), connection="c1", model="m")
    fail(table, clock.now(), connection="c2", model="n")
    fail(table, clock.now(), provider="lmstudio", connection="c1", model="m")
    assert sorted(table.keys()) == [("lmstudio", "c1", "m"), ("ollama", "c1", "m"), ("ollama", "c2", "n")]
    assert table.reenable_all(clock.now()) == 3
    assert table.keys() == []
    assert len(table) == 0
    assert table.active(clock.now()) == []
    assert table.is_locked("ollama", "c1", "m", clock.now()) is False
    assert table.is_locked("lmstudio", "c1", "m", clock.now()) is False
    assert table.for_connection("ollama", "c1", clock.now()) == []
    assert [e.reason for e in events[3:]] == ["operator", "operator", "operator"]
    # Nothing is left behind in the indexes: the same triples lock again from count 1.
    entry = fail(table, clock.now(), connection="c1", model="m")
    assert entry is not None
    assert entry.failure_count == 1


# -- the cap -------------------------------------------------------------------------------------


def test_table_holds_10000_entries_and_refuses_a_new_lock_when_all_are_active() -> None:
    clock = FakeClock()
    table, events = make_table()
    for i in range(10_000):
        assert fail_real(table, clock.now(), model=f"m{i}") is not None
    assert len(table) == 10_000
    assert fail(table, clock.now(), model="one-too-many") is None
    assert len(table) == 10_000
    assert table.is_locked("ollama", "c1", "one-too-many", clock.now()) is False
    assert events[-1] == Event(
        ts=START,
        layer="lockout",
        key="ollama:c1:one-too-many",
        from_="unlocked",
        to="unlocked",
        reason="lockout_table_full",
    )
    assert fail_real(table, clock.now(), model="real-too-many") is None
    assert table.status().refused == 2
    # An existing triple still escalates in a full table.
    entry = fail_real(table, clock.now(), model="m0")
    assert entry is not None
    assert entry.failure_count == 2


def test_full_table_prunes_expired_entries_first_and_never_active_ones() -> None:
    clock = FakeClock()
    table, _ = make_table(max_entries=3)
    fail_real(table, clock.now(), model="short", hint_ms=10_000)
    fail_real(table, clock.now(), model="long-1")
    fail_real(table, clock.now(), model="long-2")
    assert fail_real(table, clock.now(), model="new") is None
    clock.advance(10_000)  # "short" has expired; the others are still locked
    assert fail_real(table, clock.now(), model="new") is not None
    assert table.get("ollama", "c1", "short") is None
    assert [e.model for e in table.active(clock.now())] == ["new", "long-1", "long-2"]


def test_full_table_can_prune_a_short_lock_added_after_the_last_scan() -> None:
    clock = FakeClock()
    table, _ = make_table(max_entries=3)
    fail_real(table, clock.now(), model="a")
    fail_real(table, clock.now(), model="b")
    fail_real(table, clock.now(), model="c")
    assert fail_real(table, clock.now(), model="d") is None  # a scan that finds nothing to prune
    table.reenable("ollama", "c", clock.now())
    fail_real(table, clock.now(), model="short", hint_ms=1_000)
    clock.advance(1_000)
    assert fail_real(table, clock.now(), model="d") is not None
    assert table.get("ollama", "c1", "short") is None
    assert len(table) == 3


def test_max_entries_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        LockoutTable(max_entries=0)
    with pytest.raises(ValueError, match="not_found_budget"):
        LockoutTable(not_found_budget=0)


def test_pruning_reports_each_expired_entry_so_the_store_forgets_it() -> None:
    clock = FakeClock()
    table, events, dropped = make_dropping_table(max_entries=2)
    fail_real(table, clock.now(), model="short", hint_ms=1_000)
    fail_real(table, clock.now(), model="long")
    clock.advance(1_000)
    assert fail_real(table, clock.now(), model="new") is not None
    assert dropped == [("ollama", "c1", "short")]
    assert [e.reason for e in events][-1] == "429 rate_limited, 120000ms"  # an expiry is no transition


# -- the not_found budget: client-chosen names -----------------------------------------------------


def test_not_found_budget_is_100_per_connection_and_the_table_holds_10000() -> None:
    table = LockoutTable()
    assert table.status() == LockoutTableStatus(
        size=0, capacity=MAX_LOCKOUT_ENTRIES, not_found=0, not_found_budget=100, evicted=0, refused=0
    )
    assert (NOT_FOUND_BUDGET, MAX_LOCKOUT_ENTRIES) == (100, 10_000)


def test_a_connections_not_found_locks_beyond_its_budget_evict_the_least_recently_failed() -> None:
    clock = FakeClock()
    table, events, dropped = make_dropping_table(not_found_budget=3)
    for model in ("a", "b", "c"):
        fail(table, clock.now(), model=model)
        clock.advance(1_000)
    fail(table, clock.now(), model="a")  # failing again makes "a" the most recently failed
    clock.advance(1_000)
    assert fail(table, clock.now(), model="d") is not None

    assert models(table) == ["a", "c", "d"]  # "b" failed least recently
    assert dropped == [("ollama", "c1", "b")]
    assert events[-2:] == [
        Event(START + 4_000, "lockout", "ollama:c1:b", "locked", "unlocked", "evicted_not_found_budget"),
        Event(START + 4_000, "lockout", "ollama:c1:d", "unlocked", "locked", "404 not_found, 120000ms"),
    ]
    assert table.status() == LockoutTableStatus(
        size=3, capacity=MAX_LOCKOUT_ENTRIES, not_found=3, not_found_budget=3, evicted=1, refused=0
    )
    # An evicted name is simply unknown again: its next 404 locks it anew, from count 1.
    entry = fail(table, clock.now(), model="b")
    assert entry is not None
    assert entry.failure_count == 1


def test_the_budget_is_per_provider_and_connection() -> None:
    clock = FakeClock()
    table, _ = make_table(not_found_budget=2)
    for connection, provider in (("c1", "ollama"), ("c2", "ollama"), ("c1", "lmstudio")):
        for model in ("a", "b"):
            fail(table, clock.now(), provider=provider, connection=connection, model=model)
    assert len(table) == 6
    assert table.status().evicted == 0
    fail(table, clock.now(), connection="c2", model="c")
    assert sorted(table.keys()) == [
        ("lmstudio", "c1", "a"),
        ("lmstudio", "c1", "b"),
        ("ollama", "c1", "a"),
        ("ollama", "c1", "b"),
        ("ollama", "c2", "b"),
        ("ollama", "c2", "c"),
    ]


def test_real_lockouts_are_outside_the_budget_and_never_evicted() -> None:
    clock = FakeClock()
    table, _ = make_table(not_found_budget=2)
    fail_real(table, clock.now(), model="quota")
    for n in range(50):
        fail(table, clock.now(), model=f"made-up-{n}")
    assert table.is_locked("ollama", "c1", "quota", clock.now()) is True
    assert models(table) == ["made-up-48", "made-up-49", "quota"]
    assert table.status().not_found == 2
    assert table.status().evicted == 48


def test_a_full_table_makes_room_for_a_real_lock_by_evicting_the_oldest_not_found_anywhere() -> None:
    clock = FakeClock()
    table, events, dropped = make_dropping_table(max_entries=4)
    fail(table, clock.now(), connection="c1", model="old")
    clock.advance(1)
    fail(table, clock.now(), connection="c2", model="newer")
    clock.advance(1)
    fail_real(table, clock.now(), model="r1")
    fail_real(table, clock.now(), model="r2")
    assert len(table) == 4

    assert fail_real(table, clock.now(), connection="c3", model="r3") is not None
    assert dropped == [("ollama", "c1", "old")]
    assert events[-2].reason == "evicted_table_full"
    assert fail(table, clock.now(), connection="c3", model="made-up") is not None  # evicts "newer"
    assert fail_real(table, clock.now(), model="r4") is not None  # evicts "made-up"
    assert models(table) == ["r1", "r2", "r3", "r4"]

    # Now every entry is an active real lock: a new lock of any kind is refused, and counted.
    assert fail(table, clock.now(), model="made-up-2") is None
    assert fail_real(table, clock.now(), model="r5") is None
    status = table.status()
    assert (status.full, status.size, status.not_found, status.evicted, status.refused) == (True, 4, 0, 3, 2)
    assert status.to_api() == {
        "size": 4,
        "capacity": 4,
        "full": True,
        "notFound": 0,
        "notFoundBudget": NOT_FOUND_BUDGET,
        "evicted": 3,
        "refused": 2,
    }


def test_a_full_table_prunes_expired_entries_before_evicting_a_not_found_lock() -> None:
    clock = FakeClock()
    table, _, dropped = make_dropping_table(max_entries=2)
    fail(table, clock.now(), model="made-up")
    fail_real(table, clock.now(), model="short", hint_ms=1_000)
    clock.advance(1_000)
    assert fail_real(table, clock.now(), model="new") is not None
    assert dropped == [("ollama", "c1", "short")]
    assert table.is_locked("ollama", "c1", "made-up", clock.now()) is True
    assert table.status().evicted == 0


def test_an_expired_not_found_entry_is_evicted_without_an_event() -> None:
    clock = FakeClock()
    table, events, dropped = make_dropping_table(not_found_budget=1)
    fail(table, clock.now(), model="a", hint_ms=1_000)
    clock.advance(1_000)
    fail(table, clock.now(), model="b")
    assert dropped == [("ollama", "c1", "a")]
    assert [e.reason for e in events] == ["404 not_found, 1000ms", "404 not_found, 120000ms"]


def test_a_lock_that_changes_reason_moves_in_or_out_of_the_budget() -> None:
    clock = FakeClock()
    table, events = make_table(not_found_budget=2)
    fail(table, clock.now(), model="a")
    fail(table, clock.now(), model="b")
    # "a" now fails for a real reason: it leaves the budget and can no longer be evicted.
    fail_real(table, clock.now(), model="a")
    assert table.status().not_found == 1
    fail(table, clock.now(), model="c")
    fail(table, clock.now(), model="d")  # evicts "b", the oldest not_found
    assert models(table) == ["a", "c", "d"]

    # A real lock whose model later answers 404 joins the budget as its most recently failed entry,
    # and the oldest not_found lock makes way, saying so.
    fail_real(table, clock.now(), model="e")
    fail(table, clock.now(), model="e")
    assert models(table) == ["a", "d", "e"]
    assert table.status().not_found == 2
    assert [(e.key, e.to, e.reason) for e in events[-2:]] == [
        ("ollama:c1:c", "unlocked", "evicted_not_found_budget"),
        ("ollama:c1:e", "locked", "404 not_found, 240000ms"),
    ]


def test_decay_and_reenable_give_budget_back() -> None:
    clock = FakeClock()
    table, _ = make_table(not_found_budget=2)
    fail(table, clock.now(), model="a")
    fail(table, clock.now(), model="b")
    table.record_success("ollama", "c1", "a", clock.now())  # count 1 -> 0: deleted
    table.reenable("ollama", "b", clock.now())
    assert table.status().not_found == 0
    fail(table, clock.now(), model="c")
    fail(table, clock.now(), model="d")
    assert table.status().evicted == 0
    assert table.reenable_all(clock.now()) == 2
    assert table.status().not_found == 0


def test_restore_keeps_each_connections_most_recently_failed_not_found_entries() -> None:
    def entry(connection: str, model: str, reason: str, last_failure: float) -> LockoutEntry:
        status = 404 if reason == "not_found" else 429
        return LockoutEntry(
            "p", connection, model, reason, status, 1, START, START + 60_000, 60_000, last_failure
        )

    stored = [  # as a store written before the budget existed holds them: in key order
        entry("c1", "a", "not_found", START + 3),
        entry("c1", "b", "not_found", START + 1),
        entry("c1", "c", "not_found", START + 2),
        entry("c1", "q", "rate_limited", START + 0),
        entry("c2", "a", "not_found", START + 0),
    ]
    table, events, dropped = make_dropping_table(not_found_budget=2)
    table.restore(stored)
    assert sorted(table.keys()) == [("p", "c1", "a"), ("p", "c1", "c"), ("p", "c1", "q"), ("p", "c2", "a")]
    assert dropped == [("p", "c1", "b")]
    assert events == []  # restoring is no transition
    # The restored order is the eviction order: "c" goes before "a".
    fail(table, START + 10, provider="p", model="d")
    assert table.get("p", "c1", "c") is None


def test_restore_into_a_full_table_evicts_not_found_first_and_drops_what_does_not_fit() -> None:
    def entry(model: str, reason: str, last_failure: float) -> LockoutEntry:
        return LockoutEntry("p", "c", model, reason, 404, 1, START, START + 60_000, 60_000, last_failure)

    table, _, dropped = make_dropping_table(max_entries=2)
    table.restore([entry("nf", "not_found", START), entry("r1", "server_error", START + 1)])
    table.restore([entry("r2", "server_error", START + 2), entry("r3", "server_error", START + 3)])
    assert models(table) == ["r1", "r2"]
    assert dropped == [("p", "c", "nf"), ("p", "c", "r3")]


# -- views ---------------------------------------------------------------------------------------


def test_active_lists_locked_entries_longest_remaining_first() -> None:
    clock = FakeClock()
    table, _ = make_table()
    fail(table, clock.now(), model="a", hint_ms=30_000)
    fail(table, clock.now(), model="b", hint_ms=90_000)
    fail(table, clock.now(), model="c", hint_ms=60_000)
    fail(table, clock.now(), model="gone", hint_ms=10_000)
    clock.advance(10_000)
    assert [e.model for e in table.active(clock.now())] == ["b", "c", "a"]
    assert len(table) == 4  # the expired entry stays (its history decides escalation) until pruned


def test_for_connection_lists_only_that_connections_active_lockouts() -> None:
    clock = FakeClock()
    table, _ = make_table()
    fail(table, clock.now(), connection="c1", model="a", hint_ms=30_000)
    fail(table, clock.now(), connection="c1", model="b", hint_ms=90_000)
    fail(table, clock.now(), connection="c1", model="gone", hint_ms=5_000)
    fail(table, clock.now(), connection="c2", model="a", hint_ms=90_000)
    fail(table, clock.now(), provider="lmstudio", connection="c1", model="z", hint_ms=90_000)
    clock.advance(5_000)
    assert [e.model for e in table.for_connection("ollama", "c1", clock.now())] == ["b", "a"]
    assert table.for_connection("ollama", "c3", clock.now()) == []


def test_triples_whose_parts_contain_colons_do_not_collide() -> None:
    clock = FakeClock()
    table, _ = make_table()
    fail(table, clock.now(), provider="a", connection="b:c", model="m")
    assert table.is_locked("a", "b:c", "m", clock.now()) is True
    assert table.is_locked("a:b", "c", "m", clock.now()) is False


def test_entry_to_api() -> None:
    clock = FakeClock()
    table, _ = make_table()
    entry = fail(table, clock.now())
    assert entry is not None
    clock.advance(20_000.5)
    assert entry.remaining_ms(clock.now()) == 99_999.5
    assert lockout_of(entry).to_api(clock.now()) == {
        "provider": "ollama",
        "connectionId": "c1",
        "model": "llama3:8b",
        "reason": "not_found",
        "status": 404,
        "failureCount": 1,
        "remainingMs": 100_000,
        "lockedAt": "2026-01-01T00:00:00.000Z",
        "expiresAt": "2026-01-01T00:02:00.000Z",
    }
    clock.advance(200_000)
    assert entry.remaining_ms(clock.now()) == 0
    assert lockout_of(entry).to_api(clock.now())["remainingMs"] == 0


# -- persistence ---------------------------------------------------------------------------------


def test_record_round_trip_and_restore_emits_nothing() -> None:
    clock = FakeClock()
    table, _ = make_table()
    fail(table, clock.now(), connection="c1", model="a")
    fail(table, clock.now(), connection="c1", model="a")
    fail(table, clock.now(), connection="c2", model="b", status=429, reason="rate_limited", hint_ms=5_000)
    records = [e.to_record() for e in table.active(clock.now())]
    assert records[0] == {
        "provider": "ollama",
        "connection_id": "c1",
        "model": "a",
        "reason": "not_found",
        "status": 404,
        "failure_count": 2,
        "locked_at": START,
        "expires_at": START + 240_000,
        "last_cooldown_ms": 240_000.0,
        "last_failure_at": START,
    }

    restored, events = make_table()
    restored.restore(LockoutEntry.from_record(r) for r in records)
    assert events == []
    assert len(restored) == 2
    assert [e.to_record() for e in restored.active(clock.now())] == records
    assert [e.model for e in restored.for_connection("ollama", "c1", clock.now())] == ["a"]
    assert restored.reenable("ollama", "b", clock.now()) == 1
    # Escalation continues from the restored count.
    entry = fail(restored, clock.now(), connection="c1", model="a")
    assert entry is not None
    assert entry.failure_count == 3


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("provider", None, "'provider' must be a string"),
        ("failure_count", -1, "'failure_count' must be a non-negative integer"),
        ("failure_count", True, "'failure_count' must be a non-negative integer"),
        ("expires_at", "soon", "'expires_at' must be a number of ms"),
        ("status", "404", "'status' must be an integer or null"),
    ],
)
def test_from_record_rejects_bad_fields(field: str, value: object, message: str) -> None:
    record = LockoutEntry("p", "c", "m", "not_found", 404, 1, START, START + 1, 1.0, START).to_record()
    record[field] = value
    with pytest.raises(ValueError, match=message):
        LockoutEntry.from_record(record)


def test_from_record_rejects_a_missing_field() -> None:
    record = LockoutEntry("p", "c", "m", "not_found", None, 1, START, START + 1, 1.0, START).to_record()
    del record["last_failure_at"]
    with pytest.raises(ValueError, match="no 'last_failure_at'"):
        LockoutEntry.from_record(record)


def test_an_expired_lock_forgotten_by_success_decay_is_no_transition() -> None:
    """Its timer lifted it already: the success that forgets its count emits nothing (an
    `unlocked -> unlocked` event read as a glitch in the Events tab), as a prune of it does not."""
    clock = FakeClock()
    table, events = make_table()
    fail(table, clock.now())
    entry = table.get("ollama", "c1", "llama3:8b")
    assert entry is not None and entry.failure_count == 1
    clock.advance(entry.expires_at - clock.now())
    told = len(events)
    table.record_success("ollama", "c1", "llama3:8b", clock.now())
    assert table.get("ollama", "c1", "llama3:8b") is None
    assert events[told:] == []


def test_re_enabling_counts_and_tells_only_the_locks_it_lifted() -> None:
    """One triple still locked, one whose timer ran out (kept for its escalation history): `all`
    forgets both, lifts one, says one, and emits one event."""
    clock = FakeClock()
    table, events = make_table()
    fail(table, clock.now(), model="old")
    clock.advance(10 * 60_000)  # past the first lock's 2 minutes (the default base cooldown)
    fail(table, clock.now(), model="new")
    told = len(events)
    assert table.reenable_all(clock.now()) == 1
    assert len(table) == 0
    assert [(e.key, e.from_, e.to, e.reason) for e in events[told:]] == [
        ("ollama:c1:new", "locked", "unlocked", "operator")
    ]
    fail(table, clock.now(), model="old")
    clock.advance(10 * 60_000)
    assert table.reenable("ollama", "old", clock.now()) == 0
    assert len(table) == 0
