"""A stream's events are relayed as they come, and a burst in few reads (`UpstreamResponse.chunks`).

Each read and write costs the proxy tens of microseconds of CPU however little it carries. An
upstream that sends its events as fast as it can was relayed an event or two per read, and on a
workstation that CPU comes out of the cores the model's own server runs on. These tests read a
real HTTP stream from a raw socket server whose writes are spaced by real time: a burst arrives
in few reads, and events a token apart are each handed on alone; and, through a real proxy, a
burst that breaks off or a client that leaves in the middle of one ends as any stream does.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from proxy.upstream import BURST_GAP_S, UpstreamClient
from tests.fakes import Reply
from tests.integration.test_proxy import (
    CHAT_PATH,
    Proxy,
    Upstream,
    chat,
    provider,
    sse_events,
    streamed_text,
    wait_until,
)

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def frame(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


@contextmanager
def spaced_stream(events: int, gap_s: float) -> Iterator[str]:
    """A server answering one request with `events` SSE events, each its own write (TCP_NODELAY:
    its own segment), `gap_s` apart; its URL."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.recv(65536)  # the request (small: one read)
            conn.sendall(HEAD)
            for i in range(events):
                conn.sendall(frame(b'data: {"i":%d}\n\n' % i))
                time.sleep(gap_s)
            conn.sendall(frame(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            conn.recv(1)  # until the client closes

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1/chat/completions"
    finally:
        server.close()
        thread.join(5)


async def read_all(url: str) -> list[bytes]:
    client = UpstreamClient()
    try:
        response = await client.send("POST", url, body=b"{}", api_key=None)
        chunks = [chunk async for chunk in response.chunks()]
        response.close()
        return chunks
    finally:
        await client.close()


async def test_a_burst_is_read_in_few_chunks_and_none_is_lost() -> None:
    # 200 events 0.2 ms apart: at least 40 ms of burst. One read per event would be 200 chunks;
    # gathered for BURST_GAP_S at a time, it is at most one chunk per BURST_GAP_S.
    with spaced_stream(200, 0.0002) as url:
        started = time.perf_counter()
        chunks = await read_all(url)
        took = time.perf_counter() - started
    body = b"".join(chunks)
    assert body.count(b"\n\n") == 201  # every event, and [DONE]
    assert [json.loads(line[6:])["i"] for line in body.split(b"\n\n")[:-2]] == list(range(200))
    windows = took / BURST_GAP_S
    assert len(chunks) <= windows + 10, f"{len(chunks)} chunks in {took * 1000:.0f} ms"


async def test_events_a_token_apart_are_each_handed_on_alone() -> None:
    # A token stream (events 30 ms apart) never waits to be gathered: each event is its own chunk,
    # handed on when it arrives. (A stall of 30 ms on a loaded machine may merge two: hence >= 5.)
    with spaced_stream(6, 0.03) as url:
        chunks = await read_all(url)
    assert b"".join(chunks).count(b"\n\n") == 7
    assert len(chunks) >= 5


# -- through a real proxy: a burst that breaks off, a client that leaves in the middle of one ----------


def _solo(up: Upstream) -> str:
    return provider("loc", "local", up.url, "loc-1")


def test_a_burst_that_breaks_off_is_relayed_whole_then_ends_with_the_error_event(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    up.fake.default(Reply("stream_die", die_after=400, chunk_text="ok", delay_ms=0))
    proxy = launch(_solo(up))
    with proxy.http.stream("POST", CHAT_PATH, json=chat("loc/m1", stream=True)) as response:
        body = response.read().decode()
    events = sse_events(body)
    assert streamed_text(events) == "ok" * 400  # nothing lost to the gathering
    assert events[-2]["error"]["code"] == "stream_interrupted"
    assert events[-1] == "[DONE]"
    proxy.settled()


def test_a_client_that_leaves_in_a_burst_frees_everything_and_the_next_stream_flows(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """The relay pauses the upstream's socket in a burst: a client leaving then must still close
    the upstream call, count against nothing, and leave no paused connection for the next request."""
    up = upstreams()
    up.fake.default(Reply("stream", chunks=1_000_000, chunk_text="ok", delay_ms=0))  # a burst with no end
    proxy = launch(_solo(up))
    host, port = proxy.url.removeprefix("http://").split(":")
    body = json.dumps(chat("loc/m1", stream=True)).encode()
    for _ in range(3):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(
                (
                    f"POST {CHAT_PATH} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n"
                ).encode()
                + body
            )
            received = 0
            while received < 200_000:  # well into the burst
                chunk = sock.recv(65536)
                assert chunk, "the stream ended before the client left"
                received += len(chunk)
        wait_until(lambda: up.fake.in_flight == 0, what="the upstream call to be closed")
        proxy.settled()
    assert proxy.breaker("loc")["failureCount"] == 0
    assert proxy.connection("loc-1")["status"] == "active"
    up.fake.default(Reply("stream", chunks=300, chunk_text="ok", delay_ms=0))
    with proxy.http.stream("POST", CHAT_PATH, json=chat("loc/m1", stream=True)) as response:
        assert streamed_text(sse_events(response.read().decode())) == "ok" * 300
    proxy.settled()
