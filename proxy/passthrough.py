"""The single-attempt routes of the passed-through APIs (docs/apis.md#routes).

`POST /v1/messages/count_tokens` asks one eligible connection of the first target that can take
traffic, once: no fallback, and no layer counts it (counting tokens spends no quota worth
protecting, and its failures say nothing about the model). `GET`/`DELETE /v1/responses/{id}` and
`POST /v1/responses/{id}/cancel` go to the connection that created the response (remembered for
24 h, `proxy/owners.py`); an id the proxy does not know is a 404. The chat-like routes
(`/v1/messages`, `/v1/responses`) run through the pipeline like chat.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from proxy import untrusted
from proxy.apis import CLIENT_HEADERS, anthropic_error_body, anthropic_sse_error, responses_sse_error
from proxy.engine import Target
from proxy.owners import RESPONSE_ID
from proxy.pipeline import (
    BodyStalled,
    BodyTooLarge,
    Wire,
    _read_body,
    body_stalled,
    pin_not_found,
    pinned_connection,
    retry_hints,
    upstream_headers,
)
from proxy.responses import ErrorResponse, error_response
from proxy.runtime import Runtime
from proxy.scrub import Scrubber, StreamScrubber
from proxy.upstream import UpstreamFailure, UpstreamResponse


async def count_tokens(runtime: Runtime, request: Request) -> Response:
    response = await _count_tokens(runtime, request)
    if isinstance(response, ErrorResponse):
        return response.reshaped(anthropic_error_body(response.status_code, response.message))
    return response


async def _body(runtime: Runtime, request: Request) -> bytes | Response:
    """The request's body, or the answer to a body that cannot be read."""
    try:
        return await _read_body(request.scope, request.receive, runtime.upstream.deadlines())
    except BodyTooLarge:
        return error_response(413, "request body exceeds 32 MiB", "request_too_large")
    except BodyStalled:
        return body_stalled()
    except ClientDisconnect:
        return error_response(499, "the client went away before its body arrived", "client_disconnected")


async def _count_tokens(runtime: Runtime, request: Request) -> Response:
    raw = await _body(runtime, request)
    if isinstance(raw, Response):
        return raw
    try:
        body = untrusted.loads(raw)
    except untrusted.Unsendable as exc:
        return error_response(400, f"request body: {exc}", "invalid_request")
    except untrusted.TooDeep:
        return error_response(400, f"request body is {untrusted.TOO_DEEP}", "invalid_json")
    except ValueError:
        return error_response(400, "request body is not valid JSON", "invalid_json")
    if not isinstance(body, dict):
        return error_response(400, "request body must be a JSON object", "invalid_request")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return error_response(400, "`model` is required and must be a string", "missing_model")
    if not untrusted.is_text(model):  # as the chat-like routes say it
        return error_response(400, "`model` holds a lone surrogate escape; it is not a name", "invalid_model")
    if len(model) > untrusted.MODEL_LIMIT:
        return error_response(400, untrusted.MODEL_TOO_LONG, "invalid_model")
    try:
        pinned = pinned_connection(request.scope["headers"])
    except ValueError as exc:
        return error_response(400, str(exc), "invalid_request")
    route = await runtime.router.resolve(model, pinned)
    if route is None:
        return error_response(
            404,
            f"model {untrusted.echo(model)!r} is not a configured provider/model or combo",
            "model_not_found",
        )
    if not route.targets:
        return pin_not_found(pinned, model)
    config = runtime.config
    eligible = [t for t in route.targets if "messages" in config.providers[t.provider].apis]
    if not eligible:
        return error_response(
            404, f"model {untrusted.echo(model)!r}: no target speaks the messages API", "model_not_found"
        )
    picked = _pick(runtime, eligible)
    if picked is None:  # the answer a chat request gets when nothing is eligible, Retry-After and all
        return runtime.pipeline.nothing_eligible(eligible)
    target, connection_id = picked
    try:
        data = untrusted.dumps({**body, "model": target.model})
    except (ValueError, RecursionError):
        return error_response(400, f"request body is {untrusted.TOO_DEEP}", "invalid_json")
    return await runtime.pipeline.while_connected(
        request.receive,
        _send_once(runtime, request, connection_id, "POST", "messages/count_tokens", data, "messages"),
    )


def _pick(runtime: Runtime, targets: list[Target]) -> tuple[Target, str] | None:
    """The connection a chat request would most likely get, read without taking anything: a breaker
    that lets traffic through, a connection in service and not locked for the model."""
    engine = runtime.engine
    now = engine.clock.now()
    for target in targets:
        provider = engine.providers.get(target.provider)
        if provider is None or not provider.breaker.can_execute(now):
            continue
        for conn in provider.connections:
            if target.connection_id is not None and conn.id != target.connection_id:
                continue  # pinned (X-OmniRoute-Connection) to another
            if conn.health.is_eligible(now) and not engine.lockouts.is_locked(
                target.provider, conn.id, target.model, now
            ):
                return target, conn.id
    return None


