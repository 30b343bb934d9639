"""The management API over real HTTP: every route, its exact shape, auth, and bad input.

The routes: docs/api.md#the-management-api.

Each test runs a real proxy (uvicorn, SQLite state, FakeClock; see conftest.py). Engine states are
set by driving the layers directly between requests, then read back through the API.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from proxy.resilience.clock import FakeClock
from proxy.resilience.timefmt import iso
from proxy.settings import defaults
from tests.conditions import fill_up, small_disk
from tests.fakes import FakeUpstream

if TYPE_CHECKING:  # fixtures hand these out; conftest modules are not imported by tests
    from starlette.types import ASGIApp, Message

    from tests.integration.conftest import Instance

TOKEN = "mgmt-token-0123456789"
T0 = FakeClock().now()
T0_ISO = "2026-01-01T00:00:00.000Z"

CONNECTION_KEYS = {
    "id", "provider", "name", "class", "priority", "enabled", "status", "rateLimitedUntil",
    "cooldownRemainingMs", "backoffLevel", "lastError", "lastErrorType", "errorCode", "lastErrorAt",
    "maxConcurrent", "inFlight", "apiKey", "lockouts",
}  # fmt: skip
BREAKER_KEYS = {
    "provider", "class", "state", "failureCount", "degradationThreshold", "failureThreshold",
    "retryAfterMs", "openCycleCount", "lastFailure", "lastTransition",
}  # fmt: skip
LOCKOUT_KEYS = {
    "provider", "connectionId", "model", "reason", "status", "failureCount", "remainingMs", "lockedAt",
    "expiresAt",
}  # fmt: skip
RESILIENCE_SECTIONS = [
    "requestQueue", "connectionCooldown", "providerBreaker", "comboCooldownWait",
    "quotaShareConcurrencyLimit", "streamRecovery", "sessionAffinity",
]  # fmt: skip

CHAT = {"model": "alpha/m1", "messages": [{"role": "user", "content": "hi"}]}


# ---------------------------------------------------------------------------------------------
# Helpers that put the engine into states (called between requests only).


def open_breaker(proxy: Instance, provider: str) -> None:
    breaker = proxy.engine.providers[provider].breaker
    for _ in range(breaker.policy.failure_threshold):
        breaker.record_failure(proxy.clock.now())


def cool(proxy: Instance, connection_id: str) -> None:
    conn = proxy.engine.connections[connection_id]
    policy = proxy.engine.settings.cooldown_policy(
        proxy.engine.providers[conn.spec.provider].spec.provider_class
    )
    conn.health.record_failure(
        proxy.clock.now(), policy, error="503 server_error", error_type="server_error", code=503
    )


def expire(proxy: Instance, connection_id: str) -> None:
    health = proxy.engine.connections[connection_id].health
    health.mark_terminal(proxy.clock.now(), "expired", error="401 unauthorized", code=401)


def lock(proxy: Instance, connection_id: str, model: str, times: int = 1) -> None:
    provider = proxy.engine.connections[connection_id].spec.provider
    for _ in range(times):
        proxy.engine.lockouts.record_failure(
            provider,
            connection_id,
            model,
            proxy.clock.now(),
            proxy.engine.settings.lockout(),
            status=404,
            reason="not_found",
        )


def ok_json(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    return response.json()


def rejected(response: httpx.Response, status: int) -> dict[str, Any]:
    """The `error` object of a JSON error answer with this status."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error: dict[str, Any] = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    return error


