"""Issue #9, "every promise holds under concurrency": each promise reproduced over real HTTP.

Overlap is the point: requests are in flight together, so most tests drive an `httpx.AsyncClient`
from one event loop while the proxy and the fake upstreams serve on their own threads. The engine
runs on a FakeClock wherever the rule is about engine time (cooldown waits, probe leases, lock
lengths); where the rule is about how long the upstream really takes (the execution deadline), the
clock is the real one and the fake upstream's own delay is the only wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.app import create_app
from proxy.config import load_config
from proxy.resilience.clock import FakeClock
from proxy.runtime import Runtime
from tests.fakes import Reply
from tests.integration import test_proxy as harness
from tests.integration.test_proxy import (
    CHAT_PATH,
    Proxy,
    Upstream,
    chat,
    error_of,
    error_reply,
    provider,
    until,
    wait_until,
)

# The harness's fixtures, under the names the tests ask for.
started = harness.started
upstreams = harness.upstreams
launch = harness.launch

LOCKOUT_ON = {"modelLockout": {"enabled": True}}
GOOGLE_PER_MINUTE = (
    "Quota exceeded for quota metric 'Generate Content API requests per minute' and limit "
    "'GenerateContent request limit per minute for a region' of service "
    "'generativelanguage.googleapis.com' for consumer 'project_number:123'."
)


# ---------------------------------------------------------------------------------------------
# Item 3: a rate quota is not exhausted credits; a model's access is not an expired key


def test_a_per_minute_quota_cools_the_key_and_a_model_access_403_leaves_it_active(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    proxy = launch(provider("key", "apikey", up.url, "key-a", "key-b"))
    up.fake.script(error_reply(429, GOOGLE_PER_MINUTE))
    served = proxy.chat("key/m1")
    assert served.status_code == 200
    assert served.headers["x-omniroute-selected-connection-id"] == "key-b"
    conn = proxy.connection("key-a")
    assert (conn["status"], conn["errorCode"]) == ("cooling", 429)  # not credits_exhausted

    up.fake.script(error_reply(403, "Unauthorized: you do not have access to model m2"))
    served = proxy.pinned("key/m2", "key-b")
    assert served.status_code == 403  # one connection pinned: the upstream's own answer
    assert proxy.connection("key-b")["status"] == "active"  # not expired: the key is fine
    proxy.settled()


# ---------------------------------------------------------------------------------------------
# Item 2: a success that was in flight when a key went terminal does not revive it


def _late_answer_after_expiry(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], late: int
) -> tuple[Proxy, Upstream, tuple[int, int]]:
    """A request pinned to key-a, slow, answers `late` only after a 401 expired key-a meanwhile;
    returns (the proxy, its upstream, (the 401's request's status, the slow one's))."""
    up = upstreams()
    proxy = launch(provider("key", "apikey", up.url, "key-a", "key-b"))
    up.fake.by_model("slow", Reply("slow_headers", status=late, delay_ms=600))
    pin = {"X-OmniRoute-Connection": "key-a"}

    async def scenario() -> tuple[int, int]:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30.0) as client:
            slow = asyncio.create_task(client.post(CHAT_PATH, json=chat("key/slow"), headers=pin))
            await until(lambda: len(up.calls()) == 1, what="the slow request to reach the upstream")
            up.fake.script(error_reply(401, "Incorrect API key provided"))
            expired = await client.post(CHAT_PATH, json=chat("key/m1"), headers=pin)
            assert not slow.done(), f"the {late} must arrive after the 401"
            return expired.status_code, (await slow).status_code

    return proxy, up, asyncio.run(scenario())


def test_a_late_success_does_not_revive_an_expired_key(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    proxy, up, statuses = _late_answer_after_expiry(launch, upstreams, 200)
    assert statuses == (503, 200)
    conn = proxy.connection("key-a")
    assert (conn["status"], conn["errorCode"]) == ("expired", 401)
    assert error_of(proxy.pinned("key/m1", "key-a"), 503)["code"] == "all_targets_unavailable"
    assert len(up.calls()) == 2  # the expired key took no new traffic
    proxy.settled()


# ---------------------------------------------------------------------------------------------
# Item 4: lockouts' anti-thundering-herd rule


def test_ten_concurrent_404s_on_one_triple_give_one_base_length_lock(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    clock = FakeClock()
    proxy = launch(provider("loc", "local", up.url, "loc-1"), settings=LOCKOUT_ON, clock=clock)
    up.fake.by_model("gone", Reply("slow_headers", status=404, delay_ms=300))

    async def scenario() -> list[int]:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30.0) as client:
            sent = [asyncio.create_task(client.post(CHAT_PATH, json=chat("loc/gone"))) for _ in range(10)]
            return [r.status_code for r in await asyncio.gather(*sent)]

    assert asyncio.run(scenario()) == [404] * 10
    assert len(up.calls()) == 10  # all ten were in flight together
    [lock] = proxy.lockouts()
    assert (lock["model"], lock["failureCount"], lock["remainingMs"]) == ("gone", 1, 120_000)
    proxy.settled()


# ---------------------------------------------------------------------------------------------
# Item 6: the semaphore's fail-open is an engine event like any other


def one_slot(pid: str, cls: str, url: str, cid: str, *, max_concurrent: int = 1) -> str:
    """TOML for a provider with one connection that declares `max_concurrent`."""
    return (
        f'[providers.{pid}]\nclass = "{cls}"\nbase_url = "{url}"\n\n'
        f'[[providers.{pid}.connections]]\nid = "{cid}"\napi_key = "key-{cid}"\n'
        f"max_concurrent = {max_concurrent}\n\n"
    )


def test_a_fail_open_shows_in_the_events_with_the_engine_clock(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    clock = FakeClock()
    proxy = launch(
        one_slot("loc", "local", up.url, "loc-1"),
        settings={"quotaShareConcurrencyLimit": {"queueDepth": 0}},  # no waiting: the second goes open
        clock=clock,
    )
    up.fake.by_model("slow", Reply("slow_headers", delay_ms=400))
    since = proxy.rt.bus.last_seq

    async def scenario() -> list[int]:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30.0) as client:
            first = asyncio.create_task(client.post(CHAT_PATH, json=chat("loc/slow")))
            await until(lambda: len(up.calls()) == 1, what="the first request to hold the slot")
            second = await client.post(CHAT_PATH, json=chat("loc/m1"))
            return [second.status_code, (await first).status_code]

    assert asyncio.run(scenario()) == [200, 200]
    assert up.fake.max_in_flight == 2  # fail-open: the second went ahead without a slot
    events = proxy.http.get("/api/events", params={"after": since}).json()["events"]
    opened = [e for e in events if e["to"] == "fail_open"]
    assert [(e["layer"], e["key"], e["from"]) for e in opened] == [("connection", "loc-1", "saturated")]
    assert opened[0]["ts"] == clock.now()  # stamped by the engine's clock, not the wall clock
    proxy.settled()


# ---------------------------------------------------------------------------------------------
# Item 1: waiting for a concurrency slot does not eat the execution deadline


def test_waiting_for_a_slot_does_not_count_against_the_execution_deadline(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    # The real clock: the rule is about how long the upstream really takes. Each answer takes 0.4 s
    # and the deadline is 0.7 s, so the third request (0.8 s behind the first in the slot queue)
    # must still be on time: its deadline starts when it is dispatched, after its slot wait.
    proxy = launch(one_slot("key", "apikey", up.url, "key-1"), settings={"requestQueue": {"maxWaitMs": 700}})
    up.fake.default(Reply("slow_headers", delay_ms=400))

    async def scenario() -> list[int]:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30.0) as client:
            sent = [asyncio.create_task(client.post(CHAT_PATH, json=chat("key/m1"))) for _ in range(3)]
            return [r.status_code for r in await asyncio.gather(*sent)]

    assert asyncio.run(scenario()) == [200, 200, 200]
    assert up.fake.max_in_flight == 1  # the slot held: one at a time
    assert len(up.calls()) == 3
    proxy.settled()


# ---------------------------------------------------------------------------------------------
# Item 8: exactly one probe at a time, and only its own outcome settles it


def test_a_probe_that_streams_longer_than_its_lease_keeps_the_slot(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    clock = FakeClock()
    proxy = launch(
        provider("loc", "local", up.url, "loc-1"),
        settings={"connectionCooldown": {"local": {"baseCooldownMs": 0}}},  # the breaker alone decides
        clock=clock,
    )
    up.fake.default(Reply("error", status=503))
    for _ in range(2):  # local: OPEN at 2 failures, for 15 s
        assert proxy.chat("loc/m1").status_code == 503
    clock.advance(15_000)
    assert proxy.breaker("loc")["state"] == "HALF_OPEN"
    up.fake.default(Reply("stream", chunks=8, delay_ms=100))

    async def scenario() -> tuple[int, str, int]:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30.0) as client:
            probe = client.stream("POST", CHAT_PATH, json=chat("loc/m1", stream=True))
            async with probe as response:
                lines = aiter_data_lines(response)
                # Each relayed chunk is a sign of life: 100 s of engine time between chunks keeps
                # the lease (120 s, the first-byte timeout), however long the whole stream runs.
                for _ in range(3):
                    await anext(lines)
                    clock.advance(100_000)
                await anext(lines)
                second = await client.post(CHAT_PATH, json=chat("loc/m1"))
                rest = [line async for line in lines]
            return second.status_code, rest[-1], len(up.calls())

    rejected, last, calls = asyncio.run(scenario())
    assert rejected == 503  # the probe is still in flight: no second probe
    assert last == "data: [DONE]"
    assert calls == 3  # two 503s and the probe: the second request never reached the upstream
    assert proxy.breaker("loc")["state"] == "CLOSED"  # the probe's own success settled it
    proxy.settled()


@pytest.mark.parametrize(
    ("api", "path", "body"),
    [
        ("messages", "/v1/messages", {"max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}),
        ("responses", "/v1/responses", {"input": "hi"}),
    ],
)
def test_a_messages_or_responses_probe_held_back_before_its_content_keeps_the_slot(
    launch: Callable[..., Proxy],
    upstreams: Callable[..., Upstream],
    api: str,
    path: str,
    body: dict[str, Any],
) -> None:
    """As above, while the stream's opening events are held back until its first content: nothing
    renewed the lease there, and after 120 s of pings a second probe reached the upstream (found
    by a trial)."""
    up = upstreams()
    clock = FakeClock()
    proxy = launch(
        provider("loc", "local", up.url, "loc-1", extra=f'apis = ["{api}"]'),
        settings={"connectionCooldown": {"local": {"baseCooldownMs": 0}}},  # the breaker alone decides
        clock=clock,
    )
    up.fake.default(Reply("error", status=503))
    for _ in range(2):  # local: OPEN at 2 failures, for 15 s
        assert proxy.http.post(path, json={"model": "loc/m1", **body}).status_code == 503
    clock.advance(15_000)
    assert proxy.breaker("loc")["state"] == "HALF_OPEN"
    up.fake.default(Reply("json"))
    up.fake.by_model("m1", Reply("stream_pings", delay_ms=20))  # alive, but no content yet

    async def scenario() -> tuple[int, int]:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30.0) as client:
            probe = asyncio.create_task(client.post(path, json={"model": "loc/m1", "stream": True, **body}))
            await until(lambda: len(up.calls(path)) == 3, what="the probe to reach the upstream")
            for _ in range(3):  # 100 s of engine time between signs of life: the lease is 120 s
                await asyncio.sleep(0.2)  # a few pings (one each 20 ms) reach the proxy
                assert up.fake.in_flight == 1
                clock.advance(100_000)
            second = await client.post(path, json={"model": "loc/m2", **body})
            calls = len(up.calls(path))
            probe.cancel()
            return second.status_code, calls

    status, calls = asyncio.run(scenario())
    assert calls == 3, "a second probe reached the upstream while the first was still streaming"
    assert status == 503  # the probe slot is taken: skipped as if OPEN
    proxy.settled()


def test_a_probe_queued_behind_other_requests_keeps_the_slot(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    clock = FakeClock()
    # Engine time must not pass the slow request's execution deadline (15 s): a 1 s reset timeout
    # and a 5 s probe lease (the first-byte timeout) keep every step well inside it.
    proxy = launch(
        "[server]\nfirst_byte_timeout_ms = 5000\n\n" + provider("key", "apikey", up.url, "key-1"),
        settings={
            "connectionCooldown": {"apikey": {"baseCooldownMs": 0}},
            "providerBreaker": {
                "apikey": {"degradationThreshold": 1, "failureThreshold": 2, "resetTimeoutMs": 1000}
            },
            "requestQueue": {"concurrentRequests": 2},
        },
        clock=clock,
    )
    up.fake.by_model("slow", Reply("slow_headers", delay_ms=1500))
    up.fake.by_model("bad", Reply("error", status=503))

    async def scenario() -> list[int]:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30.0) as client:
            slow = asyncio.create_task(client.post(CHAT_PATH, json=chat("key/slow")))
            await until(lambda: len(up.calls()) == 1, what="the slow request to hold a queue slot")
            for _ in range(2):
                assert (await client.post(CHAT_PATH, json=chat("key/bad"))).status_code == 503
            assert proxy.breaker("key")["state"] == "OPEN"
            patched = await client.patch("/api/resilience", json={"requestQueue": {"concurrentRequests": 1}})
            assert patched.status_code == 200
            clock.advance(1_000)  # HALF_OPEN; the probe will queue behind the slow request
            limiter = proxy.rt.engine.connections["key-1"].limiter
            assert limiter is not None
            probe = asyncio.create_task(client.post(CHAT_PATH, json=chat("key/m1")))
            await until(lambda: limiter.queued == 1, what="the probe to queue")
            clock.advance(6_000)  # longer than the probe's lease: time queued must not count
            second = await client.post(CHAT_PATH, json=chat("key/m1"))
            assert not slow.done()
            return [second.status_code, (await probe).status_code, (await slow).status_code]

    assert asyncio.run(scenario()) == [503, 200, 200]
    assert len(up.calls()) == 4  # slow, two 503s, the probe: never a second probe
    assert proxy.breaker("key")["state"] == "CLOSED"
    proxy.settled()


async def aiter_data_lines(response: httpx.Response) -> AsyncIterator[str]:
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            yield line


# ---------------------------------------------------------------------------------------------
# Item 9: one owner per attempt; every slot comes back on every path


def test_a_client_gone_before_the_first_chunk_leaves_no_slot_behind(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    proxy = launch(one_slot("key", "apikey", up.url, "key-1"))
    up.fake.default(Reply("stream_pings", delay_ms=300))  # the first byte comes after 300 ms
    body = json.dumps(chat("key/m1", stream=True)).encode()
    host, port = proxy.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as client:
        client.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_until(lambda: len(up.calls()) == 1, what="the stream to reach the upstream")
    # The client has gone before the proxy could relay anything: the relay's generator never runs,
    # and the attempt must still end, record its outcome, and hand back its slots.
    proxy.settled()
    conn = proxy.rt.engine.connections["key-1"]
    assert conn.semaphore is not None and conn.semaphore.in_use == 0
    wait_until(lambda: up.fake.in_flight == 0, what="the proxy to drop the upstream stream")
    assert proxy.connection("key-1")["status"] == "active"  # a disconnect counts against nothing


def _stream_scope(body: bytes, spec_version: str) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": spec_version},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": CHAT_PATH,
        "raw_path": CHAT_PATH.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }


@pytest.mark.parametrize(
    ("spec_version", "fails_at"),
    [
        # ASGI 2.4: `send` raises OSError once the client is gone. Gone before the response starts:
        # Starlette never iterates the relay, so the relay's own `finally` never runs.
        ("2.4", "http.response.start"),
        # ...or gone after the first chunk: the relay stops at its `yield`, and only the garbage
        # collector would ever close it.
        ("2.4", "http.response.body"),
    ],
)
async def test_a_relay_that_never_runs_to_its_end_still_settles_its_attempt(
    tmp_path: Path, upstreams: Callable[..., Upstream], spec_version: str, fails_at: str
) -> None:
    # In-process ASGI, not a socket: the moments a real server would have to hit by luck are
    # played exactly. The upstream is a real fake server.
    up = upstreams()
    up.fake.default(Reply("stream", chunks=3))
    path = tmp_path / "config.toml"
    path.write_text(one_slot("key", "apikey", up.url, "key-1"))
    path.chmod(0o600)
    runtime = Runtime.open(load_config(path, {}, explicit=True), None, clock=FakeClock(), env={})
    runtime.settings.patch({"requestQueue": {"minTimeBetweenRequestsMs": 0}}, "resilience")
    app = create_app(runtime, manage_lifecycle=False)
    body = json.dumps(chat("key/m1", stream=True)).encode()
    incoming: list[dict[str, Any]] = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[str] = []

    async def receive() -> dict[str, Any]:
        assert incoming, "only the body is read (ASGI 2.4 watches no disconnect)"
        return incoming.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message["type"])
        if message["type"] == fails_at:
            raise OSError("the client has gone")

    try:
        with contextlib.suppress(OSError):
            await app(_stream_scope(body, spec_version), receive, send)
        # No await since the app returned: nothing was left for a later loop turn to clean up.
        engine = runtime.engine
        conn = engine.connections["key-1"]
        assert conn.semaphore is not None
        limiter = conn.limiter
        assert limiter is not None
        assert (conn.in_flight, conn.semaphore.in_use, limiter.running, engine.stats.in_flight) == (
            0,
            0,
            0,
            0,
        )
        assert engine.stats.failed == 1  # ended as a disconnect: counted once, as not served
        assert conn.health.status(engine.clock.now()) == "active"
    finally:
        await runtime.upstream.close()
        runtime.store.close()


def test_a_late_503_does_not_rewrite_why_a_key_expired(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """A request in flight when its key expired came back with a 503: the status stayed `expired`,
    but its last error became the 503's, and the operator lost the 401 that says what to fix
    (found by a trial)."""
    proxy, _, statuses = _late_answer_after_expiry(launch, upstreams, 503)
    assert statuses == (503, 503)
    conn = proxy.connection("key-a")
    assert conn["status"] == "expired"
    assert (conn["lastErrorType"], conn["errorCode"]) == ("expired", 401), conn
    assert "Incorrect API key" in conn["lastError"], conn
    proxy.settled()


def test_a_request_waiting_for_its_slot_leaves_at_once_when_its_connection_is_disabled(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """A request queued for a connection's slot stayed there after the connection was disabled,
    and was refused only when the slot came free (here 4 s, up to the slot wait's timeout); the
    request queue's own waiters already left at once (found by a trial)."""
    up = upstreams()
    proxy = launch(
        f'[providers.key]\nclass = "apikey"\nbase_url = "{up.url}"\n\n'
        '[[providers.key.connections]]\nid = "key-1"\napi_key = "key-key-1"\nmax_concurrent = 1\n'
    )
    up.fake.by_model("slow", Reply("slow_headers", delay_ms=4000))
    assert proxy.runtime is not None
    conn = proxy.runtime.engine.connections["key-1"]

    async def scenario() -> tuple[httpx.Response, float, int]:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30.0) as client:
            holder = asyncio.create_task(client.post(CHAT_PATH, json=chat("key/slow")))
            await until(lambda: len(up.calls()) == 1, what="the slot holder to reach the upstream")
            waiter = asyncio.create_task(client.post(CHAT_PATH, json=chat("key/m1")))
            assert conn.semaphore is not None
            await until(lambda: conn.semaphore.waiting == 1, what="the second request to wait for the slot")
            assert (await client.put("/api/providers/key-1", json={"isActive": False})).status_code == 200
            started = asyncio.get_running_loop().time()
            answer = await waiter
            took = asyncio.get_running_loop().time() - started
            calls = len(up.calls())
            await holder
            return answer, took, calls

    answer, took, calls = asyncio.run(scenario())
    assert error_of(answer, 503)["code"] == "all_targets_unavailable"
    assert calls == 1  # it never went to the disabled connection
    assert took < 1.5, f"it left the line only after {took:.1f} s, when the slot came free"
    proxy.settled()