async def response_follow_up(runtime: Runtime, request: Request) -> Response:
    """GET/DELETE `/v1/responses/{id}`, POST `/v1/responses/{id}/cancel`: to the creating connection."""
    ident = request.path_params["response_id"]
    owner = await runtime.owners.lookup(ident) if RESPONSE_ID.fullmatch(ident) else None
    if owner is None:
        return error_response(
            404,
            f"response {untrusted.echo(ident)!r} is unknown here: the proxy remembers the responses it"
            " relayed for 24 hours",
            "response_not_found",
        )
    conn = runtime.engine.connections.get(owner)
    status = conn.health.status(runtime.engine.clock.now()) if conn is not None else None
    if status is not None and status not in ("active", "cooling"):
        # Out of service by the operator's word or for good (banned, expired, out of credits): its
        # key is not used, for a follow-up either. (Cooling is no reason: the response is there.)
        state = "disabled by the operator" if status == "disabled" else status.replace("_", " ")
        return error_response(
            503,
            f"response {untrusted.echo(ident)!r} lives at connection {owner!r}, which is {state}:"
            " it takes no requests until it is back in service",
            "all_targets_unavailable",
        )
    suffix = "/cancel" if request.url.path.endswith("/cancel") else ""
    path = f"responses/{ident}{suffix}"
    if request.url.query:
        path += f"?{request.url.query}"
    # Read whatever body came (a GET's is empty) before the call: only then is the next message
    # the server has for this request the client's leaving, which `while_connected` watches for.
    raw = await _body(runtime, request)
    if isinstance(raw, Response):
        return raw
    data = (raw or None) if request.method == "POST" else None
    return await runtime.pipeline.while_connected(
        request.receive, _send_once(runtime, request, owner, request.method, path, data, "responses")
    )


async def _send_once(
    runtime: Runtime,
    request: Request,
    connection_id: str,
    method: str,
    path: str,
    data: bytes | None,
    api: str,
) -> Response:
    config = runtime.config
    conn = config.connection(connection_id)
    if conn is None:  # the config changed since the response was created
        return error_response(
            404, f"connection {connection_id!r} is no longer configured", "connection_not_found"
        )
    provider = config.providers[conn.provider]
    client = {h: request.headers[h] for h in CLIENT_HEADERS if h in request.headers}
    extra, credentials, api_key = upstream_headers(provider, conn.api_key, Wire(api, client, None))
    scrub = runtime.scrubber
    headers = {"x-omniroute-selected-connection-id": connection_id, "x-omniroute-provider": provider.id}
    try:
        upstream = await runtime.upstream.send(
            method,
            f"{provider.base_url}/{path}",
            body=data,
            api_key=api_key,
            extra_headers=extra,
            credentials=credentials,
        )
    except UpstreamFailure as failure:
        return error_response(
            502, f"{connection_id}: {failure.outcome.error}", "upstream_unreachable", headers=headers
        )
    relayed = False
    try:
        if upstream.status >= 400:
            raw, _ = await upstream.read_error_body()
            return Response(
                scrub.error_bytes(raw),
                upstream.status,
                headers={**headers, **retry_hints(upstream.headers)},
                media_type=scrub(upstream.content_type),
            )
        if upstream.content_type.startswith("text/event-stream"):
            relayed = True  # (`_chunks` closes it when the stream ends)
            return StreamingResponse(
                _chunks(upstream, scrub, api), upstream.status, headers, "text/event-stream"
            )
        try:
            content = await upstream.read()
        except UpstreamFailure as failure:
            return error_response(
                502, f"{connection_id}: {failure.outcome.error}", "upstream_unreachable", headers=headers
            )
        return Response(
            scrub.secrets(content), upstream.status, headers=headers, media_type=scrub(upstream.content_type)
        )
    finally:
        if not relayed:  # read, or cut (the client left, the server stops): the upstream sees it go
            upstream.close()


async def _chunks(upstream: UpstreamResponse, scrub: Scrubber, api: str) -> AsyncIterator[bytes]:
    """The upstream's stream, scrubbed; one that breaks off ends with the API's error event (the
    blank line first ends whatever event it cut), not silently as if it were whole."""
    lines = StreamScrubber(scrub)
    try:
        async for chunk in upstream.chunks():
            out = lines.feed(chunk)
            if out:
                yield out
        tail = lines.flush()
        if tail:
            yield tail
    except UpstreamFailure as failure:
        lines.drop_partial()
        message = f"the upstream stream broke off: {failure.outcome.error}"
        ending = anthropic_sse_error if api == "messages" else responses_sse_error
        yield b"\n" + ending(message, "stream_interrupted")
    finally:
        upstream.close()
