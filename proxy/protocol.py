"""The HTTP/1.1 connection each client is served on: uvicorn's httptools protocol, with the limits
it lacks on a request's head.

uvicorn reads a request's head (its request line and headers) for as long and as large as a client
sends it: one client's 500 MB of headers became 500 MB of the proxy's memory, kept after, and a
connection that never finished its head (or sent nothing at all) held its file descriptor for
ever, so that a few thousand of them left none for the agents. Here:

- a head is at most HEAD_LIMIT bytes: past it, `431` and the connection closes;
- a head arrives within HEAD_TIMEOUT_S of the connection (or, on a kept-alive connection, of its
  first byte): after, `408` and the connection closes, or just the close when nothing came at all
  (as uvicorn closes a kept-alive connection that stays idle);
- a request uvicorn cannot parse is answered in the proxy's JSON with an `X-Request-Id`, as every
  other answer is, not in uvicorn's plain text.

The request path pays one check per read of the socket, and no timer per request: a sweep every
SWEEP_S ticks a counter, a connection notes the tick its head began at, and the sweep closes those
whose head began HEAD_TIMEOUT_S ago and is not complete (so a head gets between HEAD_TIMEOUT_S -
SWEEP_S and HEAD_TIMEOUT_S).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any, Final

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from proxy.guard import new_request_id
from proxy.responses import error_body

HEAD_LIMIT: Final = 64 * 1024
"""The most bytes a request's line and headers may take (an agent's are under 2 KB; nginx's
default buffers hold 32 KB)."""
HEAD_TIMEOUT_S: Final = 30.0
"""How long a request's head may take to arrive (nginx's `client_header_timeout` is 60 s between
reads; a client sends its head in one write)."""
LINGER_S: Final = 2.0
"""How long a refused connection's further bytes are read and dropped before it closes: closed at
once with bytes unread (the rest of a flood), the kernel would reset the connection and the client
could lose the answer before it reads it (nginx's lingering close)."""
SWEEP_S: Final = 5.0
"""How often heads that are late are looked for."""
_HEAD_TICKS: Final = round(HEAD_TIMEOUT_S / SWEEP_S)

log = logging.getLogger("proxy.protocol")


class Sweep:
    """The clock of one server's heads: `tick` counts sweeps; each `run` closes the connections
    whose head began `_HEAD_TICKS` ticks ago or more, and re-arms while any connection is open."""

    def __init__(self, state: ServerState, loop: asyncio.AbstractEventLoop) -> None:
        self.tick = 0
        self._state = state
        self._loop = loop
        self._timer: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        if self._timer is None:
            self._timer = self._loop.call_later(SWEEP_S, self.run)

    def run(self) -> None:
        self._timer = None
        self.tick += 1
        due = self.tick - _HEAD_TICKS
        for connection in list(self._state.connections):
            if isinstance(connection, BoundedHttp):
                began = connection.head_began
                if began is not None and began <= due:
                    connection.head_timed_out()
        if self._state.connections:
            self.arm()


_sweeps: weakref.WeakKeyDictionary[ServerState, Sweep] = weakref.WeakKeyDictionary()


def sweep_of(state: ServerState, loop: asyncio.AbstractEventLoop) -> Sweep:
    """The sweep of the server whose state `state` is (one per server)."""
    sweep = _sweeps.get(state)
    if sweep is None:
        sweep = _sweeps[state] = Sweep(state, loop)
    return sweep


_feed = HttpToolsProtocol.data_received
"""uvicorn's own reading (called as a function: `super()` costs a request more than the checks)."""


class BoundedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bounded head: its size (HEAD_LIMIT) and its time
    (HEAD_TIMEOUT_S); the rest of a request (its body's pace, its size) is the app's to bound."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._sweep = sweep_of(server_state, self.loop)
        self._head_bytes = 0
        """What has come of the head being read; past HEAD_LIMIT once refused (nothing more is read)."""
        self.head_began: int | None = None
        """The sweep's tick when the head being read began; None while no head is being read (a
        request in flight, or a kept-alive connection waiting, which uvicorn's own timer closes)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.head_began = self._sweep.tick  # the first head is due from now, even if nothing comes
        self._sweep.arm()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            _feed(self, data)  # the body of the request in flight
            return
        # A head, or the start of one: the common case is a whole head in one read, which costs
        # a sum, a comparison and an identity check.
        read = self._head_bytes + len(data)
        if read > HEAD_LIMIT and self._past_limit(data):
            return
        _feed(self, data)
        if self.cycle is cycle:  # not complete yet: it has until the sweep says
            if self._head_bytes > HEAD_LIMIT:
                return  # refused as it was read (what uvicorn cannot parse)
            self._head_bytes = read
            if self.head_began is None:
                self.head_began = self._sweep.tick
        elif self.head_began is not None:  # complete, after reads before this one (or a first)
            self.head_began = None
            self._head_bytes = 0

    def _past_limit(self, data: bytes) -> bool:
        """A read that takes the head past HEAD_LIMIT, unless the head ends within it (a head and
        the start of its body often come in one read): refused, and True."""
        end = data.find(b"\r\n\r\n")
        if end >= 0 and self._head_bytes + end + 4 <= HEAD_LIMIT:
            return False
        self._refuse(
            431,
            f"the request's line and headers are larger than {HEAD_LIMIT:,} bytes",
            "request_header_too_large",
        )
        return True

    def head_timed_out(self) -> None:
        """The sweep found this connection's head late."""
        if self.transport.is_closing():
            return
        if self._head_bytes == 0:
            self.transport.close()  # nothing came: a connection nobody uses, closed as idle
            return
        self._refuse(408, f"the request's head did not arrive within {HEAD_TIMEOUT_S:g} s", "request_timeout")

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to what httptools cannot parse (plain text, no request id).
        self._refuse(400, "the request is not HTTP/1.1 this server can read", "invalid_http")

    def _refuse(self, status: int, message: str, code: str) -> None:
        """Answer in the proxy's JSON and end the connection: the rest of what the client sends is
        no request. Its bytes are read and dropped for LINGER_S after the answer has gone."""
        self.head_began = None
        if self._head_bytes > HEAD_LIMIT or self.transport.is_closing():
            return  # refused already
        self._head_bytes = HEAD_LIMIT + 1  # every later read of a head is past the limit: dropped
        body = error_body(status, message, code)
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head.append(name + b": " + value + b"\r\n")
        head.append(
            b"content-type: application/json\r\ncontent-length: %d\r\nx-request-id: %s\r\nconnection: close\r\n\r\n"
            % (len(body), new_request_id().encode())
        )
        transport = self.transport
        transport.write(b"".join(head) + body)
        if transport.can_write_eof():
            transport.write_eof()  # the answer, then the end, while its reading goes on a while
            self.loop.call_later(LINGER_S, transport.close)
        else:
            transport.close()
        log.info("refused a request from %s: %s %s", _peer(self.client), status, code)


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"
