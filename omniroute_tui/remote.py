"""The console attached to an instance it does not host (`omniroute tui --url`, docs/console.md).

`Mirror` is the read model of a running instance kept from its live stream (`GET /api/stream`):
it answers every question `proxy.readmodel.ReadModel` answers, from the views the stream sends,
so the feed, the snapshot builders and the actions cannot tell the two apart. Remaining times
count down on this process's clock from the moment each row arrived.

Events of the three layers are handed to the console only once the `state` message that carries
their rows has been applied (the server sends it within 250 ms), and settings events once the
`settings` message with the new documents has: a console that heard "loc-1 is cooling" and read
the row before it came would show the old row, and nothing would say to look again. Operator
events pass at once, in order.

`Remote` keeps the mirror up to date: it reads the stream, reconnects with backoff (0.5 s doubling
to 10 s) and resumes with `Last-Event-ID`, and asks for the 1- and 5-minute statistics every 5 s
(the stream carries the states, the records and, once a second, the counters). `RemoteOperator` and `RemoteSettings` are the console's
writes over the management API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import httpx

from proxy import stream
from proxy.readmodel import (
    BreakerView,
    ConnectionView,
    Event,
    LockoutTableStatus,
    LockoutView,
    RequestView,
    StatsReport,
    StatsView,
    Traffic,
    TransitionView,
    breaker_view,
    connection_view,
    event_view,
    lockout_table_view,
    lockout_view,
    request_view,
    reset_timeout_ms,
    stats_report,
)
from proxy.resilience.errors import FieldError, SettingsError
from proxy.scrub import Scrubber, StreamScrubber
from proxy.settings import SECTIONS, Settings
from proxy.sse import SSEParser

log = logging.getLogger("omniroute.tui")

__all__ = [
    "BACKOFF_MAX_S",
    "BACKOFF_START_S",
    "Mirror",
    "Remote",
    "RemoteError",
    "RemoteOperator",
    "RemoteSettings",
    "wall_ms",
]

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 10.0
STATS_POLL_S = 5.0
"""How often the statistics are asked for: their buckets are 5 s (the counters come with the stream)."""
EVENTS_KEPT = 1000
"""As many as the instance's own bus keeps."""
TRANSITIONS_KEPT = 20
"""Per breaker, as many as the engine keeps."""
RATE_SECONDS = 60
HELD_LAYERS = frozenset({"breaker", "connection", "lockout", "settings"})
"""Their events are told once the `state` (or `settings`) message after them has been applied."""
SETTINGS_PATHS = {"resilience": "/api/resilience", "settings": "/api/settings"}
STREAM = "/api/stream"
WITHOUT_REQUESTS = "?kinds=event,state,settings,counters"
"""The stream's message kinds (docs/api.md#the-live-stream) but the request records."""
STATS = "/api/stats"
STATS_WINDOWS = ("1m", "5m")
"""The windows the console shows (Overview's tiles, the Breakers and Connections columns)."""
FINAL_STATES = frozenset({"done", "failed", "client_gone"})


def wall_ms() -> float:
    return time.time() * 1000.0


