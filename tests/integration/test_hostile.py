"""Hostile and odd input over real HTTP (issue #10): each answer is a 4xx that says why, or the input
passed through intact; never a 500, never a slot, probe or in-flight count left behind, and never
more than `ECHO_LIMIT` characters of the input quoted back.

The proxy and its fake upstreams run on real uvicorn servers (the harness of test_proxy.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from proxy.resilience.breaker import BreakerState
from proxy.resilience.clock import FakeClock
from proxy.untrusted import ECHO_LIMIT
from tests.fakes import Reply
from tests.integration.conftest import Instance
from tests.integration.test_proxy import (
    CHAT_PATH,
    Proxy,
    Upstream,
    error_of,
    provider,
)

JSON = {"content-type": "application/json"}
LONE_SURROGATE_CHAT = b'{"model": "loc/m1", "messages": [{"role": "user", "content": "\\ud800"}]}'


def half_open(proxy: Proxy, clock: FakeClock, pid: str) -> None:
    """Open `pid`'s breaker and let its reset timeout pass: the next request is its probe."""
    breaker = proxy.rt.engine.providers[pid].breaker
    for _ in range(breaker.policy.failure_threshold):
        breaker.record_failure(clock.now())
    clock.advance(breaker.policy.reset_timeout_ms + 1)
    assert breaker.state(clock.now()) is BreakerState.HALF_OPEN


def test_a_lone_surrogate_is_passed_through_as_it_came(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    response = proxy.http.post(CHAT_PATH, content=LONE_SURROGATE_CHAT, headers=JSON)
    assert response.status_code == 200, response.text
    [sent] = up.calls()
    assert b"\\ud800" in sent.body  # escaped, as the client sent it: the same JSON document
    assert sent.json["messages"] == [{"role": "user", "content": "\ud800"}]
    proxy.settled()


def test_a_lone_surrogate_as_the_probe_leaves_no_probe_held(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """The defect: the body failed to encode after the request took the HALF_OPEN probe, so the
    probe stayed held and every valid request got 503 provider_circuit_open."""
    up = upstreams()
    clock = FakeClock()
    proxy = launch(provider("loc", "local", up.url, "loc-1"), clock=clock)
    half_open(proxy, clock, "loc")
    response = proxy.http.post(CHAT_PATH, content=LONE_SURROGATE_CHAT, headers=JSON)
    assert response.status_code == 200, response.text
    proxy.settled()
    breaker = proxy.rt.engine.providers["loc"].breaker
    assert (breaker.state(clock.now()), breaker.probe_ticket) == (BreakerState.CLOSED, 0)
    assert proxy.chat("loc/m1").status_code == 200


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        pytest.param(b'{"model": "loc/m1", "temperature": NaN}', 400, "invalid_json", id="NaN"),
        pytest.param(b'{"model": "loc/m1", "max_tokens": Infinity}', 400, "invalid_json", id="Infinity"),
        pytest.param(b'{"model": "loc/m1", "top_p": -Infinity}', 400, "invalid_json", id="-Infinity"),
        pytest.param(b'{"model": "loc/\\udc00"}', 400, "invalid_model", id="surrogate-model"),
        # Legal JSON that could not be passed on as written: 1e999 reads as infinity and would be
        # written `Infinity`; CPython converts no integer of more than 4,300 digits.
        pytest.param(b'{"model": "loc/m1", "temperature": 1e999}', 400, "invalid_request", id="1e999"),
        pytest.param(b'{"model": "loc/m1", "top_p": -1E+999}', 400, "invalid_request", id="-1E+999"),
        pytest.param(
            b'{"model": "loc/m1", "seed": ' + b"7" * 5000 + b"}", 400, "invalid_request", id="5000-digits"
        ),
    ],
)
def test_input_no_upstream_could_read_is_400_and_reaches_no_upstream(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], body: bytes, status: int, code: str
) -> None:
    up = upstreams()
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    response = proxy.http.post(CHAT_PATH, content=body, headers=JSON)
    assert error_of(response, status)["code"] == code
    assert up.calls() == []
    proxy.settled()


@pytest.mark.parametrize("path", [CHAT_PATH, "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"])
def test_a_model_name_with_a_lone_surrogate_is_refused_alike_on_every_route(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], path: str
) -> None:
    """count_tokens said "`model` is required and must be a string" of a model it had been given."""
    up = upstreams()
    proxy = launch(
        provider("loc", "local", up.url, "loc-1", extra='apis = ["chat", "messages", "responses"]')
    )
    response = proxy.http.post(path, content=b'{"model": "loc/\\udc00", "messages": []}', headers=JSON)
    assert response.status_code == 400, response.text
    assert "lone surrogate" in response.text, response.text
    assert up.calls() == []


