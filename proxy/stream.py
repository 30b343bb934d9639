"""The live stream (`GET /api/stream`, docs/api.md#the-live-stream): the instance's changes as
server-sent events, for attached consoles and `--follow` scripts.

One `StreamHub` per runtime turns the event bus into numbered messages:

- `snapshot` (first, and whenever a client must start over): the whole read model;
- `event`: one resilience event, as `GET /api/events` shows it;
- `state`: the rows the events of the last 250 ms changed (breakers, connections, lockouts);
- `settings`: both settings documents after a change;
- `request`: a request record that began, changed state or ended (at most one per record per
  250 ms, and at most REQUESTS_PER_TICK finished ones: the newest; read from the trail only
  while a client that asked for them is attached);
- `counters`: the request counters, the uptime and the lockout table's fill, once a second;
- `ping` every 15 s, so that a client (and any proxy between) knows the line is alive.

Costs, since this runs beside the request path (a client asks for the kinds it reads with
`?kinds=`, and nothing is computed for a kind no client asked for):

- With no client attached the hub only notes which rows changed and, 250 ms later, puts one
  `state` message in the buffer; nothing is serialised. A message is encoded the first time a
  client needs it, once for all of them. (A `state` message is built then too, from the rows as
  they are at that moment: rows are whole, so a newer row is never wrong, only earlier news.)
- Each client has its own bounded queue. A client that stops reading never slows the proxy or
  the other clients: past `CLIENT_QUEUE` messages its queue is dropped and it is sent a fresh
  `snapshot` when it reads again, which says everything the dropped messages said (meanwhile no
  request record is viewed for it).

Ids are `<instance>-<seq>`: `seq` counts every message of this process, `instance` tells this
process from the one before a restart. A client that reconnects with `Last-Event-ID` is sent what
it missed while it is still in the buffer (the last `BUFFER` messages) and a fresh `snapshot`
otherwise, or when the id is another instance's.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from proxy import untrusted
from proxy.readmodel import ReadModel, triple_of
from proxy.resilience.events import Event, EventBus
from proxy.settings import Settings

__all__ = [
    "BUFFER",
    "CLIENT_QUEUE",
    "COALESCE_S",
    "PING_S",
    "SILENCE_LIMIT_S",
    "SNAPSHOT_EVENTS",
    "StreamHub",
]

BUFFER = 10_000
"""Messages kept for clients that reconnect with `Last-Event-ID`."""
CLIENT_QUEUE = 2_000
"""Messages one client may have waiting before it is sent a snapshot instead."""
COALESCE_S = 0.25
"""Changed rows are gathered this long into one `state` message."""
PING_S = 15.0
PING_CHECKS = 3
"""Silences are checked every PING_S / PING_CHECKS: a quiet client gets its ping after PING_S to
PING_S * (1 + 1 / PING_CHECKS) of silence."""
MESSAGE_LIMIT_BYTES = 32 << 20
"""The largest message a reader of the stream takes: a snapshot of a full lockout table (10,000
locks) is some 10 MB."""
SILENCE_LIMIT_S = 3 * PING_S * (1 + 1 / PING_CHECKS)
"""A reader that hears nothing, not a ping either, for this long (three pings missed) is reading a
dead link: a network gone without a close. The console and `--follow` give it up then."""
SNAPSHOT_EVENTS = 200
"""Recent events in a snapshot."""
SNAPSHOT_REQUESTS = 200
"""Recent finished request records in a snapshot (the alive ones are all there)."""
SNAPSHOT_REUSE_S = 0.5
KINDS = frozenset({"event", "state", "settings", "request", "counters"})
"""What a client may ask for with `?kinds=` (all by default); `snapshot` and `ping` always come."""
REQUESTS_PER_TICK = 50
"""Finished records sent per 250 ms at most (200 a second), the newest: under heavy traffic a
console shows the latest ones anyway, and every record costs the proxy a view and its JSON."""
COUNTERS_S = 1.0
WRITE_BATCH = 16
"""Messages encoded and written to one client at a time before the loop serves others."""

Payload = Callable[[], Any]


class Message:
    """One numbered SSE message; its bytes are made on first use and shared by every client."""

    __slots__ = ("_payload", "_wire", "kind", "seq")

    def __init__(self, seq: int, kind: str, payload: Payload) -> None:
        self.seq = seq
        self.kind = kind
        self._payload: Payload | None = payload
        self._wire: bytes | None = None

    def wire(self, instance: str) -> bytes:
        if self._wire is None:
            assert self._payload is not None
            payload = self._payload()
            try:  # one line either way: JSON escapes every line break
                data = orjson.dumps(payload)
            except TypeError:  # orjson refuses a lone surrogate (and a few other things)
                data = untrusted.dumps(payload)
            self._wire = b"id: %s-%d\nevent: %s\ndata: %s\n\n" % (
                instance.encode(),
                self.seq,
                self.kind.encode(),
                data,
            )
            self._payload = None  # the bytes are all a later client needs
        return self._wire


class _Client:
    __slots__ = ("kinds", "ping_due", "queue", "sent_at", "stale", "wake")

    def __init__(self, kinds: frozenset[str]) -> None:
        self.kinds = kinds
        """What it asked for (`snapshot` and `ping` always come)."""
        self.queue: deque[Message] = deque()
        self.stale = False
        """Its queue overflowed and was dropped: it is owed a snapshot."""
        self.wake = asyncio.Event()
        self.sent_at = 0
        """The hub's silence check (`StreamHub._checks`) when it was last sent something."""
        self.ping_due = False


