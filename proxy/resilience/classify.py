"""Classify one upstream outcome (docs/resilience.md#classification-of-an-outcome): what each layer records.

Runs after status restatement (restate.py). The rows below are that table's, in its order;
the first matching row wins. A verdict only says what should happen; the layers apply it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Final

from proxy.resilience.lockout import NOT_FOUND, LockoutSettings
from proxy.resilience.outcome import Outcome, OutcomeKind


class BreakerEffect(Enum):
    SUCCESS = "success"
    FAILURE = "failure"
    NONE = "none"


class ConnectionEffect(Enum):
    CLEAR = "clear"
    COOLDOWN = "cooldown"
    BANNED = "banned"
    CREDITS_EXHAUSTED = "credits_exhausted"
    EXPIRED = "expired"
    NONE = "none"


class LockoutEffect(Enum):
    DECAY = "decay"
    LOCK = "lock"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Verdict:
    breaker: BreakerEffect
    connection: ConnectionEffect
    lockout: LockoutEffect
    fallback: bool
    """Try the next connection or target? False: the answer goes back to the client as it is."""
    reason: str
    """A short machine word: ok, network_error, stall, server_error, timeout, banned, ..."""
    transient: bool
    """Would it recover by itself (cooldown-aware waiting)? False whenever fallback is False."""


# Network errors and stalls have no status; for the lockout list they count as a bad gateway.
NO_STATUS_LOCKOUT_CODE = 502


def _words(*texts: str) -> re.Pattern[str]:
    # One alternation per group, matched against the body lowercased once.
    return re.compile("|".join(re.escape(t) for t in texts))


_BANNED = _words(
    "account has been deactivated",
    "account deactivated",
    "account suspended",
    "has been suspended",
    "account banned",
    "has been banned",
    "account disabled",
)
# Terminal verdicts end only by an operator's hand, so their markers are narrow
# (docs/resilience.md#terminal-states): credits_exhausted only for texts that say the balance, the
# credits or the plan is used up. A bare "quota exceeded" or "billing" is not enough: Google's
# per-minute rate limits say "Quota exceeded for quota metric ... per minute", and Gemini's free
# tier even opens its per-minute 429 with OpenAI's "exceeded your current quota, please check your
# plan and billing".
_CREDITS = _words(
    "insufficient_quota",
    "exceeded your current quota",
    "credit balance",
    "out of credits",
    "insufficient credits",
    "insufficient balance",
    "insufficient_balance",
    "payment required",
    "billing_hard_limit",
    "billing hard limit",
)
# A text that names a rate (a window, a retry delay) is about a rate quota, however it opens: it
# recovers by itself, so it is never terminal.
_RATE_QUOTA = _words(
    "per minute",
    "per_minute",
    "perminute",
    "per min",
    "per hour",
    "per_hour",
    "perhour",
    "per day",
    "per_day",
    "perday",
    "per second",
    "quota metric",
    "rate limit",
    "rate-limit",
    "rate_limit",
    "ratelimit",
    "retry in",
    "try again in",
)
_INVALID_KEY = _words(
    "invalid api key",
    "invalid_api_key",
    "incorrect api key",
    "invalid x-api-key",
    "api key not valid",
    "invalid authentication",
    "unauthorized",
)
# A 403 about access to one model says the key works but may not use that model: a model-level
# 403 (forbidden, lockable), never an expired key, even when it also says "unauthorized".
_MODEL_ACCESS = _words(
    "access to model",
    "access to the model",
    "access to this model",
    "access model",
    "access the model",
    "access this model",
    "have access to it",
)
_MODEL_MISSING = _words(
    "model_not_found",
    "model not found",
    "does not exist",
    "unknown model",
    "no such model",
    "not a valid model",
)
_CONTEXT_LENGTH = _words(
    "context_length_exceeded",
    "context length",
    "maximum context",
    "too many tokens",
    "prompt is too long",  # Anthropic's ("prompt is too long: 210000 tokens > 200000 maximum")
    "exceeds the available context size",  # llama.cpp's server
)

_B, _C, _L = BreakerEffect, ConnectionEffect, LockoutEffect


def _pair(
    breaker: BreakerEffect, connection: ConnectionEffect, reason: str, *, transient: bool = True
) -> tuple[Verdict, Verdict]:
    """A fallback row whose lockout column depends on the settings, indexed by `lockout.counts(...)`."""
    return (
        Verdict(breaker, connection, _L.NONE, True, reason, transient),
        Verdict(breaker, connection, _L.LOCK, True, reason, transient),
    )


# Verdicts are immutable, so each row is built once and classify() only picks one.
_OK = Verdict(_B.SUCCESS, _C.CLEAR, _L.DECAY, False, "ok", False)
SUCCESS: Final = _OK
"""The verdict on every 2xx answer (`classify` reads no setting for it)."""
_NETWORK = _pair(_B.FAILURE, _C.COOLDOWN, "network_error")
_STALL = _pair(_B.FAILURE, _C.COOLDOWN, "stall")
_TIMEOUT = _pair(_B.FAILURE, _C.COOLDOWN, "timeout")
_SERVER = _pair(_B.FAILURE, _C.COOLDOWN, "server_error")
# A 5xx outside the breaker's list (501, 505...): not a provider-level failure, but the
# client did nothing wrong, so another target may serve; it locks only if the operator lists it.
_OTHER_SERVER = _pair(_B.NONE, _C.NONE, "server_error")
_BANNED_V = Verdict(_B.NONE, _C.BANNED, _L.NONE, True, "banned", False)
_CREDITS_V = Verdict(_B.NONE, _C.CREDITS_EXHAUSTED, _L.NONE, True, "credits_exhausted", False)
_EXPIRED_V = Verdict(_B.NONE, _C.EXPIRED, _L.NONE, True, "expired", False)
_MODEL_QUOTA = Verdict(_B.NONE, _C.NONE, _L.LOCK, True, "rate_limited", True)
_RATE_LIMITED = _pair(_B.NONE, _C.COOLDOWN, "rate_limited")
_FORBIDDEN = _pair(_B.NONE, _C.NONE, "forbidden")
_NOT_FOUND = _pair(_B.NONE, _C.NONE, NOT_FOUND, transient=False)
_MODEL_NOT_FOUND = Verdict(_B.NONE, _C.NONE, _L.NONE, True, "model_not_found", False)
_CONTEXT = Verdict(_B.NONE, _C.NONE, _L.NONE, True, "context_length", False)
_CLIENT_ERROR = Verdict(_B.NONE, _C.NONE, _L.NONE, False, "client_error", False)
# 1xx/3xx (or nonsense) from an API upstream: nothing to learn, relay it as it is.
_UNEXPECTED = Verdict(_B.NONE, _C.NONE, _L.NONE, False, "unexpected_status", False)
_LOCAL = Verdict(_B.NONE, _C.NONE, _L.NONE, False, "local_rejection", False)
_DISCONNECT = Verdict(_B.NONE, _C.NONE, _L.NONE, False, "client_disconnect", False)

# 529 is Anthropic's `overloaded_error`: the same news as a 503.
_SERVER_STATUSES = frozenset((500, 502, 503, 504, 529))
_ACCOUNT_STATUSES = frozenset((401, 402, 403, 429))


def classify(outcome: Outcome, *, per_model_quota: bool, lockout: LockoutSettings) -> Verdict:
    kind = outcome.kind
    if kind is OutcomeKind.STATUS:
        status = outcome.status
        if status is None:  # an answer without a usable status tells us no more than a dead socket
            return _NETWORK[lockout.counts(NO_STATUS_LOCKOUT_CODE)]
        if 200 <= status < 300:
            return _OK
        return _classify_status(status, outcome.body, per_model_quota, lockout)
    if kind is OutcomeKind.NETWORK_ERROR:
        return _NETWORK[lockout.counts(NO_STATUS_LOCKOUT_CODE)]
    if kind is OutcomeKind.STALL:
        return _STALL[lockout.counts(NO_STATUS_LOCKOUT_CODE)]
    if kind is OutcomeKind.LOCAL_REJECTION:
        return _LOCAL
    return _DISCONNECT


def _classify_status(status: int, body: str, per_model_quota: bool, lockout: LockoutSettings) -> Verdict:
    if status >= 500:
        if status in _SERVER_STATUSES:
            return _SERVER[lockout.counts(status)]
        return _OTHER_SERVER[lockout.counts(status)] if status < 600 else _UNEXPECTED
    if status == 408:
        return _TIMEOUT[lockout.counts(status)]
    if status < 400:
        return _UNEXPECTED

    text = body.lower()
    if status in _ACCOUNT_STATUSES:
        if _BANNED.search(text):
            return _BANNED_V
        if status == 402 or (status != 401 and _CREDITS.search(text) and not _RATE_QUOTA.search(text)):
            return _CREDITS_V
        if status == 401 or (status == 403 and _INVALID_KEY.search(text) and not _MODEL_ACCESS.search(text)):
            return _EXPIRED_V
        if status == 429:
            # Per-model quotas lock the model whatever the lockout list and master switch say: the
            # connection stays in service for its other models (docs/resilience.md#model-lockout).
            return _MODEL_QUOTA if per_model_quota else _RATE_LIMITED[lockout.counts(429)]
        return _FORBIDDEN[lockout.counts(403)]
    if status == 404:
        return _NOT_FOUND[lockout.counts(404)]
    if status == 400 or status == 422:
        if _MODEL_MISSING.search(text):
            return _MODEL_NOT_FOUND
        if _CONTEXT_LENGTH.search(text):
            return _CONTEXT
    return _CLIENT_ERROR
