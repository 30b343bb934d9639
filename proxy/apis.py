"""The wire APIs the proxy passes through, and what it needs to know of each (docs/apis.md).

Chat Completions, legacy completions and embeddings are OpenAI's; the Responses API
(`/v1/responses`) is OpenAI's newer one (Codex CLI); the Messages API (`/v1/messages`) is
Anthropic's (Claude Code). Requests are passed through unchanged: this module only knows, per API,
how the proxy's own errors are shaped, how a stream says "content has started", "failed" and
"usage", and which status an error event stands for. Nothing here knows HTTP frameworks or the
engine, so the pipeline stays one pipeline and each API is a small table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from proxy.sse import SSEParser

ApiName = Literal["chat", "completions", "embeddings", "responses", "messages"]
API_NAMES: Final[tuple[ApiName, ...]] = ("chat", "completions", "embeddings", "responses", "messages")
DEFAULT_APIS: Final[frozenset[str]] = frozenset(("chat", "completions", "embeddings"))
"""What a provider speaks when its config does not say (what every OpenAI-compatible server answers)."""

BUILTIN_EXTRA_APIS: Final[Mapping[str, frozenset[str]]] = {
    # From each server's own documentation (2026): Ollama answers /v1/responses (stateless, v0.13.3+)
    # and /v1/messages (v0.14+); llama.cpp's server /v1/messages with count_tokens; LM Studio and
    # vLLM both. A server too old for one answers 404, which locks that model on that target only.
    "ollama": frozenset(("responses", "messages")),
    "llamacpp": frozenset(("messages",)),
    "lmstudio": frozenset(("responses", "messages")),
    "vllm": frozenset(("responses", "messages")),
}

ENDPOINT_API: Final[Mapping[str, ApiName]] = {
    "chat/completions": "chat",
    "completions": "completions",
    "embeddings": "embeddings",
    "responses": "responses",
    "messages": "messages",
}
"""The upstream path (after `base_url`) of each API's main route."""

AuthStyle = Literal["bearer", "x-api-key"]
AUTH_STYLES: Final[tuple[AuthStyle, ...]] = ("bearer", "x-api-key")
ANTHROPIC_VERSION: Final = "2023-06-01"
"""Sent with `auth = "x-api-key"` when the client sent no `anthropic-version` of its own."""
CLIENT_HEADERS: Final[tuple[str, ...]] = ("anthropic-version", "anthropic-beta")
"""The only client headers passed upstream, on the Messages and Responses routes."""


def builtin_apis(provider_id: str) -> frozenset[str]:
    """What a provider speaks by default: the built-in local servers know their own extras."""
    extra = BUILTIN_EXTRA_APIS.get(provider_id)
    return DEFAULT_APIS | extra if extra is not None else DEFAULT_APIS


def auth_headers(style: str, api_key: str | None, client_version: str | None) -> dict[str, str]:
    """The credential headers of one upstream request (`x-api-key` style: plus `anthropic-version`)."""
    if style == "x-api-key":
        headers = {"anthropic-version": client_version or ANTHROPIC_VERSION}
        if api_key:
            headers["x-api-key"] = api_key
        return headers
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


# ---------------------------------------------------------------------------------------------
# Errors in each API's shape

