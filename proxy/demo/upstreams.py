"""The simulated upstreams: what each kind answers, in OpenAI's wire format or Anthropic's.

One Starlette app per kind (`demo_upstream_app`); the kinds' misbehaviour is timed by
`schedules.py`, and each decides by the key the proxy sends (`DEMO_KEYS`, also in the demo config).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

import proxy.demo as demo_package
from proxy.demo.schedules import (
    OVERLOAD_EVERY,
    RATE_LIMIT_EVERY,
    RATE_LIMIT_RETRY_AFTER_S,
    FlakySchedule,
)

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
    upstream = _Upstream(kind, flaky_schedule or demo_package.DEFAULT_FLAKY_SCHEDULE, seed)
    return Starlette(
        routes=[
            Route("/v1/chat/completions", upstream.chat, methods=["POST"]),
            Route("/v1/completions", upstream.completions, methods=["POST"]),
            Route("/v1/embeddings", upstream.embeddings, methods=["POST"]),
            Route("/v1/models", upstream.models, methods=["GET"]),
            Route("/v1/messages", upstream.messages, methods=["POST"]),
        ]
    )
