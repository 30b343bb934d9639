"""What `FakeUpstream` answers on Anthropic's Messages API and OpenAI's Responses API.

Bodies and SSE events as the real services send them (field for field what the official SDKs
read): `/v1/messages` answers an Anthropic `message` (streamed as `message_start`,
`content_block_start`, `content_block_delta`..., `message_delta`, `message_stop`), its errors
`{"type": "error", "error": {"type", "message"}}`; `/v1/responses` answers a `response` object
(streamed as `response.created`, `response.output_text.delta`..., `response.completed`).
"""

from __future__ import annotations

import http
import json
import time
from typing import Any

MESSAGES = "/messages"
RESPONSES = "/responses"
COUNT_TOKENS = "/messages/count_tokens"
DIALECTS = (MESSAGES, RESPONSES)

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_error(status: int, upstream: str) -> dict[str, Any]:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "Overloaded" if status == 529 else "Error"
    kind = _ANTHROPIC_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": f"{upstream}: {status} {phrase}"}}


def _sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def message(ident: str, model: str, text: str) -> dict[str, Any]:
    return {
        "id": ident,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 4},
    }


def response(ident: str, model: str, text: str, status: str = "completed") -> dict[str, Any]:
    done = status == "completed"
    content = [{"type": "output_text", "text": text, "annotations": []}] if done else []
    return {
        "id": ident,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": [
            {
                "id": f"msg_{ident}",
                "type": "message",
                "status": status,
                "role": "assistant",
                "content": content,
            }
        ]
        if done
        else [],
        "usage": {
            "input_tokens": 5,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 4,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 9,
        }
        if done
        else None,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "text": {"format": {"type": "text"}},
    }


def head(endpoint: str, ident: str, model: str) -> bytes:
    """The events before the first text delta."""
    if endpoint == MESSAGES:
        start = message(ident, model, "") | {"content": [], "stop_reason": None}
        start["usage"] = {"input_tokens": 5, "output_tokens": 1}
        return _sse("message_start", {"type": "message_start", "message": start})
    created = response(ident, model, "", status="in_progress")
    return _sse("response.created", {"type": "response.created", "sequence_number": 0, "response": created})


def first_content(endpoint: str, ident: str) -> bytes:
    """What opens the content (the text block / output item) right before the first delta."""
    if endpoint == MESSAGES:
        block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
        return _sse("content_block_start", block)
    item = {
        "id": f"msg_{ident}",
        "type": "message",
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }
    added = {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": item}
    part = {
        "type": "response.content_part.added",
        "sequence_number": 2,
        "item_id": f"msg_{ident}",
        "output_index": 0,
        "content_index": 0,
        "part": {"type": "output_text", "text": "", "annotations": []},
    }
    return _sse("response.output_item.added", added) + _sse("response.content_part.added", part)


def delta(endpoint: str, ident: str, text: str) -> bytes:
    if endpoint == MESSAGES:
        event = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
        return _sse("content_block_delta", event)
    event = {
        "type": "response.output_text.delta",
        "sequence_number": 3,
        "item_id": f"msg_{ident}",
        "output_index": 0,
        "content_index": 0,
        "delta": text,
    }
    return _sse("response.output_text.delta", event)


def tail(endpoint: str, ident: str, model: str, text: str) -> bytes:
    """The events after the last delta: the stream's normal end."""
    if endpoint == MESSAGES:
        return (
            _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
            + _sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 4},
                },
            )
            + _sse("message_stop", {"type": "message_stop"})
        )
    done = {
        "type": "response.output_text.done",
        "sequence_number": 4,
        "item_id": f"msg_{ident}",
        "output_index": 0,
        "content_index": 0,
        "text": text,
    }
    completed = {"type": "response.completed", "sequence_number": 5, "response": response(ident, model, text)}
    return _sse("response.output_text.done", done) + _sse("response.completed", completed)


def error_event(endpoint: str, status: int, upstream: str, body: dict[str, Any] | None) -> bytes:
    """A stream's `error` event (its payload `body` when given)."""
    if endpoint == MESSAGES:
        return _sse("error", body if body is not None else anthropic_error(status, upstream))
    code = {429: "rate_limit_exceeded", 503: "server_is_overloaded"}.get(status, "server_error")
    payload = body or {"type": "error", "code": code, "message": f"{upstream}: {status}", "param": None}
    return _sse("error", payload)
