"""The one read model of a running instance, for whoever observes it (the console, its screenshots).

Observers never hold the engine's live objects (a provider's breaker, a connection's health, a
lockout entry): they read frozen views, built here at the moment of the read. So the engine can
change its internals without its observers noticing, nothing an observer does can mutate it,
and the views are the shape a remote observer could be sent as they are.

Reads are cheap and never scan more than they return: a view per provider or connection asked
for, the counts the status line needs without building any, lockouts one triple at a time (the
console keeps its own index of them, patched from lockout events).

Long on purpose (about 900 lines): each view sits with its `to_api()` and with the function that
reads that JSON back into the view (`breaker_view`, `connection_view`, `request_view`...), which
the attached console uses. A field added to a view is then added to both directions in one place,
and `tests/tui/test_attached.py` checks that they agree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args

from proxy.engine import ConnectionRuntime, Engine, ProviderRuntime
from proxy.resilience.breaker import CircuitBreaker, escalated_reset_timeout_ms
from proxy.resilience.events import Event, EventBus
from proxy.resilience.lockout import LockoutEntry, LockoutTableStatus, event_key, triple_of
from proxy.resilience.timefmt import epoch_ms, iso

if TYPE_CHECKING:
    from proxy.trail import Trail

__all__ = [
    "ALIVE_STATES",
    "ATTEMPT_OUTCOMES",
    "DEFAULT_REQUESTS_LIMIT",
    "DEFAULT_WINDOW",
    "LOCAL_REPLICA",
    "MAX_REQUESTS_LIMIT",
    "STATS_SCOPES",
    "WINDOWS",
    "AttemptView",
    "BreakerView",
    "ConnectionView",
    "Event",
    "LockoutTableStatus",
    "LockoutView",
    "Observed",
    "ReadModel",
    "RequestView",
    "SkipView",
    "StatsReport",
    "StatsView",
    "Traffic",
    "TransitionView",
    "UsageView",
    "WaitView",
    "breaker_of",
    "breaker_view",
    "connection_view",
    "event_view",
    "lockout_of",
    "lockout_table_view",
    "lockout_view",
    "request_view",
    "reset_timeout_ms",
    "stats_report",
    "triple_of",
]

ALIVE_STATES = ("queued", "waiting", "slot", "upstream", "streaming")
"""A request record's states while the request runs; it ends `done`, `failed` or `client_gone`."""
WINDOWS: dict[str, int] = {"1m": 60_000, "5m": 300_000, "15m": 900_000}
"""The statistics' sliding windows, by the name `GET /api/stats?window=` takes, in ms."""
DEFAULT_WINDOW = "5m"
STATS_SCOPES = ("replica", "fleet")
"""`GET /api/stats?scope=`: this replica's statistics (the default), or summed over its fleet's
live replicas (docs/fleet.md#statistics-of-the-fleet)."""
LOCAL_REPLICA = "local"
"""The one replica `scope=fleet` names without a fleet (the SQLite default)."""
"""The window the statistics are read over when none is named (the API, the CLI, the console)."""
DEFAULT_REQUESTS_LIMIT = 200
MAX_REQUESTS_LIMIT = 1000
"""`GET /api/requests?limit=`: its default and its ceiling."""
AttemptOutcome = Literal["ok", "fallback", "returned", "disconnect", "local", "pending"]
"""How an attempt ended; `pending`: it has not (the request's one attempt in flight, in an alive
record's view only)."""
ATTEMPT_OUTCOMES: tuple[AttemptOutcome, ...] = get_args(AttemptOutcome)


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
    last_transition_at: float | None = None

    def to_api(self) -> dict[str, object]:
        """The management API's Breaker."""
        return {
            "provider": self.provider,
            "class": self.provider_class,
            "state": self.state,
            "failureCount": self.failures,
            "degradationThreshold": self.degradation_threshold,
            "failureThreshold": self.failure_threshold,
            # Rounded up: a breaker that is still OPEN never advertises 0 ms.
            "retryAfterMs": math.ceil(self.retry_after_ms),
            "openCycleCount": self.open_cycles,
            "lastFailure": iso(self.last_failure_at),
            "lastTransition": iso(self.last_transition_at),
        }


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
    """Attempts sent upstream and not answered yet (the `queued` ones are not among them)."""
    max_concurrent: int | None
    queued: int = 0
    """Attempts waiting to be sent: in its request queue, or for a concurrency slot."""
    provider_class: str = ""

    def to_api(self, locks: Sequence[LockoutView], now: float) -> dict[str, object]:
        """The management API's Connection; `locks`: its running lockouts."""
        return {
            "id": self.id,
            "provider": self.provider,
            "name": self.name or self.id,
            "class": self.provider_class,
            "priority": self.priority,
            "enabled": self.enabled,
            "status": self.status,
            "rateLimitedUntil": iso(self.rate_limited_until) if self.remaining_ms > 0 else None,
            "cooldownRemainingMs": int(self.remaining_ms),
            "backoffLevel": self.backoff_level,
            "lastError": self.last_error,
            "lastErrorType": self.last_error_type,
            "errorCode": self.error_code,
            "lastErrorAt": iso(self.last_error_at),
            "maxConcurrent": self.max_concurrent,
            "inFlight": self.in_flight,
            "apiKey": self.masked_key,
            "lockouts": [
                {"model": e.model, "reason": e.reason, "remainingMs": int(e.remaining_ms(now))} for e in locks
            ],
        }


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
        return event_key(self.provider, self.connection_id, self.model)

    def remaining_ms(self, now: float) -> float:
        return max(0.0, self.expires_at - now)

    def to_api(self, now: float) -> dict[str, object]:
        """The management API's Lockout."""
        return {
            "provider": self.provider,
            "connectionId": self.connection_id,
            "model": self.model,
            "reason": self.reason,
            "status": self.status,
            "failureCount": self.failure_count,
            # Rounded up: a triple that is still locked never advertises 0 ms.
            "remainingMs": math.ceil(self.remaining_ms(now)),
            "lockedAt": iso(self.locked_at),
            "expiresAt": iso(self.expires_at),
        }


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
    # the traffic (docs/api.md#the-traffic-requests-and-statistics)
    @property
    def recording(self) -> bool: ...
    @property
    def requests_version(self) -> int: ...
    @property
    def requests_epoch(self) -> int: ...
    @property
    def request_history(self) -> int: ...
    def alive_requests(self) -> list[RequestView]: ...
    def alive_count(self) -> int: ...
    def finished_requests(self, mark: int, limit: int | None = None) -> tuple[list[RequestView], int]: ...
    def alive_changed(self, known: dict[str, str]) -> tuple[list[RequestView], dict[str, str]]: ...
    def stats(self, window: str, now: float) -> StatsReport: ...
    def provider_stats(self, window: str, now: float) -> dict[str, StatsView]: ...
    def latency_series(self, provider: str, now: float, buckets: int) -> list[float | None]: ...
    # the state backend and the fleet (docs/fleet.md)
    def state_backend(self) -> dict[str, object]: ...
    def fleet_api(self) -> dict[str, object] | None: ...


