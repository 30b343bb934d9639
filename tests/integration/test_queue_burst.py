"""Request-queue limits hold exactly under a burst, and the queue never leaks places."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx

from proxy.resilience.clock import FakeClock
from tests.fakes import Reply
from tests.integration.test_proxy import CHAT_PATH, Proxy, Upstream, chat, provider, until


def test_requests_per_minute_hold_exactly_under_a_burst_with_clients_leaving(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    clock = FakeClock()
    proxy = launch(
        provider("key", "apikey", up.url, "key-1"),
        settings={"requestQueue": {"requestsPerMinute": 2, "minTimeBetweenRequestsMs": 0}},
        clock=clock,
    )
    limiter_of = lambda: proxy.rt.engine.connections["key-1"].limiter  # noqa: E731

    async def scenario() -> list[int]:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30.0) as client:
            sent = [asyncio.create_task(client.post(CHAT_PATH, json=chat("key/m1"))) for _ in range(7)]
            await until(
                lambda: len(up.calls()) == 2 and limiter_of().queued == 5, what="two sent, five queued"
            )
            await asyncio.sleep(0.1)
            assert len(up.calls()) == 2
            sent[-1].cancel()  # one queued client leaves
            sent[-2].cancel()
            await until(lambda: limiter_of().queued == 3, what="the two to leave the queue")
            clock.advance(59_999)
            await asyncio.sleep(0.1)
            assert len(up.calls()) == 2
            clock.advance(1)
            await until(lambda: len(up.calls()) == 4, what="two more a minute later")
            await asyncio.sleep(0.1)
            assert len(up.calls()) == 4
            clock.advance(60_000)
            await until(lambda: len(up.calls()) == 5, what="the last one")
            done = await asyncio.gather(*sent[:5])
            return [r.status_code for r in done]

    assert asyncio.run(scenario()) == [200] * 5
    assert len(up.calls()) == 5
    proxy.settled()


def test_max_queue_depth_holds_exactly_under_a_burst(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    up.fake.default(Reply("slow_headers", delay_ms=400))
    proxy = launch(
        provider("key", "apikey", up.url, "key-1"),
        settings={"requestQueue": {"concurrentRequests": 1, "maxQueueDepth": 2}},
    )

    async def scenario() -> list[int]:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30.0) as client:
            sent = [asyncio.create_task(client.post(CHAT_PATH, json=chat("key/m1"))) for _ in range(20)]
            return sorted(r.status_code for r in await asyncio.gather(*sent))

    statuses = asyncio.run(scenario())
    assert statuses == [200] * 3 + [429] * 17
    assert len(up.calls()) == 3
    proxy.settled()
