"""The one read model of a running instance, for whoever observes it (the console, its screenshots).

Observers never hold the engine's live objects (a provider's breaker, a connection's health, a
lockout entry): they read frozen views, built here at the moment of the read. So the engine can
change its internals without its observers noticing, nothing an observer does can mutate it,
and the views are the shape a remote observer could be sent as they are.

Reads are cheap and never scan more than they return: a view per provider or connection asked
for, the counts the status line needs without building any, lockouts one triple at a time (the
console keeps its own index of them, patched from lockout events).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.engine import ConnectionRuntime, Engine, ProviderRuntime
from proxy.resilience.breaker import escalated_reset_timeout_ms
from proxy.resilience.events import Event, EventBus
from proxy.resilience.lockout import LockoutEntry, LockoutTableStatus
from proxy.resilience.timefmt import epoch_ms

__all__ = [
    "BreakerView",
    "ConnectionView",
    "Event",
    "LockoutTableStatus",
    "LockoutView",
    "Observed",
    "ReadModel",
    "Traffic",
    "TransitionView",
    "breaker_view",
    "connection_view",
    "event_view",
    "lockout_table_view",
    "lockout_view",
    "reset_timeout_ms",
]


@dataclass(frozen=True, slots=True)
class BreakerView:
    provider: str
    provider_class: str
    state: str
    """CLOSED, DEGRADED, OPEN or HALF_OPEN, as read now (lazy recovery included)."""
    failures: int
    degradation_threshold: int
    failure_threshold: int
    retry_after_ms: float
    """Until an OPEN breaker lets a probe through; 0 otherwise."""
    open_cycles: int
    last_failure_at: float | None
    reset_timeout_ms: float
    """The reset timeout in force (escalated after repeated open cycles)."""


@dataclass(frozen=True, slots=True)
class TransitionView:
    ts: float
    from_state: str
    to_state: str
    reason: str


@dataclass(frozen=True, slots=True)
class ConnectionView:
    id: str
    provider: str
    name: str
    status: str
    """active, cooling, disabled, or a terminal state (banned, expired, credits_exhausted)."""
    remaining_ms: float
    """Of the cooldown; 0 when not cooling."""
    rate_limited_until: float | None
    backoff_level: int
    last_error: str | None
    last_error_type: str | None
    error_code: int | None
    last_error_at: float | None
    enabled: bool
    priority: int
    masked_key: str | None
    in_flight: int
    max_concurrent: int | None


@dataclass(frozen=True, slots=True)
class LockoutView:
    provider: str
    connection_id: str
    model: str
    reason: str
    status: int | None
    failure_count: int
    locked_at: float
    expires_at: float
    last_cooldown_ms: float

    @property
    def key(self) -> str:
        """The event bus's key for this triple (`provider:connection:model`)."""
        return f"{self.provider}:{self.connection_id}:{self.model}"

    def remaining_ms(self, now: float) -> float:
        return max(0.0, self.expires_at - now)


@dataclass(frozen=True, slots=True)
class Traffic:
    total: int
    ok: int
    failed: int
    in_flight: int


class Observed(Protocol):
    """What an observer reads: `ReadModel` in the instance's own process, or a mirror of one kept
    from its live stream (the attached console's)."""

    version: str

    def now(self) -> float: ...
    @property
    def started_at(self) -> float: ...
    @property
    def last_seq(self) -> int: ...
    def events_after(self, seq: int) -> list[Event]: ...
    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]: ...
    def breakers(self, now: float) -> list[BreakerView]: ...
    def breaker(self, provider: str, now: float) -> BreakerView | None: ...
    def breaker_history(self, provider: str) -> tuple[TransitionView, ...]: ...
    def connections(self, now: float) -> list[ConnectionView]: ...
    def connection(self, connection_id: str, now: float) -> ConnectionView | None: ...
    def unwell(self, now: float) -> list[ConnectionView]: ...
    def open_breakers(self, now: float) -> int: ...
    def cooling(self, now: float) -> int: ...
    def traffic(self) -> Traffic: ...
    def rates(self, now: float, seconds: int) -> list[int]: ...
    def lockouts(self, now: float) -> list[LockoutView]: ...
    def lockout(self, provider: str, connection_id: str, model: str) -> LockoutView | None: ...
    def lockouts_of(self, provider: str, connection_id: str, now: float) -> list[LockoutView]: ...
    def lockout_table(self) -> LockoutTableStatus: ...


