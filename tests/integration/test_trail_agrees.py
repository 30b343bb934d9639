"""The request trail and the statistics agree with what each client saw, under overlap and faults."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.integration.test_chaos_mix import BEHAVIOURS, launch_mix
from tests.integration.test_proxy import CHAT_PATH, Proxy, Upstream, chat, wait_until

QUICK = {k: v for k, v in BEHAVIOURS.items() if k not in ("hang", "pings")}


async def one(client: httpx.AsyncClient, rng: random.Random, seen: list[dict[str, Any]]) -> None:
    model = rng.choice(list(QUICK))
    target = rng.choice(["key/", "loc/", "mix-"]) + model
    stream = rng.random() < 0.5
    if stream:
        async with client.stream("POST", CHAT_PATH, json=chat(target, stream=True)) as r:
            body = b""
            async for chunk in r.aiter_bytes():
                body += chunk
        text = body.decode()
    else:
        r = await client.post(CHAT_PATH, json=chat(target))
        text = r.text
    code = None
    if r.status_code >= 400:
        code = json.loads(text)["error"].get("code")
    elif stream:
        for line in text.splitlines():
            if line.startswith("data:") and '"error"' in line:
                code = json.loads(line[5:])["error"]["code"]
    seen.append(
        {
            "id": r.headers["x-request-id"],
            "status": r.status_code,
            "code": code,
            "stream": stream,
            "target": target,
        }
    )


@pytest.mark.parametrize("seed", range(2))
def test_the_trail_says_what_each_client_saw(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], seed: int
) -> None:
    proxy, _, _ = launch_mix(launch, upstreams, QUICK)
    rng = random.Random(seed)
    seen: list[dict[str, Any]] = []

    async def scenario() -> None:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30.0, limits=limits) as client:
            for _ in range(3):
                await asyncio.gather(*(one(client, rng, seen) for _ in range(50)))

    asyncio.run(scenario())
    wait_until(lambda: proxy.rt.engine.stats.in_flight == 0, what="every request to end")
    mismatches = []
    for s in seen:
        rec = proxy.http.get(f"/api/requests/{s['id']}").json()["request"]
        expected_state = "done" if s["status"] < 400 and s["code"] is None else "failed"
        got = (rec["status"], rec["code"], rec["state"])
        want = (s["status"], s["code"], expected_state)
        if got != want:
            mismatches.append((s, got, want))
    assert mismatches == [], mismatches[:5]
    health = proxy.http.get("/api/monitoring/health").json()["requests"]
    ok = sum(1 for s in seen if s["status"] < 400 and s["code"] is None)
    assert (health["total"], health["ok"], health["failed"]) == (len(seen), ok, len(seen) - ok), health
