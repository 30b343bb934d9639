from __future__ import annotations

import pytest

from proxy.resilience.classify import ConnectionEffect, classify
from proxy.resilience.lockout import LockoutSettings
from proxy.resilience.outcome import Outcome
from proxy.resilience.restate import (
    BUILTIN_RULES,
    Restated,
    RestatementRule,
    restate,
    rule_from_config,
    rules_for,
)

QUOTA_BODY = '{"error": {"message": "用户额度不足, 剩余额度: $0.00", "type": "new_api_error"}}'


def test_case_29_agentrouter_403_quota_text_is_restated_to_429_with_retry_after_60s() -> None:
    rules = rules_for("agentrouter")
    restated = restate(403, QUOTA_BODY, rules)
    assert restated == Restated(status=429, retry_after_ms=60_000, rule_id="agentrouter-quota")
    # Classification then sees the 429 it means: a rate limit, not a forbidden model.
    verdict = classify(
        Outcome.http(restated.status, QUOTA_BODY), per_model_quota=False, lockout=LockoutSettings()
    )
    assert (verdict.reason, verdict.connection) == ("rate_limited", ConnectionEffect.COOLDOWN)


def test_case_29_no_access_text_stays_403() -> None:
    assert restate(403, "用户额度不足 无权访问", rules_for("agentrouter")) is None


def test_case_29_a_400_with_the_marker_is_restated_too() -> None:
    assert restate(400, "用户额度不足", rules_for("agentrouter")) == Restated(
        429, 60_000, "agentrouter-quota"
    )


def test_case_29_other_statuses_and_providers_are_untouched() -> None:
    assert restate(401, "用户额度不足", rules_for("agentrouter")) is None
    assert restate(403, "forbidden", rules_for("agentrouter")) is None
    assert rules_for("openai") == ()
    assert restate(403, "用户额度不足", rules_for("openai")) is None


def test_builtin_rules_are_read_only() -> None:
    with pytest.raises(TypeError):
        BUILTIN_RULES["openai"] = ()  # type: ignore[index]


def test_rules_for_puts_configured_rules_first_and_lets_them_replace_a_builtin() -> None:
    mine = RestatementRule(id="mine", from_statuses=(403,), to_status=503, markers=("额度不足",))
    assert rules_for("agentrouter", [mine]) == (mine, *BUILTIN_RULES["agentrouter"])
    assert restate(403, "用户额度不足", rules_for("agentrouter", [mine])) == Restated(503, None, "mine")

    replacement = RestatementRule(
        id="agentrouter-quota", from_statuses=(403,), to_status=429, markers=("quota",)
    )
    assert rules_for("agentrouter", [replacement]) == (replacement,)
    assert restate(403, "用户额度不足", rules_for("agentrouter", [replacement])) is None


def test_rules_for_matches_the_provider_id_case_insensitively() -> None:
    assert rules_for("AgentRouter") == BUILTIN_RULES["agentrouter"]


def test_markers_and_excludes_match_case_insensitively() -> None:
    rule = RestatementRule(
        id="r", from_statuses=(400,), to_status=429, markers=("Quota Exhausted",), exclude=("PERMANENT",)
    )
    assert restate(400, "error: QUOTA EXHAUSTED for today", [rule]) == Restated(429, None, "r")
    assert restate(400, "quota exhausted (permanent)", [rule]) is None


def test_first_matching_rule_wins() -> None:
    first = RestatementRule(id="first", from_statuses=(403,), to_status=429, markers=("x",))
    second = RestatementRule(id="second", from_statuses=(403,), to_status=503, markers=("x",))
    assert restate(403, "x", [first, second]) == Restated(429, None, "first")


def test_rule_from_config() -> None:
    rule = rule_from_config(
        {
            "id": "gw-quota",
            "from": [403, 400],
            "to": 429,
            "markers": ["quota exhausted"],
            "exclude": ["banned"],
            "retry_after_ms": 30_000,
        }
    )
    assert rule == RestatementRule(
        id="gw-quota",
        from_statuses=(403, 400),
        to_status=429,
        markers=("quota exhausted",),
        exclude=("banned",),
        retry_after_ms=30_000,
    )


def test_rule_from_config_accepts_lone_values_and_defaults() -> None:
    rule = rule_from_config({"id": "r", "from": 403, "to": 429, "markers": "quota"})
    assert rule == RestatementRule(id="r", from_statuses=(403,), to_status=429, markers=("quota",))


GOOD: dict[str, object] = {"id": "r", "from": [403], "to": 429, "markers": ["quota"]}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"id": None}, "restatement rule: 'id' must be a non-empty string, got None"),
        ({"id": "  "}, "'id' must be a non-empty string"),
        ({"retry_after": 5}, "restatement rule 'r': unknown key\\(s\\) retry_after"),
        ({"from": []}, "'from' must list at least one status"),
        ({"from": [700]}, "'from' must hold HTTP statuses from 100 to 599, got 700"),
        ({"from": ["403"]}, "'from' must hold HTTP statuses from 100 to 599, got '403'"),
        ({"from": [True]}, "'from' must hold HTTP statuses"),
        ({"to": 99}, "'to' must be an error status from 400 to 599, got 99"),
        # (1xx, 204 and 304 cannot carry the upstream's body; a 2xx or 3xx is no error to restate.)
        ({"to": 101}, "'to' must be an error status from 400 to 599, got 101"),
        ({"to": 200}, "'to' must be an error status from 400 to 599, got 200"),
        ({"to": 204}, "'to' must be an error status from 400 to 599, got 204"),
        ({"to": 304}, "'to' must be an error status from 400 to 599, got 304"),
        ({"to": 600}, "'to' must be an error status from 400 to 599, got 600"),
        ({"markers": []}, "'markers' must list at least one text"),
        ({"markers": [""]}, "'markers' must hold non-empty strings"),
        ({"markers": [1]}, "'markers' must hold non-empty strings, got 1"),
        ({"exclude": [None]}, "'exclude' must hold non-empty strings, got None"),
        ({"retry_after_ms": -1}, "'retry_after_ms' must be whole ms from 0 to 86400000, got -1"),
        ({"retry_after_ms": "60s"}, "'retry_after_ms' must be whole ms"),
        ({"retry_after_ms": True}, "'retry_after_ms' must be whole ms"),
    ],
)
def test_rule_from_config_rejects_bad_input(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rule_from_config({**GOOD, **change})


@pytest.mark.parametrize("missing", ["from", "to", "markers"])
def test_rule_from_config_requires_from_to_and_markers(missing: str) -> None:
    data = {k: v for k, v in GOOD.items() if k != missing}
    with pytest.raises(ValueError, match=f"restatement rule 'r': '{missing}' is required"):
        rule_from_config(data)


def test_rule_from_config_rejects_a_non_table() -> None:
    with pytest.raises(ValueError, match="a restatement rule must be a table, got list"):
        rule_from_config([1, 2])  # type: ignore[arg-type]
