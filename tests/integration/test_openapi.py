"""`GET /api/openapi.json` against the real server: the same routes, and real answers fit its schemas.

A route added to the app without being described (or described without existing) fails here, and
so does a field added to (or dropped from) an answer: the schemas are closed (no other properties).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx

from proxy.app import create_app
from proxy.openapi import PATH, document
from proxy.settings import SCHEMA, defaults
from tests.fakes import FakeUpstream

if TYPE_CHECKING:  # fixtures hand these out; conftest modules are not imported by tests
    from collections.abc import Callable

    from tests.integration.conftest import Instance

TOKEN = "openapi-token-0123456789"
METHODS = {"get", "put", "post", "delete", "patch"}


# ---------------------------------------------------------------------------------------------
# A small JSON Schema checker: the subset the document uses.


def problems(value: Any, schema: dict[str, Any], doc: dict[str, Any], where: str = "$") -> list[str]:
    """Every way `value` breaks `schema`, each naming the path in the value."""
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/components/schemas/")
        return problems(value, doc["components"]["schemas"][name], doc, where)
    if "oneOf" in schema:
        fits = [s for s in schema["oneOf"] if not problems(value, s, doc, where)]
        return [] if len(fits) == 1 else [f"{where}: fits {len(fits)} of the oneOf schemas"]
    found: list[str] = []
    if "const" in schema and value != schema["const"]:
        found.append(f"{where}: {value!r} is not {schema['const']!r}")
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_is(value, kind) for kind in kinds):
            return [*found, f"{where}: {value!r} is not {' or '.join(kinds)}"]
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{where}: {value!r} not in {schema['enum']}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            found.append(f"{where}: {value} < {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            found.append(f"{where}: {value} > {schema['maximum']}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                found.append(f"{where}: missing {name!r}")
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in properties:
                found += problems(item, properties[name], doc, f"{where}.{name}")
            elif extra is False:
                found.append(f"{where}: unexpected {name!r}")
            elif isinstance(extra, dict):
                found += problems(item, extra, doc, f"{where}.{name}")
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            found.append(f"{where}: more than {schema['maxItems']} items")
        for index, item in enumerate(value):
            found += problems(item, schema.get("items", {}), doc, f"{where}[{index}]")
    return found


def _is(value: Any, kind: str) -> bool:
    return {
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
        "string": isinstance(value, str),
        "boolean": isinstance(value, bool),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "null": value is None,
    }[kind]


def answer_schema(doc: dict[str, Any], path: str, method: str, status: int) -> dict[str, Any]:
    response = doc["paths"][path][method]["responses"][str(status)]
    schema: dict[str, Any] = response["content"]["application/json"]["schema"]
    return schema


def fits(doc: dict[str, Any], response: httpx.Response, path: str, method: str) -> None:
    assert response.headers["content-type"] == "application/json", response.text
    schema = answer_schema(doc, path, method, response.status_code)
    assert problems(response.json(), schema, doc) == [], (path, method, response.status_code)


# ---------------------------------------------------------------------------------------------


def _routes(instance: Instance) -> set[tuple[str, str]]:
    assert instance.runtime is not None
    app: Any = create_app(instance.runtime, manage_lifecycle=False)  # the served app's twin: same routes
    while not hasattr(app, "routes"):  # the Guard wraps the Starlette app
        app = app.app
    return {
        (route.path, method.lower())
        for route in app.routes
        for method in route.methods or ()
        if method != "HEAD"  # Starlette adds HEAD to every GET by itself
    }


def test_the_document_describes_exactly_the_routes_the_server_has(
    make_instance: Callable[..., Instance],
) -> None:
    proxy = make_instance(token=TOKEN)
    served = proxy.get(PATH)
    assert served.status_code == 200 and served.headers["content-type"] == "application/json"
    doc = served.json()
    assert doc == document()
    described = {
        (path, method) for path, item in doc["paths"].items() for method in item if method in METHODS
    }
    assert described == _routes(proxy)
    assert doc["openapi"].startswith("3.1") and doc["info"]["version"] == proxy.runtime.version  # type: ignore[union-attr]
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            assert operation["responses"]["200"]["description"], (path, method)
            if path.startswith("/api/"):
                assert {"401", "403"} <= set(operation["responses"]), (path, method)


def test_the_openapi_route_is_guarded_like_the_rest(make_instance: Callable[..., Instance]) -> None:
    proxy = make_instance(token=TOKEN)
    assert httpx.get(proxy.server.url + PATH).status_code == 401  # type: ignore[union-attr]


def test_every_ref_resolves_and_settings_match_the_schema() -> None:
    doc = document()
    schemas = doc["components"]["schemas"]

    def refs(node: Any) -> list[str]:
        if isinstance(node, dict):
            own = [node["$ref"]] if "$ref" in node else []
            return own + [r for value in node.values() for r in refs(value)]
        if isinstance(node, list):
            return [r for item in node for r in refs(item)]
        return []

    for ref in refs(doc):
        assert ref.removeprefix("#/components/schemas/") in schemas, ref
    everything = defaults()
    resilience = {k: v for k, v in everything.items() if k != "modelLockout"}
    assert problems(resilience, schemas["ResilienceSettings"], doc) == []
    assert problems({"modelLockout": everything["modelLockout"]}, schemas["LockoutSettings"], doc) == []
    for spec in SCHEMA:  # every leaf, with its default and range
        group = "LockoutSettings" if spec.path.startswith("modelLockout.") else "ResilienceSettings"
        node = schemas[group]
        for part in spec.path.split("."):
            node = node["properties"][part]
        default = list(spec.default) if isinstance(spec.default, tuple) else spec.default
        assert node["default"] == default, spec.path
        if spec.kind == "int":
            assert (node["minimum"], node["maximum"]) == (spec.min, spec.max), spec.path


def test_real_answers_fit_the_schemas(make_instance: Callable[..., Instance]) -> None:
    proxy = make_instance(token=TOKEN)
    doc = document()
    engine, now = proxy.engine, proxy.clock.now()
    # Something in every list: an OPEN breaker, a cooling and an expired connection, a lockout, events.
    breaker = engine.providers["alpha"].breaker
    for _ in range(breaker.policy.failure_threshold):
        breaker.record_failure(now)
    engine.connections["alpha-1"].health.record_failure(
        now,
        engine.settings.cooldown_policy("local"),
        error="503 overloaded",
        error_type="server_error",
        code=503,
    )
    engine.connections["beta-1"].health.mark_terminal(now, "expired", error="401 unauthorized", code=401)
    engine.lockouts.record_failure(
        "alpha", "alpha-2", "gpt-x", now, engine.settings.lockout(), status=404, reason="not_found"
    )

    for path in ("/api/monitoring/health", "/api/resilience/connections", "/api/resilience/model-cooldowns",
                 "/api/resilience", "/api/settings", "/api/events"):  # fmt: skip
        fits(doc, proxy.get(path), path, "get")
    assert proxy.get("/api/resilience/model-cooldowns").json()["items"]
    assert proxy.get("/api/events").json()["events"]

    fits(
        doc,
        proxy.send("PATCH", "/api/resilience", {"sessionAffinity": {"ttlMs": 1000}}),
        "/api/resilience",
        "patch",
    )
    fits(
        doc,
        proxy.send("PATCH", "/api/settings", {"modelLockout": {"enabled": True}}),
        "/api/settings",
        "patch",
    )
    fits(doc, proxy.send("PATCH", "/api/settings", {"modelLockout": {"x": 1}}), "/api/settings", "patch")
    fits(doc, proxy.send("PUT", "/api/providers/alpha-1", {"isActive": False}), "/api/providers/{id}", "put")
    fits(doc, proxy.send("PUT", "/api/providers/nope", {"isActive": False}), "/api/providers/{id}", "put")
    fits(
        doc,
        proxy.send("POST", "/api/resilience/connections/beta-1/reset"),
        "/api/resilience/connections/{id}/reset",
        "post",
    )
    fits(
        doc,
        proxy.send("POST", "/api/resilience/reset", {"provider": "alpha"}),
        "/api/resilience/reset",
        "post",
    )
    fits(
        doc,
        proxy.send("POST", "/api/resilience/reset", {"provider": "nope"}),
        "/api/resilience/reset",
        "post",
    )
    path = "/api/resilience/model-cooldowns"
    fits(doc, proxy.send("DELETE", path, {"provider": "alpha", "model": "gpt-x"}), path, "delete")
    fits(doc, proxy.send("DELETE", path, {"all": True}), path, "delete")
    fits(doc, proxy.send("DELETE", path, {"model": "gpt-x"}), path, "delete")
    fits(doc, proxy.send("DELETE", "/api/monitoring/health"), "/api/monitoring/health", "delete")
    fits(doc, proxy.get("/api/events", params={"after": "x"}), "/api/events", "get")
    fits(doc, proxy.send("POST", "/api/resilience/reset", b"[1"), "/api/resilience/reset", "post")
    assert httpx.get(proxy.server.url + "/api/events").status_code == 401  # type: ignore[union-attr]
    fits(doc, httpx.get(proxy.server.url + "/api/events"), "/api/events", "get")  # type: ignore[union-attr]


def test_proxy_answers_fit_the_schemas(
    make_instance: Callable[..., Instance], upstream: tuple[FakeUpstream, str]
) -> None:
    _, url = upstream
    proxy = make_instance(alpha_url=url)
    doc = document()
    fits(doc, proxy.get("/v1/models"), "/v1/models", "get")
    for body, status in (({}, 400), ({"model": "nowhere"}, 404)):
        response = proxy.send("POST", "/v1/chat/completions", body)
        assert response.status_code == status
        fits(doc, response, "/v1/chat/completions", "post")
    ok = proxy.send("POST", "/v1/chat/completions", {"model": "alpha/m1", "messages": []})
    assert ok.status_code == 200
    fits(doc, proxy.get("/api/requests"), "/api/requests", "get")
    assert len(proxy.get("/api/requests").json()["requests"]) == 3
    fits(doc, proxy.get("/api/requests", params={"limit": "0"}), "/api/requests", "get")
    one = f"/api/requests/{ok.headers['x-request-id']}"
    fits(doc, proxy.get(one), "/api/requests/{id}", "get")
    fits(doc, proxy.get("/api/requests/nope"), "/api/requests/{id}", "get")
    fits(doc, proxy.get("/api/stats"), "/api/stats", "get")
    assert proxy.get("/api/stats").json()["providers"]["alpha"]["requests"] == 1
    fits(doc, proxy.get("/api/stats", params={"window": "1h"}), "/api/stats", "get")
    fits(doc, proxy.get("/api/stats", params={"scope": "fleet"}), "/api/stats", "get")
    fits(doc, proxy.get("/api/stats", params={"scope": "world"}), "/api/stats", "get")


def test_an_answer_about_a_dead_upstream_fits_the_error_schema(
    make_instance: Callable[..., Instance],
) -> None:
    """It carries `upstreamError` (what the request's own last attempt met), which a closed `Error`
    schema without it refused: a client validating answers rejected exactly those that say why an
    upstream is down (found by a docs trial)."""
    proxy = make_instance()  # provider alpha's upstream refuses connections
    off = proxy.send("PATCH", "/api/resilience", {"comboCooldownWait": {"enabled": False}})
    assert off.status_code == 200, off.text
    response = proxy.send("POST", "/v1/chat/completions", {"model": "alpha/m1", "messages": []})
    assert response.status_code in (429, 502, 503), response.text
    assert "connection refused" in response.json()["error"]["message"]
    assert response.json()["error"]["upstreamError"]["status"] is None
    fits(document(), response, "/v1/chat/completions", "post")


def test_the_answers_at_the_door_are_documented_on_every_route_in_their_routes_shape(
    make_instance: Callable[..., Instance],
) -> None:
    """403 forbidden_origin, 415, 421 and 500 can come from any route, and were documented on none;
    and /v1/messages's Anthropic shape had leaked into every /v1 route's shared error responses
    (/v1/chat/completions documented its 401 as an AnthropicError; found by a docs trial)."""
    doc = document()
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            assert {"403", "421", "500"} <= set(operation["responses"]), (path, method)
            if "requestBody" in operation:
                assert {"408", "415"} <= set(operation["responses"]), (path, method)
    chat = doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    messages = doc["paths"]["/v1/messages"]["post"]["responses"]
    assert chat["401"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    assert messages["401"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/AnthropicError"
    }

    proxy = make_instance()
    origin = proxy.send(
        "POST", "/v1/chat/completions", {"model": "alpha/m1"}, headers={"Origin": "https://evil.example"}
    )
    assert origin.status_code == 403
    fits(doc, origin, "/v1/chat/completions", "post")
    text = proxy.send("POST", "/api/resilience/reset", b"x", headers={"content-type": "text/plain"})
    assert text.status_code == 415
    fits(doc, text, "/api/resilience/reset", "post")


def test_every_route_that_reads_a_body_documents_how_it_refuses_one(
    make_instance: Callable[..., Instance],
) -> None:
    """Every management action, sent a body it must refuse (not JSON, malformed JSON, an unknown
    field): each refusal's status is documented on its route, with the body, and fits the schema;
    a malformed body's 400 lists `fields` like every other 400. (The two actions that take no
    fields read and refuse bodies too, and documented none of it; malformed JSON's 400 had no
    `fields`: found by a scripting trial.)"""
    doc = document()
    proxy = make_instance()
    connection = next(iter(proxy.engine.connections))
    refusals = {
        "not JSON": ({"content-type": "text/plain"}, b"x"),
        "malformed JSON": ({"content-type": "application/json"}, b'{"provider": "alpha"'),
        "an unknown field": ({"content-type": "application/json"}, b'{"no-such-field": 1}'),
    }
    checked = actions = 0
    for path, operations in doc["paths"].items():
        if not path.startswith("/api/"):
            continue
        for method, operation in operations.items():
            if method == "get":
                continue
            actions += 1
            for what, (headers, body) in refusals.items():
                answer = proxy.send(method.upper(), path.replace("{id}", connection), body, headers=headers)
                assert answer.status_code in (400, 415), (path, method, what, answer.status_code)
                assert "requestBody" in operation, (path, method, what)
                assert str(answer.status_code) in operation["responses"], (path, method, what)
                fits(doc, answer, path, method)
                if answer.status_code == 400:
                    assert answer.json()["error"]["fields"], (path, method, what)
                checked += 1
    assert actions >= 7 and checked == 3 * actions  # (every action, each refusal)
