"""Time for the engine: one injectable clock, in epoch milliseconds.

Every rule takes `now` from a `Clock` so that tests move time by hand and never sleep.
`SystemClock` anchors the monotonic clock to the wall clock once at start: readings never jump
backwards within a process (NTP steps cannot reorder deadlines), and they are still epoch
milliseconds, so deadlines can be persisted and read back after a restart.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Milliseconds since the Unix epoch, never decreasing within a process."""
        ...


class SystemClock:
    def __init__(self) -> None:
        self._wall_anchor = time.time() * 1000.0
        self._mono_anchor = time.monotonic() * 1000.0

    def now(self) -> float:
        return self._wall_anchor + (time.monotonic() * 1000.0 - self._mono_anchor)


class FakeClock:
    """A clock that only moves when told to (tests, benchmarks, snapshots)."""

    def __init__(self, start_ms: float = 1_767_225_600_000.0) -> None:  # 2026-01-01T00:00:00Z
        self._now = start_ms

    def now(self) -> float:
        return self._now

    def advance(self, ms: float) -> None:
        if ms < 0:
            raise ValueError("a clock never goes backwards")
        self._now += ms

    def set(self, ms: float) -> None:
        if ms < self._now:
            raise ValueError("a clock never goes backwards")
        self._now = ms
