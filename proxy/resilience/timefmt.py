"""Wire format for instants: ISO 8601 UTC with milliseconds, as the management API shows them."""

from __future__ import annotations

import time


def iso(ms: float | None) -> str | None:
    """`1767225600000.0` → `"2026-01-01T00:00:00.000Z"`; `None` stays `None` (never happened)."""
    if ms is None:
        return None
    # Integer arithmetic, not datetime.fromtimestamp(ms / 1000): the float division can round
    # 999 ms up into the next second.
    seconds, millis = divmod(int(ms // 1), 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"
