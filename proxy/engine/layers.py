"""The layers wired together: the state every part of the engine reads and writes.

One breaker per provider, one `ConnectionHealth` (and, with `max_concurrent`, one semaphore) per
connection, the lockout table, the session pins and the settings, all on one clock and one bus.
Routing, outcomes, operator actions and persistence each get this object: they share the
layers, not each other. Every mutation marks its object in `dirty`, which `persist` hands to the store.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.engine.pins import SessionPins
from proxy.engine.specs import ConnectionRuntime, ConnectionSpec, ProviderRuntime, ProviderSpec
from proxy.resilience.breaker import CircuitBreaker
from proxy.resilience.clock import Clock
from proxy.resilience.cooldown import ConnectionHealth
from proxy.resilience.events import Event, EventBus
from proxy.resilience.lockout import LockoutTable
from proxy.resilience.semaphore import ConnectionSemaphore
from proxy.settings import Settings
from proxy.shared import ConnectionOp, LockoutOp, SharedState


class Dirty:
    """What changed since the last persist, by key (the pins keep their own: `SessionPins.dirty`).

    Each set is swapped for a new one when persisted, so hold the `Dirty`, never one of its sets."""

    __slots__ = ("breakers", "connections", "lockouts")

    def __init__(self) -> None:
        self.breakers: set[str] = set()
        self.connections: set[str] = set()
        self.lockouts: set[tuple[str, str, str]] = set()


class Layers:
    def __init__(
        self,
        providers: Sequence[ProviderSpec],
        connections: Sequence[ConnectionSpec],
        *,
        settings: Settings | None,
        clock: Clock,
        bus: EventBus,
        probe_timeout_ms: float,
        max_lockouts: int,
        max_session_pins: int,
    ) -> None:
        self.clock = clock
        self.bus = bus
        self.dirty = Dirty()
        self.shared: SharedState | None = None
        """A shared state backend (several replicas, one state; proxy/shared.py), or None (SQLite)."""
        self.settings = settings or Settings(clock=clock, emit=self.emit)
        self.probe_timeout_ms = probe_timeout_ms
        self.lockouts = LockoutTable(max_entries=max_lockouts, emit=self.emit, on_drop=self._lockout_dropped)
        self.pins = SessionPins(max_session_pins)
        self.providers: dict[str, ProviderRuntime] = {}
        self.connections: dict[str, ConnectionRuntime] = {}
        for p in providers:
            self.providers[p.id] = ProviderRuntime(p, self.breaker_for(p))
        for c in connections:
            if c.provider not in self.providers:
                raise ValueError(f"connection {c.id!r} names unknown provider {c.provider!r}")
            health = ConnectionHealth(c.id, c.provider, enabled=c.enabled, emit=self.emit)
            # The semaphore speaks on the engine's bus and reads the engine's clock like every
            # other layer, so its fail-open events reach the Events tab and /api/events.
            semaphore = (
                ConnectionSemaphore(c.max_concurrent, key=c.id, clock=clock, emit=self.emit)
                if c.max_concurrent
                else None
            )
            runtime = ConnectionRuntime(c, health, semaphore)
            self.connections[c.id] = runtime
            self.providers[c.provider].connections.append(runtime)
        for provider in self.providers.values():
            provider.connections.sort(key=lambda r: r.spec.priority)
        self.settings.add_listener(self._settings_changed)

    def breaker_for(self, spec: ProviderSpec) -> CircuitBreaker:
        return CircuitBreaker(
            spec.id,
            spec.provider_class,
            self.settings.breaker_policy(spec.provider_class),
            probe_timeout_ms=self.probe_timeout_ms,
            emit=self.emit,
        )

    def emit(self, event: Event) -> None:
        """Every layer's events go through here to the bus."""
        if event.layer == "breaker":
            # A breaker also moves on a read (lazy recovery, OPEN -> HALF_OPEN), where no outcome
            # marks it dirty: every transition is persisted, or a restart would replay it later.
            self.dirty.breakers.add(event.key)
        if self.shared is not None and self.shared.publishes(event):
            return  # the backend's change feed brings it to every replica's bus, this one's included
        self.bus.publish(event)

    def connection_op(self, connection_id: str, op: ConnectionOp, *, by_operator: bool = False) -> None:
        """Apply one change to a connection's health: here, and (first) in the shared state."""
        if self.shared is not None:
            self.shared.connection(connection_id, op, by_operator=by_operator)
        op(self.connections[connection_id].health)
        self.dirty.connections.add(connection_id)

    def lockout_op(self, key: tuple[str, str, str], op: LockoutOp) -> None:
        """Apply one change to one triple's lockout: here, and (first) in the shared state."""
        if self.shared is not None:
            self.shared.lockout(key, op)
        op(self.lockouts)
        self.dirty.lockouts.add(key)

    def _lockout_dropped(self, key: tuple[str, str, str]) -> None:
        # An entry the table evicted or pruned by itself: the next persist() deletes its row, so a
        # restart does not bring it back.
        self.dirty.lockouts.add(key)

    def _settings_changed(self, settings: Settings) -> None:
        now = self.clock.now()
        for provider in self.providers.values():
            provider.breaker.set_policy(settings.breaker_policy(provider.spec.provider_class), now)
            self.dirty.breakers.add(provider.spec.id)
        queue = settings.queue()
        for conn in self.connections.values():
            if conn.limiter is not None:
                conn.limiter.update(queue)

    def recheck_queues(self, provider: ProviderRuntime) -> None:
        """Have the requests queued on a provider's connections (for a slot, or in a request
        queue) ask `still_eligible` again."""
        for conn in provider.connections:
            conn.recheck()


class EnginePart:
    """A part of the engine (routing, outcomes, actions, persistence): it reads and writes the layers.

    The layers' objects are copied onto the part, so the hot path pays one attribute lookup for
    them, not two; none of them is ever replaced, so the copies cannot go stale."""

    def __init__(self, layers: Layers) -> None:
        self._layers = layers
        self.clock = layers.clock
        self.settings = layers.settings
        self.providers = layers.providers
        self.connections = layers.connections
        self.lockouts = layers.lockouts
        self.pins = layers.pins
        self.dirty = layers.dirty
