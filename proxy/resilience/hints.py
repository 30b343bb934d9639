"""Upstream retry hints: how long an upstream asked us to wait, in milliseconds.

Forms, first found wins (docs/resilience.md#connection-cooldown): `retry-after-ms`, `retry-after`
(seconds or an HTTP date), `x-ratelimit-reset-requests` / `x-ratelimit-reset-tokens` (Go durations such as
"6m0s"), `x-ratelimit-reset` (an epoch), Anthropic's `anthropic-ratelimit-{requests,tokens,input-tokens,
output-tokens}-reset` (RFC 3339 times), then phrases in the error body ("try again in 20s").
A value that is negative or does not parse is skipped so the next form still gets its chance.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

MAX_HINT_MS: float = 24 * 3600 * 1000

# Go's time.Duration.String() units; "ms" must come before "m" and "s".
_GO_PART = r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)"
_GO_DURATION = re.compile(rf"(?:{_GO_PART})+")
_GO_PARTS = re.compile(_GO_PART)
_GO_UNIT_MS = {
    "ns": 1e-6,
    "us": 1e-3,
    "µs": 1e-3,
    "μs": 1e-3,
    "ms": 1.0,
    "s": 1000.0,
    "m": 60_000.0,
    "h": 3_600_000.0,
}

# Human units in body text; longest spellings first so "ms" is never read as "m" + "s".
_BODY_UNIT = r"(?:milliseconds?|msecs?|ms|seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h)(?![a-z])"
_BODY_PART = rf"(\d+(?:\.\d+)?)\s*({_BODY_UNIT})"
_BODY_HINT = re.compile(
    rf"\b(?:try again|retry|resets?)\s+(?:in|after)\s+((?:\d+(?:\.\d+)?\s*{_BODY_UNIT}\s*)+)", re.IGNORECASE
)
_BODY_PARTS = re.compile(_BODY_PART, re.IGNORECASE)
# Error bodies are short; a huge HTML page is not worth scanning to the end.
_BODY_SCAN_LIMIT = 8192

# `x-ratelimit-reset` is an epoch in seconds, or in milliseconds above this value (year 2286 in seconds).
_EPOCH_MS_THRESHOLD = 1e10
# Below this (2001-09-09 as epoch seconds) the value cannot be a current epoch: some upstreams send
# "seconds until reset" in this header, so it is read as a relative wait rather than as a past date.
_EPOCH_S_FLOOR = 1e9


def parse_retry_hint(headers: Mapping[str, str], body: str, now: float) -> float | None:
    """Milliseconds to wait that the upstream asked for, first found wins, capped at 24 h; None when none.

    headers have lower-case names. now = epoch ms (for the HTTP-date and epoch forms).
    """
    if not headers and not body:
        return None
    if headers:
        hint = _from_headers(headers, now)
        if hint is not None:
            return min(hint, MAX_HINT_MS)
    if body:
        hint = _from_body(body)
        if hint is not None:
            return min(hint, MAX_HINT_MS)
    return None


def _from_headers(headers: Mapping[str, str], now: float) -> float | None:
    value = headers.get("retry-after-ms")
    if value is not None:
        millis = _number(value)
        if millis is not None:
            return millis
    value = headers.get("retry-after")
    if value is not None:
        hint = _retry_after(value, now)
        if hint is not None:
            return hint
    for name in ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"):
        value = headers.get(name)
        if value is not None:
            hint = _go_duration(value)
            if hint is not None:
                return hint
    value = headers.get("x-ratelimit-reset")
    if value is not None:
        hint = _epoch_reset(value, now)
        if hint is not None:
            return hint
    for name in _ANTHROPIC_RESETS:
        value = headers.get(name)
        if value is not None:
            hint = _rfc3339(value, now)
            if hint is not None:
                return hint
    return None


_ANTHROPIC_RESETS = (
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-reset",
)


def _rfc3339(value: str, now: float) -> float | None:
    """Milliseconds until an RFC 3339 time ("2026-12-01T06:30:00Z"); None when it is not one."""
    text = value.strip()
    if not 20 <= len(text) <= 40 or text[4:5] != "-" or text[10:11] not in ("T", "t", " "):
        return None
    try:
        when = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1] in "Zz" else text)
    except ValueError:
        return None
    if when.tzinfo is None:  # RFC 3339 always names the offset; a bare local time is not one
        return None
    return max(0.0, when.timestamp() * 1000.0 - now)


def _number(text: str) -> float | None:
    """A plain non-negative decimal ("120", "1.5", ".5"); float() alone would also take "nan",
    "inf", "1e3", "1_0" and "-3". Cheaper than a regex, and this runs on every hinted answer."""
    text = text.strip()
    if not (text.isascii() and text.replace(".", "", 1).isdigit()):
        return None
    return float(text)


def _retry_after(value: str, now: float) -> float | None:
    seconds = _number(value)
    if seconds is not None:
        return seconds * 1000.0
    try:
        when = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # asctime form carries no zone; HTTP dates are always GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() * 1000.0 - now)


def _go_duration(value: str) -> float | None:
    text = value.strip()
    seconds = _number(text)
    if seconds is not None:
        return seconds * 1000.0
    if not _GO_DURATION.fullmatch(text):
        return None
    return sum(float(amount) * _GO_UNIT_MS[unit] for amount, unit in _GO_PARTS.findall(text))


def _epoch_reset(value: str, now: float) -> float | None:
    stamp = _number(value)
    if stamp is None:
        return None
    if stamp > _EPOCH_MS_THRESHOLD:
        return max(0.0, stamp - now)
    if stamp < _EPOCH_S_FLOOR:
        return stamp * 1000.0
    return max(0.0, stamp * 1000.0 - now)


def _from_body(body: str) -> float | None:
    head = body[:_BODY_SCAN_LIMIT]
    # Every phrase holds "try" (try again, retry) or "reset"; substring tests are far cheaper
    # than the case-insensitive regex, and most error bodies carry no hint at all.
    lowered = head.lower()
    if "try" not in lowered and "reset" not in lowered:
        return None
    match = _BODY_HINT.search(head)
    if match is None:
        return None
    return sum(
        float(amount) * _body_unit_ms(unit.lower()) for amount, unit in _BODY_PARTS.findall(match.group(1))
    )


def _body_unit_ms(unit: str) -> float:
    if unit.startswith(("ms", "milli")):
        return 1.0
    if unit.startswith("s"):
        return 1000.0
    if unit.startswith("m"):
        return 60_000.0
    return 3_600_000.0
