"""`since_operator`: what a replica that was away keeps of its own records when an operator reset
or re-enabled them in Redis meanwhile (docs/fleet.md#reconcile). The rule with real replicas:
tests/fleet/test_redis_away.py."""

from __future__ import annotations

from proxy.fleet.merge import since_operator

RESET_AT = 1_000.0


def test_a_cooldown_decided_before_the_reset_is_cleared_but_a_disable_is_kept() -> None:
    local = {"enabled": False, "rate_limited_until": 61_000.0, "backoff_level": 1, "last_error_at": 900.0}
    remote = {"enabled": True, "rate_limited_until": None, "backoff_level": 0, "last_error_at": None}
    assert since_operator("c", local, remote, RESET_AT) == {**remote, "enabled": False}


def test_what_was_decided_after_the_action_or_without_one_stands() -> None:
    later = {"enabled": True, "rate_limited_until": 61_100.0, "last_error_at": 1_100.0}
    remote = {"enabled": True, "rate_limited_until": None, "last_error_at": None}
    assert since_operator("c", later, remote, RESET_AT) is later
    assert since_operator("c", later, remote, None) is later
    unerring = {"enabled": False, "last_error_at": None}  # only the operator's switch changed here
    assert since_operator("c", unerring, remote, RESET_AT) is unerring


def test_a_lockout_from_before_a_reenable_is_gone_and_a_breakers_failures_before_a_reset() -> None:
    lock = {"expires_at": 5_000.0, "failure_count": 2, "last_failure_at": 999.0}
    assert since_operator("l", lock, None, RESET_AT) is None
    breaker = {"state": "OPEN", "failure_count": 9, "last_failure_at": 950.0, "last_transition_at": 1_500.0}
    closed = {"state": "CLOSED", "failure_count": 0, "last_failure_at": None}
    # (its transition after the reset is its own lazy recovery, which decides nothing)
    assert since_operator("b", breaker, closed, RESET_AT) is closed
