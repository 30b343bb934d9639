"""The record of a Messages or Responses stream that the upstream ended with an error event.

docs/apis.md#streams: an error event after content "is relayed as it came and ends the stream; the
attempt counts as the status it stands for". docs/api.md#request: a record's `code` and `message`
are "what the client got: ... for an error its code and message (an upstream's own error is
relayed as it said it)". The client got the upstream's `overloaded_error` ("claude-up: 529
Overloaded"), and its SDK raised it; the record says `code: "stream_interrupted"` (an error the
proxy sends only when a stream breaks off, which this one did not) and `message: null`, so
`omniroute requests --failed` and the console's detail pane tell an operator the wrong story.
(`pipeline._stream_ended` sets `stream_interrupted` for any failed outcome without a code; the
outcome `_stream_failure` makes carries the event's body, which no one reads for the record.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.fakes import Reply
from tests.fakes.dialects import delta, first_content, head
from tests.fakes.scripted import Scripted, ScriptedUpstream, sse
from tests.integration.test_apis import USER, claude, codex, messages_stream_refused
from tests.integration.test_proxy import Proxy, Upstream


def test_a_messages_error_event_after_content_is_recorded_as_the_error_the_client_got(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("claude-up")
    proxy = launch(claude("claude", up.url, "key-a"))
    up.fake.script(Reply("stream_error", status=529, die_after=2, chunk_text="par"))
    told: Any = messages_stream_refused(proxy.url, "claude/sonnet").body
    assert told["error"] == {"type": "overloaded_error", "message": "claude-up: 529 Overloaded"}

    record = proxy.last_record()
    assert record["state"] == "failed"
    assert record["attempts"][0]["status"] == 529  # the layers got it right
    assert (record["code"], record["message"]) == ("overloaded_error", "claude-up: 529 Overloaded"), record


def test_a_responses_error_event_after_content_is_recorded_as_the_error_the_client_got(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("codex-up")
    proxy = launch(codex("oa", up.url, "k1"))
    up.fake.script(Reply("stream_error", status=429, die_after=2, chunk_text="par"))
    response = proxy.http.post("/v1/responses", json={"model": "oa/m", "input": "hi", "stream": True})
    assert response.status_code == 200
    assert '"code": "rate_limit_exceeded"' in response.text  # the upstream's event, relayed

    record = proxy.last_record()
    assert record["state"] == "failed"
    assert record["attempts"][0]["status"] == 429
    assert (record["code"], record["message"]) == ("rate_limit_exceeded", "codex-up: 429"), record


def test_an_error_event_without_words_leaves_a_short_message_in_the_record(
    launch: Callable[..., Proxy], scripted: Callable[[], ScriptedUpstream]
) -> None:
    """Its words then come from the event itself, which an upstream makes as long as it likes."""
    up = scripted()
    proxy = launch(claude("claude", up.url, "key-a"))
    error = {"type": "error", "error": {"type": "overloaded_error", "detail": "x" * 100_000}}
    up.script(
        Scripted(
            [
                head("/messages", "m1", "m") + first_content("/messages", "m1"),
                delta("/messages", "m1", "par"),
                sse("error", error),
            ]
        )
    )
    body = {"model": "claude/m", "max_tokens": 16, "stream": True, "messages": USER}
    assert proxy.http.post("/v1/messages", json=body).status_code == 200
    record = proxy.last_record()
    assert record["code"] == "overloaded_error"
    assert record["message"] is not None and len(record["message"]) <= 200, len(record["message"] or "")
