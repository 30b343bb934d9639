"""The resilience engine: the layers, wired together, with routing, outcomes, actions and persistence.

`Engine` is a facade. It knows nothing of HTTP: the server asks it for an `Attempt` (`select`),
runs the attempt, and reports what came back (`record`). Every decision is returned as a value;
every transition is published on the bus. Behind it, one module per idea, all sharing one `Layers`:

- `layers.py`: the breakers, connection healths, semaphores, lockout table, pins and settings,
  wired to one clock and one bus, and what changed since the last persist;
- `routing.py`: `select`, `explain`, the combo order, the request queues' limiters;
- `outcomes.py`: `record` (restate, classify, apply) and the probe's lease;
- `actions.py`: the operator's resets, enables and re-enables;
- `persistence.py`: `restore` at start and the write-behind `persist`;
- `specs.py`, `decisions.py`, `stats.py`, `pins.py`: what it is built from, what it answers, the
  request counters, the session pins.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from proxy.engine.actions import OperatorActions
from proxy.engine.decisions import Attempt, NoTarget, Recorded, Skip
from proxy.engine.layers import Layers
from proxy.engine.outcomes import Outcomes
from proxy.engine.persistence import Persistence
from proxy.engine.pins import MAX_SESSION_PINS, PIN_PRUNE_STEP
from proxy.engine.routing import PROBE_RECOVERY_ESTIMATE_MS, Routing
from proxy.engine.specs import ConnectionRuntime, ConnectionSpec, ProviderRuntime, ProviderSpec, Target
from proxy.engine.stats import RequestStats
from proxy.resilience.clock import Clock, SystemClock
from proxy.resilience.events import EventBus
from proxy.resilience.lockout import MAX_LOCKOUT_ENTRIES, LockoutTableStatus
from proxy.scrub import Scrubber
from proxy.settings import Settings
from proxy.shared import SharedState
from proxy.store import MemoryStore, StateStore, StoredState

__all__ = [
    "MAX_SESSION_PINS",
    "PIN_PRUNE_STEP",
    "PROBE_RECOVERY_ESTIMATE_MS",
    "Attempt",
    "ConnectionRuntime",
    "ConnectionSpec",
    "Engine",
    "NoTarget",
    "ProviderRuntime",
    "ProviderSpec",
    "Recorded",
    "RequestStats",
    "Skip",
    "Target",
]


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
        layers = Layers(
            providers,
            connections,
            settings=settings,
            clock=self.clock,
            bus=self.bus,
            probe_timeout_ms=probe_timeout_ms,
            max_lockouts=max_lockouts,
            max_session_pins=max_session_pins,
        )
        self._layers = layers
        self.settings = layers.settings
        self.probe_timeout_ms = probe_timeout_ms
        self.stats = RequestStats()
        self.started_at = self.clock.now()
        self.lockouts = layers.lockouts
        self.providers = layers.providers
        self.connections = layers.connections
        self._routing = Routing(layers)
        self._outcomes = Outcomes(layers, self.scrubber)
        # The calls every request makes go straight to their part: a facade method in between
        # would be a Python call of its own for each (about 700 instructions on 3.11).
        self.select = self._routing.select
        """Pick the first target with an eligible connection (docs/resilience.md#routing-and-fallback);
        `tried` holds connection ids this request already attempted. See `Routing.select`."""
        self.record = self._outcomes.record
        """Classify one attempt's outcome and apply it to the three layers (`Outcomes.record`)."""
        self.limiter_for = self._routing.limiter_for
        """The request-queue limiter of a connection, if the limiter applies to it."""
        self._actions = OperatorActions(layers)
        self._persistence = Persistence(layers, self.store)

    @property
    def shared(self) -> SharedState | None:
        """A shared state backend (several replicas, one state; proxy/shared.py), or None (SQLite)."""
        return self._layers.shared

    @shared.setter
    def shared(self, backend: SharedState | None) -> None:
        self._layers.shared = backend

    @property
    def pins(self) -> OrderedDict[str, tuple[str, float]]:
        """session -> (connection id, expires_at), least recently refreshed first."""
        return self._layers.pins.table

    def adopt_pin(self, session: str, connection_id: str, expires_at: float) -> None:
        """Take a session pin another replica made (a fleet): the later pin wins; a pin naming a
        connection this replica does not know is ignored."""
        if connection_id in self.connections:
            self._layers.pins.adopt(session, connection_id, expires_at, self.clock.now())

    # -- routing (routing.py) ------------------------------------------------------------------

    def explain(self, targets: Sequence[Target], tried: set[str]) -> list[Skip]:
        """Why each of `targets` (or one of its connections) cannot take a request now."""
        return self._routing.explain(targets, tried)

    def order_targets(self, name: str, strategy: str, targets: Sequence[Target]) -> list[Target]:
        """Combo order for one request: as written (`priority`) or rotated (`round-robin`)."""
        return self._routing.order_targets(name, strategy, targets)

    def still_eligible(self, attempt: Attempt) -> bool:
        """May an attempt that waited in its connection's request queue still be sent?"""
        return self._routing.still_eligible(attempt)

    # -- outcomes (outcomes.py) ----------------------------------------------------------------

    def probe_waiting(self, attempt: Attempt) -> None:
        """The attempt is about to wait in our own queues: a probe's lease stops running meanwhile."""
        self._outcomes.probe_waiting(attempt)

    def probe_alive(self, attempt: Attempt) -> None:
        """A sign of progress: a probe's lease starts over."""
        self._outcomes.probe_alive(attempt)

    # -- operator actions (actions.py) ---------------------------------------------------------

    def reset_breakers(self, provider: str | None = None, *, source: str = "api") -> int:
        """Reset one provider's breaker, or all; returns how many. KeyError for an unknown provider."""
        return self._actions.reset_breakers(provider, source=source)

    def reset_connection(self, connection_id: str | None = None, *, source: str = "api") -> int:
        return self._actions.reset_connection(connection_id, source=source)

    def set_connection_enabled(self, connection_id: str, enabled: bool, *, source: str = "api") -> None:
        self._actions.set_connection_enabled(connection_id, enabled, source=source)

    def reenable(
        self, provider: str, model: str, connection_id: str | None = None, *, source: str = "api"
    ) -> int:
        """Lift the lockouts of one model: on one connection, or across the provider's connections."""
        return self._actions.reenable(provider, model, connection_id, source=source)

    def reenable_all(self, *, source: str = "api") -> int:
        return self._actions.reenable_all(source=source)

    def announce(self, action: str, *, source: str = "api") -> None:
        """An operator action made beside the engine (a settings change), told as the others are."""
        self._actions.announce(action, source=source)

    def lockout_table_status(self) -> LockoutTableStatus:
        """How full the lockout table is: `size` of `capacity` entries (`full` when equal), how many
        are `not_found` locks (each provider+connection keeps at most `not_found_budget`), and since
        the start how many `not_found` entries were `evicted` and how many new locks were `refused`
        because the table was full of other active locks. O(1): cheap enough for every console tick.
        `.to_api()` is the `lockoutTable` object of `GET /api/monitoring/health`."""
        return self.lockouts.status()

    # -- persistence (persistence.py) ----------------------------------------------------------

    def restore(self, state: StoredState, *, rewind: bool = True) -> None:
        """Load persisted state (at start, before traffic). Emits nothing; BadRecord names a refused row.
        `rewind`: move its times back by as much as this clock went back since it wrote them
        (`persistence.rewound`); not for a fleet's state, which other machines' clocks wrote."""
        self._persistence.restore(state, rewind=rewind)

    def persist(self) -> None:
        """Hand every dirty snapshot to the store (cheap: the store's writer thread commits)."""
        self._persistence.persist()
