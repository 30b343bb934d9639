"""A chat stream that the upstream ends with an error object after its content.

Some OpenAI-compatible servers (vLLM, OpenAI itself) report a failure mid-stream as a last
`data: {"error": {...}}` event, with or without `[DONE]`. It is relayed as it came (the stream
is never replayed after its first byte), but the record said `done`, 200, and no layer heard of the
failure (found by a hostile-input trial). Now it is recorded as the error the client got, and
counted as the failure it is.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.fakes.scripted import Scripted, ScriptedUpstream
from tests.integration.test_proxy import Proxy, provider


def chunk(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


def delta(text: str) -> bytes:
    return chunk(
        {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]}
    )


@pytest.mark.parametrize("done", [True, False], ids=["with-done", "without-done"])
def test_an_error_object_ending_a_chat_stream_is_a_failure_in_the_record_and_the_layers(
    launch: Callable[..., Proxy], scripted: Callable[[], ScriptedUpstream], done: bool
) -> None:
    up = scripted()
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    error = {"error": {"message": "the model crashed", "type": "server_error", "code": 500}}
    up.script(Scripted([delta("par"), delta("tial"), chunk(error), *([b"data: [DONE]\n\n"] if done else [])]))
    body = {"model": "loc/m1", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    answer = proxy.http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200
    assert "the model crashed" in answer.text  # relayed as it came
    record = proxy.last_record()
    assert (record["state"], record["code"], record["message"]) == (
        "failed",
        "server_error",
        "the model crashed",
    ), record
    assert record["attempts"][0]["outcome"] == "returned"
    assert proxy.breaker("loc")["failureCount"] == 1  # the layers heard of it


def test_a_chat_stream_whose_chunks_carry_a_null_error_is_a_success(
    launch: Callable[..., Proxy], scripted: Callable[[], ScriptedUpstream]
) -> None:
    up = scripted()
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    last = {"id": "c1", "object": "chat.completion.chunk", "choices": [], "error": None}
    up.script(Scripted([delta("whole"), chunk(last), b"data: [DONE]\n\n"]))
    body = {"model": "loc/m1", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    assert proxy.http.post("/v1/chat/completions", json=body).status_code == 200
    assert proxy.last_record()["state"] == "done"
