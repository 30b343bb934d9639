from __future__ import annotations

import asyncio
import json

import pytest

from proxy.resilience.clock import FakeClock
from proxy.resilience.cooldown import (
    DEFAULT_COOLDOWN_POLICIES,
    TERMINAL_STATUSES,
    ConnectionHealth,
    CooldownPolicy,
)
from proxy.resilience.events import Event
from proxy.resilience.hints import parse_retry_hint

APIKEY = DEFAULT_COOLDOWN_POLICIES["apikey"]
OAUTH = DEFAULT_COOLDOWN_POLICIES["oauth"]
LOCAL = DEFAULT_COOLDOWN_POLICIES["local"]


def make(enabled: bool = True) -> tuple[ConnectionHealth, FakeClock, list[Event]]:
    events: list[Event] = []
    health = ConnectionHealth("openai-key-1", "openai", enabled=enabled, emit=events.append)
    return health, FakeClock(), events


def fail_503(
    health: ConnectionHealth, now: float, policy: CooldownPolicy = APIKEY, *, disable_cooling: bool = False
) -> float:
    return health.record_failure(
        now,
        policy,
        error="503 Service Unavailable",
        error_type="server_error",
        code=503,
        disable_cooling=disable_cooling,
    )


def fail_429(health: ConnectionHealth, now: float, hint_ms: float | None = None) -> float:
    return health.record_failure(
        now, APIKEY, error="429 Too Many Requests", error_type="rate_limit", code=429, hint_ms=hint_ms
    )


def transitions(events: list[Event]) -> list[tuple[str, str, str]]:
    return [(e.from_, e.to, e.reason) for e in events]


def test_default_policies_match_the_spec_table() -> None:
    table = {
        name: (p.base_cooldown_ms, p.max_backoff_steps, p.use_upstream_retry_hints)
        for name, p in DEFAULT_COOLDOWN_POLICIES.items()
    }
    assert table == {"oauth": (5000, 8, False), "apikey": (3000, 5, True), "local": (2000, 3, False)}
    assert frozenset({"banned", "expired", "credits_exhausted"}) == TERMINAL_STATUSES


def test_new_connection_is_active_and_eligible() -> None:
    health, clock, events = make()
    assert health.status(clock.now()) == "active"
    assert health.is_eligible(clock.now()) is True
    assert health.remaining_ms(clock.now()) == 0.0
    assert health.backoff_level == 0
    assert events == []


def test_case_11_apikey_backoff_3_6_12_24() -> None:
    health, clock, events = make()
    for cooldown, level in [(3000.0, 1), (6000.0, 2), (12000.0, 3), (24000.0, 4)]:
        assert fail_503(health, clock.now()) == cooldown
        assert health.backoff_level == level
        assert health.status(clock.now()) == "cooling"
        assert health.is_eligible(clock.now()) is False
        assert health.remaining_ms(clock.now()) == cooldown
        assert health.rate_limited_until == clock.now() + cooldown
        clock.advance(cooldown - 1)
        assert health.is_eligible(clock.now()) is False
        clock.advance(1)
        # lazy recovery: the deadline has passed, nothing ran, the read says active
        assert health.status(clock.now()) == "active"
        assert health.is_eligible(clock.now()) is True
        assert health.remaining_ms(clock.now()) == 0.0
    assert [e.reason for e in events] == [
        "cooldown 3000ms (level 1)",
        "cooldown 6000ms (level 2)",
        "cooldown 12000ms (level 3)",
        "cooldown 24000ms (level 4)",
    ]
    assert {(e.from_, e.to) for e in events} == {("active", "cooling")}
    # then 48 s reaches max_backoff_steps (5) and 96 s repeats from there on
    for cooldown in [48000.0, 96000.0, 96000.0, 96000.0]:
        assert fail_503(health, clock.now()) == cooldown
        assert health.backoff_level == 5
        clock.advance(cooldown)


def test_case_11_lazy_expiry_emits_nothing() -> None:
    health, clock, events = make()
    fail_503(health, clock.now())
    clock.advance(10_000)
    assert health.status(clock.now()) == "active"
    assert len(events) == 1