def events_after(proxy: Instance, seq: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = ok_json(proxy.get("/api/events", params={"after": seq}))["events"]
    return events


def fresh_connection(connection_id: str, provider: str, **changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "id": connection_id,
        "provider": provider,
        "name": connection_id,
        "class": "local",
        "priority": 100,
        "enabled": True,
        "status": "active",
        "rateLimitedUntil": None,
        "cooldownRemainingMs": 0,
        "backoffLevel": 0,
        "lastError": None,
        "lastErrorType": None,
        "errorCode": None,
        "lastErrorAt": None,
        "maxConcurrent": None,
        "inFlight": 0,
        "apiKey": None,
        "lockouts": [],
    }
    return base | changes


FRESH_CONNECTIONS = [
    fresh_connection("alpha-1", "alpha", priority=1),
    fresh_connection("alpha-2", "alpha", priority=2),
    fresh_connection(
        "beta-1", "beta", name="Beta main", maxConcurrent=2, apiKey="sk-…1234", **{"class": "apikey"}
    ),
]


def fresh_breaker(provider: str, cls: str) -> dict[str, object]:
    thresholds = {"local": (1, 2), "apikey": (7, 12)}[cls]
    return {
        "provider": provider,
        "class": cls,
        "state": "CLOSED",
        "failureCount": 0,
        "degradationThreshold": thresholds[0],
        "failureThreshold": thresholds[1],
        "retryAfterMs": 0,
        "openCycleCount": 0,
        "lastFailure": None,
        "lastTransition": None,
    }


# ---------------------------------------------------------------------------------------------
# GET / DELETE /api/monitoring/health


def test_health_of_a_fresh_instance(proxy: Instance) -> None:
    assert proxy.runtime is not None
    assert ok_json(proxy.get("/api/monitoring/health")) == {
        "status": "healthy",
        "timestamp": T0_ISO,
        "uptimeMs": 0,
        "version": proxy.runtime.version,
        "circuitBreakers": {"open": 0, "halfOpen": 0, "degraded": 0, "closed": 2, "total": 2},
        "providerBreakers": [fresh_breaker("alpha", "local"), fresh_breaker("beta", "apikey")],
        "providerHealth": {
            "alpha": {"state": "CLOSED", "failures": 0, "lastFailure": None},
            "beta": {"state": "CLOSED", "failures": 0, "lastFailure": None},
        },
        "connections": {"total": 3, "active": 3, "coolingDown": 0, "terminal": 0, "disabled": 0},
        "lockouts": [],
        "lockoutTable": {
            "size": 0,
            "capacity": 10_000,
            "full": False,
            "notFound": 0,
            "notFoundBudget": 100,
            "evicted": 0,
            "refused": 0,
        },
        "requests": {"total": 0, "ok": 0, "failed": 0, "inFlight": 0},
        "stateBackend": {"kind": "sqlite", "connected": True, "since": T0_ISO},
    }


def test_health_reports_every_layer(proxy: Instance) -> None:
    open_breaker(proxy, "alpha")
    cool(proxy, "beta-1")
    expire(proxy, "alpha-2")
    lock(proxy, "alpha-1", "m1")
    proxy.clock.advance(1000)

    health = ok_json(proxy.get("/api/monitoring/health"))

    assert health["status"] == "degraded"
    assert health["timestamp"] == "2026-01-01T00:00:01.000Z"
    assert health["uptimeMs"] == 1000
    assert health["circuitBreakers"] == {"open": 1, "halfOpen": 0, "degraded": 0, "closed": 1, "total": 2}
    alpha = health["providerBreakers"][0]
    assert set(alpha) == BREAKER_KEYS
    assert alpha == fresh_breaker("alpha", "local") | {
        "state": "OPEN",
        "failureCount": 2,
        "retryAfterMs": 14000,
        "openCycleCount": 1,
        "lastFailure": T0_ISO,
        "lastTransition": T0_ISO,
    }
    assert health["providerHealth"]["alpha"] == {"state": "OPEN", "failures": 2, "lastFailure": T0_ISO}
    assert health["connections"] == {"total": 3, "active": 1, "coolingDown": 1, "terminal": 1, "disabled": 0}
    assert health["lockouts"] == [
        {
            "provider": "alpha",
            "connectionId": "alpha-1",
            "model": "m1",
            "reason": "not_found",
            "status": 404,
            "failureCount": 1,
            "remainingMs": 119000,
            "lockedAt": T0_ISO,
            "expiresAt": "2026-01-01T00:02:00.000Z",
        }
    ]


def test_delete_health_resets_every_breaker(proxy: Instance) -> None:
    open_breaker(proxy, "alpha")
    open_breaker(proxy, "beta")
    seq = proxy.last_seq

    assert ok_json(proxy.send("DELETE", "/api/monitoring/health")) == {"success": True, "resetCount": 2}

    health = ok_json(proxy.get("/api/monitoring/health"))
    assert health["status"] == "healthy"
    assert [b["state"] for b in health["providerBreakers"]] == ["CLOSED", "CLOSED"]
    assert [(e["layer"], e["key"], e["from"], e["to"], e["reason"]) for e in events_after(proxy, seq)] == [
        ("breaker", "alpha", "OPEN", "CLOSED", "operator"),
        ("breaker", "beta", "OPEN", "CLOSED", "operator"),
        ("operator", "reset breaker --all", "", "", "api"),
    ]


# ---------------------------------------------------------------------------------------------
# POST /api/resilience/reset


def breaker_states(proxy: Instance) -> dict[str, str]:
    return {
        b["provider"]: b["state"] for b in ok_json(proxy.get("/api/monitoring/health"))["providerBreakers"]
    }


def test_reset_one_provider(proxy: Instance) -> None:
    open_breaker(proxy, "alpha")
    open_breaker(proxy, "beta")

    assert ok_json(proxy.send("POST", "/api/resilience/reset", {"provider": "beta"})) == {
        "ok": True,
        "resetCount": 1,
    }
    assert breaker_states(proxy) == {"alpha": "OPEN", "beta": "CLOSED"}


@pytest.mark.parametrize("body", [{}, b"", None], ids=["empty-object", "empty-bytes", "no-body"])
def test_reset_all_providers(proxy: Instance, body: object) -> None:
    open_breaker(proxy, "alpha")
    open_breaker(proxy, "beta")

    assert ok_json(proxy.send("POST", "/api/resilience/reset", body)) == {"ok": True, "resetCount": 2}
    assert breaker_states(proxy) == {"alpha": "CLOSED", "beta": "CLOSED"}


def test_reset_unknown_provider_is_404(proxy: Instance) -> None:
    open_breaker(proxy, "alpha")
    error = rejected(proxy.send("POST", "/api/resilience/reset", {"provider": "gamma"}), 404)
    assert error["code"] == "not_found"
    assert "gamma" in error["message"]
    assert breaker_states(proxy) == {"alpha": "OPEN", "beta": "CLOSED"}


NULL_MESSAGE = "must be a non-empty string; leave it out rather than send null"

MALFORMED = {
    "truncated": b'{"provider": "alpha"',
    "form-encoded": b"provider=alpha",
    "nan": b"NaN",
    "not-utf8": b'{"provider": "\xff"}',
    "deep-nesting": b"[" * 100_000,
}
NOT_AN_OBJECT = {
    "array": (b"[]", "an array"),
    "null": (b"null", "null"),
    "string": (b'"alpha"', "a string"),
    "number": (b"3", "a number"),
    "bool": (b"true", "a boolean"),
}


@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
def test_reset_rejects_malformed_json(proxy: Instance, body: bytes) -> None:
    open_breaker(proxy, "alpha")
    error = rejected(proxy.send("POST", "/api/resilience/reset", body), 400)
    assert error["code"] == "invalid_request"
    # (Nested past the parser's depth, it cannot tell whether the body would have been closed.)
    said = "the body is JSON nested deeper than" if body.startswith(b"[[") else "malformed JSON body"
    assert error["message"].startswith(said)
    assert breaker_states(proxy) == {"alpha": "OPEN", "beta": "CLOSED"}


@pytest.mark.parametrize(("body", "kind"), NOT_AN_OBJECT.values(), ids=NOT_AN_OBJECT.keys())
def test_reset_rejects_a_body_that_is_not_an_object(proxy: Instance, body: bytes, kind: str) -> None:
    open_breaker(proxy, "alpha")
    error = rejected(proxy.send("POST", "/api/resilience/reset", body), 400)
    assert error["fields"] == [{"field": "", "message": f"the body must be a JSON object, not {kind}"}]
    assert breaker_states(proxy) == {"alpha": "OPEN", "beta": "CLOSED"}


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"provider": 3}, [{"field": "provider", "message": "must be a non-empty string"}]),
        ({"provider": ""}, [{"field": "provider", "message": "must be a non-empty string"}]),
        ({"provider": ["alpha"]}, [{"field": "provider", "message": "must be a non-empty string"}]),
        # A script's unset variable: read as absent, it would reset every breaker.
        ({"provider": None}, [{"field": "provider", "message": NULL_MESSAGE}]),
        ({"providers": "alpha"}, [{"field": "providers", "message": "unknown key (expected provider)"}]),
    ],
)
def test_reset_rejects_bad_fields(proxy: Instance, body: dict[str, object], fields: list[object]) -> None:
    open_breaker(proxy, "alpha")
    assert rejected(proxy.send("POST", "/api/resilience/reset", body), 400)["fields"] == fields
    assert breaker_states(proxy) == {"alpha": "OPEN", "beta": "CLOSED"}