class StreamHub:
    def __init__(self, bus: EventBus, settings: Settings, read: ReadModel) -> None:
        self._read = read
        self._bus = bus
        self._settings = settings
        self.instance = secrets.token_hex(4)
        self._seq = 0
        self._buffer: deque[Message] = deque(maxlen=BUFFER)
        self._clients: set[_Client] = set()
        self._closed = False
        # Rows changed since the last `state` message, and whether a flush is due.
        self._breakers: set[str] = set()
        self._connections: set[str] = set()
        self._lockouts: set[tuple[str, str, str]] = set()
        self._flush_due: asyncio.TimerHandle | None = None
        self._snapshot: tuple[Message, float] | None = None
        # The request records, read from the trail every COALESCE_S while a client is attached.
        self._requests_due: asyncio.TimerHandle | None = None
        self._requests_version = read.requests_version
        self._finished_mark = 0
        self._alive_states: dict[str, str] = {}
        self._requests_gap = 0
        """Records changed while nobody listened: a client that saw no later message starts over."""
        self._counters_due: asyncio.TimerHandle | None = None
        # One timer for every client's ping (a timeout per client's wait would cost each follower a
        # task and a timer for every message).
        self._ping_due: asyncio.TimerHandle | None = None
        self._checks = 0
        """Silence checks so far (`_silences`): the clock a client's `sent_at` is read against."""
        self._unsubscribe = bus.subscribe(self._on_event)

    @property
    def clients(self) -> int:
        return len(self._clients)

    @property
    def last_id(self) -> str:
        return f"{self.instance}-{self._seq}"

    # -- from the bus ----------------------------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        self._publish("event", event.to_dict)
        layer = event.layer
        if layer == "breaker":
            self._breakers.add(event.key)
        elif layer == "connection":
            self._connections.add(event.key)
        elif layer == "lockout":
            self._lockouts.add(triple_of(event.key))
        elif layer == "settings":
            self._publish("settings", self._settings_documents)
            return
        else:
            return
        if self._flush_due is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # published outside the server's loop (start-up, tools): no delay
                self.flush()
            else:
                self._flush_due = loop.call_later(COALESCE_S, self.flush)

    def flush(self) -> None:
        """Put the rows changed since the last flush in one `state` message."""
        self._flush_due = None
        if not (self._breakers or self._connections or self._lockouts):
            return
        breakers, connections, lockouts = self._breakers, self._connections, self._lockouts
        self._breakers, self._connections, self._lockouts = set(), set(), set()
        self._publish("state", lambda: self._state(breakers, connections, lockouts))

    def _publish(self, kind: str, payload: Payload) -> None:
        self._seq += 1
        message = Message(self._seq, kind, payload)
        self._buffer.append(message)
        for client in self._clients:
            if client.stale or kind not in client.kinds:
                continue
            if len(client.queue) >= CLIENT_QUEUE:
                client.queue.clear()  # the snapshot it is owed says all of it
                client.stale = True
            else:
                client.queue.append(message)
            client.wake.set()

    # -- payloads ----------------------------------------------------------------------------------

    def _settings_documents(self) -> dict[str, Any]:
        return {
            "resilience": self._settings.document("resilience"),
            "settings": self._settings.document("settings"),
        }

    def _state(
        self, breakers: set[str], connections: set[str], lockouts: set[tuple[str, str, str]]
    ) -> dict[str, Any]:
        read = self._read
        now = read.now()
        upsert: list[dict[str, object]] = []
        remove: list[dict[str, str]] = []
        for provider, connection_id, model in sorted(lockouts):
            entry = read.lockout(provider, connection_id, model)
            if entry is not None and entry.remaining_ms(now) > 0:
                upsert.append(entry.to_api(now))
            else:
                remove.append({"provider": provider, "connectionId": connection_id, "model": model})
        rows = []
        for connection_id in sorted(connections):
            with contextlib.suppress(KeyError):
                rows.append(read.connection_api(connection_id))
        return {
            "breakers": [b.to_api() for p in sorted(breakers) if (b := read.breaker(p, now)) is not None],
            "connections": rows,
            "lockouts": {"upsert": upsert, "remove": remove},
        }

    def snapshot_data(self) -> dict[str, Any]:
        """The whole read model now, as a `snapshot` message carries it."""
        read = self._read
        events = self._bus.after(0)[-SNAPSHOT_EVENTS:]
        # Built on the loop while every request waits (bench/tui.py (f)): nothing twice, and views
        # only of what is sent.
        health = read.health_api()
        data: dict[str, Any] = {
            "health": health,
            "connections": read.connections_api(),
            "lockouts": health["lockouts"],  # the same rows as the health document's
            "settings": self._settings_documents(),
            "events": [e.to_dict() for e in events],
        }
        if read.recording:
            data["requests"] = {
                "history": read.request_history,
                "alive": [r.to_api() for r in read.alive_requests()],
                "recent": [r.to_api() for r in read.requests(state="done", newest=SNAPSHOT_REQUESTS)],
            }
        return data

    # -- the request records ---------------------------------------------------------------------

    def _watch_requests(self) -> None:
        """A client attached or is sent a snapshot: follow the trail from now on (nothing is read
        while no client reads records)."""
        read = self._read
        if self._requests_due is not None or not read.recording:
            return
        if read.requests_version != self._requests_version:
            # Records moved while nobody listened, and no message said so: a client that comes
            # back from before now must start over.
            self._requests_gap = self._seq + 1
        self._requests_version = read.requests_version
        _, self._finished_mark = read.finished_requests(self._finished_mark, 0)
        _, self._alive_states = read.alive_changed({})
        self._requests_due = asyncio.get_running_loop().call_later(COALESCE_S, self._poll_requests)

    def _watch_counters(self) -> None:
        if self._counters_due is None and not self._closed:
            self._counters_due = asyncio.get_running_loop().call_later(COUNTERS_S, self._counters)

    def _counters(self) -> None:
        """The numbers that move without an event (requests, uptime, the lockout table), once a
        second while a client asks for them: cheaper than each polling the health document."""
        self._counters_due = None
        if self._closed or not any("counters" in c.kinds for c in self._clients):
            return
        self._publish("counters", self._read.counters_api)
        self._counters_due = asyncio.get_running_loop().call_later(COUNTERS_S, self._counters)

    def _watch_silences(self) -> None:
        if self._ping_due is None and not self._closed:
            self._ping_due = asyncio.get_running_loop().call_later(PING_S / PING_CHECKS, self._silences)

    def _silences(self) -> None:
        """Wake each client that has been sent nothing for PING_S: it owes its client a ping."""
        self._ping_due = None
        if self._closed or not self._clients:
            return
        self._checks += 1
        for client in self._clients:
            if self._checks - client.sent_at >= PING_CHECKS:
                client.ping_due = True
                client.wake.set()
        self._watch_silences()

    def _poll_requests(self) -> None:
        self._requests_due = None
        read = self._read
        if self._closed:
            return
        if not any("request" in c.kinds and not c.stale for c in self._clients):
            # Nobody reads them now (a client owed a snapshot is told all of it by that snapshot):
            # the next client to start reading compares the version this stopped at.
            return
        version = read.requests_version
        if version != self._requests_version:
            self._requests_version = version
            finished, self._finished_mark = read.finished_requests(self._finished_mark, REQUESTS_PER_TICK)
            changed, self._alive_states = read.alive_changed(self._alive_states)
            for view in changed:
                self._publish("request", view.to_api)
            for view in finished:
                self._publish("request", view.to_api)
        self._requests_due = asyncio.get_running_loop().call_later(COALESCE_S, self._poll_requests)

    def snapshot(self) -> Message:
        """A `snapshot` message, numbered with the last message it already accounts for.

        Clients that connect together (a restarted instance's consoles coming back, a fleet of
        `--follow` scripts) share one: it is reused while nothing happened and it is under
        `SNAPSHOT_REUSE_S` old (only its countdowns would differ)."""
        cached = self._snapshot
        now = time.monotonic()
        if cached is not None and cached[0].seq == self._seq and now - cached[1] < SNAPSHOT_REUSE_S:
            return cached[0]
        payload = self.snapshot_data()
        message = Message(self._seq, "snapshot", lambda: payload)
        self._snapshot = (message, now)
        return message

    # -- to a client -------------------------------------------------------------------------------

    def _missed(self, last_event_id: str | None) -> list[Message] | None:
        """What a client that last saw `last_event_id` missed; None when a snapshot must say it."""
        if not last_event_id:
            return None
        instance, _, seq_text = last_event_id.strip().partition("-")
        if (
            instance != self.instance
            or not (seq_text.isascii() and seq_text.isdecimal())
            or len(seq_text) > 18
        ):
            return None
        seq = int(seq_text)
        if seq > self._seq or seq < self._requests_gap:
            return None
        oldest = self._buffer[0].seq if self._buffer else self._seq + 1
        if seq + 1 < oldest:  # some of what it missed has left the buffer
            return None
        missed = [m for m in self._buffer if m.seq > seq] if seq < self._seq else []
        return missed if len(missed) <= CLIENT_QUEUE else None

    async def messages(
        self, last_event_id: str | None = None, kinds: frozenset[str] = KINDS
    ) -> AsyncIterator[bytes]:
        """One client's stream: what it missed (or a snapshot), then every message of `kinds` as
        it comes.

        Ends when the hub closes (the server is stopping); the caller cancels it when the client
        goes. Registration and the catch-up are computed in one step, so no message falls between."""
        client = _Client(kinds)
        if "request" in kinds:
            self._watch_requests()  # first: it may find that records moved while nobody listened
        missed = self._missed(last_event_id)
        if missed is None:
            client.stale = True
        else:
            client.queue.extend(m for m in missed if m.kind in kinds)
        client.sent_at = self._checks
        self._clients.add(client)
        self._watch_silences()
        if "counters" in kinds:
            self._watch_counters()
        instance = self.instance
        try:
            yield b"retry: 500\n\n"
            while not self._closed:
                if client.stale:
                    client.stale = False
                    client.queue.clear()
                    client.sent_at = self._checks
                    if "request" in kinds:
                        self._watch_requests()  # it reads records again from this snapshot on
                    yield self.snapshot().wire(instance)
                if client.queue:
                    # What is waiting goes out WRITE_BATCH messages a write (each write is a trip
                    # through the server's stack; a console under heavy traffic is sent some sixty
                    # messages a tick), and the loop serves the requests between two writes: the
                    # encoding is never one long stall on the request path.
                    queue, client.queue = client.queue, deque()
                    client.sent_at = self._checks
                    while queue:
                        batch = [queue.popleft() for _ in range(min(WRITE_BATCH, len(queue)))]
                        yield b"".join(m.wire(instance) for m in batch)
                        if queue:
                            await asyncio.sleep(0)
                if client.stale or self._closed or client.queue:
                    continue  # what came while this wrote goes first: a ping's id says it was sent
                if client.ping_due:
                    client.ping_due = False
                    client.sent_at = self._checks
                    yield b"id: %s-%d\nevent: ping\ndata: {}\n\n" % (instance.encode(), self._seq)
                    continue
                client.wake.clear()
                await client.wake.wait()
        finally:
            self._clients.discard(client)

    def close(self) -> None:
        """End every client's stream (the server is stopping: open streams must not hold it up)."""
        self._closed = True
        for due in (self._flush_due, self._requests_due, self._counters_due, self._ping_due):
            if due is not None:
                due.cancel()
        self._flush_due = self._requests_due = self._counters_due = self._ping_due = None
        self._unsubscribe()
        for client in self._clients:
            client.wake.set()