@pytest.mark.parametrize("path", [CHAT_PATH, "/v1/messages", "/v1/responses", "/v1/embeddings"])
def test_a_number_past_a_doubles_range_is_refused_in_words_on_every_route(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], path: str
) -> None:
    up = upstreams()
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    response = proxy.http.post(path, content=b'{"model": "loc/m1", "temperature": 1e999}', headers=JSON)
    assert response.status_code == 400, response.text
    assert "1e999 is too large to pass on" in response.text
    assert up.calls() == []


def test_large_numbers_a_double_or_an_integer_holds_pass_on_as_written(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    big = b"123456789012345678901234567890"
    body = b'{"model": "loc/m1", "messages": [], "temperature": 1e308, "seed": ' + big + b"}"
    assert proxy.http.post(CHAT_PATH, content=body, headers=JSON).status_code == 200
    [sent] = up.calls()
    assert big in sent.body and json.loads(sent.body)["temperature"] == 1e308


@pytest.mark.parametrize("depth", [900, 5000])
def test_a_deeply_nested_body_passes_through_or_is_400(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], depth: int
) -> None:
    """Python parses a body nested ~1,000 deep at the top of a request, and then could fail to encode
    it again from deeper in the attempt (a 500, with the attempt's slot held)."""
    up = upstreams()
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    body = b'{"model": "loc/m1", "x": ' + b"[" * depth + b"]" * depth + b"}"
    response = proxy.http.post(CHAT_PATH, content=body, headers=JSON)
    if response.status_code == 200:
        [sent] = up.calls()
        assert sent.body.count(b"[") == depth
    else:
        assert error_of(response, 400)["code"] == "invalid_json"
        assert up.calls() == []
    proxy.settled()


@pytest.mark.parametrize("depth", [1_100, 100_000])
@pytest.mark.parametrize("path", [CHAT_PATH, "/v1/messages/count_tokens"])
def test_json_nested_past_what_the_parsers_read_is_told_as_such_not_as_invalid(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], path: str, depth: int
) -> None:
    """Legal JSON, refused for its depth: the answer says so, not that it is malformed or NaN (nor
    the parser's own words about recursion)."""
    up = upstreams()
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    body = b'{"model": "loc/m1", "x": ' + b"[" * depth + b"]" * depth + b"}"
    response = proxy.http.post(path, content=body, headers=JSON)
    assert response.status_code == 400, response.text
    error = response.json()["error"]  # (in Anthropic's shape on its routes: no `code`)
    assert error.get("code", "invalid_json") == "invalid_json"
    assert (
        error["message"] == "request body is JSON nested deeper than the proxy reads (about 1,000 levels)"
    ), error
    assert up.calls() == []
    proxy.settled()


@pytest.mark.parametrize("depth", [1_100, 100_000])
def test_a_management_body_nested_past_what_the_parser_reads_is_told_as_such(
    proxy: Instance, depth: int
) -> None:
    before = proxy.runtime.settings.document() if proxy.runtime else None
    body = b'{"modelLockout": ' + b"[" * depth + b"]" * depth + b"}"
    response = proxy.send("PATCH", "/api/settings", body, headers=JSON)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["message"] == "the body is JSON nested deeper than the proxy reads (about 1,000 levels)", (
        error
    )
    assert "recursion" not in response.text
    assert proxy.runtime is not None and proxy.runtime.settings.document() == before


def quoted_at_most(text: str, needle: str, limit: int = ECHO_LIMIT) -> bool:
    """Does `text` quote no more than `limit` characters of `needle` (a run of one character)?"""
    return needle[0] * (limit + 1) not in text