def test_oversized_body_is_413(proxy: Instance) -> None:
    body = b'{"provider": "' + b"a" * (1 << 20) + b'"}'
    assert rejected(proxy.send("POST", "/api/resilience/reset", body), 413)["code"] == "request_too_large"


def test_a_body_said_to_be_oversized_is_413_before_it_comes(proxy: Instance) -> None:
    """Content-Length says 5 MB, two bytes come: the answer does not wait for the rest."""
    assert proxy.server is not None
    host, port = proxy.server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(
            b"PATCH /api/resilience HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 5000000\r\n\r\n{}"
        )
        head = sock.recv(4096)  # (a timeout here: the server waited for the 5 MB)
    assert head.startswith(b"HTTP/1.1 413 ")


# ---------------------------------------------------------------------------------------------
# GET /api/resilience/connections, POST /api/resilience/connections/{id}/reset


def test_connections_of_a_fresh_instance(proxy: Instance) -> None:
    connections = ok_json(proxy.get("/api/resilience/connections"))["connections"]
    assert all(set(c) == CONNECTION_KEYS for c in connections)
    assert connections == FRESH_CONNECTIONS


def test_connections_show_cooldown_terminal_and_lockouts(proxy: Instance) -> None:
    cool(proxy, "beta-1")
    expire(proxy, "alpha-2")
    lock(proxy, "alpha-1", "m1")
    lock(proxy, "alpha-1", "m2", times=2)  # escalated: 240 s, listed first
    proxy.clock.advance(500)

    alpha1, alpha2, beta1 = ok_json(proxy.get("/api/resilience/connections"))["connections"]

    assert alpha1["status"] == "active"
    assert alpha1["lockouts"] == [
        {"model": "m2", "reason": "not_found", "remainingMs": 239500},
        {"model": "m1", "reason": "not_found", "remainingMs": 119500},
    ]
    assert alpha2 == FRESH_CONNECTIONS[1] | {
        "status": "expired",
        "lastError": "401 unauthorized",
        "lastErrorType": "expired",
        "errorCode": 401,
        "lastErrorAt": T0_ISO,
    }
    assert beta1 == FRESH_CONNECTIONS[2] | {
        "status": "cooling",
        "rateLimitedUntil": "2026-01-01T00:00:03.000Z",
        "cooldownRemainingMs": 2500,
        "backoffLevel": 1,
        "lastError": "503 server_error",
        "lastErrorType": "server_error",
        "errorCode": 503,
        "lastErrorAt": T0_ISO,
    }


def test_reset_connection_clears_cooldown_and_terminal_state(proxy: Instance) -> None:
    cool(proxy, "beta-1")
    expire(proxy, "alpha-2")

    for connection_id, fresh in (("beta-1", FRESH_CONNECTIONS[2]), ("alpha-2", FRESH_CONNECTIONS[1])):
        answer = ok_json(proxy.send("POST", f"/api/resilience/connections/{connection_id}/reset"))
        assert answer == {"ok": True, "connection": fresh}

    assert ok_json(proxy.get("/api/resilience/connections"))["connections"] == FRESH_CONNECTIONS
    assert ok_json(proxy.get("/api/monitoring/health"))["connections"]["active"] == 3


def test_reset_unknown_connection_is_404(proxy: Instance) -> None:
    error = rejected(proxy.send("POST", "/api/resilience/connections/ghost/reset"), 404)
    assert error["code"] == "not_found"
    assert "ghost" in error["message"]


# ---------------------------------------------------------------------------------------------
# PUT /api/providers/{id}


def test_put_rate_limited_until_null_clears_the_cooldown(proxy: Instance) -> None:
    cool(proxy, "beta-1")
    answer = ok_json(proxy.send("PUT", "/api/providers/beta-1", {"rateLimitedUntil": None}))
    assert answer == {"connection": FRESH_CONNECTIONS[2]}


def test_put_is_active_disables_and_enables(proxy: Instance) -> None:
    seq = proxy.last_seq

    answer = ok_json(proxy.send("PUT", "/api/providers/alpha-1", {"isActive": False}))
    assert answer == {"connection": FRESH_CONNECTIONS[0] | {"enabled": False, "status": "disabled"}}
    assert ok_json(proxy.get("/api/monitoring/health"))["connections"]["disabled"] == 1
    assert proxy.engine.connections["alpha-1"].health.enabled is False

    answer = ok_json(proxy.send("PUT", "/api/providers/alpha-1", {"isActive": True}))
    assert answer == {"connection": FRESH_CONNECTIONS[0]}
    assert [(e["layer"], e["key"], e["from"], e["to"], e["reason"]) for e in events_after(proxy, seq)] == [
        ("connection", "alpha-1", "active", "disabled", "operator"),
        ("operator", "disable alpha-1", "", "", "api"),
        ("connection", "alpha-1", "disabled", "active", "operator"),
        ("operator", "enable alpha-1", "", "", "api"),
    ]


