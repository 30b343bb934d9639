"""Fuzzing the proxy API and the management API over real HTTP (issue #10).

Hypothesis draws requests: a method, a path (the real routes and others), a query string, headers
(Host, Origin, Content-Type, the proxy's own and arbitrary ones) and a body (arbitrary JSON
documents with lone surrogates, NaN and Infinity, huge numbers and deep nesting, or raw bytes).
One proxy (uvicorn on loopback, a FakeClock) serves every example, before a fake upstream that
answers every completion. After each answer:

- it is not a 5xx (nothing here can fail upstream, so any 5xx is ours) and its error is JSON;
- nothing is left behind: no request in flight, no slot or queue place held, no probe held (the
  `cloud` provider is put back into HALF_OPEN before each example, so requests keep being its probe);
- an input that was refused changed no setting, and no answer quotes more than ECHO_LIMIT
  characters of the input;
- and no log record so far carries a traceback or is an error.

Each target runs 150 examples (a few seconds: the whole suite must stay fast); run more locally
with `OMNIROUTE_FUZZ_EXAMPLES=4000 pytest tests/integration/test_fuzz.py --hypothesis-show-statistics`,
which also shows what the run covered (the share of each status and error code).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from proxy.resilience.breaker import BreakerState
from proxy.resilience.clock import FakeClock
from proxy.untrusted import ECHO_LIMIT
from tests.integration.test_proxy import Proxy, Upstream, provider

EXAMPLES = int(os.environ.get("OMNIROUTE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

MODELS = ["loc/m1", "loc/m2", "cloud/m1", "duo", "m1", "nope/m1", "", "loc/", "/m1"]
V1_ROUTES = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
    ("GET", "/v1/models"),
]
V1_PATHS = [path for _, path in V1_ROUTES] + ["/v1/", "/v1/chat", "/", "/v1/models/x"]
API_ROUTES = [
    ("GET", "/api/monitoring/health"),
    ("DELETE", "/api/monitoring/health"),
    ("POST", "/api/resilience/reset"),
    ("GET", "/api/resilience/connections"),
    ("POST", "/api/resilience/connections/loc-1/reset"),
    ("POST", "/api/resilience/connections/ghost/reset"),
    ("PUT", "/api/providers/loc-2"),
    ("PUT", "/api/providers/ghost"),
    ("GET", "/api/resilience/model-cooldowns"),
    ("DELETE", "/api/resilience/model-cooldowns"),
    ("GET", "/api/resilience"),
    ("PATCH", "/api/resilience"),
    ("GET", "/api/settings"),
    ("PATCH", "/api/settings"),
    ("GET", "/api/events"),
]
API_PATHS = sorted({path for _, path in API_ROUTES})
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]

# Text as JSON can carry it: any code point, lone surrogates included, and some known troublemakers
# drawn more often than chance would draw them.
TRICKY = [
    "\ud800",
    "\udfff",
    "a\udc80b",
    "\x00",
    "\u202e",
    "\x1b[31m",
    "💥",
    "NaN",
    "sk-" + "x" * 20,
    "q" * 300,
]
any_text = st.one_of(st.text(st.characters(exclude_categories=()), max_size=12), st.sampled_from(TRICKY))
json_scalar = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**300, max_value=10**310)
    | st.floats(allow_nan=True, allow_infinity=True)
    | any_text
)
json_doc = st.recursive(
    json_scalar,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=12,
)
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30).map(str.strip)
# Most requests are let through the door, so that most of the run reaches the handlers behind it.
hosts = st.sampled_from(
    ["", "", "", "127.0.0.1", "localhost", "[::1]", "app.localhost", "evil.example", "0.0.0.0"]
)
origins = st.sampled_from([None] * 12 + ["https://evil.example", "null", "http://localhost:3000"])
content_types = st.sampled_from(
    ["application/json"] * 12 + ["application/json; charset=utf-8", "text/plain", None, "multipart/form-data"]
)
door = st.tuples(hosts, origins, content_types)
headers = st.dictionaries(
    st.sampled_from(
        [
            "authorization",
            "x-omniroute-connection",
            "x-session-id",
            "x-codex-session-id",
            "accept",
            "access-control-request-method",
            "x-anything",
        ]
    ),
    header_text | st.sampled_from(["loc-1", "cloud-1", "loc-2", "Bearer x"]),
    max_size=3,
)
queries = st.dictionaries(
    st.sampled_from(["after", "model", "x"]) | header_text,
    st.sampled_from(["0", "1", "-1", "9" * 40, "00000000000000000000001"]) | header_text,
    max_size=3,
)


def encode(doc: Any) -> bytes:
    """JSON as a client may send it: lone surrogates escaped, NaN and Infinity as Python writes them."""
    return json.dumps(doc, ensure_ascii=True).encode()


chat_body = st.builds(
    lambda base, extra: encode({**extra, **base}),
    st.fixed_dictionaries(
        # Mostly a model that routes, so that most bodies reach the attempt (and the upstream).
        {
            "model": st.one_of(
                st.sampled_from(MODELS[:5]), st.sampled_from(MODELS[:5]), st.sampled_from(MODELS), any_text
            )
        },
        optional={
            "messages": st.just([{"role": "user", "content": "hi"}]) | json_doc,
            "stream": st.booleans() | json_doc,
            "temperature": json_scalar,
            "input": json_doc,
        },
    ),
    st.dictionaries(any_text, json_doc, max_size=3),
)
nested = st.integers(0, 3000).map(
    lambda depth: b'{"model": "loc/m1", "x": ' + b"[" * depth + b"]" * depth + b"}"
)
# one_of picks its branches evenly: a branch given three times is drawn three times as often.
bodies = st.one_of(
    chat_body, chat_body, chat_body, st.none(), json_doc.map(encode), st.binary(max_size=64), nested
)
settings_patch = st.dictionaries(
    st.sampled_from(["modelLockout", "sessionAffinity", "providerBreaker", "requestQueue"]) | any_text,
    json_doc
    | st.dictionaries(st.sampled_from(["enabled", "ttlMs", "errorCodes", "local"]) | any_text, json_doc),
    max_size=2,
).map(encode)


@pytest.fixture
def fuzzed(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> Iterator[tuple[Proxy, FakeClock]]:
    up = upstreams()
    clock = FakeClock()
    config = (
        provider("loc", "local", up.url, "loc-1", "loc-2").replace(
            'id = "loc-1"\n', 'id = "loc-1"\nmax_concurrent = 2\n'
        )
        + provider("cloud", "apikey", up.url, "cloud-1")
        + '[combos.duo]\nstrategy = "priority"\ntargets = ["cloud/m1", "loc/m1"]\n'
    )
    yield launch(config, clock=clock), clock


def half_open(proxy: Proxy, clock: FakeClock) -> None:
    breaker = proxy.rt.engine.providers["cloud"].breaker
    if breaker.state(clock.now()) is BreakerState.HALF_OPEN:
        return
    for _ in range(breaker.policy.failure_threshold):
        breaker.record_failure(clock.now())
    clock.advance(breaker.retry_after_ms(clock.now()) + 1)
    assert breaker.state(clock.now()) is BreakerState.HALF_OPEN


def send(
    proxy: Proxy,
    method: str,
    path: str,
    query: dict[str, str],
    extra: dict[str, str],
    door: tuple[str, str | None, str | None],
    body: bytes | None,
) -> httpx.Response:
    """One request; `door` is its (Host, Origin, Content-Type), each left out when empty."""
    host, origin, content_type = door
    request_headers = dict(extra)
    for name, value in (("host", host), ("origin", origin), ("content-type", content_type)):
        if value:
            request_headers[name] = value
    return proxy.http.request(method, path, params=query, headers=request_headers, content=body)


def check(proxy: Proxy, response: httpx.Response, settings_before: dict[str, Any]) -> None:
    code = ""
    if response.status_code >= 400 and response.request.method != "HEAD":
        with contextlib.suppress(ValueError, KeyError, TypeError):
            code = f" {response.json()['error']['code']}"
    event(f"{response.status_code}{code}")  # what the run covered: --hypothesis-show-statistics
    assert response.status_code < 500, (response.status_code, response.text[:500])
    assert "q" * (ECHO_LIMIT + 1) not in response.text, "an answer quoted more than ECHO_LIMIT characters"
    if response.status_code >= 400 and response.request.method != "HEAD":
        assert response.headers["content-type"].startswith("application/json"), response.text[:200]
        assert isinstance(response.json()["error"]["message"], str)
        assert "Traceback" not in response.text
        assert proxy.rt.settings.document() == settings_before, "a refused input changed the settings"
    proxy.settled()
    engine = proxy.rt.engine
    held = [p for p, runtime in engine.providers.items() if runtime.breaker.probe_ticket]
    assert held == [], f"a probe is held after the answer: {held}"


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert bad == [], [r.getMessage() for r in bad]


def one_request(
    fuzzed: tuple[Proxy, FakeClock],
    caplog: pytest.LogCaptureFixture,
    target: tuple[str, str],
    query: dict[str, str],
    extra: dict[str, str],
    door: tuple[str, str | None, str | None],
    body: bytes | None,
) -> None:
    """One fuzzed request against a proxy with a HALF_OPEN breaker: a clear answer, nothing changed
    that a bad request may not change, no traceback in the log."""
    method, path = target
    proxy, clock = fuzzed
    half_open(proxy, clock)
    before = proxy.rt.settings.document()
    response = send(proxy, method, path, query, extra, door, body)
    check(proxy, response, before)
    no_tracebacks(caplog)


@FUZZ
@given(
    target=st.one_of(
        st.sampled_from(V1_ROUTES),
        st.sampled_from(V1_ROUTES),
        st.sampled_from(V1_ROUTES),
        st.tuples(st.sampled_from(METHODS), st.sampled_from(V1_PATHS)),
    ),
    query=queries,
    extra=headers,
    door=door,
    body=bodies,
)
def test_fuzz_the_proxy_api(
    fuzzed: tuple[Proxy, FakeClock],
    caplog: pytest.LogCaptureFixture,
    target: tuple[str, str],
    query: dict[str, str],
    extra: dict[str, str],
    door: tuple[str, str | None, str | None],
    body: bytes | None,
) -> None:
    one_request(fuzzed, caplog, target, query, extra, door, body)


@FUZZ
@given(
    target=st.one_of(
        st.sampled_from(API_ROUTES),
        st.sampled_from(API_ROUTES),
        st.sampled_from(API_ROUTES),
        st.tuples(st.sampled_from(METHODS), st.sampled_from(API_PATHS)),
        st.tuples(
            st.sampled_from(METHODS),
            st.builds(lambda s: "/api/" + s, header_text.filter(lambda s: "?" not in s and "#" not in s)),
        ),
    ),
    query=queries,
    extra=headers,
    door=door,
    body=st.one_of(st.none(), settings_patch, settings_patch, bodies),
)
def test_fuzz_the_management_api(
    fuzzed: tuple[Proxy, FakeClock],
    caplog: pytest.LogCaptureFixture,
    target: tuple[str, str],
    query: dict[str, str],
    extra: dict[str, str],
    door: tuple[str, str | None, str | None],
    body: bytes | None,
) -> None:
    one_request(fuzzed, caplog, target, query, extra, door, body)
