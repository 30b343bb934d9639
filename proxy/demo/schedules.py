"""When each simulated upstream misbehaves: `flaky`'s bad and good phases, the others' every-n-th refusal.

Kept apart from the upstreams' HTTP so a test can shorten a cycle (`FlakySchedule`) without
touching how an upstream answers.
"""

from __future__ import annotations

from dataclasses import dataclass

RATE_LIMIT_EVERY = 3
"""`ratelimited` answers 429 to every third request it receives (whichever key sent it)."""
RATE_LIMIT_RETRY_AFTER_S = 5
OVERLOAD_EVERY = 4
"""`claude` answers 529 `overloaded_error` to every fourth Messages request it receives."""


@dataclass(frozen=True, slots=True)
class FlakySchedule:
    """When `flaky` fails: healthy for `lead_s`, then `bad_s` of failures and `good_s` of 200s, repeated."""

    bad_s: float = 20.0
    good_s: float = 25.0
    lead_s: float = 5.0
    """Healthy at first, so the breaker is seen CLOSED before it degrades."""
    bad_ratio: float = 0.9
    """Share of requests answered 503 during a bad phase (1.0: all of them, for tests)."""

    def is_bad(self, elapsed_s: float) -> bool:
        if elapsed_s < self.lead_s:
            return False
        return (elapsed_s - self.lead_s) % (self.bad_s + self.good_s) < self.bad_s
