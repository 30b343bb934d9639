from __future__ import annotations

import pytest

from proxy.resilience.classify import (
    BreakerEffect,
    ConnectionEffect,
    LockoutEffect,
    Verdict,
    classify,
)
from proxy.resilience.lockout import LockoutSettings
from proxy.resilience.outcome import Outcome

GOOGLE_PER_MINUTE = (
    "Quota exceeded for quota metric 'Generate Content API requests per minute' and limit "
    "'GenerateContent request limit per minute for a region' of service "
    "'generativelanguage.googleapis.com' for consumer 'project_number:123'."
)
GEMINI_FREE_TIER = (
    "You exceeded your current quota, please check your plan and billing details. For more information "
    "on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits. * Quota exceeded for "
    "metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 15, model: "
    "gemini-2.0-flash. Please retry in 37.5s."
)

ON = LockoutSettings(enabled=True)
OFF = LockoutSettings()

B, C, L = BreakerEffect, ConnectionEffect, LockoutEffect

# (id, outcome, per_model_quota, lockout settings, expected verdict), in the order of the table in
# docs/resilience.md#classification-of-an-outcome.
ROWS = [
    ("200", Outcome.ok(), False, ON, Verdict(B.SUCCESS, C.CLEAR, L.DECAY, False, "ok", False)),
    ("204", Outcome.ok(204), False, OFF, Verdict(B.SUCCESS, C.CLEAR, L.DECAY, False, "ok", False)),
    # network error, 408, 500, 502, 503, 504
    (
        "network",
        Outcome.network(),
        False,
        ON,
        Verdict(B.FAILURE, C.COOLDOWN, L.LOCK, True, "network_error", True),
    ),
    (
        "network-off",
        Outcome.network(),
        False,
        OFF,
        Verdict(B.FAILURE, C.COOLDOWN, L.NONE, True, "network_error", True),
    ),
    ("stall", Outcome.stall(), False, ON, Verdict(B.FAILURE, C.COOLDOWN, L.LOCK, True, "stall", True)),
    (
        "stall-502-not-listed",
        Outcome.stall(),
        False,
        LockoutSettings(enabled=True, error_codes=(404,)),
        Verdict(B.FAILURE, C.COOLDOWN, L.NONE, True, "stall", True),
    ),
    ("408", Outcome.http(408), False, ON, Verdict(B.FAILURE, C.COOLDOWN, L.NONE, True, "timeout", True)),
    (
        "408-listed",
        Outcome.http(408),
        False,
        LockoutSettings(enabled=True, error_codes=(408,)),
        Verdict(B.FAILURE, C.COOLDOWN, L.LOCK, True, "timeout", True),
    ),
    ("500", Outcome.http(500), False, ON, Verdict(B.FAILURE, C.COOLDOWN, L.NONE, True, "server_error", True)),
    ("502", Outcome.http(502), False, ON, Verdict(B.FAILURE, C.COOLDOWN, L.LOCK, True, "server_error", True)),
    ("503", Outcome.http(503), False, ON, Verdict(B.FAILURE, C.COOLDOWN, L.LOCK, True, "server_error", True)),
    (
        "503-off",
        Outcome.http(503),
        False,
        OFF,
        Verdict(B.FAILURE, C.COOLDOWN, L.NONE, True, "server_error", True),
    ),
    ("504", Outcome.http(504), True, ON, Verdict(B.FAILURE, C.COOLDOWN, L.LOCK, True, "server_error", True)),
    # 401/403/429/402 with banned text
    (
        "401-deactivated",
        Outcome.http(401, "Your account has been deactivated"),
        False,
        ON,
        Verdict(B.NONE, C.BANNED, L.NONE, True, "banned", False),
    ),
    (
        "403-suspended-any-case",
        Outcome.http(403, '{"error": "This Account Has Been SUSPENDED"}'),
        False,
        ON,
        Verdict(B.NONE, C.BANNED, L.NONE, True, "banned", False),
    ),
    (
        "429-banned",
        Outcome.http(429, "account banned"),
        True,
        ON,
        Verdict(B.NONE, C.BANNED, L.NONE, True, "banned", False),
    ),
    (
        "402-disabled",
        Outcome.http(402, "account disabled"),
        False,
        ON,
        Verdict(B.NONE, C.BANNED, L.NONE, True, "banned", False),
    ),
    # 402, or 403/429 with credit/quota-exhausted text
    (
        "402",
        Outcome.http(402),
        False,
        ON,
        Verdict(B.NONE, C.CREDITS_EXHAUSTED, L.NONE, True, "credits_exhausted", False),
    ),
    (
        "403-insufficient-quota",
        Outcome.http(403, '{"error": {"code": "insufficient_quota"}}'),
        False,
        ON,
        Verdict(B.NONE, C.CREDITS_EXHAUSTED, L.NONE, True, "credits_exhausted", False),
    ),
    (
        "429-exceeded-quota-per-model",
        Outcome.http(429, "You exceeded your current quota, please check your plan"),
        True,
        ON,
        Verdict(B.NONE, C.CREDITS_EXHAUSTED, L.NONE, True, "credits_exhausted", False),
    ),
    (
        "429-openai-insufficient-quota",
        Outcome.http(
            429,
            "You exceeded your current quota, please check your plan and billing details. For more "
            "information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes",
        ),
        False,
        OFF,
        Verdict(B.NONE, C.CREDITS_EXHAUSTED, L.NONE, True, "credits_exhausted", False),
    ),
    (
        "403-anthropic-credit-balance",
        Outcome.http(403, "Your credit balance is too low to access the Anthropic API."),
        False,
        ON,
        Verdict(B.NONE, C.CREDITS_EXHAUSTED, L.NONE, True, "credits_exhausted", False),
    ),
    # ...but a rate quota is never terminal, whatever else the text says (issue #9, item 3)
    (
        "429-google-per-minute-quota",
        Outcome.http(429, GOOGLE_PER_MINUTE),
        False,
        ON,
        Verdict(B.NONE, C.COOLDOWN, L.LOCK, True, "rate_limited", True),
    ),
    (
        "429-gemini-free-tier-per-minute",
        Outcome.http(429, GEMINI_FREE_TIER),
        False,
        OFF,
        Verdict(B.NONE, C.COOLDOWN, L.NONE, True, "rate_limited", True),
    ),
    (
        "429-google-per-day-quota-per-model",
        Outcome.http(429, "Quota exceeded for quota metric 'Requests per day' of service 'x'"),
        True,
        OFF,
        Verdict(B.NONE, C.NONE, L.LOCK, True, "rate_limited", True),
    ),
    (
        "429-tokens-per-min",
        Outcome.http(429, "Rate limit reached for gpt-4o on tokens per min (TPM): Limit 30000."),
        False,
        OFF,
        Verdict(B.NONE, C.COOLDOWN, L.NONE, True, "rate_limited", True),
    ),
    (
        "403-quota-exceeded-per-minute",
        Outcome.http(403, "Quota exceeded: requests per minute per project"),
        False,
        ON,
        Verdict(B.NONE, C.NONE, L.LOCK, True, "forbidden", True),
    ),
    (
        "429-billing-word-alone",
        Outcome.http(429, "Too many requests; see billing and usage limits"),
        False,
        OFF,
        Verdict(B.NONE, C.COOLDOWN, L.NONE, True, "rate_limited", True),
    ),
    # 401, or 403 with invalid-key text
    ("401", Outcome.http(401), False, ON, Verdict(B.NONE, C.EXPIRED, L.NONE, True, "expired", False)),
    (
        "401-credit-text-is-still-expired",
        Outcome.http(401, "insufficient_quota"),
        False,
        ON,
        Verdict(B.NONE, C.EXPIRED, L.NONE, True, "expired", False),
    ),
    (
        "403-invalid-key",
        Outcome.http(403, "Invalid API key provided: sk-****"),
        False,
        ON,
        Verdict(B.NONE, C.EXPIRED, L.NONE, True, "expired", False),
    ),
    (
        "403-unauthorized",
        Outcome.http(403, '{"error": "Unauthorized"}'),
        False,
        ON,
        Verdict(B.NONE, C.EXPIRED, L.NONE, True, "expired", False),
    ),
    # ...but a text about access to one model is a model-level 403, never an expired key
    (
        "403-unauthorized-for-one-model",
        Outcome.http(403, "Unauthorized: you do not have access to model gpt-4o"),
        False,
        ON,
        Verdict(B.NONE, C.NONE, L.LOCK, True, "forbidden", True),
    ),
    (
        "403-project-has-no-access-to-model",
        Outcome.http(403, "Project proj_1 does not have access to model `o3`; invalid api key scope"),
        False,
        ON,
        Verdict(B.NONE, C.NONE, L.LOCK, True, "forbidden", True),
    ),
    (
        "403-not-authorized-to-access-model",
        Outcome.http(403, "unauthorized: not authorized to access model claude-opus"),
        False,
        OFF,
        Verdict(B.NONE, C.NONE, L.NONE, True, "forbidden", True),
    ),
    (
        "429-invalid-key-text-is-a-rate-limit",
        Outcome.http(429, "unauthorized"),
        False,
        ON,
        Verdict(B.NONE, C.COOLDOWN, L.LOCK, True, "rate_limited", True),
    ),
    # 429 on a per-model-quota provider: locks even when 429 is not listed, or lockout is off
    (
        "429-per-model",
        Outcome.http(429),
        True,
        ON,
        Verdict(B.NONE, C.NONE, L.LOCK, True, "rate_limited", True),
    ),
    (
        "429-per-model-off",
        Outcome.http(429),
        True,
        OFF,
        Verdict(B.NONE, C.NONE, L.LOCK, True, "rate_limited", True),
    ),
    (
        "429-per-model-not-listed",
        Outcome.http(429),
        True,
        LockoutSettings(enabled=True, error_codes=(404,)),
        Verdict(B.NONE, C.NONE, L.LOCK, True, "rate_limited", True),
    ),
    # 429
    ("429", Outcome.http(429), False, ON, Verdict(B.NONE, C.COOLDOWN, L.LOCK, True, "rate_limited", True)),
    (
        "429-off",
        Outcome.http(429),
        False,
        OFF,
        Verdict(B.NONE, C.COOLDOWN, L.NONE, True, "rate_limited", True),
    ),
    # 403 (other), 404
    (
        "403",
        Outcome.http(403, "forbidden"),
        False,
        ON,
        Verdict(B.NONE, C.NONE, L.LOCK, True, "forbidden", True),
    ),
    ("403-off", Outcome.http(403), False, OFF, Verdict(B.NONE, C.NONE, L.NONE, True, "forbidden", True)),
    ("404", Outcome.http(404), False, ON, Verdict(B.NONE, C.NONE, L.LOCK, True, "not_found", False)),
    ("404-off", Outcome.http(404), False, OFF, Verdict(B.NONE, C.NONE, L.NONE, True, "not_found", False)),
    (
        "404-not-listed",
        Outcome.http(404),
        False,
        LockoutSettings(enabled=True, error_codes=(503,)),
        Verdict(B.NONE, C.NONE, L.NONE, True, "not_found", False),
    ),
    # 400/422 saying the model does not exist, or the context length is exceeded
    (
        "400-model-does-not-exist",
        Outcome.http(400, "The model `gpt-9` does not exist"),
        False,
        ON,
        Verdict(B.NONE, C.NONE, L.NONE, True, "model_not_found", False),
    ),
    (
        "422-model-not-found",
        Outcome.http(422, '{"error": {"code": "model_not_found"}}'),
        False,
        ON,
        Verdict(B.NONE, C.NONE, L.NONE, True, "model_not_found", False),
    ),
    (
        "400-context-length",
        Outcome.http(400, "This model's Maximum Context length is 8192 tokens"),
        False,
        ON,
        Verdict(B.NONE, C.NONE, L.NONE, True, "context_length", False),
    ),
    (
        "422-too-many-tokens",
        Outcome.http(422, "too many tokens in prompt"),
        False,
        ON,
        Verdict(B.NONE, C.NONE, L.NONE, True, "context_length", False),
    ),
    (
        # Anthropic's words for it (what Claude Code gets when its conversation outgrew the model)
        "400-anthropic-prompt-too-long",
        Outcome.http(
            400,
            '{"type": "error", "error": {"type": "invalid_request_error",'
            ' "message": "prompt is too long: 210000 tokens > 200000 maximum"}}',
        ),
        False,
        ON,
        Verdict(B.NONE, C.NONE, L.NONE, True, "context_length", False),
    ),
    (
        "400-llama-cpp-context-size",  # llama.cpp's server
        Outcome.http(
            400, '{"error": {"message": "the request exceeds the available context size, try increasing it"}}'
        ),
        False,
        ON,
        Verdict(B.NONE, C.NONE, L.NONE, True, "context_length", False),
    ),
    # any other 4xx: back to the client as it is
    (
        "400",
        Outcome.http(400, "invalid JSON"),
        False,
        ON,
        Verdict(B.NONE, C.NONE, L.NONE, False, "client_error", False),
    ),
    ("409", Outcome.http(409), False, ON, Verdict(B.NONE, C.NONE, L.NONE, False, "client_error", False)),
    (
        "413-model-text-is-not-400",
        Outcome.http(413, "model not found"),
        False,
        ON,
        Verdict(B.NONE, C.NONE, L.NONE, False, "client_error", False),
    ),
    # local queue full / execution timeout / client disconnect
    (
        "local",
        Outcome.local("RATE_LIMIT_QUEUE_FULL"),
        True,
        ON,
        Verdict(B.NONE, C.NONE, L.NONE, False, "local_rejection", False),
    ),
    (
        "disconnect",
        Outcome.disconnect(),
        True,
        ON,
        Verdict(B.NONE, C.NONE, L.NONE, False, "client_disconnect", False),
    ),
    # outside the table (decisions noted in classify.py)
    ("501", Outcome.http(501), False, ON, Verdict(B.NONE, C.NONE, L.NONE, True, "server_error", True)),
    # 529 is Anthropic's overloaded_error: like 503, a breaker failure and a cooldown; locks if listed
    ("529", Outcome.http(529), False, ON, Verdict(B.FAILURE, C.COOLDOWN, L.NONE, True, "server_error", True)),
    (
        "529-listed",
        Outcome.http(529),
        False,
        LockoutSettings(enabled=True, error_codes=(529,)),
        Verdict(B.FAILURE, C.COOLDOWN, L.LOCK, True, "server_error", True),
    ),
    ("302", Outcome.http(302), False, ON, Verdict(B.NONE, C.NONE, L.NONE, False, "unexpected_status", False)),
]


