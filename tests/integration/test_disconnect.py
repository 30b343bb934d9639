"""A client that goes away costs nothing more (issue #10).

Requests are sent on raw sockets and the sockets closed while the requests wait: for a concurrency
slot, in the request queue, out a cooldown, or for a non-streamed upstream answer. Every wait ends
at once, nothing waiting is sent upstream afterwards, the upstream calls in flight are cancelled
(the fake upstream sees its clients go), every slot comes back, and no layer counts anything
against the upstream: a disconnect is nobody's failure.

The engine runs on a FakeClock that the tests never advance, so no wait could end by itself: only
the disconnect can end them (the semaphore's fail-open timeout, say, never fires).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from prometheus_client.parser import text_string_to_metric_families

from omniroute_tui.snapshot import connection_row
from proxy import pipeline
from proxy.resilience.clock import FakeClock
from proxy.resilience.semaphore import ConnectionSemaphore
from tests.fakes import Reply
from tests.integration.test_proxy import CHAT_PATH, Proxy, Upstream, chat, provider, wait_until


@contextmanager
def clients(proxy: Proxy, count: int, model: str) -> Iterator[list[socket.socket]]:
    """`count` chat requests, each on its own connection and marked with its index in `user`;
    every socket still open is closed on leaving."""
    host, port = proxy.url.removeprefix("http://").split(":")
    socks = [socket.create_connection((host, int(port)), timeout=10) for _ in range(count)]
    try:
        for index, sock in enumerate(socks):
            body = json.dumps(chat(model, user=f"client-{index}")).encode()
            sock.sendall(
                (
                    f"POST {CHAT_PATH} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n"
                ).encode()
                + body
            )
        yield socks
    finally:
        for sock in socks:
            sock.close()


def close_the_unsent(socks: list[socket.socket], up: Upstream) -> None:
    """Close the clients whose requests the upstream has not seen, before any of those it has.

    The sockets of one test close one after another, not at one instant: were an answered client
    to go first, its slot would pass to a waiter whose client is still there (its close not yet
    read), and that waiter is rightly sent. Closing the waiting ones first makes "nothing waiting
    is sent upstream afterwards" a question with one right answer."""
    sent = {json.loads(call.body)["user"] for call in up.calls()}
    for index, sock in enumerate(socks):
        if f"client-{index}" not in sent:
            sock.close()


def nothing_counted(proxy: Proxy, provider_id: str, connection_id: str) -> None:
    assert proxy.breaker(provider_id)["failureCount"] == 0
    connection = proxy.connection(connection_id)
    assert (connection["status"], connection["lastError"], connection["inFlight"]) == ("active", None, 0)


