"""The HTTP/1.1 connection the proxy serves clients on (proxy/protocol.py): a request's head is
bounded in size and in time, and what uvicorn cannot parse is answered in the proxy's JSON.

A real uvicorn server with the proxy's protocol, on loopback in the test's own loop, and raw
sockets as clients (no HTTP client sends a head of 70 KB, a malformed request line, or half a
head). The head clock is the server's sweep, run here by hand: no test waits 30 s."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from proxy.protocol import _HEAD_TICKS, HEAD_LIMIT, BoundedHttp, sweep_of
from tests.instances import serving


class Served:
    def __init__(self, server: uvicorn.Server, port: int, release: asyncio.Event) -> None:
        self.server = server
        self.port = port
        self.release = release
        """Set it to let the app's `/slow` requests answer."""

    def sweep(self, times: int = _HEAD_TICKS) -> None:
        sweep = sweep_of(self.server.server_state, asyncio.get_running_loop())
        for _ in range(times):
            sweep.run()

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    release = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        if scope["path"] == "/slow":
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http=BoundedHttp, log_level="warning", log_config=None, lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.005)  # polling uvicorn's own flag: it has no event to wait on
    try:
        yield Served(server, sock.getsockname()[1], release)
    finally:
        release.set()
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response off the wire: status, headers, body (by its content-length)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    line, *fields = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields if f)}
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 5)
    return int(line.split()[1]), headers, body


async def closed(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(), 5) == b""


def error(body: bytes) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(body)["error"]
    return found


GET = b"GET / HTTP/1.1\r\nHost: localhost\r\n"


async def test_a_head_past_the_limit_is_431_in_json_and_the_connection_closes(served: Served) -> None:
    reader, writer = await served.connect()
    writer.write(GET)
    for _ in range(HEAD_LIMIT // 1000 + 1):  # the head goes on and on, a line at a time
        writer.write(b"X-Pad: " + b"v" * 991 + b"\r\n")
    await writer.drain()
    status, headers, body = await answer(reader)
    assert (status, error(body)["code"]) == (431, "request_header_too_large")
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert len(headers["x-request-id"]) == 16
    assert await closed(reader)
    writer.close()


async def test_a_head_just_under_the_limit_with_its_body_in_the_same_read_is_served(served: Served) -> None:
    reader, writer = await served.connect()
    body = b"b" * (3 * HEAD_LIMIT)
    pad = HEAD_LIMIT - len(GET) - 200
    head = GET + b"X-Pad: " + b"v" * pad + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
    assert len(head) < HEAD_LIMIT < len(head + body)
    writer.write(head + body)  # one write: the head and far more than a head's worth of body
    await writer.drain()
    assert (await answer(reader))[0] == 200
    writer.write(GET + b"\r\n")  # and the connection's next head is counted from zero
    assert (await answer(reader))[0] == 200
    writer.close()


async def test_what_uvicorn_cannot_parse_is_a_json_400_with_a_request_id(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    reader, writer = await served.connect()
    writer.write(b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Bad: \x1b[31m\r\n\r\n")
    status, headers, body = await answer(reader)
    assert (status, error(body)["code"]) == (400, "invalid_http")
    assert headers["x-request-id"] and headers["content-type"] == "application/json"
    writer.write(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")  # no request, after that: nothing more
    assert await closed(reader)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    writer.close()


async def test_a_head_that_does_not_arrive_in_time_is_408_and_the_connection_closes(served: Served) -> None:
    reader, writer = await served.connect()
    writer.write(GET)  # ... and never the blank line
    await writer.drain()
    await asyncio.sleep(0.05)  # (the server reads it; nothing else to wait on)
    served.sweep(_HEAD_TICKS - 1)
    assert not reader.at_eof() and reader._buffer == b""  # type: ignore[attr-defined]  (not yet)
    served.sweep(1)
    status, _, body = await answer(reader)
    assert (status, error(body)["code"]) == (408, "request_timeout")
    assert await closed(reader)
    writer.close()


async def test_a_connection_that_sends_nothing_is_closed_without_a_word(served: Served) -> None:
    reader, writer = await served.connect()
    await asyncio.sleep(0.05)  # (the server accepts it)
    served.sweep()
    assert await closed(reader)
    writer.close()


async def test_requests_in_flight_and_kept_alive_connections_are_not_the_sweeps(served: Served) -> None:
    idle_reader, idle = await served.connect()
    idle.write(GET + b"\r\n")
    assert (await answer(idle_reader))[0] == 200  # now idle: uvicorn's keep-alive timer's to close
    slow_reader, slow = await served.connect()
    slow.write(b"GET /slow HTTP/1.1\r\nHost: localhost\r\n\r\n")
    await slow.drain()
    await asyncio.sleep(0.05)
    served.sweep(3 * _HEAD_TICKS)  # a minute and a half of sweeps
    served.release.set()
    assert (await answer(slow_reader))[0] == 200
    idle.write(GET + b"\r\n")
    assert (await answer(idle_reader))[0] == 200
    idle.close()
    slow.close()


def test_omniroute_serve_bounds_the_head_it_reads(tmp_path: Path) -> None:
    """The proxy's server is built with the bounded protocol (`make_server`), so `serve` and the
    console's hosted proxy refuse a header flood."""
    with (
        serving(tmp_path, tmp_path / "state.db") as running,
        socket.create_connection(("127.0.0.1", running.port), timeout=5) as sock,
    ):
        sock.sendall(GET + b"X-Pad: " + b"v" * (2 * HEAD_LIMIT) + b"\r\n\r\n")
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    assert got.startswith(b"HTTP/1.1 431 ") and b'"request_header_too_large"' in got
