"""The Starlette application: the OpenAI-compatible routes and the management API."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from proxy import passthrough, untrusted
from proxy.guard import Guard
from proxy.manage import management_routes
from proxy.responses import error_response, json_response
from proxy.runtime import Runtime


def create_app(runtime: Runtime, *, manage_lifecycle: bool = True) -> ASGIApp:
    """The ASGI app for one runtime. With `manage_lifecycle` the app's lifespan starts and stops it."""

    async def chat(request: Request) -> Response:
        return await runtime.pipeline.handle(request, "chat/completions")

    async def completions(request: Request) -> Response:
        return await runtime.pipeline.handle(request, "completions")

    async def embeddings(request: Request) -> Response:
        return await runtime.pipeline.handle(request, "embeddings")

    async def responses(request: Request) -> Response:
        return await runtime.pipeline.handle(request, "responses")

    async def messages(request: Request) -> Response:
        return await runtime.pipeline.handle_messages(request)

    async def count_tokens(request: Request) -> Response:
        return await passthrough.count_tokens(runtime, request)

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
        if status == 405:
            return error_response(
                405,
                f"{untrusted.echo(request.method)} is not allowed on {untrusted.echo(request.url.path)}",
                "method_not_allowed",
            )
        return error_response(404, f"no route {untrusted.echo(request.url.path)}", "not_found")

    async def client_gone(request: Request, exc: Exception) -> Response:
        # The client hung up while sending its body: nobody will read an answer, and it is not a
        # failure of ours, so it must not reach the log as "unhandled error" with a traceback.
        return error_response(499, "client disconnected while sending the request", "client_disconnected")

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
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/v1/responses/{response_id}", response_follow_up, methods=["GET", "DELETE"]),
        Route("/v1/responses/{response_id}/cancel", response_follow_up, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
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
    return Guard(app, runtime.config.server)
