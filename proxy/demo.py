"""`--demo`: the real proxy against simulated upstreams on loopback ports, with a trickle of traffic.

A newcomer sees every resilience layer move within a minute, without any LLM installed:

- `healthy` (local): always 200, 20-80 ms.
- `flaky` (local): fails in bursts (mostly 503 for 20 s, then 200 for 25 s), so its breaker goes
  DEGRADED -> OPEN -> HALF_OPEN -> CLOSED, and the `demo` combo falls back to `healthy` meanwhile.
- `ratelimited` (apikey, two keys): every third request gets 429 `Retry-After: 5`, so its
  connections cool down and take turns.
- `models` (local): serves `llama3`, answers 404 `model_not_found` for anything else, so
  `models/missing-model` gets a model lockout (model lockout is enabled in the demo).
- `twokeys` (apikey): the key of `twokeys-dead` gets 401 (-> `expired`), `twokeys-live` serves.
- `claude` (apikey, two keys, `apis = ["messages"]`, `auth = "x-api-key"`): Anthropic's Messages
  API, as Claude Code uses it; every fourth request gets 529 `overloaded_error`, so a key cools
  and the other one serves.

Each upstream is a uvicorn server task in the caller's event loop; `demo_environment` writes a config
that points at them, and `DemoTraffic` sends the requests. The demo's state lives in a temporary
directory chosen by the caller (`proxy.serve.instance`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import socket
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from proxy.config import Config, load_config
from proxy.settings import Settings

__all__ = [
    "DEFAULT_FLAKY_SCHEDULE",
    "DEMO_KEYS",
    "DEMO_PORT",
    "DEMO_RESILIENCE_PATCH",
    "DEMO_SETTINGS_PATCH",
    "UPSTREAM_KINDS",
    "DemoTraffic",
    "FlakySchedule",
    "apply_demo_settings",
    "demo_config_text",
    "demo_environment",
    "demo_upstream_app",
]

UPSTREAM_KINDS = ("healthy", "flaky", "ratelimited", "models", "twokeys", "claude")
DEMO_PORT = 20128

# Fake inline keys: the upstreams decide by the `Authorization: Bearer <key>` the proxy sends.
DEMO_KEYS: Mapping[str, str] = {
    "ratelimited-a": "sk-demo-ratelimited-a-5f1c",
    "ratelimited-b": "sk-demo-ratelimited-b-9d2e",
    "twokeys-dead": "sk-demo-twokeys-dead-0000",
    "twokeys-live": "sk-demo-twokeys-live-7a3b",
    "claude-a": "sk-demo-claude-a-3e8f",
    "claude-b": "sk-demo-claude-b-c41d",
}
_DEAD_KEY = DEMO_KEYS["twokeys-dead"]

# The model lists each simulated upstream answers on /v1/models. Only `models` refuses the others.
_MODELS: Mapping[str, tuple[str, ...]] = {
    "healthy": ("llama3", "nomic-embed-text"),
    "flaky": ("llama3",),
    "ratelimited": ("gpt-4o-mini",),
    "models": ("llama3",),
    "twokeys": ("gpt-4o-mini",),
    "claude": ("claude-sonnet",),
}

RATE_LIMIT_EVERY = 3
"""`ratelimited` answers 429 to every third request it receives (whichever key sent it)."""
RATE_LIMIT_RETRY_AFTER_S = 5
OVERLOAD_EVERY = 4
"""`claude` answers 529 `overloaded_error` to every fourth Messages request it receives."""

DEMO_SETTINGS_PATCH: dict[str, Any] = {
    # Only 404 locks a model: the default list also holds 503, which would lock `flaky/llama3` for
    # minutes and hide the breaker's recovery behind a lockout. Short lockouts are seen expiring.
    "modelLockout": {"enabled": True, "errorCodes": [404], "baseCooldownMs": 20_000, "maxCooldownMs": 120_000}
}
"""Applied to the settings group "settings" when the demo starts."""
DEMO_RESILIENCE_PATCH: dict[str, Any] = {
    # A demo client should not be held for the default 90 s while everything cools down; but it
    # does wait out `ratelimited`'s 5 s Retry-After when both keys cool, so the Requests tab
    # shows waits too.
    "comboCooldownWait": {"maxWaitMs": 6000, "budgetMs": 12000}
}
"""Applied to the settings group "resilience" when the demo starts."""


def apply_demo_settings(settings: Settings) -> None:
    """Switch the live settings to the demo's (model lockout on, short cooldown waits)."""
    settings.patch(DEMO_SETTINGS_PATCH, "settings")
    settings.patch(DEMO_RESILIENCE_PATCH, "resilience")