@pytest.mark.parametrize(
    ("outcome", "per_model_quota", "settings", "expected"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_classification_table(
    outcome: Outcome, per_model_quota: bool, settings: LockoutSettings, expected: Verdict
) -> None:
    assert classify(outcome, per_model_quota=per_model_quota, lockout=settings) == expected


def test_case_21_429_on_a_per_model_quota_provider_locks_the_model_not_the_connection() -> None:
    local = classify(Outcome.http(429), per_model_quota=True, lockout=OFF)
    assert (local.connection, local.lockout, local.fallback) == (C.NONE, L.LOCK, True)
    apikey = classify(Outcome.http(429), per_model_quota=False, lockout=OFF)
    assert (apikey.connection, apikey.lockout, apikey.fallback) == (C.COOLDOWN, L.NONE, True)


def test_listed_but_disabled_lockout_never_locks() -> None:
    settings = LockoutSettings(enabled=False, error_codes=(403, 404, 429, 502, 503, 504))
    for outcome in (
        Outcome.http(404),
        Outcome.http(403),
        Outcome.http(503),
        Outcome.http(429),
        Outcome.network(),
    ):
        assert classify(outcome, per_model_quota=False, lockout=settings).lockout is LockoutEffect.NONE


def test_no_429_or_4xx_ever_counts_against_the_breaker() -> None:
    for status in (400, 401, 402, 403, 404, 409, 413, 422, 429):
        for per_model_quota in (False, True):
            verdict = classify(Outcome.http(status), per_model_quota=per_model_quota, lockout=ON)
            assert verdict.breaker is BreakerEffect.NONE, status
