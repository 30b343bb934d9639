"""Session pins and Responses API owners, shared by a fleet as Redis keys with a TTL (docs/fleet.md).

Both are affinities: a session keeps going to the connection that last served it, a response's
follow-ups must reach the connection that created it. Each replica keeps its memory tier (the
engine's `SessionPins`, the runtime's `ResponseOwners`) and this class shares them:

- **Write-through, off the request's path, ordered.** A pin or an owner is written to Redis by a
  task of its own the moment it is made, so the request goes on at once; at most
  `MAX_CONCURRENT_WRITES` run together, and writes of one key run in the order they were made
  (each waits for the one before). An owner is a `SET key value PX ttl`; a pin is set only if
  Redis holds no later pin of the session (`PIN_IF_LATER`): another replica's later pin may have
  got there first. The answer that made a pin or named a response id is not
  complete before its write is done (`settled`, bounded by `SETTLE_TIMEOUT_S`): the write starts
  when the upstream's answer is known and is usually done before the answer is relayed, and a
  client that has the whole answer finds the pin and the owner on every replica.
- **Reads.** A session-carrying request always asks Redis (`refresh_pin`): this replica's own pin
  may be stale (the session moved to another replica, was re-pinned there, and came back), and one
  GET is nothing next to an upstream call. The later pin wins (`SessionPins.adopt`), so a pin this
  replica made after the fleet's, whose write is still on its way, stands. A response id is asked
  of Redis only when this replica does not know it: an id names one response forever. Requests
  with neither never touch Redis.
- **Redis away (fail-open).** Nothing waits on a lost Redis: reads answer from the memory tier
  at once (or after `LOOKUP_TIMEOUT_S`, before the loss is noticed), writes are kept (at most
  `MAX_AWAY` of them) and written when Redis is back, a pin only if Redis holds no later one.

Keys: `<prefix>pin:<id>` and `<prefix>resp:<id>`, where `<id>` is `=` and the id itself when it is
short and plain (`[A-Za-z0-9_.:-]`, at most `PLAIN_ID_MAX` characters), else `#` and its SHA-256:
session and response ids are the client's (or an upstream's) strings, so a key name never holds
more than a bounded, harmless text. The value is `{"c": connection id, "e": expires_at epoch ms}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from redis.exceptions import RedisError

log = logging.getLogger("omniroute.fleet")

PLAIN_ID_MAX = 128
"""An id longer than this (or with other characters) is named by its SHA-256 in its key."""
_PLAIN_ID = re.compile(rf"[A-Za-z0-9_.:-]{{1,{PLAIN_ID_MAX}}}")
MAX_CONCURRENT_WRITES = 16
"""Pin and owner writes in flight at once (more wait their turn, in order)."""
MAX_PENDING_WRITES = 10_000
"""Writes waiting at most; beyond, a new one is kept for the next reconcile instead (fail-open)."""
MAX_AWAY = 100_000
"""Pins and owners kept to be written when Redis is back (the memory tier's own ceiling)."""
LOOKUP_TIMEOUT_S = 0.25
"""A request waits this long at most for Redis to say a session's pin or a response's owner."""
SETTLE_TIMEOUT_S = 0.25
"""An answer waits this long at most for its pin's or owners' writes to reach Redis."""

PIN_IF_LATER = """
-- KEYS[1] a pin; ARGV: value JSON, its expires_at, TTL in ms, '1' if a pin as late is replaced
local current = redis.call('GET', KEYS[1])
if current then
  local ok, pin = pcall(cjson.decode, current)
  local e = ok and type(pin) == 'table' and tonumber(pin['e'])
  if e and (e > tonumber(ARGV[2]) or (e == tonumber(ARGV[2]) and ARGV[4] ~= '1')) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
return 1
"""
"""A pin is written only if the fleet has no later one for the session: pins of one session made
on two replicas at nearly the same time may reach Redis in either order, and the later must stand
(written through, a pin as late replaces the one there: this replica's writes of a key are
ordered; written back after an outage, it does not)."""


def id_key(ident: str) -> str:
    """The key-name form of a session or response id: bounded, injective, plain text."""
    if _PLAIN_ID.fullmatch(ident):
        return "=" + ident
    return "#" + hashlib.sha256(ident.encode("utf-8", "surrogatepass")).hexdigest()


def _decode(text: str | None) -> tuple[str, float] | None:
    if not text:
        return None
    try:
        value = json.loads(text)
        connection_id, expires_at = value["c"], float(value["e"])
    except (ValueError, TypeError, KeyError):
        return None
    return (connection_id, expires_at) if isinstance(connection_id, str) else None


class Affinity:
    """The shared pins and owners of one replica (see the module docstring).

    `client()` gives the replica's async Redis client, or None while Redis is away (not connected,
    or not started); `lost(exc)` tells the replica a command failed on a lost Redis."""

    def __init__(
        self,
        prefix: str,
        now: Callable[[], float],
        client: Callable[[], Any],
        lost: Callable[[BaseException], None],
    ) -> None:
        self.prefix = prefix
        self._now = now
        self._client = client
        self._lost = lost
        self._writes: dict[str, asyncio.Task[None]] = {}
        """The last write started for each key, until it is done."""
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_WRITES)
        self._away: OrderedDict[str, tuple[bool, str, float]] = OrderedDict()
        """key -> (a pin?, value, expires_at): written while Redis was away, to write back."""

    def pin_key(self, session: str) -> str:
        return f"{self.prefix}pin:{id_key(session)}"

    def owner_key(self, response_id: str) -> str:
        return f"{self.prefix}resp:{id_key(response_id)}"

    # -- writes ---------------------------------------------------------------------------------

    def write(self, key: str, connection_id: str, expires_at: float, *, pin: bool) -> None:
        """Share a pin (`pin`) or an owner: a task of its own, after the key's previous write."""
        value = json.dumps({"c": connection_id, "e": expires_at}, separators=(",", ":"))
        if self._client() is None or len(self._writes) >= MAX_PENDING_WRITES:
            self._keep(key, pin, value, expires_at)
            return
        before = self._writes.get(key)
        task = asyncio.get_running_loop().create_task(self._set(key, value, expires_at, pin, before))
        self._writes[key] = task
        task.add_done_callback(lambda done: self._done(key, done))

    def _done(self, key: str, task: asyncio.Task[None]) -> None:
        if self._writes.get(key) is task:
            del self._writes[key]

    async def _set(
        self, key: str, value: str, expires_at: float, pin: bool, before: asyncio.Task[None] | None
    ) -> None:
        if before is not None:
            await asyncio.wait([before])  # its outcome is its own: only the order matters here
        async with self._slots:
            client = self._client()
            ttl = int(expires_at - self._now())
            if ttl <= 0:
                return
            if client is None:
                self._keep(key, pin, value, expires_at)
                return
            try:
                if pin:
                    await client.eval(PIN_IF_LATER, 1, key, value, expires_at, ttl, "1")
                else:
                    await client.set(key, value, px=ttl)  # an id names one response forever
            except (RedisError, OSError) as exc:
                self._keep(key, pin, value, expires_at)
                self._lost(exc)

    def _keep(self, key: str, pin: bool, value: str, expires_at: float) -> None:
        away = self._away
        away[key] = (pin, value, expires_at)
        away.move_to_end(key)
        while len(away) > MAX_AWAY:
            away.popitem(last=False)  # the oldest gives way, as in the memory tier

    async def settled(self, keys: Iterable[str]) -> None:
        """Wait (at most SETTLE_TIMEOUT_S) for the writes of `keys` started so far."""
        tasks = [task for key in keys if (task := self._writes.get(key)) is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=SETTLE_TIMEOUT_S)

    # -- reads ----------------------------------------------------------------------------------

    async def read(self, key: str) -> tuple[str, float] | None:
        """(connection id, expires_at) Redis holds under `key`; None when it holds none, or is away
        or slow (the caller goes on with its memory tier), or this replica's own write of the key
        is still on its way (it is the latest word on it)."""
        client = self._client()
        if client is None or key in self._writes:
            return None
        try:
            # `asyncio.timeout`, not `wait_for`: in Python 3.11 `wait_for` swallows a cancellation
            # that meets the answer, and the request whose client hung up would go on upstream.
            async with asyncio.timeout(LOOKUP_TIMEOUT_S):
                text = await client.get(key)
        except (RedisError, OSError, TimeoutError):
            return None  # the heartbeat and the worker tell a lost Redis; a request only goes on
        found = _decode(text)
        return found if found is not None and found[1] > self._now() else None

    # -- Redis back -----------------------------------------------------------------------------

    async def reconcile(self) -> int:
        """Write back what was kept while Redis was away: an owner if Redis has none, a pin if
        Redis has no later one. Returns how many were written."""
        client = self._client()
        if client is None:
            return 0
        away, self._away = self._away, OrderedDict()
        written = 0
        now = self._now()
        try:
            while away:
                key, (pin, value, expires_at) = away.popitem(last=False)
                ttl = int(expires_at - now)
                if ttl <= 0:
                    continue
                if pin:
                    written += int(await client.eval(PIN_IF_LATER, 1, key, value, expires_at, ttl, "0"))
                else:
                    written += int(bool(await client.set(key, value, px=ttl, nx=True)))
        except (RedisError, OSError):
            # Lost again: what is left waits for the next reconcile.
            for key, item in away.items():
                self._away.setdefault(key, item)
            raise
        return written

    async def close(self) -> None:
        tasks = list(self._writes.values())
        if tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait(tasks, timeout=SETTLE_TIMEOUT_S)