@dataclass(frozen=True, slots=True)
class FlakySchedule:
    """When `flaky` fails: healthy for `lead_s`, then `bad_s` of failures and `good_s` of 200s, repeated."""

    bad_s: float = 20.0
    good_s: float = 25.0
    lead_s: float = 5.0
    """Healthy at first, so the breaker is seen CLOSED before it degrades."""
    bad_ratio: float = 0.9
    """Share of requests answered 503 during a bad phase (1.0: all of them, for tests)."""

    def is_bad(self, elapsed_s: float) -> bool:
        if elapsed_s < self.lead_s:
            return False
        return (elapsed_s - self.lead_s) % (self.bad_s + self.good_s) < self.bad_s


DEFAULT_FLAKY_SCHEDULE = FlakySchedule()
"""What `demo_environment` uses when given no schedule (tests may replace it for a faster cycle)."""


# --- the simulated upstreams ----------------------------------------------------------------------


def _error(
    status: int, message: str, err_type: str, code: str, headers: Mapping[str, str] | None = None
) -> Response:
    body = {"error": {"message": message, "type": err_type, "code": code}}
    return JSONResponse(body, status_code=status, headers=dict(headers) if headers else None)


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


class _Upstream:
    """The behaviour of one simulated upstream; the HTTP plumbing is shared by every kind."""

    def __init__(self, kind: str, schedule: FlakySchedule, seed: int | None) -> None:
        if kind not in _MODELS:
            raise ValueError(f"unknown demo upstream kind {kind!r} (known: {', '.join(UPSTREAM_KINDS)})")
        self.kind = kind
        self.schedule = schedule
        self.rng = random.Random(seed)
        self.started = time.monotonic()
        self.requests = 0
        self.ids = itertools.count(1)

    def refusal(self, request: Request, model: str) -> Response | None:
        """The error this upstream answers instead of serving, if any (decided before any latency)."""
        kind = self.kind
        if kind == "flaky":
            elapsed = time.monotonic() - self.started
            if self.schedule.is_bad(elapsed) and self.rng.random() < self.schedule.bad_ratio:
                return _error(503, "the model server is overloaded", "server_error", "service_unavailable")
        elif kind == "ratelimited":
            key = _bearer(request)
            if key is None:
                return _error(401, "no api key provided", "invalid_request_error", "invalid_api_key")
            # One counter for both keys: the request after a 429 (the proxy's fallback to the other
            # key) is served, so one key cools while the other carries the traffic.
            self.requests += 1
            if self.requests % RATE_LIMIT_EVERY == 0:
                return _error(
                    429,
                    "Rate limit reached for requests on this key.",
                    "requests",
                    "rate_limit_exceeded",
                    {"Retry-After": str(RATE_LIMIT_RETRY_AFTER_S)},
                )
        elif kind == "models":
            if model not in _MODELS[kind]:
                return _error(
                    404, f"The model `{model}` does not exist", "invalid_request_error", "model_not_found"
                )
        elif kind == "twokeys":
            key = _bearer(request)
            if key is None or key == _DEAD_KEY or not key.startswith("sk-demo-"):
                message = "Incorrect API key provided: invalid api key"
                return _error(401, message, "invalid_request_error", "invalid_api_key")
        return None

    async def latency(self) -> None:
        await asyncio.sleep(self.rng.uniform(0.02, 0.08))

    def reply_text(self, model: str) -> str:
        return f"Hello from the {self.kind} demo upstream, speaking as {model}."

    def completion(self, model: str, text: str) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-demo-{self.kind}-{next(self.ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": {
                "prompt_tokens": 8,
                "completion_tokens": len(text.split()),
                "total_tokens": 8 + len(text.split()),
            },
        }

    async def stream(self, model: str, text: str, *, usage: bool = False) -> AsyncIterator[bytes]:
        ident = f"chatcmpl-demo-{self.kind}-{next(self.ids)}"
        created = int(time.time())

        def chunk(delta: dict[str, str], finish: str | None) -> bytes:
            event = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return f"data: {json.dumps(event)}\n\n".encode()

        yield chunk({"role": "assistant"}, None)
        for i, word in enumerate(text.split()):
            await asyncio.sleep(0.02)
            yield chunk({"content": word if i == 0 else " " + word}, None)
        yield chunk({}, "stop")
        if usage:  # asked for with stream_options.include_usage, as OpenAI does
            counts = self.completion(model, text)["usage"]
            yield f"data: {json.dumps({'id': ident, 'object': 'chat.completion.chunk', 'choices': [], 'usage': counts})}\n\n".encode()
        yield b"data: [DONE]\n\n"

    def message(self, model: str, text: str) -> dict[str, Any]:
        return {
            "id": f"msg_demo_{next(self.ids)}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 8, "output_tokens": len(text.split())},
        }

    async def message_stream(self, model: str, text: str) -> AsyncIterator[bytes]:
        def event(name: str, data: dict[str, Any]) -> bytes:
            return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()

        start = self.message(model, "") | {"content": [], "stop_reason": None}
        yield event("message_start", {"message": start})
        yield event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
        for i, word in enumerate(text.split()):
            await asyncio.sleep(0.02)
            delta = {"type": "text_delta", "text": word if i == 0 else " " + word}
            yield event("content_block_delta", {"index": 0, "delta": delta})
        yield event("content_block_stop", {"index": 0})
        usage = {"output_tokens": len(text.split())}
        yield event(
            "message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": usage}
        )
        yield event("message_stop", {})

    # -- routes ----------------------------------------------------------------------------------

    async def messages(self, request: Request) -> Response:
        """Anthropic's Messages API: the key as `x-api-key`, errors in Anthropic's shape."""
        body = await _json_object(request)
        if isinstance(body, Response):
            return body
        model = str(body.get("model", ""))
        if not request.headers.get("x-api-key", "").startswith("sk-demo-"):
            return _anthropic_error(401, "authentication_error", "invalid x-api-key")
        self.requests += 1
        if self.requests % OVERLOAD_EVERY == 0:
            return _anthropic_error(529, "overloaded_error", "Overloaded")
        await self.latency()
        text = self.reply_text(model)
        if body.get("stream") is True:
            return StreamingResponse(self.message_stream(model, text), media_type="text/event-stream")
        return JSONResponse(self.message(model, text))

    async def chat(self, request: Request) -> Response:
        body = await _json_object(request)
        if isinstance(body, Response):
            return body
        model = str(body.get("model", ""))
        refusal = self.refusal(request, model)
        if refusal is not None:
            return refusal
        await self.latency()
        text = self.reply_text(model)
        if body.get("stream") is True:
            options = body.get("stream_options")
            usage = isinstance(options, dict) and options.get("include_usage") is True
            return StreamingResponse(self.stream(model, text, usage=usage), media_type="text/event-stream")
        return JSONResponse(self.completion(model, text))

    async def completions(self, request: Request) -> Response:
        body = await _json_object(request)
        if isinstance(body, Response):
            return body
        model = str(body.get("model", ""))
        refusal = self.refusal(request, model)
        if refusal is not None:
            return refusal
        await self.latency()
        text = self.reply_text(model)
        return JSONResponse(
            {
                "id": f"cmpl-demo-{self.kind}-{next(self.ids)}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
            }
        )

    async def embeddings(self, request: Request) -> Response:
        body = await _json_object(request)
        if isinstance(body, Response):
            return body
        model = str(body.get("model", ""))
        refusal = self.refusal(request, model)
        if refusal is not None:
            return refusal
        await self.latency()
        raw = body.get("input", "")
        inputs = raw if isinstance(raw, list) else [raw]
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": [round(self.rng.uniform(-1, 1), 4) for _ in range(8)],
            }
            for i in range(len(inputs))
        ]
        return JSONResponse(
            {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": 4, "total_tokens": 4}}
        )

    async def models(self, request: Request) -> Response:
        # Open without a key (as several local servers are), so the proxy's /v1/models lists every upstream.
        data = [{"id": m, "object": "model", "created": 0, "owned_by": self.kind} for m in _MODELS[self.kind]]
        return JSONResponse({"object": "list", "data": data})


def _anthropic_error(status: int, kind: str, message: str) -> Response:
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status)


