"""The request trail, the statistics and /metrics over real HTTP: real fallbacks, skips, waits,
streams (with and without usage) and client disconnects through a real proxy and fake upstreams,
read back through `GET /api/requests`, `/api/stats` and `/metrics`."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Callable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from proxy.resilience.clock import FakeClock
from tests.fakes import FakeUpstream, Reply
from tests.integration.test_proxy import (
    CHAT_PATH,
    WAIT_ON,
    Proxy,
    Upstream,
    combo,
    error_of,
    in_thread,
    provider,
    sse_events,
    wait_until,
)

PRIVATE = "the-prompt-text-nobody-may-keep"


def _duo(a: Upstream, b: Upstream) -> str:
    return (
        provider("one", "local", a.url, "one-1")
        + provider("two", "local", b.url, "two-1")
        + combo("duo", "one/m1", "two/m1")
    )


def record(proxy: Proxy, request_id: str) -> dict[str, Any]:
    response = proxy.http.get(f"/api/requests/{request_id}")
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()["request"]
    return found


def ended(proxy: Proxy, request_id: str) -> dict[str, Any]:
    """The record once it has ended: a stream's client has its last byte a moment before the
    response's own end runs."""
    wait_until(lambda: record(proxy, request_id)["endedAt"] is not None, what="the record to end")
    return record(proxy, request_id)


def records(proxy: Proxy, query: str = "") -> list[dict[str, Any]]:
    response = proxy.http.get(f"/api/requests{query}")
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["requests"]
    return found


