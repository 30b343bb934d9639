from __future__ import annotations

import pytest

from proxy.resilience.clock import FakeClock
from proxy.resilience.hints import MAX_HINT_MS, parse_retry_hint

NOW = FakeClock().now()  # 2026-01-01T00:00:00Z = 1_767_225_600_000 ms
NOW_S = int(NOW // 1000)
DAY_MS = 86_400_000.0


def test_max_hint_is_24_hours() -> None:
    assert MAX_HINT_MS == DAY_MS


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        # retry-after-ms: milliseconds, float text allowed
        ({"retry-after-ms": "1500"}, 1500.0),
        ({"retry-after-ms": "250.5"}, 250.5),
        ({"retry-after-ms": " 0 "}, 0.0),
        # retry-after: seconds (integer or float) ...
        ({"retry-after": "120"}, 120_000.0),
        ({"retry-after": "1.5"}, 1500.0),
        # ... or an HTTP date in any of the three RFC 9110 forms
        ({"retry-after": "Thu, 01 Jan 2026 00:02:00 GMT"}, 120_000.0),
        ({"retry-after": "Thursday, 01-Jan-26 00:02:00 GMT"}, 120_000.0),
        ({"retry-after": "Thu Jan  1 00:02:00 2026"}, 120_000.0),
        ({"retry-after": "Wed, 31 Dec 2025 23:00:00 GMT"}, 0.0),  # a past date means "now"
        # x-ratelimit-reset-requests / -tokens: Go durations, or a bare number of seconds
        ({"x-ratelimit-reset-requests": "1s"}, 1000.0),
        ({"x-ratelimit-reset-requests": "6m0s"}, 360_000.0),
        ({"x-ratelimit-reset-requests": "250ms"}, 250.0),
        ({"x-ratelimit-reset-requests": "1h2m3.5s"}, 3_723_500.0),
        ({"x-ratelimit-reset-requests": "1.5"}, 1500.0),
        ({"x-ratelimit-reset-requests": "500us"}, 0.5),
        ({"x-ratelimit-reset-tokens": "30s"}, 30_000.0),
        ({"x-ratelimit-reset-tokens": "2m59.56s"}, 179_560.0),
        ({"x-ratelimit-reset-tokens": "7"}, 7000.0),
        # x-ratelimit-reset: epoch seconds, or epoch ms above 1e10
        ({"x-ratelimit-reset": str(NOW_S + 90)}, 90_000.0),
        ({"x-ratelimit-reset": f"{NOW_S}.5"}, 500.0),
        ({"x-ratelimit-reset": str(int(NOW) + 90_000)}, 90_000.0),
        ({"x-ratelimit-reset": str(NOW_S - 10)}, 0.0),
        ({"x-ratelimit-reset": str(int(NOW) - 10_000)}, 0.0),
        # too small to be a current epoch: read as seconds until the reset
        ({"x-ratelimit-reset": "60"}, 60_000.0),
        # Anthropic's resets: RFC 3339 times, in any of its four names
        ({"anthropic-ratelimit-requests-reset": "2026-01-01T00:00:42Z"}, 42_000.0),
        ({"anthropic-ratelimit-tokens-reset": "2026-01-01T00:01:00.500Z"}, 60_500.0),
        ({"anthropic-ratelimit-input-tokens-reset": "2026-01-01T01:00:05+01:00"}, 5_000.0),
        ({"anthropic-ratelimit-output-tokens-reset": "2026-01-01T00:00:07z"}, 7_000.0),
        ({"anthropic-ratelimit-requests-reset": "2025-12-31T23:59:00Z"}, 0.0),  # passed: no wait
    ],
)
def test_header_forms(headers: dict[str, str], expected: float) -> None:
    assert parse_retry_hint(headers, "", NOW) == expected


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after-ms": "1500", "retry-after": "120"}, 1500.0),
        ({"retry-after": "120", "x-ratelimit-reset-requests": "1s"}, 120_000.0),
        ({"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "9s"}, 1000.0),
        ({"x-ratelimit-reset-tokens": "9s", "x-ratelimit-reset": str(NOW_S + 90)}, 9000.0),
        (
            {
                "x-ratelimit-reset": str(NOW_S + 90),
                "x-ratelimit-reset-tokens": "9s",
                "x-ratelimit-reset-requests": "2s",
                "retry-after": "4",
                "retry-after-ms": "5",
            },
            5.0,
        ),
    ],
)
def test_first_found_wins(headers: dict[str, str], expected: float) -> None:
    assert parse_retry_hint(headers, "", NOW) == expected


def test_a_standard_hint_comes_before_anthropics_reset() -> None:
    headers = {"retry-after": "5", "anthropic-ratelimit-requests-reset": "2026-01-01T00:01:00Z"}
    assert parse_retry_hint(headers, "", NOW) == 5000.0


