"""The fakes themselves, proven over real HTTP: every Reply kind, the recorder and the LiveServer lifecycle."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from tests.fakes import FakeUpstream, LiveServer, Reply, serve

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hey"}]}


@pytest.fixture
def fake() -> FakeUpstream:
    return FakeUpstream("up1")


@pytest.fixture
def server(fake: FakeUpstream) -> Iterator[LiveServer]:
    with serve(fake.app) as live:
        yield live


@pytest.fixture
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"{server.url}/v1", timeout=5.0) as http:
        yield http


def wait_until(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def sse_data(lines: list[str]) -> list[Any]:
    """The `data:` payloads of an SSE body, decoded ("[DONE]" kept as a string)."""
    payloads = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    return [p if p == "[DONE]" else json.loads(p) for p in payloads]


# LiveServer


def test_live_server_serves_on_an_ephemeral_port_and_stops() -> None:
    live = LiveServer(FakeUpstream().app).start()
    try:
        assert live.port > 0
        assert live.url == f"http://127.0.0.1:{live.port}"
        assert httpx.get(f"{live.url}/v1/models").status_code == 200
    finally:
        live.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{live.url}/v1/models")


def test_live_server_reports_a_startup_failure() -> None:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        raise RuntimeError("boom")
        yield  # pragma: no cover

    with pytest.raises(RuntimeError, match="failed to start"):
        LiveServer(Starlette(lifespan=lifespan), lifespan="on").start()


async def test_live_server_works_from_an_async_test(fake: FakeUpstream, server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=f"{server.url}/v1") as http:
        response = await http.post("/chat/completions", json=CHAT)
    assert response.json()["choices"][0]["message"]["content"] == "hello from up1"


# json replies and the recorder


def test_json_chat_completion_echoes_the_model(client: httpx.Client) -> None:
    response = client.post("/chat/completions", json={**CHAT, "model": "m2"})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == "m2"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hello from up1"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}


def test_json_text_completion_and_embeddings(client: httpx.Client) -> None:
    completion = client.post("/completions", json={"model": "m1", "prompt": "x"}).json()
    assert completion["object"] == "text_completion"
    assert completion["choices"][0]["text"] == "hello from up1"
    embeddings = client.post("/embeddings", json={"model": "m1", "input": ["a", "b"]}).json()
    assert embeddings["object"] == "list"
    assert [d["index"] for d in embeddings["data"]] == [0, 1]
    assert embeddings["data"][0]["embedding"] == [0.1, 0.2, 0.3]


def test_models_lists_the_configured_models(client: httpx.Client) -> None:
    body = client.get("/models").json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["m1", "m2"]
    assert body["data"][0]["object"] == "model"


def test_requests_are_recorded_with_lower_case_headers(fake: FakeUpstream, client: httpx.Client) -> None:
    client.post("/chat/completions", json=CHAT, headers={"Authorization": "Bearer sk-client", "X-Trace": "7"})
    client.get("/nope")
    first, second = fake.requests
    assert (first.method, first.path, first.json) == ("POST", "/v1/chat/completions", CHAT)
    assert first.headers["authorization"] == "Bearer sk-client"
    assert first.headers["x-trace"] == "7"
    assert all(name == name.lower() for name in first.headers)
    assert (second.method, second.path, second.json) == ("GET", "/v1/nope", None)
    assert first.time <= second.time


def test_unknown_path_is_a_404_openai_error(client: httpx.Client) -> None:
    response = client.post("/chat/complete", json=CHAT)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


# scripting


def test_script_is_fifo_then_the_default(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script(Reply("error", status=503), Reply("error", status=429, headers={"Retry-After": "2"}))
    statuses = [client.post("/chat/completions", json=CHAT).status_code for _ in range(3)]
    assert statuses == [503, 429, 200]


def test_error_default_body_is_openai_style(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script(Reply("error", status=429, headers={"Retry-After": "2", "retry-after-ms": "1500"}))
    response = client.post("/chat/completions", json=CHAT)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "2"
    assert response.headers["retry-after-ms"] == "1500"
    assert response.json() == {
        "error": {
            "message": "up1: 429 Too Many Requests",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }


def test_error_with_text_or_custom_json_body(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script(
        Reply("error", status=502, body="<html>bad gateway</html>"),
        Reply("error", status=400, body={"error": {"message": "context_length_exceeded"}}),
        Reply("error", status=503, body="{not json", headers={"content-type": "application/json"}),
    )
    text = client.post("/chat/completions", json=CHAT)
    assert (text.status_code, text.text) == (502, "<html>bad gateway</html>")
    assert text.headers["content-type"].startswith("text/plain")
    custom = client.post("/chat/completions", json=CHAT)
    assert custom.json() == {"error": {"message": "context_length_exceeded"}}
    broken = client.post("/chat/completions", json=CHAT)
    assert (broken.headers["content-type"], broken.text) == ("application/json", "{not json")


def test_success_can_carry_headers(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script(Reply("json", headers={"x-ratelimit-reset-requests": "6m0s"}))
    response = client.post("/chat/completions", json=CHAT)
    assert response.headers["x-ratelimit-reset-requests"] == "6m0s"


def test_json_with_an_error_status_gets_an_error_body(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script(Reply("slow_headers", status=503, delay_ms=10))
    response = client.post("/chat/completions", json=CHAT)
    assert response.status_code == 503
    assert response.json()["error"]["message"] == "up1: 503 Service Unavailable"


def test_by_model_rule_wins_and_does_not_consume_the_script(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.default(Reply("error", status=500))
    fake.by_model("m2", Reply("error", status=401))
    fake.script(Reply("json"))
    assert client.post("/chat/completions", json={"model": "m2"}).status_code == 401
    assert client.post("/chat/completions", json={"model": "m2"}).status_code == 401
    assert client.post("/chat/completions", json={"model": "m1"}).status_code == 200
    assert client.post("/chat/completions", json={"model": "m1"}).status_code == 500


def test_reset_forgets_script_rules_and_recordings(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.default(Reply("error", status=500))
    fake.by_model("m1", Reply("error", status=401))
    fake.script(Reply("error", status=503))
    client.post("/chat/completions", json=CHAT)
    fake.reset()
    assert fake.requests == []
    assert fake.max_in_flight == 0
    assert client.post("/chat/completions", json=CHAT).status_code == 200
    assert client.post("/chat/completions", json={"model": "m3"}).status_code == 200


# connection failures


def test_reset_reply_is_a_connection_error_and_the_server_lives_on(
    fake: FakeUpstream, client: httpx.Client
) -> None:
    fake.script(Reply("reset"))
    with pytest.raises(httpx.ReadError):  # ECONNRESET: an RST, not an HTTP answer
        client.post("/chat/completions", json=CHAT)
    assert client.post("/chat/completions", json=CHAT).status_code == 200
    assert len(fake.requests) == 2


def test_refused_url_refuses() -> None:
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"{FakeUpstream.refused_url()}/chat/completions", json=CHAT)


def test_hang_is_cut_by_a_client_timeout_and_the_server_still_stops(fake: FakeUpstream) -> None:
    fake.script(Reply("hang"))
    live = LiveServer(fake.app).start()
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{live.url}/v1/chat/completions", json=CHAT, timeout=0.3)
    assert time.monotonic() - started >= 0.3
    wait_until(lambda: fake.in_flight == 0)  # the client's disconnect ended the handler
    stopping = time.monotonic()
    live.stop(grace=3.0)
    assert time.monotonic() - stopping < 2.5  # graceful, and nothing was left to wait for


def test_hang_is_cut_by_fake_reset(fake: FakeUpstream, server: LiveServer) -> None:
    fake.script(Reply("hang"))
    errors: list[Exception] = []

    def call() -> None:
        try:
            httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, timeout=5.0)
        except httpx.HTTPError as exc:
            errors.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    wait_until(lambda: fake.in_flight == 1)
    fake.reset()
    caller.join(5.0)
    assert [type(e) for e in errors] == [httpx.ReadError]
    wait_until(lambda: fake.in_flight == 0)


def test_stop_cuts_a_hang_the_client_never_abandons(fake: FakeUpstream) -> None:
    fake.script(Reply("hang"))
    live = LiveServer(fake.app).start()
    errors: list[Exception] = []

    def call() -> None:
        try:
            httpx.post(f"{live.url}/v1/chat/completions", json=CHAT, timeout=10.0)
        except httpx.HTTPError as exc:
            errors.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    wait_until(lambda: fake.in_flight == 1)
    stopping = time.monotonic()
    live.stop(grace=0.3)
    assert time.monotonic() - stopping < 2.0
    caller.join(5.0)
    assert len(errors) == 1
    assert isinstance(errors[0], (httpx.ReadError, httpx.RemoteProtocolError))


def test_slow_headers_delays_the_answer(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script(Reply("slow_headers", delay_ms=300))
    started = time.monotonic()
    response = client.post("/chat/completions", json=CHAT)
    assert time.monotonic() - started >= 0.3
    assert response.json()["choices"][0]["message"]["content"] == "hello from up1"


def test_slow_headers_is_cut_by_a_client_timeout(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script(Reply("slow_headers", delay_ms=2000))
    with pytest.raises(httpx.ReadTimeout):
        client.post("/chat/completions", json=CHAT, timeout=0.2)
    wait_until(lambda: fake.in_flight == 0)


# streams


def test_stream_chunks_arrive_incrementally(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script(Reply("stream", chunks=3, chunk_text="ab", delay_ms=200))
    arrivals: list[float] = []
    lines: list[str] = []
    with client.stream("POST", "/chat/completions", json={**CHAT, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        for line in response.iter_lines():
            if line:
                arrivals.append(time.monotonic())
                lines.append(line)
    events = sse_data(lines)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * 4
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": "ab"},
        {"content": "ab"},
        {"content": "ab"},
        {},
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "stop"]
    # The first chunk was in hand well before the last one was even produced.
    assert arrivals[-1] - arrivals[0] >= 0.35


def test_text_completion_stream(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script(Reply("stream", chunks=2))
    with client.stream("POST", "/completions", json={"model": "m1", "prompt": "x", "stream": True}) as r:
        events = sse_data(list(r.iter_lines()))
    assert [e["choices"][0]["text"] for e in events[:-1]] == ["hi", "hi", ""]
    assert events[-1] == "[DONE]"


def test_stream_die_is_a_client_error_after_die_after_chunks(
    fake: FakeUpstream, client: httpx.Client
) -> None:
    fake.script(Reply("stream_die", die_after=2, delay_ms=50))
    lines: list[str] = []
    with (
        pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"),
        client.stream("POST", "/chat/completions", json=CHAT) as response,
    ):
        for line in response.iter_lines():
            lines.append(line)
    events = sse_data(lines)
    assert [e["choices"][0]["delta"]["content"] for e in events] == ["hi", "hi"]
    wait_until(lambda: fake.in_flight == 0)


def test_stream_pings_only_ping_until_the_client_leaves(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script(Reply("stream_pings", delay_ms=100))
    arrivals: list[float] = []
    with client.stream("POST", "/chat/completions", json=CHAT) as response:
        for line in response.iter_lines():
            if line:
                assert line == ": ping"
                arrivals.append(time.monotonic())
            if len(arrivals) == 3:
                break
    assert arrivals[2] - arrivals[0] >= 0.15
    wait_until(lambda: fake.in_flight == 0)


def test_stream_pings_are_cut_by_fake_reset(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script(Reply("stream_pings", delay_ms=50))
    with client.stream("POST", "/chat/completions", json=CHAT) as response:
        lines = response.iter_lines()
        assert next(lines) == ": ping"
        fake.reset()
        with pytest.raises(httpx.RemoteProtocolError):
            for _ in lines:
                pass
    wait_until(lambda: fake.in_flight == 0)


# faults for the chaos test: after the headers, slow, broken, huge, in bursts


@pytest.mark.parametrize("stream", [False, True])
def test_reset_after_headers_answers_200_then_resets(
    fake: FakeUpstream, client: httpx.Client, stream: bool
) -> None:
    fake.script(Reply("reset_after_headers"))
    with client.stream("POST", "/chat/completions", json={**CHAT, "stream": stream}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith(
            "text/event-stream" if stream else "application/json"
        )
        with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
            response.read()
    assert client.post("/chat/completions", json=CHAT).status_code == 200  # the server lives on


def test_drip_sends_a_healthy_stream_a_few_bytes_at_a_time(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script(Reply("drip", chunks=2, drip_bytes=16, delay_ms=1))
    pieces: list[bytes] = []
    with client.stream("POST", "/chat/completions", json={**CHAT, "stream": True}) as response:
        pieces.extend(response.iter_raw())
    assert len(pieces) > 10 and max(len(p) for p in pieces) <= 16 * 4  # dripped (a read may join a few)
    events = sse_data(b"".join(pieces).decode().splitlines())
    assert [e["choices"][0]["delta"].get("content") for e in events[:-1]] == ["hi", "hi", None]
    assert events[-1] == "[DONE]"


def test_drip_of_a_json_answer(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script(Reply("drip", drip_bytes=64))
    assert client.post("/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"] == (
        "hello from up1"
    )


def test_drip_of_an_error_answer(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script(Reply("drip", status=503, drip_bytes=64))
    response = client.post("/chat/completions", json=CHAT | {"stream": True})
    assert response.status_code == 503
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"]["type"] == "server_error"


def test_invalid_json_is_a_200_that_does_not_parse(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script(Reply("invalid_json"))
    response = client.post("/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    with pytest.raises(json.JSONDecodeError):
        response.json()


def test_big_is_a_five_megabyte_completion(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.script(Reply("big"))
    response = client.post("/chat/completions", json=CHAT)
    assert len(response.content) > 5 * 1024 * 1024
    assert len(response.json()["choices"][0]["message"]["content"]) == 5 * 1024 * 1024


def test_burst_scripts_consecutive_502s(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.burst(3)
    statuses = [client.post("/chat/completions", json=CHAT).status_code for _ in range(4)]
    assert statuses == [502, 502, 502, 200]


# concurrency


def test_max_in_flight_counts_concurrent_requests(fake: FakeUpstream, client: httpx.Client) -> None:
    fake.default(Reply("slow_headers", delay_ms=300))
    statuses: list[int] = []

    def call() -> None:
        statuses.append(client.post("/chat/completions", json=CHAT).status_code)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5.0)
    assert statuses == [200] * 4
    assert fake.max_in_flight == 4
    assert fake.in_flight == 0


def test_sequential_requests_never_overlap(fake: FakeUpstream, client: httpx.Client) -> None:
    for _ in range(3):
        client.post("/chat/completions", json=CHAT)
    assert fake.max_in_flight == 1


@pytest.fixture
def two_servers() -> Iterator[tuple[LiveServer, LiveServer]]:
    with contextlib.ExitStack() as stack:
        yield (
            stack.enter_context(serve(FakeUpstream("a").app)),
            stack.enter_context(serve(FakeUpstream("b").app)),
        )


def test_servers_are_independent(two_servers: tuple[LiveServer, LiveServer]) -> None:
    a, b = two_servers
    assert a.port != b.port
    contents = [
        httpx.post(f"{s.url}/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"]
        for s in two_servers
    ]
    assert contents == ["hello from a", "hello from b"]
