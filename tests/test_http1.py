"""proxy.http1 against real loopback servers that answer with scripted bytes: keep-alive and its
limits, every way an answer can end or break, flow control, the pool's places under cancellation."""

from __future__ import annotations

import asyncio
import errno
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy import http1
from proxy.http1 import BUSY, ConnectFailed, ConnectionBroken, Pool

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"

Script = Callable[[int, bytes], "bytes | None"]
"""(the request's number on the server, its head) -> the bytes to answer with; None closes the
connection without an answer."""


class Server:
    """A loopback HTTP server that reads each request (head and Content-Length body) and writes the
    script's bytes; it counts the connections it accepted. `hold` keeps answers back until set."""

    def __init__(self, script: Script, *, tls: ssl.SSLContext | None = None) -> None:
        self.script = script
        self.tls = tls
        self.connections = 0
        self.requests: list[bytes] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.close_after: bool = False
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await self._server.wait_closed()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def url(self, path: str = "/v1/chat/completions", scheme: str = "http", host: str = "127.0.0.1") -> str:
        return f"{scheme}://{host}:{self.port}{path}"

    def drop_all(self) -> None:
        """Close every connection from the server's side."""
        for writer in self._writers:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                self.requests.append(head)
                await self.hold.wait()
                answer = self.script(len(self.requests), head)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def always(answer: bytes | None) -> Script:
    return lambda n, head: answer


@pytest.fixture
async def pool() -> AsyncIterator[Pool]:
    pool = Pool(limit=8, connect_timeout_s=5)
    yield pool
    await pool.close()


async def exchange(pool: Pool, url: str, body: bytes | None = b"{}", method: str = "POST") -> http1.Response:
    target = http1.parse_url(url)
    return await pool.request(
        http1.request_head(method, target, [("content-type", "application/json")]), target, body
    )


async def answered(pool: Pool, url: str) -> bytes:
    """One exchange read whole, its connection handed back."""
    response = await exchange(pool, url)
    body = await read_all(response)
    response.release()
    return body


async def read_all(response: http1.Response) -> bytes:
    chunks = []
    while chunk := await response.readany():
        chunks.append(chunk)
    return b"".join(chunks)


async def settle() -> None:
    """Let the loop run the callbacks that are due (a closed socket's connection_lost)."""
    for _ in range(5):
        await asyncio.sleep(0)


# ------------------------------------------------------------------------------ keep-alive


async def test_a_connection_serves_request_after_request(pool: Pool) -> None:
    async with Server(always(OK)) as server:
        for _ in range(3):
            response = await exchange(pool, server.url())
            assert (response.status, await read_all(response)) == (200, b"{}")
            response.release()
        assert server.connections == 1
        assert pool.busy == 0
        head = server.requests[0].decode()
        assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
        assert f"Host: 127.0.0.1:{server.port}\r\n" in head
        assert "Content-Length: 2\r\n" in head and "Accept-Encoding: identity\r\n" in head


async def test_an_answer_that_says_close_is_not_reused(pool: Pool) -> None:
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    async with Server(always(closing)) as server:
        for _ in range(2):
            response = await exchange(pool, server.url())
            assert await read_all(response) == b"{}"
            response.release()
        assert server.connections == 2
        assert pool.busy == 0


async def test_a_body_without_a_length_ends_with_the_connection(pool: Pool) -> None:
    async with Server(always(b"HTTP/1.1 200 OK\r\n\r\nall of it")) as server:
        server.close_after = True
        response = await exchange(pool, server.url())
        assert await read_all(response) == b"all of it"
        assert response.complete
        response.release()
        await settle()
        assert pool.busy == 0


async def test_a_connection_the_server_closed_while_idle_is_not_used_again(pool: Pool) -> None:
    async with Server(always(OK)) as server:
        await answered(pool, server.url())
        server.drop_all()
        await asyncio.sleep(0.05)  # (the FIN travels through the kernel: no clock to fake)
        assert await answered(pool, server.url()) == b"{}"
        assert server.connections == 2