# -- the traffic: request records and statistics ----------------------------------------------------
#
# Each view's `to_api()` is the management API's JSON for it (camelCase), so the API, the console
# and a remote observer all read one shape.


@dataclass(frozen=True, slots=True)
class UsageView:
    prompt_tokens: int | None
    completion_tokens: int | None
    total_tokens: int | None

    def to_api(self) -> dict[str, object]:
        return {
            "promptTokens": self.prompt_tokens,
            "completionTokens": self.completion_tokens,
            "totalTokens": self.total_tokens,
        }


@dataclass(frozen=True, slots=True)
class AttemptView:
    target: str
    provider: str
    connection_id: str
    started_at: float
    duration_ms: float
    status: int | None
    """The status after restatement; None when the upstream never answered."""
    outcome: AttemptOutcome
    reason: str
    """A short sentence: "429 rate_limited", "timeout before the response headers"..."""

    def to_api(self) -> dict[str, object]:
        return {
            "target": self.target,
            "provider": self.provider,
            "connectionId": self.connection_id,
            "startedAt": iso(self.started_at),
            "durationMs": round(self.duration_ms),
            "status": self.status,
            "outcome": self.outcome,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class SkipView:
    target: str
    connection_id: str | None
    reason: str
    """In words: "cooling 12 s (429 rate_limited)", "breaker OPEN, probe in 8 s"..."""
    retry_after_ms: int | None
    after: int = 0
    """How many of the request's attempts came before it (the latest time it was passed over):
    where it goes in the trail told in order."""

    def to_api(self) -> dict[str, object]:
        return {
            "target": self.target,
            "connectionId": self.connection_id,
            "reason": self.reason,
            "retryAfterMs": self.retry_after_ms,
            "after": self.after,
        }


@dataclass(frozen=True, slots=True)
class WaitView:
    ms: float
    reason: str
    after: int = 0
    """How many of the request's attempts came before it, as `SkipView.after`."""

    def to_api(self) -> dict[str, object]:
        return {"ms": round(self.ms), "reason": self.reason, "after": self.after}


@dataclass(frozen=True, slots=True)
class RequestView:
    """One request record as read now: what a `/v1` request went through; never its text."""

    id: str
    seq: int
    started_at: float
    ended_at: float | None
    state: str
    """While alive: one of ALIVE_STATES; at the end: done, failed or client_gone."""
    client: str
    endpoint: str
    model_asked: str | None
    route: str
    """combo, target (provider/model) or bare (a model name some provider lists)."""
    stream: bool
    status: int | None
    code: str | None
    message: str | None
    duration_ms: float | None
    ttft_ms: float | None
    usage: UsageView | None
    bytes_in: int
    bytes_out: int
    attempts: tuple[AttemptView, ...]
    skipped: tuple[SkipView, ...]
    waits: tuple[WaitView, ...]

    @property
    def alive(self) -> bool:
        return self.ended_at is None

    @property
    def failed(self) -> bool:
        return self.state in ("failed", "client_gone")

    def to_api(self) -> dict[str, object]:
        return {
            "id": self.id,
            "seq": self.seq,
            "startedAt": iso(self.started_at),
            "endedAt": iso(self.ended_at),
            "state": self.state,
            "client": self.client,
            "endpoint": self.endpoint,
            "modelAsked": self.model_asked,
            "route": self.route,
            "stream": self.stream,
            "status": self.status,
            "code": self.code,
            "message": self.message,
            "durationMs": None if self.duration_ms is None else round(self.duration_ms),
            "ttftMs": None if self.ttft_ms is None else round(self.ttft_ms),
            "usage": None if self.usage is None else self.usage.to_api(),
            "bytesIn": self.bytes_in,
            "bytesOut": self.bytes_out,
            "attempts": [a.to_api() for a in self.attempts],
            "skipped": [s.to_api() for s in self.skipped],
            "waits": [w.to_api() for w in self.waits],
        }


@dataclass(frozen=True, slots=True)
class StatsView:
    """One provider's or connection's traffic over one window; None where there is no sample."""

    requests: int
    errors: int
    error_rate: float | None
    p50_ms: float | None
    p95_ms: float | None
    ttft_p50_ms: float | None
    tokens_per_second: float | None

    def to_api(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "errorRate": self.error_rate,
            "p50Ms": self.p50_ms,
            "p95Ms": self.p95_ms,
            "ttftP50Ms": self.ttft_p50_ms,
            "tokensPerSecond": self.tokens_per_second,
        }


@dataclass(frozen=True, slots=True)
class StatsReport:
    window: str
    providers: dict[str, StatsView]
    connections: dict[str, StatsView]

    def to_api(self) -> dict[str, object]:
        return {
            "window": self.window,
            "providers": {k: v.to_api() for k, v in self.providers.items()},
            "connections": {k: v.to_api() for k, v in self.connections.items()},
        }


class FleetView(Protocol):
    """What the read model shows of a shared state backend (proxy/fleet)."""

    def status(self) -> dict[str, object]: ...

    def fleet(self) -> dict[str, object]: ...


class ReadModel:
    """Read-only views of one engine, its event bus and its request trail."""

    __slots__ = ("_bus", "_engine", "_fleet", "_trail", "version")

    def __init__(
        self,
        engine: Engine,
        bus: EventBus,
        version: str,
        trail: Trail | None = None,
        *,
        fleet: FleetView | None = None,
    ) -> None:
        self._engine = engine
        self._bus = bus
        self._trail = trail
        self._fleet = fleet
        self.version = version

    # -- the state backend -------------------------------------------------------------------------

    def state_backend(self) -> dict[str, object]:
        """`stateBackend` of the health document: `{kind, connected, since}`."""
        if self._fleet is not None:
            return self._fleet.status()
        return {"kind": "sqlite", "connected": True, "since": iso(self.started_at)}

    def fleet_api(self) -> dict[str, object] | None:
        """`fleet` of the health document: this replica and the fleet's (None without a fleet)."""
        return None if self._fleet is None else self._fleet.fleet()

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

    def _connection(self, conn: ConnectionRuntime, now: float) -> ConnectionView:
        return _connection(conn, now, self._engine.providers[conn.spec.provider].spec.provider_class)

    def connections(self, now: float) -> list[ConnectionView]:
        return [self._connection(c, now) for c in self._engine.connections.values()]

    def connection(self, connection_id: str, now: float) -> ConnectionView | None:
        found = self._engine.connections.get(connection_id)
        return self._connection(found, now) if found is not None else None

    def unwell(self, now: float) -> list[ConnectionView]:
        """The connections that are not active (cooling, terminal or disabled)."""
        return [
            self._connection(c, now)
            for c in self._engine.connections.values()
            if c.health.status(now) != "active"
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
        return [lockout_of(e) for e in self._engine.lockouts.active(now)]

    def lockout(self, provider: str, connection_id: str, model: str) -> LockoutView | None:
        """One triple's entry, running or expired (None when the table holds none)."""
        entry = self._engine.lockouts.get(provider, connection_id, model)
        return lockout_of(entry) if entry is not None else None

    def lockouts_of(self, provider: str, connection_id: str, now: float) -> list[LockoutView]:
        """The running lockouts of one connection."""
        return [lockout_of(e) for e in self._engine.lockouts.for_connection(provider, connection_id, now)]

    def lockout_table(self) -> LockoutTableStatus:
        return self._engine.lockout_table_status()

    # -- the management API's documents, serialised from the views above ---------------------------

    def breakers_api(self) -> list[dict[str, object]]:
        now = self.now()
        return [b.to_api() for b in self.breakers(now)]

    def connection_api(self, connection_id: str) -> dict[str, object]:
        """KeyError for an unknown connection."""
        now = self.now()
        view = self.connection(connection_id, now)
        if view is None:
            raise KeyError(connection_id)
        return view.to_api(self.lockouts_of(view.provider, view.id, now), now)

    def connections_api(self) -> list[dict[str, object]]:
        now = self.now()
        return [c.to_api(self.lockouts_of(c.provider, c.id, now), now) for c in self.connections(now)]

    def lockouts_api(self) -> list[dict[str, object]]:
        now = self.now()
        return [e.to_api(now) for e in self.lockouts(now)]

    def counters_api(self) -> dict[str, object]:
        """What moves without an event, for the stream's `counters` message: a few numbers."""
        return {
            "uptimeMs": int(self.now() - self.started_at),
            "requests": self._engine.stats.to_api(),
            "lockoutTable": self.lockout_table().to_api(),
            "stateBackend": self.state_backend(),
            **({"fleet": fleet} if (fleet := self.fleet_api()) is not None else {}),
        }

    def health_api(self) -> dict[str, object]:
        """`GET /api/monitoring/health`."""
        now = self.now()
        breakers = self.breakers(now)
        counts = {"open": 0, "halfOpen": 0, "degraded": 0, "closed": 0}
        for b in breakers:
            counts[_STATE_COUNT_KEY[b.state]] += 1
        conn_counts = {"total": 0, "active": 0, "coolingDown": 0, "terminal": 0, "disabled": 0}
        for c in self.connections(now):
            conn_counts["total"] += 1
            conn_counts[_CONNECTION_COUNT_KEY.get(c.status, "terminal")] += 1
        healthy = counts["open"] == 0 and counts["halfOpen"] == 0 and counts["degraded"] == 0
        return {
            "status": "healthy" if healthy else "degraded",
            "timestamp": iso(now),
            "uptimeMs": int(now - self.started_at),
            "version": self.version,
            "circuitBreakers": {**counts, "total": len(breakers)},
            "providerBreakers": [b.to_api() for b in breakers],
            "providerHealth": {
                b.provider: {"state": b.state, "failures": b.failures, "lastFailure": iso(b.last_failure_at)}
                for b in breakers
            },
            "connections": conn_counts,
            "lockouts": self.lockouts_api(),
            "lockoutTable": self.lockout_table().to_api(),
            "requests": self._engine.stats.to_api(),
            "stateBackend": self.state_backend(),
            **({"fleet": fleet} if (fleet := self.fleet_api()) is not None else {}),
        }

    # -- the traffic -------------------------------------------------------------------------------

    @property
    def recording(self) -> bool:
        """False when `server.request_history` is 0: no records, no statistics."""
        return self._trail is not None

    @property
    def requests_version(self) -> int:
        """Changes whenever a request record is created, changes state or ends (cheap to poll)."""
        return self._trail.version if self._trail is not None else 0

    @property
    def requests_epoch(self) -> int:
        """Changes when the finished records read so far no longer hold (never, in the instance's
        own process; a mirror's instance restarted): a reader keeping them starts over."""
        return 0

    def requests(
        self,
        *,
        after: int = 0,
        limit: int | None = None,
        state: str | None = None,
        newest: int | None = None,
    ) -> list[RequestView]:
        """Records oldest first (by `seq`), alive ones included unless `state` is "done"; `limit`:
        the oldest that many, `newest`: the newest that many."""
        if self._trail is None:
            return []
        return self._trail.views(after=after, limit=limit, state=state, newest=newest)

    @property
    def request_history(self) -> int:
        """How many finished records the ring keeps (0: recording is off)."""
        return self._trail.capacity if self._trail is not None else 0

    def alive_requests(self) -> list[RequestView]:
        return self._trail.alive_views() if self._trail is not None else []

    def alive_count(self) -> int:
        return len(self._trail.alive) if self._trail is not None else 0

    def finished_requests(self, mark: int, limit: int | None = None) -> tuple[list[RequestView], int]:
        """The records that ended since `mark` (0 at first; at most the newest `limit`), oldest
        first, and the next mark: a reader keeps what it read, and asks each tick only for what
        is new."""
        return self._trail.finished_since(mark, limit) if self._trail is not None else ([], 0)

    def alive_changed(self, known: dict[str, str]) -> tuple[list[RequestView], dict[str, str]]:
        """The alive records whose state is not what `known` says (as views), and every alive
        record's state now: a reader polling for changes builds views only for what moved."""
        return self._trail.alive_changed(known) if self._trail is not None else ([], {})

    def request(self, request_id: str) -> RequestView | None:
        return self._trail.view(request_id) if self._trail is not None else None

    def stats(self, window: str, now: float) -> StatsReport:
        """Per provider and connection over `window` (a key of WINDOWS)."""
        if self._trail is None:
            empty = StatsView(0, 0, None, None, None, None, None)
            return StatsReport(
                window,
                {p: empty for p in self._engine.providers},
                {c: empty for c in self._engine.connections},
            )
        return self._trail.stats.report(window, now)

    def provider_stats(self, window: str, now: float) -> dict[str, StatsView]:
        """`stats(window, now).providers`, without a view of every connection (the Overview's)."""
        if self._trail is None:
            return {p: StatsView(0, 0, None, None, None, None, None) for p in self._engine.providers}
        return self._trail.stats.providers(window, now)

    def latency_series(self, provider: str, now: float, buckets: int) -> list[float | None]:
        """The provider's p50 latency per statistics bucket, oldest first (for a sparkline)."""
        if self._trail is None:
            return []
        return self._trail.stats.p50_series(provider, now, buckets)


_STATE_COUNT_KEY = {"OPEN": "open", "HALF_OPEN": "halfOpen", "DEGRADED": "degraded", "CLOSED": "closed"}
_CONNECTION_COUNT_KEY = {"active": "active", "cooling": "coolingDown", "disabled": "disabled"}


def _breaker(provider: ProviderRuntime, now: float) -> BreakerView:
    return breaker_of(provider.breaker, now)


def breaker_of(b: CircuitBreaker, now: float) -> BreakerView:
    """A breaker's view as read at `now` (lazy recovery included)."""
    policy = b.policy
    return BreakerView(
        provider=b.provider,
        provider_class=b.provider_class,
        state=b.state(now).value,
        failures=b.failure_count,
        degradation_threshold=policy.degradation_threshold,
        failure_threshold=policy.failure_threshold,
        retry_after_ms=b.retry_after_ms(now),
        open_cycles=b.open_cycle_count,
        last_failure_at=b.last_failure_at,
        reset_timeout_ms=b.effective_reset_timeout_ms(),
        last_transition_at=b.last_transition_at,
    )


def _connection(conn: ConnectionRuntime, now: float, provider_class: str = "") -> ConnectionView:
    h = conn.health
    spec = conn.spec
    # The engine counts an attempt from its selection to its outcome, waits included: what waits
    # is told apart from what went upstream, so that "in flight / max" never reads as a broken cap.
    # A request queue holds a request from its admission until it is sent, its wait for a slot
    # included, so the larger of the two counts is every waiting request once (and a queue the
    # settings have since turned off, its count 0, leaves the slot's).
    waiting = max(
        conn.limiter.queued if conn.limiter is not None else 0,
        conn.semaphore.waiting if conn.semaphore is not None else 0,
    )
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
        in_flight=max(0, conn.in_flight - waiting),
        max_concurrent=spec.max_concurrent,
        queued=waiting,
        provider_class=provider_class,
    )


def lockout_of(entry: LockoutEntry) -> LockoutView:
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
        last_transition_at=epoch_ms(data.get("lastTransition")),
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
        provider_class=str(data.get("class", "")),
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


_LAYERS = ("breaker", "connection", "lockout", "settings", "operator", "state")


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


def _ms(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def request_view(data: Mapping[str, Any]) -> RequestView:
    """A RequestView from its `to_api()` form (an attached console's stream)."""
    usage = data.get("usage")
    started = epoch_ms(data.get("startedAt"))
    status = data.get("status")
    return RequestView(
        id=str(data.get("id", "")),
        seq=_int(data.get("seq")),
        started_at=started if started is not None else 0.0,
        ended_at=epoch_ms(data.get("endedAt")),
        state=str(data.get("state", "")),
        client=str(data.get("client", "")),
        endpoint=str(data.get("endpoint", "")),
        model_asked=_text(data.get("modelAsked")),
        route=str(data.get("route", "")),
        stream=data.get("stream") is True,
        status=status if isinstance(status, int) else None,
        code=_text(data.get("code")),
        message=_text(data.get("message")),
        duration_ms=_ms(data.get("durationMs")),
        ttft_ms=_ms(data.get("ttftMs")),
        usage=UsageView(
            _count_of(usage.get("promptTokens")),
            _count_of(usage.get("completionTokens")),
            _count_of(usage.get("totalTokens")),
        )
        if isinstance(usage, Mapping)
        else None,
        bytes_in=_int(data.get("bytesIn")),
        bytes_out=_int(data.get("bytesOut")),
        attempts=tuple(
            AttemptView(
                target=str(a.get("target", "")),
                provider=str(a.get("provider", "")),
                connection_id=str(a.get("connectionId", "")),
                started_at=epoch_ms(a.get("startedAt")) or 0.0,
                duration_ms=_ms(a.get("durationMs")) or 0.0,
                status=a.get("status") if isinstance(a.get("status"), int) else None,
                outcome=_outcome(a.get("outcome")),
                reason=str(a.get("reason", "")),
            )
            for a in data.get("attempts", [])
            if isinstance(a, Mapping)
        ),
        skipped=tuple(
            SkipView(
                target=str(k.get("target", "")),
                connection_id=_text(k.get("connectionId")),
                reason=str(k.get("reason", "")),
                retry_after_ms=k.get("retryAfterMs") if isinstance(k.get("retryAfterMs"), int) else None,
                after=_count(k.get("after")),
            )
            for k in data.get("skipped", [])
            if isinstance(k, Mapping)
        ),
        waits=tuple(
            WaitView(_ms(w.get("ms")) or 0.0, str(w.get("reason", "")), _count(w.get("after")))
            for w in data.get("waits", [])
            if isinstance(w, Mapping)
        ),
    )


def _count(value: object) -> int:
    """A count the API sent (`after`), or 0 for anything else (an older instance sends none)."""
    return value if type(value) is int and value >= 0 else 0


_OUTCOMES: dict[object, AttemptOutcome] = {o: o for o in ATTEMPT_OUTCOMES}


def _outcome(value: object) -> AttemptOutcome:
    return _OUTCOMES.get(value, "local")


def _count_of(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _stats_view(data: Mapping[str, Any]) -> StatsView:
    rate = data.get("errorRate")
    return StatsView(
        requests=_int(data.get("requests")),
        errors=_int(data.get("errors")),
        error_rate=float(rate) if isinstance(rate, int | float) else None,
        p50_ms=_ms(data.get("p50Ms")),
        p95_ms=_ms(data.get("p95Ms")),
        ttft_p50_ms=_ms(data.get("ttftP50Ms")),
        tokens_per_second=_ms(data.get("tokensPerSecond")),
    )


def stats_report(data: Mapping[str, Any]) -> StatsReport:
    """A StatsReport from `GET /api/stats`."""
    providers, connections = data.get("providers", {}), data.get("connections", {})
    return StatsReport(
        window=str(data.get("window", "")),
        providers={str(k): _stats_view(v) for k, v in providers.items() if isinstance(v, Mapping)},
        connections={str(k): _stats_view(v) for k, v in connections.items() if isinstance(v, Mapping)},
    )
