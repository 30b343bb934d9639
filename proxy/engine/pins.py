"""Session pins: a client session keeps going to the connection that last served it.

The table is bounded: session ids are the client's choice, so past `MAX_SESSION_PINS` the least
recently refreshed pin gives way. It is kept in refresh order, so expired pins are a prefix and
pruning never scans (see `SessionPins.prune`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Mapping

MAX_SESSION_PINS = 100_000
"""Session pins kept at most: session ids are the client's choice, so the table needs a ceiling
beyond which the least recently refreshed pin gives way (it costs that session its affinity)."""
PIN_PRUNE_STEP = 4
"""Expired pins a new pin removes on the request path: more than one, so the request path alone
keeps the table at its live size; a small constant, so no request pays for a large cleanup."""


class SessionPins:
    """session -> (connection id, expires_at), least recently refreshed first, plus what changed."""

    __slots__ = ("dirty", "max_pins", "table")

    def __init__(self, max_pins: int = MAX_SESSION_PINS) -> None:
        self.table: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self.max_pins = max_pins
        self.dirty: set[str] = set()
        """Sessions whose row must be written or deleted at the next persist."""

    def connection_for(self, session: str, now: float) -> str | None:
        """The connection id a live pin names, None if there is none or it expired."""
        pin = self.table.get(session)
        return pin[0] if pin is not None and pin[1] > now else None

    def pin(self, session: str, connection_id: str, now: float, ttl_ms: int) -> None:
        """Pin (or refresh) a session after a success, pruning a few expired pins on the way."""
        pins = self.table
        pins[session] = (connection_id, now + ttl_ms)
        pins.move_to_end(session)
        self.dirty.add(session)
        self.prune(now, PIN_PRUNE_STEP)

    def adopt(self, session: str, connection_id: str, expires_at: float, now: float) -> bool:
        """Take a pin another replica made (a fleet, proxy/shared.py): the later pin wins.

        Pins share one TTL, so the later deadline is the later success: a pin this replica made
        after the other one's stays (its own write may still be on its way). Not marked dirty: the
        pin is the fleet's, not this replica's to persist. True when the table changed."""
        if expires_at <= now:
            return False
        pins = self.table
        mine = pins.get(session)
        if mine is not None and mine[1] >= expires_at:
            return False
        pins[session] = (connection_id, expires_at)
        pins.move_to_end(session)
        self.prune(now, PIN_PRUNE_STEP)
        return True

    def restore(
        self, stored: Mapping[str, tuple[str, float]], connections: Container[str], now: float
    ) -> None:
        """Load the stored pins still alive and naming a known connection; the rest are marked for deletion."""
        live = [(k, v) for k, v in stored.items() if v[1] > now and v[0] in connections]
        # The stored rows come in any order; pruning relies on the oldest deadline being first.
        self.table = OrderedDict(sorted(live, key=lambda item: item[1][1]))
        # The rest would stay in the database forever: the next persist() deletes their rows.
        self.dirty.update(k for k in stored if k not in self.table)
        self.prune(now, len(self.table))  # over the ceiling (a lowered MAX_SESSION_PINS)

    def take_dirty(self) -> tuple[dict[str, tuple[str, float]], list[str]]:
        """(pins to write, sessions to delete) since the last call."""
        dirty, self.dirty = self.dirty, set()
        pins = self.table
        return {k: pins[k] for k in dirty if k in pins}, [k for k in dirty if k not in pins]

    def prune(self, now: float, limit: int) -> None:
        """Drop up to `limit` pins from the front: expired ones, and any beyond the ceiling.

        `table` is ordered by last refresh (a refresh moves the pin to the end), and with one TTL for
        all that is also deadline order, so the expired pins are a prefix: this stops at the first
        live one and never scans the table. After the TTL is lowered, newer pins can expire before
        older ones; they then wait behind the older ones for at most the old TTL. Each pin is
        removed once, so the cost is amortised O(1) per pin; persist() deletes the rows.
        """
        pins = self.table
        ceiling = self.max_pins
        dirty = self.dirty
        for _ in range(limit):
            if not pins:
                return
            key = next(iter(pins))  # O(1) on an OrderedDict (a plain dict rescans deleted slots)
            if pins[key][1] > now and len(pins) <= ceiling:
                return
            del pins[key]
            dirty.add(key)
