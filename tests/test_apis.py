"""What proxy/apis.py knows of each wire API: names, auth headers, error shapes, stream events."""

from __future__ import annotations

import json

import pytest

from proxy.apis import (
    _ERROR_MARKERS,
    ANTHROPIC_VERSION,
    MAX_PENDING_BYTES,
    ErrorSpotter,
    EventKind,
    anthropic_error_body,
    anthropic_sse_error,
    auth_headers,
    builtin_apis,
    event_kind,
    response_id,
    responses_sse_error,
    stream_error,
)
from proxy.sse import SSEParser


def test_a_provider_without_builtin_knowledge_speaks_openais_three() -> None:
    assert builtin_apis("openai") == {"chat", "completions", "embeddings"}
    assert builtin_apis("llamacpp") == {"chat", "completions", "embeddings", "messages"}


def test_auth_headers_per_style() -> None:
    assert auth_headers("bearer", "sk-1", None) == {"authorization": "Bearer sk-1"}
    assert auth_headers("bearer", None, "2024-01-01") == {}
    assert auth_headers("x-api-key", "sk-1", None) == {
        "x-api-key": "sk-1",
        "anthropic-version": ANTHROPIC_VERSION,
    }
    assert auth_headers("x-api-key", "sk-1", "2099-01-01") == {
        "x-api-key": "sk-1",
        "anthropic-version": "2099-01-01",
    }
    assert auth_headers("x-api-key", None, None) == {"anthropic-version": ANTHROPIC_VERSION}


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (413, "invalid_request_error"),
        (429, "rate_limit_error"),
        (499, "api_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (529, "overloaded_error"),
    ],
)
def test_anthropic_error_shape(status: int, kind: str) -> None:
    assert json.loads(anthropic_error_body(status, "words")) == {
        "type": "error",
        "error": {"type": kind, "message": "words"},
    }


def test_the_sse_error_tails_are_their_apis_own_error_events() -> None:
    for tail, api in (
        (anthropic_sse_error("broke", "stream_interrupted"), "messages"),
        (
            responses_sse_error("broke", "stream_interrupted"),
            "responses",
        ),
    ):
        [event] = SSEParser().feed(tail)
        assert event.event == "error"
        assert event_kind(api, event.event, event.json_object()) == EventKind.ERROR
        assert b"[DONE]" not in tail


@pytest.mark.parametrize(
    ("api", "name", "data", "kind"),
    [
        ("messages", "message_start", {"type": "message_start"}, EventKind.PREAMBLE),
        ("messages", "ping", {"type": "ping"}, EventKind.PREAMBLE),
        ("messages", "content_block_start", {"type": "content_block_start"}, EventKind.CONTENT),
        ("messages", "message_stop", {"type": "message_stop"}, EventKind.CONTENT),
        ("messages", "error", {"type": "error"}, EventKind.ERROR),
        ("messages", "message", {"type": "error"}, EventKind.ERROR),  # unnamed: the data's type says
        ("messages", "message", None, EventKind.PREAMBLE),
        ("responses", "response.created", {}, EventKind.PREAMBLE),
        ("responses", "response.in_progress", {}, EventKind.PREAMBLE),
        ("responses", "response.output_item.added", {}, EventKind.CONTENT),
        ("responses", "response.failed", {}, EventKind.ERROR),
        ("responses", "message", {"type": "response.output_text.delta"}, EventKind.CONTENT),
    ],
)
def test_event_kinds(api: str, name: str, data: dict[str, object] | None, kind: str) -> None:
    assert event_kind(api, name, data) == kind


@pytest.mark.parametrize(
    ("api", "data", "status"),
    [
        ("messages", {"type": "error", "error": {"type": "overloaded_error", "message": "x"}}, 529),
        ("messages", {"type": "error", "error": {"type": "rate_limit_error", "message": "x"}}, 429),
        ("messages", {"type": "error", "error": {"type": "invalid_request_error", "message": "x"}}, 400),
        ("messages", {"type": "error", "error": {"type": "something_new"}}, 500),
        ("messages", {"type": "error"}, 500),
        ("responses", {"type": "error", "code": "rate_limit_exceeded", "message": "slow down"}, 429),
        ("responses", {"type": "error", "code": "server_is_overloaded", "message": "x"}, 503),
        ("responses", {"type": "response.failed", "response": {"error": {"code": "server_error"}}}, 500),
        ("responses", {"type": "error", "code": None}, 500),
        ("responses", None, 502),
        ("responses", {"type": "response.failed", "response": None}, 500),
        ("responses", {"type": "response.failed", "response": "boom"}, 500),
        ("responses", {"type": "response.failed", "response": {"error": [1]}}, 500),
        ("responses", {"type": "error", "code": {"deep": [[[]]]}}, 500),
        ("messages", None, 502),
    ],
)
def test_an_error_event_stands_for_a_status(api: str, data: dict[str, object] | None, status: int) -> None:
    error = stream_error(api, data)
    assert error.status == status
    body = json.loads(error.body)
    assert isinstance(body["error"], dict)  # both shapes keep their error under "error"


