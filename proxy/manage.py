"""The management API (docs/api.md#the-management-api): thin handlers over the engine and the settings.

Each handler parses its input, calls one engine or runtime method, and answers with the camelCase
shapes OmniRoute's dashboard uses. Authentication happens before any of this, in `proxy.guard`.
Bad input never reaches the engine: it becomes a 400 naming every bad field, or a 404 for an
unknown provider or connection, and nothing changes.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from proxy import untrusted
from proxy.openapi import openapi_route
from proxy.readmodel import DEFAULT_REQUESTS_LIMIT, DEFAULT_WINDOW, MAX_REQUESTS_LIMIT, STATS_SCOPES, WINDOWS
from proxy.resilience.errors import FieldError, SettingsError
from proxy.responses import error_response, json_response
from proxy.runtime import Runtime, not_saved
from proxy.settings import SettingsContended
from proxy.store import StoreError
from proxy.stream import KINDS as STREAM_KINDS

__all__ = ["MAX_BODY_BYTES", "management_routes"]

log = logging.getLogger("omniroute")

MAX_BODY_BYTES = 1 << 20
_FIELDS_SHOWN = 20
"""The most bad fields one answer names (a body may hold thousands of unknown keys)."""
"""Management bodies are a few keys; anything near this size is a mistake, not a request."""

_MAX_SEQ_DIGITS = 18
"""An event sequence number fits in 18 digits (below 2**63); `after` may not be longer."""

SOURCE = "api"
"""Who performed an operator action, as recorded in its `operator` event."""

Handler = Callable[[Request], Awaitable[Response]]


class _Rejected(Exception):
    """Bad input: answered as `{error: {message, type, code[, fields]}}` and nothing changes."""

    def __init__(self, status: int, message: str, fields: list[FieldError] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.fields = fields

    def response(self) -> Response:
        code = {400: "invalid_request", 404: "not_found", 413: "request_too_large"}[self.status]
        if self.fields is None:
            return error_response(self.status, self.message, code)
        return error_response(self.status, self.message, code, fields=[f.to_dict() for f in self.fields])


def _invalid(fields: list[FieldError]) -> _Rejected:
    # A field's name is the client's own key: quoted, like every echo, at most ECHO_LIMIT characters.
    # So many of them make a long answer too: past the first few, the rest are counted, not named.
    shown = [FieldError(untrusted.echo(f.field), f.message) for f in fields[:_FIELDS_SHOWN]]
    message = "; ".join(f"{f.field or 'body'}: {f.message}" for f in shown)
    if len(fields) > _FIELDS_SHOWN:
        message += f"; and {len(fields) - _FIELDS_SHOWN} more"
    return _Rejected(400, message, shown)


def _answers(handler: Handler) -> Handler:
    """Turn a handler's `_Rejected` into its JSON answer."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except _Rejected as rejected:
            return rejected.response()
        except ClientDisconnect:  # gone before its body arrived: nothing was done, nobody reads this
            return error_response(499, "the client went away before its body arrived", "client_disconnected")

    return endpoint