def test_a_header_beats_the_body() -> None:
    assert parse_retry_hint({"retry-after": "3"}, "Please try again in 20s.", NOW) == 3000.0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        # each unparsable or negative value is skipped and the next form answers
        ({"retry-after-ms": "soon", "retry-after": "7"}, 7000.0),
        ({"retry-after-ms": "-5", "retry-after": "7"}, 7000.0),
        ({"retry-after-ms": "nan", "retry-after": "7"}, 7000.0),
        ({"retry-after-ms": "inf", "retry-after": "7"}, 7000.0),
        ({"retry-after": "-120", "x-ratelimit-reset-requests": "2s"}, 2000.0),
        ({"retry-after": "tomorrow", "x-ratelimit-reset-requests": "2s"}, 2000.0),
        ({"retry-after": "1_000", "x-ratelimit-reset-requests": "2s"}, 2000.0),
        ({"x-ratelimit-reset-requests": "abc", "x-ratelimit-reset-tokens": "2s"}, 2000.0),
        ({"x-ratelimit-reset-requests": "-1s", "x-ratelimit-reset-tokens": "2s"}, 2000.0),
        ({"x-ratelimit-reset-requests": "1x", "x-ratelimit-reset-tokens": "2s"}, 2000.0),
        ({"x-ratelimit-reset-requests": "s", "x-ratelimit-reset-tokens": "2s"}, 2000.0),
        ({"x-ratelimit-reset-tokens": "", "x-ratelimit-reset": str(NOW_S + 4)}, 4000.0),
        (
            {"x-ratelimit-reset": "never", "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:03Z"},
            3000.0,
        ),
        (
            {
                "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:03",  # no offset: not RFC 3339
                "anthropic-ratelimit-tokens-reset": "2026-01-01T00:00:04Z",
            },
            4000.0,
        ),
    ],
)
def test_garbage_falls_through_to_the_next_form(headers: dict[str, str], expected: float) -> None:
    assert parse_retry_hint(headers, "", NOW) == expected


@pytest.mark.parametrize(
    "headers",
    [
        {"retry-after-ms": "soon"},
        {"retry-after": "-1"},
        {"retry-after": ""},
        {"x-ratelimit-reset-requests": "forever"},
        {"x-ratelimit-reset": "-5"},
        {"x-ratelimit-reset": "next tuesday"},
        {"anthropic-ratelimit-requests-reset": "soon"},
        {"anthropic-ratelimit-requests-reset": "2026-13-01T00:00:00Z"},
        {"anthropic-ratelimit-tokens-reset": "42"},
    ],
)
def test_garbage_alone_gives_none(headers: dict[str, str]) -> None:
    assert parse_retry_hint(headers, "", NOW) is None


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("Rate limit reached. Please try again in 20s.", 20_000.0),
        ("try again in 1.5 seconds", 1500.0),
        ("Too many requests, retry after 30 seconds", 30_000.0),
        ("retry after 30s", 30_000.0),
        ("Your quota resets in 2h7m23s", 7_643_000.0),
        ("please retry in 250ms", 250.0),
        ("retry in 2 minutes", 120_000.0),
        ("TRY AGAIN IN 20S", 20_000.0),
        ("Please Retry After 5 Secs", 5000.0),
        ("try again in 1 sec", 1000.0),
        ("try again in 3 min", 180_000.0),
        ("try again in 3 mins", 180_000.0),
        ("try again in 1m30.5s", 90_500.0),
        ("retry in 1 hour", 3_600_000.0),
        ("retry in 2 hours", 7_200_000.0),
        ("retry in 1h", 3_600_000.0),
        ("retry in 5 minutes 30 seconds", 330_000.0),
        ("the limit will reset in 45s", 45_000.0),
        ('{"error":{"message":"Rate limit reached for gpt-4o. Please try again in 6ms.","code":null}}', 6.0),
        ("Resource exhausted. Please retry in 57.3s.", 57_300.0),
    ],
)
def test_body_phrases(body: str, expected: float) -> None:
    assert parse_retry_hint({}, body, NOW) == pytest.approx(expected)


@pytest.mark.parametrize(
    "body",
    [
        "internal server error",
        "retry after 30",  # no unit: ambiguous, ignored
        "try again in 2 months",  # not a unit we know
        "try again later",
        "<html><body>502 Bad Gateway</body></html>",
    ],
)
def test_body_without_a_hint_gives_none(body: str) -> None:
    assert parse_retry_hint({}, body, NOW) is None


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({"retry-after-ms": "90000000"}, ""),
        ({"retry-after": "172800"}, ""),
        ({"retry-after": "Fri, 01 Jan 2027 00:00:00 GMT"}, ""),
        ({"x-ratelimit-reset-tokens": "48h"}, ""),
        ({"x-ratelimit-reset": str(NOW_S + 3 * 86_400)}, ""),
        ({"retry-after": "9" * 400}, ""),
        ({}, "try again in 30 hours"),
    ],
)
def test_capped_at_24_hours(headers: dict[str, str], body: str) -> None:
    assert parse_retry_hint(headers, body, NOW) == DAY_MS


def test_no_headers_and_no_body_gives_none() -> None:
    assert parse_retry_hint({}, "", NOW) is None


def test_unrelated_headers_give_none() -> None:
    headers = {"content-type": "application/json", "x-request-id": "abc", "x-ratelimit-limit-requests": "60"}
    assert parse_retry_hint(headers, '{"error": "overloaded"}', NOW) is None
