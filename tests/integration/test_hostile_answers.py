"""Upstream answers no HTTP server library writes, which a hostile or broken upstream can: a status
HTTP does not have, a Content-Type outside latin-1. Each reaches the client as a well-formed answer
(relayed, or a failure that falls back, or an error that says why), never a 500 or a dropped
connection, on every route that relays an upstream's answer.

The upstream writes raw bytes (tests/fakes/raw.py); the proxy runs on a real uvicorn server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.fakes.raw import RawUpstream
from tests.integration.test_proxy import CHAT_PATH, Proxy, Upstream, chat, error_of, provider

JSON = {"content-type": "application/json"}
COMPLETION = (
    b'{"id":"c1","object":"chat.completion","created":1,"model":"m1","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"raw"},"finish_reason":"stop"}]}'
)
ERROR = b'{"error":{"message":"no such model","type":"invalid_request_error"}}'


@pytest.fixture
def raw() -> Iterator[Callable[[Callable[[str], bytes]], RawUpstream]]:
    started: list[RawUpstream] = []

    def make(answer: Callable[[str], bytes]) -> RawUpstream:
        server = RawUpstream(answer).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


def answering(status_line: bytes, content_type: bytes, body: bytes) -> Callable[[str], bytes]:
    return lambda path: RawUpstream.response(status_line, [b"content-type: " + content_type], body)


def first_attempt_falls_back(
    launch: Callable[..., Proxy], odd: RawUpstream, good: Upstream
) -> dict[str, object]:
    """A combo of `odd` then `good`: the client gets `good`'s answer, and this is the record of the
    attempt at `odd` (which fell back)."""
    proxy = launch(
        provider("odd", "local", odd.url, "odd-1")
        + provider("good", "local", good.url, "good-1")
        + '[combos.both]\nstrategy = "priority"\ntargets = ["odd/m1", "good/m1"]\n'
    )
    response = proxy.chat("both")
    assert response.status_code == 200, response.text
    assert response.headers["x-omniroute-selected-connection-id"] == "good-1"
    [first, _] = proxy.http.get("/api/requests").json()["requests"][0]["attempts"]
    assert (first["connectionId"], first["outcome"]) == ("odd-1", "fallback")
    proxy.settled()
    return dict(first)


@pytest.mark.parametrize("status", [600, 700, 999])
def test_a_status_http_does_not_have_is_a_failure_that_falls_back(
    launch: Callable[..., Proxy],
    upstreams: Callable[..., Upstream],
    raw: Callable[..., RawUpstream],
    status: int,
) -> None:
    odd = raw(answering(b"HTTP/1.1 %d Odd" % status, b"application/json", COMPLETION))
    first = first_attempt_falls_back(launch, odd, upstreams())
    assert f"answered status {status}, which is no answer in HTTP" in str(first["reason"])


def test_a_status_http_does_not_have_with_nowhere_to_fall_back_is_told_as_a_failure(
    launch: Callable[..., Proxy], raw: Callable[..., RawUpstream]
) -> None:
    """As a reset would be: the connection cools, and the client is told what the upstream did
    (429 `all_targets_cooling`: the connection it would wait for is cooling)."""
    odd = raw(answering(b"HTTP/1.1 700 Odd", b"application/json", COMPLETION))
    proxy = launch(provider("odd", "local", odd.url, "odd-1"))
    error = error_of(proxy.chat("odd/m1"), 429)  # all_targets_cooling, as after a reset
    assert error["upstreamError"]["message"].startswith("answered status 700, which is no answer in HTTP")
    assert proxy.http.post("/api/resilience/connections/odd-1/reset").status_code == 200
    streamed = proxy.http.post(CHAT_PATH, json=chat("odd/m1", stream=True))
    # (a second failure in a row opens the local provider's breaker: 503 provider_circuit_open)
    assert "status 700" in error_of(streamed, 503)["upstreamError"]["message"]
    proxy.settled()


@pytest.mark.parametrize(
    "content_type",
    [
        pytest.param("application/json; charset=é中".encode(), id="utf-8"),
        pytest.param(b"application/json; charset=\xff\xfe", id="bytes"),
        pytest.param(b"\xff\xfe/\xc3\xa9", id="no-media-type"),
    ],
)
@pytest.mark.parametrize(
    ("status_line", "body"),
    [
        pytest.param(b"HTTP/1.1 200 OK", COMPLETION, id="200"),
        pytest.param(b"HTTP/1.1 404 No", ERROR, id="404"),
    ],
)
def test_a_content_type_outside_latin_1_is_relayed_in_one_latin_1_can_carry(
    launch: Callable[..., Proxy],
    raw: Callable[..., RawUpstream],
    content_type: bytes,
    status_line: bytes,
    body: bytes,
) -> None:
    odd = raw(answering(status_line, content_type, body))
    proxy = launch(provider("odd", "local", odd.url, "odd-1"))
    response = proxy.chat("odd/m1")
    assert response.status_code == int(status_line.split()[1]), response.text
    assert response.content == body
    relayed = response.headers["content-type"]
    assert relayed.isascii() and relayed.isprintable()
    assert relayed.startswith("application/json" if b"application/json" in content_type else "application/")
    proxy.settled()


def test_the_passed_through_routes_bound_the_status_and_the_content_type(
    launch: Callable[..., Proxy], raw: Callable[..., RawUpstream]
) -> None:
    """count_tokens relays one attempt's answer as it came (passthrough.py), and Messages through
    the pipeline: both answer in the Anthropic shape, never a 500."""
    bad_type = raw(answering(b"HTTP/1.1 400 Bad", "application/json; charset=é".encode(), ERROR))
    bad_status = raw(answering(b"HTTP/1.1 700 Odd", b"application/json", b'{"input_tokens":3}'))
    extra = 'apis = ["messages"]\nauth = "x-api-key"'
    proxy = launch(
        provider("typed", "apikey", bad_type.url, "typed-1", extra=extra)
        + provider("odd", "apikey", bad_status.url, "odd-1", extra=extra)
    )
    count = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    typed = proxy.http.post("/v1/messages/count_tokens", json={**count, "model": "typed/m"}, headers=JSON)
    assert typed.status_code == 400 and typed.content == ERROR
    assert typed.headers["content-type"].startswith("application/json")
    odd = proxy.http.post("/v1/messages/count_tokens", json={**count, "model": "odd/m"}, headers=JSON)
    assert odd.status_code == 502, odd.text
    assert odd.json()["type"] == "error" and "status 700" in odd.json()["error"]["message"]
    messages = proxy.http.post("/v1/messages", json={**count, "model": "odd/m"}, headers=JSON)
    assert messages.status_code == 429, messages.text
    assert messages.json()["type"] == "error" and "status 700" in messages.json()["error"]["message"]
    proxy.settled()


@pytest.mark.parametrize(
    "models",
    [
        pytest.param(b'{"data":' + b"[" * 100_000 + b"]" * 100_000 + b"}", id="deep"),
        pytest.param(
            b'{"data":[{"id":null},{"id":["x"]},{"id":1e999},{"id":7},{"id":"real"}]}', id="odd-ids"
        ),
    ],
)
def test_a_model_list_no_client_could_use_names_no_model(
    launch: Callable[..., Proxy], raw: Callable[..., RawUpstream], models: bytes
) -> None:
    """A provider's `/v1/models` is read for bare model names: nesting deeper than any parser
    recurses, or ids that are not strings (which would become routable names like `None` or
    `['x']`), name nothing, and the names that are strings still count."""
    odd = raw(
        lambda path: RawUpstream.response(b"HTTP/1.1 200 OK", [b"content-type: application/json"], models)
    )
    proxy = launch(provider("odd", "local", odd.url, "odd-1"))
    listed = proxy.http.get("/v1/models")
    assert listed.status_code == 200, listed.text
    ids = {m["id"] for m in listed.json()["data"]}
    assert ids == ({"odd/real"} if b"real" in models else set())
    for name in ("None", "['x']", "inf", "7"):
        assert error_of(proxy.chat(name), 404)
    proxy.settled()


CUT_CHAT = (
    b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m1","choices":[{"index":0,'
    b'"delta":{"content":"hel"}}]}\n\n'
    b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m1","choices":[{"index":0,"del'
)
CUT_MESSAGES = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message",'
    b'"role":"assistant","model":"m","content":[],"usage":{"input_tokens":3,"output_tokens":0}}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    b'"content_block":{"type":"text","text":""}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"hel"}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_blo'
)


@pytest.mark.parametrize(
    ("path", "body", "cut"),
    [
        pytest.param(
            CHAT_PATH,
            {"model": "odd/m1", "messages": [{"role": "user", "content": "hi"}]},
            CUT_CHAT,
            id="chat",
        ),
        pytest.param(
            "/v1/messages",
            {"model": "odd/m1", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
            CUT_MESSAGES,
            id="messages",
        ),
    ],
)
def test_a_stream_whose_connection_closes_inside_an_event_ends_as_broken_off(
    launch: Callable[..., Proxy],
    raw: Callable[..., RawUpstream],
    path: str,
    body: dict[str, object],
    cut: bytes,
) -> None:
    """An upstream whose body ends where its connection does (no length, no chunks) and closes it
    in the middle of an event: the client gets what came whole, then the API's error event, never
    the half event; the attempt is a failure, as when a chunked body breaks off."""
    sse = [b"content-type: text/event-stream"]
    odd = raw(lambda p: RawUpstream.response(b"HTTP/1.1 200 OK", sse, cut, length=False))
    extra = 'apis = ["chat", "messages"]'
    proxy = launch(provider("odd", "local", odd.url, "odd-1", extra=extra))
    response = proxy.http.post(path, json={**body, "stream": True}, headers=JSON)
    assert response.status_code == 200
    text = response.text
    whole = cut[: cut.rindex(b"\n\n") + 2].decode()
    assert text.startswith(whole), text
    assert "stream_interrupted" in text[len(whole) :]
    assert cut[cut.rindex(b"\n\n") + 2 :].decode() not in text[len(whole) :]  # the half event is dropped
    record = proxy.last_record()
    assert (record["state"], record["code"]) == ("failed", "stream_interrupted"), record
    assert record["attempts"][0]["outcome"] != "ok"
    proxy.settled()


CUT_MESSAGES_BETWEEN_EVENTS = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message",'
    b'"role":"assistant","model":"m1","content":[],"stop_reason":null,"stop_sequence":null,'
    b'"usage":{"input_tokens":5,"output_tokens":1}}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    b'"content_block":{"type":"text","text":""}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"hel"}}\n\n'
)


def test_a_messages_stream_whose_connection_closes_between_events_before_message_stop_is_broken_off(
    launch: Callable[..., Proxy], raw: Callable[..., RawUpstream]
) -> None:
    """The same upstream (body ends where its connection does), closing after a whole event but
    before `message_stop`: the answer is not whole (no `message_delta`, no `message_stop`: the
    Anthropic SDK hands back a message with `stop_reason: None` as if it were complete), so the
    client must get the API's error event and the attempt must not count as a success."""
    sse = [b"content-type: text/event-stream"]
    odd = raw(
        lambda p: RawUpstream.response(b"HTTP/1.1 200 OK", sse, CUT_MESSAGES_BETWEEN_EVENTS, length=False)
    )
    proxy = launch(provider("odd", "local", odd.url, "odd-1", extra='apis = ["messages"]'))
    body = {
        "model": "odd/m1",
        "max_tokens": 5,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    response = proxy.http.post("/v1/messages", json=body, headers=JSON)
    assert response.status_code == 200
    text = response.text
    assert text.startswith(CUT_MESSAGES_BETWEEN_EVENTS.decode()), text
    assert "event: error" in text[len(CUT_MESSAGES_BETWEEN_EVENTS) :], text
    record = proxy.last_record()
    assert record["state"] == "failed", record
    assert record["attempts"][0]["outcome"] != "ok"
    proxy.settled()


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (b"HTTP/1.1 200 OK\r\n" + b"x-h: 1\r\n" * 200 + b"\r\n" + COMPLETION, "not HTTP"),
        (b"HTTP/1.1 200 OK\r\nx-pad: " + b"a" * (80 * 1024) + b"\r\n\r\n" + COMPLETION, "not HTTP"),
        (b"SSH-2.0-OpenSSH_9.2\r\n", "not HTTP"),
    ],
    ids=["200-headers", "80-KiB-header", "not-http"],
)
def test_an_answer_with_an_endless_head_or_no_http_at_all_is_a_failure_that_falls_back(
    launch: Callable[..., Proxy],
    upstreams: Callable[..., Upstream],
    raw: Callable[..., RawUpstream],
    answer: bytes,
    words: str,
) -> None:
    """The proxy does not buffer an upstream's head without end (64 KiB, 128 headers), nor take
    what is not HTTP for an answer: the attempt fails, in words, and the next candidate answers."""
    first = first_attempt_falls_back(launch, raw(lambda path: answer), upstreams())
    assert words in str(first["reason"]), first["reason"]
