"""A scriptable fake OpenAI-compatible upstream: a Starlette app that answers, fails or misbehaves on cue.

Serve it with `tests.fakes.server.LiveServer` (base_url = `server.url + "/v1"`). The replies that drop
a connection ("reset", "stream_die", and hangs ended by `reset()`) use the transport LiveServer puts
in the scope, because ASGI itself cannot close a connection without answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import itertools
import json
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.fakes import dialects
from tests.fakes.server import TRANSPORT_SCOPE_KEY

__all__ = ["FakeUpstream", "RecordedRequest", "Reply", "ReplyKind"]

ReplyKind = Literal[
    "json",
    "error",
    "reset",
    "hang",
    "stream",
    "stream_die",
    "stream_error",
    "stream_pings",
    "slow_headers",
    "reset_after_headers",
    "drip",
    "invalid_json",
    "big",
]


@dataclass(frozen=True)
class Reply:
    """What the fake does for one request.

    - json: a valid completion for the endpoint (or `body`, if given), with `status` and `headers`;
      with a status >= 400 and no body, the default error body instead.
    - error: `status`, `headers` and `body` (default: an OpenAI-style error JSON). A str body is sent
      as text/plain unless `headers` set a content-type.
    - reset: the TCP connection is reset (RST) without any HTTP response.
    - hang: never answers; ends when the client disconnects, or with a reset on `FakeUpstream.reset()`.
    - slow_headers: waits `delay_ms`, then answers like json.
    - stream: SSE of `chunks` chat.completion.chunk events (delta.content = `chunk_text`), `delay_ms`
      apart, then a finish_reason "stop" chunk, a usage chunk when the request asked for
      `stream_options.include_usage`, and `data: [DONE]`.
    - stream_die: like stream, but the connection is closed after `die_after` chunks (truncated body).
    - stream_error: like stream_die, but after `die_after` text deltas (0: before any content) the
      stream sends its API's `error` event (`body`, else one for `status`: 529 is Anthropic's
      overloaded_error) and ends. On /v1/chat/completions the event is `data: {"error": ...}`.
    - stream_pings: SSE that only sends `: ping` comments every `delay_ms` (1 s when 0), forever.
    - reset_after_headers: a 200 with the headers of the answer the request asked for (SSE when it
      has `"stream": true`, else JSON), then a TCP reset before any byte of the body.
    - drip: the answer the request asked for (the `chunks`-event SSE stream, or the JSON completion),
      sent `drip_bytes` at a time, `delay_ms` apart: a slow but healthy upstream. With a `status` of
      400 or more, the default error body for it, as JSON, the same way.
    - invalid_json: a 200 `application/json` whose body is not JSON.
    - big: a 200 JSON completion whose message content is `size` bytes (default 5 MiB).
    """

    kind: ReplyKind
    status: int = 200
    body: str | dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    chunks: int = 5
    chunk_text: str = "hi"
    delay_ms: float = 0
    die_after: int = 2
    drip_bytes: int = 1
    size: int = 5 * 1024 * 1024


JSON_OK = Reply("json")

_GENERATION_KEY = "tests.fakes.generation"  # the reset() generation a request arrived in


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    json: Any  # the parsed body; None when empty or not JSON
    time: float  # time.monotonic() at arrival
    body: bytes = b""


class FakeUpstream:
    """An OpenAI-compatible server whose replies tests script.

    It also speaks Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) and OpenAI's
    Responses API (`/v1/responses`, whose responses it keeps in `responses` so that GET, DELETE and
    `/cancel` on `/v1/responses/{id}` find them; another fake answers 404 for them), in their own
    bodies, events and error shapes (tests/fakes/dialects.py).

    Each completion request gets, in order of precedence: the `by_model` rule for its model, the next
    `script`ed reply (FIFO, consumed), or the `default` (initially a json 200). GET /v1/models always
    lists `models`. Every request, unknown paths included, is recorded in `requests`.
    """

    def __init__(self, name: str = "fake", models: Sequence[str] = ("m1", "m2")) -> None:
        self.name = name
        self.models = tuple(models)
        self.requests: list[RecordedRequest] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.models_delay_ms = 0.0
        """How long GET /v1/models takes to answer (to hold a listing in flight while others arrive)."""
        self.chooser: Callable[[str | None], Reply] | None = None
        """When set, picks the reply of every completion request without a `by_model` rule (ahead of
        the script and the default): endless random faults for a soak. Called under a lock."""
        self.recording = True
        """False: `requests` stays empty (a long soak would otherwise keep every request it sent)."""
        self._lock = threading.Lock()  # tests script from their thread while the server thread picks
        self._queue: deque[Reply] = deque()
        self._by_model: dict[str, Reply] = {}
        self._default = JSON_OK
        self._release = _Release()
        self._ids = itertools.count(1)
        self.responses: dict[str, dict[str, Any]] = {}
        """Responses API objects this fake created, by id."""
        routes = [
            Route("/v1/chat/completions", self._complete, methods=["POST"]),
            Route("/v1/completions", self._complete, methods=["POST"]),
            Route("/v1/embeddings", self._complete, methods=["POST"]),
            Route("/v1/messages", self._complete, methods=["POST"]),
            Route("/v1/messages/count_tokens", self._complete, methods=["POST"]),
            Route("/v1/responses", self._complete, methods=["POST"]),
            Route("/v1/responses/{ident}", self._response, methods=["GET", "DELETE"]),
            Route("/v1/responses/{ident}/cancel", self._response, methods=["POST"]),
            Route("/v1/models", self._list_models, methods=["GET"]),
            Route("/{path:path}", self._not_found, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
        ]
        self.app = Starlette(routes=routes, middleware=[Middleware(_CountInFlight, upstream=self)])

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._queue.extend(replies)

    def default(self, reply: Reply) -> None:
        with self._lock:
            self._default = reply

    def burst(self, count: int, status: int = 502) -> None:
        """Script `count` consecutive error answers with `status` (a 502 burst by default)."""
        self.script(*(Reply("error", status=status) for _ in range(count)))

    def by_model(self, model: str, reply: Reply) -> None:
        with self._lock:
            self._by_model[model] = reply

    def reset(self) -> None:
        """Forget script, rules and recordings, and cut (soon after, from the server's loop) every request
        still in flight that waits or streams: hang, slow_headers and all stream kinds."""
        with self._lock:
            self._queue.clear()
            self._by_model.clear()
            self._default = JSON_OK
            self.requests.clear()
            self.max_in_flight = self.in_flight
        self._release.fire()

    @staticmethod
    def refused_url() -> str:
        """A base_url where nothing listens, so connecting is refused.

        The port was just free; on loopback the kernel does not hand it out again right away.
        """
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    def _pick(self, model: str | None) -> Reply:
        with self._lock:
            if model is not None and model in self._by_model:
                return self._by_model[model]
            if self.chooser is not None:
                return self.chooser(model)
            if self._queue:
                return self._queue.popleft()
            return self._default

    async def _record(self, request: Request) -> Any:
        raw = await request.body()
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = None
        if not self.recording:
            return payload
        headers = {name.lower(): value for name, value in request.headers.items()}
        self.requests.append(
            RecordedRequest(request.method, request.url.path, headers, payload, time.monotonic(), raw)
        )
        return payload

    async def _complete(self, request: Request) -> ASGIApp:
        payload = await self._record(request)
        model = payload.get("model") if isinstance(payload, dict) else None
        model = model if isinstance(model, str) else None
        reply = self._pick(model)
        if request.scope[_GENERATION_KEY] != self._release.generation:
            reply = Reply("reset")  # reset() came while we read the body: cut it like every request in flight
        call = _Call(
            request.url.path.removeprefix("/v1"),
            model or "",
            self.name,
            payload,
            next(self._ids),
            self.responses,
        )
        if reply.kind == "json":
            return _json_response(reply, call)
        if reply.kind == "error":
            body = reply.body if reply.body is not None else call.error(reply.status)
            return _body_response(body, reply)
        if reply.kind == "invalid_json":
            return Response(b'{"id": "broken", "choices": [{"mess', media_type="application/json")
        if reply.kind == "big":
            completion = call.completion()
            completion["choices"][0]["message"]["content"] = "x" * reply.size
            return JSONResponse(completion)
        return _Act(reply, call, self._release)

    async def _list_models(self, request: Request) -> Response:
        await self._record(request)
        if self.models_delay_ms:
            await asyncio.sleep(self.models_delay_ms / 1000)
        data = [{"id": m, "object": "model", "created": 0, "owned_by": self.name} for m in self.models]
        return JSONResponse({"object": "list", "data": data})

    async def _response(self, request: Request) -> Response:
        """GET / DELETE /v1/responses/{id} and POST .../cancel, on the responses this fake created."""
        await self._record(request)
        ident = request.path_params["ident"]
        found = self.responses.get(ident)
        if found is None:
            body = _openai_error(404, self.name)
            body["error"]["message"] = f"{self.name}: no response {ident!r}"
            return JSONResponse(body, status_code=404)
        if request.method == "DELETE":
            del self.responses[ident]
            return JSONResponse({"id": ident, "object": "response", "deleted": True})
        if request.url.path.endswith("/cancel"):
            found = found | {"status": "cancelled"}
            self.responses[ident] = found
        return JSONResponse(found)

    async def _not_found(self, request: Request) -> Response:
        await self._record(request)
        return JSONResponse(_openai_error(404, self.name), status_code=404)


class _CountInFlight:
    """Counts requests whose response is still being played (streams included), for semaphore tests."""

    def __init__(self, app: ASGIApp, upstream: FakeUpstream) -> None:
        self.app = app
        self.upstream = upstream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        upstream = self.upstream
        scope[_GENERATION_KEY] = upstream._release.generation
        upstream.in_flight += 1
        upstream.max_in_flight = max(upstream.max_in_flight, upstream.in_flight)
        counted = True

        def finish() -> None:
            nonlocal counted
            if counted:
                counted = False
                upstream.in_flight -= 1

        async def send_counting(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                finish()  # before the last bytes leave: a client holding the whole response sees 0
            await send(message)

        try:
            await self.app(scope, receive, send_counting)
        finally:
            finish()


class _Release:
    """Lets `FakeUpstream.reset()` (any thread) end every request that was in flight when it was called.

    Requests note the generation they arrived in; a reset bumps it, so one that starts waiting only
    after the reset still sees it (no lost wake-up).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generation = 0
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    @property
    def generation(self) -> int:
        return self._generation

    async def wait(self, since: int) -> None:
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            if self._generation != since:
                return
            self._waiters.add(waiter)
        try:
            await waiter[1].wait()
        finally:
            with self._lock:
                self._waiters.discard(waiter)

    def fire(self) -> None:
        with self._lock:
            self._generation += 1
            waiters = list(self._waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits there any more
                loop.call_soon_threadsafe(event.set)


@dataclass(frozen=True)
class _Call:
    """One completion request, enough to build its answer."""

    endpoint: str  # "/chat/completions", "/completions" or "/embeddings"
    model: str
    upstream: str
    payload: Any
    seq: int
    responses: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False)

    @property
    def wants_stream(self) -> bool:
        return isinstance(self.payload, dict) and self.payload.get("stream") is True

    @property
    def ident(self) -> str:
        prefix = "msg" if self.endpoint == dialects.MESSAGES else "resp"
        return f"{prefix}_{self.upstream}_{self.seq}"

    @property
    def text(self) -> str:
        return f"hello from {self.upstream}"

    def error(self, status: int) -> dict[str, Any]:
        if self.endpoint.startswith(dialects.MESSAGES):
            return dialects.anthropic_error(status, self.upstream)
        return _openai_error(status, self.upstream)

    def completion(self) -> dict[str, Any]:
        if self.endpoint == dialects.MESSAGES:
            return dialects.message(self.ident, self.model, self.text)
        if self.endpoint == dialects.COUNT_TOKENS:
            return {"input_tokens": 7}
        if self.endpoint == dialects.RESPONSES:
            created = dialects.response(self.ident, self.model, self.text)
            self.responses[self.ident] = created
            return created
        created = int(time.time())
        usage = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
        text = f"hello from {self.upstream}"
        if self.endpoint == "/embeddings":
            raw = self.payload.get("input", "") if isinstance(self.payload, dict) else ""
            inputs = raw if isinstance(raw, list) else [raw]
            data = [
                {"object": "embedding", "index": i, "embedding": [0.1, 0.2, 0.3]} for i in range(len(inputs))
            ]
            usage = {"prompt_tokens": 5, "total_tokens": 5}
            return {"object": "list", "data": data, "model": self.model, "usage": usage}
        if self.endpoint == "/completions":
            choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}
            return self._envelope("cmpl", "text_completion", created, choice) | {"usage": usage}
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
        return self._envelope("chatcmpl", "chat.completion", created, choice) | {"usage": usage}

    def chunk(self, text: str | None, *, first: bool) -> bytes:
        """One SSE event; `text=None` makes the closing chunk (finish_reason "stop")."""
        if self.endpoint in dialects.DIALECTS:
            opening = self.opening() + dialects.first_content(self.endpoint, self.ident) if first else b""
            if text is None:
                return opening
            return opening + dialects.delta(self.endpoint, self.ident, text)
        finish = None if text is not None else "stop"
        if self.endpoint == "/completions":
            choice: dict[str, Any] = {"index": 0, "text": text or "", "finish_reason": finish}
            event = self._envelope("cmpl", "text_completion", int(time.time()), choice)
        else:
            delta: dict[str, str] = {} if text is None else {"content": text}
            if first and text is not None:
                delta = {"role": "assistant"} | delta
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            event = self._envelope("chatcmpl", "chat.completion.chunk", int(time.time()), choice)
        return b"data: " + json.dumps(event).encode() + b"\n\n"

    def opening(self) -> bytes:
        """What a Messages or Responses stream sends before any content (empty for chat)."""
        if self.endpoint not in dialects.DIALECTS:
            return b""
        if self.endpoint == dialects.RESPONSES:
            self.responses[self.ident] = dialects.response(self.ident, self.model, self.text)
        return dialects.head(self.endpoint, self.ident, self.model)

    def ending(self, chunks: int, chunk_text: str) -> bytes:
        """The stream's normal end after `chunks` deltas (chat: the finish chunk and `[DONE]`)."""
        if self.endpoint in dialects.DIALECTS:
            opening = self.chunk(None, first=True) if chunks == 0 else b""
            return opening + dialects.tail(self.endpoint, self.ident, self.model, chunk_text * chunks)
        return self.chunk(None, first=chunks == 0) + self.usage_chunk() + b"data: [DONE]\n\n"

    def error_event(self, status: int, body: Any) -> bytes:
        if self.endpoint in dialects.DIALECTS:
            return dialects.error_event(self.endpoint, status, self.upstream, body)
        return b"data: " + json.dumps(body if body is not None else self.error(status)).encode() + b"\n\n"

    def usage_chunk(self) -> bytes:
        """The final usage event, as OpenAI sends it when the client asked for
        `stream_options.include_usage` (nothing otherwise)."""
        options = self.payload.get("stream_options") if isinstance(self.payload, dict) else None
        if not (isinstance(options, dict) and options.get("include_usage") is True):
            return b""
        usage = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
        event = {"id": f"chatcmpl-{self.upstream}-{self.seq}", "object": "chat.completion.chunk"}
        return b"data: " + json.dumps(event | {"choices": [], "usage": usage}).encode() + b"\n\n"

    def _envelope(self, prefix: str, obj: str, created: int, choice: dict[str, Any]) -> dict[str, Any]:
        ident = f"{prefix}-{self.upstream}-{self.seq}"
        return {"id": ident, "object": obj, "created": created, "model": self.model, "choices": [choice]}