def test_put_both_fields_at_once(proxy: Instance) -> None:
    expire(proxy, "alpha-2")
    answer = ok_json(
        proxy.send("PUT", "/api/providers/alpha-2", {"rateLimitedUntil": None, "isActive": False})
    )
    assert answer == {"connection": FRESH_CONNECTIONS[1] | {"enabled": False, "status": "disabled"}}


def test_put_unknown_connection_is_404(proxy: Instance) -> None:
    assert (
        rejected(proxy.send("PUT", "/api/providers/ghost", {"isActive": False}), 404)["code"] == "not_found"
    )


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({}, [{"field": "", "message": 'send {"rateLimitedUntil": null} and/or {"isActive": true|false}'}]),
        ({"isActive": "false"}, [{"field": "isActive", "message": "must be true or false"}]),
        ({"isActive": 0}, [{"field": "isActive", "message": "must be true or false"}]),
        ({"isActive": None}, [{"field": "isActive", "message": "must be true or false"}]),
        (
            {"rateLimitedUntil": "2026-01-01T00:00:00.000Z"},
            [{"field": "rateLimitedUntil", "message": "only null is accepted (it clears the cooldown)"}],
        ),
        (
            {"rateLimitedUntil": 0},
            [{"field": "rateLimitedUntil", "message": "only null is accepted (it clears the cooldown)"}],
        ),
        (
            {"isActive": False, "priority": 1},
            [{"field": "priority", "message": "unknown key (expected rateLimitedUntil, isActive)"}],
        ),
        (b"[]", [{"field": "", "message": "the body must be a JSON object, not an array"}]),
        (
            b"{",
            [
                {
                    "field": "",
                    "message": "malformed JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
                }
            ],
        ),
    ],
)
def test_put_rejects_bad_bodies_and_changes_nothing(
    proxy: Instance, body: object, fields: list[object] | None
) -> None:
    cool(proxy, "beta-1")
    before = ok_json(proxy.get("/api/resilience/connections"))

    error = rejected(proxy.send("PUT", "/api/providers/beta-1", body), 400)

    assert error.get("fields") == fields
    assert ok_json(proxy.get("/api/resilience/connections")) == before


# ---------------------------------------------------------------------------------------------
# GET / DELETE /api/resilience/model-cooldowns


def reenable(proxy: Instance, body: object) -> Any:
    return ok_json(proxy.send("DELETE", "/api/resilience/model-cooldowns", body))


def lockout_items(proxy: Instance) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = ok_json(proxy.get("/api/resilience/model-cooldowns"))["items"]
    return items


def test_model_cooldowns_longest_first(proxy: Instance) -> None:
    lock(proxy, "alpha-1", "m1")
    lock(proxy, "alpha-2", "m1", times=3)  # 480 s
    lock(proxy, "beta-1", "gpt", times=2)  # 240 s

    items = lockout_items(proxy)

    assert all(set(item) == LOCKOUT_KEYS for item in items)
    assert [(i["connectionId"], i["model"], i["failureCount"], i["remainingMs"]) for i in items] == [
        ("alpha-2", "m1", 3, 480000),
        ("beta-1", "gpt", 2, 240000),
        ("alpha-1", "m1", 1, 120000),
    ]
    assert items[1] == {
        "provider": "beta",
        "connectionId": "beta-1",
        "model": "gpt",
        "reason": "not_found",
        "status": 404,
        "failureCount": 2,
        "remainingMs": 240000,
        "lockedAt": T0_ISO,
        "expiresAt": iso(T0 + 240000),
    }


def test_model_cooldowns_empty(proxy: Instance) -> None:
    assert ok_json(proxy.get("/api/resilience/model-cooldowns")) == {"items": []}


def test_reenable_one_triple(proxy: Instance) -> None:
    lock(proxy, "alpha-1", "m1")
    lock(proxy, "alpha-2", "m1")

    body = {"provider": "alpha", "model": "m1", "connectionId": "alpha-2"}
    assert reenable(proxy, body) == {"ok": True, "removed": 1}
    assert [(i["connectionId"], i["model"]) for i in lockout_items(proxy)] == [("alpha-1", "m1")]


def test_reenable_a_model_across_connections(proxy: Instance) -> None:
    lock(proxy, "alpha-1", "m1")
    lock(proxy, "alpha-2", "m1")
    lock(proxy, "alpha-1", "m2")

    body = {"provider": "alpha", "model": "m1"}  # no connectionId: every connection of the provider
    assert reenable(proxy, body) == {"ok": True, "removed": 2}
    assert [(i["connectionId"], i["model"]) for i in lockout_items(proxy)] == [("alpha-1", "m2")]


def test_reenable_all(proxy: Instance) -> None:
    lock(proxy, "alpha-1", "m1")
    lock(proxy, "beta-1", "gpt")
    seq = proxy.last_seq

    assert reenable(proxy, {"all": True}) == {"ok": True, "removed": 2}
    assert lockout_items(proxy) == []
    assert [(e["layer"], e["key"], e["to"], e["reason"]) for e in events_after(proxy, seq)][-1] == (
        "operator",
        "reenable --all",
        "",
        "api",
    )