def test_a_responses_error_event_becomes_an_error_whose_type_follows_its_status() -> None:
    """As every OpenAI-style error the proxy answers: `rate_limit_error` for a 429 (it said
    `upstream_error` whatever the status; found by an agent-API trial)."""
    error = stream_error(
        "responses", {"type": "error", "code": "rate_limit_exceeded", "message": "slow down"}
    )
    body = json.loads(error.body)["error"]
    assert (error.status, body["type"], body["code"], body["message"]) == (
        429,
        "rate_limit_error",
        "rate_limit_exceeded",
        "slow down",
    )


def test_a_messages_error_event_becomes_the_error_body_as_it_came() -> None:
    data = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    assert json.loads(stream_error("messages", data).body) == data


def test_an_error_event_too_deep_to_write_again_is_said_in_its_own_words() -> None:
    """orjson reads 1,024 levels; the standard library writes fewer: the status and the words stay."""
    deep: object = []
    for _ in range(1000):
        deep = [deep]
    data = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}, "detail": deep}
    error = stream_error("messages", data)
    assert error.status == 529
    assert json.loads(error.body) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }


def test_response_ids_of_answers_and_created_events() -> None:
    assert response_id({"id": "resp_1", "object": "response"}) == "resp_1"
    assert (
        response_id({"type": "response.created", "response": {"id": "resp_2", "object": "response"}})
        == "resp_2"
    )
    assert response_id({"id": "chatcmpl-1", "object": "chat.completion"}) is None
    assert response_id({"id": "x" * 300, "object": "response"}) is None
    assert response_id(None) is None


# ---------------------------------------------------------------------------------------------
# ErrorSpotter: the relay's cheap look for an error event after content

DELTA = b'event: content_block_delta\ndata: {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hi"}}\n\n'
ERROR = b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}\n\n'
UNNAMED_ERROR = b'data: {"type":"error","error":{"type":"rate_limit_error","message":"slow"}}\n\n'
FAILED = b'event: response.failed\ndata: {"type": "response.failed", "response": {"error": {"code": "server_error"}}}\n\n'
# Text that talks about errors is escaped JSON inside a string: it never looks like an error event.
TALK = b'event: content_block_delta\ndata: {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "event: error \\"type\\": \\"error\\""}}\n\n'


def _spot(api: str, stream: bytes, cuts: list[int], head: bytes = b"") -> list[int]:
    """Feed `stream` cut at `cuts`; the statuses reported, in order."""
    spotter = ErrorSpotter(api, head)
    found = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        error = spotter.feed(stream[start:end])
        if error is not None:
            found.append(error.status)
    return found


@pytest.mark.parametrize(
    ("api", "stream", "status"),
    [
        ("messages", DELTA * 3 + ERROR, 529),
        ("messages", DELTA + UNNAMED_ERROR, 429),
        ("messages", (DELTA + ERROR).replace(b"\n", b"\r\n"), 529),
        ("messages", DELTA + TALK + ERROR, 529),
        ("responses", DELTA + FAILED, 500),
    ],
)
def test_the_spotter_finds_an_error_event_however_the_stream_is_cut(
    api: str, stream: bytes, status: int
) -> None:
    for cut in range(1, len(stream)):
        assert _spot(api, stream, [cut]) == [status], cut
    assert _spot(api, stream, list(range(1, len(stream)))) == [status]  # one byte at a time


def test_the_spotter_reports_nothing_for_a_stream_without_an_error() -> None:
    stream = DELTA * 3 + TALK + DELTA
    for cut in range(1, len(stream)):
        assert _spot("messages", stream, [cut]) == []


def test_the_spotter_completes_an_error_event_the_head_began() -> None:
    whole = DELTA + ERROR
    split = len(DELTA) + 20  # inside the error event's data line
    assert _spot("messages", whole[split:], [], head=whole[:split]) == [529]


def test_the_spotter_keeps_a_bounded_unfinished_event() -> None:
    spotter = ErrorSpotter("messages")
    for _ in range(100):
        assert spotter.feed(b"x" * 4096) is None  # no event boundary ever
    assert len(spotter._pending) <= MAX_PENDING_BYTES


def test_every_error_marker_holds_a_word_the_spotter_looks_for_first() -> None:
    """The spotter passes a chunk over when neither `error` nor `failed` is in it: a marker
    without either would never be looked for."""
    assert all(b"error" in marker or b"failed" in marker for marker in _ERROR_MARKERS)


def test_the_spotter_keeps_an_unfinished_event_of_a_chunk_without_error_words() -> None:
    """A chunk that ends inside an event keeps that event's start, so that the event's end in the
    next chunk (where its error words may be) is read whole."""
    spotter = ErrorSpotter("messages")
    event = b'event: content_block_delta\ndata: {"type": "content_block_delta"}\n\n'
    assert spotter.feed(DELTA + event[:10]) is None
    assert spotter._pending == event[:10]
    assert spotter.feed(event[10:]) is None
    assert spotter._pending == b""
