"""The Messages and Responses APIs through a real proxy, driven by the official SDKs.

Claude Code speaks Anthropic's Messages API and Codex CLI OpenAI's Responses API; both go
through the proxy unchanged (no translation) to the providers that declare that API, with every
resilience layer applying as for chat. The clients here are the `anthropic` and `openai` SDKs
themselves (no retries of their own, so each answer is the proxy's); the upstreams are fake
servers speaking each wire format (tests/fakes/dialects.py).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import anthropic
import openai
import pytest

from proxy.resilience.clock import FakeClock
from tests.fakes import Reply
from tests.instances import OMNIROUTE, environment, free_port, wait_until_serving
from tests.integration.test_proxy import Proxy, Upstream, combo, provider

MESSAGES_PATH = "/v1/messages"
RESPONSES_PATH = "/v1/responses"
USER = [{"role": "user", "content": "hi"}]


def claude(pid: str, url: str, *connections: str) -> str:
    """An Anthropic-style provider: speaks only `messages`, keys sent as x-api-key."""
    return provider(pid, "apikey", url, *connections, extra='apis = ["messages"]\nauth = "x-api-key"')


def codex(pid: str, url: str, *connections: str) -> str:
    return provider(pid, "apikey", url, *connections, extra='apis = ["chat", "responses"]')


def messages_stream_refused(url: str, model: str) -> anthropic.APIStatusError:
    """What Anthropic's SDK raised on a streamed Messages request through the proxy at `url`."""
    client = anthropic.Anthropic(base_url=url, api_key="sk-ant-client", max_retries=0)
    try:
        with client.messages.stream(model=model, max_tokens=16, messages=USER) as stream:  # type: ignore[arg-type]
            list(stream.text_stream)
    except anthropic.APIStatusError as refused:
        return refused
    finally:
        client.close()
    raise AssertionError("the stream was not refused")


SdkClient = TypeVar("SdkClient", anthropic.Anthropic, openai.OpenAI)
_OPENED: list[anthropic.Anthropic | openai.OpenAI] = []
"""SDK clients a test opened: closed when it ends (each holds a pool of sockets, which the collector
would otherwise close later, during some other test, with a ResourceWarning)."""


@pytest.fixture(autouse=True)
def _close_sdk_clients() -> Iterator[None]:
    yield
    while _OPENED:
        _OPENED.pop().close()


def opened(client: SdkClient) -> SdkClient:
    _OPENED.append(client)
    return client


def anthropic_client(proxy: Proxy, **kwargs: Any) -> anthropic.Anthropic:
    return opened(anthropic.Anthropic(base_url=proxy.url, api_key="sk-ant-client", max_retries=0, **kwargs))


