"""The request trail's usage of a Responses stream whose answer is large.

docs/api.md#request: `usage` comes from "a Responses stream's `response.completed`". That event
carries the whole final response (every output item: the text, a tool call's arguments) and the
usage after it, so a coding agent's answer that writes a file (Codex's `apply_patch`, a few
hundred KB of arguments) makes it hundreds of KB long, read in many pieces. The relay keeps only
the last two chunks it read (`Pipeline._start_gated`, `trail.stream_usage(previous + last)`): the
`data:` line that starts the event is no longer there, so the record says `usage: null` although
the upstream reported it (the SDK reads it). `/api/stats` tokens and `omniroute_tokens_total` miss
those tokens with it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import openai

from tests.fakes.dialects import delta, first_content, head
from tests.fakes.scripted import Scripted, ScriptedUpstream, sse
from tests.integration.test_apis import codex
from tests.integration.test_proxy import Proxy

RESPONSES = "/responses"
USAGE = {"input_tokens": 1100, "output_tokens": 90_000, "total_tokens": 91_100}


def completed(arguments: str) -> bytes:
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "apply_patch",
        "arguments": arguments,
        "status": "completed",
    }
    response = {
        "id": "resp_big",
        "object": "response",
        "created_at": 1,
        "status": "completed",
        "model": "m",
        "output": [call],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": USAGE,
    }
    return sse(
        "response.completed", {"type": "response.completed", "sequence_number": 9, "response": response}
    )


def test_the_usage_of_a_large_response_completed_event_reaches_the_record(
    launch: Callable[..., Proxy], scripted: Callable[[], ScriptedUpstream]
) -> None:
    up = scripted()
    proxy = launch(codex("oa", up.url, "k1"))
    arguments = json.dumps({"patch": "+ a line of the new file\n" * 12_000})  # ~300 KB
    end = completed(arguments)
    pieces = [
        head(RESPONSES, "resp_big", "m") + first_content(RESPONSES, "resp_big"),
        delta(RESPONSES, "resp_big", "ok"),
    ]
    pieces += [end[i : i + 32 * 1024] for i in range(0, len(end), 32 * 1024)]  # as a socket delivers it
    up.script(Scripted(pieces, gap_s=0.01))

    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-client", max_retries=0)
    try:
        events = list(client.responses.create(model="oa/m", input="hi", stream=True))
    finally:
        client.close()
    final: Any = events[-1]
    assert final.type == "response.completed"
    assert final.response.usage.output_tokens == 90_000  # what the client was told

    record = proxy.last_record()
    assert record["state"] == "done", record
    assert record["usage"] == {"promptTokens": 1100, "completionTokens": 90_000, "totalTokens": 91_100}
