"""The throughput watchdog on the Messages API (docs/resilience.md#streams-and-the-throughput-watchdog):
a Messages stream that sends nothing but pings is aborted like a chat stream of pings
(tests/integration/test_proxy.py), not held open for as long as the upstream keeps pinging. Before
the first content the stream is held back (the gate, so that an error event still falls back); the
watchdog must judge that wait too.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from tests.fakes import Reply
from tests.integration.test_apis import claude
from tests.integration.test_proxy import Proxy, Upstream, provider

WATCHDOG = {"enabled": True, "warmupMs": 0, "windowMs": 1000, "minUsefulBytesPerSecond": 4}
SILENCE = {"enabled": True, "warmupMs": 1000, "windowMs": 2000, "minUsefulBytesPerSecond": 10}


def test_a_messages_stream_of_pings_is_aborted_by_the_throughput_watchdog(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams("claude-up")
    up.fake.default(Reply("stream_pings", delay_ms=100))
    proxy = launch(
        claude("claude", up.url, "key-a"), settings={"streamRecovery": {"throughputWatchdog": WATCHDOG}}
    )
    body = {
        "model": "claude/m1",
        "max_tokens": 5,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    started = time.monotonic()
    try:
        response = proxy.http.post("/v1/messages", json=body, timeout=15)
    except httpx.ReadTimeout:
        raise AssertionError(
            f"no answer after {time.monotonic() - started:.0f} s: a stream of pings is never judged"
        ) from None
    elapsed = time.monotonic() - started
    assert elapsed < 10, elapsed
    assert response.status_code in (200, 429, 502, 503), response.text
    assert proxy.connection("key-a")["lastErrorType"] == "stall"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_a_stream_gone_silent_is_cut_when_the_watchdog_judges_it_not_when_its_upstream_speaks(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], path: str
) -> None:
    """The watchdog judged a stream only as its chunks arrived: one chunk, then 9 s of silence, was
    cut at 9 s (warm-up and window: 3 s), and a stream silent for good ran into the idle timeout
    (120 s), cut as `stream_interrupted` (found by a trial)."""
    up = upstreams("one")
    up.fake.default(Reply("stream", chunks=2, delay_ms=9_000))  # one chunk at once, the next 9 s later
    proxy = launch(
        provider("one", "local", up.url, "one-1", extra='apis = ["chat", "messages"]'),
        settings={"streamRecovery": {"throughputWatchdog": SILENCE}},
    )
    body: dict[str, object] = {
        "model": "one/m1",
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    if path == "/v1/messages":
        body["max_tokens"] = 16
    started = time.monotonic()
    response = proxy.http.post(path, json=body)
    took = time.monotonic() - started
    assert response.status_code == 200 and "stream_stalled" in response.text
    assert took < 6.0, f"cut after {took:.1f} s"
    if path == "/v1/chat/completions":
        assert response.text.rstrip().endswith("data: [DONE]")
    proxy.settled()