def openai_client(proxy: Proxy) -> openai.OpenAI:
    return opened(openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-client", max_retries=0))


# ---------------------------------------------------------------------------------------------
# Messages


def test_messages_create_stream_and_count_tokens_with_the_anthropic_sdk(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("claude-up")
    proxy = launch(claude("claude", up.url, "claude-main"))
    client = anthropic_client(proxy)

    message = client.messages.create(model="claude/sonnet", max_tokens=64, messages=USER)
    assert message.content[0].type == "text"
    assert message.content[0].text == "hello from claude-up"
    assert message.usage.output_tokens == 4

    up.fake.by_model("streamed", Reply("stream", chunks=3, chunk_text="ok"))
    with client.messages.stream(model="claude/streamed", max_tokens=64, messages=USER) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "okokok"
    assert final.stop_reason == "end_turn"

    counted = client.messages.count_tokens(model="claude/sonnet", messages=USER)
    assert counted.input_tokens == 7

    sent = up.calls(MESSAGES_PATH)
    assert [r.json["model"] for r in sent] == ["sonnet", "streamed"]  # the provider's own model name
    for request in [*sent, *up.calls("/v1/messages/count_tokens")]:
        # The provider's key as x-api-key; the client's own key never travels.
        assert request.headers["x-api-key"] == "key-claude-main"
        assert "authorization" not in request.headers
        assert request.headers["anthropic-version"] == client.default_headers["anthropic-version"]
    assert up.calls("/v1/messages/count_tokens")[0].json["model"] == "sonnet"


def test_a_529_on_the_first_key_falls_back_to_the_second(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("claude-up")
    proxy = launch(claude("claude", up.url, "key-a", "key-b"))
    up.fake.script(Reply("error", status=529))
    message = anthropic_client(proxy).messages.create(model="claude/sonnet", max_tokens=64, messages=USER)
    assert message.content[0].text == "hello from claude-up"
    assert [r.headers["x-api-key"] for r in up.calls(MESSAGES_PATH)] == ["key-key-a", "key-key-b"]
    assert proxy.connection("key-a")["status"] == "cooling"  # 529 counts like 503
    assert proxy.breaker("claude")["lastFailure"] is not None


def test_a_429_with_anthropic_reset_headers_cools_the_key_until_that_time(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    clock = FakeClock()
    up = upstreams("claude-up")
    proxy = launch(claude("claude", up.url, "key-a", "key-b"), clock=clock)
    reset = datetime.fromtimestamp(clock.now() / 1000, UTC) + timedelta(seconds=42)
    stamp = reset.isoformat().replace("+00:00", "Z")
    up.fake.script(Reply("error", status=429, headers={"anthropic-ratelimit-requests-reset": stamp}))
    message = anthropic_client(proxy).messages.create(model="claude/sonnet", max_tokens=64, messages=USER)
    assert message.content[0].text == "hello from claude-up"
    cooling = proxy.connection("key-a")
    assert cooling["status"] == "cooling"
    assert cooling["cooldownRemainingMs"] == 42_000


def test_an_error_event_mid_stream_reaches_the_sdk_as_its_own_error(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("claude-up")
    proxy = launch(claude("claude", up.url, "key-a", "key-b"))
    up.fake.script(Reply("stream_error", status=529, die_after=2, chunk_text="par"))
    client = anthropic_client(proxy)
    received: list[str] = []
    stream = client.messages.stream(model="claude/sonnet", max_tokens=64, messages=USER)
    with pytest.raises(anthropic.APIStatusError) as caught, stream as events:
        received.extend(events.text_stream)
    assert received == ["par", "par"]  # what came before the error was relayed, then the error
    assert "overloaded_error" in str(caught.value)
    assert len(up.calls(MESSAGES_PATH)) == 1  # after content nothing is replayed
    assert proxy.breaker("claude")["failureCount"] == 1  # and the attempt counts as the 529 it was
    assert proxy.connection("key-a")["status"] == "cooling"


def test_an_error_event_before_content_falls_back(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("claude-up")
    proxy = launch(claude("claude", up.url, "key-a", "key-b"))
    up.fake.script(Reply("stream_error", status=529, die_after=0), Reply("stream", chunks=2, chunk_text="ok"))
    with anthropic_client(proxy).messages.stream(
        model="claude/sonnet", max_tokens=64, messages=USER
    ) as stream:
        assert "".join(stream.text_stream) == "okok"
    assert [r.headers["x-api-key"] for r in up.calls(MESSAGES_PATH)] == ["key-key-a", "key-key-b"]
    assert proxy.connection("key-a")["status"] == "cooling"


def test_an_error_event_before_content_with_nothing_left_is_the_answer(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("claude-up")
    proxy = launch(claude("claude", up.url, "key-a"))
    up.fake.script(Reply("stream_error", status=429, die_after=0))
    with (
        pytest.raises(anthropic.RateLimitError) as caught,
        anthropic_client(proxy).messages.stream(model="claude/sonnet", max_tokens=64, messages=USER) as s,
    ):
        list(s.text_stream)
    assert caught.value.status_code == 429
    assert caught.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]


def test_a_missing_model_locks_out_only_that_model(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("claude-up")
    proxy = launch(claude("claude", up.url, "key-a"), settings={"modelLockout": {"enabled": True}})
    up.fake.by_model("gone", Reply("error", status=404))
    client = anthropic_client(proxy)
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="claude/gone", max_tokens=64, messages=USER)
    assert caught.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert [(x["connectionId"], x["model"]) for x in proxy.lockouts()] == [("key-a", "gone")]
    assert client.messages.create(model="claude/sonnet", max_tokens=64, messages=USER).content
    assert proxy.connection("key-a")["status"] == "active"
    assert proxy.breaker("claude")["failureCount"] == 0


def test_a_messages_model_on_a_chat_only_provider_is_not_found(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    proxy = launch(provider("plain", "local", up.url, "plain-1"))
    with pytest.raises(anthropic.NotFoundError) as caught:
        anthropic_client(proxy).messages.create(model="plain/m1", max_tokens=64, messages=USER)
    body: Any = caught.value.body
    assert body["type"] == "error"
    assert body["error"]["type"] == "not_found_error"
    assert "does not speak messages" in body["error"]["message"]
    assert "messages API" in body["error"]["message"]
    assert up.fake.requests == []


def test_a_combo_skips_the_targets_that_do_not_speak_the_api(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    plain, claude_up = upstreams("plain-up"), upstreams("claude-up")
    proxy = launch(
        provider("plain", "local", plain.url, "plain-1")
        + claude("claude", claude_up.url, "claude-1")
        + combo("coding", "plain/m1", "claude/sonnet")
    )
    message = anthropic_client(proxy).messages.create(model="coding", max_tokens=64, messages=USER)
    assert message.content[0].text == "hello from claude-up"
    assert plain.fake.requests == []
    # The same combo still serves chat from its chat target (the Anthropic one does not speak chat).
    chat = proxy.chat("coding")
    assert chat.status_code == 200
    assert chat.headers["x-omniroute-provider"] == "plain"


def test_the_proxys_own_errors_on_messages_are_in_anthropics_shape(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("claude-up")
    proxy = launch(claude("claude", up.url, "key-a"))
    up.fake.script(Reply("error", status=400))
    answer = proxy.http.post(
        MESSAGES_PATH, json={"model": "claude/sonnet", "max_tokens": 8, "messages": USER}
    )
    assert answer.status_code == 400  # the upstream's own answer, relayed as it came
    assert answer.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "claude-up: 400 Bad Request"},
    }
    # A client that sends no anthropic-version gets the one the API needs.
    assert up.calls(MESSAGES_PATH)[0].headers["anthropic-version"] == "2023-06-01"
    up.fake.script(Reply("error", status=503))
    cooling = proxy.http.post(
        MESSAGES_PATH, json={"model": "claude/sonnet", "max_tokens": 8, "messages": USER}
    )
    assert cooling.status_code == 429  # the proxy's own: the only key is cooling after its 503
    assert cooling.headers["retry-after"].isdigit()
    assert cooling.json()["type"] == "error"
    assert cooling.json()["error"]["type"] == "rate_limit_error"
    bad = proxy.http.post(MESSAGES_PATH, content=b"{", headers={"content-type": "application/json"})
    assert bad.status_code == 400
    assert bad.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": bad.json()["error"]["message"]},
    }


def test_api_keys_accept_x_api_key_and_refuse_in_anthropics_shape(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("claude-up")
    proxy = launch('[server]\napi_keys = ["sk-local-claude"]\n\n' + claude("claude", up.url, "key-a"))
    good = opened(anthropic.Anthropic(base_url=proxy.url, api_key="sk-local-claude", max_retries=0))
    assert good.messages.create(model="claude/sonnet", max_tokens=8, messages=USER).content
    assert up.calls(MESSAGES_PATH)[0].headers["x-api-key"] == "key-key-a"
    with pytest.raises(anthropic.AuthenticationError) as caught:
        anthropic_client(proxy).messages.create(model="claude/sonnet", max_tokens=8, messages=USER)
    assert caught.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


# ---------------------------------------------------------------------------------------------
# Responses


def test_responses_create_streamed_and_not_and_retrieve_with_the_openai_sdk(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    first, second = upstreams("first-up"), upstreams("second-up")
    proxy = launch(codex("one", first.url, "one-1") + codex("two", second.url, "two-1"))
    client = openai_client(proxy)

    created = client.responses.create(model="two/gpt-5", input="hi")
    assert created.output_text == "hello from second-up"
    assert created.usage is not None and created.usage.output_tokens == 4

    second.fake.by_model("streamed", Reply("stream", chunks=3, chunk_text="ok"))
    events = list(client.responses.create(model="two/streamed", input="hi", stream=True))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == "okokok"
    completed = events[-1]
    assert completed.type == "response.completed"

    # Follow-ups go to the connection that created the response, streamed or not.
    for ident in (created.id, completed.response.id):
        again = client.responses.retrieve(ident)
        assert again.id == ident
    cancelled = proxy.http.post(f"/v1/responses/{created.id}/cancel")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    assert proxy.http.delete(f"/v1/responses/{created.id}").json()["deleted"] is True
    assert first.fake.requests == []
    assert second.calls(f"/v1/responses/{created.id}")[0].headers["authorization"] == "Bearer key-two-1"

    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_never_made")


def test_the_response_memory_survives_a_restart(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("codex-up")
    proxy = launch(codex("codex", up.url, "codex-1"))
    ident = openai_client(proxy).responses.create(model="codex/gpt-5", input="hi").id
    proxy.stop()
    proxy.start()
    assert openai_client(proxy).responses.retrieve(ident).id == ident


def test_a_follow_up_does_not_use_a_connection_taken_out_of_service(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """Found by an adversarial trial: with its connection disabled (chat on it answered 503), the
    follow-up routes still sent its key upstream. Until it is back in service they answer 503."""
    up = upstreams("codex-up")
    proxy = launch(codex("codex", up.url, "codex-1"))
    ident = openai_client(proxy).responses.create(model="codex/gpt-5", input="hi").id
    assert proxy.http.put("/api/providers/codex-1", json={"isActive": False}).status_code == 200
    sent = len(up.fake.requests)
    for method, path in (("GET", ""), ("DELETE", ""), ("POST", "/cancel")):
        answer = proxy.http.request(method, f"/v1/responses/{ident}{path}")
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "all_targets_unavailable"
        assert "disabled by the operator" in answer.json()["error"]["message"]
    assert len(up.fake.requests) == sent  # nothing went upstream
    assert proxy.http.put("/api/providers/codex-1", json={"isActive": True}).status_code == 200
    assert proxy.http.get(f"/v1/responses/{ident}").status_code == 200


def test_the_response_memory_forgets_after_a_day(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    clock = FakeClock()
    up = upstreams("codex-up")
    proxy = launch(codex("codex", up.url, "codex-1"), clock=clock)
    ident = openai_client(proxy).responses.create(model="codex/gpt-5", input="hi").id
    clock.advance(24 * 3600 * 1000 - 1)
    assert proxy.http.get(f"/v1/responses/{ident}").status_code == 200
    clock.advance(1)
    gone = proxy.http.get(f"/v1/responses/{ident}")
    assert gone.status_code == 404
    assert gone.json()["error"]["code"] == "response_not_found"


def test_a_responses_error_event_before_content_falls_back_and_after_it_ends_the_stream(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("codex-up")
    proxy = launch(codex("codex", up.url, "key-a", "key-b"))
    client = openai_client(proxy)
    up.fake.script(Reply("stream_error", status=503, die_after=0), Reply("stream", chunks=2, chunk_text="ok"))
    events = list(client.responses.create(model="codex/gpt-5", input="hi", stream=True))
    assert events[-1].type == "response.completed"
    assert proxy.connection("key-a")["status"] == "cooling"

    up.fake.script(Reply("stream_error", status=503, die_after=2, chunk_text="par"))
    events = list(client.responses.create(model="codex/gpt-5", input="hi", stream=True))
    assert [e.type for e in events][-1] == "error"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "parpar"


def test_a_streams_broken_connection_ends_with_the_apis_error_event(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("claude-up")
    proxy = launch(claude("claude", up.url, "key-a"))
    up.fake.script(Reply("stream_die", die_after=2))
    with proxy.http.stream(
        "POST", MESSAGES_PATH, json={"model": "claude/x", "max_tokens": 8, "messages": USER, "stream": True}
    ) as answer:
        body = b"".join(answer.iter_bytes())
    assert body.rstrip().split(b"\n\n")[-1].startswith(b"event: error\ndata: ")
    assert b"[DONE]" not in body  # OpenAI's sentinel has no place in an Anthropic stream
    assert b"stream_interrupted" in body


def test_chat_routes_reach_only_providers_that_speak_chat(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("claude-up")
    proxy = launch(claude("claude", up.url, "key-a"))
    answer = proxy.chat("claude/sonnet")
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "model_not_found"
    assert "does not speak chat" in answer.json()["error"]["message"]
    assert up.fake.requests == []


def test_count_tokens_counts_against_no_layer(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("claude-up")
    proxy = launch(claude("claude", up.url, "key-a"))
    up.fake.default(Reply("error", status=529))
    with pytest.raises(anthropic.APIStatusError) as caught:
        anthropic_client(proxy).messages.count_tokens(model="claude/sonnet", messages=USER)
    assert caught.value.status_code == 529
    assert len(up.calls("/v1/messages/count_tokens")) == 1  # one attempt, no fallback
    assert proxy.connection("key-a")["status"] == "active"
    assert proxy.breaker("claude")["failureCount"] == 0


def test_count_tokens_refuses_a_model_name_no_model_has(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("claude-up")
    proxy = launch(claude("claude", up.url, "key-a"))
    with pytest.raises(anthropic.BadRequestError) as caught:
        anthropic_client(proxy).messages.count_tokens(model="claude/" + "s" * 1_000_000, messages=USER)
    assert "longer than 256 characters" in str(caught.value)
    assert up.fake.requests == []


def test_count_tokens_honours_a_pinned_connection_as_messages_does(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """`X-OmniRoute-Connection` means that connection only, on every route: count_tokens served a
    pin to a cooling key from another key, and a pin to an unknown connection from any."""
    up = upstreams("claude-up")
    proxy = launch(claude("claude", up.url, "key-a", "key-b"))
    client = anthropic_client(proxy)
    counted = client.messages.count_tokens(
        model="claude/sonnet", messages=USER, extra_headers={"X-OmniRoute-Connection": "key-b"}
    )
    assert counted.input_tokens > 0
    assert up.calls("/v1/messages/count_tokens")[-1].headers["x-api-key"] == "key-key-b"
    with pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.count_tokens(
            model="claude/sonnet", messages=USER, extra_headers={"X-OmniRoute-Connection": "nope"}
        )
    assert "connection 'nope' is unknown" in str(unknown.value)
    up.fake.script(Reply("error", status=429, headers={"retry-after": "40"}))
    with pytest.raises(anthropic.RateLimitError):
        client.messages.create(
            model="claude/sonnet",
            max_tokens=8,
            messages=USER,
            extra_headers={"X-OmniRoute-Connection": "key-a"},
        )
    with pytest.raises(anthropic.RateLimitError) as cooling:
        client.messages.count_tokens(
            model="claude/sonnet", messages=USER, extra_headers={"X-OmniRoute-Connection": "key-a"}
        )
    assert int(cooling.value.response.headers["retry-after"]) >= 39
    assert len(up.calls("/v1/messages/count_tokens")) == 1  # key-b was not asked in key-a's place


def test_count_tokens_with_nothing_eligible_answers_as_messages_does(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """The same status and Retry-After as `/v1/messages` (429 while a key cools, with its hint), not
    a 503 with none that the SDK retries at once."""
    up = upstreams("claude-up")
    proxy = launch(claude("claude", up.url, "key-a"))
    client = anthropic_client(proxy)
    up.fake.script(Reply("error", status=429, headers={"retry-after": "40"}))
    with pytest.raises(anthropic.RateLimitError):
        client.messages.create(model="claude/sonnet", max_tokens=8, messages=USER)
    with pytest.raises(anthropic.RateLimitError) as messages:
        client.messages.create(model="claude/sonnet", max_tokens=8, messages=USER)
    with pytest.raises(anthropic.RateLimitError) as counting:
        client.messages.count_tokens(model="claude/sonnet", messages=USER)
    for refused in (messages.value, counting.value):
        assert int(refused.response.headers["retry-after"]) >= 39
        assert refused.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert "key-a: cooling after 429 rate_limited" in str(counting.value)
    assert up.calls("/v1/messages/count_tokens") == []


# ---------------------------------------------------------------------------------------------
# The whole program


def test_both_sdks_through_a_real_omniroute_serve(tmp_path: Path, upstreams: Callable[..., Upstream]) -> None:
    """`omniroute serve` as a process, as Claude Code and Codex CLI would meet it."""
    claude_up, codex_up = upstreams("claude-up"), upstreams("codex-up")
    claude_up.fake.by_model("streamed", Reply("stream", chunks=2, chunk_text="ok"))
    codex_up.fake.by_model("streamed", Reply("stream", chunks=2, chunk_text="ok"))
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(
        f"[server]\nport = {port}\n\n"
        + claude("claude", claude_up.url, "claude-1")
        + codex("codex", codex_up.url, "codex-1")
        + combo("coding", "codex/gpt-5", "claude/sonnet")
    )
    config.chmod(0o600)
    log = tmp_path / "serve.log"
    command = [*OMNIROUTE, "serve", "--config", str(config), "--state", str(tmp_path / "state.db")]
    with open(log, "w") as stderr:
        proc = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=stderr, text=True, env=environment()
        )
    try:
        wait_until_serving(proc, port, log)
        url = f"http://127.0.0.1:{port}"
        ant = opened(anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0))
        # A combo: the Messages request skips the target that does not speak messages.
        assert ant.messages.create(model="coding", max_tokens=8, messages=USER).content[0].text == (
            "hello from claude-up"
        )
        with ant.messages.stream(model="claude/streamed", max_tokens=8, messages=USER) as stream:
            assert "".join(stream.text_stream) == "okok"
        assert ant.messages.count_tokens(model="claude/sonnet", messages=USER).input_tokens == 7

        oai = opened(openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0))
        created = oai.responses.create(model="coding", input="hi")
        assert created.output_text == "hello from codex-up"
        events = list(oai.responses.create(model="codex/streamed", input="hi", stream=True))
        assert events[-1].type == "response.completed"
        assert oai.responses.retrieve(created.id).id == created.id
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0, log.read_text()


def test_bad_input_on_the_new_routes_gets_a_clear_4xx_and_reaches_no_upstream(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("claude-up")
    proxy = launch(claude("claude", up.url, "key-a") + codex("codex", up.url, "codex-1"))
    count = "/v1/messages/count_tokens"
    for body, status, kind in (
        (b"{", 400, "invalid_request_error"),
        (b"[]", 400, "invalid_request_error"),
        (b'{"messages": []}', 400, "invalid_request_error"),
        (b'{"model": "nope/x"}', 404, "not_found_error"),
        (b'{"model": "codex/gpt-5"}', 404, "not_found_error"),  # codex does not speak messages
    ):
        answer = proxy.http.post(count, content=body, headers={"content-type": "application/json"})
        assert answer.status_code == status, body
        assert answer.json()["type"] == "error"
        assert answer.json()["error"]["type"] == kind, body
    for ident in ("resp_unknown", "x" * 300, "a%2Fb", "%00"):
        for method, path in (("GET", f"/v1/responses/{ident}"), ("DELETE", f"/v1/responses/{ident}")):
            answer = proxy.http.request(method, path)
            assert answer.status_code == 404, (method, ident)
            assert answer.json()["error"]["code"] in ("response_not_found", "not_found")
        cancel = proxy.http.post(f"/v1/responses/{ident}/cancel")
        assert cancel.status_code == 404
    # Only the model lists were asked (for the bare name "nope/x"), with the provider's own auth.
    assert {r.path for r in up.fake.requests} <= {"/v1/models"}


QUIET_MID_EVENT = Reply("drip", drip_bytes=50, delay_ms=2000)
"""An upstream that sends 50 bytes of its first event, then nothing past the idle timeout."""


def test_a_stream_that_breaks_off_mid_event_reaches_the_openai_sdk_as_an_api_error(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """The proxy's closing event used to be glued to the half event the upstream left, which the
    SDK could not parse (a JSONDecodeError); it now gets the event whole, as its own APIError."""
    up = upstreams("up")
    proxy = launch("[server]\nidle_timeout_ms = 300\n\n" + provider("loc", "local", up.url, "loc-1"))
    up.fake.default(QUIET_MID_EVENT)
    stream = openai_client(proxy).chat.completions.create(model="loc/m1", messages=USER, stream=True)  # type: ignore[arg-type]
    with pytest.raises(openai.APIError, match="the upstream stream broke off"):
        list(stream)


def test_a_messages_stream_that_breaks_off_mid_event_reaches_the_anthropic_sdk_as_its_error(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("claude-up")
    proxy = launch("[server]\nidle_timeout_ms = 300\n\n" + claude("claude", up.url, "key-a"))
    # Its first content delta whole (the stream is the client's from there), then half an event.
    up.fake.default(Reply("drip", drip_bytes=560, delay_ms=2000))
    client = anthropic_client(proxy)
    with (
        pytest.raises(anthropic.APIStatusError, match="the upstream stream broke off"),
        client.messages.stream(model="claude/x", max_tokens=8, messages=USER) as stream,  # type: ignore[arg-type]
    ):
        list(stream)
