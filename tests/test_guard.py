"""proxy/guard.py's Host rule, with its cache of the Host values it has seen, and the answers of an app
that puts the Guard's headers on itself (DirectAnswers)."""

from __future__ import annotations

import json

from starlette.types import Message, Receive, Scope, Send

from proxy.config import ServerConfig
from proxy.guard import STARTED_KEY, Guard


async def _app(scope: object, receive: object, send: object) -> None:  # never reached here
    raise AssertionError


def test_host_verdicts_stay_right_past_the_cache_and_on_repeat() -> None:
    guard = Guard(_app, ServerConfig(allowed_hosts=("proxy.lan",)))
    hosts = [f"evil{i}.example".encode() for i in range(200)] + [b"127.0.0.1:20128", b"proxy.lan", b"[::1]"]
    for _ in range(2):  # the second time round, the first 64 come from the cache
        assert [guard._host_allowed(h) for h in hosts] == [False] * 200 + [True, True, True]
    assert len(guard._hosts) == 64  # however many names a client makes up


class _Direct:
    """An app that answers its API requests itself (proxy.guard.DirectAnswers)."""

    def __init__(self, fail_after_start: bool) -> None:
        self.fail_after_start = fail_after_start

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("a claimed request goes to answer()")

    def claims(self, scope: Scope) -> bool:
        return bool(scope["path"] == "/v1/chat/completions")

    async def answer(
        self, scope: Scope, receive: Receive, send: Send, added: list[tuple[bytes, bytes]]
    ) -> None:
        if self.fail_after_start:
            scope[STARTED_KEY] = True
            await send({"type": "http.response.start", "status": 200, "headers": [*added]})
        raise RuntimeError("broken")


async def _through(guard: Guard, path: str = "/v1/chat/completions") -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [(b"host", b"127.0.0.1:20128"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000),
    }
    await guard(scope, receive, send)
    return sent


async def test_a_direct_answer_that_fails_before_it_starts_is_a_json_500_with_the_request_id() -> None:
    sent = await _through(Guard(_Direct(fail_after_start=False), ServerConfig()))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 500
    assert dict(sent[0]["headers"])[b"x-request-id"]
    assert b"internal_error" in sent[1]["body"]


async def test_on_the_messages_route_the_500_is_in_anthropics_shape() -> None:
    """Anthropic's SDK reads `{"type": "error", "error": {"type", "message"}}` on `/v1/messages`,
    as for every other answer of the Guard's there."""
    sent = await _through(Guard(_Direct(fail_after_start=False), ServerConfig()), "/v1/messages")
    assert sent[0]["status"] == 500
    body = json.loads(sent[1]["body"])
    assert body["type"] == "error" and body["error"]["type"] == "api_error", body
    assert "see the server log" in body["error"]["message"]


async def test_a_direct_answer_that_fails_after_it_started_gets_no_second_start() -> None:
    sent = await _through(Guard(_Direct(fail_after_start=True), ServerConfig()))
    assert [m["type"] for m in sent] == ["http.response.start"]
    assert dict(sent[0]["headers"])[b"x-request-id"]