@pytest.mark.parametrize("form", ["seconds", "http-date"])
def test_case_12_retry_after_120_gives_120s_and_level_0(form: str) -> None:
    health, clock, events = make()
    # two earlier failures raise the level, so the reset to 0 is visible
    clock.advance(fail_503(health, clock.now()))
    clock.advance(fail_503(health, clock.now()))
    assert health.backoff_level == 2
    assert clock.now() == 1_767_225_609_000  # 2026-01-01T00:00:09Z
    retry_after = "120" if form == "seconds" else "Thu, 01 Jan 2026 00:02:09 GMT"
    hint = parse_retry_hint({"retry-after": retry_after}, "", clock.now())
    assert hint == 120_000.0
    assert fail_429(health, clock.now(), hint_ms=hint) == 120_000.0
    assert health.backoff_level == 0
    assert health.remaining_ms(clock.now()) == 120_000.0
    assert events[-1].reason == "retry hint 120000ms"
    assert (events[-1].from_, events[-1].to) == ("active", "cooling")


def test_case_12_hints_are_ignored_when_the_class_does_not_use_them() -> None:
    health, clock, _ = make()
    applied = health.record_failure(
        clock.now(), OAUTH, error="429", error_type="rate_limit", code=429, hint_ms=120_000.0
    )
    assert applied == 5000.0
    assert health.backoff_level == 1


def test_case_12_a_zero_hint_cools_nothing_and_resets_the_level() -> None:
    health, clock, events = make()
    clock.advance(fail_503(health, clock.now()))
    assert fail_429(health, clock.now(), hint_ms=0.0) == 0.0
    assert health.backoff_level == 0
    assert health.status(clock.now()) == "active"
    assert health.error_code == 429
    assert len(events) == 1


async def test_case_13_ten_concurrent_429s_one_cooldown_level_bumped_once() -> None:
    health, clock, events = make()
    now = clock.now()

    async def in_flight_request() -> float:
        await asyncio.sleep(0)  # let every task start before any of them reports
        return fail_429(health, now)

    applied = await asyncio.gather(*(asyncio.create_task(in_flight_request()) for _ in range(10)))
    assert sorted(applied) == [0.0] * 9 + [3000.0]
    assert health.backoff_level == 1
    assert health.rate_limited_until == now + 3000
    assert transitions(events) == [("active", "cooling", "cooldown 3000ms (level 1)")]


def test_case_13_late_failures_while_cooling_neither_bump_nor_shorten() -> None:
    health, clock, events = make()
    start = clock.now()
    fail_503(health, start)
    fail_503(health, start)
    clock.advance(2000)
    assert fail_503(health, clock.now()) == 0.0
    assert fail_429(health, clock.now()) == 0.0
    assert health.backoff_level == 1
    assert health.rate_limited_until == start + 3000
    assert health.last_error_at == start + 2000  # error fields still follow the latest failure
    assert health.error_code == 429
    assert len(events) == 1


def test_case_14_longer_hint_extends_shorter_does_not_shorten() -> None:
    health, clock, events = make()
    start = clock.now()
    assert fail_429(health, start, hint_ms=60_000.0) == 60_000.0
    clock.advance(10_000)
    assert fail_429(health, clock.now(), hint_ms=120_000.0) == 120_000.0
    assert health.rate_limited_until == start + 130_000
    clock.advance(10_000)
    assert fail_429(health, clock.now(), hint_ms=5_000.0) == 0.0
    assert fail_429(health, clock.now()) == 0.0  # no hint: no bump, no change
    assert health.rate_limited_until == start + 130_000
    assert health.remaining_ms(clock.now()) == 110_000.0
    assert health.backoff_level == 0
    assert transitions(events) == [
        ("active", "cooling", "retry hint 60000ms"),
        ("cooling", "cooling", "extended by retry hint"),
    ]


def test_case_14_a_hint_extends_a_backoff_cooldown_and_resets_its_level() -> None:
    health, clock, _ = make()
    start = clock.now()
    fail_503(health, start)
    fail_503(health, start)  # thundering herd: still level 1
    assert fail_429(health, start + 1000, hint_ms=30_000.0) == 30_000.0
    assert health.rate_limited_until == start + 31_000
    assert health.backoff_level == 0


