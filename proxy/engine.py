"""The resilience engine: the three layers, wired together, with routing and persistence.

`Engine` owns one breaker per provider, one `ConnectionHealth` per connection, the lockout table,
the per-connection semaphores and request limiters, and the settings. It knows nothing of HTTP:
the server asks it for an `Attempt` (`select`), runs the attempt, and reports what came back
(`record`). Every decision is returned as a value; every transition is published on the bus.

Persistence is write-behind: mutations only mark objects dirty (a set add), and `persist()`
(called by the server every 250 ms and at shutdown) hands the dirty snapshots to the store,
whose writer thread commits them. The request path never waits for the disk.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from proxy.resilience.breaker import Admission, BreakerState, CircuitBreaker
from proxy.resilience.classify import BreakerEffect, ConnectionEffect, LockoutEffect, Verdict, classify
from proxy.resilience.clock import Clock, SystemClock
from proxy.resilience.cooldown import ConnectionHealth
from proxy.resilience.events import Event, EventBus
from proxy.resilience.hints import parse_retry_hint
from proxy.resilience.limiter import RequestLimiter
from proxy.resilience.lockout import (
    MAX_LOCKOUT_ENTRIES,
    NOT_FOUND,
    LockoutEntry,
    LockoutTable,
    LockoutTableStatus,
)
from proxy.resilience.outcome import Outcome, OutcomeKind, ProviderClass
from proxy.resilience.restate import RestatementRule, restate, rules_for
from proxy.resilience.semaphore import ConnectionSemaphore
from proxy.scrub import Scrubber
from proxy.settings import Settings
from proxy.shared import ConnectionOp, LockoutOp, SharedState, reenable_op
from proxy.store import BadRecord, MemoryStore, StateStore, StoredState

# How long a HALF_OPEN provider whose probe is in flight is expected to stay blocked, for the
# purpose of "when will something recover": the probe usually settles within a second or two.
PROBE_RECOVERY_ESTIMATE_MS = 1000.0

MAX_SESSION_PINS = 100_000
"""Session pins kept at most: session ids are the client's choice, so the table needs a ceiling
beyond which the least recently refreshed pin gives way (it costs that session its affinity)."""
PIN_PRUNE_STEP = 4
"""Expired pins a new pin removes on the request path: more than one, so the request path alone
keeps the table at its live size; a small constant, so no request pays for a large cleanup."""


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    id: str
    provider_class: ProviderClass
    per_model_quota: bool
    rate_limit: bool | None = None
    """None: follow `requestQueue.autoEnableApiKeyProviders` (on for apikey providers)."""
    restate: tuple[RestatementRule, ...] = ()


@dataclass(frozen=True, slots=True)
class ConnectionSpec:
    id: str
    provider: str
    name: str = ""
    priority: int = 100
    max_concurrent: int | None = None
    enabled: bool = True
    disable_cooling: bool = False
    fingerprint: str = ""
    """Changes when the credential changes; a changed credential clears a terminal state."""
    masked_key: str | None = None


@dataclass(frozen=True, slots=True)
class Target:
    provider: str
    model: str
    connection_id: str | None = None

    def __str__(self) -> str:
        return f"{self.provider}/{self.model}"


class ConnectionRuntime:
    """Everything the engine tracks for one connection."""

    __slots__ = ("health", "id", "in_flight", "last_used", "limiter", "priority", "semaphore", "spec")

    def __init__(
        self, spec: ConnectionSpec, health: ConnectionHealth, semaphore: ConnectionSemaphore | None = None
    ) -> None:
        self.spec = spec
        self.id = spec.id
        self.priority = spec.priority
        self.health = health
        self.semaphore = semaphore
        self.limiter: RequestLimiter | None = None
        self.in_flight = 0
        self.last_used = 0.0


class ProviderRuntime:
    __slots__ = ("breaker", "connections", "rules", "spec")

    def __init__(self, spec: ProviderSpec, breaker: CircuitBreaker) -> None:
        self.spec = spec
        self.breaker = breaker
        self.connections: list[ConnectionRuntime] = []
        self.rules = rules_for(spec.id, spec.restate)


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


class Engine:
    def __init__(
        self,
        providers: Sequence[ProviderSpec],
        connections: Sequence[ConnectionSpec],
        *,
        settings: Settings | None = None,
        store: StateStore | None = None,
        clock: Clock | None = None,
        bus: EventBus | None = None,
        probe_timeout_ms: float = 120_000,
        max_lockouts: int = MAX_LOCKOUT_ENTRIES,
        max_session_pins: int = MAX_SESSION_PINS,
        scrubber: Scrubber | None = None,
    ) -> None:
        self.clock: Clock = clock or SystemClock()
        self.scrubber = scrubber or Scrubber()
        """What an upstream said goes through this before the engine keeps it (`lastError`, events,
        the state file); the pipeline relays error text through the same one."""
        self.bus = bus or EventBus()
        self.store: StateStore = store or MemoryStore()
        self.settings = settings or Settings(clock=self.clock, emit=self._emit)
        self.probe_timeout_ms = probe_timeout_ms
        self.stats = RequestStats()
        self.started_at = self.clock.now()
        self.lockouts = LockoutTable(max_entries=max_lockouts, emit=self._emit, on_drop=self._lockout_dropped)
        self.providers: dict[str, ProviderRuntime] = {}
        self.connections: dict[str, ConnectionRuntime] = {}
        self.pins: OrderedDict[str, tuple[str, float]] = OrderedDict()
        """session -> (connection id, expires_at), least recently refreshed first (see _prune_pins)."""
        self._max_session_pins = max_session_pins
        self._dirty_breakers: set[str] = set()
        self._dirty_connections: set[str] = set()
        self._dirty_lockouts: set[tuple[str, str, str]] = set()
        self._dirty_pins: set[str] = set()
        self._round_robin: dict[str, int] = {}
        self.shared: SharedState | None = None
        """A shared state backend (several replicas, one state; proxy/shared.py), or None (SQLite)."""
        for p in providers:
            breaker = CircuitBreaker(
                p.id,
                p.provider_class,
                self.settings.breaker_policy(p.provider_class),
                probe_timeout_ms=probe_timeout_ms,
                emit=self._emit,
            )
            self.providers[p.id] = ProviderRuntime(p, breaker)
        for c in connections:
            if c.provider not in self.providers:
                raise ValueError(f"connection {c.id!r} names unknown provider {c.provider!r}")
            health = ConnectionHealth(c.id, c.provider, enabled=c.enabled, emit=self._emit)
            # The semaphore speaks on the engine's bus and reads the engine's clock like every
            # other layer, so its fail-open events reach the Events tab and /api/events.
            semaphore = (
                ConnectionSemaphore(c.max_concurrent, key=c.id, clock=self.clock, emit=self._emit)
                if c.max_concurrent
                else None
            )
            runtime = ConnectionRuntime(c, health, semaphore)
            self.connections[c.id] = runtime
            self.providers[c.provider].connections.append(runtime)
        for provider in self.providers.values():
            provider.connections.sort(key=lambda r: r.spec.priority)
        self.settings.add_listener(self._settings_changed)

    # ------------------------------------------------------------------ events and persistence

    def _emit(self, event: Event) -> None:
        if event.layer == "breaker":
            # A breaker also moves on a read (lazy recovery, OPEN -> HALF_OPEN), where no outcome
            # marks it dirty: every transition is persisted, or a restart would replay it later.
            self._dirty_breakers.add(event.key)
        if self.shared is not None and self.shared.publishes(event):
            return  # the backend's change feed brings it to every replica's bus, this one's included
        self.bus.publish(event)

    def _lockout_dropped(self, key: tuple[str, str, str]) -> None:
        # An entry the table evicted or pruned by itself: the next persist() deletes its row, so a
        # restart does not bring it back.
        self._dirty_lockouts.add(key)

    def restore(self, state: StoredState) -> None:
        """Load persisted state (at start, before traffic). Emits nothing.

        A record a layer refuses raises BadRecord naming its table and row, so that the operator
        learns which row of which file to fix instead of reading a bare ValueError.
        """
        for provider_id, record in state.breakers.items():
            runtime = self.providers.get(provider_id)
            if runtime is None:
                continue
            with _stored("breakers", provider_id):
                runtime.breaker = CircuitBreaker.from_record(
                    record,
                    self.settings.breaker_policy(runtime.spec.provider_class),
                    probe_timeout_ms=self.probe_timeout_ms,
                    emit=self._emit,
                )
        for connection_id, record in state.connections.items():
            conn = self.connections.get(connection_id)
            if conn is None:
                continue
            enabled_by_config = conn.spec.enabled
            with _stored("connections", connection_id):
                conn.health.load_record(record)
            if not enabled_by_config:
                conn.health.enabled = False
            stored_fp = state.meta.get(f"fingerprint:{connection_id}")
            if stored_fp is not None and stored_fp != conn.spec.fingerprint and conn.health.terminal:
                # The credential changed in the config: a terminal verdict about the old key is void.
                conn.health.reset(self.clock.now(), reason="credential_changed")
                self._dirty_connections.add(connection_id)
        entries: list[LockoutEntry] = []
        for r in state.lockouts:
            if r.get("provider") in self.providers and r.get("connection_id") in self.connections:
                row = " / ".join(str(r.get(k)) for k in ("provider", "connection_id", "model"))
                with _stored("lockouts", row):
                    entries.append(LockoutEntry.from_record(r))
        self.lockouts.restore(entries)
        now = self.clock.now()
        live = [(k, v) for k, v in state.pins.items() if v[1] > now and v[0] in self.connections]
        # The stored rows come in any order; pruning relies on the oldest deadline being first.
        self.pins = OrderedDict(sorted(live, key=lambda item: item[1][1]))
        # The rest would stay in the database forever: the next persist() deletes their rows.
        self._dirty_pins.update(k for k in state.pins if k not in self.pins)
        self._prune_pins(now, len(self.pins))  # over the ceiling (a lowered MAX_SESSION_PINS)
        for conn in self.connections.values():
            if state.meta.get(f"fingerprint:{conn.spec.id}") != conn.spec.fingerprint:
                self.store.set_meta(f"fingerprint:{conn.spec.id}", conn.spec.fingerprint)

    def persist(self) -> None:
        """Hand every dirty snapshot to the store (cheap: the store's writer thread commits)."""
        if self._dirty_breakers:
            dirty_b, self._dirty_breakers = self._dirty_breakers, set()
            self.store.save_breakers({p: self.providers[p].breaker.to_record() for p in dirty_b})
        if self._dirty_connections:
            dirty_c, self._dirty_connections = self._dirty_connections, set()
            self.store.save_connections({c: self.connections[c].health.to_record() for c in dirty_c})
        if self._dirty_lockouts:
            dirty_l, self._dirty_lockouts = self._dirty_lockouts, set()
            upserts: list[Mapping[str, Any]] = []
            deletes: list[tuple[str, str, str]] = []
            for key in dirty_l:
                entry = self.lockouts.get(*key)
                if entry is None:
                    deletes.append(key)
                else:
                    upserts.append(entry.to_record())
            self.store.save_lockouts(upserts, deletes)
        self._prune_pins(self.clock.now(), len(self.pins))
        if self._dirty_pins:
            dirty_p, self._dirty_pins = self._dirty_pins, set()
            self.store.save_pins(
                {k: self.pins[k] for k in dirty_p if k in self.pins},
                [k for k in dirty_p if k not in self.pins],
            )

    def _prune_pins(self, now: float, limit: int) -> None:
        """Drop up to `limit` pins from the front: expired ones, and any beyond the ceiling.

        `pins` is ordered by last refresh (a refresh moves the pin to the end), and with one TTL for
        all that is also deadline order, so the expired pins are a prefix: this stops at the first
        live one and never scans the table. After the TTL is lowered, newer pins can expire before
        older ones; they then wait behind the older ones for at most the old TTL. Each pin is
        removed once, so the cost is amortised O(1) per pin; persist() deletes the rows.
        """
        pins = self.pins
        ceiling = self._max_session_pins
        dirty = self._dirty_pins
        for _ in range(limit):
            if not pins:
                return
            key = next(iter(pins))  # O(1) on an OrderedDict (a plain dict rescans deleted slots)
            if pins[key][1] > now and len(pins) <= ceiling:
                return
            del pins[key]
            dirty.add(key)

    def _settings_changed(self, settings: Settings) -> None:
        now = self.clock.now()
        for provider in self.providers.values():
            provider.breaker.set_policy(settings.breaker_policy(provider.spec.provider_class), now)
            self._dirty_breakers.add(provider.spec.id)
        queue = settings.queue()
        for conn in self.connections.values():
            if conn.limiter is not None:
                conn.limiter.update(queue)

    # ------------------------------------------------------------------ routing

    def select(
        self,
        targets: Sequence[Target],
        *,
        tried: Iterable[str] = (),
        session: str | None = None,
    ) -> Attempt | NoTarget:
        """Pick the first target with an eligible connection (docs/resilience.md#routing-and-fallback).

        Skips a provider whose breaker rejects, then picks a connection that is enabled, not
        cooling, not terminal and not locked for the model: a live session pin first, then free
        concurrency slots, the lowest `priority`, the least recently used. `tried` holds
        connection ids this request already attempted.
        """
        now = self.clock.now()
        tried_set = set(tried) if tried else None
        lockouts = self.lockouts
        pinned: ConnectionRuntime | None = None
        if session is not None:
            pin = self.pins.get(session)
            if pin is not None and pin[1] > now:
                pinned = self.connections.get(pin[0])
        for target in targets:
            provider = self.providers.get(target.provider)
            if provider is None:
                continue
            breaker = provider.breaker
            if not breaker.can_execute(now):
                continue
            model = target.model
            locked_keys = lockouts.keys_for_model(target.provider, model)
            best: ConnectionRuntime | None = None
            best_free = False
            best_priority = 0
            best_used = 0.0
            for conn in provider.connections:  # sorted by priority
                priority = conn.priority
                if best_free and pinned is None and priority > best_priority:
                    break  # nothing later can beat a free connection with a lower priority number
                cid = conn.id
                if target.connection_id is not None and cid != target.connection_id:
                    continue
                if tried_set is not None and cid in tried_set:
                    continue
                if not conn.health.is_eligible(now):
                    continue
                if locked_keys and lockouts.is_locked(target.provider, cid, model, now):
                    continue
                if conn is pinned:
                    best = conn
                    break
                sem = conn.semaphore
                free = sem is None or sem.has_free_slot()
                if (
                    best is None
                    or (free and not best_free)
                    or (
                        free == best_free
                        and (
                            priority < best_priority
                            or (priority == best_priority and conn.last_used < best_used)
                        )
                    )
                ):
                    best, best_free, best_priority, best_used = conn, free, priority, conn.last_used
            if best is None:
                continue
            admission = breaker.admit(now)
            if admission is Admission.REJECT:
                continue
            best.in_flight += 1
            best.last_used = now
            if admission is Admission.PROBE:
                return Attempt(target, provider, best, True, now, best is pinned, breaker.probe_ticket)
            return Attempt(target, provider, best, False, now, best is pinned)
        return NoTarget(tuple(self._explain(targets, tried_set or set(), now)))

    def explain(self, targets: Sequence[Target], tried: set[str]) -> list[Skip]:
        """Why each of `targets` (or one of its connections) cannot take a request now; `tried` holds
        the connection ids the request already attempted. For the request trail's skips."""
        return list(self._explain(targets, tried, self.clock.now()))

    def _explain(self, targets: Sequence[Target], tried: set[str], now: float) -> Iterable[Skip]:
        """The slow path: why each target was skipped (only computed when nothing was eligible)."""
        for target in targets:
            name = str(target)
            provider = self.providers.get(target.provider)
            if provider is None:
                yield Skip(name, None, "unknown_provider", None, False)
                continue
            state = provider.breaker.state(now)
            if state is BreakerState.OPEN:
                yield Skip(name, None, "circuit_open", now + provider.breaker.retry_after_ms(now), True)
                continue
            if state is BreakerState.HALF_OPEN and not provider.breaker.can_execute(now):
                yield Skip(name, None, "probe_in_flight", now + PROBE_RECOVERY_ESTIMATE_MS, True)
                continue
            candidates = [
                c
                for c in provider.connections
                if target.connection_id is None or c.spec.id == target.connection_id
            ]
            if not candidates:
                yield Skip(name, target.connection_id, "no_connection", None, False)
            for conn in candidates:
                cid = conn.spec.id
                status = conn.health.status(now)
                entry = self.lockouts.get(target.provider, cid, target.model)
                # What blocks a connection now matters more than whether this request tried it:
                # a connection that just failed and is cooling is worth waiting for.
                if status == "cooling":
                    yield Skip(name, cid, "cooling", conn.health.rate_limited_until, True)
                elif status != "active":
                    yield Skip(name, cid, status, None, False)
                elif entry is not None and entry.remaining_ms(now) > 0:
                    waitable = entry.reason not in (NOT_FOUND, "model_not_found", "quota")
                    yield Skip(name, cid, "locked", entry.expires_at, waitable, entry.reason)
                elif cid in tried:
                    yield Skip(name, cid, "already_tried", None, False)

    def order_targets(self, name: str, strategy: str, targets: Sequence[Target]) -> list[Target]:
        """Combo order for one request: as written (`priority`) or rotated (`round-robin`)."""
        if strategy != "round-robin" or len(targets) < 2:
            return list(targets)
        start = self._round_robin.get(name, 0) % len(targets)
        self._round_robin[name] = start + 1
        return [*targets[start:], *targets[:start]]

    def limiter_for(self, conn: ConnectionRuntime, provider: ProviderRuntime) -> RequestLimiter | None:
        """The request-queue limiter of a connection, if the limiter applies to it
        (docs/resilience.md#request-queue)."""
        queue = self.settings.queue()
        enabled = provider.spec.rate_limit
        if enabled is None:
            enabled = queue.auto_enable_api_key_providers and provider.spec.provider_class == "apikey"
        if not enabled:
            return None
        if conn.limiter is None:
            conn.limiter = RequestLimiter(queue, self.clock)
        return conn.limiter

    def still_eligible(self, attempt: Attempt) -> bool:
        """May an attempt that waited in its connection's request queue still be sent?

        Not when, while it waited, the connection started cooling or became terminal or disabled,
        its model was locked on it, or (unless it is the probe) its provider's breaker opened:
        `select` would not pick it now, and sending it would only add to what the upstream refuses.
        """
        now = self.clock.now()
        conn = attempt.connection
        if not conn.health.is_eligible(now):
            return False
        target = attempt.target
        if len(self.lockouts) and self.lockouts.is_locked(target.provider, conn.id, target.model, now):
            return False
        return attempt.probe or attempt.provider.breaker.state(now) is not BreakerState.OPEN

    def _recheck_queues(self, provider: ProviderRuntime) -> None:
        """Have the requests queued on a provider's connections ask `still_eligible` again."""
        for conn in provider.connections:
            if conn.limiter is not None:
                conn.limiter.recheck()

    # ------------------------------------------------------------------ outcomes

    def record(self, attempt: Attempt, outcome: Outcome, *, session: str | None = None) -> Recorded:
        """Classify one attempt's outcome and apply it to the three layers."""
        now = self.clock.now()
        provider = attempt.provider
        conn = attempt.connection
        conn.in_flight -= 1
        pid = provider.spec.id
        cid = conn.spec.id
        model = attempt.target.model

        if outcome.body or outcome.error:
            # Only failures carry text; it may quote the key the attempt was sent with.
            scrub = self.scrubber
            outcome = Outcome(
                outcome.kind, outcome.status, outcome.headers, scrub(outcome.body), scrub(outcome.error)
            )

        client_retry: int | None = None
        if outcome.kind is OutcomeKind.STATUS and outcome.status is not None and outcome.status >= 400:
            restated = restate(outcome.status, outcome.body, provider.rules) if provider.rules else None
            if restated is not None:
                client_retry = restated.retry_after_ms
                outcome = Outcome(outcome.kind, restated.status, outcome.headers, outcome.body, outcome.error)

        lockout_settings = self.settings.lockout()
        verdict = classify(outcome, per_model_quota=provider.spec.per_model_quota, lockout=lockout_settings)

        breaker = provider.breaker
        if self.shared is not None and (verdict.breaker is not BreakerEffect.NONE or attempt.probe):
            self.shared.breaker(pid, verdict.breaker, now, probe=attempt.probe)
        if verdict.breaker is BreakerEffect.SUCCESS:
            breaker.record_success(now, probe=attempt.probe_ticket)
        elif verdict.breaker is BreakerEffect.FAILURE:
            breaker.record_failure(now, probe=attempt.probe_ticket)
        elif attempt.probe:
            breaker.release_probe(now, attempt.probe_ticket)
        if verdict.breaker is not BreakerEffect.NONE or attempt.probe:
            self._dirty_breakers.add(pid)

        health = conn.health
        effect = verdict.connection
        if effect is ConnectionEffect.CLEAR:
            if health.terminal is None and (
                health.last_error is not None or health.backoff_level or health.rate_limited_until is not None
            ):
                self._connection_op(cid, lambda h: h.record_success(now))
        elif effect is not ConnectionEffect.NONE:
            error = _describe(outcome, verdict)
            if effect is ConnectionEffect.COOLDOWN:
                policy = self.settings.cooldown_policy(provider.spec.provider_class)
                hint = (
                    parse_retry_hint(outcome.headers, outcome.body, now)
                    if policy.use_upstream_retry_hints
                    else None
                )
                reason, code, no_cooling = verdict.reason, outcome.status, conn.spec.disable_cooling
                self._connection_op(
                    cid,
                    lambda h: h.record_failure(
                        now,
                        policy,
                        error=error,
                        error_type=reason,
                        code=code,
                        hint_ms=hint,
                        disable_cooling=no_cooling,
                    ),
                )
            else:
                status, code = effect.value, outcome.status
                self._connection_op(cid, lambda h: h.mark_terminal(now, status, error=error, code=code))

        if verdict.lockout is LockoutEffect.DECAY:
            if len(self.lockouts) and self.lockouts.get(pid, cid, model) is not None:
                self._lockout_op((pid, cid, model), lambda t: t.record_success(pid, cid, model, now))
        elif verdict.lockout is LockoutEffect.LOCK:
            hint = (
                parse_retry_hint(outcome.headers, outcome.body, now)
                if outcome.headers or outcome.body
                else None
            )
            lock_status, lock_reason, lock_hint, started = (
                outcome.status,
                verdict.reason,
                hint,
                attempt.started_at,
            )
            self._lockout_op(
                (pid, cid, model),
                lambda t: t.record_failure(
                    pid,
                    cid,
                    model,
                    now,
                    lockout_settings,
                    status=lock_status,
                    reason=lock_reason,
                    hint_ms=lock_hint,
                    started_at=started,
                ),
            )

        if (
            verdict.breaker is BreakerEffect.FAILURE
            or effect not in (ConnectionEffect.NONE, ConnectionEffect.CLEAR)
            or verdict.lockout is LockoutEffect.LOCK
        ):
            self._recheck_queues(provider)

        if session is not None and outcome.is_success:
            ttl = self.settings.session_ttl_ms()
            if ttl > 0:
                pins = self.pins
                pins[session] = (cid, now + ttl)
                pins.move_to_end(session)
                self._dirty_pins.add(session)
                self._prune_pins(now, PIN_PRUNE_STEP)

        return Recorded(verdict, outcome.status, client_retry)

    def _connection_op(self, connection_id: str, op: ConnectionOp) -> None:
        """Apply one change to a connection's health: here, and (first) in the shared state."""
        if self.shared is not None:
            self.shared.connection(connection_id, op)
        op(self.connections[connection_id].health)
        self._dirty_connections.add(connection_id)

    def _lockout_op(self, key: tuple[str, str, str], op: LockoutOp) -> None:
        """Apply one change to one triple's lockout: here, and (first) in the shared state."""
        if self.shared is not None:
            self.shared.lockout(key, op)
        op(self.lockouts)
        self._dirty_lockouts.add(key)

    def probe_waiting(self, attempt: Attempt) -> None:
        """The attempt is about to wait in our own queues. A probe's lease stops running meanwhile:
        its owner is alive and settles it on every path, and time it spends queued behind other
        requests must not let a second probe in."""
        if attempt.probe:
            attempt.provider.breaker.hold_probe(attempt.probe_ticket)

    def probe_alive(self, attempt: Attempt) -> None:
        """A sign of progress (dispatched, response headers, a chunk relayed): a probe's lease
        starts over, so a probe that streams for longer than the lease keeps its slot."""
        if attempt.probe:
            attempt.provider.breaker.renew_probe(self.clock.now(), attempt.probe_ticket)
            if self.shared is not None:
                self.shared.probe_alive(attempt.provider.spec.id)

    # ------------------------------------------------------------------ operator actions

    def _operator(self, action: str, reason: str) -> None:
        self._emit(Event(self.clock.now(), "operator", action, "", "", reason))

    def reset_breakers(self, provider: str | None = None, *, source: str = "api") -> int:
        """Reset one provider's breaker, or all; returns how many. KeyError for an unknown provider."""
        now = self.clock.now()
        if provider is not None and provider not in self.providers:
            raise KeyError(provider)
        ids = [provider] if provider is not None else list(self.providers)
        for pid in ids:
            if self.shared is not None:
                self.shared.reset_breaker(pid, now)
            self.providers[pid].breaker.reset(now, "operator")
            self._dirty_breakers.add(pid)
        self._operator(f"reset breaker {provider or '--all'}", source)
        return len(ids)

    def reset_connection(self, connection_id: str | None = None, *, source: str = "api") -> int:
        now = self.clock.now()
        if connection_id is not None and connection_id not in self.connections:
            raise KeyError(connection_id)
        ids = [connection_id] if connection_id is not None else list(self.connections)
        for cid in ids:
            self._connection_op(cid, lambda h: h.reset(now, "operator"))
        self._operator(f"reset connection {connection_id or '--all'}", source)
        return len(ids)

    def set_connection_enabled(self, connection_id: str, enabled: bool, *, source: str = "api") -> None:
        if connection_id not in self.connections:
            raise KeyError(connection_id)
        conn = self.connections[connection_id]
        now = self.clock.now()
        self._connection_op(connection_id, lambda h: h.set_enabled(enabled, now))
        if not enabled and conn.limiter is not None:
            conn.limiter.recheck()  # what waits in its queue is not sent to a disabled connection
        self._operator(f"{'enable' if enabled else 'disable'} {connection_id}", source)

    def reenable(
        self, provider: str, model: str, connection_id: str | None = None, *, source: str = "api"
    ) -> int:
        """Lift the lockouts of one model: on one connection, or across the provider's connections."""
        runtime = self.providers.get(provider)
        now = self.clock.now()
        if runtime is not None:
            keys = [
                (provider, c.spec.id, model)
                for c in runtime.connections
                if connection_id is None or c.spec.id == connection_id
            ]
            self._dirty_lockouts.update(keys)
            if self.shared is not None:
                for key in keys:
                    self.shared.lockout(key, reenable_op(key, now))
        removed = self.lockouts.reenable(provider, model, now, connection_id)
        suffix = f" --connection {connection_id}" if connection_id else ""
        self._operator(f"reenable {provider}/{model}{suffix}", source)
        return removed

    def reenable_all(self, *, source: str = "api") -> int:
        keys = self.lockouts.keys()
        self._dirty_lockouts.update(keys)
        now = self.clock.now()
        if self.shared is not None:
            for key in keys:
                self.shared.lockout(key, reenable_op(key, now))
        removed = self.lockouts.reenable_all(now)
        self._operator("reenable --all", source)
        return removed

    def lockout_table_status(self) -> LockoutTableStatus:
        """How full the lockout table is: `size` of `capacity` entries (`full` when equal), how many
        are `not_found` locks (each provider+connection keeps at most `not_found_budget`), and since
        the start how many `not_found` entries were `evicted` and how many new locks were `refused`
        because the table was full of other active locks. O(1): cheap enough for every console tick.
        `.to_api()` is the `lockoutTable` object of `GET /api/monitoring/health`."""
        return self.lockouts.status()


def _describe(outcome: Outcome, verdict: Verdict) -> str:
    """A short description of an error for `lastError` (its text was scrubbed in `record`)."""
    if outcome.kind is OutcomeKind.STATUS:
        body = " ".join(outcome.body.split())[:160]
        return f"{outcome.status}: {body}" if body else f"{outcome.status} {verdict.reason}"
    return outcome.error or verdict.reason


@contextmanager
def _stored(table: str, row: str) -> Iterator[None]:
    """Name the table and row of a stored record a layer refuses to restore (it raises ValueError)."""
    try:
        yield
    except ValueError as exc:
        raise BadRecord(table, repr(row), str(exc)) from None
