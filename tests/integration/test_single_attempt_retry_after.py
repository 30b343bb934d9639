"""The upstream's `Retry-After` on the single-attempt routes (`count_tokens`, the Responses
follow-ups).

docs/api.md#the-proxy-api, response headers: "`Retry-After` | on a relayed upstream error, the
upstream's own". `POST /v1/messages/count_tokens` (Claude Code calls it before many turns) and
`GET /v1/responses/{id}` relay an upstream's error answer (status and body) but drop its headers:
a 429 with `Retry-After: 30` reaches the client without it, so the SDK's retry (which honours
`retry-after` / `retry-after-ms`) comes back after its own short backoff instead, into the same
rate limit. (`proxy/passthrough.py:_send_once` builds the error Response with only the routing
headers.)
"""

from __future__ import annotations

from collections.abc import Callable

import openai

from tests.fakes import Reply
from tests.fakes.dialects import response
from tests.fakes.scripted import Scripted, ScriptedUpstream
from tests.integration.test_apis import USER
from tests.integration.test_proxy import Proxy, Upstream, provider


def test_count_tokens_relays_the_upstreams_retry_after_with_its_429(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("claude-up")
    proxy = launch(
        provider("claude", "apikey", up.url, "key-a", extra='apis = ["messages"]\nauth = "x-api-key"')
    )
    up.fake.script(Reply("error", status=429, headers={"retry-after": "30"}))
    response = proxy.http.post("/v1/messages/count_tokens", json={"model": "claude/sonnet", "messages": USER})
    assert response.status_code == 429
    assert response.json()["error"]["type"] == "rate_limit_error"  # the upstream's body, relayed
    assert response.headers.get("retry-after") == "30"


def test_a_responses_follow_up_relays_the_upstreams_retry_after_with_its_429(
    launch: Callable[..., Proxy], scripted: Callable[[], ScriptedUpstream]
) -> None:
    up = scripted()
    proxy = launch(provider("oa", "apikey", up.url, "k1", extra='apis = ["chat", "responses"]'))
    up.script(
        Scripted(json_body=response("resp_1", "m", "hello")),
        Scripted(
            json_body={"error": {"message": "slow down", "type": "requests", "code": "rate_limit_exceeded"}},
            status=429,
            headers={"retry-after": "30"},
        ),
    )
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-client", max_retries=0)
    try:
        assert client.responses.create(model="oa/m", input="hi").id == "resp_1"
    finally:
        client.close()
    answer = proxy.http.get("/v1/responses/resp_1")
    assert [path for path, _, _ in up.requests] == ["/v1/responses", "/v1/responses/resp_1"]
    assert answer.status_code == 429
    assert answer.headers.get("retry-after") == "30"


def test_only_a_number_or_a_date_is_carried_on() -> None:
    from proxy.pipeline import retry_hints

    said = {"retry-after": "30", "retry-after-ms": "1500.5"}
    assert retry_hints(said) == said
    assert retry_hints({"retry-after": "Wed, 21 Oct 2026 07:28:00 GMT"}) == {
        "retry-after": "Wed, 21 Oct 2026 07:28:00 GMT"
    }
    for odd in ("1.2.3.4", "sk-live-123", "-5", "", "30 seconds", "1" * 20):
        assert retry_hints({"retry-after": odd}) == {}, odd
