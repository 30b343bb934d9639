"""A Responses stream's `response.failed` event whose `response` is not an object.

docs/apis.md#streams: an error event (`error`, `response.failed`) before any content is a failed
attempt, classified by the status it stands for, and the next connection is tried; after content it
is relayed as it came and ends the stream. README#security: an upstream's answer is relayed, or a
failed attempt, "never a 500". `proxy.apis.stream_error` reads `data.get("response", {}).get("error")`,
which raises AttributeError when the upstream sent `"response": null` (or a string, a list): before
content the client gets `500 internal_error`; after content the proxy drops the client's
connection in the middle of the chunked body.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest

from tests.fakes.dialects import delta, first_content, head, tail
from tests.fakes.scripted import Scripted, ScriptedUpstream, sse
from tests.integration.test_apis import codex
from tests.integration.test_proxy import Proxy, wait_until

RESPONSES = "/responses"


def failed(response: Any) -> bytes:
    return sse("response.failed", {"type": "response.failed", "sequence_number": 9, "response": response})


def records(proxy: Proxy) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = proxy.http.get("/api/requests").json()["requests"]
    return found


@pytest.mark.parametrize("odd", [None, "boom", [1]], ids=["null", "string", "list"])
def test_a_failed_event_before_content_is_a_failed_attempt_that_falls_back_not_a_500(
    launch: Callable[..., Proxy], scripted: Callable[[], ScriptedUpstream], odd: Any
) -> None:
    up = scripted()
    proxy = launch(codex("oa", up.url, "k1", "k2"))
    up.script(
        Scripted([head(RESPONSES, "r1", "m"), failed(odd)]),  # k1: fails before any content
        Scripted(
            [
                head(RESPONSES, "r2", "m"),
                first_content(RESPONSES, "r2"),
                delta(RESPONSES, "r2", "ok"),
                tail(RESPONSES, "r2", "m", "ok"),
            ]
        ),  # k2: a whole answer
    )
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-client", max_retries=0)
    try:
        events = list(client.responses.create(model="oa/m", input="hi", stream=True))
    finally:
        client.close()
    assert [e.type for e in events][-1] == "response.completed"
    assert [path for path, _, _ in up.requests] == ["/v1/responses", "/v1/responses"]
    assert proxy.connection("k1")["status"] == "cooling"  # counted as the failure it was (500)
    proxy.settled()


def test_a_failed_event_after_content_is_relayed_and_ends_the_stream_whole(
    launch: Callable[..., Proxy], scripted: Callable[[], ScriptedUpstream]
) -> None:
    up = scripted()
    proxy = launch(codex("oa", up.url, "k1"))
    before = head(RESPONSES, "r1", "m") + first_content(RESPONSES, "r1") + delta(RESPONSES, "r1", "par")
    up.script(Scripted([before, failed("boom")]))
    body = {"model": "oa/m", "input": "hi", "stream": True}
    # The body must arrive whole: the chunked encoding ended, not a connection dropped mid-body
    # (httpx.RemoteProtocolError "incomplete chunked read" on current code).
    response = proxy.http.post("/v1/responses", json=body)
    assert response.status_code == 200
    assert response.text.startswith(before.decode()), response.text
    assert "response.failed" in response.text[len(before) :]
    wait_until(lambda: records(proxy)[-1]["state"] != "streaming", what="the record to end")
    record = records(proxy)[-1]
    assert record["state"] == "failed", record
    assert record["attempts"][0]["outcome"] == "returned", record  # a failure, not a client that left
    assert proxy.breaker("oa")["lastFailure"] is not None
    proxy.settled()
