"""Run an ASGI app on a real uvicorn server, on 127.0.0.1 and an ephemeral port, in a background thread.

The server thread owns its own event loop, so the same `LiveServer` works from sync tests and from
async tests (whose loop it never touches). The port is known before the thread starts because we
bind the listening socket ourselves and hand it to uvicorn.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Literal, cast

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["TRANSPORT_SCOPE_KEY", "LiveServer", "serve"]

LifespanMode = Literal["auto", "on", "off"]

# Scope key under which each request carries its connection's asyncio transport. ASGI has no way to
# drop a connection without a response; fakes that simulate resets or dying streams need the socket.
TRANSPORT_SCOPE_KEY = "tests.fakes.transport"

_START_TIMEOUT = 10.0


class _TransportInScope(HttpToolsProtocol):
    """uvicorn's HTTP protocol, plus the raw transport in every request scope (see TRANSPORT_SCOPE_KEY)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        inner = cast(ASGIApp, self.app)

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            scope[TRANSPORT_SCOPE_KEY] = self.transport
            await inner(scope, receive, send)

        self.app = app


class LiveServer:
    """A real uvicorn server for `app`; `start()` returns once it accepts connections.

    `stop()` is graceful first (uvicorn finishes in-flight responses), then aborts connections whose
    responses never end (a fake that hangs), then forces the loop down; it always joins the thread.
    """

    def __init__(self, app: ASGIApp, *, lifespan: LifespanMode = "auto") -> None:
        # log_config=None: leave logging alone so uvicorn's records reach pytest's log capture.
        self._config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            log_level="warning",
            log_config=None,
            lifespan=lifespan,
            http=_TransportInScope,
        )
        self._server = uvicorn.Server(self._config)
        self._sock: socket.socket | None = None
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("LiveServer is not started")
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LiveServer:
        if self._thread is not None:
            raise RuntimeError("LiveServer already started")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self._sock = sock
        self._port = sock.getsockname()[1]
        self._thread = threading.Thread(target=self._run, name=f"LiveServer:{self._port}", daemon=True)
        self._thread.start()

        deadline = time.monotonic() + _START_TIMEOUT
        while not self._server.started:
            if not self._thread.is_alive():
                error = self._error
                self.stop()
                raise RuntimeError(f"LiveServer failed to start: {error!r}") from error
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"LiveServer did not start within {_START_TIMEOUT}s")
            time.sleep(0.005)
        return self

    def stop(self, *, grace: float = 1.0) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._server.should_exit = True
            thread.join(grace)
            if thread.is_alive():
                self._abort_connections()
                thread.join(grace)
            if thread.is_alive():
                self._server.force_exit = True
                thread.join(_START_TIMEOUT)
        if self._sock is not None:
            self._sock.close()  # uvicorn closes it on shutdown, but not when startup failed
        if thread is not None and thread.is_alive():
            raise RuntimeError("LiveServer thread did not stop")
        error, self._error = self._error, None
        if error is not None and not isinstance(error, SystemExit):
            raise RuntimeError("LiveServer crashed") from error

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            with asyncio.Runner(loop_factory=self._config.get_loop_factory()) as runner:
                runner.run(self._serve())
        except BaseException as exc:  # startup failure arrives as SystemExit: report it, not the thread hook
            self._error = exc

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        assert self._sock is not None
        await self._server.serve(sockets=[self._sock])

    def _abort_connections(self) -> None:
        loop = self._loop
        if loop is None:
            return

        def abort_all() -> None:
            for connection in list(self._server.server_state.connections):
                connection.transport.abort()

        with contextlib.suppress(RuntimeError):  # the loop closed in the meantime: nothing left to abort
            loop.call_soon_threadsafe(abort_all)


@contextlib.contextmanager
def serve(app: ASGIApp, *, lifespan: LifespanMode = "auto") -> Iterator[LiveServer]:
    """A started LiveServer for the `with` block; in a fixture: `with serve(app) as server: yield server`."""
    with LiveServer(app, lifespan=lifespan) as server:
        yield server
