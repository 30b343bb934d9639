"""A client that goes away stops costing anything, on the single-attempt routes of the passed-through
APIs too: `POST /v1/messages/count_tokens` and the Responses follow-ups (`GET /v1/responses/{id}`).

docs/apis.md#routes: the single-attempt routes end as the others do when their client goes away
(the upstream call is cancelled). The chat-like routes get this from the pipeline's client watch (tests/integration/test_disconnect.py); these routes are answered by
proxy/passthrough.py, outside it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes import LiveServer, Reply, dialects
from tests.integration.test_apis import claude, codex
from tests.integration.test_proxy import Proxy, Upstream, wait_until


def _post_and_leave(proxy: Proxy, path: str, body: dict[str, object]) -> socket.socket:
    host, port = proxy.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    data = json.dumps(body).encode()
    sock.sendall(
        (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        ).encode()
        + data
    )
    return sock


def test_a_client_gone_during_count_tokens_cancels_the_upstream_call(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("claude-up")
    proxy = launch(claude("claude", up.url, "key-a"))
    up.fake.by_model("slow", Reply("hang"))
    sock = _post_and_leave(
        proxy,
        "/v1/messages/count_tokens",
        {"model": "claude/slow", "messages": [{"role": "user", "content": "hi"}]},
    )
    wait_until(lambda: up.fake.in_flight == 1, what="the count reaching the upstream")
    sock.close()
    # The same wait that test_disconnect.py gives the chat routes: the upstream sees its client go.
    deadline = time.monotonic() + 5
    while up.fake.in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    assert up.fake.in_flight == 0, "the count_tokens call is still upstream after its client went away"


def test_a_client_gone_during_a_response_retrieve_cancels_the_upstream_call(
    launch: Callable[..., Proxy],
) -> None:
    """An upstream whose retrieve route answers only when its client is gone (as a slow one would)."""
    waiting: list[str] = []
    gone: list[str] = []

    async def create(request: Request) -> Response:
        await request.body()
        return JSONResponse(dialects.response("resp_slow", "m1", "hi"))

    async def retrieve(request: Request) -> Response:
        waiting.append(request.path_params["ident"])
        while not await request.is_disconnected():
            await asyncio.sleep(0.02)
        gone.append(request.path_params["ident"])
        return Response(status_code=499)

    app = Starlette(
        routes=[
            Route("/v1/responses", create, methods=["POST"]),
            Route("/v1/responses/{ident}", retrieve, methods=["GET"]),
        ]
    )
    server = LiveServer(app).start()
    try:
        proxy = launch(codex("codex", server.url + "/v1", "key-a"))
        assert (
            proxy.http.post("/v1/responses", json={"model": "codex/m1", "input": "hi"}).json()["id"]
            == "resp_slow"
        )
        host, port = proxy.url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(f"GET /v1/responses/resp_slow HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        wait_until(lambda: waiting == ["resp_slow"], what="the retrieve reaching the upstream")
        sock.close()
        deadline = time.monotonic() + 5
        while not gone and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone == ["resp_slow"], "the retrieve is still upstream after its client went away"
    finally:
        server.stop()