_ANTHROPIC_TYPES: Final[Mapping[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    421: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    421: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


def error_type(status: int) -> str:
    """An OpenAI-style error's `type` for a status (`rate_limit_error` for a 429...)."""
    return _OPENAI_TYPES.get(status, "api_error")


def anthropic_error_body(status: int, message: str) -> bytes:
    """`{"type": "error", "error": {"type", "message"}}`, the type chosen by status as Anthropic does."""
    kind = _ANTHROPIC_TYPES.get(status, "api_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


def anthropic_sse_error(message: str, code: str) -> bytes:
    """The tail of a Messages stream that cannot continue: Anthropic's `error` event (no `[DONE]`:
    that sentinel is OpenAI's). The SDK raises its own APIStatusError on it."""
    payload = json.dumps({"type": "error", "error": {"type": "api_error", "message": f"{message} ({code})"}})
    return f"event: error\ndata: {payload}\n\n".encode()


def responses_sse_error(message: str, code: str) -> bytes:
    """The tail of a Responses stream that cannot continue: its `error` event."""
    payload = json.dumps({"type": "error", "code": code, "message": message, "param": None})
    return f"event: error\ndata: {payload}\n\n".encode()


# ---------------------------------------------------------------------------------------------
# Streams: what an event says


class EventKind:
    """What one SSE event of a Messages or Responses stream means to the relay."""

    PREAMBLE: Final = "preamble"
    """Opens the stream, carries no content (`message_start`, `response.created`, pings)."""
    CONTENT: Final = "content"
    """Anything after the preamble that is not an error: from here on nothing is replayed."""
    ERROR: Final = "error"
    """The upstream failed in the stream (`error`, `response.failed`)."""


_MESSAGES_PREAMBLE: Final = frozenset(("message_start", "ping"))
_RESPONSES_PREAMBLE: Final = frozenset(("response.created", "response.in_progress", "response.queued"))
ERROR_EVENTS: Final = frozenset(("error", "response.failed"))


def event_kind(api: str, name: str, data: Mapping[str, Any] | None) -> str:
    """The kind of one event by its SSE `event:` name, or the `type` in its data when unnamed."""
    kind = name if name != "message" else (data.get("type") if data is not None else None)
    if not isinstance(kind, str):
        return EventKind.PREAMBLE  # a comment-like event without a type says nothing yet
    if kind in ERROR_EVENTS:
        return EventKind.ERROR
    preamble = _MESSAGES_PREAMBLE if api == "messages" else _RESPONSES_PREAMBLE
    return EventKind.PREAMBLE if kind in preamble else EventKind.CONTENT


# Anthropic's error types (https://docs.anthropic.com/en/api/errors) as the statuses they come with.
_ANTHROPIC_STATUS: Final[Mapping[str, int]] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
# The codes of a Responses `error` event or a failed response's `error.code`.
_RESPONSES_STATUS: Final[Mapping[str, int]] = {
    "rate_limit_exceeded": 429,
    "insufficient_quota": 429,
    "server_error": 500,
    "server_is_overloaded": 503,
    "overloaded": 503,
    "model_not_found": 404,
    "invalid_api_key": 401,
    "invalid_prompt": 400,
    "context_length_exceeded": 400,
}


@dataclass(frozen=True, slots=True)
class StreamError:
    """An error event, as the status it stands for and an error body in the API's own shape."""

    status: int
    body: bytes


def stream_error(api: str, data: Mapping[str, Any] | None) -> StreamError:
    """The status an error event stands for (so it is classified like that status: 529 overloaded,
    429 rate limited...), and the error body a client of that API would have got instead. `data`
    is the event's JSON (None when it was not JSON): any shape an upstream sends is answered."""
    failed = "the upstream stream failed"
    if api == "messages":
        if data is None:  # not JSON
            return StreamError(502, anthropic_error_body(502, failed))
        error = data.get("error")
        if not isinstance(error, Mapping):  # not Anthropic's shape: say so in it
            return StreamError(500, anthropic_error_body(500, failed))
        kind = error.get("type")
        status = _ANTHROPIC_STATUS.get(kind, 500) if isinstance(kind, str) else 500
        try:
            return StreamError(status, json.dumps(data).encode())  # as the upstream said it
        except (ValueError, RecursionError):  # JSON nested too deep to write out again
            message = error.get("message")
            said = message if isinstance(message, str) else failed
            return StreamError(
                status, json.dumps({"type": "error", "error": {"type": kind, "message": said}}).encode()
            )
    if data is None:
        return StreamError(502, json.dumps({"error": {"message": failed, "type": "upstream_error"}}).encode())
    error = data.get("response") if data.get("type") == "response.failed" else data
    if isinstance(error, Mapping) and error is not data:
        error = error.get("error")
    if not isinstance(error, Mapping):
        error = {}
    code = error.get("code")
    code = code if isinstance(code, str) else None
    status = _RESPONSES_STATUS.get(code, 500) if code is not None else 500
    message = error.get("message") if isinstance(error.get("message"), str) else failed
    body = {"error": {"message": message, "type": error_type(status), "code": code}}
    return StreamError(status, json.dumps(body).encode())


_ERROR_MARKERS: Final = (
    # An error event's name, or for an unnamed event its type: one of these is in every error event.
    # (Each holds `error` or `failed`: ErrorSpotter.feed looks for those words first.)
    b"event: error",
    b"event:error",
    b"event: response.failed",
    b"event:response.failed",
    b'"type":"error"',
    b'"type": "error"',
    b'"type":"response.failed"',
    b'"type": "response.failed"',
)
MAX_PENDING_BYTES = 64 * 1024
"""The most of an unfinished event the spotter keeps (an error event is far smaller)."""


class ErrorSpotter:
    """Spots the error event of a Messages or Responses stream after its content has started.

    The relay must end such a stream at its `error` (or `response.failed`) event, but parsing every
    event in Python would cost the relay its speed. So the bytes are searched (in C) for what an
    error event must carry: its name, or for an unnamed event its type in the data (a JSON string
    escapes the quotes inside it, so text quoting `"type": "error"` does not match). Only from the
    event holding a marker on is the stream parsed, and from then on to its end: an error event is
    reported; an event that only looked like one (text quoting `event: error`, say: a rare false
    alarm) costs the speed, never an error missed. The unfinished event at the end of each chunk is kept, so a marker split between
    two chunks is still found.
    """

    __slots__ = ("_api", "_parser", "_pending")

    def __init__(self, api: str, head: bytes = b"") -> None:
        """`head`: what was relayed before (already parsed); its unfinished event is kept."""
        self._api = api
        self._parser: SSEParser | None = None
        self._pending = _unfinished(head)

    def feed(self, chunk: bytes) -> StreamError | None:
        """The error the stream reports in this chunk (or in an event this chunk completes), if any."""
        parser = self._parser
        if parser is not None:
            return self._parse(parser, chunk)
        data = self._pending + chunk if self._pending else chunk
        if b"error" not in data and b"failed" not in data:
            # The common chunk, in two scans: every marker holds one of these words.
            self._pending = _unfinished(data)
            return None
        hit = -1
        for marker in _ERROR_MARKERS:
            found = data.find(marker)
            if found >= 0 and (hit < 0 or found < hit):
                hit = found
        if hit < 0:
            self._pending = _unfinished(data)
            return None
        self._pending = b""
        start = _boundary(data, hit)
        self._parser = parser = SSEParser()
        return self._parse(parser, data[start:])

    def _parse(self, parser: SSEParser, data: bytes) -> StreamError | None:
        for event in parser.feed(data):
            fields = event.json_object()
            if event_kind(self._api, event.event, fields) == EventKind.ERROR:
                return stream_error(self._api, fields)
        return None


def _boundary(data: bytes, end: int) -> int:
    """Where the event holding `data[end]` starts: after the last blank line before it (LF or CRLF)."""
    lf = data.rfind(b"\n\n", 0, end)
    crlf = data.rfind(b"\r\n\r\n", 0, end)
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def _unfinished(data: bytes) -> bytes:
    """The bytes after the last complete event (bounded: an error event is small)."""
    if data.endswith(b"\n\n"):  # the common chunk: it ends an event, nothing is left over
        return b""
    rest = data[_boundary(data, len(data)) :]
    return rest[-MAX_PENDING_BYTES:] if len(rest) > MAX_PENDING_BYTES else rest


def response_id(data: Mapping[str, Any] | None) -> str | None:
    """The id of a Responses object: a non-streamed answer's `id`, or a `response.created` event's."""
    if data is None:
        return None
    if data.get("type") == "response.created" and isinstance(data.get("response"), Mapping):
        data = data["response"]
    ident = data.get("id")
    return (
        ident
        if isinstance(ident, str) and 0 < len(ident) <= 256 and data.get("object") == "response"
        else None
    )