def test_case_14_no_extension_when_hints_are_off() -> None:
    health, clock, events = make()
    start = clock.now()
    health.record_failure(start, OAUTH, error="429", error_type="rate_limit", code=429)
    applied = health.record_failure(
        start + 1000, OAUTH, error="429", error_type="rate_limit", code=429, hint_ms=600_000.0
    )
    assert applied == 0.0
    assert health.rate_limited_until == start + 5000
    assert len(events) == 1


@pytest.mark.parametrize(
    ("status", "code", "error"),
    [
        ("expired", 401, "Incorrect API key provided"),
        ("banned", 403, "Your account has been deactivated"),
        ("credits_exhausted", 429, "insufficient_quota"),
    ],
)
def test_case_15_terminal_states_survive_503_until_reset(status: str, code: int, error: str) -> None:
    health, clock, events = make()
    fail_503(health, clock.now())  # cooling first: mark_terminal clears the cooldown
    health.mark_terminal(clock.now(), status, error=error, code=code)
    assert health.status(clock.now()) == status
    assert health.terminal == status
    assert health.rate_limited_until is None
    assert health.is_eligible(clock.now()) is False
    assert health.remaining_ms(clock.now()) == 0.0
    assert (events[-1].from_, events[-1].to) == ("cooling", status)
    assert events[-1].reason == f"{status}: {code} {error}"

    clock.advance(3_600_000)
    assert health.status(clock.now()) == status  # no timer, no expiry
    assert fail_503(health, clock.now()) == 0.0
    assert health.status(clock.now()) == status
    assert health.rate_limited_until is None
    # Nor its words: why the key went terminal is what the operator reads to fix it (a late 503
    # used to replace them; found by a trial).
    assert (health.error_code, health.last_error, health.last_error_type) == (code, error, status)
    assert len(events) == 2

    health.reset(clock.now())
    assert health.status(clock.now()) == "active"
    assert health.is_eligible(clock.now()) is True
    assert health.terminal is None
    assert health.backoff_level == 0
    assert health.error_code is None
    assert transitions(events)[-1] == (status, "active", "operator")


def test_case_15_a_later_terminal_state_replaces_an_earlier_one() -> None:
    health, clock, events = make()
    health.mark_terminal(clock.now(), "expired", error="invalid key", code=401)
    health.mark_terminal(clock.now(), "banned", error="account suspended", code=403)
    assert health.status(clock.now()) == "banned"
    assert [(e.from_, e.to) for e in events] == [("active", "expired"), ("expired", "banned")]


def test_case_15_mark_terminal_rejects_other_statuses() -> None:
    health, clock, events = make()
    with pytest.raises(ValueError, match="cooling"):
        health.mark_terminal(clock.now(), "cooling", error="x", code=None)
    assert health.status(clock.now()) == "active"
    assert events == []


def test_case_15_terminal_event_reason_is_short_and_masks_keys() -> None:
    health, clock, events = make()
    error = "Incorrect API key provided: sk-proj-abcdefghijklmnopqrstuvwxyz0123456789. " + "x " * 100
    health.mark_terminal(clock.now(), "expired", error=error, code=401)
    reason = events[-1].reason
    assert "abcdefghijklmnop" not in reason
    assert reason.startswith("expired: 401 Incorrect API key provided: ***.")
    assert len(reason) == len("expired: 401 ") + 60
    assert reason.endswith("...")


def test_case_17_success_clears_every_error_field_and_the_level() -> None:
    health, clock, events = make()
    fail_503(health, clock.now())
    clock.advance(3000)
    fail_429(health, clock.now())
    assert health.backoff_level == 2
    clock.advance(1000)  # still cooling: a request sent before the cooldown succeeds
    health.record_success(clock.now())
    assert health.status(clock.now()) == "active"
    assert health.is_eligible(clock.now()) is True
    assert health.rate_limited_until is None
    assert health.backoff_level == 0
    assert health.last_error is None
    assert health.last_error_type is None
    assert health.error_code is None
    assert health.last_error_at is None
    assert transitions(events)[-1] == ("cooling", "active", "success")
    # the next failure starts the ladder again from 3 s
    assert fail_503(health, clock.now()) == 3000.0


