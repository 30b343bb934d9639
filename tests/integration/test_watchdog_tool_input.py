"""The throughput watchdog suspends judgement while a tool call's input streams
(docs/resilience.md#streams-and-the-throughput-watchdog). On the
Responses API a tool call's input streams as `response.function_call_arguments.delta` for a
function tool, and as `response.custom_tool_call_input.delta` for a custom (freeform) tool, which
is how Codex's `apply_patch` writes a patch. A long patch is as much a tool call as a long JSON
argument: neither may be cut as a stall.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from tests.fakes import LiveServer, dialects
from tests.integration.test_proxy import Proxy

WATCHDOG = {"enabled": True, "warmupMs": 0, "windowMs": 1000, "minUsefulBytesPerSecond": 4}


def _sse(data: dict[str, object]) -> bytes:
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()


def _tool_call_stream(kind: str) -> Callable[[Request], StreamingResponse]:
    """A Responses stream whose one output item is a tool call, its input arriving for 2.5 s."""
    item = (
        {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "shell", "arguments": ""}
        if kind == "function"
        else {
            "id": "ctc_1",
            "type": "custom_tool_call",
            "call_id": "call_1",
            "name": "apply_patch",
            "input": "",
        }
    )
    delta_type = (
        "response.function_call_arguments.delta"
        if kind == "function"
        else "response.custom_tool_call_input.delta"
    )

    async def answer(request: Request) -> StreamingResponse:
        body = await request.json()

        async def events() -> AsyncIterator[bytes]:
            created = dialects.response("resp_tool", body["model"], "", status="in_progress")
            yield _sse({"type": "response.created", "sequence_number": 0, "response": created})
            yield _sse(
                {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": item}
            )
            for n in range(25):
                await asyncio.sleep(0.1)
                yield _sse(
                    {
                        "type": delta_type,
                        "sequence_number": 2 + n,
                        "item_id": item["id"],
                        "output_index": 0,
                        "delta": "+ a line of the patch\n",
                    }
                )
            done = dialects.response("resp_tool", body["model"], "")
            yield _sse({"type": "response.completed", "sequence_number": 30, "response": done})

        return StreamingResponse(events(), media_type="text/event-stream")

    return answer


@pytest.mark.parametrize("kind", ["function", "custom"])
def test_a_tool_calls_streaming_input_is_not_cut_by_the_watchdog(
    launch: Callable[..., Proxy], kind: str
) -> None:
    app = Starlette(routes=[Route("/v1/responses", _tool_call_stream(kind), methods=["POST"])])
    server = LiveServer(app).start()
    try:
        config = (
            f'[providers.codex]\nclass = "local"\nbase_url = "{server.url}/v1"\napis = ["responses"]\n\n'
            '[[providers.codex.connections]]\nid = "codex-1"\n'
        )
        proxy = launch(config, settings={"streamRecovery": {"throughputWatchdog": WATCHDOG}})
        response = proxy.http.post(
            "/v1/responses", json={"model": "codex/m1", "input": "patch it", "stream": True}, timeout=30
        )
        assert response.status_code == 200
        assert "stream_stalled" not in response.text, response.text[-300:]
        assert response.text.rstrip().endswith("}"), response.text[-300:]
        assert '"type": "response.completed"' in response.text
        assert proxy.connection("codex-1")["lastError"] is None
        proxy.settled()
    finally:
        server.stop()
