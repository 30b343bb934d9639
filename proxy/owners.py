"""Which connection created each Responses API response, so its follow-up routes reach it.

`GET /v1/responses/{id}`, `DELETE /v1/responses/{id}` and `POST /v1/responses/{id}/cancel` only
make sense on the upstream (and with the key) that created the response: another connection
answers 404 for an id it never issued. The pipeline tells this memory the id of every response
it relays; entries live `RESPONSE_TTL_MS` (24 h) and are persisted like session pins, in the
same table under a key no session header can produce (a leading tab: HTTP strips it from header
values), so a restart keeps them without a schema change.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from proxy.resilience.clock import Clock
from proxy.store import StateStore

RESPONSE_TTL_MS = 24 * 3600 * 1000
MAX_RESPONSES = 100_000
"""Ids kept at most: a burst of answers beyond it forgets the oldest first."""
KEY_PREFIX = "\tresponse:"
PRUNE_STEP = 4
"""Expired entries a new one removes, as for session pins: the request path keeps the table at its
live size without ever paying for a large cleanup."""


class ResponseOwners:
    def __init__(self, clock: Clock, store: StateStore, *, limit: int = MAX_RESPONSES) -> None:
        self._clock = clock
        self._store = store
        self._limit = limit
        self._owners: OrderedDict[str, tuple[str, float]] = OrderedDict()
        """response id -> (connection id, expires_at epoch ms), oldest first."""
        self._dirty: set[str] = set()

    def __len__(self) -> int:
        return len(self._owners)

    def take(self, pins: dict[str, tuple[str, float]], connections: Mapping[str, object]) -> None:
        """Move this memory's rows out of the stored pins (the rest are session pins): live ones whose
        connection still exists are kept, the others are deleted on the next `persist`."""
        now = self._clock.now()
        mine = [k for k in pins if k.startswith(KEY_PREFIX)]
        live = []
        for key in mine:
            connection_id, expires_at = pins.pop(key)
            if expires_at > now and connection_id in connections:
                live.append((key[len(KEY_PREFIX) :], (connection_id, expires_at)))
            else:
                self._dirty.add(key[len(KEY_PREFIX) :])
        self._owners = OrderedDict(sorted(live, key=lambda item: item[1][1]))

    def remember(self, response_id: str, connection_id: str) -> None:
        now = self._clock.now()
        self._owners[response_id] = (connection_id, now + RESPONSE_TTL_MS)
        self._owners.move_to_end(response_id)
        self._dirty.add(response_id)
        self._prune(now, PRUNE_STEP)

    def owner(self, response_id: str) -> str | None:
        """The connection that created `response_id`, or None when unknown (or older than 24 h)."""
        entry = self._owners.get(response_id)
        if entry is None or entry[1] <= self._clock.now():
            return None
        return entry[0]

    def persist(self) -> None:
        """Hand the changed entries to the store (its writer thread commits them)."""
        self._prune(self._clock.now(), len(self._owners))
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, set()
        owners = self._owners
        self._store.save_pins(
            {KEY_PREFIX + k: owners[k] for k in dirty if k in owners},
            [KEY_PREFIX + k for k in dirty if k not in owners],
        )

    def _prune(self, now: float, limit: int) -> None:
        owners = self._owners
        for _ in range(limit):
            if not owners:
                return
            key = next(iter(owners))
            if owners[key][1] > now and len(owners) <= self._limit:
                return
            del owners[key]
            self._dirty.add(key)
