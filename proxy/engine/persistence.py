"""Persistence: the engine's state to and from the store, write-behind.

Mutations only mark objects dirty (a set add, in `Layers.dirty` and `SessionPins.dirty`);
`persist()`, called by the server every 250 ms and at shutdown, hands the dirty snapshots to the
store, whose writer thread commits them, so the request path never waits for the disk. `restore`
loads them back at start, before traffic, and names the table and row of any record a layer refuses.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from proxy.engine.layers import EnginePart, Layers
from proxy.resilience.breaker import CircuitBreaker
from proxy.resilience.lockout import LockoutEntry
from proxy.store import BadRecord, StateStore, StoredState

log = logging.getLogger("omniroute")


class Persistence(EnginePart):
    def __init__(self, layers: Layers, store: StateStore) -> None:
        super().__init__(layers)
        self.store = store

    def restore(self, state: StoredState, *, rewind: bool = True) -> None:
        """Load persisted state (at start, before traffic). Emits nothing.

        A record a layer refuses raises BadRecord naming its table and row, so that the operator
        learns which row of which file to fix instead of reading a bare ValueError.
        """
        if rewind:  # (not a fleet's shared state: other machines' clocks wrote it)
            state = rewound(state, self.clock.now())
        layers = self._layers
        for provider_id, record in state.breakers.items():
            runtime = self.providers.get(provider_id)
            if runtime is None:
                continue
            with _stored("breakers", provider_id):
                runtime.breaker = CircuitBreaker.from_record(
                    record,
                    self.settings.breaker_policy(runtime.spec.provider_class),
                    probe_timeout_ms=layers.probe_timeout_ms,
                    emit=layers.emit,
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
                self.dirty.connections.add(connection_id)
        entries: list[LockoutEntry] = []
        for r in state.lockouts:
            if r.get("provider") in self.providers and r.get("connection_id") in self.connections:
                row = " / ".join(str(r.get(k)) for k in ("provider", "connection_id", "model"))
                with _stored("lockouts", row):
                    entries.append(LockoutEntry.from_record(r))
        self.lockouts.restore(entries)
        self.pins.restore(state.pins, self.connections, self.clock.now())
        for conn in self.connections.values():
            if state.meta.get(f"fingerprint:{conn.spec.id}") != conn.spec.fingerprint:
                self.store.set_meta(f"fingerprint:{conn.spec.id}", conn.spec.fingerprint)

    def persist(self) -> None:
        """Hand every dirty snapshot to the store (cheap: the store's writer thread commits)."""
        dirty = self.dirty
        if dirty.breakers:
            dirty_b, dirty.breakers = dirty.breakers, set()
            self.store.save_breakers({p: self.providers[p].breaker.to_record() for p in dirty_b})
        if dirty.connections:
            dirty_c, dirty.connections = dirty.connections, set()
            self.store.save_connections({c: self.connections[c].health.to_record() for c in dirty_c})
        if dirty.lockouts:
            dirty_l, dirty.lockouts = dirty.lockouts, set()
            upserts: list[Mapping[str, Any]] = []
            deletes: list[tuple[str, str, str]] = []
            for key in dirty_l:
                entry = self.lockouts.get(*key)
                if entry is None:
                    deletes.append(key)
                else:
                    upserts.append(entry.to_record())
            self.store.save_lockouts(upserts, deletes)
        pins = self.pins
        pins.prune(self.clock.now(), len(pins.table))
        if pins.dirty:
            self.store.save_pins(*pins.take_dirty())


@contextmanager
def _stored(table: str, row: str) -> Iterator[None]:
    """Name the table and row of a stored record a layer refuses to restore (it raises ValueError)."""
    try:
        yield
    except ValueError as exc:
        raise BadRecord(table, repr(row), str(exc)) from None


EVENT_TIMES = ("opened_at", "last_failure_at", "last_transition_at", "last_error_at", "locked_at")
"""The fields of stored records that say when something happened (the others ending in `_at` or
`_until` are deadlines): none can be later than now, unless the clock went back since."""
CLOCK_SLACK_MS = 1_000.0


def rewound(state: StoredState, now: float) -> StoredState:
    """`state` with every stored time moved back by as much as the clock went back since it was
    written. A time something happened that lies in the future can only come from a clock that was
    ahead then (a dual-boot's hardware clock in local time, corrected by NTP before a restart):
    restored as they are, its deadlines (an OPEN breaker's, a cooldown's, a lockout's) would
    outlast the correction by as much, hours, until an operator reset them by hand."""
    records = [*state.breakers.values(), *state.connections.values(), *state.lockouts]
    latest = max(
        (
            v
            for r in records
            for k in EVENT_TIMES
            if isinstance(v := r.get(k), int | float) and not isinstance(v, bool)
        ),
        default=now,
    )
    ahead = latest - now
    if ahead <= CLOCK_SLACK_MS:
        return state
    log.warning(
        "the state file holds times up to %.0f s ahead of the clock (it went back since they were"
        " written): its deadlines are moved back by as much",
        ahead / 1000,
    )

    def back(record: dict[str, Any]) -> dict[str, Any]:
        return {
            k: v - ahead
            if (k.endswith(("_at", "_until")) and isinstance(v, int | float) and not isinstance(v, bool))
            else v
            for k, v in record.items()
        }

    return dataclasses.replace(
        state,
        breakers={k: back(r) for k, r in state.breakers.items()},
        connections={k: back(r) for k, r in state.connections.items()},
        lockouts=[back(r) for r in state.lockouts],
        pins={k: (c, e - ahead) for k, (c, e) in state.pins.items()},
    )
