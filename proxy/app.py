"""The Starlette application: the OpenAI-compatible routes and the management API."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy import passthrough, untrusted
from proxy.apis import anthropic_error_body
from proxy.guard import STARTED_KEY, Guard, stamping
from proxy.manage import management_routes
from proxy.pipeline import WHOLE_ANSWERS
from proxy.responses import error_response, json_response
from proxy.runtime import Runtime

Endpoint = Callable[[Scope, Receive], Awaitable[Response]]
"""An API route's endpoint: the request as its ASGI scope and `receive` (see Pipeline.handle)."""


class ApiRoutes:
    """The proxy's API routes (`POST /v1/...`), dispatched straight from the door.

    Starlette's middleware stack, router and endpoint wrapper wrap every request and every message
    it sends (about 6 % of a small request's instructions, docs/performance.md), so the requests
    the proxy exists for skip them: an exact path match, then the route's endpoint and its
    response. Every other request (a management route, another method on these paths, an unknown
    path) goes on to the Starlette app, which answers it as before. Nothing is lost on the way: the Guard in
    front checks Host, Origin, credentials and Content-Type for both, and answers an unexpected
    exception with the same JSON 500 that Starlette's handler gives. For the requests it claims,
    the Guard hands its headers (`X-Request-Id`, CORS) to `answer`, which puts them on the answer
    itself (proxy.guard.DirectAnswers); a whole answer is sent without a coroutine of its own.
    """

    def __init__(self, routes: Mapping[str, Endpoint], app: ASGIApp) -> None:
        self.endpoints = dict(routes)
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.claims(scope):
            await self.answer(scope, receive, send, [])
        else:
            await self.app(scope, receive, send)

    def claims(self, scope: Scope) -> bool:
        """Is this (http) request one of the API routes' own?"""
        return scope["method"] == "POST" and scope["path"] in self.endpoints

    async def answer(
        self, scope: Scope, receive: Receive, send: Send, added: list[tuple[bytes, bytes]]
    ) -> None:
        """Answer a request `claims` took, with `added` on the answer (the Guard's headers; see
        proxy.guard.DirectAnswers)."""
        try:
            response = await self.endpoints[scope["path"]](scope, receive)
        except ClientDisconnect:
            response = client_gone_answer()
        if type(response) in WHOLE_ANSWERS and response.background is None:
            # What Response.__call__ does (for an http scope), without a coroutine of its own, and
            # with the Guard's headers put on as it would.
            scope[STARTED_KEY] = True
            headers = [*response.raw_headers, *added]
            await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
            await send({"type": "http.response.body", "body": response.body})
            return
        await response(scope, receive, stamping(send, added, scope))


def client_gone_answer() -> Response:
    # The client hung up while sending its body: nobody will read an answer, and it is not a
    # failure of ours, so it must not reach the log as "unhandled error" with a traceback.
    return error_response(499, "client disconnected while sending the request", "client_disconnected")


async def client_gone(request: Request, exc: Exception) -> Response:
    """`client_gone_answer` as Starlette's handler of ClientDisconnect, for the routes it runs."""
    return client_gone_answer()


def api_routes(runtime: Runtime) -> dict[str, Endpoint]:
    """`POST` path -> endpoint: each hands the request to the pipeline (with the upstream endpoint
    it is sent to) or to its pass-through. Exact paths only: a route with a path parameter stays
    with Starlette."""

    def route(endpoint: str) -> Endpoint:
        # A plain function handing back the pipeline's own coroutine, with no coroutine of its own
        # between: each coroutine in the chain is resumed again at every await below it.
        def handle(scope: Scope, receive: Receive) -> Awaitable[Response]:
            return runtime.pipeline.handle(scope, receive, endpoint)

        return handle

    def messages(scope: Scope, receive: Receive) -> Awaitable[Response]:
        return runtime.pipeline.handle_messages(scope, receive)

    async def count_tokens(scope: Scope, receive: Receive) -> Response:
        return await passthrough.count_tokens(runtime, Request(scope, receive))

    return {
        "/v1/chat/completions": route("chat/completions"),
        "/v1/completions": route("completions"),
        "/v1/embeddings": route("embeddings"),
        "/v1/responses": route("responses"),
        "/v1/messages": messages,
        "/v1/messages/count_tokens": count_tokens,
    }