def test_reenable_a_model_that_is_not_locked_removes_nothing(proxy: Instance) -> None:
    body = {"provider": "alpha", "model": "m9"}
    assert reenable(proxy, body) == {"ok": True, "removed": 0}


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        (
            {},
            [
                {"field": "provider", "message": "required: a non-empty string"},
                {"field": "model", "message": "required: a non-empty string"},
            ],
        ),
        (None, [
            {"field": "provider", "message": "required: a non-empty string"},
            {"field": "model", "message": "required: a non-empty string"},
        ]),
        ({"provider": "alpha"}, [{"field": "model", "message": "required: a non-empty string"}]),
        ({"provider": "alpha", "model": 5}, [{"field": "model", "message": "must be a non-empty string"}]),
        (
            {"provider": "alpha", "model": "m1", "connectionId": 7},
            [{"field": "connectionId", "message": "must be a non-empty string"}],
        ),
        (
            {"provider": "alpha", "model": "m1", "extra": 1},
            [{"field": "extra", "message": "unknown key (expected provider, model, connectionId, all)"}],
        ),
        (
            {"all": False},
            [{"field": "all", "message": "must be true (or send {provider, model[, connectionId]})"}],
        ),
        (
            {"all": "yes"},
            [{"field": "all", "message": "must be true (or send {provider, model[, connectionId]})"}],
        ),
        ({"all": True, "provider": "alpha"}, [{"field": "provider", "message": 'cannot be combined with "all"'}]),
        # A script's unset variable: read as absent, it would lift the model's lockout on every connection.
        ({"provider": "alpha", "model": "m1", "connectionId": None}, [{"field": "connectionId", "message": NULL_MESSAGE}]),
        (b"[1]", [{"field": "", "message": "the body must be a JSON object, not an array"}]),
        (b"{'all': true}", [{"field": "", "message": "malformed JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"}]),
    ],
)  # fmt: skip
def test_reenable_rejects_bad_bodies_and_changes_nothing(
    proxy: Instance, body: object, fields: list[object] | None
) -> None:
    lock(proxy, "alpha-1", "m1")

    error = rejected(proxy.send("DELETE", "/api/resilience/model-cooldowns", body), 400)

    assert error.get("fields") == fields
    assert len(lockout_items(proxy)) == 1


@pytest.mark.parametrize(
    "body",
    [
        {"provider": "gamma", "model": "m1"},
        {"provider": "alpha", "model": "m1", "connectionId": "ghost"},
        {"provider": "alpha", "model": "m1", "connectionId": "beta-1"},  # another provider's connection
    ],
)
def test_reenable_unknown_provider_or_connection_is_404(proxy: Instance, body: dict[str, object]) -> None:
    lock(proxy, "alpha-1", "m1")
    lock(proxy, "beta-1", "m1")
    assert rejected(proxy.send("DELETE", "/api/resilience/model-cooldowns", body), 404)["code"] == "not_found"
    assert len(lockout_items(proxy)) == 2


