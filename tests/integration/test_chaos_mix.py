"""Randomized chaos on the three APIs: overlapping requests through combos, slots and request queues,
clients that vanish at random moments, upstreams that fail in every way. Afterwards nothing may be
left behind: no slot, no queue place, no request in flight, and the counts agree (found holding by
an overlap trial; one seed here, the trial ran three)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.fakes import Reply
from tests.integration.test_proxy import CHAT_PATH, Proxy, Upstream, chat, wait_until

BEHAVIOURS: dict[str, Reply] = {
    "ok": Reply("json"),
    "slow": Reply("slow_headers", delay_ms=150),
    "hang": Reply("hang"),
    "s503": Reply("error", status=503),
    "s429": Reply("error", status=429, headers={"retry-after-ms": "80"}),
    "s404": Reply("error", status=404),
    "stream": Reply("stream", chunks=6, delay_ms=30),
    "die": Reply("stream_die", chunks=6, delay_ms=20, die_after=2),
    "reset": Reply("reset"),
    "rah": Reply("reset_after_headers"),
    "bad": Reply("invalid_json"),
    "drip": Reply("drip", delay_ms=5, drip_bytes=40),
    "pings": Reply("stream_pings", delay_ms=50),
}


def config(a: str, b: str) -> str:
    combos = "".join(
        f'[combos.mix-{m}]\nstrategy = "priority"\ntargets = ["key/{m}", "loc/{m}"]\n\n' for m in BEHAVIOURS
    )
    return (
        combos
        + f"""
[server]
first_byte_timeout_ms = 1500
idle_timeout_ms = 1500

[providers.key]
class = "apikey"
base_url = "{a}"
apis = ["chat", "messages", "responses"]

[[providers.key.connections]]
id = "key-a"
api_key = "key-key-a"
max_concurrent = 2
priority = 1

[[providers.key.connections]]
id = "key-b"
api_key = "key-key-b"
max_concurrent = 1
priority = 2

[providers.loc]
class = "local"
base_url = "{b}"
apis = ["chat", "messages", "responses"]

[[providers.loc.connections]]
id = "loc-1"
api_key = "key-loc-1"
max_concurrent = 1
"""
    )


SETTINGS: dict[str, Any] = {
    "requestQueue": {
        "minTimeBetweenRequestsMs": 0,
        "concurrentRequests": 2,
        "maxQueueDepth": 4,
        "maxWaitMs": 1000,
    },
    "connectionCooldown": {
        "apikey": {"baseCooldownMs": 60, "maxBackoffSteps": 2},
        "local": {"baseCooldownMs": 60, "maxBackoffSteps": 2},
    },
    "providerBreaker": {"local": {"resetTimeoutMs": 1000}},
    "comboCooldownWait": {"enabled": True, "maxWaitMs": 400, "maxAttempts": 3, "budgetMs": 800},
    "quotaShareConcurrencyLimit": {"queueDepth": 3, "queueTimeoutMs": 300},
}


async def one_client(client: httpx.AsyncClient, rng: random.Random, seen: list[str]) -> None:
    model = rng.choice(list(BEHAVIOURS))
    target = rng.choice(["key", "loc"]) + "/" + model
    if rng.random() < 0.25:
        target = "mix-" + model
    stream = rng.random() < 0.5
    cancel_after = rng.choice([None, None, rng.uniform(0.0, 0.05), rng.uniform(0.0, 0.6)])
    headers = {}
    if rng.random() < 0.2:
        headers["X-OmniRoute-Connection"] = (
            rng.choice(["key-a", "key-b"]) if not target.startswith("loc") else "loc-1"
        )

    api = rng.choice(["chat", "chat", "messages", "responses"])
    path, body = {
        "chat": (CHAT_PATH, chat(target)),
        "messages": (
            "/v1/messages",
            {"model": target, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        ),
        "responses": ("/v1/responses", {"model": target, "input": "hi"}),
    }[api]

    async def run() -> None:
        if stream:
            async with client.stream("POST", path, json={**body, "stream": True}, headers=headers) as r:
                async for _ in r.aiter_bytes():
                    await asyncio.sleep(rng.choice([0, 0, 0.01]))
                seen.append(f"{r.status_code}")
        else:
            r = await client.post(path, json=body, headers=headers)
            seen.append(f"{r.status_code}")

    try:
        if cancel_after is None:
            await asyncio.wait_for(run(), 20)
        else:
            await asyncio.wait_for(run(), cancel_after)
    except TimeoutError:
        seen.append("cancelled")
    except httpx.HTTPError as exc:
        seen.append(type(exc).__name__)


def idle_report(proxy: Proxy) -> dict[str, Any]:
    engine = proxy.rt.engine
    return {
        "stats_in_flight": engine.stats.in_flight,
        "waiting": proxy.rt.pipeline.waiting if hasattr(proxy.rt, "pipeline") else None,
        "conns": {
            c.id: (
                c.in_flight,
                c.limiter.running if c.limiter else None,
                c.limiter.queued if c.limiter else None,
                c.semaphore.in_use if c.semaphore else None,
                c.semaphore.waiting if c.semaphore else None,
            )
            for c in engine.connections.values()
        },
    }


def launch_mix(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], behaviours: dict[str, Reply]
) -> tuple[Proxy, Upstream, Upstream]:
    """The proxy on `config` and `SETTINGS`, its two upstreams answering each model as `behaviours` says."""
    a, b = upstreams("a"), upstreams("b")
    for up in (a, b):
        for name, reply in behaviours.items():
            up.fake.by_model(name, reply)
    return launch(config(a.url, b.url), settings=SETTINGS), a, b


@pytest.mark.parametrize("seed", [1])
def test_chaos_leaves_nothing_behind(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], seed: int
) -> None:
    proxy, a, b = launch_mix(launch, upstreams, BEHAVIOURS)
    rng = random.Random(seed)
    seen: list[str] = []

    async def scenario() -> None:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30.0, limits=limits) as client:
            for _ in range(4):
                await asyncio.gather(*(one_client(client, rng, seen) for _ in range(60)))

    asyncio.run(scenario())
    a.fake.reset()
    b.fake.reset()
    engine = proxy.rt.engine

    def idle() -> bool:
        return engine.stats.in_flight == 0 and all(
            c.in_flight == 0
            and (c.limiter is None or (c.limiter.running == 0 and c.limiter.queued == 0))
            and (c.semaphore is None or (c.semaphore.in_use == 0 and c.semaphore.waiting == 0))
            for c in engine.connections.values()
        )

    try:
        wait_until(idle, timeout=10, what="the proxy to settle")
    except AssertionError:
        raise AssertionError(f"left behind: {idle_report(proxy)}; answers {sorted(set(seen))}") from None
    alive = proxy.http.get("/api/requests?state=alive").json()["requests"]
    assert alive == [], alive
    for conn in proxy.http.get("/api/resilience/connections").json()["connections"]:
        assert (conn["id"], conn["inFlight"], conn.get("queued", 0)) == (conn["id"], 0, 0), conn
    health = proxy.http.get("/api/monitoring/health").json()
    req = health["requests"]
    assert req["inFlight"] == 0
    assert req["total"] == req["ok"] + req["failed"], req