async def _json_object(request: Request) -> dict[str, Any] | Response:
    try:
        body = json.loads(await request.body())
    except ValueError:
        return _error(400, "request body is not valid JSON", "invalid_request_error", "invalid_json")
    if not isinstance(body, dict):
        return _error(400, "request body must be a JSON object", "invalid_request_error", "invalid_request")
    return body


def demo_upstream_app(
    kind: str, *, flaky_schedule: FlakySchedule | None = None, seed: int | None = None
) -> ASGIApp:
    """The Starlette app of one simulated upstream (`kind` is one of `UPSTREAM_KINDS`)."""
    upstream = _Upstream(kind, flaky_schedule or DEFAULT_FLAKY_SCHEDULE, seed)
    return Starlette(
        routes=[
            Route("/v1/chat/completions", upstream.chat, methods=["POST"]),
            Route("/v1/completions", upstream.completions, methods=["POST"]),
            Route("/v1/embeddings", upstream.embeddings, methods=["POST"]),
            Route("/v1/models", upstream.models, methods=["GET"]),
            Route("/v1/messages", upstream.messages, methods=["POST"]),
        ]
    )


# --- running them ---------------------------------------------------------------------------------


class _UpstreamServer(uvicorn.Server):
    """A uvicorn server that leaves SIGINT/SIGTERM alone.

    Several servers share the loop; if each captured the signals, their handlers would be restored
    out of order on shutdown. The proxy's own server handles the signals and the demo stops after it.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass(slots=True)
class _Running:
    server: uvicorn.Server
    task: asyncio.Task[None]
    sock: socket.socket
    port: int = field(init=False)

    def __post_init__(self) -> None:
        self.port = int(self.sock.getsockname()[1])


UPSTREAM_START_TIMEOUT_S = 10.0


async def _start_upstream(app: ASGIApp, kind: str) -> _Running:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        log_config=None,
        timeout_graceful_shutdown=1,
    )
    server = _UpstreamServer(config)
    running = _Running(server, asyncio.create_task(server.serve(sockets=[sock]), name=f"demo-{kind}"), sock)
    try:
        async with asyncio.timeout(UPSTREAM_START_TIMEOUT_S):
            while not server.started:
                if running.task.done():
                    await running.task  # raises the startup error, if it has one
                    raise RuntimeError(f"demo upstream {kind!r} stopped while starting")
                await asyncio.sleep(0.005)
    except BaseException:
        await _stop_upstreams([running])
        raise
    return running


async def _stop_upstreams(running: list[_Running]) -> None:
    for r in running:
        r.server.should_exit = True
    # The servers are gone when the demo is: their own failures at shutdown do not matter.
    await asyncio.gather(*(r.task for r in running), return_exceptions=True)
    for r in running:
        r.sock.close()


def demo_config_text(ports: Mapping[str, int], host: str = "127.0.0.1", port: int = DEMO_PORT) -> str:
    """The demo's config file: one provider per simulated upstream (`ports`: kind -> port)."""

    def url(kind: str) -> str:
        return json.dumps(f"http://127.0.0.1:{ports[kind]}/v1")

    k = {cid: json.dumps(key) for cid, key in DEMO_KEYS.items()}
    return f"""\
# omniroute --demo: simulated upstreams on loopback ports (written by proxy/demo.py).

[server]
host = {json.dumps(host)}
port = {port}
default_combo = "demo"
connect_timeout_ms = 2000
first_byte_timeout_ms = 15000
idle_timeout_ms = 15000

# Always answers 200 within 20-80 ms.
[providers.healthy]
class = "local"
base_url = {url("healthy")}

[[providers.healthy.connections]]
id = "healthy-1"

# Fails in bursts (mostly 503): its breaker degrades, opens, probes and closes again.
[providers.flaky]
class = "local"
base_url = {url("flaky")}

[[providers.flaky.connections]]
id = "flaky-1"

# Every third request of a key: 429 with Retry-After: 5 (connection cooldowns).
[providers.ratelimited]
class = "apikey"
base_url = {url("ratelimited")}

[[providers.ratelimited.connections]]
id = "ratelimited-a"
api_key = {k["ratelimited-a"]}

[[providers.ratelimited.connections]]
id = "ratelimited-b"
api_key = {k["ratelimited-b"]}

# Serves llama3; any other model is 404 model_not_found (model lockouts).
[providers.models]
class = "local"
base_url = {url("models")}

[[providers.models.connections]]
id = "models-1"

# The first key is dead (401: the connection becomes `expired`); the second one serves.
[providers.twokeys]
class = "apikey"
base_url = {url("twokeys")}

[[providers.twokeys.connections]]
id = "twokeys-dead"
api_key = {k["twokeys-dead"]}
priority = 1

[[providers.twokeys.connections]]
id = "twokeys-live"
api_key = {k["twokeys-live"]}
priority = 2

# Anthropic's Messages API (Claude Code's): every fourth request is 529 overloaded_error.
[providers.claude]
class = "apikey"
base_url = {url("claude")}
apis = ["messages"]
auth = "x-api-key"

[[providers.claude.connections]]
id = "claude-a"
api_key = {k["claude-a"]}

[[providers.claude.connections]]
id = "claude-b"
api_key = {k["claude-b"]}

# flaky first; healthy serves while flaky's breaker is open.
[combos.demo]
strategy = "priority"
targets = ["flaky/llama3", "healthy/llama3"]
"""