def test_reenabled_model_takes_traffic_again(
    make_instance: Callable[..., Instance], upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = upstream
    proxy = make_instance(alpha_url=url)
    lock(proxy, "alpha-1", "m1")
    lock(proxy, "alpha-2", "m1")

    blocked = proxy.send("POST", "/v1/chat/completions", CHAT)
    assert blocked.status_code != 200
    assert not [r for r in fake.requests if r.path == "/v1/chat/completions"]

    body = {"provider": "alpha", "model": "m1"}
    assert reenable(proxy, body) == {"ok": True, "removed": 2}

    served = ok_json(proxy.send("POST", "/v1/chat/completions", CHAT))
    assert served["choices"][0]["message"]["content"] == "hello from alpha-upstream"
    assert [r.json["model"] for r in fake.requests if r.path == "/v1/chat/completions"] == ["m1"]


# ---------------------------------------------------------------------------------------------
# GET / PATCH /api/resilience and /api/settings


def test_get_resilience_settings(proxy: Instance) -> None:
    document = ok_json(proxy.get("/api/resilience"))
    assert list(document) == RESILIENCE_SECTIONS
    assert document == {name: defaults()[name] for name in RESILIENCE_SECTIONS}
    assert document["providerBreaker"]["local"] == {
        "failureThreshold": 2,
        "degradationThreshold": 1,
        "resetTimeoutMs": 15000,
    }
    assert document["quotaShareConcurrencyLimit"] == {
        "enabled": True,
        "queueDepth": 20,
        "queueTimeoutMs": 30000,
    }
    assert document["sessionAffinity"] == {"ttlMs": 0}


def test_patch_resilience_changes_one_value(proxy: Instance) -> None:
    seq = proxy.last_seq
    expected = ok_json(proxy.get("/api/resilience"))
    expected["providerBreaker"]["local"]["resetTimeoutMs"] = 1000

    patch = {"providerBreaker": {"local": {"resetTimeoutMs": 1000}}}
    assert ok_json(proxy.send("PATCH", "/api/resilience", patch)) == expected

    assert ok_json(proxy.get("/api/resilience")) == expected
    assert proxy.engine.providers["alpha"].breaker.policy.reset_timeout_ms == 1000
    assert [(e["layer"], e["key"], e["from"], e["to"], e["reason"]) for e in events_after(proxy, seq)] == [
        ("settings", "providerBreaker.local.resetTimeoutMs", "15000", "1000", "patch"),
        ("operator", "settings set providerBreaker.local.resetTimeoutMs=1000", "", "", "api"),
    ]


def test_patch_resilience_applies_live_to_breakers(proxy: Instance) -> None:
    patch = {"providerBreaker": {"local": {"failureThreshold": 5, "degradationThreshold": 3}}}
    ok_json(proxy.send("PATCH", "/api/resilience", patch))
    alpha = ok_json(proxy.get("/api/monitoring/health"))["providerBreakers"][0]
    assert (alpha["degradationThreshold"], alpha["failureThreshold"]) == (3, 5)


@pytest.mark.parametrize(
    ("patch", "fields"),
    [
        (
            {
                "providerBreaker": {"local": {"resetTimeoutMs": 2000, "failureThreshold": 0}},
                "sessionAffinity": {"ttlMs": 1000},
            },
            [{"field": "providerBreaker.local.failureThreshold", "message": "must be an integer between 1 and 1000"}],
        ),
        (
            {"sessionAffinity": {"ttlMs": 1000}, "requestQueue": {"maxWaitMs": "15000"}},
            [{"field": "requestQueue.maxWaitMs", "message": "must be an integer between 1 and 30000"}],
        ),
        (
            {"sessionAffinity": {"ttlMs": 1000}, "providerBreaker": {"local": {"bogus": 1}}},
            [{"field": "providerBreaker.local.bogus", "message": "unknown key"}],
        ),
        (
            {"sessionAffinity": {"ttlMs": 1000}, "modelLockout": {"enabled": True}},
            [{"field": "modelLockout", "message": "unknown key"}],
        ),
        (
            {"sessionAffinity": {"ttlMs": 1000}, "comboCooldownWait": True},
            [{"field": "comboCooldownWait", "message": "must be an object"}],
        ),
    ],
)  # fmt: skip
def test_patch_resilience_is_strict_and_atomic(
    proxy: Instance, patch: dict[str, object], fields: list[object]
) -> None:
    before = ok_json(proxy.get("/api/resilience"))
    seq = proxy.last_seq

    error = rejected(proxy.send("PATCH", "/api/resilience", patch), 400)

    assert error["code"] == "invalid_request"
    assert error["fields"] == fields
    assert ok_json(proxy.get("/api/resilience")) == before
    assert events_after(proxy, seq) == []


def test_patch_resilience_cross_field_rule(proxy: Instance) -> None:
    before = ok_json(proxy.get("/api/resilience"))
    error = rejected(
        proxy.send("PATCH", "/api/resilience", {"providerBreaker": {"local": {"degradationThreshold": 5}}}),
        400,
    )
    assert [f["field"] for f in error["fields"]] == ["providerBreaker.local.degradationThreshold"]
    assert ok_json(proxy.get("/api/resilience")) == before


@pytest.mark.parametrize("path", ["/api/resilience", "/api/settings"])
@pytest.mark.parametrize(
    ("body", "fields"),
    [
        (
            b'{"sessionAffinity": ',
            [{"field": "", "message": "malformed JSON: Expecting value: line 1 column 21 (char 20)"}],
        ),
        (b"[]", [{"field": "", "message": "the body must be a JSON object, not an array"}]),
        (b'"x"', [{"field": "", "message": "the body must be a JSON object, not a string"}]),
    ],
)
def test_patch_rejects_non_object_bodies(
    proxy: Instance, path: str, body: bytes, fields: list[object] | None
) -> None:
    before = ok_json(proxy.get(path))
    assert rejected(proxy.send("PATCH", path, body), 400).get("fields") == fields
    assert ok_json(proxy.get(path)) == before


def test_empty_patch_changes_nothing(proxy: Instance) -> None:
    before = ok_json(proxy.get("/api/resilience"))
    assert ok_json(proxy.send("PATCH", "/api/resilience", {})) == before


def test_get_and_patch_settings_model_lockout(proxy: Instance) -> None:
    document = ok_json(proxy.get("/api/settings"))
    assert document == {
        "modelLockout": {
            "enabled": False,
            "errorCodes": [403, 404, 429, 502, 503, 504],
            "baseCooldownMs": 120000,
            "maxCooldownMs": 1800000,
            "maxBackoffSteps": 10,
            "useExponentialBackoff": True,
        }
    }

    patched = ok_json(
        proxy.send("PATCH", "/api/settings", {"modelLockout": {"enabled": True, "errorCodes": [429]}})
    )

    expected = {"modelLockout": document["modelLockout"] | {"enabled": True, "errorCodes": [429]}}
    assert patched == expected
    assert ok_json(proxy.get("/api/settings")) == expected
    assert proxy.engine.settings.lockout().error_codes == (429,)


@pytest.mark.parametrize(
    ("patch", "fields"),
    [
        (
            {"modelLockout": {"enabled": True, "maxCooldownMs": 5000}},
            ["modelLockout.maxCooldownMs"],
        ),
        ({"modelLockout": {"enabled": True, "errorCodes": [429, 700]}}, ["modelLockout.errorCodes"]),
        ({"modelLockout": {"enabled": 1}}, ["modelLockout.enabled"]),
        ({"providerBreaker": {"local": {"resetTimeoutMs": 1000}}}, ["providerBreaker"]),
    ],
)
def test_patch_settings_is_strict_and_atomic(
    proxy: Instance, patch: dict[str, object], fields: list[str]
) -> None:
    before = ok_json(proxy.get("/api/settings"))
    error = rejected(proxy.send("PATCH", "/api/settings", patch), 400)
    assert [f["field"] for f in error["fields"]] == fields
    assert ok_json(proxy.get("/api/settings")) == before
    assert ok_json(proxy.get("/api/resilience"))["providerBreaker"]["local"]["resetTimeoutMs"] == 15000


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param(
            "/api/resilience",
            b'{"providerBreaker": {"local": {"resetTimeoutMs": 1111}},'
            b' "providerBreaker": {"apikey": {"resetTimeoutMs": 2222}}}',
            id="a-second-section-replaces-the-first",
        ),
        pytest.param(
            "/api/resilience",
            b'{"requestQueue": {"bogus": 1}, "requestQueue": {"maxWaitMs": 1234}}',
            id="an-unknown-key-hidden",
        ),
        pytest.param(
            "/api/resilience",
            b'{"requestQueue": {"maxWaitMs": -5, "maxWaitMs": 1235}}',
            id="out-of-range-hidden",
        ),
        pytest.param(
            "/api/settings", b'{"modelLockout": {"enabled": "yes", "enabled": true}}', id="wrong-type-hidden"
        ),
    ],
)
def test_a_settings_patch_that_repeats_a_key_is_refused_whole(
    proxy: Instance, path: str, body: bytes
) -> None:
    """A repeated member read as its last copy (found by a trial) dropped a section of the PATCH, or
    hid an unknown key, an out-of-range value or a wrong type behind a good one, with a 200."""
    before = ok_json(proxy.get(path))
    error = rejected(proxy.send("PATCH", path, body), 400)
    assert error["fields"][0]["field"] == "" and "is given twice in one object" in error["message"]
    assert ok_json(proxy.get(path)) == before


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        pytest.param(
            "DELETE", "/api/resilience/model-cooldowns", b'{"all": false, "all": true}', id="reenable-all"
        ),
        pytest.param(
            "POST", "/api/resilience/reset", b'{"provider": "nope", "provider": "alpha"}', id="reset"
        ),
        pytest.param("PUT", "/api/providers/alpha-1", b'{"isActive": "no", "isActive": false}', id="disable"),
    ],
)
def test_an_action_whose_body_repeats_a_key_is_refused_and_does_nothing(
    proxy: Instance, method: str, path: str, body: bytes
) -> None:
    """`{"all": true, "all": false}` was refused but `{"all": false, "all": true}` lifted every
    lockout; a 404's provider named first let the second one's breaker be reset."""
    start = proxy.last_seq
    rejected(proxy.send(method, path, body), 400)
    assert events_after(proxy, start) == []


