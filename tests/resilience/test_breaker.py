"""Provider circuit breaker: docs/resilience.md#provider-circuit-breaker and acceptance cases 1-10."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.readmodel import breaker_of
from proxy.resilience.breaker import (
    DEFAULT_BREAKER_POLICIES,
    Admission,
    BreakerPolicy,
    BreakerState,
    CircuitBreaker,
    Transition,
)
from proxy.resilience.clock import FakeClock
from proxy.resilience.events import Event
from proxy.resilience.outcome import ProviderClass
from proxy.resilience.timefmt import epoch_ms, iso

APIKEY = DEFAULT_BREAKER_POLICIES["apikey"]
START = 1_767_225_600_000.0  # FakeClock's default: 2026-01-01T00:00:00Z


def make(
    provider: str = "openai", cls: ProviderClass = "apikey", events: list[Event] | None = None
) -> CircuitBreaker:
    sink = events if events is not None else []
    return CircuitBreaker(provider, cls, DEFAULT_BREAKER_POLICIES[cls], emit=sink.append)


def fail(breaker: CircuitBreaker, now: float, times: int) -> None:
    for _ in range(times):
        breaker.record_failure(now)


def admit_probe(breaker: CircuitBreaker, now: float) -> int:
    """Admit the probe and return its ticket, the one identity that may settle its slot."""
    assert breaker.admit(now) is Admission.PROBE
    ticket = breaker.probe_ticket
    assert ticket != 0
    return ticket


def opened(clock: FakeClock, events: list[Event] | None = None) -> CircuitBreaker:
    """An apikey breaker that has just opened (cycle 1) at clock.now()."""
    breaker = make(events=events)
    fail(breaker, clock.now(), 12)
    assert breaker.state(clock.now()) is BreakerState.OPEN
    return breaker


def test_default_policies() -> None:
    assert DEFAULT_BREAKER_POLICIES["oauth"] == BreakerPolicy(5, 8, 60_000)
    assert DEFAULT_BREAKER_POLICIES["apikey"] == BreakerPolicy(7, 12, 30_000)
    assert DEFAULT_BREAKER_POLICIES["local"] == BreakerPolicy(1, 2, 15_000)
    assert len(DEFAULT_BREAKER_POLICIES) == 3


def test_case_1_new_breaker_closed_and_successes_keep_it_closed() -> None:
    clock = FakeClock()
    events: list[Event] = []
    breaker = make(events=events)
    assert breaker.state(clock.now()) is BreakerState.CLOSED
    for _ in range(50):
        assert breaker.admit(clock.now()) is Admission.ALLOW
        breaker.record_success(clock.now())
        clock.advance(10)
    assert breaker.state(clock.now()) is BreakerState.CLOSED
    assert breaker.failure_count == 0
    assert breaker.can_execute(clock.now()) is True
    assert breaker.retry_after_ms(clock.now()) == 0
    assert events == []
    assert list(breaker.history) == []


def test_case_2_apikey_degrades_at_7_and_opens_at_12() -> None:
    clock = FakeClock()
    events: list[Event] = []
    breaker = make(events=events)
    fail(breaker, clock.now(), 6)
    assert (breaker.state(clock.now()), breaker.failure_count) == (BreakerState.CLOSED, 6)
    breaker.record_failure(clock.now())
    assert (breaker.state(clock.now()), breaker.failure_count) == (BreakerState.DEGRADED, 7)
    fail(breaker, clock.now(), 4)
    assert (breaker.state(clock.now()), breaker.failure_count) == (BreakerState.DEGRADED, 11)
    assert breaker.admit(clock.now()) is Admission.ALLOW  # DEGRADED still sends
    breaker.record_failure(clock.now())
    assert (breaker.state(clock.now()), breaker.failure_count) == (BreakerState.OPEN, 12)
    assert [(e.from_, e.to, e.reason) for e in events] == [
        ("CLOSED", "DEGRADED", "failures"),
        ("DEGRADED", "OPEN", "failures"),
    ]


def test_case_2_successes_pull_the_count_down() -> None:
    # 429s and 401s are never reported to the breaker (classification is the caller's); what the
    # breaker does see between failures are successes, and each one takes one failure back.
    clock = FakeClock()
    events: list[Event] = []
    breaker = make(events=events)
    fail(breaker, clock.now(), 7)
    assert breaker.state(clock.now()) is BreakerState.DEGRADED
    breaker.record_success(clock.now())
    assert (breaker.state(clock.now()), breaker.failure_count) == (BreakerState.CLOSED, 6)
    for _ in range(10):
        breaker.record_success(clock.now())
    assert breaker.failure_count == 0  # never below zero
    # Interleaved: 11 failures with a success after every failure never degrade it.
    for _ in range(11):
        breaker.record_failure(clock.now())
        breaker.record_success(clock.now())
    assert (breaker.state(clock.now()), breaker.failure_count) == (BreakerState.CLOSED, 0)
    assert [(e.from_, e.to, e.reason) for e in events] == [
        ("CLOSED", "DEGRADED", "failures"),
        ("DEGRADED", "CLOSED", "recovered"),
    ]


def test_local_profile_degrades_at_1_and_opens_at_2() -> None:
    clock = FakeClock()
    breaker = make("ollama", "local")
    breaker.record_failure(clock.now())
    assert breaker.state(clock.now()) is BreakerState.DEGRADED
    breaker.record_failure(clock.now())
    assert breaker.state(clock.now()) is BreakerState.OPEN
    assert breaker.retry_after_ms(clock.now()) == 15_000


def test_case_3_open_rejects_with_remaining_time() -> None:
    clock = FakeClock()
    breaker = opened(clock)
    assert breaker.can_execute(clock.now()) is False
    assert breaker.retry_after_ms(clock.now()) == 30_000
    assert breaker.admit(clock.now()) is Admission.REJECT
    clock.advance(12_345)
    assert breaker.can_execute(clock.now()) is False
    assert breaker.retry_after_ms(clock.now()) == 17_655
    assert breaker.admit(clock.now()) is Admission.REJECT
    clock.advance(17_654)
    assert breaker.retry_after_ms(clock.now()) == 1
    assert breaker.admit(clock.now()) is Admission.REJECT


@pytest.mark.parametrize("read", ["state", "can_execute", "retry_after_ms", "admit", "view"])
def test_case_4_first_read_after_timeout_is_half_open(read: str) -> None:
    clock = FakeClock()
    events: list[Event] = []
    breaker = opened(clock, events)
    clock.advance(30_000)
    # No timer ran: the breaker is still OPEN internally until something reads it.
    assert breaker.to_record()["state"] == "OPEN"
    reader = (lambda now: breaker_of(breaker, now)) if read == "view" else getattr(breaker, read)
    reader(clock.now())  # "view": what the API, the stream and the console read
    assert breaker.to_record()["state"] == "HALF_OPEN"
    assert events[-1] == Event(
        ts=START + 30_000,
        layer="breaker",
        key="openai",
        from_="OPEN",
        to="HALF_OPEN",
        reason="timeout_elapsed",
    )
    assert breaker.retry_after_ms(clock.now()) == 0
    reader(clock.now())
    assert [e.to for e in events] == ["DEGRADED", "OPEN", "HALF_OPEN"]  # HALF_OPEN told once


def test_case_4_one_ms_before_the_timeout_is_still_open() -> None:
    clock = FakeClock()
    breaker = opened(clock)
    clock.advance(29_999)
    assert breaker.state(clock.now()) is BreakerState.OPEN
    clock.advance(1)
    assert breaker.state(clock.now()) is BreakerState.HALF_OPEN


async def test_case_5_half_open_with_100_concurrent_requests_admits_exactly_one() -> None:
    clock = FakeClock()
    breaker = opened(clock)
    clock.advance(30_000)
    assert breaker.state(clock.now()) is BreakerState.HALF_OPEN
    upstream_calls: list[int] = []

    async def request(i: int) -> Admission:
        admission = breaker.admit(clock.now())
        if admission is not Admission.REJECT:
            ticket = breaker.probe_ticket if admission is Admission.PROBE else 0
            upstream_calls.append(i)
            await asyncio.sleep(0)  # the upstream call: every other task runs meanwhile
            breaker.record_success(clock.now(), probe=ticket)
        return admission

    admissions = await asyncio.gather(*(request(i) for i in range(100)))
    assert admissions.count(Admission.PROBE) == 1
    assert admissions.count(Admission.REJECT) == 99
    assert admissions.count(Admission.ALLOW) == 0
    assert len(upstream_calls) == 1
    assert breaker.state(clock.now()) is BreakerState.CLOSED


def test_case_5_probe_slot_taken_means_reject_and_cannot_execute() -> None:
    clock = FakeClock()
    breaker = opened(clock)
    clock.advance(30_000)
    assert breaker.can_execute(clock.now()) is True
    assert breaker.admit(clock.now()) is Admission.PROBE
    assert breaker.can_execute(clock.now()) is False
    assert breaker.admit(clock.now()) is Admission.REJECT
    assert breaker.state(clock.now()) is BreakerState.HALF_OPEN


def test_case_6_probe_success_closes_with_count_zero() -> None:
    clock = FakeClock()
    events: list[Event] = []
    breaker = opened(clock, events)
    clock.advance(30_000)
    ticket = admit_probe(breaker, clock.now())
    clock.advance(250)
    breaker.record_success(clock.now(), probe=ticket)
    assert breaker.state(clock.now()) is BreakerState.CLOSED
    assert (breaker.failure_count, breaker.open_cycle_count) == (0, 0)
    assert breaker.admit(clock.now()) is Admission.ALLOW
    assert (events[-1].from_, events[-1].to, events[-1].reason) == ("HALF_OPEN", "CLOSED", "probe_succeeded")
    assert events[-1].ts == START + 30_250


def test_case_6_probe_failure_reopens_with_cycle_plus_one() -> None:
    clock = FakeClock()
    events: list[Event] = []
    breaker = opened(clock, events)
    assert breaker.open_cycle_count == 1
    clock.advance(30_000)
    ticket = admit_probe(breaker, clock.now())
    clock.advance(500)
    breaker.record_failure(clock.now(), probe=ticket)
    assert breaker.state(clock.now()) is BreakerState.OPEN
    assert breaker.open_cycle_count == 2
    assert breaker.failure_count == 13
    assert breaker.retry_after_ms(clock.now()) == 30_000  # counted from the probe's failure
    assert breaker.admit(clock.now()) is Admission.REJECT
    assert (events[-1].from_, events[-1].to, events[-1].reason) == ("HALF_OPEN", "OPEN", "probe_failed")


def test_case_7_failed_probe_cycles_double_from_the_4th_and_cap_at_16x() -> None:
    clock = FakeClock()
    breaker = opened(clock)
    open_periods: list[float] = []
    for _ in range(9):
        period = breaker.retry_after_ms(clock.now())
        assert period == breaker.effective_reset_timeout_ms()
        open_periods.append(period)
        clock.advance(period - 1)
        assert breaker.state(clock.now()) is BreakerState.OPEN
        clock.advance(1)
        breaker.record_failure(clock.now(), probe=admit_probe(breaker, clock.now()))
    assert open_periods[:5] == [30_000, 30_000, 30_000, 60_000, 120_000]
    assert open_periods[5:] == [240_000, 480_000, 480_000, 480_000]
    assert breaker.open_cycle_count == 10


def test_case_7_probe_success_resets_the_cycle_count() -> None:
    clock = FakeClock()
    breaker = opened(clock)
    for _ in range(4):  # cycles 2..5
        clock.advance(breaker.retry_after_ms(clock.now()))
        breaker.record_failure(clock.now(), probe=admit_probe(breaker, clock.now()))
    assert (breaker.open_cycle_count, breaker.retry_after_ms(clock.now())) == (5, 120_000)
    clock.advance(120_000)
    breaker.record_success(clock.now(), probe=admit_probe(breaker, clock.now()))
    fail(breaker, clock.now(), 12)
    assert (breaker.open_cycle_count, breaker.retry_after_ms(clock.now())) == (1, 30_000)


def test_case_8_probe_without_verdict_gives_its_slot_back() -> None:
    clock = FakeClock()
    events: list[Event] = []
    breaker = opened(clock, events)
    clock.advance(30_000)
    ticket = admit_probe(breaker, clock.now())
    assert breaker.admit(clock.now()) is Admission.REJECT
    clock.advance(100)
    breaker.release_probe(clock.now(), ticket)  # the client disconnected (or a 4xx, or a local rejection)
    assert breaker.state(clock.now()) is BreakerState.HALF_OPEN
    assert breaker.open_cycle_count == 1
    assert breaker.can_execute(clock.now()) is True
    assert breaker.admit(clock.now()) is Admission.PROBE
    assert breaker.admit(clock.now()) is Admission.REJECT
    assert events[-1].to == "HALF_OPEN"  # releasing is not a transition


def test_case_8_unsettled_probe_loses_its_slot_after_probe_timeout() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker("openai", "apikey", APIKEY, probe_timeout_ms=5_000)
    fail(breaker, clock.now(), 12)
    clock.advance(30_000)
    assert breaker.admit(clock.now()) is Admission.PROBE
    clock.advance(4_999)
    assert breaker.can_execute(clock.now()) is False
    assert breaker.admit(clock.now()) is Admission.REJECT
    clock.advance(1)
    assert breaker.can_execute(clock.now()) is True
    second = admit_probe(breaker, clock.now())
    assert breaker.admit(clock.now()) is Admission.REJECT
    breaker.record_success(clock.now(), probe=second)
    assert breaker.state(clock.now()) is BreakerState.CLOSED


def test_case_8_a_stale_probe_never_settles_or_frees_the_new_probes_slot() -> None:
    # Issue #9, item 8: the first probe lost its slot to its lease; its outcome, whatever it is,
    # belongs to no probe any more.
    clock = FakeClock()
    breaker = CircuitBreaker("openai", "apikey", APIKEY, probe_timeout_ms=5_000)
    fail(breaker, clock.now(), 12)
    clock.advance(30_000)
    stale = admit_probe(breaker, clock.now())
    clock.advance(5_000)
    fresh = admit_probe(breaker, clock.now())
    assert fresh != stale
    breaker.release_probe(clock.now(), stale)
    breaker.record_success(clock.now(), probe=stale)
    breaker.record_failure(clock.now(), probe=stale)
    breaker.renew_probe(clock.now(), stale)
    assert breaker.state(clock.now()) is BreakerState.HALF_OPEN
    assert (breaker.failure_count, breaker.open_cycle_count) == (12, 1)
    assert breaker.admit(clock.now()) is Admission.REJECT  # the fresh probe still holds the slot
    breaker.record_failure(clock.now(), probe=fresh)
    assert (breaker.state(clock.now()), breaker.open_cycle_count) == (BreakerState.OPEN, 2)


def test_case_8_a_probe_that_shows_progress_keeps_its_slot_past_the_lease() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker("openai", "apikey", APIKEY, probe_timeout_ms=5_000)
    fail(breaker, clock.now(), 12)
    clock.advance(30_000)
    ticket = admit_probe(breaker, clock.now())
    breaker.hold_probe(ticket)  # waiting in our own queue: the lease does not run
    clock.advance(60_000)
    assert breaker.admit(clock.now()) is Admission.REJECT
    for _ in range(10):  # a stream: each chunk is a sign of life
        breaker.renew_probe(clock.now(), ticket)
        clock.advance(4_999)
        assert breaker.admit(clock.now()) is Admission.REJECT
    clock.advance(1)  # no sign of life for a whole lease: the slot is free again
    assert breaker.can_execute(clock.now()) is True


def test_case_9_late_failures_while_open_change_nothing() -> None:
    clock = FakeClock()
    events: list[Event] = []
    breaker = opened(clock, events)
    clock.advance(10_000)
    before = breaker.to_record()
    for _ in range(50):  # answers of requests sent before the breaker opened
        breaker.record_failure(clock.now())
        breaker.record_success(clock.now())
    assert breaker.retry_after_ms(clock.now()) == 20_000
    assert breaker.open_cycle_count == 1
    assert breaker.to_record() == before
    assert len(events) == 2
    clock.advance(20_000)
    assert breaker.state(clock.now()) is BreakerState.HALF_OPEN


def test_case_9_late_outcomes_while_half_open_change_nothing() -> None:
    clock = FakeClock()
    breaker = opened(clock)
    clock.advance(30_000)
    assert breaker.admit(clock.now()) is Admission.PROBE
    breaker.record_success(clock.now())  # not the probe: does not close
    breaker.record_failure(clock.now())  # not the probe: does not reopen
    assert breaker.state(clock.now()) is BreakerState.HALF_OPEN
    assert (breaker.failure_count, breaker.open_cycle_count) == (12, 1)
    assert breaker.admit(clock.now()) is Admission.REJECT  # the probe still holds the slot


def test_case_10_reset_one_provider_leaves_the_others() -> None:
    clock = FakeClock()
    events: list[Event] = []
    breakers = {name: make(name, events=events) for name in ("openai", "groq", "mistral")}
    fail(breakers["openai"], clock.now(), 12)
    fail(breakers["groq"], clock.now(), 12)
    fail(breakers["mistral"], clock.now(), 8)
    clock.advance(1_000)
    breakers["openai"].reset(clock.now())
    openai = breakers["openai"]
    assert openai.state(clock.now()) is BreakerState.CLOSED
    assert (openai.failure_count, openai.open_cycle_count, openai.retry_after_ms(clock.now())) == (0, 0, 0)
    assert openai.admit(clock.now()) is Admission.ALLOW
    assert events[-1] == Event(
        ts=START + 1_000, layer="breaker", key="openai", from_="OPEN", to="CLOSED", reason="operator"
    )
    assert breakers["groq"].state(clock.now()) is BreakerState.OPEN
    assert breakers["groq"].retry_after_ms(clock.now()) == 29_000
    assert breakers["mistral"].state(clock.now()) is BreakerState.DEGRADED
    assert breakers["mistral"].failure_count == 8


def test_case_10_reset_all_closes_every_breaker() -> None:
    clock = FakeClock()
    events: list[Event] = []
    breakers = [make(name, events=events) for name in ("a", "b", "c", "d")]
    fail(breakers[0], clock.now(), 12)
    fail(breakers[1], clock.now(), 12)
    clock.advance(30_000)
    assert breakers[1].admit(clock.now()) is Admission.PROBE  # b: HALF_OPEN with its probe out
    fail(breakers[2], clock.now(), 3)  # c: CLOSED with a count
    events.clear()
    for breaker in breakers:
        breaker.reset(clock.now())
    assert [b.state(clock.now()) for b in breakers] == [BreakerState.CLOSED] * 4
    assert [b.failure_count for b in breakers] == [0, 0, 0, 0]
    assert [b.open_cycle_count for b in breakers] == [0, 0, 0, 0]
    # a had expired unread: its lazy recovery is told first. d was already clean: nothing to say.
    assert [(e.key, e.from_, e.to, e.reason) for e in events] == [
        ("a", "OPEN", "HALF_OPEN", "timeout_elapsed"),
        ("a", "HALF_OPEN", "CLOSED", "operator"),
        ("b", "HALF_OPEN", "CLOSED", "operator"),
        ("c", "CLOSED", "CLOSED", "operator"),
    ]


def test_reset_frees_the_probe_slot_and_a_late_probe_verdict_counts_as_normal() -> None:
    clock = FakeClock()
    breaker = opened(clock)
    clock.advance(30_000)
    ticket = admit_probe(breaker, clock.now())
    breaker.reset(clock.now(), reason="operator")
    breaker.record_failure(clock.now(), probe=ticket)  # the probe answers after the reset
    assert (breaker.state(clock.now()), breaker.failure_count) == (BreakerState.CLOSED, 1)


def test_history_keeps_the_last_20_transitions() -> None:
    clock = FakeClock()
    breaker = make()
    for _ in range(15):  # each loop: CLOSED→DEGRADED→CLOSED = 2 transitions
        fail(breaker, clock.now(), 7)
        for _ in range(7):
            breaker.record_success(clock.now())
        clock.advance(1)
    assert len(breaker.history) == 20
    assert breaker.history.maxlen == 20
    assert breaker.history[-1] == Transition(
        START + 14, BreakerState.DEGRADED, BreakerState.CLOSED, "recovered"
    )
    assert breaker.history[0] == Transition(START + 5, BreakerState.CLOSED, BreakerState.DEGRADED, "failures")


def test_every_transition_is_an_event_and_a_history_entry() -> None:
    clock = FakeClock()
    events: list[Event] = []
    breaker = make(events=events)
    fail(breaker, clock.now(), 12)  # CLOSED→DEGRADED, DEGRADED→OPEN
    clock.advance(30_000)
    breaker.record_failure(clock.now(), probe=admit_probe(breaker, clock.now()))  # OPEN→HALF_OPEN→OPEN
    clock.advance(30_000)
    breaker.record_success(clock.now(), probe=admit_probe(breaker, clock.now()))  # OPEN→HALF_OPEN→CLOSED
    expected = [
        (START, "CLOSED", "DEGRADED", "failures"),
        (START, "DEGRADED", "OPEN", "failures"),
        (START + 30_000, "OPEN", "HALF_OPEN", "timeout_elapsed"),
        (START + 30_000, "HALF_OPEN", "OPEN", "probe_failed"),
        (START + 60_000, "OPEN", "HALF_OPEN", "timeout_elapsed"),
        (START + 60_000, "HALF_OPEN", "CLOSED", "probe_succeeded"),
    ]
    assert [(e.ts, e.from_, e.to, e.reason) for e in events] == expected
    assert {(e.layer, e.key, e.seq) for e in events} == {("breaker", "openai", 0)}
    assert [(t.ts, t.from_state.value, t.to_state.value, t.reason) for t in breaker.history] == expected
    assert breaker.last_transition_at == START + 60_000


def test_jumping_past_degraded_emits_one_transition() -> None:
    events: list[Event] = []
    breaker = make("ollama", "local", events=events)
    breaker.set_policy(BreakerPolicy(degradation_threshold=1, failure_threshold=1, reset_timeout_ms=1_000), 0)
    breaker.record_failure(0)
    assert [(e.from_, e.to) for e in events] == [("CLOSED", "OPEN")]


def test_set_policy_reevaluates_closed_and_degraded_at_once() -> None:
    clock = FakeClock()
    events: list[Event] = []
    breaker = make(events=events)
    fail(breaker, clock.now(), 5)
    assert breaker.state(clock.now()) is BreakerState.CLOSED
    clock.advance(1)
    breaker.set_policy(BreakerPolicy(4, 10, 30_000), clock.now())
    assert breaker.state(clock.now()) is BreakerState.DEGRADED
    clock.advance(1)
    breaker.set_policy(BreakerPolicy(6, 10, 30_000), clock.now())
    assert breaker.state(clock.now()) is BreakerState.CLOSED
    clock.advance(1)
    breaker.set_policy(BreakerPolicy(2, 5, 10_000), clock.now())
    assert breaker.state(clock.now()) is BreakerState.OPEN
    assert breaker.open_cycle_count == 1
    assert breaker.retry_after_ms(clock.now()) == 10_000
    assert [(e.ts, e.from_, e.to, e.reason) for e in events] == [
        (START + 1, "CLOSED", "DEGRADED", "policy_changed"),
        (START + 2, "DEGRADED", "CLOSED", "policy_changed"),
        (START + 3, "CLOSED", "OPEN", "policy_changed"),
    ]
    assert breaker.policy == BreakerPolicy(2, 5, 10_000)


def test_set_policy_recomputes_an_open_timeout_from_opened_at() -> None:
    clock = FakeClock()
    events: list[Event] = []
    breaker = opened(clock, events)
    clock.advance(10_000)
    breaker.set_policy(BreakerPolicy(7, 12, 60_000), clock.now())
    assert breaker.retry_after_ms(clock.now()) == 50_000
    breaker.set_policy(BreakerPolicy(7, 12, 5_000), clock.now())  # already elapsed
    assert (events[-1].to, events[-1].reason) == ("HALF_OPEN", "timeout_elapsed")
    assert breaker.admit(clock.now()) is Admission.PROBE


def test_to_api_shape_reads_through_lazy_recovery() -> None:
    clock = FakeClock()
    breaker = make()
    assert breaker_of(breaker, clock.now()).to_api() == {
        "provider": "openai",
        "class": "apikey",
        "state": "CLOSED",
        "failureCount": 0,
        "degradationThreshold": 7,
        "failureThreshold": 12,
        "retryAfterMs": 0,
        "openCycleCount": 0,
        "lastFailure": None,
        "lastTransition": None,
    }
    clock.advance(1_500)
    fail(breaker, clock.now(), 12)
    clock.advance(10_000.4)
    api = breaker_of(breaker, clock.now()).to_api()
    assert api["state"] == "OPEN"
    assert api["retryAfterMs"] == 20_000  # 19,999.6 rounded up, an int
    assert type(api["retryAfterMs"]) is int
    assert api["failureCount"] == 12
    assert api["openCycleCount"] == 1
    assert api["lastFailure"] == "2026-01-01T00:00:01.500Z"
    assert api["lastTransition"] == "2026-01-01T00:00:01.500Z"
    clock.advance(20_000)
    api = breaker_of(breaker, clock.now()).to_api()
    assert (api["state"], api["retryAfterMs"]) == ("HALF_OPEN", 0)
    assert api["lastTransition"] == "2026-01-01T00:00:31.500Z"
    json.dumps(api)


def test_record_round_trip_keeps_an_open_breaker_open_with_the_same_remaining_time() -> None:
    clock = FakeClock()
    breaker = opened(clock)
    for _ in range(3):  # reach cycle 4 (60 s)
        clock.advance(breaker.retry_after_ms(clock.now()))
        breaker.record_failure(clock.now(), probe=admit_probe(breaker, clock.now()))
    clock.advance(12_000)
    record = json.loads(json.dumps(breaker.to_record()))
    assert record == {
        "provider": "openai",
        "provider_class": "apikey",
        "state": "OPEN",
        "failure_count": 15,
        "open_cycle_count": 4,
        "opened_at": START + 90_000,
        "last_failure_at": START + 90_000,
        "last_transition_at": START + 90_000,
    }
    events: list[Event] = []
    restored = CircuitBreaker.from_record(record, APIKEY, emit=events.append)
    assert events == []
    assert restored.to_record() == breaker.to_record()
    assert restored.retry_after_ms(clock.now()) == 48_000
    assert breaker_of(restored, clock.now()).to_api() == breaker_of(breaker, clock.now()).to_api()
    clock.advance(48_000)
    assert restored.admit(clock.now()) is Admission.PROBE
    assert [(e.from_, e.to) for e in events] == [("OPEN", "HALF_OPEN")]


def test_record_round_trip_of_closed_and_half_open() -> None:
    clock = FakeClock()
    closed = make()
    fail(closed, clock.now(), 8)
    copy = CircuitBreaker.from_record(closed.to_record(), APIKEY)
    assert (copy.state(clock.now()), copy.failure_count) == (BreakerState.DEGRADED, 8)
    half = opened(clock)
    clock.advance(30_000)
    assert half.admit(clock.now()) is Admission.PROBE
    revived = CircuitBreaker.from_record(half.to_record(), APIKEY)
    assert revived.admit(clock.now()) is Admission.PROBE  # the dead process's probe slot is free


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"state": "AJAR"}, "unknown breaker state 'AJAR'"),
        ({"provider_class": "cloud"}, "unknown provider class 'cloud'"),
        ({"failure_count": -1}, "'failure_count' must be a non-negative integer, got -1"),
        ({"opened_at": "yesterday"}, "'opened_at' must be epoch ms or null, got 'yesterday'"),
        ({"state": "OPEN", "opened_at": None}, "an OPEN breaker record needs opened_at"),
    ],
)
def test_from_record_rejects_a_broken_record(change: dict[str, object], message: str) -> None:
    record = {**make().to_record(), **change}
    with pytest.raises(ValueError, match=message):
        CircuitBreaker.from_record(record, APIKEY)


def test_iso_formats_epoch_ms_as_utc_with_millis() -> None:
    assert iso(START) == "2026-01-01T00:00:00.000Z"
    assert iso(START - 1) == "2025-12-31T23:59:59.999Z"
    assert iso(START + 999.9) == "2026-01-01T00:00:00.999Z"
    assert iso(None) is None


@given(st.floats(min_value=0, max_value=4e12, allow_nan=False))
def test_epoch_ms_reads_back_what_iso_wrote(ms: float) -> None:
    """An attached console and the CLI read the API's instants back: to the millisecond."""
    assert epoch_ms(iso(ms)) == float(int(ms))


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "2026-01-01",
        "2026-01-01T00:00:00Z",
        "2026-13-01T00:00:00.000Z",
        "2026-01-01 00:00:00.000Z",
        "2026-01-01T00:00:00.+12Z",
        5,
    ],
)
def test_epoch_ms_refuses_what_iso_never_writes(text: object) -> None:
    assert epoch_ms(text) is None
