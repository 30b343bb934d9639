"""The engine's decisions, returned as values: an `Attempt` to run, or `NoTarget` with a `Skip` per
candidate saying why not, and what `record` concluded about an attempt (`Recorded`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.engine.specs import ConnectionRuntime, ProviderRuntime, Target
from proxy.resilience.classify import Verdict
from proxy.resilience.lockout import NOT_FOUND


@dataclass(slots=True)
class Attempt:
    """One dispatch to one connection. Every attempt must be `record`ed exactly once."""

    target: Target
    provider: ProviderRuntime
    connection: ConnectionRuntime
    probe: bool
    started_at: float
    pinned_by_session: bool = False
    probe_ticket: int = 0
    """The breaker's ticket for this probe (0 when not a probe): only this attempt settles the slot."""


@dataclass(frozen=True, slots=True)
class Skip:
    """Why one target (or one of its connections) could not take the request."""

    target: str
    connection_id: str | None
    reason: str
    """circuit_open, probe_in_flight, cooling, locked, banned, expired, credits_exhausted, disabled,
    no_connection, unknown_provider, already_tried."""
    retry_at: float | None
    """Epoch ms when this recovers by itself; None when it never will (operator action needed)."""
    waitable: bool
    """May cooldown-aware waiting wait for it? (short, transient reasons only)."""
    lock_reason: str | None = None
    """For `locked`: the lock's own reason (not_found, rate_limited...)."""

    def to_dict(self, now: float) -> dict[str, Any]:
        return {
            "target": self.target,
            "connectionId": self.connection_id,
            "reason": self.reason,
            "retryAfterMs": None if self.retry_at is None else max(0, int(self.retry_at - now)),
        }


@dataclass(frozen=True, slots=True)
class NoTarget:
    """Nothing eligible right now, with every reason."""

    skips: tuple[Skip, ...]

    @property
    def earliest_recovery(self) -> float | None:
        times = [s.retry_at for s in self.skips if s.retry_at is not None]
        return min(times) if times else None

    @property
    def earliest_waitable(self) -> float | None:
        times = [s.retry_at for s in self.skips if s.waitable and s.retry_at is not None]
        return min(times) if times else None

    @property
    def all_waitable(self) -> bool:
        """Every candidate is blocked for a short transient reason (cooldown-aware waiting applies)."""
        relevant = [s for s in self.skips if s.reason != "already_tried"]
        return bool(relevant) and all(s.waitable for s in relevant)

    @property
    def not_found_only(self) -> bool:
        """Every candidate is locked because the upstream answered 404 for the model: the answer is
        a 404, never a 429, since no wait makes the model exist
        (docs/resilience.md#answers-when-nothing-can-serve)."""
        relevant = [s for s in self.skips if s.reason != "already_tried"]
        return bool(relevant) and all(s.lock_reason == NOT_FOUND for s in relevant)

    @property
    def breaker_only(self) -> bool:
        relevant = [s for s in self.skips if s.reason != "already_tried"]
        return bool(relevant) and all(s.reason in ("circuit_open", "probe_in_flight") for s in relevant)


@dataclass(frozen=True, slots=True)
class Recorded:
    """What `record` concluded about one attempt."""

    verdict: Verdict
    status: int | None
    """The status after restatement (what the client should see for this attempt)."""
    client_retry_after_ms: int | None
    """A restatement rule's retry hint for the client, if one matched."""
