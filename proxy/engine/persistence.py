"""Persistence: the engine's state to and from the store, write-behind.

Mutations only mark objects dirty (a set add, in `Layers.dirty` and `SessionPins.dirty`);
`persist()`, called by the server every 250 ms and at shutdown, hands the dirty snapshots to the
store, whose writer thread commits them, so the request path never waits for the disk. `restore`
loads them back at start, before traffic, and names the table and row of any record a layer refuses.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from proxy.engine.layers import EnginePart, Layers
from proxy.resilience.breaker import CircuitBreaker
from proxy.resilience.lockout import LockoutEntry
from proxy.store import BadRecord, StateStore, StoredState


class Persistence(EnginePart):
    def __init__(self, layers: Layers, store: StateStore) -> None:
        super().__init__(layers)
        self.store = store

    def restore(self, state: StoredState) -> None:
        """Load persisted state (at start, before traffic). Emits nothing.

        A record a layer refuses raises BadRecord naming its table and row, so that the operator
        learns which row of which file to fix instead of reading a bare ValueError.
        """
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
