"""The watch that ends a request's work when its client leaves (`Pipeline.while_connected`, in `proxy.pipeline._while_connected`).

Under uvicorn it waits on the server's own signal (`_ClientWatch`), under any other server it runs
`receive()` as a task: both must end the work when the client goes, and neither when it stays.
The integration tests (tests/integration/test_disconnect.py) leave at every await under uvicorn;
these pin the two ways down one by one.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from typing import Any

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from proxy.pipeline import _cycle_of, _read_body, _while_connected
from proxy.upstream import Deadlines
from tests.fakes import LiveServer

SCOPE: Scope = {"type": "http", "method": "POST", "path": "/", "headers": []}


async def _forever() -> Response:
    await asyncio.sleep(3600)
    raise AssertionError("not reached")


async def test_without_uvicorn_a_disconnect_ends_the_work_with_499() -> None:
    left = asyncio.Event()

    async def receive() -> Message:
        await left.wait()
        return {"type": "http.disconnect"}

    assert _cycle_of(receive) is None
    task = asyncio.ensure_future(_while_connected(receive, _forever()))
    await asyncio.sleep(0.01)
    assert not task.done()
    left.set()
    response = await asyncio.wait_for(task, 5)
    assert response.status_code == 499


async def test_without_uvicorn_another_message_ends_only_the_watch() -> None:
    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def work() -> Response:
        await asyncio.sleep(0.05)
        return Response(b"ok")

    response = await asyncio.wait_for(_while_connected(receive, work()), 5)
    assert response.status_code == 200


class _WatchedApp:
    """Reads the body, then waits forever under `_while_connected`; notes what it saw."""

    def __init__(self) -> None:
        self.uvicorn_cycle: list[bool] = []
        self.statuses: list[int] = []
        self.done = threading.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await _read_body(scope, receive, Deadlines(asyncio.get_running_loop()))
        self.uvicorn_cycle.append(_cycle_of(receive) is not None)
        quick = scope["path"] == "/quick"

        async def work() -> Response:
            if quick:
                return Response(b"ok")
            return await _forever()

        response = await _while_connected(receive, work())
        self.statuses.append(response.status_code)
        self.done.set()
        await response(scope, receive, send)


def _post(sock: socket.socket, path: str, body: bytes) -> None:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    sock.sendall(head.encode() + body)


def test_under_uvicorn_the_watch_uses_its_cycle_and_ends_the_work_when_the_client_goes() -> None:
    # A body past uvicorn's high-water mark (64 KiB) pauses reading: the watch must resume it, or
    # the client's going would not be seen.
    app = _WatchedApp()
    body = json.dumps({"pad": "x" * 300_000}).encode()
    with LiveServer(app, lifespan="off") as live:
        sock = socket.create_connection(("127.0.0.1", live.port), timeout=10)
        _post(sock, "/slow", body)
        sock.shutdown(socket.SHUT_WR)
        sock.close()
        assert app.done.wait(10), "the work did not end when the client went"
    assert app.uvicorn_cycle == [True]
    assert app.statuses == [499]


def test_under_uvicorn_a_client_that_stays_gets_its_answer_and_the_next_one_too() -> None:
    app = _WatchedApp()
    with (
        LiveServer(app, lifespan="off") as live,
        socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock,
    ):
        reader = sock.makefile("rb")
        for _ in range(2):
            _post(sock, "/quick", b"{}")
            status: Any = reader.readline().split()[1]
            assert status == b"200"
            while reader.readline() not in (b"\r\n", b""):
                pass
            assert reader.read(2) == b"ok"
    assert app.uvicorn_cycle == [True, True]
    assert app.statuses == [200, 200]