async def _json_body(request: Request) -> dict[str, Any]:
    """The request body as a JSON object. No body at all counts as `{}`; anything but an object is a 400."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY_BYTES:  # said up front: no need to wait for it
        raise _Rejected(413, f"body larger than {MAX_BODY_BYTES} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _Rejected(413, f"body larger than {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        return {}
    try:
        # A repeated member is refused, as a repeated query parameter is (`_query`): read as its
        # last copy, it would hide the first one's refused value, or drop a section of a PATCH.
        body = untrusted.loads(raw, unique=True)
    except untrusted.RepeatedKey as exc:
        raise _invalid([FieldError("", f"{exc}; send it once")]) from None
    except untrusted.TooDeep:
        raise _Rejected(
            400, f"the body is {untrusted.TOO_DEEP}", [FieldError("", untrusted.TOO_DEEP)]
        ) from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        # (`fields` as for any body refused whole: a client reads one shape for every 400.)
        said = untrusted.echo(str(exc))
        raise _Rejected(
            400, f"malformed JSON body: {said}", [FieldError("", f"malformed JSON: {said}")]
        ) from None
    if not isinstance(body, dict):
        raise _invalid([FieldError("", f"the body must be a JSON object, not {_json_kind(body)}")])
    return body


async def _no_fields(request: Request) -> None:
    """An action that takes no fields refuses any, as the others refuse unknown ones: a script
    that sent one meant something this route does not do."""
    errors = _unknown_keys(await _json_body(request), ())
    if errors:
        raise _invalid(errors)


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array"


def _unknown_keys(body: dict[str, Any], allowed: tuple[str, ...]) -> list[FieldError]:
    expected = f"expected {', '.join(allowed)}" if allowed else "this action takes none"
    return [FieldError(key, f"unknown key ({expected})") for key in body if key not in allowed]


def _text(body: dict[str, Any], key: str, errors: list[FieldError], *, required: bool) -> str | None:
    """A non-empty string field; None when absent (an error too when `required`). A null is an
    error: it is a script's unset variable far more often than a wish, and read as absent it would
    widen an action to everything (`{"provider": null}` resetting every breaker)."""
    if key not in body:
        if required:
            errors.append(FieldError(key, "required: a non-empty string"))
        return None
    value = body[key]
    if value is None:
        errors.append(FieldError(key, "must be a non-empty string; leave it out rather than send null"))
        return None
    if not isinstance(value, str) or not value:
        errors.append(FieldError(key, "must be a non-empty string"))
        return None
    if not untrusted.is_text(value):  # a name is logged and shown: it must be text UTF-8 can hold
        errors.append(FieldError(key, "must be text (it holds a lone surrogate escape)"))
        return None
    return value


def _query(request: Request) -> dict[str, str]:
    """The query's parameters, each given once. A repeated one is refused (400) rather than read as
    whichever came last: `?kinds=garbage&kinds=event` would pass where the reverse order is refused."""
    items = request.query_params.multi_items()
    query = dict(items)
    if len(query) < len(items):
        given = Counter(name for name, _ in items)
        raise _invalid([FieldError(name, "given more than once") for name, n in given.items() if n > 1])
    return query


def _query_int(text: str | None, name: str, lo: int, hi: int, default: int, errors: list[FieldError]) -> int:
    """A query parameter that must be an integer in [lo, hi] (its digits checked before int())."""
    if text is None:
        return default
    digits = text.lstrip("0") or "0"
    if text.isascii() and text.isdecimal() and len(digits) <= _MAX_SEQ_DIGITS and lo <= int(digits) <= hi:
        return int(digits)
    errors.append(
        FieldError(name, f"must be an integer from {lo:,} to {hi:,} (got {untrusted.echo(text)!r})")
    )
    return default


def management_routes(runtime: Runtime) -> list[Route]:
    """Every route of the management API, bound to one runtime."""
    engine = runtime.engine

    def connection_or_404(connection_id: str) -> None:
        if connection_id not in engine.connections:
            raise _Rejected(404, f"no connection '{untrusted.echo(connection_id)}'")

    def provider_or_404(provider: str) -> None:
        if provider not in engine.providers:
            raise _Rejected(404, f"no provider '{untrusted.echo(provider)}'")

    async def acknowledged(answer: dict[str, object]) -> Response:
        """An operator action's answer, once what it changed is on disk (`Runtime.acknowledge`); a
        500 `action_not_saved` when the store refused it: done, but not durable."""
        problem = await runtime.acknowledge()
        if problem is not None:
            return error_response(500, not_saved(problem), "action_not_saved")
        return json_response(answer)

    # -- health and breakers ------------------------------------------------------------------

    async def health(request: Request) -> Response:
        return json_response(runtime.read.health_api())

    async def reset_all_breakers(request: Request) -> Response:
        await _no_fields(request)
        return await acknowledged({"success": True, "resetCount": engine.reset_breakers(source=SOURCE)})

    async def reset_breakers(request: Request) -> Response:
        body = await _json_body(request)
        errors = _unknown_keys(body, ("provider",))
        provider = _text(body, "provider", errors, required=False)
        if errors:
            raise _invalid(errors)
        if provider is not None:
            provider_or_404(provider)
        return await acknowledged({"ok": True, "resetCount": engine.reset_breakers(provider, source=SOURCE)})

    # -- connections --------------------------------------------------------------------------

    def connection_view(connection_id: str) -> dict[str, object]:
        return runtime.read.connection_api(connection_id)

    async def connections(request: Request) -> Response:
        return json_response({"connections": runtime.read.connections_api()})

    async def reset_connection(request: Request) -> Response:
        connection_id: str = request.path_params["id"]
        connection_or_404(connection_id)
        await _no_fields(request)
        engine.reset_connection(connection_id, source=SOURCE)
        return await acknowledged({"ok": True, "connection": connection_view(connection_id)})

    async def update_connection(request: Request) -> Response:
        """OmniRoute's `PUT /api/providers/{id}`: only the two resilience fields are accepted."""
        connection_id: str = request.path_params["id"]
        connection_or_404(connection_id)
        body = await _json_body(request)
        errors = _unknown_keys(body, ("rateLimitedUntil", "isActive"))
        if "rateLimitedUntil" in body and body["rateLimitedUntil"] is not None:
            errors.append(FieldError("rateLimitedUntil", "only null is accepted (it clears the cooldown)"))
        if "isActive" in body and not isinstance(body["isActive"], bool):
            errors.append(FieldError("isActive", "must be true or false"))
        if not body:
            errors.append(FieldError("", 'send {"rateLimitedUntil": null} and/or {"isActive": true|false}'))
        if errors:
            raise _invalid(errors)
        if "rateLimitedUntil" in body:
            engine.reset_connection(connection_id, source=SOURCE)
        if "isActive" in body:
            engine.set_connection_enabled(connection_id, body["isActive"], source=SOURCE)
        return await acknowledged({"connection": connection_view(connection_id)})

    # -- model lockouts -----------------------------------------------------------------------

    async def lockouts(request: Request) -> Response:
        return json_response({"items": runtime.read.lockouts_api()})

    async def reenable(request: Request) -> Response:
        body = await _json_body(request)
        if "all" in body:
            errors = [FieldError(key, 'cannot be combined with "all"') for key in body if key != "all"]
            if body["all"] is not True:
                errors.append(FieldError("all", "must be true (or send {provider, model[, connectionId]})"))
            if errors:
                raise _invalid(errors)
            return await acknowledged({"ok": True, "removed": engine.reenable_all(source=SOURCE)})
        errors = _unknown_keys(body, ("provider", "model", "connectionId", "all"))
        provider = _text(body, "provider", errors, required=True)
        model = _text(body, "model", errors, required=True)
        connection_id = _text(body, "connectionId", errors, required=False)
        if errors or provider is None or model is None:
            raise _invalid(errors)
        provider_or_404(provider)
        if connection_id is not None:
            connection = engine.connections.get(connection_id)
            if connection is None or connection.spec.provider != provider:
                raise _Rejected(
                    404,
                    f"provider '{untrusted.echo(provider)}' has no connection '{untrusted.echo(connection_id)}'",
                )
        removed = engine.reenable(provider, model, connection_id, source=SOURCE)
        return await acknowledged({"ok": True, "removed": removed})

    # -- settings -----------------------------------------------------------------------------

    def settings_routes(path: str, group: str) -> list[Route]:
        async def read(request: Request) -> Response:
            return json_response(runtime.settings.document(group))

        async def change(request: Request) -> Response:
            body = await _json_body(request)
            try:
                return json_response(await runtime.patch_settings(body, group))
            except SettingsError as exc:
                raise _invalid(exc.fields) from None
            except SettingsContended as exc:
                return error_response(
                    409, f"settings not saved, nothing changed: {exc}; send it again", "settings_conflict"
                )
            except StoreError as exc:
                # Not a bug to hide behind "internal error": the operator must learn that the disk
                # refused the change, and that the live settings are still the old ones.
                return error_response(
                    500, f"settings not saved, nothing changed: {exc}", "settings_not_saved"
                )

        return [
            Route(path, _answers(read), methods=["GET"]),
            Route(path, _answers(change), methods=["PATCH"]),
        ]

    # -- events -------------------------------------------------------------------------------

    async def events(request: Request) -> Response:
        after_text = _query(request).get("after", "0")
        # Checked before int(): Python refuses to convert more than 4,300 digits (ValueError), and no
        # sequence number has more than MAX_SEQ_DIGITS (a counter would take centuries to get there).
        digits = after_text.lstrip("0") or "0"
        if not (after_text.isascii() and after_text.isdecimal()) or len(digits) > _MAX_SEQ_DIGITS:
            raise _invalid(
                [
                    FieldError(
                        "after",
                        f"must be a non-negative integer of at most {_MAX_SEQ_DIGITS} digits"
                        f" (got {untrusted.echo(after_text)!r})",
                    )
                ]
            )
        return json_response({"events": [e.to_dict() for e in runtime.bus.after(int(digits))]})

    # -- the live stream ------------------------------------------------------------------------

    async def stream(request: Request) -> Response:
        asked = _query(request).get("kinds")
        kinds = STREAM_KINDS
        if asked is not None:
            kinds = frozenset(k.strip() for k in asked.split(",") if k.strip())
            if not kinds or kinds - STREAM_KINDS:
                raise _invalid(
                    [
                        FieldError(
                            "kinds",
                            f"takes a comma-separated list of {', '.join(sorted(STREAM_KINDS))}"
                            f" (got {untrusted.echo(asked)!r})",
                        )
                    ]
                )
        return StreamingResponse(
            runtime.stream.messages(request.headers.get("last-event-id"), kinds),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    # -- the traffic --------------------------------------------------------------------------

    async def requests(request: Request) -> Response:
        query = _query(request)
        errors: list[FieldError] = []
        after = _query_int(query.get("after"), "after", 0, 10**_MAX_SEQ_DIGITS - 1, 0, errors)
        limit = _query_int(query.get("limit"), "limit", 1, MAX_REQUESTS_LIMIT, DEFAULT_REQUESTS_LIMIT, errors)
        state = query.get("state")
        if state is not None and state not in ("alive", "done"):
            errors.append(FieldError("state", f"must be alive or done (got {untrusted.echo(state)!r})"))
        if errors:
            raise _invalid(errors)
        found = runtime.read.requests(after=after, limit=limit, state=state)
        return json_response({"requests": [r.to_api() for r in found]})

    async def one_request(request: Request) -> Response:
        request_id = request.path_params["id"]
        found = runtime.read.request(request_id)
        if found is None:
            raise _Rejected(
                404,
                f"no request {untrusted.echo(request_id)!r} in the trail (alive or among the last"
                f" {runtime.config.server.request_history:,})",
            )
        return json_response({"request": found.to_api()})

    async def stats(request: Request) -> Response:
        query = _query(request)
        window = query.get("window", DEFAULT_WINDOW)
        scope = query.get("scope", "replica")
        errors: list[FieldError] = []
        if window not in WINDOWS:
            errors.append(
                FieldError("window", f"must be one of {', '.join(WINDOWS)} (got {untrusted.echo(window)!r})")
            )
        if scope not in STATS_SCOPES:
            errors.append(
                FieldError(
                    "scope", f"must be one of {', '.join(STATS_SCOPES)} (got {untrusted.echo(scope)!r})"
                )
            )
        if errors:
            raise _invalid(errors)
        if scope == "fleet":
            return json_response(await runtime.fleet_stats(window))
        return json_response(runtime.read.stats(window, runtime.read.now()).to_api())

    async def metrics(request: Request) -> Response:
        from proxy.metrics import CONTENT_TYPE_LATEST, exposition  # only a scrape loads the library

        return Response(exposition(runtime), media_type=CONTENT_TYPE_LATEST)

    return [
        Route("/api/monitoring/health", _answers(health), methods=["GET"]),
        Route("/api/monitoring/health", _answers(reset_all_breakers), methods=["DELETE"]),
        Route("/api/resilience/reset", _answers(reset_breakers), methods=["POST"]),
        Route("/api/resilience/connections", _answers(connections), methods=["GET"]),
        Route("/api/resilience/connections/{id}/reset", _answers(reset_connection), methods=["POST"]),
        Route("/api/providers/{id}", _answers(update_connection), methods=["PUT"]),
        Route("/api/resilience/model-cooldowns", _answers(lockouts), methods=["GET"]),
        Route("/api/resilience/model-cooldowns", _answers(reenable), methods=["DELETE"]),
        *settings_routes("/api/resilience", "resilience"),
        *settings_routes("/api/settings", "settings"),
        Route("/api/events", _answers(events), methods=["GET"]),
        Route("/api/stream", _answers(stream), methods=["GET"]),
        Route("/api/requests", _answers(requests), methods=["GET"]),
        Route("/api/requests/{id}", _answers(one_request), methods=["GET"]),
        Route("/api/stats", _answers(stats), methods=["GET"]),
        Route("/metrics", _answers(metrics), methods=["GET"]),
        openapi_route(),
    ]