class ReadModel:
    """Read-only views of one engine and its event bus."""

    __slots__ = ("_bus", "_engine", "version")

    def __init__(self, engine: Engine, bus: EventBus, version: str) -> None:
        self._engine = engine
        self._bus = bus
        self.version = version

    # -- time --------------------------------------------------------------------------------------

    def now(self) -> float:
        return self._engine.clock.now()

    @property
    def started_at(self) -> float:
        return self._engine.started_at

    # -- events ------------------------------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        return self._bus.last_seq

    def events_after(self, seq: int) -> list[Event]:
        return self._bus.after(seq)

    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        """`listener` hears every event as it is published; call the returned function to stop."""
        return self._bus.subscribe(listener)

    # -- breakers ----------------------------------------------------------------------------------

    def breakers(self, now: float) -> list[BreakerView]:
        return [_breaker(p, now) for p in self._engine.providers.values()]

    def breaker(self, provider: str, now: float) -> BreakerView | None:
        found = self._engine.providers.get(provider)
        return _breaker(found, now) if found is not None else None

    def breaker_history(self, provider: str) -> tuple[TransitionView, ...]:
        """The provider's last transitions, oldest first."""
        found = self._engine.providers.get(provider)
        if found is None:
            return ()
        return tuple(
            TransitionView(t.ts, t.from_state.value, t.to_state.value, t.reason)
            for t in found.breaker.history
        )

    # -- connections -------------------------------------------------------------------------------

    def connections(self, now: float) -> list[ConnectionView]:
        return [_connection(c, now) for c in self._engine.connections.values()]

    def connection(self, connection_id: str, now: float) -> ConnectionView | None:
        found = self._engine.connections.get(connection_id)
        return _connection(found, now) if found is not None else None

    def unwell(self, now: float) -> list[ConnectionView]:
        """The connections that are not active (cooling, terminal or disabled)."""
        return [
            _connection(c, now) for c in self._engine.connections.values() if c.health.status(now) != "active"
        ]

    # -- what the status line counts, without a view per row ---------------------------------------

    def open_breakers(self, now: float) -> int:
        return sum(1 for p in self._engine.providers.values() if p.breaker.state(now).value == "OPEN")

    def cooling(self, now: float) -> int:
        return sum(1 for c in self._engine.connections.values() if c.health.status(now) == "cooling")

    def traffic(self) -> Traffic:
        stats = self._engine.stats
        return Traffic(stats.total, stats.ok, stats.failed, stats.in_flight)

    def rates(self, now: float, seconds: int) -> list[int]:
        """Completed requests per second over the last `seconds` (the current one still filling)."""
        return self._engine.stats.rate_series(now, seconds)

    # -- lockouts ----------------------------------------------------------------------------------

    def lockouts(self, now: float) -> list[LockoutView]:
        """Every running lockout."""
        return [_lockout(e) for e in self._engine.lockouts.active(now)]

    def lockout(self, provider: str, connection_id: str, model: str) -> LockoutView | None:
        """One triple's entry, running or expired (None when the table holds none)."""
        entry = self._engine.lockouts.get(provider, connection_id, model)
        return _lockout(entry) if entry is not None else None

    def lockouts_of(self, provider: str, connection_id: str, now: float) -> list[LockoutView]:
        """The running lockouts of one connection."""
        return [_lockout(e) for e in self._engine.lockouts.for_connection(provider, connection_id, now)]

    def lockout_table(self) -> LockoutTableStatus:
        return self._engine.lockout_table_status()


def _breaker(provider: ProviderRuntime, now: float) -> BreakerView:
    b = provider.breaker
    policy = b.policy
    return BreakerView(
        provider=provider.spec.id,
        provider_class=provider.spec.provider_class,
        state=b.state(now).value,
        failures=b.failure_count,
        degradation_threshold=policy.degradation_threshold,
        failure_threshold=policy.failure_threshold,
        retry_after_ms=b.retry_after_ms(now),
        open_cycles=b.open_cycle_count,
        last_failure_at=b.last_failure_at,
        reset_timeout_ms=b.effective_reset_timeout_ms(),
    )


def _connection(conn: ConnectionRuntime, now: float) -> ConnectionView:
    h = conn.health
    spec = conn.spec
    return ConnectionView(
        id=spec.id,
        provider=spec.provider,
        name=spec.name,
        status=h.status(now),
        remaining_ms=h.remaining_ms(now),
        rate_limited_until=h.rate_limited_until,
        backoff_level=h.backoff_level,
        last_error=h.last_error,
        last_error_type=h.last_error_type,
        error_code=h.error_code,
        last_error_at=h.last_error_at,
        enabled=h.enabled,
        priority=spec.priority,
        masked_key=spec.masked_key,
        in_flight=conn.in_flight,
        max_concurrent=spec.max_concurrent,
    )


