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

from tests.fakes import Reply
from tests.integration.test_apis import claude
from tests.integration.test_proxy import Proxy, Upstream

WATCHDOG = {"enabled": True, "warmupMs": 0, "windowMs": 1000, "minUsefulBytesPerSecond": 4}


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
