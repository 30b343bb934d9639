"""One running instance: config + store + engine + upstream client + router + pipeline.

`Runtime.open()` builds it (blocking I/O: call it before the event loop serves traffic);
`start()` / `stop()` run inside the server's lifespan. The console and the headless server both
hold a `Runtime`, so they read the same engine in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from proxy import __version__
from proxy.apis import auth_headers
from proxy.config import Config
from proxy.engine import ConnectionSpec, Engine, ProviderSpec
from proxy.owners import ResponseOwners
from proxy.pipeline import Pipeline
from proxy.readmodel import LOCAL_REPLICA, ReadModel
from proxy.resilience.clock import Clock, SystemClock
from proxy.resilience.errors import SettingsError
from proxy.resilience.events import EventBus
from proxy.router import Router, parse_model_list
from proxy.scrub import Scrubber
from proxy.settings import (
    Settings,
    SettingsChange,
    SettingsContended,
    StaleSettingsChange,
    apply_env_overrides,
    defaults,
    field,
    leaves,
)
from proxy.store import BadRecord, MemoryStore, SqliteStore, StateStore, StoredState
from proxy.stream import StreamHub
from proxy.traffic import merged_report
from proxy.trail import EventCounts, Trail
from proxy.upstream import Timeouts, UpstreamClient, UpstreamFailure

if TYPE_CHECKING:
    from proxy.fleet import FleetState
    from proxy.statelock import StateLock

log = logging.getLogger("omniroute")

PERSIST_INTERVAL_S = 0.25
ACK_FLUSH_S = 5.0
"""The longest an operator's action waits for the disk before it is answered (`acknowledge`)."""


def not_saved(problem: str) -> str:
    """What an operator is told of an action the store refused: it is in effect all the same, and
    the store's writer keeps trying (a disk that has room again takes it)."""
    return (
        f"done and in effect, but not saved: {problem}; it is saved as soon as the state file takes"
        " writes again (until then, a restart would undo it)"
    )


SETTINGS_TRIES = 5
"""How often a settings change is merged onto a newer document and written again before it gives
up (`SettingsContended`): each try of a fleet's replica waits up to a second for that document."""


