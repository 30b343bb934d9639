"""Wire format for instants: ISO 8601 UTC with milliseconds, as the management API shows them."""

from __future__ import annotations

import calendar
import time


def iso(ms: float | None) -> str | None:
    """`1767225600000.0` → `"2026-01-01T00:00:00.000Z"`; `None` stays `None` (never happened)."""
    if ms is None:
        return None
    # Integer arithmetic, not datetime.fromtimestamp(ms / 1000): the float division can round
    # 999 ms up into the next second.
    seconds, millis = divmod(int(ms // 1), 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def epoch_ms(text: object) -> float | None:
    """The inverse of `iso`: `"2026-01-01T00:00:00.000Z"` → `1767225600000.0`; None for null or
    anything else (an answer from another program, a garbled one)."""
    if not isinstance(text, str) or len(text) != 24 or text[19] != "." or not text.endswith("Z"):
        return None
    try:
        parsed = time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")
        millis = int(text[20:23])
    except ValueError:
        return None
    return calendar.timegm(parsed) * 1000.0 + millis
