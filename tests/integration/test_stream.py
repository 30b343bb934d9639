"""`GET /api/stream` over real HTTP: the snapshot, the changes as they happen, resuming with
`Last-Event-ID`, a client that never reads, and a server that stops under an open stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxy import stream
from proxy.resilience.clock import FakeClock
from proxy.resilience.events import Event
from proxy.sse import SSEParser
from tests.fakes import Reply
from tests.instances import serving
from tests.integration.test_proxy import Proxy, Upstream, provider, wait_until

STREAM = "/api/stream"


@dataclass(frozen=True)
class Message:
    id: str | None
    kind: str
    data: Any


class Listener:
    """Reads one stream on a thread, over a plain socket (closing it ends the read at once);
    `next()` hands its messages over in order."""

    def __init__(self, url: str, *, last_event_id: str | None = None, headers: dict[str, str] | None = None):
        host, port = url.removeprefix("http://").split(":")
        lines = [f"GET {STREAM} HTTP/1.1", f"Host: {host}:{port}"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        if last_event_id is not None:
            lines.append(f"Last-Event-ID: {last_event_id}")
        self._sock = socket.create_connection((host, int(port)), timeout=10)
        self._sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self._messages: queue.Queue[Message] = queue.Queue()
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "the stream did not answer"

    def _read(self) -> None:
        try:
            self._sock.settimeout(None)
            head, body = self._recv_head()
            status_line, *header_lines = head.decode("latin-1").split("\r\n")
            self.status = int(status_line.split()[1])
            self.headers = {
                k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)
            }
            self._ready.set()
            parser = SSEParser()
            for chunk in self._dechunk(body):
                for event in parser.feed(chunk):
                    self._messages.put(Message(event.id, event.event, json.loads(event.data)))
        except OSError:  # closed from the test's thread
            pass
        finally:
            self._ready.set()

    def _recv_head(self) -> tuple[bytes, bytes]:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise OSError("closed")
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        return head, rest

    def _dechunk(self, data: bytes) -> Iterator[bytes]:
        """The body of a chunked answer (the stream's), chunk by chunk, as it arrives."""
        while True:
            while b"\r\n" not in data:
                data += self._receive()
            size_line, _, data = data.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                return
            while len(data) < size + 2:
                data += self._receive()
            yield data[:size]
            data = data[size + 2 :]

    def _receive(self) -> bytes:
        chunk = self._sock.recv(65536)
        if not chunk:
            raise OSError("closed")
        return chunk

    def next(self, kind: str | None = None, timeout: float = 10.0) -> Message:
        """The next message (of `kind`, skipping others)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {kind or 'message'} within {timeout} s"
            try:
                message = self._messages.get(timeout=remaining)
            except queue.Empty:
                continue
            if kind is None or message.kind == kind:
                return message

    def until(self, kind: str, accept: Callable[[Any], bool], timeout: float = 10.0) -> Message:
        deadline = time.monotonic() + timeout
        while True:
            message = self.next(kind, timeout=max(0.01, deadline - time.monotonic()))
            if accept(message.data):
                return message

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(10)
        assert not self._thread.is_alive()


@pytest.fixture
def listen() -> Iterator[Callable[..., Listener]]:
    opened: list[Listener] = []

    def make(url: str, **kwargs: Any) -> Listener:
        listener = Listener(url, **kwargs)
        opened.append(listener)
        return listener

    yield make
    for listener in opened:
        listener.close()


def one_provider(launch: Callable[..., Proxy], up: Upstream, **kwargs: Any) -> Proxy:
    """A proxy whose clock stands still, so that a row streamed and a row read later are equal."""
    return launch(provider("loc", "local", up.url, "loc-1"), clock=FakeClock(), **kwargs)


def test_a_client_first_gets_the_whole_read_model(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], listen: Callable[..., Listener]
) -> None:
    proxy = one_provider(launch, upstreams())
    proxy.http.post("/api/resilience/reset", json={})  # an operator event for the snapshot to hold
    listener = listen(proxy.url)
    assert listener.status == 200
    assert listener.headers["content-type"].startswith("text/event-stream")
    snapshot = listener.next()
    assert snapshot.kind == "snapshot"
    data = snapshot.data
    assert data["health"] == proxy.http.get("/api/monitoring/health").json()
    assert data["connections"] == proxy.http.get("/api/resilience/connections").json()["connections"]
    assert data["lockouts"] == []
    assert data["settings"] == {
        "resilience": proxy.http.get("/api/resilience").json(),
        "settings": proxy.http.get("/api/settings").json(),
    }
    assert data["events"] == proxy.http.get("/api/events").json()["events"]
    assert data["events"][-1]["layer"] == "operator"
    assert snapshot.id == f"{proxy.rt.stream.instance}-{proxy.rt.stream._seq}"


def test_changes_arrive_as_events_then_as_the_changed_rows(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], listen: Callable[..., Listener]
) -> None:
    up = upstreams()
    proxy = one_provider(launch, up)
    listener = listen(proxy.url)
    listener.next("snapshot")
    up.fake.default(Reply("error", status=503))
    assert proxy.chat("loc/m1").status_code >= 400  # the upstream failed; the status is restated

    event = listener.until("event", lambda e: e["layer"] == "connection")
    assert (event.data["key"], event.data["to"]) == ("loc-1", "cooling")
    state = listener.until("state", lambda s: s["connections"])
    [row] = state.data["connections"]
    assert row == proxy.connection("loc-1")
    assert row["status"] == "cooling"
    assert state.data["lockouts"] == {"upsert": [], "remove": []}
    ids = [int(m.id.rsplit("-", 1)[1]) for m in (event, state) if m.id]
    assert ids == sorted(ids) and len(set(ids)) == 2

    reset = proxy.http.post("/api/resilience/connections/loc-1/reset")
    assert reset.status_code == 200
    state = listener.until("state", lambda s: s["connections"] and s["connections"][0]["status"] == "active")
    assert state.data["connections"] == [proxy.connection("loc-1")]


def test_a_lockout_arrives_as_an_upsert_and_leaves_as_a_removal(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], listen: Callable[..., Listener]
) -> None:
    up = upstreams()
    proxy = one_provider(launch, up, settings={"modelLockout": {"enabled": True}})
    up.fake.by_model("llama3:8b", Reply("error", status=404))
    listener = listen(proxy.url)
    listener.next("snapshot")
    proxy.chat("loc/llama3:8b")
    state = listener.until("state", lambda s: s["lockouts"]["upsert"])
    [lock] = state.data["lockouts"]["upsert"]
    assert lock == proxy.lockouts()[0]
    assert (lock["connectionId"], lock["model"]) == ("loc-1", "llama3:8b")  # a ":" in the model kept whole

    removed = proxy.http.request("DELETE", "/api/resilience/model-cooldowns", json={"all": True})
    assert removed.status_code == 200
    state = listener.until("state", lambda s: s["lockouts"]["remove"])
    assert state.data["lockouts"] == {
        "upsert": [],
        "remove": [{"provider": "loc", "connectionId": "loc-1", "model": "llama3:8b"}],
    }


def test_a_settings_change_streams_both_documents(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], listen: Callable[..., Listener]
) -> None:
    proxy = one_provider(launch, upstreams())
    listener = listen(proxy.url)
    listener.next("snapshot")
    assert proxy.http.patch("/api/settings", json={"modelLockout": {"enabled": True}}).status_code == 200
    message = listener.next("settings")
    assert message.data["settings"]["modelLockout"]["enabled"] is True
    assert message.data["resilience"] == proxy.http.get("/api/resilience").json()


def test_a_client_that_comes_back_gets_what_it_missed_or_a_snapshot(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], listen: Callable[..., Listener]
) -> None:
    proxy = one_provider(launch, upstreams())
    first = listen(proxy.url)
    seen = first.next("snapshot").id
    first.close()
    for _ in range(3):
        assert proxy.http.post("/api/resilience/reset", json={}).status_code == 200

    resumed = listen(proxy.url, last_event_id=seen)
    missed = [resumed.next() for _ in range(3)]
    assert [m.kind for m in missed] == ["event"] * 3  # no snapshot: what it missed, in order
    assert [m.data["layer"] for m in missed] == ["operator"] * 3
    assert [int(m.id.rsplit("-", 1)[1]) for m in missed if m.id] == [
        int(seen.rsplit("-", 1)[1]) + n for n in (1, 2, 3)
    ]

    # Another instance's id (the server restarted), a garbled one, one from the future: a snapshot.
    instance = proxy.rt.stream.instance
    for stale in ("0badf00d-1", "garbage", f"{instance}-99999", f"{instance}-{'9' * 5000}"):
        assert listen(proxy.url, last_event_id=stale).next().kind == "snapshot"


def test_a_client_whose_missed_messages_left_the_buffer_starts_over(
    launch: Callable[..., Proxy],
    upstreams: Callable[..., Upstream],
    listen: Callable[..., Listener],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stream, "BUFFER", 4)
    proxy = one_provider(launch, upstreams())
    first = listen(proxy.url)
    seen = first.next("snapshot").id
    first.close()
    for _ in range(6):
        assert proxy.http.post("/api/resilience/reset", json={}).status_code == 200
    again = listen(proxy.url, last_event_id=seen)
    snapshot = again.next()
    assert snapshot.kind == "snapshot"
    assert snapshot.id == proxy.rt.stream.last_id


def flood(proxy: Proxy, batches: int, size: int) -> tuple[int, bool]:
    """`batches` of `size` operator events of 2 KB each, published on the server's own loop (as the
    engine would), letting the loop run between batches; returns the longest queue any stream client
    had after a batch, and whether any was owed a snapshot."""
    server = proxy.server
    assert server is not None and server._loop is not None
    hub = proxy.rt.stream

    async def publish() -> tuple[int, bool]:
        longest, owed = 0, False
        for batch in range(batches):
            for n in range(size):
                proxy.rt.bus.publish(Event(0.0, "operator", "tui", "", f"flood {batch}.{n}", "x" * 2000))
            longest = max([longest, *(len(c.queue) for c in hub._clients)])
            owed = owed or any(c.stale for c in hub._clients)
            await asyncio.sleep(0.01)  # the stream's writer gets its turn: it writes until it blocks
        return longest, owed

    return asyncio.run_coroutine_threadsafe(publish(), server._loop).result(60)


def test_a_client_that_never_reads_never_slows_the_proxy(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    proxy = one_provider(launch, upstreams())
    host, port = proxy.url.removeprefix("http://").split(":")
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once, then never drains
    stalled.connect((host, int(port)))
    stalled.sendall(f"GET {STREAM} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    hub = proxy.rt.stream
    try:
        wait_until(lambda: hub.clients == 1, what="the stream to open")
        [client] = hub._clients
        wait_until(lambda: not client.stale, what="the first snapshot to be sent")
        published = 10 * stream.CLIENT_QUEUE
        longest, owed = flood(proxy, 10, stream.CLIENT_QUEUE)
        assert longest <= stream.CLIENT_QUEUE  # what it may hold, however long it sleeps
        assert owed  # the rest is said by a snapshot, not kept

        started = time.monotonic()
        assert proxy.chat("loc/m1").status_code == 200
        assert time.monotonic() - started < 2.0  # the proxy answers while the client sleeps

        # The client reads at last: what the sockets held, then the snapshot it was owed.
        stalled.settimeout(10)
        received = b""
        while received.count(b"event: snapshot") < 2:
            chunk = stalled.recv(1 << 16)
            assert chunk, "the stream ended"
            received += chunk
        assert received.count(b"event: event") < published
    finally:
        stalled.close()
    wait_until(lambda: hub.clients == 0, what="the stalled client to be let go")


def test_the_stream_is_guarded_like_the_rest_of_the_api(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], listen: Callable[..., Listener]
) -> None:
    up = upstreams()
    proxy = launch(
        '[server]\nmanagement_token = "tok-stream-1234567890"\n\n' + provider("loc", "local", up.url, "loc-1")
    )
    assert listen(proxy.url).status == 401
    assert listen(proxy.url, headers={"Origin": "https://evil.example"}).status in (401, 403)
    allowed = listen(proxy.url, headers={"Authorization": "Bearer tok-stream-1234567890"})
    assert allowed.status == 200
    assert allowed.next().kind == "snapshot"


@contextmanager
def attached(url: str) -> Iterator[Listener]:
    listener = Listener(url)
    try:
        yield listener
    finally:
        listener.close()


def test_a_server_that_stops_ends_its_streams_at_once(tmp_path: Path) -> None:
    """`omniroute serve` with a console attached stops as fast as without one (it used to wait
    out the grace period for the stream, which never ends by itself)."""
    with serving(tmp_path, tmp_path / "state.db") as server, attached(server.url) as listener:
        assert listener.next().kind == "snapshot"
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail("serve did not stop")
        assert server.proc.returncode == 0
        assert time.monotonic() - started < 2.0, server.log.read_text()


def test_clients_that_come_together_share_one_snapshot(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted instance's consoles, or a fleet of --follow scripts, connect at once: the
    snapshot (the whole model, encoded) is built once for them, and anew once anything happened."""
    proxy = one_provider(launch, upstreams())
    hub = proxy.rt.stream
    built: list[int] = []
    real = hub.snapshot_data

    def counted() -> dict[str, Any]:
        built.append(1)
        return real()

    monkeypatch.setattr(hub, "snapshot_data", counted)
    first = hub.snapshot()
    assert hub.snapshot() is first and len(built) == 1
    assert proxy.http.post("/api/resilience/reset", json={}).status_code == 200
    later = hub.snapshot()
    assert later is not first and later.seq > first.seq and len(built) == 2


