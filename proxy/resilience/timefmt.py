"""Wire format for instants: ISO 8601 UTC with milliseconds, as the management API shows them."""

from __future__ import annotations

import time
from datetime import datetime, timedelta


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
    if (
        not isinstance(text, str)
        or len(text) != 24
        or text[10] != "T"
        or text[19] != "."
        or not text.endswith("Z")
        or not (text[20:23].isascii() and text[20:23].isdigit())
    ):
        return None
    try:
        # fromisoformat, not strptime: an attached console reads several instants per request
        # record it is sent, and strptime took 4 µs each (a tenth of the console's busy time).
        parsed = datetime.fromisoformat(text[:19])
    except ValueError:
        return None
    return (parsed - _EPOCH) // _MILLISECOND + int(text[20:23]) + 0.0


_EPOCH = datetime(1970, 1, 1)
_MILLISECOND = timedelta(milliseconds=1)
