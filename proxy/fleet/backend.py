"""The Redis backend: several replicas, one resilience state (docs/fleet.md).

`FleetState` is both the replica's `StateStore` (start-up load, settings writes) and the engine's
`SharedState` (proxy/shared.py). How a decision travels:

1. The engine decides on its memory tier (the request path reads nothing else) and hands the
   decision to `FleetState` as an operation, before applying it locally.
2. One worker task replays each operation, in order, on a fresh layer object built from the
   shared record at the version this replica last saw, and writes the result with one Lua
   script (`scripts.TRANSITION`) that only applies if that version is still current. On a
   conflict it reads the current record and replays again: the layers' own rules (anti-herd,
   later deadline wins, one OPEN per cycle) then decide on the fleet's state, not a stale copy.
3. The script appends the new record and its events to the change feed (a Redis Stream). Every
   replica tails it: it takes the record into its memory tier, then publishes the events on its
   bus, so `/api/events` and the console show each fleet-wide transition once.

The HALF_OPEN probe is a lease (`SET NX PX`) naming replica and ticket: one probe fleet-wide,
settled only by its owner, expiring with a dead owner.

When Redis is away the replica keeps serving on its memory tier (fail-open), says so (a `state`
event, `stateBackend` in the health document), remembers what it changed, and reconciles when
Redis is back (proxy/fleet/merge.py).

Session pins and response owners are not transitions: they are keys with a TTL, written through
as they are made (proxy/fleet/affinity.py). Each heartbeat also publishes this replica's
statistics windows, which `peer_stats` reads for `/api/stats?scope=fleet`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError
from redis.retry import Retry

from proxy import untrusted
from proxy.config import Config
from proxy.fleet.affinity import Affinity
from proxy.fleet.fingerprint import config_items, differences, fingerprint
from proxy.fleet.merge import MERGES, since_operator
from proxy.fleet.scripts import RELEASE_PROBE, RENEW_PROBE, TAKE_PROBE, TRANSITION
from proxy.resilience.breaker import Admission, CircuitBreaker
from proxy.resilience.classify import BreakerEffect
from proxy.resilience.clock import Clock, SystemClock
from proxy.resilience.cooldown import ConnectionHealth
from proxy.resilience.events import Event
from proxy.resilience.lockout import LockoutEntry, LockoutTable, event_key, triple_of
from proxy.resilience.timefmt import iso
from proxy.settings import SECTIONS, Settings, StaleSettingsChange
from proxy.shared import ConnectionOp, LockoutOp, apply_breaker_effect
from proxy.store import StoredState, StoreError

if TYPE_CHECKING:
    from proxy.engine import Attempt, Engine

log = logging.getLogger("omniroute.fleet")

FEED_MAXLEN = 10_000
"""The change feed keeps about this many entries (`MAXLEN ~`): the fleet's recent events."""
LOCKOUT_TTL_MARGIN_MS = 60_000
"""A lockout's key outlives its lock by this much, so a late reader still sees why it ended."""
TOMBSTONE_TTL_MS = 600_000
"""A removed lockout stays as an empty record this long: a replica back from a partition then
learns it was removed, instead of writing its old copy back."""
REPLICA_TTL_MS = 5_000
HEARTBEAT_S = 1.0
ID_WATCH_S = 2.5 * HEARTBEAT_S
"""How long a starting replica that finds its own id's key watches it: a live replica rewrites it
within a heartbeat, a crashed one never does (`_check_replica_id`)."""
STATS_STALE_MS = 3_000
"""A replica's published statistics older than this are not summed (`/api/stats?scope=fleet`): its
heartbeat, which refreshes them every second, has been failing."""
COMMAND_TIMEOUT_S = 1.0
"""A command not answered within this is a lost Redis: the replica fails open rather than wait."""
FEED_BLOCK_MS = 1_000
RECONNECT_BACKOFF_S = (0.1, 2.0)
MAX_REPLAYS = 16
SETTINGS_CONFLICT_WAIT_S = 1.0
STOP_TIMEOUT_S = 1.0
_LAZY_REASONS = frozenset({"timeout_elapsed"})
"""Transitions every replica derives on its own (lazy recovery): published locally, never shipped."""

_GLOB = re.compile(r"[\\*?\[\]]")
"""What a Redis SCAN pattern reads as glob syntax (a backslash escapes it)."""

_Slot = tuple[str, str]  # (kind, id): kind b (breaker), c (connection), l (lockout)


@dataclass(slots=True)
class _Job:
    kind: str
    """b, c, l: a transition; x: an event only; renew: a probe lease's renewal; release: a probe
    lease given back without an outcome (its owner in `owner`)."""
    ident: str
    mutate: Callable[[Any], object] | None = None
    lease: bool = False
    """A breaker job of the probe: give the lease back once it is recorded."""
    event: Event | None = None
    owner: str | None = None
    at: float = 0.0
    """When the engine decided the transition (this replica's clock)."""
    by_operator: bool = False
    """An operator's reset or re-enable: it clears what any outcome decided before it did."""


@dataclass(frozen=True, slots=True)
class PeerStats:
    """The other live replicas' published statistics windows (`FleetState.peer_stats`)."""

    rows: dict[str, dict[str, dict[str, list[float]]]]
    """replica id -> window -> connection -> raw row (proxy.traffic.TrafficStats.rows)."""
    stale: list[str]
    """Live replicas whose windows are older than STATS_STALE_MS (not in `rows`)."""
    missing: list[str]
    """Live replicas that published none (recording off, just started), or all of them but this
    one while Redis is away."""


class FleetUnavailable(StoreError):
    """Redis cannot be reached at start-up, or the replica does not match its fleet."""

    code = "state_backend_unavailable"


