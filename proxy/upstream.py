"""The one long-lived upstream HTTP client: its timeouts, and its failures as the engine's outcomes.

`UpstreamClient.send` builds the upstream request from scratch (the client's Authorization and
session headers never travel), waits for the response headers within the first-byte timeout,
and maps every transport failure to one `UpstreamFailure` carrying an engine `Outcome`. The HTTP
itself is `proxy.http1`'s; this is the only place where its exceptions are translated.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit, urlunsplit

from proxy import http1
from proxy.resilience.outcome import Outcome

T = TypeVar("T")

_HEADS_CACHED = 256
MAX_ERROR_BODY = 1024 * 1024
"""An upstream's error body is relayed whole up to this size; a gateway that answers an error
with more must not make us buffer it all, so past this it is not relayed at all (a cut JSON body
would be broken JSON)."""

MAX_UPSTREAM_BODY_BYTES = 256 * 1024 * 1024
"""A non-streaming answer is buffered whole before it is relayed, so it needs a ceiling. 256 MiB
holds the largest real answers (a 2,048-input batch of 3,072-dimension embeddings as JSON is about
120 MB); past it the attempt fails like a dropped connection instead of growing without end."""

BURST_GAP_S = 0.001
"""A stream's reads closer together than this are a burst, which a relay gathers for this long
before it reads again (`UpstreamResponse.chunks`). Each read and write costs the proxy tens of
microseconds of CPU however little it carries: an upstream that sends its events as fast as it can
would otherwise be relayed an event or two at a time, and the proxy's CPU then comes out of the
cores the upstream and the client run on (a local model's server, on a workstation). A token stream
(events milliseconds apart) never waits; in a burst, an event waits at most this long."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_ms: float = 10_000
    first_byte_ms: float = 120_000
    idle_ms: float = 120_000


IDLE = Outcome.stall("upstream idle timeout")
"""A body that went quiet past `Timeouts.idle_ms`."""


class UpstreamFailure(Exception):
    """The attempt failed before (or while) the upstream answered; `outcome` says how."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.error)
        self.outcome = outcome


class UpstreamResponse:
    """An upstream response whose headers have arrived; the body is read on demand.

    Every wait for more of the body ends after `idle_s` without a byte (the idle timeout, an
    `upstream idle timeout` stall), behind the client's one loop timer (`Deadlines`) rather than a
    loop timer per request and per read."""

    __slots__ = ("_body_timeout_ms", "_deadlines", "_headers", "_idle_s", "_response", "status")

    def __init__(
        self,
        response: http1.Response,
        body_timeout_ms: float,
        deadlines: Deadlines,
        idle_s: float,
    ) -> None:
        """`body_timeout_ms`: how long `read()` may take for the whole body, from the headers on."""
        self._response = response
        self._body_timeout_ms = body_timeout_ms
        self._deadlines = deadlines
        self._idle_s = idle_s
        self.status = response.status
        self._headers: Mapping[str, str] | None = None

    @property
    def headers(self) -> Mapping[str, str]:
        """The response's headers by lower-case name (the last of repeated ones). Built when first
        read: only an error answer's retry hints need them."""
        if self._headers is None:
            self._headers = {k.lower(): v for k, v in self._response.headers}
        return self._headers

    def read_arrived(self) -> bytes | None:
        """The whole body if it has all arrived already (the common case for a short answer: it
        came with the headers), released as `read` leaves it; None when some is still to come.
        Not a coroutine: there is nothing to wait for, and a coroutine is an object per call."""
        response = self._response
        if not response.complete:
            return None
        # No deadline to set up; what arrived was bounded as it came (http1.BUFFER_HIGH stops
        # the reading), so a body this size cannot have come whole, but the check stays.
        data = response.read_nowait()
        if len(data) > MAX_UPSTREAM_BODY_BYTES:
            response.close()
            raise UpstreamFailure(
                Outcome.network(f"upstream body larger than {MAX_UPSTREAM_BODY_BYTES} bytes")
            )
        response.release()
        return data

    async def read(self) -> bytes:
        """The whole body: within `body_timeout_ms` of the headers and at most MAX_UPSTREAM_BODY_BYTES.
        Once it has returned, the response is released: `close` has nothing left to do.

        The idle timeout alone cannot end a body that trickles (keep-alive pings on a non-streaming
        request reset it with every byte): the request would never end, and its buffer would grow
        for as long as the upstream went on. Either bound failing is an UpstreamFailure.
        """
        arrived = self.read_arrived()
        if arrived is not None:
            return arrived
        limit = MAX_UPSTREAM_BODY_BYTES
        response = self._response
        deadlines = self._deadlines
        task = _current_task(deadlines.loop)
        done_by = deadlines.loop.time() + self._body_timeout_ms / 1000
        try:
            length = response.header("content-length")
            if length is not None and length.strip().isdigit() and int(length) > limit:
                raise UpstreamFailure(Outcome.network(f"upstream body larger than {limit} bytes"))
            chunks: list[bytes] = []
            size = 0
            while True:
                at = min(deadlines.loop.time() + self._idle_s, done_by)
                chunk = await deadlines.within(response.readany(), task, at)
                if not chunk:
                    break
                size += len(chunk)
                if size > limit:
                    raise UpstreamFailure(Outcome.network(f"upstream body larger than {limit} bytes"))
                chunks.append(chunk)
        except DeadlinePassed as exc:
            response.close()
            if deadlines.loop.time() >= done_by:
                message = f"upstream body not complete within {self._body_timeout_ms:g} ms of its headers"
                raise UpstreamFailure(Outcome.stall(message)) from exc
            raise UpstreamFailure(IDLE) from exc
        except (http1.ConnectionBroken, OSError) as exc:
            response.close()
            raise UpstreamFailure(_network_outcome(exc)) from exc
        except BaseException:
            response.close()  # an unread body cannot go back to the pool
            raise
        response.release()
        return b"".join(chunks)

    async def read_error_body(self) -> tuple[bytes, bool]:
        """The error body and whether that is all of it: at most MAX_ERROR_BODY bytes are read (the
        rest is not waited for). A body that breaks off is what arrived, and not whole."""
        response = self._response
        deadlines = self._deadlines
        task = _current_task(deadlines.loop)
        chunks: list[bytes] = []
        size = 0
        whole = False
        try:
            while size <= MAX_ERROR_BODY:
                at = deadlines.loop.time() + self._idle_s
                chunk = await deadlines.within(response.readany(), task, at)
                if not chunk:
                    whole = True
                    break
                chunks.append(chunk)
                size += len(chunk)
        except (DeadlinePassed, http1.ConnectionBroken, OSError):
            pass
        finally:
            response.close()
        raw = b"".join(chunks)
        return raw[:MAX_ERROR_BODY], whole

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (for SSE relays); raises UpstreamFailure if the upstream dies.

        Each chunk is handed on as soon as it is read, with one exception: in a burst (a read that
        came within BURST_GAP_S of the one before), what follows is gathered for BURST_GAP_S before
        it is read, so a burst costs a read and a write per window instead of one per event."""
        response = self._response
        deadlines = self._deadlines
        loop = deadlines.loop
        idle = self._idle_s
        previous = -BURST_GAP_S
        try:
            # The task is looked up for each read: a relay reads its first chunk in the request's
            # task and the rest in the one its response streams from.
            while chunk := await deadlines.within(
                response.readany(), _current_task(loop), loop.time() + idle
            ):
                yield chunk
                now = loop.time()
                if now - previous < BURST_GAP_S and not response.complete:
                    await _gather(response)
                    now = loop.time()
                previous = now
        except DeadlinePassed as exc:
            raise UpstreamFailure(IDLE) from exc
        except (http1.ConnectionBroken, OSError) as exc:
            raise UpstreamFailure(_network_outcome(exc)) from exc

    @property
    def content_type(self) -> str:
        """The answer's Content-Type (the last one, as `headers` reads it), as the client can be
        sent it: see `relayable_type`."""
        found = self._response.header("content-type")
        return relayable_type(found) if found is not None else "application/json"

    def close(self) -> None:
        self._response.close()


async def _gather(response: http1.Response) -> None:
    """Let a burst's data gather in the socket for BURST_GAP_S: the connection stops reading, or
    the loop would read it anyway, a few events at a time, into the response's buffer."""
    response.hold()
    try:
        await asyncio.sleep(BURST_GAP_S)
    finally:
        response.unhold()


class UpstreamClient:
    def __init__(self, timeouts: Timeouts | None = None, *, max_connections: int = 512) -> None:
        self.timeouts = timeouts or Timeouts()
        self._pool: http1.Pool | None = None
        self._max_connections = max_connections
        self._deadlines: Deadlines | None = None
        """The first-byte deadlines of the requests in flight (on the loop they are sent from)."""
        self._heads: dict[tuple[str, str, str | None], tuple[bytes, http1.Target]] = {}
        """(method, URL, API key) -> the request's head and parsed URL, for a provider without
        headers or credentials of its own: the same few every time (at most _HEADS_CACHED)."""

    async def start(self) -> None:
        if self._pool is None:
            self._pool = http1.Pool(
                limit=self._max_connections, connect_timeout_s=self.timeouts.connect_ms / 1000
            )

    def deadlines(self) -> Deadlines:
        """The running loop's deadlines: one loop timer for this client's waits and for other waits
        bounded the same way (a client's body that stops arriving, `proxy.pipeline`)."""
        loop = asyncio.get_running_loop()
        deadlines = self._deadlines
        if deadlines is None or deadlines.loop is not loop:
            deadlines = self._deadlines = Deadlines(loop)
        return deadlines

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def send(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None,
        api_key: str | None,
        extra_headers: Mapping[str, str] | None = None,
        first_byte_ms: float | None = None,
        credentials: Mapping[str, str] | None = None,
    ) -> UpstreamResponse:
        """Send one request and return once the response headers are in.

        `api_key` travels as `Authorization: Bearer`; a provider with another auth style passes
        `api_key=None` and its `credentials` headers instead (`proxy.apis.auth_headers`), which
        are set last so that no configured header can replace them."""
        if self._pool is None:
            await self.start()
        pool = self._pool
        assert pool is not None
        plain = not extra_headers and not credentials
        # The same few heads every time (one per URL and key): built once.
        known = self._heads.get((method, url, api_key)) if plain else None
        if known is None:
            built = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
            try:
                target = http1.parse_url(url)
                if target.basic is not None:  # base_url's user name and password; a key comes first
                    built["authorization"] = target.basic
                if extra_headers:
                    built.update((name.lower(), value) for name, value in extra_headers.items())
                if api_key:
                    built["authorization"] = f"Bearer {api_key}"
                if credentials:
                    built.update((name.lower(), value) for name, value in credentials.items())
                known = (http1.request_head(method, target, list(built.items())), target)
            except ValueError as exc:
                # base_url and the headers come from a checked configuration; a value that still
                # cannot go into a request fails this attempt, in words, not the proxy
                raise UpstreamFailure(Outcome.local(f"cannot send this request: {exc}")) from exc
            if plain and len(self._heads) < _HEADS_CACHED:
                self._heads[(method, url, api_key)] = known
        head, target = known
        limit = (first_byte_ms if first_byte_ms is not None else self.timeouts.first_byte_ms) / 1000
        # The first-byte deadline cancels this task when it passes, as an `asyncio.timeout` context
        # would (without its object, reschedule and exit check per request, in Python), and
        # behind one loop timer for every request in flight (`Deadlines`) rather than a timer of
        # its own (a libuv timer started, stopped and closed per request). The same rules: a
        # cancellation is ours only when our deadline passed and nobody else cancelled the task
        # too (`uncancel`, as `asyncio.timeout` decides), and it cannot pass after the `finally`.
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None  # a request is sent from a task
        cancelling = task.cancelling()
        deadlines = self._deadlines
        if deadlines is None or deadlines.loop is not loop:
            deadlines = self._deadlines = Deadlines(loop)
        # (`Deadlines.add`, inline: once per request)
        deadline = loop.time() + limit
        deadlines.pending[task] = deadline
        if deadlines.timer is None or deadline < deadlines.at:
            deadlines.arm(deadline)
        try:
            # Redirects are not followed (http1 never does): a key, the provider's headers and (on
            # a 307) the prompt go only where base_url points, never wherever an upstream names.
            response = await pool.request(head, target, body)
        except asyncio.CancelledError as exc:
            if task in deadlines.passed_tasks and task.uncancel() <= cancelling:
                raise UpstreamFailure(Outcome.network("timeout before the response headers")) from exc
            raise
        except TimeoutError as exc:  # the connect timeout: the same words as ours
            raise UpstreamFailure(Outcome.network("timeout before the response headers")) from exc
        except (http1.ConnectFailed, http1.ConnectionBroken, OSError) as exc:
            raise UpstreamFailure(_network_outcome(exc)) from exc
        finally:
            if deadlines.pending.pop(task, None) is None:  # (`Deadlines.discard`, inline)
                deadlines.passed_tasks.discard(task)
        status = response.status
        if not (200 <= status < 300 or 400 <= status <= 599):
            location = response.header("location")
            response.close()
            if 300 <= status < 400:
                raise UpstreamFailure(Outcome.network(redirected(status, location)))
            # Three digits that are no final answer's status: 600-999 are not HTTP's, and no
            # client could be answered with one (uvicorn writes status lines for 100-599).
            raise UpstreamFailure(Outcome.network(f"answered status {status}, which is no answer in HTTP"))
        # The same budget again for the rest of a non-streaming answer (see UpstreamResponse.read).
        return UpstreamResponse(response, limit * 1000, deadlines, self.timeouts.idle_ms / 1000)


def relayable_type(value: str) -> str:
    """An upstream's Content-Type as a header the client can be sent: HTTP headers are latin-1, and
    aiohttp decodes them as UTF-8 (bytes it cannot, as surrogates), so a hostile or broken upstream's
    `charset=é中` could not be written back. Printable ASCII passes as it came; otherwise its media
    type alone when that is, else `application/octet-stream` (what the bytes are, and nothing more)."""
    if value.isascii() and value.isprintable():
        return value
    media = value.partition(";")[0].strip()
    if media and media.isascii() and media.isprintable():
        return media
    return "application/octet-stream"


REDIRECT_SHOWN = 120
"""The most of a redirect's target a failure's words show."""


def redirected(status: int, location: str | None) -> str:
    """A redirect in words, with where it pointed (no user name, password or query, where a key may
    hide): the likely fix is base_url set to that address."""
    where = ""
    try:
        parts = urlsplit(location.strip()) if location else None
    except ValueError:  # not a URL (`http://[::1`): nothing to show
        parts = None
    if parts is not None:
        host = parts.netloc.rpartition("@")[2]  # (as written: `.port` raises on one out of range)
        shown = urlunsplit((parts.scheme, host, parts.path, "", ""))
        if len(shown) > REDIRECT_SHOWN:
            shown = shown[: REDIRECT_SHOWN - 1] + "…"
        where = f" to {shown}"
    return f"answered {status}, a redirect{where}: not followed (a key goes only to base_url)"


class Deadlines:
    """Tasks to cancel when their deadline (loop time) passes, behind one loop timer.

    A task's deadline goes into `pending`, and the timer is set (`arm`) for it when it is the
    earliest. When the timer fires, every task whose deadline has passed is cancelled and moves to
    `passed_tasks`, and the timer is set again for the earliest one left. A task done with its
    deadline leaves `pending` (or `passed_tasks`): with every request given the same limit, the
    timer fires about once a limit, not once a request. The first-byte deadline of a request
    (`UpstreamClient.send` reads and writes the tables itself, once per request), the idle
    timeout of each wait for an upstream's body and of each wait for a client's body that has not
    arrived yet (`within`) share it.
    """

    __slots__ = ("at", "loop", "passed_tasks", "pending", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: dict[asyncio.Task[object], float] = {}
        self.passed_tasks: set[asyncio.Task[object]] = set()
        self.timer: asyncio.TimerHandle | None = None
        self.at = 0.0
        """When the timer fires (loop time)."""

    async def within(self, awaitable: Awaitable[T], task: asyncio.Task[Any], at: float) -> T:
        """`awaitable`'s result, awaited by `task` (the current task); `DeadlinePassed` if loop
        time `at` passes first. (The rules of `UpstreamClient.send`'s inline use.)"""
        cancelling = task.cancelling()
        self.pending[task] = at
        if self.timer is None or at < self.at:
            self.arm(at)
        try:
            return await awaitable
        except asyncio.CancelledError as exc:
            if task in self.passed_tasks and task.uncancel() <= cancelling:
                raise DeadlinePassed from exc
            raise
        finally:
            if self.pending.pop(task, None) is None:
                self.passed_tasks.discard(task)

    def arm(self, when: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.at = when
        self.timer = self.loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self.timer = None
        now = self.loop.time()
        due = [task for task, deadline in self.pending.items() if deadline <= now]
        for task in due:
            del self.pending[task]
            self.passed_tasks.add(task)
            task.cancel()
        if self.pending:
            self.arm(min(self.pending.values()))


class DeadlinePassed(Exception):
    """A wait outlived its deadline (`Deadlines.within`)."""


def _current_task(loop: asyncio.AbstractEventLoop) -> asyncio.Task[Any]:
    task = asyncio.current_task(loop)
    assert task is not None  # an upstream is read from a task
    return task


SHORTAGES: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""The errors that say this process (or machine) is out of something, not that the upstream failed:
no descriptor left for a socket (a low `ulimit -n` under a busy agent), no buffer, no memory."""


def _network_outcome(exc: BaseException) -> Outcome:
    local = exc.error if isinstance(exc, http1.ConnectFailed) else exc
    if isinstance(local, OSError) and local.errno in SHORTAGES:
        # Counts against no layer: a healthy upstream must not be cooled, nor its breaker opened,
        # for what this process lacks.
        return Outcome.local(f"the proxy could not open a connection: {os.strerror(local.errno).lower()}")
    if isinstance(exc, http1.ConnectFailed):
        # In words: "connection refused", not "[Errno 111] Connect call failed ('127.0.0.1', 11434)".
        error = exc.error
        if isinstance(error, socket.gaierror):
            return Outcome.network(f"cannot resolve {exc.host}: {error.strerror or error}")
        if isinstance(error, ssl.SSLCertVerificationError):
            return Outcome.network(f"TLS: {error.verify_message or error.reason}")
        if isinstance(error, ssl.SSLError):
            return Outcome.network(f"TLS: {error.reason or error}")
        words = os.strerror(error.errno) if error.errno else str(error.strerror or error)
        return Outcome.network(words[:1].lower() + words[1:])
    if isinstance(exc, http1.ConnectionBroken):
        return Outcome.network(str(exc))
    if isinstance(exc, ConnectionError):  # reset, broken pipe: mid-exchange
        return Outcome.network("upstream closed the connection")
    return Outcome.network(type(exc).__name__)
