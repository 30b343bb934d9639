"""Resolving a bare model name asks each upstream for its model list at most once at a time, and
never asks a provider whose breaker is OPEN (issue #9, item 11).

A bare model (`m1`, no provider prefix, no combo) is looked up in every provider's `/v1/models`.
Without single-flight, 20 requests that arrive while the list is being fetched fetch it 20 times;
without the breaker check, an OPEN provider (one we stopped sending traffic to) is still asked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx

from proxy.resilience.breaker import BreakerState
from tests.fakes import FakeUpstream
from tests.integration.conftest import Instance

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
MINUTE_MS = 60_000


def models_calls(fake: FakeUpstream) -> int:
    return sum(1 for r in fake.requests if r.path == "/v1/models")


async def _bare_model_requests(url: str, count: int, model: str = "m1") -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
        return await asyncio.gather(
            *(client.post("/v1/chat/completions", json={"model": model, **CHAT}) for _ in range(count))
        )


def open_breaker(proxy: Instance, provider: str) -> None:
    # No cooldown-aware waiting: the engine runs on a FakeClock, so a wait for the circuit would be
    # spent in real time; the answer must come at once.
    disable_wait = {"comboCooldownWait": {"enabled": False}}
    assert proxy.send("PATCH", "/api/resilience", disable_wait).status_code == 200
    breaker = proxy.engine.providers[provider].breaker
    now = proxy.clock.now()
    while breaker.state(now) is not BreakerState.OPEN:
        breaker.record_failure(now)


def test_twenty_concurrent_bare_model_requests_fetch_the_list_once(
    upstream: tuple[FakeUpstream, str], make_instance: Callable[..., Instance]
) -> None:
    fake, url = upstream
    fake.models_delay_ms = 300  # every request arrives while the first fetch is still in flight
    proxy = make_instance(alpha_url=url)
    assert proxy.server is not None

    responses = asyncio.run(_bare_model_requests(proxy.server.url, 20))

    assert [r.status_code for r in responses] == [200] * 20
    assert models_calls(fake) == 1
    # Within the TTL the cached list serves, after it one fetch refreshes it for everyone.
    asyncio.run(_bare_model_requests(proxy.server.url, 5))
    assert models_calls(fake) == 1
    proxy.clock.advance(MINUTE_MS + 1)
    responses = asyncio.run(_bare_model_requests(proxy.server.url, 20))
    assert [r.status_code for r in responses] == [200] * 20
    assert models_calls(fake) == 2


def test_an_open_provider_is_not_asked_for_its_models(
    upstream: tuple[FakeUpstream, str], make_instance: Callable[..., Instance]
) -> None:
    fake, url = upstream
    proxy = make_instance(alpha_url=url)
    open_breaker(proxy, "alpha")

    response = proxy.send("POST", "/v1/chat/completions", {"model": "m1", **CHAT})

    assert response.status_code == 404  # nobody else lists m1 and there is no default combo
    assert models_calls(fake) == 0
    assert [r.path for r in fake.requests] == []


def test_an_open_provider_keeps_its_last_known_list_and_is_not_asked_again(
    upstream: tuple[FakeUpstream, str], make_instance: Callable[..., Instance]
) -> None:
    """The model still lives there: the client gets the circuit's 503 with Retry-After, not a 404."""
    fake, url = upstream
    proxy = make_instance(alpha_url=url)
    assert proxy.send("POST", "/v1/chat/completions", {"model": "m1", **CHAT}).status_code == 200
    assert models_calls(fake) == 1
    proxy.clock.advance(MINUTE_MS + 1)  # the cached list is stale
    open_breaker(proxy, "alpha")

    response = proxy.send("POST", "/v1/chat/completions", {"model": "m1", **CHAT})

    assert response.status_code == 503
    assert response.json()["error"]["code"] == "provider_circuit_open"
    assert models_calls(fake) == 1