class FleetState:
    """The Redis backend of one replica (see the module docstring)."""

    kind = "redis"

    def __init__(self, config: Config, *, clock: Clock | None = None, replica_id: str | None = None) -> None:
        self.url = config.state.backend
        self.shown_url = config.state.shown
        """The URL as messages show it: never the password it may carry."""
        self.prefix = config.state.key_prefix
        server = config.server
        self.address = f"http://{server.host}:{server.port}"
        self.replica_id = (
            replica_id
            or os.environ.get("OMNIROUTE_REPLICA_ID")
            or (f"{socket.gethostname()}-{server.port}-{os.getpid()}")
        )
        self._clock: Clock = clock or SystemClock()
        self._items = config_items(config)
        # Typed Any: redis-py's stubs type every reply as a union of all replies.
        self._sync: Any = redis.Redis.from_url(
            self.url,
            decode_responses=True,
            socket_timeout=COMMAND_TIMEOUT_S * 2,
            socket_connect_timeout=COMMAND_TIMEOUT_S * 2,
            retry=Retry(NoBackoff(), 0),
        )
        self._cache: dict[_Slot, tuple[dict[str, Any] | None, int]] = {}
        """What this replica knows of each shared record: (record, version). None: deleted/absent."""
        self._pending: dict[_Slot, int] = {}
        self._acted: dict[_Slot, float] = {}
        """When an operator last reset or re-enabled each shared record (on any replica), as far as
        this replica has heard: an outcome decided before then, still queued here, is dropped
        rather than replayed over the action (`_transition`)."""
        self._dirty: set[_Slot] = set()
        """Records this replica changed while Redis was away: reconciled when it is back."""
        self._leases: dict[str, str] = {}
        self._quiet: set[tuple[str, str]] = set()
        self._quiet_clear: asyncio.Handle | None = None
        self._settings_version = 0
        self._settings_dirty = False
        self._settings_lock = threading.Lock()
        self._feed_from = "0-0"
        self.connected = False
        """Transitions are written to Redis (False: fail-open, they stay local and are reconciled)."""
        self.up = False
        """What health, events and the console report: connected, and reconciled since it was lost."""
        self.since = self._clock.now()
        self.replicas: list[dict[str, Any]] = []
        """The live replicas' heartbeats (`_replica_of`), this one's included, by id."""
        self._bad_replicas: set[str] = set()
        """`replica:*` keys that hold no heartbeat (said once in the log, while they stay)."""
        self.started_at = self._clock.now()
        self._engine_: Engine | None = None
        self._settings: Settings | None = None
        self._bus: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._jobs: asyncio.Queue[_Job] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._r: Any = None
        self._feed: Any = None
        self._closed = False
        self._stopping = False
        self.stats_source: Callable[[float], dict[str, dict[str, list[float]]]] | None = None
        """This replica's statistics windows as of a time (set by the runtime; None: recording is
        off): published with each heartbeat for `/api/stats?scope=fleet`."""
        self.affinity = Affinity(
            self.prefix, self._clock.now, lambda: self._r if self.connected else None, self._lost
        )
        """Session pins and response owners, shared as keys with a TTL (proxy/fleet/affinity.py)."""

    # ------------------------------------------------------------------ keys

    def key(self, kind: str, ident: str) -> str:
        return f"{self.prefix}{kind}:{ident}"

    def every(self, kind: str) -> str:
        """The SCAN pattern of every key of `kind`: the prefix's own glob characters escaped, or a
        `team[eu]:` fleet would find none of its keys, and a `*` in one, another fleet's."""
        return _GLOB.sub(lambda glob: "\\" + glob[0], self.prefix) + f"{kind}:*"

    @property
    def feed_key(self) -> str:
        return f"{self.prefix}feed"

    @property
    def settings_key(self) -> str:
        return f"{self.prefix}settings"

    # ------------------------------------------------------------------ StateStore (start-up, settings)

    def load(self) -> StoredState:
        """Check the fleet, then read the shared state (blocking: start-up only)."""
        try:
            self._sync.ping()
        except RedisError as exc:
            raise FleetUnavailable(
                f"cannot reach the state backend {self.shown_url}: {exc} "
                '(start Redis there, or set [state] backend = "sqlite")'
            ) from None
        name = f"{self.prefix}fleet:config"
        try:
            self._check_fleet()
            self._check_replica_id()
            last = self._sync.xrevrange(self.feed_key, count=1)
            # The feed is read from here on: whatever happens after this read reaches the memory tier.
            self._feed_from = last[0][0] if last else "0-0"
            state = StoredState()
            for kind in ("b", "c", "l"):
                for name in self._sync.scan_iter(match=self.every(kind), count=500):
                    version, text = self._sync.hmget(name, "v", "r")
                    ident = name[len(self.prefix) + 2 :]
                    record = json.loads(text) if text else None
                    if record is not None and not isinstance(record, dict):
                        raise ValueError("the record is not a JSON object")
                    self._cache[(kind, ident)] = (record, int(version or 0))
                    if record is None:
                        continue
                    if kind == "b":
                        state.breakers[ident] = record
                    elif kind == "c":
                        state.connections[ident] = record
                    else:
                        state.lockouts.append(record)
            name = self.settings_key
            version, text = self._sync.hmget(name, "v", "r")
            if text:
                state.settings = json.loads(text)
                self._settings_version = int(version or 0)
            name = f"{self.prefix}meta"
            state.meta = dict(self._sync.hgetall(name))
        except (ValueError, ResponseError) as exc:  # (a bad reply, not an outage: that is a RedisError)
            raise self.unreadable(name, str(exc)) from None
        self.connected = self.up = True
        self.since = self._clock.now()
        return state

    def unreadable(self, key: str, reason: str) -> FleetUnavailable:
        """A shared key this replica cannot read at start (another writer broke it), named with how
        to clear it: like a bad row in a state file, it stops the start rather than be guessed at."""
        return FleetUnavailable(
            f"the state backend {self.shown_url} holds a key this replica cannot read: {key} "
            f"({reason[:200]}); delete that key (`redis-cli -u URL DEL {key}`) to start from the "
            "fleet's other records"
        )

    def unreadable_record(self, table: str, row: str, reason: str) -> FleetUnavailable:
        """`unreadable` for a record the engine refused (`BadRecord`: it knows the table and row)."""
        kind = {"breakers": "b", "connections": "c", "lockouts": "l"}.get(table, table)
        return self.unreadable(self.key(kind, row.strip("'")), reason)

    def _check_fleet(self) -> None:
        """Refuse to join a fleet whose providers, connections or combos differ from ours."""
        name = f"{self.prefix}fleet:config"
        mine = fingerprint(self._items)
        stored = self._sync.get(name)
        alive = False
        for key in self._sync.scan_iter(match=self.every("replica"), count=100):
            if self._sync.pttl(key) == -1:
                # A heartbeat always expires: a key that never does is another writer's, and taken
                # for a live replica it would hold the fleet to its old config for ever.
                log.warning("fleet: %s never expires, so it is no replica's heartbeat; ignored", key)
                continue
            alive = True
            break
        if stored is not None and alive:
            fleet = json.loads(stored)
            items = fleet.get("items", {}) if isinstance(fleet, dict) else None
            if not isinstance(items, dict):  # (a ValueError: `load` names the key)
                raise ValueError("not a fleet's config document: an object with `fingerprint` and `items`")
            if fleet.get("fingerprint") != mine:
                found = differences(self._items, items)
                raise FleetUnavailable(
                    "this replica's config differs from its fleet's (the replicas sharing "
                    f"{self.shown_url} with key_prefix {self.prefix!r}): "
                    + "; ".join(found or ["settings differ"])
                    + ". Give every replica the same providers, connections and combos."
                )
            return
        # No live replica: this config becomes the fleet's (a fleet restarted on a new config).
        self._sync.set(name, json.dumps({"fingerprint": mine, "items": self._items}))

    def _check_replica_id(self) -> None:
        """Refuse to start under the id of a live replica. Two replicas under one id each take the
        other's changes on the feed for their own and skip them: their settings part ways, and a
        settings change then waits forever on a version it never sees. A replica that died without
        stopping leaves its key for up to REPLICA_TTL_MS, unchanged; a live one rewrites it every
        heartbeat: so a key that changes while this waits two heartbeats is a live replica's."""
        name = self.key("replica", self.replica_id)
        seen = self._sync.get(name)
        if seen is None:
            return
        deadline = time.monotonic() + ID_WATCH_S
        while time.monotonic() < deadline:
            time.sleep(HEARTBEAT_S / 10)
            now = self._sync.get(name)
            if now is None:
                return  # it expired: whoever wrote it is gone
            if now != seen:
                try:
                    address = json.loads(now).get("address")
                except (ValueError, AttributeError):
                    address = None
                where = f" ({address})" if isinstance(address, str) else ""
                raise FleetUnavailable(
                    f"replica id {self.replica_id!r} is already live in this fleet{where}; give each"
                    " replica its own OMNIROUTE_REPLICA_ID, or leave it unset (the default is"
                    " host-port-pid)"
                )

    def save_breakers(self, records: Mapping[str, Mapping[str, Any]]) -> None:
        pass  # transitions travel as operations (see the module docstring), not as snapshots

    def save_connections(self, records: Mapping[str, Mapping[str, Any]]) -> None:
        pass

    def save_lockouts(self, upserts: Any, deletes: Any) -> None:
        pass

    def save_pins(self, upserts: Any, deletes: Any) -> None:
        pass  # pins and response owners are written through as they are made (`pinned`, `remembered`)

    def set_meta(self, key: str, value: str) -> None:
        with contextlib.suppress(RedisError):
            self._sync.hset(f"{self.prefix}meta", key, value)

    def save_settings(self, document: Mapping[str, Any]) -> None:
        """Write the settings document for the whole fleet, version-checked. Blocking (to_thread).

        StaleSettingsChange when another replica changed the settings since this one last saw
        them: by then the newer document is live here, and the caller merges its change onto it.
        With Redis away the change is live on this replica only (fail-open) and written when
        Redis is back, if no replica wrote a newer version meanwhile."""
        text = json.dumps(document, separators=(",", ":"))
        with self._settings_lock:
            expected = self._settings_version
            if not self.connected:
                self._settings_dirty = True
                self._settings_version = expected + 1
                return
            try:
                ok, version, *_ = self._sync.eval(*self._settings_write(expected, text))
            except RedisError as exc:
                self._settings_dirty = True
                self._settings_version = expected + 1
                if self._loop is not None:
                    self._loop.call_soon_threadsafe(self._lost, exc)
                return
            if ok:
                self._settings_version = int(version)
                return
            if int(version) < expected:
                # Behind what this replica saw (Redis restarted without the settings, or the key
                # was deleted): no newer document is on its way; the caller's next try writes over it.
                self._settings_version = int(version)
                raise StaleSettingsChange("the fleet's settings went back to an older version")
        deadline = time.monotonic() + SETTINGS_CONFLICT_WAIT_S
        while self._settings_version < int(version) and time.monotonic() < deadline:
            time.sleep(0.005)
        raise StaleSettingsChange("another replica changed the settings meanwhile")

    def flush(self, timeout: float = 5.0) -> bool:
        return True

    @property
    def write_problem(self) -> str | None:
        return None

    def purge(self, finds: Callable[[str], bool]) -> bool:
        return False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(RedisError):
            self._sync.delete(self.key("replica", self.replica_id), self.key("stats", self.replica_id))
        self._sync.close()

    # ------------------------------------------------------------------ lifecycle

    @property
    def _engine(self) -> Engine:
        assert self._engine_ is not None, "attach() first"
        return self._engine_

    def attach(self, engine: Engine, settings: Settings) -> None:
        """Become `engine.shared` (after the engine restored the state `load` returned)."""
        self._engine_ = engine
        self._settings = settings
        self._bus = engine.bus
        engine.shared = self

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._jobs = asyncio.Queue()
        options: dict[str, Any] = {"decode_responses": True, "retry": AsyncRetry(NoBackoff(), 0)}
        self._r = aredis.Redis.from_url(
            self.url, socket_timeout=COMMAND_TIMEOUT_S, socket_connect_timeout=COMMAND_TIMEOUT_S, **options
        )
        # Its own connection: XREAD BLOCK holds it for up to FEED_BLOCK_MS at a time.
        self._feed = aredis.Redis.from_url(
            self.url,
            socket_timeout=FEED_BLOCK_MS / 1000 + COMMAND_TIMEOUT_S,
            socket_connect_timeout=COMMAND_TIMEOUT_S,
            **options,
        )
        self._tasks = [
            asyncio.create_task(self._supervise(), name="omniroute-fleet-feed"),
            asyncio.create_task(self._work(), name="omniroute-fleet-worker"),
            asyncio.create_task(self._heartbeat(), name="omniroute-fleet-heartbeat"),
        ]

    async def stop(self) -> None:
        jobs = self._jobs
        if jobs is not None and self.connected:
            # What was decided before the stop reaches the fleet (briefly: a lost Redis gives up).
            # (`asyncio.timeout` rather than `wait_for`, which in Python 3.11 can swallow a
            # cancellation of the stop itself.)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    await jobs.join()
            await self.affinity.close()
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        # Bounded: a task cancelled inside the Redis client's own reconnect logic may take its time.
        await asyncio.wait(self._tasks, timeout=STOP_TIMEOUT_S)
        self._tasks = []
        if self._r is not None:
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                # The Replicas line loses this replica at once, not when its key expires.
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await self._r.delete(
                        self.key("replica", self.replica_id), self.key("stats", self.replica_id)
                    )
        for client in (self._r, self._feed):
            if client is not None:
                with contextlib.suppress(RedisError, OSError, TimeoutError):
                    async with asyncio.timeout(STOP_TIMEOUT_S):
                        await client.aclose()

    # ------------------------------------------------------------------ what the health document says

    def status(self) -> dict[str, object]:
        return {"kind": self.kind, "connected": self.up, "since": iso(self.since)}

    def fleet(self) -> dict[str, object]:
        return {"replica": self.replica_id, "address": self.address, "replicas": list(self.replicas)}

    # ------------------------------------------------------------------ SharedState (from the engine)

    def publishes(self, event: Event) -> bool:
        if not self.connected or self._jobs is None:
            return False
        if event.layer == "operator":
            self._enqueue(_Job("x", event.key, event=event))
            return True
        return (event.layer, event.key) in self._quiet

    def breaker(self, provider: str, effect: BreakerEffect, now: float, *, probe: bool) -> None:
        if not probe and effect is BreakerEffect.SUCCESS and not self._pending.get(("b", provider)):
            # (With this replica's own outcomes for the breaker still queued, the shared record is
            # behind them: a failure waiting to be written makes this success one to replay after it.)
            record = self._cache.get(("b", provider), (None, 0))[0]
            if record is None or (record.get("state") == "CLOSED" and not record.get("failure_count")):
                return  # the usual success on a healthy provider changes nothing anywhere
        clock = self._clock

        def mutate(b: CircuitBreaker) -> None:
            ticket = 0
            if probe and b.admit(clock.now()) is Admission.PROBE:
                ticket = b.probe_ticket
            apply_breaker_effect(b, effect, now, ticket)

        self._submit("breaker", _Job("b", provider, mutate, lease=probe))

    def reset_breaker(self, provider: str, now: float) -> None:
        self._submit("breaker", _Job("b", provider, lambda b: b.reset(now, "operator"), by_operator=True))

    def connection(self, connection_id: str, op: ConnectionOp, *, by_operator: bool = False) -> None:
        self._submit("connection", _Job("c", connection_id, op, by_operator=by_operator))

    def lockout(self, key: tuple[str, str, str], op: LockoutOp, *, by_operator: bool = False) -> None:
        self._submit("lockout", _Job("l", event_key(*key), op, by_operator=by_operator))

    def probe_alive(self, provider: str) -> None:
        if provider in self._leases and self._jobs is not None:
            self._enqueue(_Job("renew", provider))

    async def take_probe(self, attempt: Attempt) -> bool:
        """Take the fleet's probe lease for an attempt `select` admitted as the HALF_OPEN probe.

        False when another replica holds it: the attempt is withdrawn (its slot given back) and
        the breaker holds the probe slot for the other replica's lease. Fail-open: with Redis away
        the local probe goes ahead (each replica then probes on its own, as one replica would)."""
        provider = attempt.provider.spec.id
        if not self.connected or self._r is None:
            return True
        owner = f"{self.replica_id}:{attempt.probe_ticket}"
        lease = self.key("probe", provider)
        ttl = int(self._engine.probe_timeout_ms)
        try:
            taken, remaining = await self._r.eval(TAKE_PROBE, 1, lease, owner, ttl)
        except RedisError as exc:
            self._lost(exc)
            return True
        except asyncio.CancelledError:
            # The client left while Redis answered: the attempt goes no further, so it is withdrawn
            # here (nothing else holds it yet), and the lease, which Redis may have granted, is
            # given back (the release compares the owner), or the fleet would wait out its TTL.
            _withdraw(attempt, self._clock.now())
            if self._jobs is not None:
                self._enqueue(_Job("release", provider, owner=owner))
            raise
        if taken:
            if taken == 2:
                log.warning("fleet: %s held a probe lease that could never expire; taken over", lease)
            self._leases[provider] = owner
            return True
        now = self._clock.now()
        _withdraw(attempt, now)
        attempt.provider.breaker.hold_probe_elsewhere(now + max(int(remaining), 50))
        return False

    # ------------------------------------------------------------------ session pins, response owners

    def pinned(self, session: str, connection_id: str, expires_at: float) -> None:
        affinity = self.affinity
        affinity.write(affinity.pin_key(session), connection_id, expires_at, pin=True)

    async def refresh_pin(self, session: str) -> None:
        found = await self.affinity.read(self.affinity.pin_key(session))
        if found is not None:
            self._engine.adopt_pin(session, *found)

    async def settled(self, session: str | None, response_ids: Sequence[str] = ()) -> None:
        affinity = self.affinity
        keys = [affinity.owner_key(i) for i in response_ids]
        if session is not None:
            keys.append(affinity.pin_key(session))
        await affinity.settled(keys)

    def remembered(self, response_id: str, connection_id: str, expires_at: float) -> None:
        affinity = self.affinity
        affinity.write(affinity.owner_key(response_id), connection_id, expires_at, pin=False)

    async def owner_of(self, response_id: str) -> tuple[str, float] | None:
        return await self.affinity.read(self.affinity.owner_key(response_id))

    def _submit(self, layer: str, job: _Job) -> None:
        if self._jobs is None:
            return
        job.at = self._clock.now()
        # The engine applies the same change locally right after this call: its events are the
        # ones the replay publishes through the feed, so they stay quiet here for this step.
        self._quiet.add((layer, job.ident))
        if self._quiet_clear is None and self._loop is not None:
            self._quiet_clear = self._loop.call_soon(self._unquiet)
        self._enqueue(job)

    def _unquiet(self) -> None:
        self._quiet.clear()
        self._quiet_clear = None

    def _enqueue(self, job: _Job) -> None:
        assert self._jobs is not None
        slot = (job.kind, job.ident)
        self._pending[slot] = self._pending.get(slot, 0) + 1
        self._jobs.put_nowait(job)

    # ------------------------------------------------------------------ the worker: replay and write

    async def _work(self) -> None:
        assert self._jobs is not None
        while not self._stopping:
            job = await self._jobs.get()
            slot = (job.kind, job.ident)
            try:
                if not self.connected:
                    if job.kind in ("b", "c", "l"):
                        self._dirty.add(slot)
                elif job.kind == "x":
                    await self._send_event(job)
                elif job.kind == "renew":
                    await self._renew(job.ident)
                elif job.kind == "release":
                    await self._withdrawn(job.ident, job.owner)
                else:
                    await self._transition(job)
            except (RedisError, OSError) as exc:
                if job.kind in ("b", "c", "l"):
                    self._dirty.add(slot)
                if self._stopping:
                    return
                self._lost(exc)
            except Exception:
                log.exception("fleet: could not share a transition of %s", slot)
            finally:
                left = self._pending.get(slot, 1) - 1
                if left > 0:
                    self._pending[slot] = left
                else:
                    self._pending.pop(slot, None)
                self._jobs.task_done()

    async def _transition(self, job: _Job) -> None:
        assert self._r is not None and job.mutate is not None
        slot = (job.kind, job.ident)
        for _ in range(MAX_REPLAYS):
            record, version = self._cache.get(slot, (None, 0))
            if job.at < self._acted.get(slot, -1.0):
                # Decided before an operator reset or re-enabled this record (on another replica,
                # whose action landed first): replayed now it would undo the action (a reset key
                # cooling again, a re-enabled model locked again), which on one process it never
                # could, having come first. The operator's word stands. So does the later operator's
                # against an earlier one landing late: that reset cleared all this one could, and
                # what came after it (a 429 since) is not this one's to clear.
                if self._pending.get(slot, 0) <= 1:
                    self._adopt(job.kind, job.ident, record)
                break
            events: list[Event] = []
            try:
                fresh = self._fresh(job.kind, job.ident, record, events.append)
            except (ValueError, KeyError, TypeError) as exc:
                # Valid JSON of another shape (another writer's): read as no record, replaced below.
                self._unreadable(slot, exc)
                events.clear()
                fresh = self._fresh(job.kind, job.ident, None, events.append)
            if fresh is None:
                return
            job.mutate(fresh)
            new = self._record_of(job.kind, job.ident, fresh)
            shipped = [e for e in events if e.reason not in _LAZY_REASONS]
            if new == record and not shipped and not job.by_operator:
                # Nothing to write: the shared record already says it (or, after a conflict, says
                # more). This replica's memory tier may have applied its own stale decision: it
                # takes the shared record instead. (An operator's action is written all the same:
                # its time must reach the fleet.)
                if self._pending.get(slot, 0) <= 1:
                    self._adopt(job.kind, job.ident, record)
                break
            ok, current_version, rest, acted = await self._write(
                job.kind, job.ident, version, new, shipped, by_operator=job.at if job.by_operator else None
            )
            operator_acted = self._heard_acted(slot, acted)
            if ok:
                newest = self._newest(slot, new, int(current_version))
                if self._pending.get(slot, 0) <= 1:
                    self._adopt(job.kind, job.ident, newest)
                break
            # Another replica moved this record first: decide again on what it wrote.
            current = self._readable(slot, rest)
            if current_version < version:
                # Behind what this replica saw (the key was deleted, or Redis restarted without
                # it): no later write can be on its way here, and what Redis holds is the record.
                self._cache[slot] = (current, current_version)
            newest = self._newest(slot, current, current_version)
            if operator_acted:
                self._adopt(job.kind, job.ident, newest)  # another's operator action: at once (`_on_entry`)
        else:
            log.warning("fleet: gave up sharing %s after %d conflicts", slot, MAX_REPLAYS)
        if job.lease:
            await self._release(job.ident)

    def _readable(self, slot: _Slot, text: str | None) -> dict[str, Any] | None:
        """A shared record's JSON, or None for none, and for one no replica can read (another
        writer broke it): the next transition then replaces it with a good one, rather than fail
        to share this record for ever."""
        if not text:
            return None
        try:
            record = json.loads(text)
        except ValueError as exc:
            self._unreadable(slot, exc)
            return None
        if not isinstance(record, dict):
            self._unreadable(slot, ValueError("not a JSON object"))
            return None
        return record

    def _unreadable(self, slot: _Slot, exc: BaseException) -> None:
        log.warning(
            "fleet: the shared record %s is unreadable (%s); the next transition replaces it",
            self.key(*slot),
            str(exc)[:200],
        )

    def _heard_acted(self, slot: _Slot, acted: str) -> bool:
        """Note when an operator last changed a record, as a write's reply or the feed says; True
        when that is later than this replica had heard."""
        try:
            when = float(acted) if acted else -1.0
        except ValueError:  # another writer's
            return False
        if when > self._acted.get(slot, -1.0):
            self._acted[slot] = when
            return True
        return False

    async def _write(
        self,
        kind: str,
        ident: str,
        version: int,
        record: Mapping[str, Any] | None,
        events: list[Event],
        *,
        by_operator: float | None = None,
    ) -> tuple[int, int, str, str]:
        """Write `record` if the shared one is still at `version` (the TRANSITION script). Returns
        (written, the version now, the feed entry's id or else the current record, when an operator
        last changed it); `by_operator`: when the operator who made this change acted."""
        assert self._r is not None
        ttl = 0
        if kind == "l":
            now = self._clock.now()
            ttl = (
                TOMBSTONE_TTL_MS
                if record is None
                else int(max(0.0, float(record["expires_at"]) - now)) + LOCKOUT_TTL_MARGIN_MS
            )
        result = await self._r.eval(
            TRANSITION,
            2,
            self.key(kind, ident),
            self.feed_key,
            version,
            kind,
            ident,
            "" if record is None else json.dumps(record, separators=(",", ":")),
            json.dumps([e.to_dict() for e in events], separators=(",", ":")),
            self.replica_id,
            ttl,
            FEED_MAXLEN,
            "" if by_operator is None else repr(by_operator),
        )
        return int(result[0]), int(result[1]), str(result[2] or ""), str(result[3] or "")

    async def _send_event(self, job: _Job) -> None:
        assert self._r is not None and job.event is not None
        await self._r.xadd(
            self.feed_key,
            {"k": "x", "i": job.ident, "e": json.dumps([job.event.to_dict()]), "o": self.replica_id},
            maxlen=FEED_MAXLEN,
            approximate=True,
        )

    async def _withdrawn(self, provider: str, owner: str | None) -> None:
        """Give back the lease of a probe withdrawn before it was sent. The feed tells the other
        replicas it is free; this one, which may have been refused it meanwhile (`take_probe`
        found it taken), stops waiting for it too, unless it sends a probe of its own by now."""
        if await self._release(provider, owner):
            runtime = self._engine.providers.get(provider)
            if runtime is not None and runtime.breaker.probe_ticket == 0:
                runtime.breaker.hold_probe_elsewhere(self._clock.now())

    async def _release(self, provider: str, owner: str | None = None) -> bool:
        """Give back the probe lease `owner` took (by default: the one this replica notes); False
        when it was not ours any more (run out, taken since)."""
        if owner is None:
            owner = self._leases.pop(provider, None)
        if owner is None or self._r is None:
            return False
        return bool(
            await self._r.eval(
                RELEASE_PROBE,
                2,
                self.key("probe", provider),
                self.feed_key,
                owner,
                provider,
                self.replica_id,
                FEED_MAXLEN,
            )
        )

    async def _renew(self, provider: str) -> None:
        owner = self._leases.get(provider)
        if owner is None or self._r is None:
            return
        ttl = int(self._engine.probe_timeout_ms)
        await self._r.eval(RENEW_PROBE, 1, self.key("probe", provider), owner, ttl)

    # ------------------------------------------------------------------ layer objects from records

    def _fresh(
        self, kind: str, ident: str, record: Mapping[str, Any] | None, emit: Callable[[Event], None]
    ) -> Any:
        engine = self._engine
        if kind == "b":
            runtime = engine.providers.get(ident)
            if runtime is None:
                return None
            policy = engine.settings.breaker_policy(runtime.spec.provider_class)
            if record is None:
                return CircuitBreaker(
                    ident,
                    runtime.spec.provider_class,
                    policy,
                    probe_timeout_ms=engine.probe_timeout_ms,
                    emit=emit,
                )
            return CircuitBreaker.from_record(
                record, policy, probe_timeout_ms=engine.probe_timeout_ms, emit=emit
            )
        if kind == "c":
            conn = engine.connections.get(ident)
            if conn is None:
                return None
            health = ConnectionHealth(ident, conn.spec.provider, enabled=conn.spec.enabled, emit=emit)
            if record is not None:
                health.load_record(record)
            return health
        table = LockoutTable(emit=emit)
        if record is not None:
            table.restore([LockoutEntry.from_record(record)])
        return table

    def _record_of(self, kind: str, ident: str, obj: Any) -> dict[str, Any] | None:
        if kind == "l":
            entry = obj.get(*triple_of(ident))
            return None if entry is None else _plain(entry.to_record())
        return _plain(obj.to_record())

    def _newest(
        self, slot: tuple[str, str], record: dict[str, Any] | None, version: int
    ) -> dict[str, Any] | None:
        """Take a record read or written at `version` into the cache, unless the cache already holds
        a later one, and return the newest record known. A reply is heard after an await: by then
        the feed may have brought another replica's later write (adopting nothing while this
        replica had the record's job pending), and taking the reply as the newest would set this
        replica back for good, since the feed never brings that write again."""
        cached = self._cache.get(slot)
        if cached is not None and cached[1] > version:
            return cached[0]
        self._cache[slot] = (record, version)
        return record

    def _adopt(self, kind: str, ident: str, record: Mapping[str, Any] | None) -> None:
        """Take a shared record into this replica's memory tier (no events: the feed brings them)."""
        engine = self._engine
        try:
            if kind == "b":
                runtime = engine.providers.get(ident)
                if runtime is not None and record is not None:
                    runtime.breaker.load_record(record)
            elif kind == "c":
                conn = engine.connections.get(ident)
                if conn is not None and record is not None:
                    conn.health.load_record(record)
            elif kind == "l":
                provider, connection_id, model = triple_of(ident)
                if record is None:
                    engine.lockouts.discard(provider, connection_id, model)
                elif provider in engine.providers and connection_id in engine.connections:
                    engine.lockouts.restore([LockoutEntry.from_record(record)])
        except ValueError as exc:
            log.warning("fleet: ignored a bad shared record for %s %s: %s", kind, ident, exc)

    # ------------------------------------------------------------------ the change feed

    async def _supervise(self) -> None:
        """Tail the feed; on a lost Redis, retry with backoff, then reconcile and tail again."""
        delay = RECONNECT_BACKOFF_S[0]
        while not self._stopping:
            try:
                if not self.connected:
                    await self._reconnect()
                    delay = RECONNECT_BACKOFF_S[0]
                await self._tail()
                if not self._stopping:
                    await asyncio.sleep(delay)  # lost elsewhere: back off before reconnecting
                    delay = min(delay * 2, RECONNECT_BACKOFF_S[1])
            except (RedisError, OSError) as exc:
                # A stop's cancellation can reach us as the Redis client's own error: not an outage.
                if self._stopping:
                    return
                self._lost(exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_BACKOFF_S[1])
            except Exception:
                if self._stopping:
                    return
                log.exception("fleet: the change feed failed; retrying")
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_BACKOFF_S[1])

    async def _tail(self) -> None:
        assert self._feed is not None
        # Until Redis is lost: by the feed itself (an error, to `_supervise`), or by any other
        # command (a write, a heartbeat: `_lost`), which this loop learns within a block, and
        # hands back to `_supervise` to reconnect and reconcile (its own connection being fine
        # says nothing of the one that failed).
        while self.connected:
            reply = await self._feed.xread({self.feed_key: self._feed_from}, count=500, block=FEED_BLOCK_MS)
            for _stream, entries in reply or ():
                for entry_id, fields in entries:
                    self._feed_from = entry_id
                    self._on_entry(fields)

    def _on_entry(self, fields: Mapping[str, str]) -> None:
        kind, ident, origin = fields.get("k", ""), fields.get("i", ""), fields.get("o", "")
        if kind in ("b", "c", "l"):
            version = int(fields.get("v") or 0)
            slot = (kind, ident)
            operator = self._heard_acted(slot, fields.get("a") or "") and origin != self.replica_id
            if version > self._cache.get(slot, (None, 0))[1]:
                text = fields.get("r") or ""
                record = json.loads(text) if text else None
                self._cache[slot] = (record, version)
                # With this replica's own outcomes for the record still queued, its memory tier is
                # ahead of the feed and waits for them; another replica's operator action is taken
                # at once all the same (what it freed is free now, and the requests its event
                # nudges look again now): outcomes queued here from before it are dropped.
                if not self._pending.get(slot) or operator:
                    self._adopt(kind, ident, record)
        elif kind == "s":
            version = int(fields.get("v") or 0)
            if origin != self.replica_id and version > self._settings_version:
                self._adopt_settings(json.loads(fields.get("r") or "{}"), version)
        elif kind == "p":
            runtime = self._engine.providers.get(ident)
            if origin != self.replica_id and runtime is not None and runtime.breaker.probe_ticket == 0:
                runtime.breaker.hold_probe_elsewhere(self._clock.now())  # the fleet's probe is free again
        self._publish(fields.get("e"))

    def _publish(self, text: str | None) -> None:
        if not text or text == "[]":
            return
        for raw in json.loads(text):
            self._bus.publish(
                Event(
                    ts=float(raw["ts"]),
                    layer=raw["layer"],
                    key=str(raw["key"]),
                    from_=str(raw["from"]),
                    to=str(raw["to"]),
                    reason=str(raw["reason"]),
                )
            )

    def _adopt_settings(self, document: Mapping[str, Any], version: int) -> None:
        settings = self._settings
        assert settings is not None
        with self._settings_lock:
            self._settings_version = version
            self._settings_dirty = False
        for group, names in SECTIONS.items():
            part = {name: document[name] for name in names if name in document}
            for _ in range(3):
                try:
                    settings.commit(settings.prepare(part, group))
                    break
                except StaleSettingsChange:
                    continue  # a local change went live in between: merge onto it
                except Exception:
                    log.exception("fleet: could not apply the fleet's settings (version %d)", version)
                    break

    # ------------------------------------------------------------------ losing and regaining Redis

    def _lost(self, exc: BaseException) -> None:
        if self._stopping:
            return
        self.connected = False
        if not self.up:
            return  # said already (or lost again while reconciling: still the same outage)
        self.up = False
        self.since = self._clock.now()
        reason = (str(exc) or type(exc).__name__)[:200]
        log.warning("fleet: lost the state backend (%s); serving on this replica's memory", reason)
        self._bus.publish(Event(self.since, "state", "redis", "connected", "disconnected", reason))

    async def _reconnect(self) -> None:
        assert self._r is not None
        await self._r.ping()
        last = await self._r.xrevrange(self.feed_key, count=1)
        # A Redis that came back empty (restarted without persistence) has a new feed: read all of it.
        self._feed_from = last[0][0] if last else "0-0"
        # Connected first: transitions from here on are written (and replayed on conflict) as
        # usual, while the reconcile below merges what changed while Redis was away.
        self.connected = True
        try:
            merged = await self._reconcile()
            merged += await self.affinity.reconcile()
        except BaseException:
            # Not back yet: a reconcile cut short (Redis lost again, a stop) starts over on the
            # next try, with what this replica changed while away still to merge.
            self.connected = False
            raise
        self.up = True
        self.since = self._clock.now()
        log.warning("fleet: the state backend is back; %d records reconciled", merged)
        self._bus.publish(
            Event(self.since, "state", "redis", "disconnected", "connected", f"reconciled {merged}")
        )

    async def _reconcile(self) -> int:
        """Merge this replica's memory tier with Redis; returns how many records it wrote."""
        assert self._r is not None
        engine = self._engine
        dirty, self._dirty = self._dirty, set()
        written = 0
        try:
            for pid, runtime in engine.providers.items():
                written += await self._reconcile_one("b", pid, _plain(runtime.breaker.to_record()), dirty)
            for cid, conn in engine.connections.items():
                written += await self._reconcile_one("c", cid, _plain(conn.health.to_record()), dirty)
            idents = {event_key(*key) for key in engine.lockouts.keys()}  # noqa: SIM118 (a method, not a dict)
            async for name in self._r.scan_iter(match=self.every("l"), count=500):
                idents.add(name[len(self.prefix) + 2 :])
            for ident in idents:
                entry = engine.lockouts.get(*triple_of(ident))
                local = None if entry is None else _plain(entry.to_record())
                written += await self._reconcile_one("l", ident, local, dirty)
            written += await self._reconcile_settings()
        except BaseException:
            self._dirty |= dirty  # merged again on the next try (a merge already written is a no-op)
            raise
        return written

    async def _reconcile_one(
        self, kind: str, ident: str, local: dict[str, Any] | None, dirty: set[tuple[str, str]]
    ) -> int:
        assert self._r is not None
        slot = (kind, ident)
        for _ in range(MAX_REPLAYS):
            version_text, text, acted = await self._r.hmget(self.key(kind, ident), ["v", "r", "a"])
            version = int(version_text or 0)
            remote = self._readable(slot, text)
            self._heard_acted(slot, acted or "")
            changed = slot in dirty
            if version < self._cache.get(slot, (None, 0))[1]:
                # Redis holds less than this replica saw of the record (it came back empty, or
                # from an older snapshot, or the key was deleted): what this replica knows is
                # written back, as if it had changed while away; and the version it saw is gone.
                del self._cache[slot]
                changed = True
            if not changed and version > 0:
                # Unchanged here while away: the fleet's record is the truth.
                self._adopt(kind, ident, self._newest(slot, remote, version))
                return 0
            try:
                kept = since_operator(kind, local, remote, float(acted) if acted else None)
                merged = MERGES[kind](kept, remote)
                if kind == "l" and merged is not None and float(merged["expires_at"]) <= self._clock.now():
                    merged = remote
            except (ValueError, TypeError, KeyError) as exc:
                # Valid JSON of another shape (another writer's): read as no record, replaced below.
                self._unreadable(slot, exc)
                remote = None
                merged = local
            if merged == remote:
                self._adopt(kind, ident, self._newest(slot, remote, version))
                return 0
            ok, new_version, *_ = await self._write(kind, ident, version, merged, [])
            if ok:
                self._adopt(kind, ident, self._newest(slot, merged, new_version))
                return 1
        return 0

    async def _reconcile_settings(self) -> int:
        assert self._r is not None and self._settings is not None
        version_text, text = await self._r.hmget(self.settings_key, ["v", "r"])
        remote_version = int(version_text or 0)
        remote = None
        if text:
            try:
                remote = json.loads(text)
            except ValueError as exc:
                log.warning("fleet: %s is unreadable (%s); replaced", self.settings_key, str(exc)[:200])
            if not isinstance(remote, dict):
                remote = None  # another writer's: replaced by the settings this replica runs on
        with self._settings_lock:
            dirty, local_version = self._settings_dirty, self._settings_version
        if local_version > remote_version or remote is None:
            # The highest version wins: this replica's change made while away; or Redis holds
            # less than this replica saw (it came back empty, or from an older snapshot): the
            # settings this replica runs on are the fleet's again.
            document = json.dumps(self._settings.document(), separators=(",", ":"))
            ok, version = await self._write_settings(remote_version, document)
            if ok:
                with self._settings_lock:
                    self._settings_version, self._settings_dirty = version, False
                return 1
            return 0  # another replica wrote first: its document comes on the feed
        with self._settings_lock:
            self._settings_dirty = False
        if remote_version > local_version or dirty:
            self._adopt_settings(remote, remote_version)
        return 0

    async def _write_settings(self, expected: int, document: str) -> tuple[bool, int]:
        assert self._r is not None
        result = await self._r.eval(*self._settings_write(expected, document))
        return bool(int(result[0])), int(result[1])

    def _settings_write(self, expected: int, document: str) -> tuple[Any, ...]:
        """The TRANSITION script's arguments that write the settings `document` if the fleet's
        version is still `expected` (for the request threads' client and the loop's alike)."""
        return (
            TRANSITION,
            2,
            self.settings_key,
            self.feed_key,
            expected,
            "s",
            "settings",
            document,
            "[]",
            self.replica_id,
            0,
            FEED_MAXLEN,
        )

    # ------------------------------------------------------------------ replicas

    async def _heartbeat(self) -> None:
        failing = False
        while not self._stopping:
            if self.connected and self._r is not None:
                try:
                    await self._beat()
                    failing = False
                except (RedisError, OSError) as exc:
                    if self._stopping:
                        return  # a stop's cancellation, as the Redis client reports it
                    self._lost(exc)
                except Exception:
                    # Never the end of the heartbeat: without it this replica's key expires, and
                    # the fleet loses sight of it (and, of all of them, lets any config join).
                    if not failing:
                        log.exception("fleet: a heartbeat failed; beating on")
                    failing = True
            await asyncio.sleep(HEARTBEAT_S)

    async def _beat(self) -> None:
        assert self._r is not None
        now = self._clock.now()
        engine = self._engine
        me = {
            "id": self.replica_id,
            "address": self.address,
            "startedAt": iso(self.started_at),
            "uptimeMs": int(now - self.started_at),
            "inFlight": engine.stats.in_flight,
            "lastSeen": iso(now),
        }
        await self._r.set(self.key("replica", self.replica_id), json.dumps(me), px=REPLICA_TTL_MS)
        source = self.stats_source
        if source is not None:
            windows = {"at": now, "windows": source(now)}
            text = json.dumps(windows, separators=(",", ":"))
            await self._r.set(self.key("stats", self.replica_id), text, px=REPLICA_TTL_MS)
        names = [name async for name in self._r.scan_iter(match=self.every("replica"), count=100)]
        values = await self._r.mget(names) if names else []
        replicas = []
        bad = set()
        for name, text in zip(names, values, strict=True):
            replica = _replica_of(text) if text else None
            if replica is not None:
                replicas.append(replica)
            elif text:
                bad.add(name)
        for name in sorted(bad - self._bad_replicas):
            log.warning("fleet: %s is not a replica's heartbeat (another writer's?); left out", name)
        self._bad_replicas = bad
        replicas.sort(key=lambda r: r["id"])
        self.replicas = replicas

    async def peer_stats(self) -> PeerStats:
        """The statistics windows the other live replicas published (`/api/stats?scope=fleet`).

        Read when asked (a management read, never the request path): the live replicas are the
        `replica:*` keys, their windows the `stats:*` keys they refresh with each heartbeat. With
        Redis away, every other replica last seen is missing."""
        others = [str(r.get("id")) for r in self.replicas if r.get("id") != self.replica_id]
        if not self.connected or self._r is None:
            return PeerStats({}, [], others)
        try:
            names = [n async for n in self._r.scan_iter(match=self.every("replica"), count=100)]
            ids = sorted(n[len(self.prefix) + len("replica:") :] for n in names)
            ids = [i for i in ids if i != self.replica_id]
            values = await self._r.mget([self.key("stats", i) for i in ids]) if ids else []
        except (RedisError, OSError) as exc:
            self._lost(exc)
            return PeerStats({}, [], others)
        now = self._clock.now()
        rows: dict[str, dict[str, dict[str, list[float]]]] = {}
        stale: list[str] = []
        missing: list[str] = []
        for ident, text in zip(ids, values, strict=True):
            if not text:
                missing.append(ident)
                continue
            try:
                published = json.loads(text, parse_constant=untrusted.no_constant)
                at, windows = float(published["at"]), published["windows"]
            except (ValueError, TypeError, KeyError):
                missing.append(ident)
                continue
            if not (math.isfinite(at) and _windows_ok(windows)):
                missing.append(ident)  # another writer's: not a replica's windows
            elif now - at > STATS_STALE_MS:
                stale.append(ident)
            else:
                rows[ident] = windows
        return PeerStats(rows, stale, missing)