def test_changes_survive_a_restart(proxy: Instance) -> None:
    ok_json(proxy.send("PATCH", "/api/resilience", {"sessionAffinity": {"ttlMs": 60000}}))
    ok_json(proxy.send("PATCH", "/api/settings", {"modelLockout": {"baseCooldownMs": 30000}}))
    ok_json(proxy.send("PUT", "/api/providers/beta-1", {"isActive": False}))

    proxy.restart()

    assert ok_json(proxy.get("/api/resilience"))["sessionAffinity"] == {"ttlMs": 60000}
    assert ok_json(proxy.get("/api/settings"))["modelLockout"]["baseCooldownMs"] == 30000
    beta1 = ok_json(proxy.get("/api/resilience/connections"))["connections"][2]
    assert (beta1["id"], beta1["enabled"], beta1["status"]) == ("beta-1", False, "disabled")


# ---------------------------------------------------------------------------------------------
# GET /api/events


def test_events_after_a_sequence_number(proxy: Instance) -> None:
    start = proxy.last_seq
    open_breaker(proxy, "alpha")
    ok_json(proxy.send("POST", "/api/resilience/reset", {"provider": "alpha"}))

    events = events_after(proxy, start)

    assert events == [
        {"seq": start + 1, "ts": T0, "layer": "breaker", "key": "alpha", "from": "CLOSED", "to": "DEGRADED",
         "reason": "failures"},
        {"seq": start + 2, "ts": T0, "layer": "breaker", "key": "alpha", "from": "DEGRADED", "to": "OPEN",
         "reason": "failures"},
        {"seq": start + 3, "ts": T0, "layer": "breaker", "key": "alpha", "from": "OPEN", "to": "CLOSED",
         "reason": "operator"},
        {"seq": start + 4, "ts": T0, "layer": "operator", "key": "reset breaker alpha", "from": "", "to": "",
         "reason": "api"},
    ]  # fmt: skip
    assert events_after(proxy, start + 3) == events[3:]
    assert events_after(proxy, start + 4) == []
    assert ok_json(proxy.get("/api/events"))["events"][-4:] == events  # no `after`: from the start


@pytest.mark.parametrize("after", ["-1", "x", "", "1.5", " 1", "0x10", "١"])
def test_events_rejects_a_bad_after(proxy: Instance, after: str) -> None:
    error = rejected(proxy.get("/api/events", params={"after": after}), 400)
    assert [f["field"] for f in error["fields"]] == ["after"]


# ---------------------------------------------------------------------------------------------
# Routing and auth


@pytest.mark.parametrize(
    ("method", "path"),
    [("DELETE", "/api/monitoring/health"), ("POST", "/api/resilience/connections/alpha-1/reset")],
)
def test_an_action_that_takes_no_fields_refuses_any_and_does_nothing(
    proxy: Instance, method: str, path: str
) -> None:
    open_breaker(proxy, "alpha")
    error = rejected(proxy.send(method, path, {"provider": "beta"}), 400)
    assert error["code"] == "invalid_request" and error["fields"][0]["field"] == "provider"
    assert breaker_states(proxy)["alpha"] == "OPEN"
    assert [e for e in proxy.get("/api/events").json()["events"] if e["layer"] == "operator"] == []


def test_unknown_route_and_wrong_method(proxy: Instance) -> None:
    assert rejected(proxy.get("/api/nothing-here"), 404)["code"] == "not_found"
    wrong = proxy.send("PUT", "/api/monitoring/health")
    assert rejected(wrong, 405)["code"] == "method_not_allowed"
    assert set(wrong.headers["allow"].split(", ")) == {"GET", "HEAD", "DELETE"}  # what is allowed
    assert (
        rejected(proxy.send("POST", "/api/resilience/model-cooldowns"), 405)["code"] == "method_not_allowed"
    )


ROUTES: list[tuple[str, str, object]] = [
    ("GET", "/api/monitoring/health", None),
    ("DELETE", "/api/monitoring/health", None),
    ("POST", "/api/resilience/reset", {}),
    ("GET", "/api/resilience/connections", None),
    ("POST", "/api/resilience/connections/alpha-1/reset", None),
    ("PUT", "/api/providers/alpha-1", {"isActive": False}),
    ("GET", "/api/resilience/model-cooldowns", None),
    ("DELETE", "/api/resilience/model-cooldowns", {"all": True}),
    ("GET", "/api/resilience", None),
    ("PATCH", "/api/resilience", {"sessionAffinity": {"ttlMs": 5000}}),
    ("GET", "/api/settings", None),
    ("PATCH", "/api/settings", {"modelLockout": {"enabled": True}}),
    ("GET", "/api/events", None),
]


def test_every_route_answers_loopback_without_a_token(proxy: Instance) -> None:
    for method, path, body in ROUTES:
        response = proxy.send(method, path, body)
        assert response.status_code == 200, (method, path, response.text)


