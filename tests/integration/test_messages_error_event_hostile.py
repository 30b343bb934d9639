"""A Messages stream's `error` event that the proxy cannot encode again.

docs/apis.md#streams: an error event before any content is a failed attempt, classified as the
status it stands for (`overloaded_error` as 529), and the next connection is tried; when nothing is
left the client gets that status with the error as a JSON body, and the proxy's own errors on
`/v1/messages` are in Anthropic's shape. README#security: an upstream's answer is relayed or is a
failed attempt, "never a 500".

`proxy.apis.stream_error` re-encodes the event's data with `json.dumps`, which raises
RecursionError on data nested about 1,000 levels deep (orjson read it: it goes to 1,024). The
request ends in `500 internal_error`, and that 500 is in OpenAI's shape
(`{"error": {"message", "type": "server_error", "code"}}`) on `/v1/messages`: the guard's catch-all
(`proxy/guard.py`, `Guard.__call__`) does not reshape it as it does its other answers there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic

from tests.fakes.dialects import delta, first_content, head, tail
from tests.fakes.scripted import Scripted, ScriptedUpstream
from tests.integration.test_apis import USER, claude, messages_stream_refused
from tests.integration.test_proxy import Proxy

MESSAGES = "/messages"
DEPTH = 1000
DEEP_ERROR = (
    b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"},'
    b' "detail": ' + b"[" * DEPTH + b"]" * DEPTH + b"}\n\n"
)


def whole(ident: str) -> list[bytes]:
    return [
        head(MESSAGES, ident, "m") + first_content(MESSAGES, ident),
        delta(MESSAGES, ident, "ok"),
        tail(MESSAGES, ident, "m", "ok"),
    ]


def test_a_deeply_nested_error_event_before_content_falls_back_to_the_next_key(
    launch: Callable[..., Proxy], scripted: Callable[[], ScriptedUpstream]
) -> None:
    up = scripted()
    proxy = launch(claude("claude", up.url, "key-a", "key-b"))
    up.script(Scripted([head(MESSAGES, "m1", "m"), DEEP_ERROR]), Scripted(whole("m2")))
    client = anthropic.Anthropic(base_url=proxy.url, api_key="sk-ant-client", max_retries=0)
    try:
        with client.messages.stream(model="claude/m", max_tokens=16, messages=USER) as stream:
            assert "".join(stream.text_stream) == "ok"
    finally:
        client.close()
    assert [headers["x-api-key"] for _, headers, _ in up.requests] == ["key-key-a", "key-key-b"]
    assert proxy.connection("key-a")["status"] == "cooling"  # counted as the 529 it stands for
    proxy.settled()


def test_with_nothing_left_the_answer_is_an_anthropic_error_not_a_500(
    launch: Callable[..., Proxy], scripted: Callable[[], ScriptedUpstream]
) -> None:
    up = scripted()
    proxy = launch(claude("claude", up.url, "key-a"))
    up.script(Scripted([head(MESSAGES, "m1", "m"), DEEP_ERROR]))
    body = {"model": "claude/m", "max_tokens": 16, "stream": True, "messages": USER}
    response = proxy.http.post("/v1/messages", json=body)
    assert response.status_code != 500, response.text
    answer: Any = response.json()
    assert answer["type"] == "error" and set(answer["error"]) == {"type", "message"}, answer
    proxy.settled()


def test_an_error_event_without_json_data_is_answered_in_anthropics_shape(
    launch: Callable[..., Proxy], scripted: Callable[[], ScriptedUpstream]
) -> None:
    """The same rule, for an `error` event whose data is not JSON (`data: upstream exploded`): the
    proxy makes up the body itself (`stream_error(api, None)`), in OpenAI's shape on every API:
    `{"error": {"message": "the upstream stream failed", "type": "upstream_error"}}`. It reaches
    the client when nothing cools in between (`disable_cooling`, or `baseCooldownMs = 0`)."""
    up = scripted()
    proxy = launch(
        f'[providers.claude]\nclass = "apikey"\nbase_url = "{up.url}"\napis = ["messages"]\nauth = "x-api-key"\n'
        '[[providers.claude.connections]]\nid = "key-a"\napi_key = "key-key-a"\ndisable_cooling = true\n'
    )
    up.script(Scripted([head(MESSAGES, "m1", "m"), b"event: error\ndata: upstream exploded\n\n"]))
    refused = messages_stream_refused(proxy.url, "claude/m")
    assert refused.status_code == 502
    answer: Any = refused.body
    assert answer["type"] == "error" and answer["error"]["type"] == "api_error", answer
    proxy.settled()
