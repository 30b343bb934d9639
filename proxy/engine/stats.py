"""The engine's request counters: totals, in flight, and completions per second for the sparkline."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestStats:
    total: int = 0
    ok: int = 0
    failed: int = 0
    in_flight: int = 0
    per_second: dict[int, int] = field(default_factory=dict)
    """Completed requests per epoch second, last 120 seconds (for the console's sparkline)."""

    def started(self) -> None:
        self.total += 1
        self.in_flight += 1

    def finished(self, ok: bool, now: float) -> None:
        self.in_flight -= 1
        if ok:
            self.ok += 1
        else:
            self.failed += 1
        second = int(now // 1000)
        per_second = self.per_second
        per_second[second] = per_second.get(second, 0) + 1
        if len(per_second) > 120:
            for old in sorted(per_second)[:-120]:
                del per_second[old]

    def rate_series(self, now: float, seconds: int = 60) -> list[int]:
        last = int(now // 1000)
        return [self.per_second.get(s, 0) for s in range(last - seconds + 1, last + 1)]

    def to_api(self) -> dict[str, int]:
        return {"total": self.total, "ok": self.ok, "failed": self.failed, "inFlight": self.in_flight}
