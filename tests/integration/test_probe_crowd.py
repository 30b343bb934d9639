"""HALF_OPEN under a crowd whose clients vanish at random: never more than one probe upstream, and
never a breaker stuck with its probe slot taken once every request has ended."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import httpx
import pytest

from proxy.resilience.breaker import BreakerState
from proxy.resilience.clock import FakeClock
from tests.fakes import Reply
from tests.integration.test_proxy import CHAT_PATH, Proxy, Upstream, chat, provider, wait_until


@pytest.mark.parametrize("seed", range(3))
def test_a_crowd_at_half_open_sends_one_probe_and_leaves_the_slot_free(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], seed: int
) -> None:
    rng = random.Random(seed)
    up = upstreams()
    clock = FakeClock()
    proxy = launch(
        provider("loc", "local", up.url, "loc-1", extra="per_model_quota = false"),
        settings={"connectionCooldown": {"local": {"baseCooldownMs": 0}}},
        clock=clock,
    )
    breaker = proxy.rt.engine.providers["loc"].breaker
    up.fake.by_model("bad", Reply("error", status=503))
    for _ in range(2):
        assert proxy.chat("loc/bad").status_code == 503
    for round_ in range(6):
        clock.advance(300_000)  # past any reset timeout: HALF_OPEN
        assert breaker.state(clock.now()) is BreakerState.HALF_OPEN
        kinds = ["slow_ok", "slow_bad", "hang"]
        up.fake.by_model(
            "m1",
            {
                "slow_ok": Reply("slow_headers", delay_ms=150),
                "slow_bad": Reply("slow_headers", status=503, delay_ms=150),
                "hang": Reply("hang"),
            }[rng.choice(kinds)],
        )

        async def scenario() -> None:
            async with httpx.AsyncClient(
                base_url=proxy.url, timeout=30.0, limits=httpx.Limits(max_connections=200)
            ) as client:

                async def one() -> None:
                    cancel = rng.choice([None, rng.uniform(0, 0.3)])
                    stream = rng.random() < 0.3
                    try:
                        async with asyncio.timeout(cancel if cancel is not None else 1.0):
                            await client.post(CHAT_PATH, json=chat("loc/m1", stream=stream))
                    except TimeoutError:
                        pass

                await asyncio.gather(*(one() for _ in range(100)))

        asyncio.run(scenario())
        wait_until(
            lambda: up.fake.in_flight == 0,
            what="idle",
        )
        assert up.fake.max_in_flight <= 1, f"round {round_}: {up.fake.max_in_flight} probes upstream at once"
        proxy.settled()
        state = breaker.state(clock.now())
        if state is BreakerState.HALF_OPEN:
            assert breaker.can_execute(clock.now()), f"round {round_}: HALF_OPEN with its probe slot taken"
        if state is BreakerState.CLOSED:
            up.fake.by_model("m1", Reply("error", status=503))
            for _ in range(2):
                proxy.chat("loc/m1")
        assert breaker.state(clock.now()) in (BreakerState.OPEN, BreakerState.HALF_OPEN)
        up.fake.max_in_flight = 0