def _write_private(path: Path, text: str) -> None:
    # 0600 from the start: the file holds (fake) inline keys, and load_config warns about readable ones.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


@contextlib.asynccontextmanager
async def demo_environment(
    tmp: Path,
    *,
    host: str | None = None,
    port: int | None = None,
    flaky_schedule: FlakySchedule | None = None,
    seed: int | None = None,
) -> AsyncIterator[Config]:
    """Start every simulated upstream in the current event loop and yield the demo config.

    The config file is written into `tmp`; the proxy listens on `host`/`port` (default
    127.0.0.1:20128). The upstreams stop on exit. `flaky_schedule` defaults to
    `DEFAULT_FLAKY_SCHEDULE` (read at call time); `seed` makes the upstreams' randomness repeatable.
    """
    schedule = flaky_schedule or DEFAULT_FLAKY_SCHEDULE
    running: list[_Running] = []
    try:
        for i, kind in enumerate(UPSTREAM_KINDS):
            app = demo_upstream_app(kind, flaky_schedule=schedule, seed=None if seed is None else seed + i)
            running.append(await _start_upstream(app, kind))
        ports = {kind: r.port for kind, r in zip(UPSTREAM_KINDS, running, strict=True)}
        path = tmp / "demo-config.toml"
        _write_private(
            path, demo_config_text(ports, host if host is not None else "127.0.0.1", port or DEMO_PORT)
        )
        yield load_config(path, explicit=True)
    finally:
        await _stop_upstreams(running)