class Runtime:
    def __init__(
        self,
        config: Config,
        store: StateStore,
        *,
        clock: Clock | None = None,
        env: Mapping[str, str] | None = None,
        state_path: Path | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.state_path = state_path
        self.version = __version__
        self.demo = False
        """True when serving the built-in simulated upstreams (`--demo`)."""
        self.state_lock: StateLock | None = None
        """The lock on the state file this instance owns (proxy/statelock.py), when it has one."""
        self.clock: Clock = clock or SystemClock()
        self.bus = EventBus()
        self.scrubber = Scrubber(config.secrets())
        stored = store.load()
        self._scrub_stored(stored)
        document = stored.settings if stored.settings is not None else defaults()
        document, self.warnings = apply_env_overrides(document, env if env is not None else os.environ)
        self.warnings = [*config.warnings, *self.warnings]
        try:
            self.settings = Settings(document, clock=self.clock, emit=self.bus.publish)
        except SettingsError as exc:
            # A document written by another version may no longer validate: start on defaults
            # rather than refuse to start, and say so.
            self.warnings.append(f"stored settings ignored, defaults used ({exc})")
            fallback, _ = apply_env_overrides(defaults(), env if env is not None else os.environ)
            self.settings = Settings(fallback, clock=self.clock, emit=self.bus.publish)
        self.engine = Engine(
            [
                ProviderSpec(p.id, p.provider_class, p.per_model_quota, p.rate_limit, p.restate)
                for p in config.providers.values()
            ],
            [
                ConnectionSpec(
                    c.id,
                    c.provider,
                    name=c.name,
                    priority=c.priority,
                    max_concurrent=c.max_concurrent,
                    enabled=c.enabled,
                    disable_cooling=c.disable_cooling,
                    fingerprint=c.fingerprint(),
                    masked_key=c.masked_key(),
                )
                for p in config.providers.values()
                for c in p.connections
            ],
            settings=self.settings,
            store=store,
            clock=self.clock,
            bus=self.bus,
            probe_timeout_ms=config.server.first_byte_timeout_ms,
            scrubber=self.scrubber,
        )
        self.owners = ResponseOwners(self.clock, store)
        """Which connection created each Responses API response (for its follow-up routes)."""
        self.owners.take(stored.pins, self.engine.connections)  # before the engine reads the pins
        self.engine.restore(stored, rewind=not config.state.shared)
        self.fleet: FleetState | None = None
        """The Redis backend this replica shares its resilience state through (None: SQLite)."""
        if config.state.shared:
            from proxy.fleet import FleetState

            assert isinstance(store, FleetState)
            self.fleet = store
            store.attach(self.engine, self.settings)
            self.owners.shared = store
        server = config.server
        self.upstream = UpstreamClient(
            Timeouts(server.connect_timeout_ms, server.first_byte_timeout_ms, server.idle_timeout_ms)
        )
        self.router = Router(config, self.engine, self._list_models)
        self.event_counts = EventCounts()
        self.bus.subscribe(self.event_counts)
        history = server.request_history
        self.trail = Trail(self.engine, self.clock, history) if history > 0 else None
        """The request records and traffic statistics (None when `server.request_history` is 0)."""
        if self.fleet is not None and self.trail is not None:
            self.fleet.stats_source = self.trail.stats_rows
        self.pipeline = Pipeline(config, self.engine, self.router, self.upstream, self.trail)
        self.pipeline.owners = self.owners
        self.bus.subscribe(self.pipeline.nudge)  # an operator's action frees waiting requests at once
        self.read = ReadModel(self.engine, self.bus, self.version, self.trail, fleet=self.fleet)
        """What observers (the console) read: frozen views, never the engine's live objects."""
        self.stream = StreamHub(self.bus, self.settings, self.read)
        """`GET /api/stream`'s messages, for attached consoles and `--follow` scripts."""
        self._persist_task: asyncio.Task[None] | None = None
        self._settings_lock = asyncio.Lock()

    @classmethod
    def open(cls, config: Config, state_path: Path | None, **kwargs: Any) -> Runtime:
        """Open the state database (None: memory only), or the fleet's Redis, and build the instance."""
        store: StateStore
        if config.state.shared:
            from proxy.fleet import FleetState

            store = FleetState(config, clock=kwargs.get("clock"))
        else:
            store = SqliteStore(state_path) if state_path is not None else MemoryStore()
        try:
            return cls(config, store, state_path=state_path, **kwargs)
        except BadRecord as exc:
            store.close()
            if config.state.shared:  # the row is a Redis key: name it, not a file
                assert isinstance(store, FleetState)
                raise store.unreadable_record(exc.table, exc.row, exc.reason) from None
            if exc.path is None and state_path is not None:
                raise exc.at(state_path) from None  # the engine knows the row, not the file
            raise
        except BaseException:
            store.close()
            raise

    def _scrub_stored(self, stored: StoredState) -> None:
        """A state file written before error text was scrubbed may hold a key an upstream quoted:
        scrub the records, and have the store leave none of the old text in the file."""
        scrub = self.scrubber
        changed: dict[str, dict[str, Any]] = {}
        for connection_id, record in stored.connections.items():
            error = record.get("last_error")
            if isinstance(error, str) and scrub.finds(error):
                record["last_error"] = scrub(error)
                changed[connection_id] = record
        if changed:
            self.store.save_connections(changed)
        self.store.purge(scrub.finds)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.upstream.start()
        if self.fleet is not None:
            await self.fleet.start()
        if self._persist_task is None:
            self._persist_task = asyncio.create_task(self._persist_loop(), name="omniroute-persist")

    def stopping(self) -> None:
        """The server has begun to stop (serve.make_server): the live streams end, and requests
        that wait are answered now (`Pipeline.stop`); those upstream get the grace period. The
        state file's lock says so, so that a restart meanwhile waits for it (not refused)."""
        if self.state_lock is not None:
            self.state_lock.mark_stopping()
        self.stream.close()
        self.pipeline.stop()

    async def stop(self) -> None:
        self.stream.close()  # normally done already, as the server began to stop (`stopping`)
        if self._persist_task is not None:
            self._persist_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._persist_task
            self._persist_task = None
        self._persist()
        if self.fleet is not None:
            await self.fleet.stop()
        await asyncio.to_thread(self.store.close)
        await self.upstream.close()

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(PERSIST_INTERVAL_S)
            try:
                self._persist()
            except Exception:  # the store reports its own errors; the loop must survive them
                log.exception("could not persist engine state")

    def _persist(self) -> None:
        self.engine.persist()
        self.owners.persist()

    async def acknowledge(self) -> str | None:
        """Before an operator's action is answered: what it changed is on disk, so that a crash
        right after the answer keeps it (the write-behind would take up to PERSIST_INTERVAL_S and
        the writer's commit). None when it is; else why not, when the store refused it (a full
        disk, a state file removed under the instance): the action is live, but a restart would
        lose it, and its answer must say so. A store that only did not answer in ACK_FLUSH_S (a
        slow disk) leaves the action answered all the same: it reports its own errors."""
        self._persist()
        if await asyncio.to_thread(self.store.flush, ACK_FLUSH_S):
            return None
        return self.store.write_problem

    # ------------------------------------------------------------------ the fleet's statistics

    async def fleet_stats(self, window: str) -> dict[str, object]:
        """`GET /api/stats?scope=fleet`: `window` summed over the fleet's live replicas.

        This replica's own windows are read live; the others' are those they published with
        their last heartbeat (at most a second or so old). Without a fleet (SQLite), this replica
        is the fleet: its own statistics, summed over one replica named `local`."""
        now = self.clock.now()
        members = {
            p: [c.spec.id for c in provider.connections] for p, provider in self.engine.providers.items()
        }
        own = self.trail.stats.rows(now).get(window, {}) if self.trail is not None else {}
        parts = [own]
        fleet = self.fleet
        if fleet is None:
            summed, stale, missing = [LOCAL_REPLICA], [], []
        else:
            peers = await fleet.peer_stats()
            summed = [fleet.replica_id, *sorted(peers.rows)]
            parts += [windows.get(window, {}) for windows in peers.rows.values()]
            stale, missing = peers.stale, peers.missing
        report = merged_report(window, members, parts).to_api()
        return {
            **report,
            "scope": "fleet",
            "replicas": {"summed": summed, "stale": stale, "missing": missing},
        }

    # ------------------------------------------------------------------ settings

    async def patch_settings(
        self, patch: Mapping[str, Any], group: str, *, source: str = "api"
    ) -> dict[str, Any]:
        """Validate a settings change, write it, then apply it; returns once it is both on disk and live.
        Like every operator action it is announced with its CLI command and `source` (`api`, `tui`).

        SettingsError if invalid, StoreError if the write failed: either way nothing changed.
        """

        def told(document: Mapping[str, Any]) -> None:
            pairs = [f"{path}={field(path).written(_at(document, path))}" for path in leaves(patch)]
            self.engine.announce("settings set " + " ".join(pairs), source=source)

        return await self._change_settings(lambda: self.settings.prepare(patch, group), told)

    async def reset_settings_section(self, section: str) -> dict[str, Any]:
        """`patch_settings` for "Reset defaults": KeyError for an unknown section."""
        return await self._change_settings(lambda: self.settings.prepare_reset(section))

    async def _change_settings(
        self,
        prepare: Callable[[], SettingsChange],
        told: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """`told(document)`, if given, runs as the change goes live, in the same step as its
        `settings` events: the requests waiting out a cooldown look again once for both."""
        # The write runs in a task the caller cannot cancel: once the document may be on disk,
        # memory must follow it, or a client that hung up mid-PATCH would leave the two apart.
        task = asyncio.ensure_future(self._write_then_commit(prepare, told))
        task.add_done_callback(_retrieve)
        return await asyncio.shield(task)

    async def _write_then_commit(
        self, prepare: Callable[[], SettingsChange], told: Callable[[Mapping[str, Any]], None] | None
    ) -> dict[str, Any]:
        # One change at a time, from the merge to the commit: each document is merged onto the one
        # before it and reaches the disk before the next is merged, so the disk sees the changes in
        # the order memory does, and an answer is sent only for a change a restart would load.
        # (Two writes in flight at once could land in either order: the older document would win.)
        async with self._settings_lock:
            for _ in range(SETTINGS_TRIES):
                change = prepare()
                try:
                    await asyncio.to_thread(self.store.save_settings, change.document)
                    document = self.settings.commit(change)
                    if told is not None:
                        told(document)
                    return document
                except StaleSettingsChange:
                    # A memory-only Settings.patch() (start-up code, tests) slipped in during the
                    # write, or (a fleet) another replica's change went live first: merge onto it
                    # and write again, so neither change is lost.
                    continue
            # Bounded: a fleet whose versions disagree for good must answer, not hold the lock
            # (and every later change behind it) for ever.
            raise SettingsContended(f"the settings changed under this change {SETTINGS_TRIES} times in a row")

    # ------------------------------------------------------------------ upstream model lists

    async def _list_models(self, provider: str) -> list[str] | None:
        config = self.config.providers[provider]
        conn = next((c for c in config.connections if c.enabled), None)
        key = conn.api_key if conn else None
        bearer = config.auth == "bearer"
        try:
            response = await self.upstream.send(
                "GET",
                f"{config.base_url}/models",
                body=None,
                api_key=key if bearer else None,
                credentials=None if bearer else auth_headers(config.auth, key, None),
                extra_headers=config.headers,
                first_byte_ms=2000,
            )
            if response.status != 200:
                response.close()
                return None
            return parse_model_list(await response.read())
        except UpstreamFailure:
            return None


def _at(document: Mapping[str, Any], path: str) -> object:
    """The value at a dotted path of a settings document."""
    node: Any = document
    for part in path.split("."):
        node = node[part]
    return node


def _retrieve(task: asyncio.Future[Any]) -> None:
    # The caller may have been cancelled and never read the result: read the error here so that
    # asyncio does not log "exception was never retrieved" for a failure already answered or logged.
    if not task.cancelled():
        task.exception()