_HEARTBEAT: dict[str, type] = {
    "id": str,
    "address": str,
    "startedAt": str,
    "uptimeMs": int,
    "inFlight": int,
    "lastSeen": str,
}
"""A replica's heartbeat document (`_beat`): what the health document's `fleet.replicas` lists."""


def _replica_of(text: str) -> dict[str, Any] | None:
    """The heartbeat in a `replica:*` key, or None if it holds none (another writer's key): each
    field of its type, nothing else. What health relays is then the documented shape, and JSON
    (Python's parser takes `NaN` and `Infinity`, which no JSON client reads)."""
    try:
        found = json.loads(text, parse_constant=untrusted.no_constant)
    except ValueError:
        return None
    if not isinstance(found, dict):
        return None
    replica: dict[str, Any] = {name: found.get(name) for name in _HEARTBEAT}
    if any(type(replica[name]) is not kind for name, kind in _HEARTBEAT.items()):
        return None
    return replica if replica["uptimeMs"] >= 0 and replica["inFlight"] >= 0 else None


def _windows_ok(windows: object) -> bool:
    """Published statistics windows of the shape `TrafficStats.rows` writes: window -> connection ->
    a row of finite, non-negative numbers (what another writer left is not summed)."""
    return isinstance(windows, dict) and all(
        isinstance(rows, dict)
        and all(
            isinstance(row, list) and all(type(x) in (int, float) and 0 <= x < math.inf for x in row)
            for row in rows.values()
        )
        for rows in windows.values()
    )


def _plain(record: Mapping[str, Any]) -> dict[str, Any]:
    """A record as it reads back from JSON, so a local one and a stored one compare equal."""
    result: dict[str, Any] = json.loads(json.dumps(record))
    return result


def _withdraw(attempt: Attempt, now: float) -> None:
    """Undo what `select` took for a probe attempt that will not be sent: its connection's slot and
    the breaker's probe slot."""
    attempt.connection.in_flight -= 1
    attempt.provider.breaker.release_probe(now, attempt.probe_ticket)
