"""A client that hangs up while sending its request body is not a server error (found by the soak).

`omniroute serve` logged such a request as "unhandled error" with a traceback (and answered 500 to
nobody): Starlette raises ClientDisconnect from the body stream, and nothing told it apart from a
bug. The operator's log and the console's Events tab must keep ERROR for real failures.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.app import create_app
from proxy.config import load_config
from proxy.runtime import Runtime
from tests.fakes import FakeUpstream, LiveServer
from tests.two_providers import config_text


class _Finished:
    """Wraps the app and counts the requests it has finished handling (whatever the outcome)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.count = 0
        self.lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            if scope["type"] == "http":
                with self.lock:
                    self.count += 1


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[LiveServer, _Finished]]:
    path = tmp_path / "config.toml"
    path.write_text(config_text(FakeUpstream.refused_url(), FakeUpstream.refused_url(), None))
    path.chmod(0o600)
    runtime = Runtime.open(load_config(path, {}, explicit=True), tmp_path / "state.db", env={})
    app = _Finished(create_app(runtime))
    with LiveServer(app, lifespan="on") as live:
        yield live, app


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/resilience"])
def test_a_client_gone_mid_body_is_not_logged_as_an_error(
    server: tuple[LiveServer, _Finished], path: str, caplog: pytest.LogCaptureFixture
) -> None:
    live, app = server
    method = "PATCH" if path.startswith("/api/") else "POST"
    with socket.create_connection(("127.0.0.1", live.port)) as sock:
        sock.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            'Content-Length: 1000\r\n\r\n{"model": '.encode()
        )
    deadline = time.monotonic() + 5
    while app.count < 1:  # the handler has seen the disconnect and returned
        assert time.monotonic() < deadline, "the request never finished"
        time.sleep(0.01)

    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