def test_request_records_stream_as_they_change(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], listen: Callable[..., Listener]
) -> None:
    up = upstreams()
    proxy = one_provider(launch, up)
    listener = listen(proxy.url)
    assert listener.next("snapshot").data["requests"] == {
        "history": proxy.rt.read.request_history,
        "alive": [],
        "recent": [],
    }
    assert proxy.chat("loc/m1").status_code == 200
    ended = listener.until("request", lambda r: r["state"] == "done")
    [record] = proxy.http.get("/api/requests").json()["requests"]
    assert ended.data == record  # the API's own shape
    assert ended.data["status"] == 200 and ended.data["modelAsked"] == "loc/m1"

    # A client connecting later finds it among the recent records of its snapshot.
    assert listen(proxy.url).next("snapshot").data["requests"]["recent"] == [record]


def test_records_that_moved_while_nobody_listened_start_a_returning_client_over(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], listen: Callable[..., Listener]
) -> None:
    """Records are read from the trail only while a client is attached: one that comes back after
    a request nobody streamed cannot be given what it missed, so it is given a snapshot."""
    up = upstreams()
    proxy = one_provider(launch, up)
    first = listen(proxy.url)
    seen = first.next("snapshot").id
    first.close()
    hub = proxy.rt.stream
    wait_until(lambda: hub.clients == 0 and hub._requests_due is None, what="the trail to be let go")
    assert proxy.chat("loc/m1").status_code == 200
    assert listen(proxy.url, last_event_id=seen).next().kind == "snapshot"


def test_a_client_names_the_kinds_it_wants_and_a_bad_name_is_a_400(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], listen: Callable[..., Listener]
) -> None:
    proxy = one_provider(launch, upstreams())
    bad = proxy.http.get(STREAM, params={"kinds": "event,<b>gossip</b>"})
    assert bad.status_code == 400
    assert bad.json()["error"]["fields"][0]["field"] == "kinds"
    assert proxy.rt.stream.clients == 0