def test_case_17_success_after_expiry_clears_quietly() -> None:
    health, clock, events = make()
    fail_503(health, clock.now())
    clock.advance(3000)
    health.record_success(clock.now())
    assert health.backoff_level == 0
    assert health.last_error_at is None
    assert len(events) == 1  # status was already "active" by lazy expiry: no transition


def test_success_on_a_healthy_connection_emits_nothing() -> None:
    health, clock, events = make()
    health.record_success(clock.now())
    assert events == []
    assert health.status(clock.now()) == "active"


@pytest.mark.parametrize("status", sorted(TERMINAL_STATUSES))
def test_a_late_success_never_clears_a_terminal_state(status: str) -> None:
    # A terminal connection takes no traffic, so any success it reports is a request that was in
    # flight when the verdict came: it says nothing about the credential now (issue #9, item 2).
    health, clock, events = make()
    health.mark_terminal(clock.now(), status, error="401 Incorrect API key provided", code=401)
    before = health.to_record()
    clock.advance(500)
    health.record_success(clock.now())
    assert health.status(clock.now()) == status
    assert health.to_record() == before
    assert len(events) == 1
    health.reset(clock.now())  # only an operator (or a credential change) ends it
    assert health.status(clock.now()) == "active"


def test_disable_cooling_records_errors_but_never_cools() -> None:
    health, clock, events = make()
    for _ in range(3):
        assert fail_503(health, clock.now(), disable_cooling=True) == 0.0
    assert fail_429(health, clock.now(), hint_ms=None) == 3000.0  # the flag is per call
    health.reset(clock.now())
    assert (
        health.record_failure(
            clock.now(),
            APIKEY,
            error="429",
            error_type="rate_limit",
            code=429,
            hint_ms=60_000.0,
            disable_cooling=True,
        )
        == 0.0
    )
    assert health.status(clock.now()) == "active"
    assert health.backoff_level == 0
    assert health.error_code == 429
    assert health.last_error_type == "rate_limit"
    assert health.last_error_at == clock.now()
    assert [e.to for e in events] == ["cooling", "active"]


def test_base_cooldown_zero_turns_cooling_off() -> None:
    health, clock, events = make()
    off = CooldownPolicy(base_cooldown_ms=0, max_backoff_steps=5, use_upstream_retry_hints=True)
    assert fail_503(health, clock.now(), off) == 0.0
    assert (
        health.record_failure(clock.now(), off, error="429", error_type="rl", code=429, hint_ms=9000) == 0.0
    )
    assert health.status(clock.now()) == "active"
    assert health.backoff_level == 0
    assert health.error_code == 429
    assert events == []


def test_max_backoff_steps_zero_keeps_the_base_cooldown() -> None:
    health, clock, _ = make()
    flat = CooldownPolicy(base_cooldown_ms=2000, max_backoff_steps=0, use_upstream_retry_hints=False)
    for _ in range(3):
        assert fail_503(health, clock.now(), flat) == 2000.0
        assert health.backoff_level == 0
        clock.advance(2000)


def test_a_lowered_max_backoff_steps_applies_at_once() -> None:
    health, clock, _ = make()
    for _ in range(5):
        clock.advance(fail_503(health, clock.now()))
    assert health.backoff_level == 5
    assert fail_503(health, clock.now(), LOCAL) == 16_000.0  # 2000 * 2**3, not 2000 * 2**5
    assert health.backoff_level == 3


def test_disable_and_enable() -> None:
    health, clock, events = make()
    health.set_enabled(False, clock.now())
    assert health.status(clock.now()) == "disabled"
    assert health.is_eligible(clock.now()) is False
    health.set_enabled(False, clock.now())  # no change, no event
    health.set_enabled(True, clock.now())
    assert health.status(clock.now()) == "active"
    assert health.is_eligible(clock.now()) is True
    assert transitions(events) == [("active", "disabled", "operator"), ("disabled", "active", "operator")]


def test_re_enabling_restores_the_underlying_state() -> None:
    health, clock, events = make()
    health.mark_terminal(clock.now(), "expired", error="401", code=401)
    health.set_enabled(False, clock.now())
    assert health.status(clock.now()) == "disabled"
    health.set_enabled(True, clock.now())
    assert health.status(clock.now()) == "expired"
    assert health.is_eligible(clock.now()) is False
    assert transitions(events)[-2:] == [
        ("expired", "disabled", "operator"),
        ("disabled", "expired", "operator"),
    ]