def ask(proxy: Proxy, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": PRIVATE}], **extra}
    return proxy.http.post(CHAT_PATH, json=body)


def test_a_fallback_leaves_both_attempts_and_what_the_client_got(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    a, b = upstreams("a"), upstreams("b")
    proxy = launch(_duo(a, b))
    a.fake.script(Reply("error", status=503))
    response = ask(proxy, "duo")
    assert response.status_code == 200
    rec = record(proxy, response.headers["x-request-id"])
    assert rec["id"] == response.headers["x-request-id"]
    assert (rec["state"], rec["status"], rec["code"], rec["message"]) == ("done", 200, None, None)
    assert (rec["modelAsked"], rec["route"], rec["endpoint"], rec["stream"]) == (
        "duo",
        "combo",
        "chat/completions",
        False,
    )
    assert rec["client"] == "127.0.0.1"
    assert [(t["target"], t["connectionId"], t["status"], t["outcome"]) for t in rec["attempts"]] == [
        ("one/m1", "one-1", 503, "fallback"),
        ("two/m1", "two-1", 200, "ok"),
    ]
    assert rec["attempts"][0]["reason"] == "503 server_error"
    assert rec["usage"] == {"promptTokens": 5, "completionTokens": 4, "totalTokens": 9}
    assert rec["bytesIn"] == len(response.request.content)
    assert rec["bytesOut"] == len(response.content)
    assert rec["durationMs"] is not None and rec["ttftMs"] is None
    assert rec["endedAt"] is not None and rec["startedAt"] <= rec["endedAt"]
    assert (rec["skipped"], rec["waits"]) == ([], [])
    assert PRIVATE not in json.dumps(rec) and "hello from" not in json.dumps(rec)

    # The next request passes over the cooling connection without trying it: a skip, in words.
    again = ask(proxy, "duo")
    assert again.status_code == 200
    rec = record(proxy, again.headers["x-request-id"])
    assert [s["connectionId"] for s in rec["skipped"]] == ["one-1"]
    skip = rec["skipped"][0]
    assert skip["target"] == "one/m1"
    assert skip["reason"].startswith("cooling ") and "(503 server_error)" in skip["reason"]
    assert skip["retryAfterMs"] > 0
    assert [t["connectionId"] for t in rec["attempts"]] == ["two-1"]
    assert rec["seq"] == record(proxy, response.headers["x-request-id"])["seq"] + 1
    proxy.settled()


def test_an_open_breaker_is_a_skip_and_an_error_reaches_the_record(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    a, b = upstreams("a"), upstreams("b")
    proxy = launch(_duo(a, b), settings={"connectionCooldown": {"local": {"baseCooldownMs": 0}}})
    a.fake.default(Reply("error", status=503))
    b.fake.default(Reply("error", status=400))
    for _ in range(5):
        ask(proxy, "duo")
    assert proxy.breaker("one")["state"] == "OPEN"
    response = ask(proxy, "duo")
    assert error_of(response, 400)
    rec = record(proxy, response.headers["x-request-id"])
    assert [s["reason"].split(",")[0] for s in rec["skipped"]] == ["breaker OPEN"]
    assert rec["skipped"][0]["connectionId"] is None
    assert [(t["connectionId"], t["outcome"]) for t in rec["attempts"]] == [("two-1", "returned")]
    assert (rec["state"], rec["status"]) == ("failed", 400)
    assert rec["message"] == "b: 400 Bad Request"  # the upstream's own words, relayed
    proxy.settled()


def test_a_connection_cooling_after_a_network_error_is_skipped_with_that_error_in_words(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    # A local server that is down cools its connection with no status: the skip says what cooled
    # it, as the 429 answer does when nothing is left ("cooling after connection refused..."), not
    # a bare "cooling 2 s" an operator cannot act on.
    b = upstreams("b")
    proxy = launch(
        provider("one", "local", FakeUpstream.refused_url(), "one-1")
        + provider("two", "local", b.url, "two-1")
        + combo("duo", "one/m1", "two/m1")
    )
    first = ask(proxy, "duo")
    assert first.status_code == 200
    assert record(proxy, first.headers["x-request-id"])["attempts"][0]["outcome"] == "fallback"
    again = ask(proxy, "duo")
    assert again.status_code == 200
    (skip,) = record(proxy, again.headers["x-request-id"])["skipped"]
    assert skip["connectionId"] == "one-1"
    assert re.fullmatch(r"cooling \d+ (ms|s) \(connection refused\)", skip["reason"]), skip
    proxy.settled()


def test_a_wait_is_in_the_trail_and_the_record_says_waiting_meanwhile(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    a, b = upstreams("a"), upstreams("b")
    clock = FakeClock()
    proxy = launch(_duo(a, b), settings=WAIT_ON, clock=clock)
    a.fake.script(Reply("error", status=503))
    b.fake.script(Reply("error", status=503))
    answer = in_thread(lambda: ask(proxy, "duo"))
    wait_until(lambda: proxy.rt.pipeline.waiting == 1, what="the request to wait")
    alive = records(proxy, "?state=alive")
    assert [(r["state"], r["endedAt"]) for r in alive] == [("waiting", None)]
    assert records(proxy, "?state=done") == []
    clock.advance(2_000 + 50)
    response = answer()
    assert response.status_code == 200
    rec = record(proxy, response.headers["x-request-id"])
    assert [w["ms"] for w in rec["waits"]] == [2050]
    assert rec["waits"][0]["reason"].startswith("nothing eligible; waited for one-1")
    assert [t["outcome"] for t in rec["attempts"]] == ["fallback", "fallback", "ok"]
    assert {s["connectionId"] for s in rec["skipped"]} == {"one-1", "two-1"}
    assert rec["durationMs"] == 2050
    # Where each skip and wait came among the attempts: both connections failed, then were passed
    # over as cooling, then the request waited, then it tried again.
    assert [s["after"] for s in rec["skipped"]] == [2, 2] and [w["after"] for w in rec["waits"]] == [2]
    # The console tells the trail in that order (the read model decoded from this JSON, as an
    # attached console reads it; a hosted one reads the same views).
    from omniroute_tui.snapshot import request_detail
    from proxy.readmodel import request_view

    told = [text for text, _ in request_detail(request_view(rec)).lines]
    assert [line.split(" (")[0].split(", ")[0] for line in told[:6]] == [
        "one-1  503 in 0 ms",
        "two-1  503 in 0 ms",
        "one-1  skipped  cooling 2 s",
        "two-1  skipped  cooling 2 s",
        "waited 2.0 s  nothing eligible; waited for one-1",
        "one-1  200 in 0 ms",
    ]
    proxy.settled()


def stream_body(proxy: Proxy, model: str, **extra: Any) -> tuple[httpx.Response, bytes]:
    body = {"model": model, "messages": [{"role": "user", "content": PRIVATE}], "stream": True, **extra}
    with proxy.http.stream("POST", CHAT_PATH, json=body) as response:
        return response, response.read()


def test_streams_with_and_without_usage(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("up")
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    up.fake.default(Reply("stream", chunks=3))
    bare, raw = stream_body(proxy, "loc/m1")
    rec = ended(proxy, bare.headers["x-request-id"])
    assert (rec["stream"], rec["state"], rec["status"], rec["route"]) == (True, "done", 200, "target")
    assert rec["usage"] is None  # the client did not ask, and the proxy never adds include_usage
    assert b"include_usage" not in up.calls()[-1].body
    assert rec["ttftMs"] is not None and rec["ttftMs"] <= rec["durationMs"]
    assert rec["bytesOut"] == len(raw)

    counted, raw = stream_body(proxy, "loc/m1", stream_options={"include_usage": True})
    rec = ended(proxy, counted.headers["x-request-id"])
    assert rec["usage"] == {"promptTokens": 5, "completionTokens": 4, "totalTokens": 9}
    assert rec["bytesOut"] == len(raw)
    assert PRIVATE not in json.dumps(rec) and '"hi"' not in json.dumps(rec)

    up.fake.default(Reply("stream_die", die_after=2))
    broken, _ = stream_body(proxy, "loc/m1")
    rec = ended(proxy, broken.headers["x-request-id"])
    assert (rec["state"], rec["code"], rec["status"]) == ("failed", "stream_interrupted", 200)
    assert [t["outcome"] for t in rec["attempts"]] == ["returned"]  # it had reached the client
    proxy.settled()


def test_a_broken_streams_record_says_the_code_its_client_was_told(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """An upstream that goes quiet past idle_timeout_ms counts as a stall, but the client is told
    `stream_interrupted` (`stream_stalled` is the throughput watchdog's): the record says the same."""
    up = upstreams("up")
    watchdog = {"enabled": True, "warmupMs": 0, "windowMs": 1000, "minUsefulBytesPerSecond": 4}
    proxy = launch("[server]\nidle_timeout_ms = 300\n\n" + provider("loc", "local", up.url, "loc-1"))
    for reply, settings, code in (
        (Reply("drip", drip_bytes=40, delay_ms=2000), None, "stream_interrupted"),  # quiet for 2 s
        (Reply("stream_pings", delay_ms=100), {"streamRecovery": {"throughputWatchdog": watchdog}}, "stream_stalled"),
    ):  # fmt: skip
        if settings is not None:
            assert proxy.http.patch("/api/resilience", json=settings).status_code == 200
        up.fake.default(reply)
        response, raw = stream_body(proxy, "loc/m1")
        told = [e for e in sse_events(raw.decode()) if isinstance(e, dict) and "error" in e]
        assert [e["error"]["code"] for e in told] == [code]
        rec = ended(proxy, response.headers["x-request-id"])
        assert (rec["state"], rec["code"]) == ("failed", code)
        proxy.rt.engine.reset_connection("loc-1")
    proxy.settled()


def _send_and_close(proxy: Proxy, body: dict[str, Any], up: Upstream) -> None:
    host, port = proxy.url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=10)
    try:
        head = (
            f"POST {CHAT_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        sock.sendall(head.encode() + data)
        wait_until(lambda: len(up.calls()) == 1, what="the request to reach the upstream")
    finally:
        sock.close()


def test_a_client_that_leaves_is_client_gone(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("up")
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    up.fake.default(Reply("hang"))
    _send_and_close(proxy, {"model": "loc/m1", "messages": [{"role": "user", "content": PRIVATE}]}, up)
    wait_until(lambda: records(proxy, "?state=done") != [], what="the record to end")
    (rec,) = records(proxy)
    assert (rec["state"], rec["status"], rec["code"]) == ("client_gone", 499, "client_disconnected")
    assert [t["outcome"] for t in rec["attempts"]] == ["disconnect"]
    proxy.settled()


def test_a_client_that_leaves_a_stream_is_client_gone(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("up")
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    up.fake.default(Reply("stream", chunks=1000, delay_ms=20))
    body = {"model": "loc/m1", "messages": [], "stream": True}
    _send_and_close(proxy, body, up)
    wait_until(lambda: records(proxy, "?state=done") != [], what="the record to end")
    (rec,) = records(proxy)
    assert (rec["state"], rec["code"], rec["stream"]) == ("client_gone", "client_disconnected", True)
    assert [t["outcome"] for t in rec["attempts"]] == ["disconnect"]
    proxy.settled()


def test_a_key_an_upstream_echoes_never_reaches_a_record(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("up")
    proxy = launch(provider("loc", "apikey", up.url, "loc-1"))
    up.fake.default(
        Reply("error", status=400, body={"error": {"message": "bad key key-loc-1 sent", "code": "x"}})
    )
    response = ask(proxy, "loc/m1")
    assert response.status_code == 400
    text = json.dumps(record(proxy, response.headers["x-request-id"]))
    assert "key-loc-1" not in text and "bad key" in text
    assert "key-loc-1" not in proxy.http.get("/metrics").text


def test_requests_before_any_upstream_leave_a_record_too(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("up")
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    response = ask(proxy, "nobody/serves-this")
    rec = record(proxy, response.headers["x-request-id"])
    assert (rec["state"], rec["status"], rec["code"], rec["attempts"]) == (
        "failed",
        404,
        "model_not_found",
        [],
    )
    bad = proxy.http.post(CHAT_PATH, content=b"{", headers={"content-type": "application/json"})
    rec = record(proxy, bad.headers["x-request-id"])
    assert (rec["status"], rec["code"], rec["modelAsked"]) == (400, "invalid_json", None)


def test_a_request_the_proxy_failed_on_is_a_failure_in_its_record_not_a_client_gone(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], monkeypatch: Any
) -> None:
    """A bug on the request path answered 500 internal_error, and the record said the client had
    gone (`client_gone`, `cancelled`) although it was there for the answer (found by a trial, where
    a base_url's user name and password made every request fail in the HTTP client)."""
    up = upstreams("up")
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    assert proxy.runtime is not None

    async def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(proxy.runtime.pipeline, "_route", broken)
    response = ask(proxy, "loc/m1")
    assert error_of(response, 500)["code"] == "internal_error"
    rec = record(proxy, response.headers["x-request-id"])
    assert (rec["state"], rec["status"], rec["code"]) == ("failed", 500, "internal_error")


def test_the_ring_keeps_request_history_records_and_the_query_pages(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("up")
    proxy = launch("[server]\nrequest_history = 3\n" + provider("loc", "local", up.url, "loc-1"))
    ids = [ask(proxy, "loc/m1").headers["x-request-id"] for _ in range(5)]
    kept = records(proxy)
    assert [r["id"] for r in kept] == ids[2:]
    assert [r["seq"] for r in kept] == [3, 4, 5]
    assert proxy.http.get(f"/api/requests/{ids[0]}").status_code == 404
    assert [r["seq"] for r in records(proxy, "?after=3")] == [4, 5]
    assert [r["seq"] for r in records(proxy, "?limit=1")] == [3]
    for query in ("?limit=0", "?limit=1001", "?after=-1", "?after=x", "?state=gone"):
        response = proxy.http.get(f"/api/requests{query}")
        assert response.status_code == 400, query
        assert response.json()["error"]["fields"][0]["field"] == query[1:].split("=")[0]


def test_recording_off_keeps_nothing(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("up")
    proxy = launch("[server]\nrequest_history = 0\n" + provider("loc", "local", up.url, "loc-1"))
    response = ask(proxy, "loc/m1")
    assert response.status_code == 200
    assert records(proxy) == []
    assert proxy.http.get(f"/api/requests/{response.headers['x-request-id']}").status_code == 404
    stats = proxy.http.get("/api/stats").json()
    assert stats["providers"]["loc"]["requests"] == 0


def test_stats_per_provider_and_connection(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    a, b = upstreams("a"), upstreams("b")
    clock = FakeClock()
    proxy = launch(_duo(a, b), clock=clock)
    a.fake.script(Reply("error", status=503))
    assert ask(proxy, "duo").status_code == 200  # falls back to two: one request for two
    b.fake.script(Reply("error", status=400))
    assert ask(proxy, "duo").status_code == 400  # one is cooling: two answers 400
    body = proxy.http.get("/api/stats?window=1m").json()
    assert body["window"] == "1m"
    two = body["providers"]["two"]
    assert (two["requests"], two["errors"], two["errorRate"]) == (2, 1, 0.5)
    assert two["p50Ms"] is not None and two["ttftP50Ms"] is None and two["tokensPerSecond"] is None
    assert body["connections"]["two-1"]["requests"] == 2
    assert body["providers"]["one"] == {
        "requests": 0,
        "errors": 0,
        "errorRate": None,
        "p50Ms": None,
        "p95Ms": None,
        "ttftP50Ms": None,
        "tokensPerSecond": None,
    }
    assert proxy.http.get("/api/stats").json()["window"] == "5m"
    clock.advance(5 * 60_000)
    after = proxy.http.get("/api/stats?window=1m").json()["providers"]["two"]
    assert after["requests"] == 0
    assert proxy.http.get("/api/stats?window=15m").json()["providers"]["two"]["requests"] == 2
    bad = proxy.http.get("/api/stats?window=2m")
    assert bad.status_code == 400 and bad.json()["error"]["fields"][0]["field"] == "window"


def test_stats_scope_fleet_without_a_fleet_is_this_replica_and_a_bad_scope_is_a_400(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    a, b = upstreams("a"), upstreams("b")
    proxy = launch(_duo(a, b), clock=FakeClock())
    a.fake.script(Reply("error", status=503))
    assert ask(proxy, "duo").status_code == 200
    own = proxy.http.get("/api/stats?window=1m").json()
    fleet = proxy.http.get("/api/stats?window=1m&scope=fleet").json()
    assert fleet.pop("scope") == "fleet"
    assert fleet.pop("replicas") == {"summed": ["local"], "stale": [], "missing": []}
    assert fleet == own
    assert proxy.http.get("/api/stats?scope=replica").json() == proxy.http.get("/api/stats").json()
    bad = proxy.http.get("/api/stats?scope=everywhere")
    assert bad.status_code == 400
    assert [f["field"] for f in bad.json()["error"]["fields"]] == ["scope"]
    assert "replica, fleet" in bad.json()["error"]["fields"][0]["message"]


def test_metrics_parse_with_the_exposition_librarys_own_parser(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    a, b = upstreams("a"), upstreams("b")
    proxy = launch(_duo(a, b))
    a.fake.script(Reply("error", status=503))
    assert ask(proxy, "duo").status_code == 200
    assert ask(proxy, "a-model-name-a-client-made-up").status_code == 404
    b.fake.default(Reply("stream", chunks=2))
    streamed, _ = stream_body(proxy, "two/m1", stream_options={"include_usage": True})
    ended(proxy, streamed.headers["x-request-id"])

    response = proxy.http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    text = response.text
    assert "a-model-name" not in text  # labels are bounded by the configuration
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("omniroute_requests_total", provider="two", connection="two-1", status="200") == 2
    assert value("omniroute_requests_total", provider="none", connection="none", status="404") == 1
    assert value("omniroute_fallbacks_total", provider="one") == 1
    assert value("omniroute_fallbacks_total", provider="two") == 0
    assert value("omniroute_tokens_total", provider="two", kind="completion") == 8
    assert value("omniroute_tokens_total", provider="two", kind="prompt") == 10
    assert value("omniroute_request_duration_seconds_count", provider="two") == 2
    assert value("omniroute_ttft_seconds_count", provider="two") == 1
    assert value("omniroute_ttft_seconds_count", provider="one") == 0
    assert families["omniroute_request_duration_seconds"].type == "histogram"
    now = proxy.breaker("one")["state"]
    states = ("CLOSED", "DEGRADED", "OPEN", "HALF_OPEN")
    assert [value("omniroute_breaker_state", provider="one", state=s) for s in states] == [
        1.0 if s == now else 0.0 for s in states
    ]
    assert value("omniroute_connection_status", connection="one-1", status="cooling") == 1
    assert value("omniroute_connection_status", connection="one-1", status="active") == 0
    assert value("omniroute_connection_cooldown_seconds", connection="one-1") > 0
    assert value("omniroute_lockouts", provider="one") == 0
    assert value("omniroute_in_flight", provider="one") == 0
    assert value("omniroute_queue_depth", connection="two-1") == 0
    assert value("omniroute_events_total", layer="connection") >= 1
    proxy.settled()


def test_metrics_are_behind_the_management_token(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("up")
    proxy = launch(
        '[server]\nmanagement_token = "scrape-me-0123456789"\n' + provider("loc", "local", up.url, "l-1")
    )
    assert proxy.http.get("/metrics").status_code == 401
    assert proxy.http.get("/api/requests").status_code == 401
    ok = proxy.http.get("/metrics", headers={"authorization": "Bearer scrape-me-0123456789"})
    assert ok.status_code == 200 and "omniroute_breaker_state" in ok.text


def test_messages_requests_leave_records_too(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    from tests.integration.test_apis import anthropic_client, claude

    up = upstreams("claude-up")
    proxy = launch(claude("claude", up.url, "key-a", "key-b"))
    client = anthropic_client(proxy)
    up.fake.script(Reply("error", status=529))
    client.messages.create(
        model="claude/sonnet", max_tokens=64, messages=[{"role": "user", "content": PRIVATE}]
    )
    up.fake.by_model("streamed", Reply("stream", chunks=3, chunk_text="ok"))
    with client.messages.stream(model="claude/streamed", max_tokens=64, messages=[]) as stream:
        "".join(stream.text_stream)
    wait_until(lambda: len(records(proxy, "?state=done")) == 2, what="both records to end")
    plain, streamed = records(proxy)
    assert (plain["endpoint"], plain["state"], plain["status"]) == ("messages", "done", 200)
    assert [(a["connectionId"], a["outcome"]) for a in plain["attempts"]] == [
        ("key-a", "fallback"),
        ("key-b", "ok"),
    ]
    assert plain["usage"] is not None and plain["usage"]["completionTokens"] == 4
    assert (streamed["stream"], streamed["state"]) == (True, "done")
    assert streamed["ttftMs"] is not None and streamed["bytesOut"] > 0
    assert streamed["usage"] is not None and streamed["usage"]["completionTokens"] is not None
    # A Messages stream says its prompt's tokens once, at its start (message_start), and only the
    # output's at its end (message_delta): the record has both.
    assert streamed["usage"] == {"promptTokens": 5, "completionTokens": 4, "totalTokens": 9}
    assert PRIVATE not in json.dumps([plain, streamed])


def test_a_request_streaming_says_where_it_is_streaming_from(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """Found by an operator's trial of the demo: a request in state `streaming` (TTFT 83 ms, bytes
    flowing) is shown on the Requests tab as gone nowhere: `Went to —`, `Attempts 0`, and its
    detail pane holds no attempt line, because the attempt is recorded only once it has ended.
    The operator watching a long stream cannot tell which connection is serving it, though the
    client already holds `X-OmniRoute-Selected-Connection-Id`."""
    up = upstreams("up")
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    up.fake.default(Reply("stream", chunks=200, delay_ms=20))
    body = {"model": "loc/m1", "messages": [], "stream": True}
    answer = in_thread(lambda: proxy.http.post(CHAT_PATH, json=body))
    wait_until(
        lambda: [r["state"] for r in records(proxy, "?state=alive")] == ["streaming"],
        what="the request to stream",
    )
    (alive,) = records(proxy, "?state=alive")
    assert answer().status_code == 200
    proxy.settled()
    assert [(t["provider"], t["connectionId"]) for t in alive["attempts"]] == [("loc", "loc-1")], alive