def test_an_answer_never_quotes_more_than_200_characters_of_the_input(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    long = "q" * 100_000
    answers = [
        proxy.chat(long),
        proxy.chat(f"loc/{long}", headers={"X-OmniRoute-Connection": long}),
        proxy.http.get(f"/v1/{long[:10_000]}"),  # httpx sends no URL longer than 64 KiB
        proxy.http.put(f"/v1/{long[:10_000]}", headers=JSON, content=b"{}"),
    ]
    for response in answers:
        assert 400 <= response.status_code < 500, response.text[:300]
        assert quoted_at_most(response.text, long), response.text[:300]
        assert len(response.content) < 2 * ECHO_LIMIT + 1000


def chat_body(**extra: Any) -> bytes:
    return json.dumps({"model": "loc/m1", "messages": [{"role": "user", "content": "hi"}], **extra}).encode()


# ---------------------------------------------------------------------------------------------
# The management API


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PATCH", "/api/settings", b'{"\\ud800": 1}'),
        ("PATCH", "/api/resilience", b'{"providerBreaker": {"\\udfff": {"x": 1}}}'),
        ("DELETE", "/api/resilience/model-cooldowns", b'{"provider": "alpha", "model": "\\ud800"}'),
        ("DELETE", "/api/resilience/model-cooldowns", b'{"\\ud800": true}'),
        ("POST", "/api/resilience/reset", b'{"provider": "\\ud800"}'),
        ("PUT", "/api/providers/alpha-1", b'{"isActive": "\\ud800"}'),
        ("PATCH", "/api/settings", b'{"modelLockout": {"enabled": NaN}}'),
    ],
)
def test_management_input_with_lone_surrogates_or_nan_is_400_and_changes_nothing(
    proxy: Instance, method: str, path: str, body: bytes
) -> None:
    before = proxy.runtime.settings.document() if proxy.runtime else None
    seq = proxy.last_seq
    response = proxy.send(method, path, body, headers=JSON)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_request"
    assert proxy.runtime is not None and proxy.runtime.settings.document() == before
    assert proxy.runtime.bus.after(seq) == []


def test_events_after_a_number_longer_than_any_sequence_is_400(proxy: Instance) -> None:
    for after in ("9" * 5000, "1" * 19):
        response = proxy.get("/api/events", params={"after": after})
        assert response.status_code == 400, response.text[:300]
        assert quoted_at_most(response.text, after)
    assert proxy.get("/api/events", params={"after": "0" * 50 + "1"}).status_code == 200


def test_a_query_parameter_given_twice_is_400_whichever_value_comes_first(proxy: Instance) -> None:
    """Read as the last value, `?kinds=garbage&kinds=event` would open a stream where the reverse
    order is refused: a repeated parameter is refused on every route that reads one."""
    for path, name, good, bad in (
        ("/api/stream", "kinds", "event", "garbage"),
        ("/api/events", "after", "0", "x"),
        ("/api/requests", "limit", "5", "x"),
        ("/api/stats", "window", "5m", "x"),
    ):
        for values in ((bad, good), (good, bad), (good, good)):
            response = proxy.get(path, params=[(name, v) for v in values])
            assert response.status_code == 400, (path, values, response.text[:300])
            assert response.json()["error"]["fields"] == [{"field": name, "message": "given more than once"}]
        if path != "/api/stream":  # (one that opens goes on until the client leaves)
            assert proxy.get(path, params={name: good}).status_code == 200


def test_management_answers_quote_at_most_200_characters_of_the_input(proxy: Instance) -> None:
    long = "k" * 100_000
    answers = [
        proxy.send("PATCH", "/api/settings", {long: 1}),
        proxy.send("PATCH", "/api/settings", {f"x{i}{long[:300]}": 1 for i in range(1000)}),
        proxy.send("PATCH", "/api/settings", {"modelLockout": {"errorCodes": [long]}}),
        proxy.send("POST", "/api/resilience/reset", {"provider": long}),
        proxy.send("DELETE", "/api/resilience/model-cooldowns", {"provider": "alpha", "model": "m", long: 1}),
        proxy.send("POST", f"/api/resilience/connections/{long[:10_000]}/reset"),
        proxy.send("PUT", f"/api/providers/{long[:10_000]}", {"isActive": True}),
        proxy.get("/api/events", params={"after": long[:10_000]}),
    ]
    for response in answers:
        assert 400 <= response.status_code < 500, response.text[:300]
        assert quoted_at_most(response.text, long), response.text[:300]
        assert len(response.content) < 20_000, len(response.content)


# ---------------------------------------------------------------------------------------------
# What upstreams send back


@pytest.mark.parametrize("size_kib", [65, 200, 1023])
def test_an_error_body_up_to_1_mib_is_relayed_whole(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], size_kib: int
) -> None:
    """Bodies over 64 KiB used to be cut, and sent as broken JSON labelled application/json."""
    up = upstreams()
    body = {
        "error": {"message": "bad request", "type": "invalid_request_error", "pad": "p" * (size_kib * 1024)}
    }
    up.fake.default(Reply("error", status=400, body=body))
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    response = proxy.chat("loc/m1")
    assert response.status_code == 400
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == body
    proxy.settled()