def hanging_and_capped_at_8(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> tuple[Proxy, Upstream, ConnectionSemaphore | None]:
    """A local provider whose one connection, `loc-1`, takes 8 requests at a time, in front of an
    upstream that never answers; the engine on a clock nobody advances. Returns the slot too."""
    up = upstreams()
    up.fake.default(Reply("hang"))
    config = (
        f'[providers.loc]\nclass = "local"\nbase_url = "{up.url}"\n\n'
        '[[providers.loc.connections]]\nid = "loc-1"\nmax_concurrent = 8\n'
    )
    proxy = launch(config, clock=FakeClock())
    return proxy, up, proxy.rt.engine.connections["loc-1"].semaphore


def test_gone_clients_leave_the_semaphore_and_the_upstream_at_once(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """24 requests on a `max_concurrent = 8` connection whose upstream never answers: 8 are sent,
    16 wait for a slot. The clients go: the 8 upstream calls are cancelled and the 16 never sent
    (they used to wait out the 30 s slot timeout, then go upstream anyway, fail-open)."""
    proxy, up, semaphore = hanging_and_capped_at_8(launch, upstreams)
    assert semaphore is not None and semaphore.limit == 8
    with clients(proxy, 24, "loc/m1") as socks:
        wait_until(lambda: up.fake.in_flight == 8 and semaphore.waiting == 16, what="8 sent and 16 waiting")
        close_the_unsent(socks, up)
        wait_until(lambda: semaphore.waiting == 0, what="the 16 waiting to withdraw")
        assert len(up.calls()) == 8
    wait_until(lambda: up.fake.in_flight == 0, what="the upstream calls to be cancelled")
    proxy.settled()
    assert (semaphore.in_use, semaphore.waiting) == (0, 0)
    assert len(up.calls()) == 8
    nothing_counted(proxy, "loc", "loc-1")


def test_gone_clients_leave_the_request_queue_at_once(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    up.fake.default(Reply("hang"))
    proxy = launch(
        provider("cloud", "apikey", up.url, "key-a"),
        settings={"requestQueue": {"concurrentRequests": 2}},
        clock=FakeClock(),
    )
    limiter = proxy.rt.engine.connections["key-a"].limiter
    with clients(proxy, 6, "cloud/m1") as socks:
        wait_until(lambda: up.fake.in_flight == 2, what="2 sent")
        limiter = proxy.rt.engine.connections["key-a"].limiter
        assert limiter is not None
        wait_until(lambda: limiter is not None and limiter.queued == 4, what="4 queued")
        close_the_unsent(socks, up)
        wait_until(lambda: limiter is not None and limiter.queued == 0, what="the 4 queued to withdraw")
        assert len(up.calls()) == 2
    wait_until(lambda: up.fake.in_flight == 0, what="the upstream calls to be cancelled")
    proxy.settled()
    assert limiter is not None and (limiter.queued, limiter.running) == (0, 0)
    assert len(up.calls()) == 2
    nothing_counted(proxy, "cloud", "key-a")


def test_a_gone_client_stops_waiting_out_a_cooldown_at_once(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    clock = FakeClock()
    proxy = launch(
        provider("loc", "local", up.url, "loc-1"),
        settings={"comboCooldownWait": {"enabled": True}},
        clock=clock,
    )
    engine = proxy.rt.engine
    conn = engine.connections["loc-1"]
    conn.health.record_failure(
        clock.now(),
        engine.settings.cooldown_policy("local"),
        error="503",
        error_type="server_error",
        code=503,
    )
    with clients(proxy, 3, "loc/m1"):
        wait_until(lambda: proxy.rt.pipeline.waiting == 3, what="3 requests waiting out the cooldown")
    wait_until(lambda: proxy.rt.pipeline.waiting == 0, what="the waits to end")
    proxy.settled()
    assert up.calls() == []


def test_requests_waiting_for_a_slot_read_as_waiting_not_in_flight(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """Twenty-four requests to a connection capped at 8: 8 are sent, 16 wait for a slot. The API,
    the metrics and the console say 8 in flight of 8 and 16 waiting (they said 24 in flight of 8,
    which reads as a cap that does not hold)."""
    proxy, up, semaphore = hanging_and_capped_at_8(launch, upstreams)
    assert semaphore is not None
    with clients(proxy, 24, "loc/m1"):
        wait_until(lambda: up.fake.in_flight == 8 and semaphore.waiting == 16, what="8 sent and 16 waiting")
        assert proxy.connection("loc-1")["inFlight"] == 8
        assert (
            proxy.http.get("/api/monitoring/health").json()["requests"]["inFlight"] == 24
        )  # the clients' requests: all of them wait
        samples = {
            (s.name, tuple(s.labels.values())): s.value
            for family in text_string_to_metric_families(proxy.http.get("/metrics").text)
            for s in family.samples
        }
        assert samples[("omniroute_in_flight", ("loc",))] == 8
        assert samples[("omniroute_queue_depth", ("loc-1",))] == 16
        view = proxy.rt.read.connection("loc-1", 0.0)
        assert view is not None
        assert "8 / 8" in connection_row(view).cells  # the console's Connections row
        assert view.queued == 16


def capped_key(url: str) -> str:
    """An API-key provider whose one connection, `cloud-1`, takes 2 requests at a time."""
    return provider("cloud", "apikey", url, "cloud-1").replace(
        "priority = 1", "priority = 1\nmax_concurrent = 2"
    )


def test_a_request_queue_and_a_slot_count_each_waiting_request_once(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """A key with a request queue (2 at a time) and a slot cap of 2: of 6 requests, 2 are sent and
    4 wait (in the queue, and some for a slot as well): 4 waiting, not 4 plus those in both."""
    up = upstreams()
    up.fake.default(Reply("hang"))
    proxy = launch(
        capped_key(up.url),
        settings={"requestQueue": {"concurrentRequests": 2}},
    )
    conn = proxy.rt.engine.connections["cloud-1"]
    assert conn.semaphore is not None
    with clients(proxy, 6, "cloud/m1"):
        wait_until(lambda: up.fake.in_flight == 2 and conn.in_flight == 6, what="2 sent, 6 selected")
        assert conn.limiter is not None and conn.semaphore.waiting > 0  # (the limiter: made on first use)
        connection = proxy.connection("cloud-1")
        assert connection["inFlight"] == 2
        view = proxy.rt.read.connection("cloud-1", 0.0)
        assert view is not None
        assert (view.in_flight, view.queued) == (2, 4)


def test_slot_waiters_count_as_waiting_after_the_request_queue_is_turned_off(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """The key's request queue served a request, then the operator turned request queues off: the
    queue stays behind, empty, and the slot's 4 waiters must still read as waiting."""
    up = upstreams()
    proxy = launch(
        capped_key(up.url),
        settings={"requestQueue": {"concurrentRequests": 2}},
    )
    assert proxy.chat("cloud/m1").status_code == 200
    conn = proxy.rt.engine.connections["cloud-1"]
    assert conn.limiter is not None and conn.semaphore is not None
    patched = proxy.http.patch("/api/resilience", json={"requestQueue": {"autoEnableApiKeyProviders": False}})
    assert patched.status_code == 200, patched.text
    up.fake.default(Reply("hang"))
    with clients(proxy, 6, "cloud/m1"):
        wait_until(lambda: up.fake.in_flight == 2 and conn.semaphore.waiting == 4, what="2 sent, 4 waiting")
        assert conn.limiter.queued == 0
        assert proxy.connection("cloud-1")["inFlight"] == 2


def _start(proxy: Proxy, body: bytes, length: int, path: str = CHAT_PATH) -> socket.socket:
    """A request whose headers promise `length` bytes of body, of which only `body` is sent."""
    host, port = proxy.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n".encode()
        + body
    )
    return sock


def _answer(sock: socket.socket) -> tuple[str, dict[str, str], bytes]:
    """The whole HTTP answer on `sock`, read until the server closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return status, headers, body


@pytest.mark.parametrize("sent", [b"", b'{"model": "loc/m1", "mess'])
def test_a_body_that_stops_arriving_is_answered_408_and_ends_its_record(
    launch: Callable[..., Proxy],
    upstreams: Callable[..., Upstream],
    monkeypatch: pytest.MonkeyPatch,
    sent: bytes,
) -> None:
    """A client sends its headers (and maybe part of its body), then nothing: the request is
    answered 408 once the body has stopped for the idle limit, the connection is closed, and the
    request leaves the trail's alive list (it stayed `queued` there for as long as the client
    held the socket). Nothing reached the upstream or counted against it."""
    monkeypatch.setattr(pipeline, "BODY_IDLE_TIMEOUT_S", 0.5)
    up = upstreams()
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    sock = _start(proxy, sent, 200)
    try:
        status, headers, body = _answer(sock)  # the server closes: the read ends
    finally:
        sock.close()
    assert status.split()[1] == "408", status
    assert headers.get("connection") == "close"
    assert json.loads(body)["error"]["code"] == "request_timeout"
    alive = proxy.http.get("/api/requests").json()
    assert [r for r in alive["requests"] if r["state"] in ("queued", "waiting", "slot", "upstream")] == []
    assert up.calls() == []
    nothing_counted(proxy, "loc", "loc-1")


def test_a_body_sent_slowly_but_steadily_is_read_whole(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit is on a silence, not on the whole body: a body that keeps coming, each part
    well within the limit, is read whole however long it takes in all."""
    monkeypatch.setattr(pipeline, "BODY_IDLE_TIMEOUT_S", 1.0)
    up = upstreams()
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    body = json.dumps(chat("loc/m1")).encode()
    parts = [body[i : i + 8] for i in range(0, len(body), 8)][:6]
    sock = _start(proxy, b"", len(body))
    try:
        for part in parts:
            time.sleep(0.3)  # the server's own clock is the subject: its silence limit is 1 s
            sock.sendall(part)
        sock.sendall(body[sum(map(len, parts)) :])
        sock.settimeout(10)
        head = sock.recv(65536)
    finally:
        sock.close()
    assert head.startswith(b"HTTP/1.1 200"), head[:80]
    assert len(up.calls()) == 1
