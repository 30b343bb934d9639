"""A Responses follow-up relayed as a stream (`GET /v1/responses/{id}?stream=true`) that breaks off
ends with the API's error event, as every relayed stream does (docs/apis.md#streams): it ended
silently, as if whole, and the client took a cut answer for a finished one (found by an agent-API
trial)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes import LiveServer, dialects
from tests.integration.test_proxy import Proxy


def test_a_streamed_follow_up_that_breaks_off_ends_with_the_apis_error_event(
    launch: Callable[..., Proxy],
) -> None:
    async def create(request: Request) -> Response:
        return JSONResponse(dialects.response("resp_1", "m", "hi"))

    async def retrieve(request: Request) -> Response:
        async def broken() -> AsyncIterator[bytes]:
            yield dialects.head("/responses", "resp_1", "m") + dialects.delta("/responses", "resp_1", "par")
            raise RuntimeError("the upstream's connection breaks here")

        return StreamingResponse(broken(), media_type="text/event-stream")

    routes = [Route("/v1/responses", create, methods=["POST"]), Route("/v1/responses/{id}", retrieve)]
    server = LiveServer(Starlette(routes=routes)).start()
    try:
        proxy = launch(
            f'[providers.codex]\nclass = "apikey"\nbase_url = "{server.url}/v1"\napis = ["responses"]\n\n'
            '[[providers.codex.connections]]\nid = "key-a"\napi_key = "sk-key-a-0123456789"\n'
        )
        made = proxy.http.post("/v1/responses", json={"model": "codex/m", "input": "hi"})
        assert made.status_code == 200, made.text
        answer = proxy.http.get("/v1/responses/resp_1?stream=true")
        assert answer.status_code == 200
        assert "par" in answer.text  # what came before the break was relayed
        assert answer.text.rstrip().endswith("}"), answer.text[-200:]
        assert "event: error" in answer.text and "stream_interrupted" in answer.text, answer.text[-300:]
    finally:
        server.stop()