async def test_a_connection_idle_past_the_keep_alive_is_closed_not_reused(pool: Pool) -> None:
    async with Server(always(OK)) as server:
        response = await exchange(pool, server.url())
        await read_all(response)
        connection = response._connection
        response.release()
        assert connection is not None and connection.state == http1.IDLE
        connection.idle_since -= http1.KEEPALIVE_S["http"]  # as if it had waited that long
        await answered(pool, server.url())
        assert server.connections == 2
        assert connection.state == http1.GONE


async def test_a_plain_http_connection_is_not_kept_past_a_local_servers_five_seconds(pool: Pool) -> None:
    """uvicorn (vLLM), llama.cpp's server and Node close an idle connection after 5 s: one idle
    for 4.5 s is not sent a request that would race its close (and fail, cooling the connection)."""
    async with Server(always(OK)) as server:
        response = await exchange(pool, server.url())
        await read_all(response)
        connection = response._connection
        response.release()
        assert connection is not None
        connection.idle_since -= 4.5
        assert await answered(pool, server.url()) == b"{}"
        assert server.connections == 2
    assert http1.KEEPALIVE_S["https"] > 5  # (a cloud API keeps its connections far longer)


async def test_interim_answers_are_passed_over(pool: Pool) -> None:
    answer = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + OK
    async with Server(always(answer)) as server:
        response = await exchange(pool, server.url())
        assert response.status == 200
        assert response.header("content-type") == "application/json"
        assert response.header("link") is None
        assert await read_all(response) == b"{}"
        response.release()


async def test_chunked_bodies_are_decoded_and_repeated_headers_kept() -> None:
    answer = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\nx-a: 2\r\n\r\n"
        b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )
    pool = Pool(limit=1, connect_timeout_s=5)
    async with Server(always(answer)) as server:
        response = await exchange(pool, server.url())
        assert await read_all(response) == b"abcde"
        assert [v for k, v in response.headers if k.lower() == "x-a"] == ["1", "2"]
        assert response.header("x-a") == "2"
        response.release()
        assert pool.busy == 0
    await pool.close()


# ------------------------------------------------------------------------------ broken answers


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "upstream closed the connection"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
            "upstream closed the connection",
        ),
        (b"SSH-2.0-OpenSSH_9.2\r\n", "not HTTP"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", "not HTTP"),
        (b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * (70 * 1024) + b"\r\n\r\n", "not HTTP"),
        (b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * (70 * 1024), "head longer than"),
        (b"HTTP/1.1 200 OK\r\n" + b"X-H: 1\r\n" * 200 + b"\r\n", "not HTTP"),
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n", "switched"),
    ],
    ids=[
        "short-length",
        "short-chunked",
        "not-http",
        "two-lengths",
        "long-header",
        "long-head",
        "many-headers",
        "upgrade",
    ],
)
async def test_an_answer_that_breaks_off_or_is_not_http_is_broken(
    pool: Pool, answer: bytes, words: str
) -> None:
    async with Server(always(answer)) as server:
        server.close_after = True
        with pytest.raises(ConnectionBroken, match=words):
            response = await exchange(pool, server.url())
            await read_all(response)
        await settle()
        assert pool.busy == 0


