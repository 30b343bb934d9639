"""`previous_response_id` on `POST /v1/responses` names a response that only the upstream (and key)
that created it knows, like the follow-up routes (`GET /v1/responses/{id}`), which the proxy sends
to the creating connection (docs/apis.md, "The response memory"). A conversation that Codex-style
clients continue with `previous_response_id` must not be sent to another key of the same provider,
which answers 400 `previous_response_not_found`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import openai
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes import LiveServer, dialects
from tests.integration.test_proxy import Proxy, provider


def accounts(served: list[str]) -> Starlette:
    """A Responses API upstream where each key is an account of its own: a response is known only
    to the key that created it, as OpenAI's are; `served` gets the key of every request."""
    ids = itertools.count(1)
    known: dict[str, str] = {}  # response id -> the key that created it

    async def create(request: Request) -> Response:
        body = await request.json()
        key = request.headers["authorization"]
        served.append(key)
        previous = body.get("previous_response_id")
        if previous is not None and known.get(previous) != key:
            error = {
                "message": f"Previous response with id '{previous}' not found.",
                "type": "invalid_request_error",
                "param": "previous_response_id",
                "code": "previous_response_not_found",
            }
            return JSONResponse({"error": error}, status_code=400)
        ident = f"resp_{next(ids)}"
        known[ident] = key
        return JSONResponse(dialects.response(ident, body["model"], "hi"))

    return Starlette(routes=[Route("/v1/responses", create, methods=["POST"])])


def converse(proxy: Proxy, model: str, turns: int) -> None:
    """A conversation as Codex CLI has it: a first request, then `turns` that continue it."""
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-client", max_retries=0)
    try:
        previous = client.responses.create(model=model, input="hi").id
        for turn in range(turns):
            previous = client.responses.create(
                model=model, input=f"turn {turn}", previous_response_id=previous
            ).id
    finally:
        client.close()


def test_a_follow_up_with_previous_response_id_goes_to_the_connection_that_created_it(
    launch: Callable[..., Proxy],
) -> None:
    server = LiveServer(accounts([])).start()
    try:
        # Two keys of one provider, equal in priority: the proxy spreads requests over both.
        config = (
            f'[providers.codex]\nclass = "apikey"\nbase_url = "{server.url}/v1"\napis = ["responses"]\n\n'
        )
        for cid in ("key-a", "key-b"):
            config += f'[[providers.codex.connections]]\nid = "{cid}"\napi_key = "sk-{cid}-0123456789"\n\n'
        converse(launch(config), "codex/m1", turns=4)
    finally:
        server.stop()


def test_a_continued_conversation_goes_to_its_creator_across_a_combos_targets(
    launch: Callable[..., Proxy],
) -> None:
    """The creator comes before the combo's order too: a round-robin combo of two providers sent
    every other turn of a conversation to the provider that does not know it (a 400 each time)."""
    served: list[str] = []
    server = LiveServer(accounts(served)).start()
    try:
        config = "".join(
            provider(pid, "apikey", f"{server.url}/v1", f"{pid}-key", extra='apis = ["responses"]')
            for pid in ("one", "two")
        )
        config += '[combos.rr]\nstrategy = "round-robin"\ntargets = ["one/m1", "two/m1"]\n\n'
        proxy = launch(config)
        converse(proxy, "rr", turns=5)
        converse(proxy, "rr", turns=0)  # new conversations still go round the combo
        converse(proxy, "rr", turns=0)
        assert len(set(served[:6])) == 1 and served[6] != served[7], served
    finally:
        server.stop()
