"""HTTP/1.1 to the upstreams: a pool of keep-alive connections, each an asyncio protocol around
httptools' response parser (llhttp, the parser uvicorn reads its clients' requests with).

The proxy sends a few kinds of request (a POST of JSON bytes, a GET of a model list) to a few
origins, over and over, and reads each answer whole or as a stream. aiohttp's client took 77-85 µs
of CPU for such an exchange on this stack (its session, request and response objects, header
multidicts, payload and writer classes, timers), a third of what the proxy spent on a small
request; this client takes 23.5 µs, system calls included (docs/performance.md). What it does not
do, because the proxy never asks: redirects (never followed: a key goes only to base_url),
cookies (never kept: one client's session must not ride with another's request), environment
proxies, compression (it asks for `identity`), request bodies other than bytes.

Failures are its own exceptions, which `proxy.upstream` turns into the engine's outcomes:
`ConnectFailed` (no connection could be opened), `ConnectionBroken` (the upstream closed it, or
answered with something that is not HTTP, before the answer was complete).
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
import ssl
from collections import deque
from typing import Final, NamedTuple, cast
from urllib.parse import unquote, urlsplit

import httptools

MAX_HEAD_BYTES: Final = 64 * 1024
"""An answer's status line and headers together; past this the upstream is not speaking HTTP to
us (or is hostile), and the connection is dropped instead of buffering a head without end."""
MAX_HEADERS: Final = 128
BUFFER_HIGH: Final = 256 * 1024
"""Body bytes kept unread before the connection stops reading: a stream's reader that is slower
than its upstream (a slow client behind it) holds the upstream back through TCP, not our memory."""
KEEPALIVE_S: Final = {"http": 4.0, "https": 15.0}
"""How long an idle connection is used again, by scheme; after that it is closed rather than sent a
request as its server closes its end (the request would fail, and cool a healthy connection). Local
servers over plain HTTP close theirs after 5 s (uvicorn, so vLLM; llama.cpp's server; Node), and a
new connection to one costs next to nothing. Cloud APIs over TLS keep theirs far longer, and a new
one costs a TLS handshake: 15 s there (aiohttp's default)."""

BUSY, IDLE, GONE = "busy", "idle", "gone"
"""A connection's state in its pool: serving a request (it counts against the pool's limit), kept
for the next one, or closed."""

_FULL, _HELD = 1, 2
"""Why a connection's reading is paused: its buffer is full, or a reader holds it (`hold`)."""


class ConnectFailed(Exception):
    """No connection to `host` could be opened: `error` says why (refused, unreachable, cannot
    resolve: a `socket.gaierror`, out of descriptors: EMFILE)."""

    def __init__(self, host: str, error: OSError) -> None:
        super().__init__(f"cannot connect to {host}: {error}")
        self.host = host
        self.error = error


class ConnectionBroken(Exception):
    """The connection ended, or the upstream sent what is not HTTP, before its answer was whole."""


class Origin(NamedTuple):
    """Where a connection goes: connections are kept and reused per origin."""

    scheme: str
    host: str
    port: int


class Target(NamedTuple):
    """A parsed request URL: its origin, the request line's target, the `Host` header, and the
    `Authorization` its user name and password make (`Basic`), if it has them."""

    origin: Origin
    path: bytes
    host_header: bytes
    basic: str | None = None


def parse_url(url: str) -> Target:
    """`url` as a Target; ValueError if it is not an http(s) URL with a host. (The error does not
    quote the URL: a base_url may hold a password.)"""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL with a host")
    default = 443 if scheme == "https" else 80
    port = parts.port or default
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if port == default else f"{shown}:{port}"
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    for text in (path, host_header):
        if not text.isascii() or not text.isprintable() or " " in text:
            raise ValueError("a URL with spaces or characters that cannot go on a request line")
    basic = None
    if parts.username is not None or parts.password is not None:
        user = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
        basic = "Basic " + base64.b64encode(user.encode()).decode("ascii")
    return Target(Origin(scheme, host, port), path.encode("ascii"), host_header.encode("ascii"), basic)


def request_head(method: str, target: Target, headers: list[tuple[str, str]]) -> bytes:
    """The request line and the headers of a request to `target`, without `Content-Length` (added
    per request) and the blank line. ValueError on a header that would break the head."""
    lines = [f"{method} ".encode("ascii") + target.path + b" HTTP/1.1", b"Host: " + target.host_header]
    encoding = True
    for name, value in headers:
        if not name or not name.isascii() or not name.isprintable() or ":" in name or " " in name:
            raise ValueError(f"not a header name: {name!r}")
        if "\r" in value or "\n" in value or "\0" in value:
            raise ValueError(f"the value of header {name} holds a line break or a NUL")
        lines.append(f"{name}: {value}".encode())
        encoding = encoding and name.lower() != "accept-encoding"
    if encoding:  # (unless configured: what comes back is then the provider's to answer for)
        lines.append(b"Accept-Encoding: identity")
    return b"\r\n".join(lines) + b"\r\n"


class Response:
    """One answer on one connection: its status and headers once they are in, and its body as it
    arrives (`read_nowait`, `readany`). Hand it back with `release` once read whole, or `close`."""

    __slots__ = (
        "_chunks",
        "_connection",
        "_error",
        "_head",
        "_size",
        "_waiter",
        "complete",
        "headers",
        "status",
    )

    def __init__(self, connection: Connection, head: asyncio.Future[None]) -> None:
        self._connection: Connection | None = connection
        self._head = head
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        """As the upstream sent them, names and values decoded as UTF-8 (with surrogates for what
        is not): repeated ones repeated, in order."""
        self._chunks: list[bytes] = []
        self._size = 0
        self.complete = False
        """The whole body has arrived (it may not all have been read yet)."""
        self._error: ConnectionBroken | None = None
        self._waiter: asyncio.Future[None] | None = None

    def header(self, name: str) -> str | None:
        """The last value of header `name` (lower case), or None."""
        found = None
        for key, value in self.headers:
            if key.lower() == name:
                found = value
        return found

    def read_nowait(self) -> bytes:
        """What has arrived and not been read yet (b"" if nothing)."""
        chunks = self._chunks
        if not chunks:
            return b""
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        self._size = 0
        connection = self._connection
        if connection is not None and connection.paused & _FULL:
            connection.unpause(_FULL)
        return data

    async def readany(self) -> bytes:
        """What has arrived, once something has; b"" at the end of the body. ConnectionBroken if
        the connection ended before the body was whole."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self.complete:
                return b""
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        return self.read_nowait()

    def hold(self) -> None:
        """Stop reading from the upstream until `unhold` (what arrives meanwhile waits in the socket)."""
        if self._connection is not None and not self.complete:
            self._connection.pause(_HELD)

    def unhold(self) -> None:
        if self._connection is not None:
            self._connection.unpause(_HELD)

    def release(self) -> None:
        """Done with this answer: its connection goes back to the pool when the answer was whole and
        the upstream keeps it open; otherwise it is closed."""
        connection = self._connection
        if connection is None:
            return
        self._connection = None
        connection.finished(self)

    close = release
    """(Release and close are one: an answer not whole leaves its connection unusable either way.)"""

    def __del__(self) -> None:
        # Dropped without a release (a bug of the caller's): its connection must not stay busy,
        # holding a place of the pool's, for as long as the process lives.
        connection = self._connection
        if connection is not None:
            connection.abort()

    # ------------------------------------------------------------------ fed by the connection

    def _arrived(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        if self._size > BUFFER_HIGH and self._connection is not None:
            self._connection.pause(_FULL)
        self._wake()

    def _ended(self, error: ConnectionBroken | None) -> None:
        if self.complete or self._error is not None:
            return
        if error is None:  # (only once the head is in: an answer ends after its head)
            self.complete = True
        else:
            self._error = error
            if not self._head.done():
                self._head.set_exception(error)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Connection(asyncio.Protocol):
    """One connection to an origin, one request at a time."""

    def __init__(self, pool: Pool, origin: Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.reusable = False
        """The last answer came whole and the upstream keeps the connection open."""
        self.state = BUSY
        self.idle_since = 0.0
        self.paused = 0
        self._head_bytes = 0
        """What reads have brought of a head that is not complete yet."""
        self._header_bytes = 0
        """The header names and values of the answer so far (one read may bring a whole head)."""
        self._in_head = False

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is not a subclass)

    def data_received(self, data: bytes) -> None:
        if self.response is None:  # nothing was asked: not an answer to anything of ours
            self.abort()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._broken("the upstream switched protocols")
            return
        except httptools.HttpParserError as exc:
            self._broken(f"the upstream's answer is not HTTP ({_reason(exc)})")
            return
        if self._in_head:  # a head that goes on past this read: all of it was head
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._broken(f"the upstream's answer has a head longer than {MAX_HEAD_BYTES} bytes")

    def eof_received(self) -> bool:
        return False  # close our end too

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self.transport = None
        self.pool.gone(self)
        response = self.response
        if response is not None:
            self.response = None
            if not self._in_head and response._head.done() and _ends_with_connection(response):
                response._ended(None)
            else:
                response._ended(ConnectionBroken("upstream closed the connection"))

    # ------------------------------------------------------------------ httptools callbacks

    def on_message_begin(self) -> None:
        response = self.response
        if response is None or response.complete:
            raise _Unexpected  # a second answer to one request
        response.headers = []
        self._in_head = True
        self._header_bytes = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        response = self.response
        assert response is not None
        self._header_bytes += len(name) + len(value)
        if len(response.headers) >= MAX_HEADERS or self._header_bytes > MAX_HEAD_BYTES:
            raise _Unexpected
        response.headers.append(
            (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
        )

    def on_headers_complete(self) -> None:
        response = self.response
        assert response is not None
        status = self.parser.get_status_code()
        if status < 200:  # an interim answer (100 Continue, 103 Early Hints): the real one follows
            return
        self._in_head = False
        response.status = status
        if not response._head.done():
            response._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        response = self.response
        assert response is not None
        response._arrived(body)

    def on_message_complete(self) -> None:
        response = self.response
        assert response is not None
        if self._in_head:  # the end of an interim answer
            self._head_bytes = 0
            return
        # (Never a body that ends with the connection: the parser completes that one only at an
        # end of input, which it is never given; `connection_lost` does.) Not reusable while some
        # of the request is still unsent (an upstream that answered early, a 413 say): the rest of
        # it would reach the server as the start of the next request.
        transport = self.transport
        self.reusable = (
            self.parser.should_keep_alive()
            and transport is not None
            and not transport.get_write_buffer_size()
        )
        self.response = None if self.reusable else response
        response._ended(None)

    # ------------------------------------------------------------------ used by the pool

    def send(self, head: bytes, body: bytes | None, loop: asyncio.AbstractEventLoop) -> Response:
        """Write one request (its head from `request_head`) and return its answer-to-be."""
        transport = self.transport
        if transport is None or transport.is_closing():  # (closed by the upstream since it was made)
            raise ConnectionBroken("upstream closed the connection")
        response = self.response = Response(self, loop.create_future())
        self.reusable = False
        self._in_head = True
        self._head_bytes = 0
        if body is None:
            transport.write(head + b"\r\n")
        elif len(body) <= 16 * 1024:  # one write, one system call
            transport.write(b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body))
        else:  # not copied onto the head
            transport.write(b"%sContent-Length: %d\r\n\r\n" % (head, len(body)))
            transport.write(body)
        return response

    def finished(self, response: Response) -> None:
        """`response`'s reader is done with it."""
        if self.response is response:
            self.response = None
        transport = self.transport
        if self.reusable and transport is not None and not transport.is_closing():
            self.unpause(_FULL | _HELD)
            self.pool.idle(self)
        else:
            self.abort()

    def pause(self, reason: int) -> None:
        if not self.paused and self.transport is not None:
            self.transport.pause_reading()
        self.paused |= reason

    def unpause(self, reasons: int) -> None:
        if not self.paused:
            return
        self.paused &= ~reasons
        transport = self.transport
        if not self.paused and transport is not None and not transport.is_closing():
            transport.resume_reading()

    def abort(self) -> None:
        """Close the connection now: nothing in it is wanted any more. It stops counting as busy at
        once (its socket goes when the loop has closed it)."""
        self.reusable = False
        self.pool.gone(self)
        if self.transport is not None:
            self.transport.abort()  # (connection_lost follows, on the loop)

    def _broken(self, why: str) -> None:
        response = self.response
        self.response = None
        self.abort()
        if response is not None:
            response._ended(ConnectionBroken(why))


def _ends_with_connection(response: Response) -> bool:
    """Is `response`'s body one that ends when the connection does (no length, not chunked)? Asked
    only when a connection ends mid-answer: whether that answer is whole or broken."""
    if response.status in (204, 304):
        return False
    names = {name.lower() for name, _ in response.headers}
    return "content-length" not in names and "transfer-encoding" not in names


class _Unexpected(Exception):
    """Raised from a parser callback: the answer breaks a rule of ours (see the callers)."""


def _reason(exc: Exception) -> str:
    cause = exc.__context__
    if isinstance(cause, _Unexpected):
        return f"an answer no request asked for, more than {MAX_HEADERS} headers or a head past {MAX_HEAD_BYTES} bytes"
    return str(exc) or type(exc).__name__


class Pool:
    """Connections per origin, at most `limit` of them busy at once (more requests wait their turn).

    A connection is taken for one request and handed back when its answer has been read whole
    (`Response.release`); an idle one is used again, newest first, for up to KEEPALIVE_S."""

    def __init__(self, *, limit: int, connect_timeout_s: float, tls: ssl.SSLContext | None = None) -> None:
        """`tls`: whom to trust for https (by default the system's certificate authorities)."""
        self.limit = limit
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[Origin, list[Connection]] = {}
        self.busy = 0
        """Connections serving a request, and connections being opened for one."""
        self._turns: deque[asyncio.Future[None]] = deque()
        self._tls = tls
        self._closed = False

    async def request(self, head: bytes, target: Target, body: bytes | None) -> Response:
        """Send one request (`head` from `request_head`) and return once its answer's status and
        headers are in. ConnectFailed, ConnectionBroken; a cancellation (a deadline, a client that
        left) closes the connection."""
        if self._closed:
            raise RuntimeError("the upstream client is closed")
        loop = asyncio.get_running_loop()
        connection = self._take_idle(target.origin, loop.time())
        if connection is not None:
            self.busy += 1
        else:
            if self.busy >= self.limit or self._turns:
                await self._wait_turn(loop)  # (with its place counted)
                connection = self._take_idle(target.origin, loop.time())  # one freed meanwhile?
            else:
                self.busy += 1
            if connection is None:
                try:
                    connection = await self._connect(target.origin, loop)
                except BaseException:
                    self.busy -= 1
                    self._next_turn()
                    raise
        try:
            response = connection.send(head, body, loop)
        except BaseException:
            connection.abort()
            raise
        try:
            await response._head
        except BaseException:
            response.close()
            raise
        return response

    async def close(self) -> None:
        """Close the idle connections, and each busy one as its answer is done with."""
        self._closed = True
        for connections in list(self._idle.values()):
            for connection in list(connections):
                connection.abort()
        self._idle.clear()

    # ------------------------------------------------------------------ used by connections

    def idle(self, connection: Connection) -> None:
        """A busy connection is free for the next request."""
        if self._closed:
            connection.abort()
            return
        assert connection.state == BUSY
        connection.state = IDLE
        connection.idle_since = asyncio.get_running_loop().time()
        self._idle.setdefault(connection.origin, []).append(connection)
        self.busy -= 1
        self._next_turn()

    def gone(self, connection: Connection) -> None:
        """A connection is closed (or closing): it no longer counts, busy or idle."""
        state, connection.state = connection.state, GONE
        if state == BUSY:
            self.busy -= 1
            self._next_turn()
        elif state == IDLE:
            idle = self._idle.get(connection.origin)
            if idle is not None and connection in idle:
                idle.remove(connection)

    # ------------------------------------------------------------------ inside

    def _take_idle(self, origin: Origin, now: float) -> Connection | None:
        """The newest idle connection to `origin` still fit for use, now busy (the caller counts it)."""
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            transport = connection.transport
            if (
                transport is not None
                and not transport.is_closing()
                and now - connection.idle_since < KEEPALIVE_S[origin.scheme]
            ):
                connection.state = BUSY
                return connection
            connection.state = GONE
            connection.abort()
        return None

    async def _wait_turn(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait until a connection may be opened (first come, first served): it is counted busy
        from then on."""
        turn = loop.create_future()
        self._turns.append(turn)
        try:
            await turn
        except BaseException:
            if turn in self._turns:
                self._turns.remove(turn)
            elif turn.done() and not turn.cancelled():
                self.busy -= 1  # given a place it will not use: the next waiter's
                self._next_turn()
            raise

    def _next_turn(self) -> None:
        """A connection stopped counting: let the first waiter open one."""
        while self._turns and self.busy < self.limit:
            turn = self._turns.popleft()
            if not turn.done():
                self.busy += 1
                turn.set_result(None)
                return

    async def _connect(self, origin: Origin, loop: asyncio.AbstractEventLoop) -> Connection:
        """A new connection to `origin`, tried at each of its addresses in turn (ConnectFailed with
        the first one's error when none answers); TimeoutError after `connect_timeout_s`."""
        tls = None
        if origin.scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        async with asyncio.timeout(self.connect_timeout_s):
            try:
                addresses = _literal(origin) or await loop.getaddrinfo(
                    origin.host, origin.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
                )
            except socket.gaierror as exc:
                raise ConnectFailed(origin.host, exc) from exc
            first: OSError | None = None
            for family, kind, proto, _, address in addresses:
                sock = socket.socket(family, kind, proto)
                try:
                    sock.setblocking(False)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    await loop.sock_connect(sock, address)
                    _, connection = await loop.create_connection(
                        lambda: Connection(self, origin),
                        sock=sock,
                        ssl=tls,
                        server_hostname=origin.host if tls else None,
                    )
                    return connection
                except OSError as exc:
                    sock.close()
                    if first is None:
                        first = exc
                except BaseException:
                    sock.close()
                    raise
            assert first is not None  # (getaddrinfo answers with an address, or fails)
            raise ConnectFailed(origin.host, first)


def _literal(origin: Origin) -> list[tuple[int, int, int, str, tuple[str, int]]] | None:
    """`origin`'s address when its host is one (no resolver round trip), else None."""
    try:
        address = ipaddress.ip_address(origin.host)
    except ValueError:
        return None
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (origin.host, origin.port))]