# --- client traffic -------------------------------------------------------------------------------

MAX_IN_FLIGHT = 8
REQUEST_TIMEOUT_S = 30.0

# (weight, endpoint, model, stream): every layer gets some traffic, the combo the most.
_MIX: tuple[tuple[int, str, str, bool], ...] = (
    (3, "chat/completions", "demo", False),
    (1, "chat/completions", "demo", True),
    (2, "chat/completions", "flaky/llama3", False),
    (2, "chat/completions", "ratelimited/gpt-4o-mini", False),
    (1, "chat/completions", "ratelimited/gpt-4o-mini", True),
    (1, "chat/completions", "models/missing-model", False),
    (2, "chat/completions", "models/llama3", False),
    (2, "chat/completions", "twokeys/gpt-4o-mini", False),
    (1, "chat/completions", "healthy/llama3", True),
    (1, "embeddings", "healthy/nomic-embed-text", False),
    (2, "messages", "claude/claude-sonnet", False),
    (1, "messages", "claude/claude-sonnet", True),
)
_MIX_WEIGHTS = [w for w, *_ in _MIX]


class DemoTraffic:
    """A trickle of client requests against the proxy at `base_url` (no `/v1` suffix).

    Runs as one task in the current loop; errors are expected and only counted, never raised.
    Never more than `MAX_IN_FLIGHT` requests are outstanding: a tick with no room is skipped.
    """

    def __init__(self, base_url: str, *, rate_per_s: float = 4.0, seed: int | None = None) -> None:
        if rate_per_s <= 0:
            raise ValueError("rate_per_s must be positive")
        self.base_url = base_url.rstrip("/")
        self.rate_per_s = rate_per_s
        self.sent = 0
        self.answered: dict[int, int] = {}
        """Responses by status."""
        self.served_by: dict[str, int] = {}
        """Successful responses by the provider that served them (`X-OmniRoute-Provider`)."""
        self.errors = 0
        """Requests that got no HTTP answer (proxy not up yet, timeouts)."""
        self._rng = random.Random(seed)
        self._task: asyncio.Task[None] | None = None
        self._in_flight: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="omniroute-demo-traffic")

    async def stop(self) -> None:
        """Stop sending, cancel what is in flight and close the client session."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
            connector=aiohttp.TCPConnector(limit=MAX_IN_FLIGHT),
        )
        interval = 1.0 / self.rate_per_s
        try:
            while True:
                await asyncio.sleep(interval * self._rng.uniform(0.5, 1.5))
                if len(self._in_flight) >= MAX_IN_FLIGHT:
                    continue
                _, endpoint, model, stream = self._rng.choices(_MIX, _MIX_WEIGHTS)[0]
                task = asyncio.create_task(self._send(session, endpoint, model, stream))
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)
        finally:
            pending = tuple(self._in_flight)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await session.close()

    async def _send(self, session: aiohttp.ClientSession, endpoint: str, model: str, stream: bool) -> None:
        if endpoint == "embeddings":
            payload: dict[str, Any] = {"model": model, "input": "the quick brown fox"}
        elif endpoint == "messages":
            payload = {
                "model": model,
                "max_tokens": 64,
                "messages": [{"role": "user", "content": "Say hello."}],
                "stream": stream,
            }
        else:
            payload = {
                "model": model,
                "messages": [{"role": "user", "content": "Say hello."}],
                "stream": stream,
            }
            if stream and model == "demo":  # the Requests tab shows streams with and without usage
                payload["stream_options"] = {"include_usage": True}
        self.sent += 1
        try:
            async with session.post(f"{self.base_url}/v1/{endpoint}", json=payload) as response:
                await response.read()
                status = response.status
                provider = response.headers.get("x-omniroute-provider")
        except Exception:  # the demo's client must never disturb the instance: count and move on
            self.errors += 1
            return
        self.answered[status] = self.answered.get(status, 0) + 1
        if status < 400 and provider:
            self.served_by[provider] = self.served_by.get(provider, 0) + 1