def _lockout(entry: LockoutEntry) -> LockoutView:
    return LockoutView(
        provider=entry.provider,
        connection_id=entry.connection_id,
        model=entry.model,
        reason=entry.reason,
        status=entry.status,
        failure_count=entry.failure_count,
        locked_at=entry.locked_at,
        expires_at=entry.expires_at,
        last_cooldown_ms=entry.last_cooldown_ms,
    )


# -- the same views, from the management API's JSON (an attached console's stream) ------------------
#
# The API says how long is left (`retryAfterMs`, `cooldownRemainingMs`, `remainingMs`) as well as
# when: the views are built on the reader's clock from the former, so a reader whose clock is not
# the server's still counts down right.


def _int(value: object, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def reset_timeout_ms(settings: Mapping[str, Any], provider_class: str, open_cycles: int) -> float:
    """The reset timeout a breaker of `provider_class` is in, from the resilience settings document
    (the API's Breaker shape does not carry it): the engine's own escalation rule."""
    profile = settings.get("providerBreaker", {}).get(provider_class, {})
    base = profile.get("resetTimeoutMs") if isinstance(profile, Mapping) else None
    return escalated_reset_timeout_ms(float(base) if isinstance(base, int | float) else 0.0, open_cycles)


def breaker_view(data: Mapping[str, Any], reset_timeout: float) -> BreakerView:
    return BreakerView(
        provider=str(data.get("provider", "")),
        provider_class=str(data.get("class", "")),
        state=str(data.get("state", "CLOSED")),
        failures=_int(data.get("failureCount")),
        degradation_threshold=_int(data.get("degradationThreshold")),
        failure_threshold=_int(data.get("failureThreshold")),
        retry_after_ms=float(_int(data.get("retryAfterMs"))),
        open_cycles=_int(data.get("openCycleCount")),
        last_failure_at=epoch_ms(data.get("lastFailure")),
        reset_timeout_ms=reset_timeout,
    )


def connection_view(data: Mapping[str, Any]) -> ConnectionView:
    code = data.get("errorCode")
    limit = data.get("maxConcurrent")
    return ConnectionView(
        id=str(data.get("id", "")),
        provider=str(data.get("provider", "")),
        name=str(data.get("name", "")),
        status=str(data.get("status", "active")),
        remaining_ms=float(_int(data.get("cooldownRemainingMs"))),
        rate_limited_until=epoch_ms(data.get("rateLimitedUntil")),
        backoff_level=_int(data.get("backoffLevel")),
        last_error=_text(data.get("lastError")),
        last_error_type=_text(data.get("lastErrorType")),
        error_code=code if isinstance(code, int) else None,
        last_error_at=epoch_ms(data.get("lastErrorAt")),
        enabled=data.get("enabled") is not False,
        priority=_int(data.get("priority")),
        masked_key=_text(data.get("apiKey")),
        in_flight=_int(data.get("inFlight")),
        max_concurrent=limit if isinstance(limit, int) else None,
    )


def lockout_view(data: Mapping[str, Any], now: float) -> LockoutView:
    """`now`: the reader's clock when the row arrived; the lock ends `remainingMs` after it."""
    expires_at = now + _int(data.get("remainingMs"))
    locked, expires = epoch_ms(data.get("lockedAt")), epoch_ms(data.get("expiresAt"))
    length = expires - locked if locked is not None and expires is not None else 0.0
    status = data.get("status")
    return LockoutView(
        provider=str(data.get("provider", "")),
        connection_id=str(data.get("connectionId", "")),
        model=str(data.get("model", "")),
        reason=str(data.get("reason", "")),
        status=status if isinstance(status, int) else None,
        failure_count=_int(data.get("failureCount")),
        locked_at=expires_at - length,
        expires_at=expires_at,
        last_cooldown_ms=length,
    )


def lockout_table_view(data: Mapping[str, Any]) -> LockoutTableStatus:
    return LockoutTableStatus(
        size=_int(data.get("size")),
        capacity=_int(data.get("capacity"), 1),
        not_found=_int(data.get("notFound")),
        not_found_budget=_int(data.get("notFoundBudget")),
        evicted=_int(data.get("evicted")),
        refused=_int(data.get("refused")),
    )


_LAYERS = ("breaker", "connection", "lockout", "settings", "operator")


def event_view(data: Mapping[str, Any]) -> Event | None:
    """An Event from its `to_dict()` form; None when it is not one."""
    layer = data.get("layer")
    ts = data.get("ts")
    if layer not in _LAYERS or not isinstance(ts, int | float):
        return None
    return Event(
        ts=float(ts),
        layer=layer,
        key=str(data.get("key", "")),
        from_=str(data.get("from", "")),
        to=str(data.get("to", "")),
        reason=str(data.get("reason", "")),
        seq=_int(data.get("seq")),
    )