async def test_bytes_after_a_whole_answer_end_the_connection_not_the_answer(pool: Pool) -> None:
    async with Server(always(OK + b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")) as server:
        assert await answered(pool, server.url()) == b"{}"
        await settle()
        assert await answered(pool, server.url()) == b"{}"
        assert server.connections == 2


async def test_a_server_that_closes_without_answering_is_broken(pool: Pool) -> None:
    async with Server(always(None)) as server:
        with pytest.raises(ConnectionBroken, match="closed"):
            await exchange(pool, server.url())
        await settle()
        assert pool.busy == 0


# ------------------------------------------------------------------------------ connecting


async def test_a_refused_connection_says_so(pool: Pool) -> None:
    async with Server(always(OK)) as server:
        url = server.url()
    with pytest.raises(ConnectFailed) as caught:
        await exchange(pool, url)
    assert caught.value.error.errno == errno.ECONNREFUSED
    assert pool.busy == 0


@pytest.mark.parametrize(
    ("name", "value"),
    [("x-a", "1\r\nx-b: 2"), ("x-a", "1\n"), ("x-a", "\0"), ("x a", "1"), ("x:a", "1"), ("", "1")],
)
def test_a_header_that_would_break_the_head_is_refused(name: str, value: str) -> None:
    with pytest.raises(ValueError):
        http1.request_head("POST", http1.parse_url("http://127.0.0.1:1/v1"), [(name, value)])


@pytest.mark.parametrize("url", ["ftp://h/x", "http:///x", "http://h/a b", "http://h/\u00e9", "nothing"])
def test_a_url_that_cannot_be_requested_is_refused(url: str) -> None:
    with pytest.raises(ValueError):
        http1.parse_url(url)


def test_urls_become_request_targets() -> None:
    target = http1.parse_url("https://api.example.com/v1/models?limit=5")
    assert target == http1.Target(
        http1.Origin("https", "api.example.com", 443), b"/v1/models?limit=5", b"api.example.com"
    )
    assert http1.parse_url("http://[::1]:8080").host_header == b"[::1]:8080"
    assert http1.parse_url("http://[::1]:8080").path == b"/"
    private = http1.parse_url("http://svc:p%40ss@host:8080/v1")
    assert (private.host_header, private.basic) == (b"host:8080", "Basic c3ZjOnBAc3M=")  # svc:p@ss
    head = http1.request_head("GET", private, [])
    assert b"p%40ss" not in head and b"svc" not in head  # (the caller puts `basic` on)


# ------------------------------------------------------------------------------ the pool's places


async def test_requests_past_the_limit_wait_their_turn_and_a_waiter_can_leave() -> None:
    pool = Pool(limit=1, connect_timeout_s=5)
    async with Server(always(OK)) as server:
        server.hold.clear()
        first = asyncio.create_task(exchange(pool, server.url()))
        leaving = asyncio.create_task(exchange(pool, server.url()))
        third = asyncio.create_task(exchange(pool, server.url()))
        await asyncio.sleep(0.05)  # (the first request travels to the server)
        assert pool.busy == 1 and len(pool._turns) == 2 and server.connections == 1
        leaving.cancel()
        await settle()
        assert len(pool._turns) == 1
        server.hold.set()
        response = await first
        await read_all(response)
        response.release()
        response = await third
        await read_all(response)
        response.release()
        assert pool.busy == 0 and not pool._turns
        assert server.connections == 1  # the third took the first's connection when it was idle
    await pool.close()


async def test_a_request_cancelled_while_waiting_for_its_answer_gives_its_place_back(pool: Pool) -> None:
    async with Server(always(OK)) as server:
        server.hold.clear()
        waiting = asyncio.create_task(exchange(pool, server.url()))
        await asyncio.sleep(0.05)
        assert pool.busy == 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert pool.busy == 0
        server.hold.set()
        response = await exchange(pool, server.url())  # a new connection: the first is unusable
        assert await read_all(response) == b"{}"
        response.release()
        assert server.connections == 2


async def test_a_reader_slower_than_its_upstream_stops_the_reading(pool: Pool) -> None:
    size = 4 * 1024 * 1024
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size
    async with Server(always(answer)) as server:
        response = await exchange(pool, server.url())
        await asyncio.sleep(0.2)  # (the server writes as fast as the kernel takes it)
        connection = response._connection
        assert connection is not None and connection.transport is not None
        assert not connection.transport.is_reading()
        assert response._size <= http1.BUFFER_HIGH + 256 * 1024  # at most one read past the mark
        assert len(await read_all(response)) == size
        response.release()
        assert pool.busy == 0


async def test_a_held_connection_reads_nothing_until_let_go(pool: Pool) -> None:
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n"
    async with Server(always(answer)) as server:
        response = await exchange(pool, server.url())
        assert await response.readany() == b"a"
        response.hold()
        connection = response._connection
        assert connection is not None and connection.transport is not None
        assert not connection.transport.is_reading()
        response.unhold()
        assert connection.transport.is_reading()
        response.close()
        await settle()
        assert pool.busy == 0 and connection.state == http1.GONE


Step = tuple[str, int]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    limit=st.integers(1, 3),
    steps=st.lists(
        st.tuples(st.sampled_from(["ask", "cancel", "release", "close", "drop"]), st.integers(0, 7)),
        min_size=1,
        max_size=25,
    ),
)
def test_the_pool_counts_its_places_whatever_happens(limit: int, steps: list[Step]) -> None:
    """Requests start, are cancelled at any await, are released or closed with their bodies half
    read, and the server drops every connection at any moment: the pool's busy count is always
    the connections it has busy, never past its limit, and it is back to zero at the end."""

    async def run() -> None:
        pool = Pool(limit=limit, connect_timeout_s=5)
        body = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n"
        async with Server(lambda n, head: body + (b"0\r\n\r\n" if n % 2 else b"")) as server:
            asks: list[asyncio.Task[http1.Response]] = []
            for action, pick in steps:
                if action == "ask":
                    asks.append(asyncio.create_task(exchange(pool, server.url())))
                elif action == "drop":
                    server.drop_all()
                elif asks:
                    task = asks[pick % len(asks)]
                    if action == "cancel":
                        task.cancel()
                    elif task.done() and not task.cancelled() and task.exception() is None:
                        response = task.result()
                        if action == "release":
                            await asyncio.wait_for(read_all(response), 5) if response.complete else None
                            response.release()
                        else:
                            response.close()
                await asyncio.sleep(0.002)
                busy = [c for c in _connections(pool, asks) if c.state == BUSY]
                assert pool.busy <= limit
                assert pool.busy >= len(busy)
            for task in asks:
                task.cancel()
            outcomes = await asyncio.gather(*asks, return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, http1.Response):
                    outcome.close()
            await settle()
            await asyncio.sleep(0.01)
            assert pool.busy == 0
            assert not pool._turns
        await pool.close()

    asyncio.run(run())


def _connections(pool: Pool, asks: list[asyncio.Task[http1.Response]]) -> list[http1.Connection]:
    found = [c for idle in pool._idle.values() for c in idle]
    for task in asks:
        if task.done() and not task.cancelled() and task.exception() is None:
            connection = task.result()._connection
            if connection is not None:
                found.append(connection)
    return found


# ------------------------------------------------------------------------------ TLS


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


async def test_https_checks_the_certificate_and_the_name(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    trusting = ssl.create_default_context(cafile=str(cert))
    async with Server(always(OK), tls=served) as server:
        pool = Pool(limit=4, connect_timeout_s=5, tls=trusting)
        response = await exchange(pool, server.url(scheme="https", host="localhost"))
        assert (response.status, await read_all(response)) == (200, b"{}")
        response.release()
        with pytest.raises(ConnectFailed) as caught:  # the name is not the certificate's
            await exchange(pool, server.url(scheme="https", host="127.0.0.1"))
        assert isinstance(caught.value.error, ssl.SSLCertVerificationError)
        await pool.close()
        untrusting = Pool(limit=4, connect_timeout_s=5)  # the system's authorities: not this one
        with pytest.raises(ConnectFailed):
            await exchange(untrusting, server.url(scheme="https", host="localhost"))
        await untrusting.close()
        assert pool.busy == untrusting.busy == 0


async def test_an_answer_dropped_unreleased_gives_its_place_back(pool: Pool) -> None:
    async with Server(always(OK)) as server:
        response = await exchange(pool, server.url())
        assert pool.busy == 1
        del response  # (a caller's bug: the pool must not lose the place for good)
        assert pool.busy == 0
        assert await answered(pool, server.url()) == b"{}"
