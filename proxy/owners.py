"""Which connection created each Responses API response, so its follow-up routes reach it.

`GET /v1/responses/{id}`, `DELETE /v1/responses/{id}` and `POST /v1/responses/{id}/cancel` only
make sense on the upstream (and with the key) that created the response: another connection
answers 404 for an id it never issued. The pipeline tells this memory the id of every response
it relays; entries live `RESPONSE_TTL_MS` (24 h) and are persisted like session pins, in the
same table under a key no session header can produce (a leading tab: HTTP strips it from header
values), so a restart keeps them without a schema change.

In a fleet (docs/fleet.md) the owners are shared too (`SharedOwners`, implemented on Redis by
proxy.fleet): each id this memory learns is written through at once, and a follow-up route for an
id this replica never saw asks the fleet (`lookup`), so a response created through one replica is
reached through any other. An id names one response forever, so a local answer is never stale.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from typing import Protocol

from proxy.resilience.clock import Clock
from proxy.store import StateStore

RESPONSE_ID = re.compile(r"[A-Za-z0-9_.:-]{1,256}")
"""What a response id a client names may look like to be looked up (a follow-up route's path, a
request's `previous_response_id`): anything else is unknown here without asking."""
RESPONSE_TTL_MS = 24 * 3600 * 1000
MAX_RESPONSES = 100_000
"""Ids kept at most: a burst of answers beyond it forgets the oldest first."""
KEY_PREFIX = "\tresponse:"
PRUNE_STEP = 4
"""Expired entries a new one removes, as for session pins: the request path keeps the table at its
live size without ever paying for a large cleanup."""


class SharedOwners(Protocol):
    """Where the fleet's replicas share which connection created each response."""

    def remembered(self, response_id: str, connection_id: str, expires_at: float) -> None:
        """This replica relayed a new response: share its owner (never blocks)."""
        ...

    async def owner_of(self, response_id: str) -> tuple[str, float] | None:
        """(connection id, expires_at) the fleet knows for `response_id`, or None (unknown, or the
        backend did not answer within a short timeout)."""
        ...


class ResponseOwners:
    def __init__(self, clock: Clock, store: StateStore, *, limit: int = MAX_RESPONSES) -> None:
        self._clock = clock
        self._store = store
        self._limit = limit
        self.shared: SharedOwners | None = None
        """The fleet's shared owners (None: this replica alone, the SQLite default)."""
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
        if self.shared is not None:
            self.shared.remembered(response_id, connection_id, now + RESPONSE_TTL_MS)

    async def lookup(self, response_id: str) -> str | None:
        """`owner`, or, when this replica does not know the id, what the fleet knows (kept here)."""
        found = self.owner(response_id)
        if found is not None or self.shared is None:
            return found
        shared = await self.shared.owner_of(response_id)
        if shared is None:
            return None
        connection_id, expires_at = shared
        now = self._clock.now()
        if expires_at <= now:
            return None
        # The fleet's entry, not this replica's to persist: not marked dirty.
        self._owners[response_id] = (connection_id, expires_at)
        self._owners.move_to_end(response_id)
        self._prune(now, PRUNE_STEP)
        return connection_id

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
