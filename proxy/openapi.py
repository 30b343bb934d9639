"""`GET /api/openapi.json`: the OpenAPI 3.1 description of every route this server answers.

Written by hand, except the settings documents, which are built from `proxy.schema.SCHEMA` like
everything else that shows a setting (defaults and ranges included). `tests/integration/
test_openapi.py` checks it against the real routes and validates real answers against its schemas,
so it cannot drift from the code. The prose behind it is docs/api.md.

Long on purpose (about 700 lines): one document describing every route and every answer's shape;
it is as long as the API is wide, and a route's description is easiest to check beside the others.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy import __version__
from proxy.apis import API_NAMES
from proxy.readmodel import (
    ALIVE_STATES,
    ATTEMPT_OUTCOMES,
    DEFAULT_REQUESTS_LIMIT,
    DEFAULT_WINDOW,
    MAX_REQUESTS_LIMIT,
    STATS_SCOPES,
    WINDOWS,
)
from proxy.settings import INT_LIST_MAX_ITEMS, SCHEMA, SECTIONS, FieldSpec

__all__ = ["PATH", "document", "openapi_route"]

PATH = "/api/openapi.json"

Schema = dict[str, Any]


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(properties: dict[str, Schema], *, optional: tuple[str, ...] = (), closed: bool = True) -> Schema:
    """An object with these properties, all required but `optional`; `closed`: no others."""
    schema: Schema = {"type": "object", "properties": properties}
    required = [name for name in properties if name not in optional]
    if required:
        schema["required"] = required
    if closed:
        schema["additionalProperties"] = False
    return schema


def _nullable(kind: str, **extra: Any) -> Schema:
    return {"type": [kind, "null"], **extra}


_INT: Schema = {"type": "integer"}
_STR: Schema = {"type": "string"}
_BOOL: Schema = {"type": "boolean"}
_TIME: Schema = _nullable(
    "string", format="date-time", description="ISO 8601 UTC, e.g. 2026-01-01T00:00:00.000Z"
)
_MS: Schema = {"type": "integer", "minimum": 0, "description": "milliseconds"}
_AFTER: Schema = {
    "type": "integer",
    "minimum": 0,
    "description": "how many of the request's attempts came before it: where it goes in the trail told in order",
}
_CLASS: Schema = {"type": "string", "enum": ["oauth", "apikey", "local"]}
_BREAKER_STATE: Schema = {"type": "string", "enum": ["CLOSED", "DEGRADED", "OPEN", "HALF_OPEN"]}
_SKIP_REASONS = (
    "circuit_open", "probe_in_flight", "cooling", "locked", "banned", "expired", "credits_exhausted",
    "disabled", "no_connection", "unknown_provider", "already_tried",
    *(f"does not speak {api}" for api in API_NAMES),
)  # fmt: skip
_CONNECTION_STATUS: Schema = {
    "type": "string",
    "enum": ["active", "cooling", "banned", "expired", "credits_exhausted", "disabled"],
}


# ---------------------------------------------------------------------------------------------
# Settings documents, from the schema.


def _leaf(spec: FieldSpec) -> Schema:
    schema: Schema
    if spec.kind == "bool":
        schema = {"type": "boolean"}
    elif spec.kind == "int":
        schema = {"type": "integer", "minimum": spec.min, "maximum": spec.max}
    else:
        schema = {
            "type": "array",
            "maxItems": INT_LIST_MAX_ITEMS,
            "items": {"type": "integer", "minimum": spec.min, "maximum": spec.max},
        }
    default = list(spec.default) if isinstance(spec.default, tuple) else spec.default
    return {**schema, "default": default, "description": spec.help}


def _settings_schema(group: str, *, partial: bool) -> Schema:
    """The document of one API group; `partial`: a PATCH body, where every key is optional."""
    tree: dict[str, Any] = {}
    for spec in SCHEMA:
        parts = spec.path.split(".")
        if parts[0] not in SECTIONS[group]:
            continue
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = spec

    def build(node: dict[str, Any]) -> Schema:
        properties = {
            name: _leaf(child) if isinstance(child, FieldSpec) else build(child)
            for name, child in node.items()
        }
        return _obj(properties, optional=tuple(properties) if partial else ())

    return build(tree)


# ---------------------------------------------------------------------------------------------
# Shapes of the answers.


def _schemas() -> dict[str, Schema]:
    return {
        "Error": _obj(
            {
                "error": _obj(
                    {
                        "message": _STR,
                        "type": _STR,
                        "code": _STR,
                        "fields": {"type": "array", "items": _ref("FieldError")},
                        "skipped": {"type": "array", "items": _ref("Skip")},
                        "upstreamError": _ref("UpstreamError"),
                    },
                    optional=("fields", "skipped", "upstreamError"),
                )
            }
        ),
        "UpstreamError": {
            **_obj(
                {
                    "connectionId": _STR,
                    "status": {
                        **_nullable("integer"),
                        "description": "null when the upstream never answered",
                    },
                    "message": {
                        **_STR,
                        "description": "what went wrong, in the upstream's words when it said any",
                    },
                }
            ),
            "description": "the last of this request's own failed attempts (when it made any)",
        },
        "AnthropicError": _obj(
            {
                "type": {"const": "error"},
                "error": _obj(
                    {
                        "type": {
                            "type": "string",
                            "enum": [
                                "invalid_request_error",
                                "authentication_error",
                                "not_found_error",
                                "rate_limit_error",
                                "api_error",
                                "overloaded_error",
                            ],
                        },
                        "message": _STR,
                    }
                ),
            }
        ),
        "FieldError": _obj(
            {"field": {**_STR, "description": "dotted path; empty for the body as a whole"}, "message": _STR}
        ),
        "Skip": _obj(
            {
                "target": {**_STR, "description": "provider/model"},
                "connectionId": _nullable("string"),
                "reason": {"type": "string", "enum": list(_SKIP_REASONS)},
                "retryAfterMs": _nullable("integer", minimum=0),
            }
        ),
        "Breaker": _obj(
            {
                "provider": _STR,
                "class": _CLASS,
                "state": _BREAKER_STATE,
                "failureCount": _INT,
                "degradationThreshold": _INT,
                "failureThreshold": _INT,
                "retryAfterMs": _MS,
                "openCycleCount": _INT,
                "lastFailure": _TIME,
                "lastTransition": _TIME,
            }
        ),
        "Connection": _obj(
            {
                "id": _STR,
                "provider": _STR,
                "name": _STR,
                "class": _CLASS,
                "priority": _INT,
                "enabled": _BOOL,
                "status": _CONNECTION_STATUS,
                "rateLimitedUntil": _TIME,
                "cooldownRemainingMs": _MS,
                "backoffLevel": _INT,
                "lastError": _nullable("string"),
                "lastErrorType": _nullable("string"),
                "errorCode": _nullable("integer"),
                "lastErrorAt": _TIME,
                "maxConcurrent": _nullable("integer"),
                "inFlight": _INT,
                "apiKey": _nullable("string", description="masked: sk-…abcd"),
                "lockouts": {
                    "type": "array",
                    "items": _obj({"model": _STR, "reason": _STR, "remainingMs": _MS}),
                },
            }
        ),
        "Lockout": _obj(
            {
                "provider": _STR,
                "connectionId": _STR,
                "model": _STR,
                "reason": _STR,
                "status": _nullable("integer"),
                "failureCount": _INT,
                "remainingMs": _MS,
                "lockedAt": _TIME,
                "expiresAt": _TIME,
            }
        ),
        "LockoutTable": _obj(
            {
                "size": _INT,
                "capacity": _INT,
                "full": _BOOL,
                "notFound": _INT,
                "notFoundBudget": _INT,
                "evicted": _INT,
                "refused": _INT,
            }
        ),
        "Health": _obj(
            {
                "status": {"type": "string", "enum": ["healthy", "degraded"]},
                "timestamp": _TIME,
                "uptimeMs": _MS,
                "version": _STR,
                "circuitBreakers": _obj(
                    {"open": _INT, "halfOpen": _INT, "degraded": _INT, "closed": _INT, "total": _INT}
                ),
                "providerBreakers": {"type": "array", "items": _ref("Breaker")},
                "providerHealth": {
                    "type": "object",
                    "additionalProperties": _obj(
                        {"state": _BREAKER_STATE, "failures": _INT, "lastFailure": _TIME}
                    ),
                },
                "connections": _obj(
                    {"total": _INT, "active": _INT, "coolingDown": _INT, "terminal": _INT, "disabled": _INT}
                ),
                "lockouts": {"type": "array", "items": _ref("Lockout")},
                "lockoutTable": _ref("LockoutTable"),
                "requests": _obj({"total": _INT, "ok": _INT, "failed": _INT, "inFlight": _INT}),
                "stateBackend": _ref("StateBackend"),
                "fleet": _ref("Fleet"),
            },
            optional=("fleet",),
        ),
        "StateBackend": _obj(
            {
                "kind": {"type": "string", "enum": ["sqlite", "redis"]},
                "connected": _BOOL,
                "since": _TIME,
            }
        ),
        "Fleet": _obj(
            {
                "replica": _STR,
                "address": _STR,
                "replicas": {
                    "type": "array",
                    "items": _obj(
                        {
                            "id": _STR,
                            "address": _STR,
                            "startedAt": _TIME,
                            "uptimeMs": _MS,
                            "inFlight": _INT,
                            "lastSeen": _TIME,
                        }
                    ),
                },
            }
        ),
        "Event": _obj(
            {
                "seq": _INT,
                "ts": {"type": "number", "description": "epoch milliseconds"},
                "layer": {
                    "type": "string",
                    "enum": ["breaker", "connection", "lockout", "settings", "operator", "state"],
                },
                "key": _STR,
                "from": _STR,
                "to": _STR,
                "reason": _STR,
            }
        ),
        "Usage": _obj(
            {
                "promptTokens": _nullable("integer", minimum=0),
                "completionTokens": _nullable("integer", minimum=0),
                "totalTokens": _nullable("integer", minimum=0),
            }
        ),
        "Attempt": _obj(
            {
                "target": {**_STR, "description": "provider/model"},
                "provider": _STR,
                "connectionId": _STR,
                "startedAt": _TIME,
                "durationMs": _MS,
                "status": _nullable("integer", description="after restatement; null when nothing answered"),
                "outcome": {
                    "type": "string",
                    "enum": list(ATTEMPT_OUTCOMES),
                    "description": "`pending`: still in flight (an alive request's current attempt;"
                    " its durationMs is the time so far)",
                },
                "reason": {
                    **_STR,
                    "description": "in words: `429 rate_limited`, `timeout before the response headers`",
                },
            }
        ),
        "TrailSkip": _obj(
            {
                "target": {**_STR, "description": "provider/model"},
                "connectionId": _nullable("string"),
                "reason": {
                    **_STR,
                    "description": "in words: `cooling 12 s (429 rate_limited)`, `breaker OPEN, probe in 8 s`",
                },
                "retryAfterMs": _nullable("integer", minimum=0),
                "after": _AFTER,
            }
        ),
        "Wait": _obj({"ms": _MS, "reason": _STR, "after": _AFTER}),
        "Request": _obj(
            {
                "id": {**_STR, "description": "the X-Request-Id the client received"},
                "seq": {"type": "integer", "minimum": 1},
                "startedAt": _TIME,
                "endedAt": _TIME,
                "state": {"type": "string", "enum": [*ALIVE_STATES, "done", "failed", "client_gone"]},
                "client": {**_STR, "description": "the client's address"},
                "endpoint": {
                    **_STR,
                    "description": "chat/completions, completions, embeddings, messages or responses",
                },
                "modelAsked": _nullable("string"),
                "route": {"type": "string", "enum": ["combo", "target", "bare"]},
                "stream": _BOOL,
                "status": _nullable("integer"),
                "code": _nullable("string"),
                "message": _nullable("string"),
                "durationMs": _nullable("integer", minimum=0),
                "ttftMs": _nullable("integer", minimum=0),
                "usage": {"oneOf": [_ref("Usage"), {"type": "null"}]},
                "bytesIn": _INT,
                "bytesOut": _INT,
                "attempts": {"type": "array", "items": _ref("Attempt")},
                "skipped": {"type": "array", "items": _ref("TrailSkip")},
                "waits": {"type": "array", "items": _ref("Wait")},
            }
        ),
        "Stats": _obj(
            {
                "requests": _INT,
                "errors": _INT,
                "errorRate": _nullable("number", minimum=0, maximum=1),
                "p50Ms": _nullable("number"),
                "p95Ms": _nullable("number"),
                "ttftP50Ms": _nullable("number"),
                "tokensPerSecond": _nullable("number"),
            }
        ),
        "ResilienceSettings": _settings_schema("resilience", partial=False),
        "ResilienceSettingsPatch": _settings_schema("resilience", partial=True),
        "LockoutSettings": _settings_schema("settings", partial=False),
        "LockoutSettingsPatch": _settings_schema("settings", partial=True),
    }


# ---------------------------------------------------------------------------------------------
# Operations.


def _json(schema: Schema, description: str) -> Schema:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> Schema:
    return _json(_ref("Error"), description)


_FORBIDDEN_ORIGIN = (
    "a browser's request: its `Origin` is not in `server.allowed_origins` (`forbidden_origin`)"
)
_GUARDED = {
    "401": _error("a management token is set and the request does not carry it (`unauthorized`)"),
    "403": _error(
        "no management token is set and the client is not on loopback (`forbidden`), or " + _FORBIDDEN_ORIGIN
    ),
}
_AT_THE_DOOR = {
    "421": _error(
        "no token authenticates the request and its `Host` is neither loopback nor in"
        " `server.allowed_hosts` (`misdirected_request`)"
    ),
    "500": _error("a bug (`internal_error`); the traceback is in the log, never in the answer"),
}
"""What any route may answer, before (or beside) what it does."""
_WITH_A_BODY = {
    "408": _error("the body stopped arriving: nothing of it for 60 s (`request_timeout`)"),
    "415": _error("a body that is not `application/json` (`unsupported_media_type`)"),
}
_BODY = {
    "400": _error("malformed JSON, not an object, or bad fields (`invalid_request`, with `fields`)"),
    "413": _error("body larger than 1 MiB (`request_too_large`)"),
}
_NO_FIELDS = {**_obj({}), "description": "no fields: an empty object, or no body at all"}
"""The body of an action that takes none: one that holds a field is refused, as an unknown one is."""
_GUARDED_V1 = _error("`server.api_keys` is set and the request carries none of them (`invalid_api_key`)")
_NOT_FOUND = {"404": _error("no such provider, connection or model (`not_found`)")}


def _op(
    summary: str,
    ok: Schema,
    *,
    errors: dict[str, Schema] | None = None,
    body: Schema | None = None,
    parameters: list[Schema] | None = None,
    tag: str = "management",
) -> Schema:
    responses: Schema = {"200": ok, **(errors or {})}
    operation: Schema = {"tags": [tag], "summary": summary, "responses": responses}
    if tag == "management":
        responses.update(_GUARDED)
        operation["security"] = [{}, {"managementToken": []}]
    else:
        responses["403"] = _error(_FORBIDDEN_ORIGIN)
        operation["security"] = [{}, {"clientApiKey": []}]
    for status, response in {**_AT_THE_DOOR, **(_WITH_A_BODY if body is not None else {})}.items():
        responses.setdefault(status, response)
    if body is not None:
        operation["requestBody"] = {"required": False, "content": {"application/json": {"schema": body}}}
    if parameters:
        operation["parameters"] = parameters
    return operation


_ID = {"name": "id", "in": "path", "required": True, "schema": _STR, "description": "a connection id"}


def _settings_path(group: str, name: str, card: str) -> Schema:
    whole, patch = _ref(name), _ref(name + "Patch")
    return {
        "get": _op(f"The {card} settings, every key", _json(whole, "the document")),
        "patch": _op(
            f"Change some {card} settings, atomically (deep merge)",
            _json(whole, "the document after the change, already on disk"),
            errors={
                **_BODY,
                "409": _error(
                    "the settings changed under this change on every try (a fleet's replicas out of"
                    " step), so nothing changed; send it again (`settings_conflict`)"
                ),
                "500": _error("the change could not be saved, so nothing changed (`settings_not_saved`)"),
            },
            body=patch,
        ),
    }


def _proxy_op(summary: str) -> Schema:
    request = {"type": "object", "required": ["model"], "properties": {"model": _STR, "stream": _BOOL}}
    return _op(
        summary,
        {
            "description": "the upstream's answer, relayed (a stream is relayed chunk by chunk)",
            "content": {"application/json": {}, "text/event-stream": {}},
        },
        errors={
            "400": _error(
                "not JSON, not an object, no `model` (or one no model is named: over 256 characters),"
                " or a `stream` that is not a boolean"
                " (`invalid_json`, `invalid_request`, `missing_model`, `invalid_model`, `invalid_stream`)"
            ),
            "401": _GUARDED_V1,
            "404": _error("no such model or connection (`model_not_found`, `connection_not_found`)"),
            "413": _error("body larger than 32 MiB (`request_too_large`)"),
            "429": _error("everything is cooling (`all_targets_cooling`), or a full request queue (`RATE_LIMIT_QUEUE_FULL`)"),
            "502": _error("the last upstream could not be reached (`upstream_unreachable`)"),
            "503": _error(
                "`provider_circuit_open`, `all_targets_unavailable`, `server_stopping` or `proxy_out_of_resources`"
            ),
            "504": _error("no response headers within requestQueue.maxWaitMs (`RATE_LIMIT_EXECUTION_TIMEOUT`)"),
        },
        body=request,
        tag="proxy",
    )  # fmt: skip


def _messages_op(summary: str) -> Schema:
    """`/v1/messages`: the proxy's own errors in Anthropic's shape (an upstream's are relayed)."""
    operation = _proxy_op(summary)
    anthropic = {"application/json": {"schema": _ref("AnthropicError")}}
    # (New dicts: the responses are shared with the other routes, which keep OpenAI's shape.)
    operation["responses"] = {
        status: response if status == "200" else {**response, "content": anthropic}
        for status, response in operation["responses"].items()
    }
    return operation


_RESPONSE_ID: Schema = {
    "name": "response_id",
    "in": "path",
    "required": True,
    "schema": _STR,
    "description": "a Responses API response id this proxy relayed in the last 24 hours",
}


def _follow_up(summary: str) -> Schema:
    return _op(
        summary,
        {"description": "the creating upstream's answer, relayed", "content": {"application/json": {}}},
        errors={
            "401": _GUARDED_V1,
            "404": _error("the proxy relayed no response with this id in the last 24 hours (`response_not_found`)"),
            "502": _error("that upstream could not be reached (`upstream_unreachable`)"),
        },
        parameters=[_RESPONSE_ID],
        tag="proxy",
    )  # fmt: skip


def _paths() -> dict[str, Schema]:
    ok_count = _obj({"ok": {"const": True}, "resetCount": _INT})
    return {
        "/v1/responses": {
            "post": _proxy_op("OpenAI Responses API, passed through to providers that speak it (`apis`)")
        },
        "/v1/responses/{response_id}": {
            "get": _follow_up("Retrieve a response, from the connection that created it"),
            "delete": _follow_up("Delete a response, at the connection that created it"),
        },
        "/v1/responses/{response_id}/cancel": {
            "post": _follow_up("Cancel a background response, at the connection that created it")
        },
        "/v1/messages": {
            "post": _messages_op("Anthropic Messages API, passed through to providers that speak it (`apis`)")
        },
        "/v1/messages/count_tokens": {
            "post": _messages_op(
                "Anthropic token counting: one attempt at one eligible connection, no fallback, counted by no layer"
            )
        },
        "/v1/chat/completions": {"post": _proxy_op("OpenAI chat completions, routed through the engine")},
        "/v1/completions": {"post": _proxy_op("OpenAI completions, routed through the engine")},
        "/v1/embeddings": {"post": _proxy_op("OpenAI embeddings, routed through the engine")},
        "/v1/models": {
            "get": _op(
                "Combos, configured targets, and what each upstream lists",
                _json(
                    _obj(
                        {
                            "object": {"const": "list"},
                            "data": {
                                "type": "array",
                                "items": _obj(
                                    {"id": _STR, "object": {"const": "model"}, "created": _INT, "owned_by": _STR}
                                ),
                            },
                        }
                    ),
                    "the model list",
                ),
                errors={"401": _GUARDED_V1},
                tag="proxy",
            )
        },
        "/api/monitoring/health": {
            "get": _op("Overview: status, breakers, connection counts, lockouts, requests", _json(_ref("Health"), "health")),
            "delete": _op(
                "Reset every breaker to CLOSED",
                _json(_obj({"success": {"const": True}, "resetCount": _INT}), "how many breakers"),
                errors=_BODY,
                body=_NO_FIELDS,
            ),
        },
        "/api/resilience/reset": {
            "post": _op(
                "Reset one breaker (`{provider}`) or all (`{}`)",
                _json(ok_count, "how many breakers"),
                errors={**_BODY, **_NOT_FOUND},
                body=_obj({"provider": _STR}, optional=("provider",)),
            )
        },
        "/api/resilience/connections": {
            "get": _op(
                "Every connection",
                _json(_obj({"connections": {"type": "array", "items": _ref("Connection")}}), "the connections"),
            )
        },
        "/api/resilience/connections/{id}/reset": {
            "post": _op(
                "Clear a connection's cooldown, backoff, errors and terminal state",
                _json(_obj({"ok": {"const": True}, "connection": _ref("Connection")}), "the connection after"),
                errors={**_BODY, **_NOT_FOUND},
                body=_NO_FIELDS,
                parameters=[_ID],
            )
        },
        "/api/providers/{id}": {
            "put": _op(
                "Clear a cooldown (`rateLimitedUntil: null`) and/or enable or disable (`isActive`)",
                _json(_obj({"connection": _ref("Connection")}), "the connection after"),
                errors={**_BODY, **_NOT_FOUND},
                body=_obj({"rateLimitedUntil": {"type": "null"}, "isActive": _BOOL}, optional=("rateLimitedUntil", "isActive")),
                parameters=[_ID],
            )
        },
        "/api/resilience/model-cooldowns": {
            "get": _op(
                "Active model lockouts, longest first",
                _json(_obj({"items": {"type": "array", "items": _ref("Lockout")}}), "the lockouts"),
            ),
            "delete": _op(
                "Lift lockouts: one model (`{provider, model}`), on one connection (`connectionId`), or all",
                _json(_obj({"ok": {"const": True}, "removed": _INT}), "how many were lifted"),
                errors={**_BODY, **_NOT_FOUND},
                body={
                    "oneOf": [
                        _obj({"provider": _STR, "model": _STR, "connectionId": _STR}, optional=("connectionId",)),
                        _obj({"all": {"const": True}}),
                    ]
                },
            ),
        },
        "/api/resilience": _settings_path("resilience", "ResilienceSettings", "resilience"),
        "/api/settings": _settings_path("settings", "LockoutSettings", "model lockout"),
        "/api/events": {
            "get": _op(
                "Recent state changes, oldest first",
                _json(_obj({"events": {"type": "array", "items": _ref("Event")}}), "events after `after`"),
                errors={"400": _error("`after` is not a non-negative integer (`invalid_request`)")},
                parameters=[
                    {
                        "name": "after",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 0, "default": 0},
                        "description": "only events with a greater `seq`",
                    }
                ],
            )
        },
        "/api/stream": {
            "get": _op(
                "The live stream: a snapshot, then every change (server-sent events)",
                {
                    "description": "`snapshot`, `event`, `state`, `settings` and `ping` messages; see docs/api.md",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}},
                },
                errors={"400": _error("`kinds` names something the stream does not send (`invalid_request`)")},
                parameters=[
                    {
                        "name": "kinds",
                        "in": "query",
                        "required": False,
                        "schema": _STR,
                        "description": "comma-separated: event, state, settings, request, counters (default all);"
                        " snapshot and ping always come",
                    },
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "required": False,
                        "schema": _STR,
                        "description": "the last message's `id`: resume after it (a snapshot when it is gone)",
                    }
                ],
            )
        },
        "/api/requests": {
            "get": _op(
                "Request records (alive and the last server.request_history finished), oldest first",
                _json(_obj({"requests": {"type": "array", "items": _ref("Request")}}), "the records"),
                errors={"400": _error("`after`, `limit` or `state` out of range (`invalid_request`, with `fields`)")},
                parameters=[
                    {"name": "after", "in": "query", "required": False,
                     "schema": {"type": "integer", "minimum": 0, "default": 0}, "description": "only records with a greater `seq`"},
                    {"name": "limit", "in": "query", "required": False,
                     "schema": {"type": "integer", "minimum": 1, "maximum": MAX_REQUESTS_LIMIT, "default": DEFAULT_REQUESTS_LIMIT}},
                    {"name": "state", "in": "query", "required": False,
                     "schema": {"type": "string", "enum": ["alive", "done"]}, "description": "alive or finished ones only"},
                ],
            )
        },
        "/api/requests/{id}": {
            "get": _op(
                "One request record",
                _json(_obj({"request": _ref("Request")}), "the record"),
                errors={"404": _error("not alive and no longer in the ring (`not_found`)")},
                parameters=[{"name": "id", "in": "path", "required": True, "schema": _STR, "description": "its X-Request-Id"}],
            )
        },
        "/api/stats": {
            "get": _op(
                "Traffic per provider and connection over a sliding window, of this replica or its fleet",
                _json(
                    _obj(
                        {
                            "window": {"type": "string", "enum": list(WINDOWS)},
                            "providers": {"type": "object", "additionalProperties": _ref("Stats")},
                            "connections": {"type": "object", "additionalProperties": _ref("Stats")},
                            "scope": {"const": "fleet", "description": "only with `scope=fleet`"},
                            "replicas": {
                                **_obj(
                                    {
                                        "summed": {"type": "array", "items": _STR, "description":
                                                   "the replicas added up, this one first (`local` without a fleet)"},
                                        "stale": {"type": "array", "items": _STR, "description":
                                                  "live replicas whose published windows are too old: left out"},
                                        "missing": {"type": "array", "items": _STR, "description":
                                                    "live replicas that published none (recording off, just started), "
                                                    "or every other one while Redis is away: left out"},
                                    }
                                ),
                                "description": "only with `scope=fleet`",
                            },
                        },
                        optional=("scope", "replicas"),
                    ),
                    "the statistics",
                ),
                errors={"400": _error("unknown `window` or `scope` (`invalid_request`, with `fields`)")},
                parameters=[
                    {"name": "window", "in": "query", "required": False,
                     "schema": {"type": "string", "enum": list(WINDOWS), "default": DEFAULT_WINDOW}},
                    {"name": "scope", "in": "query", "required": False,
                     "schema": {"type": "string", "enum": list(STATS_SCOPES), "default": STATS_SCOPES[0]},
                     "description": "`replica`: this replica's; `fleet`: summed over the fleet's live replicas "
                                    "(counts add, percentiles from the merged histograms; docs/fleet.md)"},
                ],
            )
        },
        "/metrics": {
            "get": _op(
                "Prometheus metrics (text exposition format); guarded like /api",
                {"description": "the metrics", "content": {"text/plain": {"schema": _STR}}},
            )
        },
        PATH: {"get": _op("This document", _json({"type": "object"}, "OpenAPI 3.1"))},
    }  # fmt: skip


@cache
def _text() -> bytes:
    return json.dumps(document(), ensure_ascii=False).encode()


def document() -> dict[str, Any]:
    """The whole OpenAPI document, as a fresh dict."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "omniroute",
            "version": __version__,
            "description": "An OpenAI-compatible proxy with resilience layers (/v1) and its management API "
            "(/api). Times are ISO 8601 UTC, durations integer milliseconds. See docs/api.md.",
        },
        "tags": [
            {"name": "proxy", "description": "OpenAI-compatible routes"},
            {"name": "management", "description": "state, operator actions and settings"},
        ],
        "paths": _paths(),
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {
                "managementToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "server.management_token; without one, /api answers loopback clients only",
                },
                "clientApiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "one of server.api_keys, when any are set",
                },
            },
        },
    }


async def _serve(request: Request) -> Response:
    return Response(_text(), media_type="application/json")


def openapi_route() -> Route:
    """`GET /api/openapi.json`, for the management API's route list."""
    return Route(PATH, _serve, methods=["GET"])