def test_an_error_body_that_breaks_off_is_told_as_such_not_as_too_large(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """A 400 whose body stops after a few bytes (here: stalls past the idle timeout) was answered
    "an error body larger than 1 MiB": the operator looked for a huge body that never was."""
    up = upstreams()
    up.fake.default(Reply("drip", status=400, drip_bytes=9, delay_ms=5_000))
    proxy = launch("[server]\nidle_timeout_ms = 300\n\n" + provider("loc", "local", up.url, "loc-1"))
    response = proxy.chat("loc/m1")
    error = error_of(response, 400)
    assert error["code"] == "upstream_error_incomplete"
    assert error["message"] == "loc-1: 400 with an error body that broke off after 9 bytes, not relayed"
    up.fake.reset()
    proxy.settled()


def test_an_error_body_over_1_mib_is_a_well_formed_error_that_says_so(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    body = {"error": {"message": "bad request", "pad": "p" * (1024 * 1024)}}
    up.fake.default(Reply("error", status=400, body=body))
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    response = proxy.chat("loc/m1")
    error = error_of(response, 400)
    assert error["code"] == "upstream_error_too_large"
    assert error["message"] == "loc-1: 400 with an error body larger than 1 MiB, not relayed"
    assert len(response.content) < 1000
    proxy.settled()


def test_the_answer_starts_with_what_the_last_upstream_said(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """Both keys answered 429 and cool: the 429 says so first, not only "cooling"."""
    up = upstreams()
    limited = {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}
    up.fake.default(Reply("error", status=429, body=limited))
    proxy = launch(provider("cloud", "apikey", up.url, "key-a", "key-b"))
    response = proxy.chat("cloud/m1")
    error = error_of(response, 429)
    assert error["code"] == "all_targets_cooling"
    assert error["message"].startswith("key-b: 429 Rate limit reached; no target is available right now: ")
    assert error["upstreamError"] == {"connectionId": "key-b", "status": 429, "message": "Rate limit reached"}
    assert len(up.calls()) == 2
    proxy.settled()


def test_an_answer_without_attempts_of_its_own_names_no_upstream_error(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    up.fake.default(Reply("error", status=503, body={"error": {"message": "overloaded"}}))
    proxy = launch(provider("cloud", "apikey", up.url, "key-a"))
    first = error_of(proxy.chat("cloud/m1"), 429)
    assert first["message"].startswith("key-a: 503 overloaded; ")
    second = error_of(proxy.chat("cloud/m1"), 429)  # blocked by the first one's cooldown: no attempt
    assert "upstreamError" not in second
    assert second["message"].startswith("no target is available right now")
    assert len(up.calls()) == 1
    proxy.settled()


@pytest.mark.parametrize("body", ["<html>Please log in</html>", '{"choices": [{"index": 0', ""])
def test_a_200_whose_body_is_not_the_json_it_claims_is_a_failure_that_falls_back(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], body: str
) -> None:
    a, b = upstreams("a"), upstreams("b")
    a.fake.default(Reply("error", status=200, body=body, headers={"content-type": "application/json"}))
    config = (
        provider("one", "local", a.url, "one-1")
        + provider("two", "local", b.url, "two-1")
        + '[combos.duo]\nstrategy = "priority"\ntargets = ["one/m1", "two/m1"]\n'
    )
    proxy = launch(config, settings={"connectionCooldown": {"local": {"baseCooldownMs": 0}}})
    response = proxy.chat("duo")
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "hello from b"
    assert response.headers["x-omniroute-fallback-attempts"] == "1"
    assert proxy.breaker("one")["failureCount"] == 1
    assert proxy.connection("one-1")["lastError"] == "answered 200 with a body that is not the JSON it claims"

    second = proxy.chat("one/m1")  # the second failure opens the local breaker: 503, saying why
    only = error_of(second, second.status_code)
    assert second.status_code in (502, 503)
    assert only["message"].startswith(
        f"one-1: answered 200 with a body that is not the JSON it claims at {a.url}"
    )
    proxy.settled()


@pytest.mark.parametrize("history", [2000, 0], ids=["recorded", "unrecorded"])
def test_an_answer_with_nan_as_pythons_json_writes_it_is_relayed_whether_recorded_or_not(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], history: int
) -> None:
    # The clients' own libraries (Python's json, the official SDKs) read NaN: so does the check
    # that an answer is the JSON it claims, with the request trail on or off alike.
    up = upstreams()
    body = '{"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "logprob": NaN}]}'
    up.fake.default(Reply("error", status=200, body=body, headers={"content-type": "application/json"}))
    proxy = launch(f"[server]\nrequest_history = {history}\n" + provider("one", "local", up.url, "one-1"))
    response = proxy.chat("one/m1")
    assert response.status_code == 200
    assert response.content == body.encode()
    assert proxy.breaker("one")["failureCount"] == 0
    proxy.settled()