def test_starting_disabled_and_cooling_underneath() -> None:
    health, clock, events = make(enabled=False)
    assert health.status(clock.now()) == "disabled"
    assert fail_503(health, clock.now()) == 3000.0  # an in-flight failure still counts
    assert health.status(clock.now()) == "disabled"
    assert events == []  # the visible status did not change
    health.set_enabled(True, clock.now())
    assert health.status(clock.now()) == "cooling"
    assert transitions(events) == [("disabled", "cooling", "operator")]


def test_reset_keeps_enabled_and_reports_what_it_cleared() -> None:
    health, clock, events = make()
    health.mark_terminal(clock.now(), "banned", error="suspended", code=403)
    health.set_enabled(False, clock.now())
    health.reset(clock.now())
    assert health.enabled is False
    assert health.terminal is None
    assert health.status(clock.now()) == "disabled"
    assert transitions(events)[-1] == ("disabled", "disabled", "operator")
    health.reset(clock.now(), reason="credential changed")  # nothing left to clear: no event
    assert len(events) == 3


def test_reset_with_a_reason_for_a_credential_change() -> None:
    health, clock, events = make()
    fail_503(health, clock.now())
    health.reset(clock.now(), reason="credential changed")
    assert health.status(clock.now()) == "active"
    assert transitions(events)[-1] == ("cooling", "active", "credential changed")


def test_events_carry_layer_key_and_time() -> None:
    health, clock, events = make()
    clock.advance(1234)
    fail_503(health, clock.now())
    assert events == [
        Event(
            ts=clock.now(),
            layer="connection",
            key="openai-key-1",
            from_="active",
            to="cooling",
            reason="cooldown 3000ms (level 1)",
        )
    ]


def test_record_round_trip() -> None:
    health, clock, _ = make()
    clock.advance(fail_503(health, clock.now()))
    fail_429(health, clock.now())
    health.set_enabled(False, clock.now())
    record = json.loads(json.dumps(health.to_record()))
    assert record == {
        "connection_id": "openai-key-1",
        "provider": "openai",
        "enabled": False,
        "terminal": None,
        "rate_limited_until": clock.now() + 6000,
        "backoff_level": 2,
        "last_error": "429 Too Many Requests",
        "last_error_type": "rate_limit",
        "error_code": 429,
        "last_error_at": clock.now(),
    }
    restored_events: list[Event] = []
    restored = ConnectionHealth("openai-key-1", "openai", emit=restored_events.append)
    restored.load_record(record)
    assert restored.to_record() == health.to_record()
    assert restored.status(clock.now()) == "disabled"
    assert restored.remaining_ms(clock.now()) == 6000.0
    assert restored_events == []


def test_record_round_trip_of_a_terminal_state() -> None:
    health, clock, _ = make()
    health.mark_terminal(clock.now(), "credits_exhausted", error="insufficient_quota", code=429)
    restored = ConnectionHealth("openai-key-1", "openai")
    restored.load_record(json.loads(json.dumps(health.to_record())))
    assert restored.status(clock.now()) == "credits_exhausted"
    assert restored.last_error_type == "credits_exhausted"


@pytest.mark.parametrize(
    "bad",
    [
        {"terminal": "cooling"},
        {"backoff_level": "3"},
        {"backoff_level": True},
        {"backoff_level": -1},
        {"enabled": 1},
        {"rate_limited_until": "soon"},
        {"error_code": 4.5},
    ],
)
def test_load_record_rejects_a_bad_record_and_changes_nothing(bad: dict[str, object]) -> None:
    health, clock, _ = make()
    fail_503(health, clock.now())
    before = health.to_record()
    with pytest.raises(ValueError, match=next(iter(bad))):
        health.load_record(bad)
    assert health.to_record() == before


def test_load_record_missing_keys_mean_cleared() -> None:
    health, clock, _ = make()
    fail_503(health, clock.now())
    health.load_record({"connection_id": "other", "backoff_level": 4})
    assert health.connection_id == "openai-key-1"  # identity comes from the config, not the record
    assert health.backoff_level == 4
    assert health.rate_limited_until is None
    assert health.last_error is None
    assert health.enabled is True