class Mirror:
    """The read model of a remote instance, as its stream last told it (see the module's doc)."""

    def __init__(self, clock: Callable[[], float] = wall_ms) -> None:
        self._clock = clock
        self.version = ""
        self.ready = False
        """A snapshot has been applied: the mirror says something."""
        self._started_at = clock()
        self._frozen_at: float | None = None
        self._instance = ""
        self._changes = 0
        self._breakers: dict[str, tuple[BreakerView, float]] = {}
        self._connections: dict[str, tuple[ConnectionView, float]] = {}
        self._lockouts: dict[tuple[str, str, str], LockoutView] = {}
        self._lockout_table = LockoutTableStatus(0, 1, 0, 0, 0, 0)
        # The schema's defaults until the instance's documents come (the status line says
        # `connecting…` meanwhile): a Settings tab opened before then has every card to draw.
        self._settings: dict[str, dict[str, Any]] = {
            group: _readable_settings({}, group) for group in ("resilience", "settings")
        }
        self._events: deque[Event] = deque(maxlen=EVENTS_KEPT)
        self._history: dict[str, deque[TransitionView]] = {}
        self._held: list[Event] = []  # row events waiting for the state message with their rows
        self._listeners: list[Callable[[Event], None]] = []
        self._traffic = Traffic(0, 0, 0, 0)
        self._per_second: dict[int, int] = {}
        self._counted: int | None = None
        # The request records: the alive ones by id, the finished ones in the order they ended.
        self._recording = False
        self._request_history = 0
        self._requests_version = 0
        self._requests_epoch = 0
        self._alive: dict[str, RequestView] = {}
        self._finished: deque[RequestView] = deque()
        self._finished_ids: set[str] = set()
        self._finished_total = 0
        self._stats: dict[str, StatsReport] = {}
        self._state_backend: dict[str, object] = {"kind": "sqlite", "connected": True, "since": None}
        self._fleet: dict[str, object] | None = None

    # -- applying the stream ---------------------------------------------------------------------

    def apply(self, kind: str, data: Mapping[str, Any], *, instance: str = "") -> None:
        """One stream message (its `event` name and JSON data); `instance`: the process that sent
        it (the first part of its id), which tells a restarted instance from a stream that resumed."""
        if kind == "snapshot":
            self._snapshot(data, instance)
        elif kind == "event":
            event = event_view(data)
            if event is not None:
                self._event(event)
        elif kind == "state":
            self._state(data)
        elif kind == "settings":
            self._settings_documents(data)
        elif kind == "request":
            self._request(request_view(data))
        elif kind == "counters":
            self._health(data, self._clock())
        else:
            return
        self._changes += 1

    def _snapshot(self, data: Mapping[str, Any], instance: str) -> None:
        now = self._clock()
        if instance != self._instance:
            # Another process: its events are numbered from 1 again, and its breakers' histories
            # are its own. What the old one said stays in the console's Events tab.
            self._instance = instance
            self._events.clear()
            self._history.clear()
            # and its requests: the old one's finished records are no longer the instance's
            self._finished.clear()
            self._finished_ids.clear()
            self._requests_epoch += 1
        self._settings_documents(data.get("settings", {}))
        health = data.get("health", {})
        self._health(health, now)
        self._breakers = {}
        for row in health.get("providerBreakers", []):
            self._put_breaker(row, now)
        self._connections = {}
        for row in data.get("connections", []):
            self._put_connection(row, now)
        self._lockouts = {}
        for row in data.get("lockouts", []):
            view = lockout_view(row, now)
            self._lockouts[(view.provider, view.connection_id, view.model)] = view
        requests = data.get("requests")
        self._recording = isinstance(requests, Mapping)
        if isinstance(requests, Mapping):
            self._request_history = _count(requests.get("history"))
            self._alive = {}
            for row in requests.get("recent", []):
                self._request(request_view(row))
            for row in requests.get("alive", []):
                self._request(request_view(row))
        self.ready = True
        # What it missed while away: the events it has not told yet, then the rows as they are.
        told = self._events[-1].seq if self._events else 0
        for row in data.get("events", []):
            event = event_view(row)
            if event is not None and event.seq > told:
                self._record(event)
                self._tell(event)
        self._release()

    def _event(self, event: Event) -> None:
        self._record(event)
        if event.layer in HELD_LAYERS or self._held:
            self._held.append(event)
        else:
            self._tell(event)

    def _state(self, data: Mapping[str, Any]) -> None:
        now = self._clock()
        for row in data.get("breakers", []):
            self._put_breaker(row, now)
        for row in data.get("connections", []):
            self._put_connection(row, now)
        lockouts = data.get("lockouts", {})
        for row in lockouts.get("upsert", []):
            view = lockout_view(row, now)
            self._lockouts[(view.provider, view.connection_id, view.model)] = view
        for row in lockouts.get("remove", []):
            self._lockouts.pop(
                (str(row.get("provider")), str(row.get("connectionId")), str(row.get("model"))), None
            )
        self._release()

    def _release(self) -> None:
        held, self._held = self._held, []
        for event in held:
            self._tell(event)

    def _record(self, event: Event) -> None:
        self._events.append(event)
        if event.layer == "breaker":
            history = self._history.setdefault(event.key, deque(maxlen=TRANSITIONS_KEPT))
            history.append(TransitionView(event.ts, event.from_, event.to, event.reason))

    def _tell(self, event: Event) -> None:
        for listener in tuple(self._listeners):
            listener(event)

    def _request(self, view: RequestView) -> None:
        self._requests_version += 1
        if view.state not in FINAL_STATES:
            self._alive[view.id] = view
            return
        self._alive.pop(view.id, None)
        if view.id in self._finished_ids:  # a snapshot after a reconnect says it again
            return
        finished = self._finished
        if len(finished) >= max(1, self._request_history):
            self._finished_ids.discard(finished.popleft().id)
        finished.append(view)
        self._finished_ids.add(view.id)
        self._finished_total += 1

    def stats_polled(self, report: StatsReport) -> None:
        self._stats[report.window] = report

    def _settings_documents(self, data: Mapping[str, Any]) -> None:
        for group in ("resilience", "settings"):
            document = data.get(group)
            if isinstance(document, dict):
                self._settings[group] = _readable_settings(document, group)
        self._release()

    def _put_breaker(self, row: Mapping[str, Any], now: float) -> None:
        timeout = reset_timeout_ms(
            self._settings["resilience"], str(row.get("class", "")), row.get("openCycleCount", 0)
        )
        view = breaker_view(row, timeout)
        self._breakers[view.provider] = (view, now)

    def _put_connection(self, row: Mapping[str, Any], now: float) -> None:
        view = connection_view(row)
        self._connections[view.id] = (view, now)

    def health(self, data: Mapping[str, Any]) -> None:
        """The instance's health document (polled): counters, uptime, version, the lockout table."""
        self._health(data, self._clock())
        self._changes += 1

    def _health(self, data: Mapping[str, Any], now: float) -> None:
        self.version = str(data.get("version", self.version))
        backend = data.get("stateBackend")
        if isinstance(backend, dict):
            self._state_backend = dict(backend)
            fleet = data.get("fleet")
            self._fleet = dict(fleet) if isinstance(fleet, dict) else None
        uptime = data.get("uptimeMs")
        if isinstance(uptime, int):
            self._started_at = now - uptime
        table = data.get("lockoutTable")
        if isinstance(table, dict):
            self._lockout_table = lockout_table_view(table)
        requests = data.get("requests")
        if isinstance(requests, dict):
            traffic = Traffic(
                int(requests.get("total", 0)),
                int(requests.get("ok", 0)),
                int(requests.get("failed", 0)),
                int(requests.get("inFlight", 0)),
            )
            if self._counted is not None and traffic.total >= self._counted:
                second = int(now // 1000)
                self._per_second[second] = self._per_second.get(second, 0) + traffic.total - self._counted
                for old in [s for s in self._per_second if s <= second - RATE_SECONDS]:
                    del self._per_second[old]
            self._counted = traffic.total
            self._traffic = traffic

    # -- the read model ----------------------------------------------------------------------------

    def now(self) -> float:
        """The instance's present as the console shows it: while the stream is down (`freeze`), the
        moment it went, so that what is shown stays as of then (see `freeze`)."""
        frozen = self._frozen_at
        return self._clock() if frozen is None else frozen

    def freeze(self) -> None:
        """The stream is down: show what the instance said last, as of now, until `thaw`. Nothing
        moves on by the console's clock alone (the uptime, a request's age, a countdown, a breaker
        turning HALF_OPEN): the instance, which alone knows, may have done anything meanwhile."""
        if self._frozen_at is None:
            self._frozen_at = self._clock()

    def thaw(self) -> None:
        self._frozen_at = None

    @property
    def started_at(self) -> float:
        return self._started_at

    @property
    def last_seq(self) -> int:
        """Grows with every change the mirror applied (what a redraw keys on)."""
        return self._changes

    def events_after(self, seq: int) -> list[Event]:
        return [e for e in self._events if e.seq > seq]

    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def _breaker_now(self, view: BreakerView, received: float, now: float) -> BreakerView:
        if view.state != "OPEN":
            return view
        left = max(0.0, view.retry_after_ms - (now - received))
        # Lazy recovery, as the engine reads it: an OPEN breaker whose timeout ran out lets a probe in.
        return replace(view, retry_after_ms=left, state="OPEN" if left > 0 else "HALF_OPEN")

    def _connection_now(self, view: ConnectionView, received: float, now: float) -> ConnectionView:
        if view.status != "cooling":
            return view
        left = max(0.0, view.remaining_ms - (now - received))
        return replace(view, remaining_ms=left, status="cooling" if left > 0 else "active")

    def breakers(self, now: float) -> list[BreakerView]:
        return [self._breaker_now(v, t, now) for v, t in self._breakers.values()]

    def breaker(self, provider: str, now: float) -> BreakerView | None:
        found = self._breakers.get(provider)
        return self._breaker_now(*found, now) if found is not None else None

    def breaker_history(self, provider: str) -> tuple[TransitionView, ...]:
        return tuple(self._history.get(provider, ()))

    def connections(self, now: float) -> list[ConnectionView]:
        return [self._connection_now(v, t, now) for v, t in self._connections.values()]

    def connection(self, connection_id: str, now: float) -> ConnectionView | None:
        found = self._connections.get(connection_id)
        return self._connection_now(*found, now) if found is not None else None

    def unwell(self, now: float) -> list[ConnectionView]:
        return [c for c in self.connections(now) if c.status != "active"]

    def open_breakers(self, now: float) -> int:
        return sum(1 for b in self.breakers(now) if b.state == "OPEN")

    def cooling(self, now: float) -> int:
        return sum(1 for c in self.connections(now) if c.status == "cooling")

    def traffic(self) -> Traffic:
        return self._traffic

    def rates(self, now: float, seconds: int) -> list[int]:
        last = int(now // 1000)
        return [self._per_second.get(s, 0) for s in range(last - seconds + 1, last + 1)]

    def lockouts(self, now: float) -> list[LockoutView]:
        return [v for v in self._lockouts.values() if v.expires_at > now]

    def lockout(self, provider: str, connection_id: str, model: str) -> LockoutView | None:
        return self._lockouts.get((provider, connection_id, model))

    def lockouts_of(self, provider: str, connection_id: str, now: float) -> list[LockoutView]:
        return [
            v
            for v in self._lockouts.values()
            if v.provider == provider and v.connection_id == connection_id and v.expires_at > now
        ]

    def state_backend(self) -> dict[str, object]:
        return self._state_backend

    def fleet_api(self) -> dict[str, object] | None:
        return self._fleet

    def lockout_table(self) -> LockoutTableStatus:
        return self._lockout_table

    def settings_document(self, group: str) -> dict[str, Any]:
        return self._settings[group]

    # -- the traffic -----------------------------------------------------------------------------

    @property
    def recording(self) -> bool:
        return self._recording

    @property
    def requests_version(self) -> int:
        return self._requests_version

    @property
    def requests_epoch(self) -> int:
        return self._requests_epoch

    @property
    def request_history(self) -> int:
        return self._request_history

    def alive_requests(self) -> list[RequestView]:
        return list(self._alive.values())

    def alive_count(self) -> int:
        return len(self._alive)

    def finished_requests(self, mark: int, limit: int | None = None) -> tuple[list[RequestView], int]:
        finished, total = self._finished, self._finished_total
        count = min(total - mark, len(finished))
        if limit is not None:
            count = min(count, limit)
        if count <= 0:
            return [], total
        return list(finished)[len(finished) - count :], total

    def alive_changed(self, known: dict[str, str]) -> tuple[list[RequestView], dict[str, str]]:
        states = {request_id: view.state for request_id, view in self._alive.items()}
        changed = [view for request_id, view in self._alive.items() if known.get(request_id) != view.state]
        return changed, states

    def stats(self, window: str, now: float) -> StatsReport:
        found = self._stats.get(window)
        if found is not None:
            return found
        empty = StatsView(0, 0, None, None, None, None, None)
        return StatsReport(window, {p: empty for p in self._breakers}, {c: empty for c in self._connections})

    def provider_stats(self, window: str, now: float) -> dict[str, StatsView]:
        return dict(self.stats(window, now).providers)

    def latency_series(self, provider: str, now: float, buckets: int) -> list[float | None]:
        """Not sent to an attached console: its tiles show no sparkline."""
        return [None] * buckets


class RemoteError(Exception):
    """The instance refused, failed or never got an action; the message says so in words."""


def _unanswered(url: str, exc: httpx.TransportError) -> RemoteError:
    """What an action that got no answer tells the operator: nothing changed when the instance could
    not be reached; when the link broke once the request was out, it may have been applied."""
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        return RemoteError(f"{url} could not be reached: nothing changed")
    broke = "no answer in time" if isinstance(exc, httpx.TimeoutException) else "the link broke"
    return RemoteError(f"{url} did not answer ({broke}): the change may or may not have been made")


def _error_message(response: httpx.Response, scrub: Scrubber) -> str:
    """What the instance said was wrong, without the console's own token (a server may quote the
    headers it was sent)."""
    try:
        error = response.json().get("error", {})
        message = error.get("message")
    except (ValueError, AttributeError):
        message = None
    return scrub(message) if isinstance(message, str) else f"{response.status_code} {response.reason_phrase}"


class RemoteOperator:
    """The engine's operator commands over the management API (`actions.Operator`), for a worker
    thread. A 404 is a KeyError, as the engine raises for a name it does not know."""

    def __init__(self, url: str, token: str | None) -> None:
        self._url = url
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._scrub = Scrubber([token])

    def _call(self, method: str, path: str, body: object = None, *, name: str = "") -> dict[str, Any]:
        with httpx.Client(base_url=self._url, headers=self._headers, timeout=10.0, trust_env=False) as client:
            try:
                response = client.request(method, path, json=body)
            except httpx.TransportError as exc:
                raise _unanswered(self._url, exc) from exc
        if response.status_code == 404 and name:
            raise KeyError(name)
        if response.status_code != 200:
            raise RemoteError(
                f"{self._url} answered {method} {path}: {_error_message(response, self._scrub)}"
            )
        answer: dict[str, Any] = response.json()
        return answer

    def reset_breakers(self, provider: str | None = None, *, source: str = "tui") -> int:
        body = {"provider": provider} if provider is not None else {}
        return int(self._call("POST", "/api/resilience/reset", body, name=provider or "")["resetCount"])

    def reset_connection(self, connection_id: str | None = None, *, source: str = "tui") -> int:
        if connection_id is None:
            answer = self._call("GET", "/api/resilience/connections")
            ids = [c["id"] for c in answer["connections"]]
        else:
            ids = [connection_id]
        for done, cid in enumerate(ids):
            try:
                self._call("POST", f"/api/resilience/connections/{cid}/reset", name=cid)
            except RemoteError as exc:
                if not done:
                    raise
                # ("nothing changed" would be untrue: the ones before it were reset)
                raise RemoteError(f"{done} of {len(ids)} connections were reset, then: {exc}") from exc
        return len(ids)

    def set_connection_enabled(self, connection_id: str, enabled: bool, *, source: str = "tui") -> None:
        self._call("PUT", f"/api/providers/{connection_id}", {"isActive": enabled}, name=connection_id)

    def reenable(
        self, provider: str, model: str, connection_id: str | None = None, *, source: str = "tui"
    ) -> int:
        body: dict[str, str] = {"provider": provider, "model": model}
        if connection_id is not None:
            body["connectionId"] = connection_id
        return int(self._call("DELETE", "/api/resilience/model-cooldowns", body, name=provider)["removed"])

    def reenable_all(self, *, source: str = "tui") -> int:
        return int(self._call("DELETE", "/api/resilience/model-cooldowns", {"all": True})["removed"])


class RemoteSettings:
    """The settings cards' source over the API: documents from the mirror, saves by PATCH."""

    def __init__(self, mirror: Mirror, url: str, token: str | None) -> None:
        self._mirror = mirror
        self._url = url
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._scrub = Scrubber([token])

    def document(self, group: str) -> dict[str, Any]:
        return self._mirror.settings_document(group)

    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        return self._mirror.subscribe(listener)

    async def patch(self, patch: Mapping[str, Any], group: str) -> dict[str, Any]:
        """The group's document after the change; SettingsError naming the fields the server refused."""
        async with httpx.AsyncClient(
            base_url=self._url, headers=self._headers, timeout=10.0, trust_env=False
        ) as client:
            try:
                response = await client.patch(SETTINGS_PATHS[group], json=patch)
            except httpx.TransportError as exc:
                raise _unanswered(self._url, exc) from exc
        if response.status_code == 400:
            fields = response.json().get("error", {}).get("fields") or []
            scrub = self._scrub
            raise SettingsError(
                [FieldError(str(f.get("field", "")), scrub(str(f.get("message", "")))) for f in fields]
            )
        if response.status_code != 200:
            raise RemoteError(f"not saved: {_error_message(response, self._scrub)}")
        document: dict[str, Any] = response.json()
        self._mirror.apply("settings", {group: document})  # the card reads it back at once
        return document


class Remote:
    """Keeps a `Mirror` of the instance at `url` up to date until `stop()`.

    `on_change(kind)` is called after each message applied (`snapshot`, `event`, `state`,
    `settings`, or `health` for the counters); `on_status(text)`
    when the link changes: "attached to URL", or "reconnecting… URL" while the stream is down."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        on_change: Callable[[str], None] = lambda kind: None,
        on_status: Callable[[str], None] = lambda text: None,
        mirror: Mirror | None = None,
    ) -> None:
        self.url = url
        self.token = token
        self.mirror = mirror or Mirror()
        self.operator = RemoteOperator(url, token)
        self.settings = RemoteSettings(self.mirror, url, token)
        self.on_change = on_change
        self.on_status = on_status
        self.connected = False
        self.ever_connected = False
        self._scrub = Scrubber([token])
        """The console's own token out of what the instance sends (a server may quote the headers it
        was sent): nothing shown holds it."""
        self.refused: str | None = None
        """Why the instance refused the stream (401/403), while it does: retrying cannot help
        until the operator acts, so the status line says so rather than `reconnecting…`."""
        self.last_event_id: str | None = None
        self.reconnects = 0
        self.requests_followed = True
        """Whether the stream is asked for request records (`follow_requests`)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._snapshot_came = asyncio.Event()
        """Set by each snapshot: the statistics are asked for at once (the snapshot says whether the
        instance records any), not up to STATS_POLL_S later."""
        self._stream: asyncio.Task[None] | None = None

    @property
    def status(self) -> str:
        if self.connected:
            return f"attached to {self.url}"
        if self.refused is not None:
            return f"{self.url} {self.refused}: retrying"
        return f"reconnecting… {self.url}" if self.ever_connected else f"connecting… {self.url}"

    def start(self) -> None:
        self._stream = asyncio.create_task(self._follow(), name="omniroute-stream")
        self._tasks = [self._stream, asyncio.create_task(self._poll(), name="omniroute-health")]

    def follow_requests(self, on: bool) -> None:
        """Ask the stream for request records only while something shows them (the Requests tab).

        Under traffic they are most of what the stream carries (up to 200 records a second, each
        decoded and mirrored: about half of an attached console's CPU, which it takes from the
        machine the proxy and its clients run on). A change opens the stream again with the other
        kinds, resumed from the last message: the instance sends what was missed of the new kinds,
        or a snapshot when records moved while nobody asked for them (docs/api.md)."""
        if on == self.requests_followed:
            return
        self.requests_followed = on
        if self._stream is not None and not self._stream.done():
            self._stream.cancel()  # not a break: the status line stays as it is
            self._stream = asyncio.create_task(self._follow(), name="omniroute-stream")
            self._tasks = [*(t for t in self._tasks if not t.done()), self._stream]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        self._stream = None

    def _headers(self) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        if self.last_event_id:
            headers["Last-Event-ID"] = self.last_event_id
        return headers

    def _link(self, connected: bool, refused: str | None = None) -> None:
        if connected:
            self.mirror.thaw()
        else:
            self.mirror.freeze()
        if connected != self.connected or refused != self.refused:
            self.connected, self.refused = connected, refused
            self.ever_connected = self.ever_connected or connected
            self.on_status(self.status)

    async def _follow(self) -> None:
        delay = BACKOFF_START_S
        # A read that hears nothing, not a ping either, for SILENCE_LIMIT_S is a dead link (a
        # network gone without a close): given up, and attached again.
        timeout = httpx.Timeout(10.0, read=stream.SILENCE_LIMIT_S)
        async with httpx.AsyncClient(base_url=self.url, timeout=timeout, trust_env=False) as client:
            while True:
                try:
                    url = STREAM if self.requests_followed else STREAM + WITHOUT_REQUESTS
                    refused = None
                    async with client.stream("GET", url, headers=self._headers()) as response:
                        if response.status_code in (401, 403):
                            refused = (
                                (
                                    "needs a management token"
                                    if self.token is None
                                    else "refused the management token"
                                )
                                if response.status_code == 401
                                else "refused this console (403)"
                            )
                        if response.status_code != 200:
                            raise RemoteError(f"{STREAM} answered {response.status_code}")
                        if self.mirror.ready:
                            # Resumed where it left off (what was missed comes next, or a snapshot
                            # if the instance cannot say it): attached again, and the next break
                            # starts its backoff over.
                            self._link(True)
                            delay = BACKOFF_START_S
                        parser = SSEParser(stream.MESSAGE_LIMIT_BYTES)
                        withheld = StreamScrubber(self._scrub)
                        async for chunk in response.aiter_raw():
                            for message in parser.feed(withheld.feed(chunk)):
                                if message.oversize:  # not taken: nor may its id say it was
                                    raise Unreadable(
                                        f"a {message.event} message over {stream.MESSAGE_LIMIT_BYTES:,} bytes"
                                    )
                                data = message.json_object()
                                if message.id is not None and message.event != "ping":
                                    self.last_event_id = message.id
                                if data is None:
                                    continue
                                instance = (message.id or "").rpartition("-")[0]
                                self._apply(message.event, data, instance)
                                if message.event == "snapshot":
                                    self._link(True)
                                    self._snapshot_came.set()
                                    delay = BACKOFF_START_S
                                self.on_change(message.event)
                except (httpx.HTTPError, RemoteError) as exc:
                    log.info("the stream from %s broke: %s", self.url, exc)
                except Unreadable as exc:
                    log.warning("%s: %s; attaching again", self.url, exc)
                    self.last_event_id = None  # a fresh snapshot: the mirror may hold half of this one
                self._link(False, refused)
                self.reconnects += 1
                await asyncio.sleep(delay)
                delay = min(BACKOFF_MAX_S, delay * 2)

    def _apply(self, event: str, data: dict[str, Any], instance: str) -> None:
        """One stream message into the mirror. A message it cannot read (a field of another type
        than the instance's API has: another version, a broken or hostile server) is `Unreadable`,
        which drops this connection: the console attaches again, and says `reconnecting…` meanwhile,
        rather than stop following for good while its status line says it is attached."""
        try:
            self.mirror.apply(event, data, instance=instance)
        except Exception as exc:  # whatever the data made the mirror's code raise
            raise Unreadable(
                f"a {event} message this console cannot read ({type(exc).__name__}: {exc})"
            ) from None

    async def _poll(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        async with httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=5.0, trust_env=False
        ) as client:
            while True:
                try:
                    if self.mirror.recording:
                        for window in STATS_WINDOWS:
                            answer = await client.get(STATS, params={"window": window})
                            if answer.status_code == 200:
                                self.mirror.stats_polled(stats_report(answer.json()))
                        self.on_change("stats")
                except (httpx.HTTPError, ValueError):
                    pass  # the stream says when the instance is away
                except Exception as exc:  # an answer of another shape: skip it, ask again
                    log.warning(
                        "%s: statistics this console cannot read (%s: %s)", self.url, type(exc).__name__, exc
                    )
                # (Not `wait_for`: in Python 3.11 it swallows a cancellation that meets the event
                # being set, and `stop()` would wait for this task forever.)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(STATS_POLL_S):
                        await self._snapshot_came.wait()
                self._snapshot_came.clear()


def _readable_settings(document: Mapping[str, Any], group: str) -> dict[str, Any]:
    """An instance's settings document as the cards read it: every section and key this console's
    schema has, each of its type (a section an older instance lacks reads as its default; a key
    only a newer one has is left out). ValueError for a value of another type or range: the
    message is unreadable, and the console attaches again rather than draw half a card."""
    merged, errors = Settings().validate(document, group)
    errors = [e for e in errors if e.message != "unknown key"]
    if errors:
        raise ValueError("; ".join(f"{e.field}: {e.message}" for e in errors[:3]))
    return {name: merged[name] for name in SECTIONS[group]}


class Unreadable(Exception):
    """A stream message the mirror could not take (its text says which, and what was wrong)."""


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