def test_every_route_needs_the_token_when_one_is_set(make_instance: Callable[..., Instance]) -> None:
    proxy = make_instance(TOKEN)
    open_breaker(proxy, "alpha")
    lock(proxy, "alpha-1", "m1")
    del proxy.http.headers["Authorization"]
    wrong = [None, "Bearer nope", f"Basic {TOKEN}", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer"]

    for method, path, body in ROUTES:
        for authorization in wrong:
            headers = {"Authorization": authorization} if authorization else {}
            response = proxy.send(method, path, body, headers=headers)
            assert response.status_code == 401, (method, path, authorization)
            assert response.json()["error"]["code"] == "unauthorized"

    # Nothing the refused requests asked for happened.
    proxy.http.headers["Authorization"] = f"Bearer {TOKEN}"
    assert breaker_states(proxy)["alpha"] == "OPEN"
    assert len(lockout_items(proxy)) == 1
    assert ok_json(proxy.get("/api/settings"))["modelLockout"]["enabled"] is False
    assert ok_json(proxy.get("/api/resilience"))["sessionAffinity"] == {"ttlMs": 0}
    assert proxy.engine.connections["alpha-1"].health.enabled is True


def test_the_right_token_opens_every_route(make_instance: Callable[..., Instance]) -> None:
    proxy = make_instance(TOKEN)
    for method, path, body in ROUTES:
        response = proxy.send(method, path, body)
        assert response.status_code == 200, (method, path, response.text)


async def call_asgi(
    app: ASGIApp, client: tuple[str, int], headers: list[tuple[bytes, bytes]]
) -> tuple[int, Any]:
    """One GET /api/monitoring/health straight through the ASGI app, from `client`."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/api/monitoring/health",
        "raw_path": b"/api/monitoring/health",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": client,
        "server": ("127.0.0.1", 20128),
    }
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = sent[0]["status"]
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body)


async def test_without_a_token_only_loopback_clients_are_answered(
    guarded_app: Callable[[str | None], ASGIApp],
) -> None:
    app = guarded_app(None)
    status, body = await call_asgi(app, ("10.0.0.5", 1234), [])
    assert status == 403
    assert body["error"]["code"] == "forbidden"
    assert (await call_asgi(app, ("127.0.0.1", 1234), []))[0] == 200
    assert (await call_asgi(app, ("::1", 1234), []))[0] == 200


async def test_with_a_token_remote_clients_need_it(guarded_app: Callable[[str | None], ASGIApp]) -> None:
    app = guarded_app(TOKEN)
    assert (await call_asgi(app, ("10.0.0.5", 1234), []))[0] == 401
    bearer = (b"authorization", f"Bearer {TOKEN}".encode())
    status, body = await call_asgi(app, ("10.0.0.5", 1234), [bearer])
    assert status == 200
    assert body["status"] == "healthy"


def test_an_action_the_full_disk_refuses_is_saved_when_it_has_room_again_as_its_answer_says(
    make_instance: Callable[..., Instance],
) -> None:
    """An action stays in effect when the store refuses it; the store keeps trying, and saves it
    once the disk has room. The answer said "a restart would undo it", which the next successful
    write made untrue (found by a lifecycle trial): it says when that holds."""
    with small_disk(512) as disk:
        state = disk / "state.db"
        proxy = make_instance(state=state)
        try:
            fill_up(disk)
            response = proxy.send("PUT", "/api/providers/alpha-1", {"isActive": False})
            assert response.status_code == 500, response.text
            error = response.json()["error"]
            assert error["code"] == "action_not_saved"
            assert "the disk is full" in error["message"]
            assert error["message"].endswith(
                "; it is saved as soon as the state file takes writes again (until then, a restart"
                " would undo it)"
            )
            (disk / "filler").unlink()
            assert proxy.runtime is not None and proxy.runtime.store.flush(10.0)
            proxy.restart()
            assert ok_json(proxy.get("/api/resilience/connections"))["connections"][0]["status"] == "disabled"
        finally:
            (disk / "filler").unlink(missing_ok=True)
            proxy.stop()


def test_a_settings_change_the_disk_refuses_is_a_500_with_the_reason_and_not_applied(
    make_instance: Callable[..., Instance], caplog: pytest.LogCaptureFixture
) -> None:
    """Only a change that a restart would keep is acknowledged (issue #21): with the disk full,
    PATCH says so, the live settings stay as they were, and the log has one line, no traceback."""
    with small_disk(512) as disk:
        state = disk / "state.db"
        proxy = make_instance(state=state)
        try:
            before = ok_json(proxy.get("/api/resilience"))
            fill_up(disk)
            patch = {"providerBreaker": {"local": {"resetTimeoutMs": 1000}}}
            response = proxy.send("PATCH", "/api/resilience", patch)
            assert response.status_code == 500, response.text  # the reason, never an "internal error"
            error = response.json()["error"]
            assert error["code"] == "settings_not_saved"
            assert error["message"].startswith(
                f"settings not saved, nothing changed: {state}: cannot save settings"
            )
            assert "the disk is full" in error["message"]
            assert ok_json(proxy.get("/api/resilience")) == before
            assert proxy.engine.providers["alpha"].breaker.policy.reset_timeout_ms == 15000
        finally:
            (disk / "filler").unlink()
            proxy.stop()
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


def test_a_settings_change_is_an_operator_action_with_its_cli_command(proxy: Instance) -> None:
    """Like every action: the settings events say what changed, and one `operator` event says who
    did it and how to do it again from a shell (values as the instance took them)."""
    seq = proxy.last_seq
    resilience = {
        "connectionCooldown": {"apikey": {"baseCooldownMs": 5000}},
        "streamRecovery": {"throughputWatchdog": {"enabled": True}},
    }
    assert proxy.send("PATCH", "/api/resilience", resilience).status_code == 200
    assert (
        proxy.send("PATCH", "/api/settings", {"modelLockout": {"errorCodes": [404, 429]}}).status_code == 200
    )
    operator = [(e["key"], e["reason"]) for e in events_after(proxy, seq) if e["layer"] == "operator"]
    assert operator == [
        (
            "settings set connectionCooldown.apikey.baseCooldownMs=5000"
            " streamRecovery.throughputWatchdog.enabled=true",
            "api",
        ),
        ("settings set modelLockout.errorCodes=404,429", "api"),
    ]