def _allowed(routes: Sequence[BaseRoute], path: str) -> str:
    """The `Allow` header of a 405: the methods of every route of the path. (Starlette's names only
    the first route that matched the path, and a path may have a route per method.)"""
    methods: set[str] = set()
    for route in routes:
        if isinstance(route, Route) and route.methods and route.path_regex.match(path):
            methods |= route.methods
    return ", ".join(sorted(methods))


def _coroutine(endpoint: Endpoint) -> Callable[[Request], Coroutine[Any, Any, Response]]:
    """`endpoint` as an `async def`: Starlette runs any other callable in a thread."""

    async def call(request: Request) -> Response:
        return await endpoint(request.scope, request.receive)

    return call


def create_app(runtime: Runtime, *, manage_lifecycle: bool = True) -> ASGIApp:
    """The ASGI app for one runtime. With `manage_lifecycle` the app's lifespan starts and stops it."""
    api = api_routes(runtime)

    async def response_follow_up(request: Request) -> Response:
        return await passthrough.response_follow_up(runtime, request)

    async def models(request: Request) -> Response:
        router = runtime.router
        data: list[dict[str, Any]] = []
        seen: set[str] = set()

        def add(model_id: str, owner: str) -> None:
            if model_id not in seen:
                seen.add(model_id)
                data.append({"id": model_id, "object": "model", "created": 0, "owned_by": owner})

        for name in router.configured_models():
            add(name, "omniroute")
        providers = list(runtime.config.providers)
        listings = await asyncio.gather(*(router.models_of(p) for p in providers))
        for provider, listed in zip(providers, listings, strict=True):
            for model_id in listed:
                add(f"{provider}/{model_id}", provider)
        return json_response({"object": "list", "data": data})

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        path = request.url.path
        if status == 405:
            answer = error_response(
                405,
                f"{untrusted.echo(request.method)} is not allowed on {untrusted.echo(path)}",
                "method_not_allowed",
                headers={"Allow": _allowed(routes, path)},
            )
        else:
            answer = error_response(404, f"no route {untrusted.echo(path)}", "not_found")
        # Anthropic's clients read their own shape, on every path of theirs
        if path == "/v1/messages" or path.startswith("/v1/messages/"):
            return answer.reshaped(anthropic_error_body(answer.status_code, answer.message))
        return answer

    async def internal_error(request: Request, exc: Exception) -> Response:
        # Starlette answers an unhandled exception itself (plain text) before the Guard sees it; this
        # makes that answer our JSON error. The exception is still re-raised and logged by the Guard.
        return error_response(500, "internal error; see the server log", "internal_error")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if manage_lifecycle:
            await runtime.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                await runtime.stop()

    routes = [
        # Registered here too, so that Starlette answers their other methods (405) and the OpenAPI
        # document lists them; their POSTs never get this far (ApiRoutes).
        *(Route(path, _coroutine(endpoint), methods=["POST"]) for path, endpoint in api.items()),
        Route("/v1/responses/{response_id}", response_follow_up, methods=["GET", "DELETE"]),
        Route("/v1/responses/{response_id}/cancel", response_follow_up, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        *management_routes(runtime),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            404: not_found,
            405: not_found,
            ClientDisconnect: client_gone,
            Exception: internal_error,
        },
    )
    # A path with a trailing slash is a route that does not exist, answered in JSON: Starlette
    # would send an empty 307 to a URL built from the Host header, which no client follows with
    # its POST body.
    app.router.redirect_slashes = False
    return Guard(ApiRoutes(api, app), runtime.config.server)
