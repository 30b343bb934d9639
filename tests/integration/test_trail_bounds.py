"""What a request record keeps of text others choose is bounded, whatever its length.

A record lives in the ring (`server.request_history`, 2,000 by default), in `/api/requests` and in
every attached console's snapshot (at most 32 MiB a message): text a client or an upstream makes as
long as it likes, kept whole, grows all three without bound and ends every attach.

- The client address comes from `X-Forwarded-For` (uvicorn takes it from a loopback peer): any local
  process can make it as long as its headers.
- An upstream's error `code` sits beside its `message`, which is cut to 200 characters.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable

from tests.fakes import Reply
from tests.integration.test_proxy import CHAT_PATH, Proxy, Upstream, chat, provider

HUGE = 1024 * 1024  # one header of 1 MiB: uvicorn (httptools) takes it
CODE = "C" * 900_000


def post_with_forwarded_for(url: str, forwarded_for: bytes) -> bytes:
    """A chat request whose `X-Forwarded-For` is `forwarded_for`, over a raw socket (an HTTP client
    library would refuse nothing here, but this keeps the bytes exactly as written)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(chat("loc/m1")).encode()
    head = (
        f"POST {CHAT_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head + b"X-Forwarded-For: " + forwarded_for + b"\r\n\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_a_huge_forwarded_for_is_not_kept_whole_in_the_request_records(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("loc")
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    answer = post_with_forwarded_for(proxy.url, b"a" * HUGE)
    assert answer.startswith(b"HTTP/1.1 "), answer[:100]

    records = proxy.http.get("/api/requests").json()["requests"]
    assert len(records) == 1
    client = records[0]["client"]
    # Kept like a model name or a session id: at most 256 characters (today: all 1,048,576 of
    # them, in the ring, in /api/requests and in every attached console's snapshot; 40 such
    # requests took a real `omniroute serve` from 78 MiB to 856 MiB of RSS).
    assert len(client) <= 256, f"the record keeps a client address of {len(client):,} characters"


def test_the_request_records_do_not_grow_with_the_forwarded_for_clients_send(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("loc")
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    for n in range(8):
        post_with_forwarded_for(proxy.url, bytes([ord("a") + n]) * HUGE)
    answer = proxy.http.get("/api/requests")
    assert answer.status_code == 200
    # Eight small requests: their records are a few kilobytes, not eight megabytes.
    assert len(answer.content) < 64 * 1024, f"/api/requests is {len(answer.content):,} bytes for 8 requests"


def test_an_upstream_error_code_is_kept_as_briefly_as_its_message(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("loc")
    up.fake.default(
        Reply(
            "error",
            status=400,
            body={"error": {"message": "bad", "type": "invalid_request_error", "code": CODE}},
        )
    )
    proxy = launch(provider("loc", "local", up.url, "loc-1"))

    answer = proxy.chat("loc/m1")
    assert answer.status_code == 400  # relayed as it came: that part is the client's business

    records = proxy.http.get("/api/requests").json()["requests"]
    assert len(records) == 1
    code = records[0]["code"]
    assert code is not None
    # The message beside it is cut to 200 characters; the code must not be kept whole either.
    assert len(code) <= 200, f"the record keeps an upstream error code of {len(code):,} characters"


def test_request_records_stay_small_whatever_the_upstream_error_code(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("loc")
    up.fake.default(Reply("error", status=400, body={"error": {"message": "bad", "code": CODE}}))
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    for _ in range(5):
        assert proxy.chat("loc/m1").status_code == 400
    answer = proxy.http.get("/api/requests")
    assert len(answer.json()["requests"]) == 5
    assert len(answer.content) < 64 * 1024, f"/api/requests is {len(answer.content):,} bytes for 5 requests"