def _openai_error(status: int, upstream: str) -> dict[str, Any]:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    kind, code = {
        401: ("invalid_request_error", "invalid_api_key"),
        404: ("invalid_request_error", "model_not_found"),
        429: ("requests", "rate_limit_exceeded"),
    }.get(status, ("server_error" if status >= 500 else "invalid_request_error", None))
    message = f"{upstream}: {status} {phrase}"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _body_response(body: str | dict[str, Any], reply: Reply) -> Response:
    if isinstance(body, str):
        return Response(body, status_code=reply.status, headers=reply.headers, media_type="text/plain")
    return JSONResponse(body, status_code=reply.status, headers=reply.headers)


def _json_response(reply: Reply, call: _Call) -> Response:
    if reply.body is not None:
        return _body_response(reply.body, reply)
    # A success body under an error status would be a confusing fake: fail like a real server.
    body = call.completion() if reply.status < 400 else call.error(reply.status)
    return _body_response(body, reply)


class _Act:
    """Plays the replies a finished Response cannot express: delays, streams and dropped connections."""

    def __init__(self, reply: Reply, call: _Call, release: _Release) -> None:
        self.reply = reply
        self.call = call
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        reply = self.reply
        if reply.kind == "reset":
            await _drop(scope, receive, reset=True)
        elif reply.kind == "reset_after_headers":
            await send({"type": "http.response.start", "status": 200, "headers": self._headers()})
            await _drop(scope, receive, reset=True)
        elif reply.kind == "drip":
            await send({"type": "http.response.start", "status": reply.status, "headers": self._headers()})
            if await _race(scope, receive, self.release, self._drip(send)) == "released":
                await _drop(scope, receive, reset=False)
        elif reply.kind in ("hang", "slow_headers"):
            pause = asyncio.sleep(reply.delay_ms / 1000) if reply.kind == "slow_headers" else None
            outcome = await _race(scope, receive, self.release, pause)
            if outcome == "done":
                await _json_response(reply, self.call)(scope, receive, send)
            elif outcome == "released":
                await _drop(scope, receive, reset=True)
        else:
            headers = {"content-type": "text/event-stream", "cache-control": "no-cache"} | reply.headers
            raw_headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
            status = 200 if reply.kind == "stream_error" else reply.status  # the event carries the error
            await send({"type": "http.response.start", "status": status, "headers": raw_headers})
            outcome = await _race(scope, receive, self.release, self._stream(send))
            if outcome == "released" or (outcome == "done" and reply.kind == "stream_die"):
                await _drop(scope, receive, reset=False)

    def _headers(self) -> list[tuple[bytes, bytes]]:
        streamed = self.call.wants_stream and self.reply.status < 400
        kind = b"text/event-stream" if streamed else b"application/json"
        return [
            (b"content-type", kind),
            *((k.lower().encode(), v.encode()) for k, v in self.reply.headers.items()),
        ]

    async def _drip(self, send: Send) -> None:
        reply, call = self.reply, self.call
        if reply.status >= 400:
            body = json.dumps(call.error(reply.status)).encode()
        elif call.wants_stream:
            events = [call.chunk(reply.chunk_text, first=i == 0) for i in range(reply.chunks)]
            body = b"".join(events) + call.ending(reply.chunks, reply.chunk_text)
        else:
            body = json.dumps(call.completion()).encode()
        step = max(1, reply.drip_bytes)
        for start in range(0, len(body), step):
            if start:
                await asyncio.sleep(reply.delay_ms / 1000)
            await send({"type": "http.response.body", "body": body[start : start + step], "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _stream(self, send: Send) -> None:
        reply, call = self.reply, self.call
        delay = reply.delay_ms / 1000
        if reply.kind == "stream_pings":
            while True:
                await asyncio.sleep(delay or 1.0)
                await send({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})
        count = reply.die_after if reply.kind in ("stream_die", "stream_error") else reply.chunks
        for i in range(count):
            if i:
                await asyncio.sleep(delay)
            event = call.chunk(reply.chunk_text, first=i == 0)
            await send({"type": "http.response.body", "body": event, "more_body": True})
        if reply.kind == "stream":
            tail = call.ending(count, reply.chunk_text)
            await send({"type": "http.response.body", "body": tail, "more_body": False})
        elif reply.kind == "stream_error":
            opening = call.opening() if count == 0 else b""
            status = reply.status if reply.status >= 400 else 529
            event = opening + call.error_event(status, reply.body)
            await send({"type": "http.response.body", "body": event, "more_body": False})


Outcome = Literal["done", "disconnected", "released"]


async def _race(scope: Scope, receive: Receive, release: _Release, work: Awaitable[None] | None) -> Outcome:
    """Wait for `work`, the client's disconnect or `FakeUpstream.reset()`, whichever comes first."""
    disconnect = asyncio.ensure_future(_until_disconnect(receive))
    released = asyncio.ensure_future(release.wait(since=scope[_GENERATION_KEY]))
    worker = asyncio.ensure_future(work) if work is not None else None
    tasks = [t for t in (disconnect, released, worker) if t is not None]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if worker is not None and worker.done() and not worker.cancelled():
        worker.result()  # a bug in the fake must surface, not pass as a disconnect
        return "done"
    return "disconnected" if disconnect.done() and not disconnect.cancelled() else "released"


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _drop(scope: Scope, receive: Receive, *, reset: bool) -> None:
    """Drop the connection mid-exchange: an RST when `reset`, else an orderly close (FIN)."""
    transport = scope.get(TRANSPORT_SCOPE_KEY)
    if transport is None:
        raise RuntimeError("dropping a connection needs the app served by tests.fakes.server.LiveServer")
    if reset:
        # SO_LINGER with a zero timeout makes close() send RST instead of FIN.
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    else:
        transport.close()
    # Returning only once uvicorn saw the disconnect keeps it from logging a "response not started" error.
    await _until_disconnect(receive)
