"""The proxy end to end over real HTTP: fake upstreams and the proxy each on a real uvicorn server.

Every test starts its own FakeUpstream(s) and a proxy (`create_app(Runtime.open(...))`, lifespan on,
SQLite state in tmp_path) and talks to it with httpx. States are driven by upstream answers and read
back through the management API; the engine is only read (in-flight counters), never driven. Case 11
runs the engine on a FakeClock, so its cooldowns are exact and time moves without waiting.

Speed: requestQueue.minTimeBetweenRequestsMs is 0 and comboCooldownWait is off unless a test says
otherwise, so an answer never waits for pacing or for a cooldown the test is not about. Nothing
sleeps for a condition: tests poll it (`wait_until`) with generous upper bounds.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.app import create_app
from proxy.config import load_config
from proxy.resilience.clock import Clock, FakeClock
from proxy.runtime import Runtime
from proxy.settings import SECTIONS
from tests.fakes import FakeUpstream, LiveServer, RecordedRequest, Reply

CHAT_PATH = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hi"}]
FAST: dict[str, Any] = {
    "requestQueue": {"minTimeBetweenRequestsMs": 0},
    "comboCooldownWait": {"enabled": False},
}
WAIT_ON: dict[str, Any] = {"comboCooldownWait": {"enabled": True}}


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": MESSAGES, **extra}


def error_reply(status: int, message: str, **kwargs: Any) -> Reply:
    return Reply(
        "error", status=status, body={"error": {"message": message, "type": "x", "code": None}}, **kwargs
    )


# ---------------------------------------------------------------------------------------------
# Harness: upstreams, config text, the proxy


@dataclass
class Upstream:
    fake: FakeUpstream
    server: LiveServer

    @property
    def url(self) -> str:
        return self.server.url + "/v1"

    def calls(self, path: str = CHAT_PATH) -> list[RecordedRequest]:
        return [r for r in self.fake.requests if r.path == path]


def provider(pid: str, cls: str, url: str, *connections: str, extra: str = "") -> str:
    """TOML for one provider; each connection gets the key `key-<id>` and priority in listed order."""
    text = f'[providers.{pid}]\nclass = "{cls}"\nbase_url = "{url}"\n{extra}\n'
    for n, cid in enumerate(connections, 1):
        text += f'[[providers.{pid}.connections]]\nid = "{cid}"\napi_key = "key-{cid}"\npriority = {n}\n\n'
    return text


def combo(name: str, *targets: str) -> str:
    listed = ", ".join(f'"{t}"' for t in targets)
    return f'[combos.{name}]\nstrategy = "priority"\ntargets = [{listed}]\n\n'


@dataclass
class Proxy:
    config_path: Path
    state_path: Path
    clock: Clock | None = None
    runtime: Runtime | None = None
    server: LiveServer | None = None
    client: httpx.Client | None = None
    extra_headers: dict[str, str] = field(default_factory=dict)

    def start(self, settings: dict[str, Any] | None = None) -> Proxy:
        config = load_config(self.config_path, {}, explicit=True)
        self.runtime = Runtime.open(config, self.state_path, clock=self.clock, env={})
        for group, sections in SECTIONS.items():
            part = {k: v for k, v in (settings or {}).items() if k in sections}
            if part:
                self.runtime.settings.patch(part, group)
        self.server = LiveServer(create_app(self.runtime), lifespan="on").start()
        self.client = httpx.Client(base_url=self.server.url, timeout=30.0, headers=self.extra_headers)
        return self

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.server is not None:
            server, self.server = self.server, None
            server.stop()  # lifespan shutdown: the runtime persists and closes its store

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    @property
    def rt(self) -> Runtime:
        assert self.runtime is not None
        return self.runtime

    @property
    def http(self) -> httpx.Client:
        assert self.client is not None
        return self.client

    def chat(self, model: str, *, headers: dict[str, str] | None = None, **extra: Any) -> httpx.Response:
        return self.http.post(CHAT_PATH, json=chat(model, **extra), headers=headers)

    def pinned(self, model: str, connection: str, **extra: Any) -> httpx.Response:
        return self.chat(model, headers={"X-OmniRoute-Connection": connection}, **extra)

    def connection(self, cid: str) -> dict[str, Any]:
        response = self.http.get("/api/resilience/connections")
        assert response.status_code == 200
        return next(c for c in response.json()["connections"] if c["id"] == cid)

    def breaker(self, pid: str) -> dict[str, Any]:
        response = self.http.get("/api/monitoring/health")
        assert response.status_code == 200
        return next(b for b in response.json()["providerBreakers"] if b["provider"] == pid)

    def lockouts(self) -> list[dict[str, Any]]:
        response = self.http.get("/api/resilience/model-cooldowns")
        assert response.status_code == 200
        items: list[dict[str, Any]] = response.json()["items"]
        return items

    def last_record(self) -> dict[str, Any]:
        """The newest request's record once every request has ended: a stream's client has its
        last byte a moment before the proxy ends the stream's record."""
        wait_until(
            lambda: self.http.get("/api/requests?state=alive").json()["requests"] == [],
            what="every request's record to end",
        )
        record: dict[str, Any] = self.http.get("/api/requests").json()["requests"][-1]
        return record

    def settled(self) -> None:
        """Every request has ended and left nothing behind: in-flight counters, limiter and semaphore slots."""
        engine = self.rt.engine

        def idle() -> bool:
            return engine.stats.in_flight == 0 and all(
                c.in_flight == 0
                and (c.limiter is None or (c.limiter.running == 0 and c.limiter.queued == 0))
                and (c.semaphore is None or c.semaphore.in_use == 0)
                for c in engine.connections.values()
            )

        wait_until(idle, what="the proxy to settle")
        assert engine.stats.in_flight == 0
        assert [c.id for c in engine.connections.values() if c.in_flight] == []


@dataclass
class Started:
    """Everything one test started; stopped side by side at the end (each uvicorn waits for a loop tick)."""

    upstreams: list[Upstream] = field(default_factory=list)
    proxies: list[Proxy] = field(default_factory=list)


@pytest.fixture
def started() -> Iterator[Started]:
    everything = Started()
    yield everything
    for up in everything.upstreams:
        up.fake.reset()  # cut hangs and endless streams so the servers stop at once
    _stop_all([p.stop for p in everything.proxies] + [up.server.stop for up in everything.upstreams])


@pytest.fixture
def upstreams(started: Started) -> Callable[..., Upstream]:
    def make(name: str = "up", models: tuple[str, ...] = ("m1", "m2")) -> Upstream:
        fake = FakeUpstream(name, models)
        up = Upstream(fake, LiveServer(fake.app).start())
        started.upstreams.append(up)
        return up

    return make


@pytest.fixture
def launch(tmp_path: Path, started: Started) -> Callable[..., Proxy]:
    """`launch(config_text, settings=..., clock=None, headers=None)` starts a proxy; `settings` go over FAST."""

    def make(
        config: str,
        *,
        settings: dict[str, Any] | None = None,
        clock: Clock | None = None,
        headers: dict[str, str] | None = None,
    ) -> Proxy:
        n = len(started.proxies)
        path = tmp_path / f"config-{n}.toml"
        path.write_text(config)
        path.chmod(0o600)
        proxy = Proxy(path, tmp_path / f"state-{n}.db", clock, extra_headers=headers or {})
        started.proxies.append(proxy)
        return proxy.start(_merge(FAST, settings or {}))

    return make


def _stop_all(stops: list[Callable[[], None]]) -> None:
    """Stop servers side by side (each uvicorn shutdown waits for its own loop tick)."""
    errors: list[BaseException] = []

    def run(stop: Callable[[], None]) -> None:
        try:
            stop()
        except BaseException as exc:  # reported below, from the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(stop,)) for stop in stops]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in patch.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def wait_until(condition: Callable[[], bool], timeout: float = 10.0, what: str = "a condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


async def until(condition: Callable[[], bool], timeout: float = 10.0, what: str = "a condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    """The OpenAI-style error of a response, after checking its status and shape."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert "Traceback" not in response.text
    assert response.headers["x-request-id"]
    error: dict[str, Any] = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str)
    return error


def sse_events(text: str) -> list[Any]:
    """The `data:` payloads of an SSE body, decoded ("[DONE]" kept as a string)."""
    payloads = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    return [p if p == "[DONE]" else json.loads(p) for p in payloads]


def streamed_text(events: list[Any]) -> str:
    return "".join(
        e["choices"][0]["delta"].get("content") or ""
        for e in events
        if isinstance(e, dict) and "choices" in e
    )


# ---------------------------------------------------------------------------------------------
# Acceptance cases over HTTP


def test_case_2_apikey_breaker_degrades_at_7_opens_at_12_and_ignores_429_and_401(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    # Cooling off for the class, so every request reaches the one connection.
    proxy = launch(
        provider("key", "apikey", up.url, "key-1"),
        settings={"connectionCooldown": {"apikey": {"baseCooldownMs": 0}}},
    )
    up.fake.default(Reply("error", status=503))
    for n in range(1, 8):
        assert proxy.chat("key/m1").status_code == 503
        expected = "DEGRADED" if n >= 7 else "CLOSED"
        assert (proxy.breaker("key")["state"], proxy.breaker("key")["failureCount"]) == (expected, n)

    up.fake.default(Reply("error", status=429))
    for _ in range(5):
        assert proxy.chat("key/m1").status_code == 429
    up.fake.default(Reply("error", status=401))
    for _ in range(3):
        error_of(proxy.chat("key/m1"), 503)  # the only connection is now `expired`
        assert proxy.connection("key-1")["status"] == "expired"
        assert proxy.http.post("/api/resilience/connections/key-1/reset").status_code == 200
    breaker = proxy.breaker("key")
    assert (breaker["state"], breaker["failureCount"]) == ("DEGRADED", 7)
    assert len(up.calls()) == 15

    up.fake.default(Reply("error", status=503))
    for n in range(8, 13):
        assert proxy.chat("key/m1").status_code == 503
        expected = "OPEN" if n >= 12 else "DEGRADED"
        assert proxy.breaker("key")["state"] == expected
    health = proxy.http.get("/api/monitoring/health").json()
    assert health["circuitBreakers"]["open"] == 1
    assert health["status"] == "degraded"

    blocked = proxy.chat("key/m1")
    assert error_of(blocked, 503)["code"] == "provider_circuit_open"
    assert 1 <= int(blocked.headers["retry-after"]) <= 30
    assert len(up.calls()) == 20  # the OPEN provider was not contacted
    proxy.settled()


def test_an_answer_that_a_connection_is_cooling_says_what_cooled_it(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """The request after the one that found a server down was told only "cooling (retry in N
    ms)" in a 429: a new user whose local server was not running read a rate limit (found by a
    new user's trial). The answer names the connection's last error."""
    refused = FakeUpstream.refused_url()
    proxy = launch(provider("key", "apikey", refused, "key-1"), clock=FakeClock())
    first = error_of(proxy.chat("key/m1"), 429)["message"]
    assert "connection refused" in first
    second = error_of(proxy.chat("key/m1"), 429)["message"]
    assert "key/m1@key-1: cooling after connection refused (retry in " in second, second
    proxy.settled()


def test_case_11_apikey_connection_cools_3_6_12_24_seconds(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    clock = FakeClock()
    proxy = launch(provider("key", "apikey", up.url, "key-1"), clock=clock)
    up.fake.default(Reply("error", status=503))
    for level, cooldown_ms in enumerate([3000, 6000, 12000, 24000], 1):
        # The 503 cools the only connection, so the answer is the cooldown itself.
        failed = proxy.chat("key/m1")
        assert error_of(failed, 429)["code"] == "all_targets_cooling"
        assert failed.headers["retry-after"] == str(cooldown_ms // 1000)
        conn = proxy.connection("key-1")
        assert (conn["status"], conn["backoffLevel"], conn["cooldownRemainingMs"]) == (
            "cooling",
            level,
            cooldown_ms,
        )
        assert conn["errorCode"] == 503
        blocked = proxy.chat("key/m1")  # cooling: not sent upstream
        assert error_of(blocked, 429)["code"] == "all_targets_cooling"
        assert blocked.headers["retry-after"] == str(cooldown_ms // 1000)
        assert len(up.calls()) == level

        clock.advance(cooldown_ms - 1)
        assert proxy.connection("key-1")["cooldownRemainingMs"] == 1
        clock.advance(1)  # the cooldown has ended: the next failure is the next level
        assert proxy.connection("key-1")["status"] == "active"
    assert proxy.breaker("key")["failureCount"] == 4
    proxy.settled()


def test_case_15_terminal_states_survive_late_503s_until_operator_reset(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    proxy = launch(provider("key", "apikey", up.url, "key-1", "key-2", "key-3"))
    # A slow 503 is in flight on each connection while its terminal verdict arrives.
    up.fake.by_model("slow", Reply("slow_headers", status=503, delay_ms=1000))
    late: list[httpx.Response] = []

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30.0) as client:
            slow = [
                asyncio.create_task(
                    client.post(CHAT_PATH, json=chat("key/slow"), headers={"X-OmniRoute-Connection": cid})
                )
                for cid in ("key-1", "key-2", "key-3")
            ]
            await until(lambda: len(up.calls()) == 3, what="the slow requests to reach the upstream")
            up.fake.script(
                error_reply(401, "Incorrect API key provided"),
                error_reply(403, "Your account has been deactivated"),
                error_reply(429, "You exceeded your current quota"),
            )
            for cid in ("key-1", "key-2", "key-3"):
                answer = await client.post(
                    CHAT_PATH, json=chat("key/m1"), headers={"X-OmniRoute-Connection": cid}
                )
                assert answer.status_code == 503
            assert not any(t.done() for t in slow), "the 503s must arrive after the terminal verdicts"
            late.extend(await asyncio.gather(*slow))

    asyncio.run(scenario())
    assert [r.status_code for r in late] == [503, 503, 503]
    statuses = {cid: proxy.connection(cid)["status"] for cid in ("key-1", "key-2", "key-3")}
    assert statuses == {"key-1": "expired", "key-2": "banned", "key-3": "credits_exhausted"}
    assert all(proxy.connection(cid)["cooldownRemainingMs"] == 0 for cid in statuses)
    assert proxy.http.get("/api/monitoring/health").json()["connections"]["terminal"] == 3

    calls = len(up.calls())
    error_of(proxy.pinned("key/m1", "key-1"), 503)
    assert len(up.calls()) == calls  # a terminal connection takes no traffic

    reset = proxy.http.post("/api/resilience/connections/key-1/reset")
    assert reset.status_code == 200
    assert reset.json()["connection"]["status"] == "active"
    served = proxy.pinned("key/m1", "key-1")
    assert served.status_code == 200
    assert served.headers["x-omniroute-selected-connection-id"] == "key-1"
    assert proxy.connection("key-2")["status"] == "banned"
    proxy.settled()


def test_case_16_two_connections_one_cooling_traffic_flows_through_the_other(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    proxy = launch(
        provider("loc", "local", up.url, "loc-1", "loc-2"),
        settings={"connectionCooldown": {"local": {"baseCooldownMs": 60000}}},
    )
    up.fake.script(Reply("error", status=503))
    first = proxy.chat("loc/m1")
    assert first.status_code == 200
    assert first.headers["x-omniroute-selected-connection-id"] == "loc-2"
    assert first.headers["x-omniroute-fallback-attempts"] == "1"
    assert proxy.connection("loc-1")["status"] == "cooling"

    for _ in range(5):
        response = proxy.chat("loc/m1")
        assert response.status_code == 200
        assert response.headers["x-omniroute-selected-connection-id"] == "loc-2"
        assert "x-omniroute-fallback-attempts" not in response.headers
    keys = [r.headers["authorization"] for r in up.calls()]
    assert keys == ["Bearer key-loc-1"] + ["Bearer key-loc-2"] * 6
    assert proxy.connection("loc-2")["status"] == "active"
    proxy.settled()


def test_case_18_model_lockout_off_locks_nothing_on_locks_the_triple_for_120_s(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    proxy = launch(provider("loc", "local", up.url, "loc-1"))
    up.fake.by_model("m1", Reply("error", status=404))

    for n in (1, 2):
        assert error_of(proxy.chat("loc/m1"), 404)["code"] == "model_not_found"  # the upstream's answer
        assert proxy.lockouts() == []
        assert len(up.calls()) == n

    patched = proxy.http.patch("/api/settings", json={"modelLockout": {"enabled": True}})
    assert patched.status_code == 200
    assert patched.json()["modelLockout"]["enabled"] is True

    # This answer locks the triple, and the client still gets the upstream's own 404 (never a 429).
    locking = proxy.chat("loc/m1")
    assert error_of(locking, 404)["code"] == "model_not_found"
    assert locking.headers["x-omniroute-selected-connection-id"] == "loc-1"
    [lock] = proxy.lockouts()
    assert (lock["provider"], lock["connectionId"], lock["model"], lock["status"]) == (
        "loc",
        "loc-1",
        "m1",
        404,
    )
    assert 115_000 <= lock["remainingMs"] <= 120_000
    assert [x["model"] for x in proxy.connection("loc-1")["lockouts"]] == ["m1"]
    assert len(up.calls()) == 3

    other = proxy.chat("loc/m2")
    assert other.status_code == 200
    assert other.headers["x-omniroute-selected-connection-id"] == "loc-1"
    blocked = proxy.chat("loc/m1")  # blocked only by a not_found lock: 404, and no Retry-After to wait for
    assert error_of(blocked, 404)["code"] == "model_not_found"
    assert "retry-after" not in blocked.headers
    assert [r.json["model"] for r in up.calls()] == ["m1", "m1", "m1", "m2"]  # the locked model was not sent
    assert proxy.connection("loc-1")["status"] == "active"
    proxy.settled()


def _assert_untouched(proxy: Proxy, pid: str, cid: str) -> None:
    breaker = proxy.breaker(pid)
    assert (breaker["state"], breaker["failureCount"]) == ("CLOSED", 0)
    conn = proxy.connection(cid)
    assert (conn["status"], conn["backoffLevel"], conn["lastError"], conn["errorCode"]) == (
        "active",
        0,
        None,
        None,
    )
    assert proxy.lockouts() == []


def test_case_24_full_request_queue_rejects_at_once_and_touches_no_layer(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    proxy = launch(
        provider("key", "apikey", up.url, "key-1"),
        settings={
            "requestQueue": {"maxQueueDepth": 2, "concurrentRequests": 1},
            "modelLockout": {"enabled": True},  # 429 is in errorCodes: a wrongly recorded 429 would lock
        },
    )
    up.fake.script(Reply("slow_headers", delay_ms=1500))

    async def scenario() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30.0) as client:

            def send() -> asyncio.Task[httpx.Response]:
                return asyncio.create_task(client.post(CHAT_PATH, json=chat("key/m1")))

            first = send()
            await until(lambda: len(up.calls()) == 1, what="request 1 to reach the upstream")
            limiter = proxy.rt.engine.connections["key-1"].limiter
            assert limiter is not None
            second = send()
            await until(lambda: limiter.queued == 1, what="request 2 to queue")
            third = send()
            await until(lambda: limiter.queued == 2, what="request 3 to queue")

            fourth = await client.post(CHAT_PATH, json=chat("key/m1"))
            assert error_of(fourth, 429)["code"] == "RATE_LIMIT_QUEUE_FULL"
            # At once: request 1 is still at the upstream, 2 and 3 are still queued.
            assert not first.done() and limiter.queued == 2 and len(up.calls()) == 1
            return [*(await asyncio.gather(first, second, third)), fourth]

    answers = asyncio.run(scenario())
    assert [r.status_code for r in answers] == [200, 200, 200, 429]
    assert len(up.calls()) == 3
    assert up.fake.max_in_flight == 1  # concurrentRequests 1: one after the other
    _assert_untouched(proxy, "key", "key-1")
    proxy.settled()


@pytest.mark.parametrize(
    "queue",
    [
        {"minTimeBetweenRequestsMs": 5000},  # the later requests wait on the pacing rule
        {"concurrentRequests": 1},  # ... or for the one slot, held by the request that gets the 429
    ],
    ids=["pacing", "concurrency"],
)
def test_requests_queued_behind_a_429_are_answered_at_once_without_reaching_the_upstream(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], queue: dict[str, int]
) -> None:
    """Issue #21's slow rejections: requests admitted while the key was eligible waited their turn
    in its request queue (200 ms apart, 100 a minute) after the key had started cooling, then went
    to the rate-limited upstream anyway, deepening its cooldown, and only then were told
    `all_targets_cooling`. A queued request now leaves the queue as soon as its connection cannot
    take it, and is answered like any request that finds the key cooling."""
    up = upstreams()
    proxy = launch(provider("key", "apikey", up.url, "key-1"), settings={"requestQueue": queue})
    up.fake.script(Reply("slow_headers", status=429, delay_ms=300, headers={"retry-after": "3600"}))
    queued = 4

    async def scenario() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30.0) as client:
            first = asyncio.create_task(client.post(CHAT_PATH, json=chat("key/m1")))
            await until(lambda: len(up.calls()) == 1, what="request 1 to reach the upstream")
            limiter = proxy.rt.engine.connections["key-1"].limiter
            assert limiter is not None
            rest = [asyncio.create_task(client.post(CHAT_PATH, json=chat("key/m1"))) for _ in range(queued)]
            await until(lambda: limiter.queued == queued, what="the others to queue")
            # Far less than one pacing interval (5 s) after the 429: nobody waited a turn.
            async with asyncio.timeout(3.0):
                return await asyncio.gather(first, *rest)

    answers = asyncio.run(scenario())
    assert [error_of(r, 429)["code"] for r in answers] == ["all_targets_cooling"] * (queued + 1)
    assert len(up.calls()) == 1  # one 429, not one more per queued request
    assert proxy.connection("key-1")["status"] == "cooling"
    proxy.settled()


def test_a_request_queued_on_a_connection_that_starts_cooling_falls_back_to_the_next(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    proxy = launch(
        provider("key", "apikey", up.url, "key-1", "key-2"),
        settings={"requestQueue": {"concurrentRequests": 1}},
    )
    up.fake.script(Reply("slow_headers", status=429, delay_ms=300, headers={"retry-after": "3600"}))

    async def scenario() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30.0) as client:
            first = asyncio.create_task(client.post(CHAT_PATH, json=chat("key/m1")))
            await until(lambda: len(up.calls()) == 1, what="request 1 to reach the upstream")
            limiter = proxy.rt.engine.connections["key-1"].limiter
            assert limiter is not None
            second = asyncio.create_task(client.post(CHAT_PATH, json=chat("key/m1")))
            await until(lambda: limiter.queued == 1, what="request 2 to queue on key-1")
            return await asyncio.gather(first, second)

    first, second = asyncio.run(scenario())
    assert first.status_code == 200 and second.status_code == 200  # both served by key-2 in the end
    assert second.headers["x-omniroute-selected-connection-id"] == "key-2"
    assert [r.headers["authorization"] for r in up.calls()] == [
        "Bearer key-key-1",
        "Bearer key-key-2",
        "Bearer key-key-2",
    ]
    proxy.settled()


def in_thread(call: Callable[[], httpx.Response]) -> Callable[[], httpx.Response]:
    """Start `call` on a thread; the returned function joins it and gives its response."""
    answers: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: answers.append(call()))
    thread.start()

    def join() -> httpx.Response:
        thread.join(10.0)
        assert answers, "the request did not finish"
        return answers[0]

    return join


def test_case_25_execution_deadline_is_504_and_not_a_failure(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    clock = FakeClock()  # the deadline is engine time: it passes when the clock does
    proxy = launch(
        provider("key", "apikey", up.url, "key-1"),
        settings={"requestQueue": {"maxWaitMs": 15000}, "modelLockout": {"enabled": True}},  # 504 would lock
        clock=clock,
    )
    up.fake.default(Reply("hang"))
    answer = in_thread(lambda: proxy.chat("key/m1"))
    wait_until(lambda: len(up.calls()) == 1, what="the request to reach the upstream")
    clock.advance(15_000)
    response = answer()
    assert error_of(response, 504)["code"] == "RATE_LIMIT_EXECUTION_TIMEOUT"
    _assert_untouched(proxy, "key", "key-1")
    wait_until(lambda: up.fake.in_flight == 0, what="the proxy to drop the upstream request")
    proxy.settled()


def _duo(a: Upstream, b: Upstream, cls: str = "local") -> str:
    return (
        provider("one", cls, a.url, "one-1")
        + provider("two", cls, b.url, "two-1")
        + combo("duo", "one/m1", "two/m1")
    )


def test_case_26_combo_skips_an_open_provider_and_says_so(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    a, b = upstreams("a"), upstreams("b")
    proxy = launch(_duo(a, b), settings={"connectionCooldown": {"local": {"baseCooldownMs": 0}}})
    a.fake.default(Reply("error", status=503))
    for _ in range(2):  # local profile: opens at 2 failures; each request still served by `two`
        response = proxy.chat("duo")
        assert response.status_code == 200
        assert response.headers["x-omniroute-fallback-attempts"] == "1"
    assert proxy.breaker("one")["state"] == "OPEN"

    response = proxy.chat("duo")
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "hello from b"
    assert response.headers["x-omniroute-provider"] == "two"
    assert response.headers["x-omniroute-selected-connection-id"] == "two-1"
    assert response.headers["x-omniroute-fallback-attempts"] == "1"
    assert len(a.calls()) == 2  # the OPEN provider was skipped, not tried
    assert len(b.calls()) == 3
    proxy.settled()


def test_case_27_both_targets_cooling_wait_enabled_succeeds_once_the_first_recovers(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    a, b = upstreams("a"), upstreams("b")
    clock = FakeClock()  # the wait is engine time: the test moves the clock instead of sleeping 2 s
    proxy = launch(_duo(a, b), settings=WAIT_ON, clock=clock)
    a.fake.script(Reply("error", status=503))
    b.fake.script(Reply("error", status=503))
    started = time.monotonic()
    answer = in_thread(lambda: proxy.chat("duo"))
    pipeline = proxy.rt.pipeline
    wait_until(lambda: pipeline.waiting == 1, what="the request to wait out the cooldowns")
    assert (len(a.calls()), len(b.calls())) == (1, 1)
    clock.advance(2_000 + 50)  # `one` cooled first, for 2 s (local); the wait adds 50 ms of slack
    response = answer()
    assert response.status_code == 200
    assert response.headers["x-omniroute-provider"] == "one"  # the first to recover
    assert (len(a.calls()), len(b.calls())) == (2, 1)
    assert pipeline.waiting == 0
    assert time.monotonic() - started < 1.9  # no real 2 s went by: the engine's clock decided
    proxy.settled()


def _half_open(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> tuple[Upstream, FakeClock, Proxy]:
    """A proxy with waits on whose one provider's breaker is HALF_OPEN: its next request is the probe."""
    up = upstreams()
    clock = FakeClock()
    proxy = launch(provider("loc", "local", up.url, "loc-1"), settings=WAIT_ON, clock=clock)
    breaker = proxy.rt.engine.providers["loc"].breaker
    for _ in range(breaker.policy.failure_threshold):
        breaker.record_failure(clock.now())
    clock.advance(breaker.policy.reset_timeout_ms + 1)
    return up, clock, proxy


def test_a_request_waits_out_a_long_probe_and_is_served_when_it_settles(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """A probe in flight was waited on a second at a time, each wait one of `maxAttempts`: behind a
    probe that streamed for 11 s every other request got 503 after five. Now a request waits until
    the probe settles (its breaker's event ends the wait), up to `maxWaitMs`."""
    up, clock, proxy = _half_open(launch, upstreams)
    up.fake.script(Reply("slow_headers", delay_ms=600))  # (real time: the probe's upstream is slow)
    probe = in_thread(lambda: proxy.chat("loc/m1"))
    wait_until(lambda: up.fake.in_flight == 1, what="the probe to reach the upstream")
    waiter = in_thread(lambda: proxy.http.post(CHAT_PATH, json=chat("loc/m1"), timeout=5))
    pipeline = proxy.rt.pipeline
    wait_until(lambda: pipeline.waiting == 1, what="the request to wait for the probe")
    clock.advance(10_000)  # ten seconds of the engine's time with the probe still in flight
    assert probe().status_code == 200
    response = waiter()
    assert response.status_code == 200, response.text  # served when the probe closed the breaker
    assert len(up.calls()) == 2
    rec = proxy.http.get(f"/api/requests/{response.headers['x-request-id']}").json()["request"]
    # Two waits: the clock's ten seconds ended one (a look a second in, no wait of its own: the
    # probe still held), the probe's close ended the other.
    assert [w["reason"] for w in rec["waits"]] == [
        "nothing eligible; waited for loc/m1 (probe_in_flight)"
    ] * 2
    proxy.settled()


def test_a_request_waiting_on_a_probe_takes_it_when_the_probe_is_let_go_without_a_verdict(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """A probe whose client leaves settles nothing: its slot is freed, no breaker event says so. A
    request waiting on it looks again within a second (PROBE_RECOVERY_ESTIMATE_MS) and becomes the
    next probe, rather than sleep out `maxWaitMs`."""
    up, clock, proxy = _half_open(launch, upstreams)
    up.fake.script(Reply("hang"))  # the probe's upstream never answers; its client gives up
    gave_up: list[Exception] = []

    def impatient() -> None:
        try:
            proxy.http.post(CHAT_PATH, json=chat("loc/m1"), timeout=0.5)
        except httpx.ReadTimeout as exc:
            gave_up.append(exc)

    probe = threading.Thread(target=impatient)
    probe.start()
    wait_until(lambda: up.fake.in_flight == 1, what="the probe to reach the upstream")
    waiter = in_thread(lambda: proxy.http.post(CHAT_PATH, json=chat("loc/m1"), timeout=5))
    pipeline = proxy.rt.pipeline
    wait_until(lambda: pipeline.waiting == 1, what="the request to wait for the probe")
    probe.join(10.0)
    assert gave_up, "the probe's client did not give up"
    wait_until(lambda: up.fake.in_flight == 0, what="the probe's upstream call to end")
    clock.advance(1_100)  # the probe was let go: within a second, the waiter looks again
    response = waiter()
    assert response.status_code == 200, response.text
    proxy.settled()


def test_case_27_both_targets_cooling_wait_disabled_is_429_retry_after_2(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    a, b = upstreams("a"), upstreams("b")
    proxy = launch(_duo(a, b))
    a.fake.script(Reply("error", status=503))
    b.fake.script(Reply("error", status=503))
    started = time.monotonic()
    response = proxy.chat("duo")
    assert time.monotonic() - started < 1.9  # answered without waiting for the cooldowns
    error = error_of(response, 429)
    assert error["code"] == "all_targets_cooling"
    assert response.headers["retry-after"] == "2"
    assert {s["reason"] for s in error["skipped"]} == {"cooling"}
    assert (len(a.calls()), len(b.calls())) == (1, 1)
    proxy.settled()


def test_case_28_all_connections_terminal_is_503_at_once(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    proxy = launch(provider("loc", "local", up.url, "loc-1", "loc-2"), settings=WAIT_ON)
    up.fake.script(Reply("error", status=401), error_reply(402, "Payment required"))
    first = proxy.chat("loc/m1")
    assert error_of(first, 503)["code"] == "all_targets_unavailable"
    assert proxy.connection("loc-1")["status"] == "expired"
    assert proxy.connection("loc-2")["status"] == "credits_exhausted"

    started = time.monotonic()
    second = proxy.chat("loc/m1")
    assert time.monotonic() - started < 1.5  # waiting is on, but nothing terminal is waited for
    error = error_of(second, 503)
    assert error["code"] == "all_targets_unavailable"
    assert "retry-after" not in second.headers
    assert {(s["connectionId"], s["reason"]) for s in error["skipped"]} == {
        ("loc-1", "expired"),
        ("loc-2", "credits_exhausted"),
    }
    assert len(up.calls()) == 2
    proxy.settled()


def test_case_29_agentrouter_quota_403_is_429_retry_after_60_but_no_access_stays_403(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    proxy = launch(provider("agentrouter", "apikey", up.url, "ar-1"))
    up.fake.script(error_reply(403, "用户额度不足，请充值"))
    quota = proxy.chat("agentrouter/m1")
    assert error_of(quota, 429)
    assert quota.headers["retry-after"] == "60"
    conn = proxy.connection("ar-1")
    assert (conn["status"], conn["errorCode"]) == ("cooling", 429)  # treated as 429 inside too
    assert proxy.breaker("agentrouter")["failureCount"] == 0

    assert proxy.http.post("/api/resilience/connections/ar-1/reset").status_code == 200
    for message in ("无权访问", "无权访问：用户额度不足"):
        up.fake.script(error_reply(403, message))
        denied = proxy.chat("agentrouter/m1")
        assert denied.status_code == 403
        assert denied.json()["error"]["message"] == message  # the upstream's own answer
        assert "retry-after" not in denied.headers
        assert proxy.connection("ar-1")["status"] == "active"
    proxy.settled()


@pytest.mark.parametrize(
    "failure",
    [Reply("stream_die", die_after=0), Reply("reset"), Reply("error", status=502)],
    ids=["closed-before-data", "reset", "502"],
)
def test_case_30_stream_failing_before_its_first_byte_falls_back(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], failure: Reply
) -> None:
    a, b = upstreams("a"), upstreams("b")
    proxy = launch(_duo(a, b))
    a.fake.default(failure)
    b.fake.default(Reply("stream", chunks=3, chunk_text="ok"))
    with proxy.http.stream("POST", CHAT_PATH, json=chat("duo", stream=True)) as response:
        body = response.read().decode()
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-omniroute-provider"] == "two"
    assert response.headers["x-omniroute-fallback-attempts"] == "1"
    events = sse_events(body)
    assert streamed_text(events) == "okokok"
    assert events[-1] == "[DONE]"
    assert not any(isinstance(e, dict) and "error" in e for e in events)
    assert len(a.calls()) == 1
    proxy.settled()


def test_case_30_stream_failing_after_its_first_byte_ends_with_error_event_and_done(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    a, b = upstreams("a"), upstreams("b")
    proxy = launch(_duo(a, b))
    a.fake.default(Reply("stream_die", die_after=2, chunk_text="ok", delay_ms=20))
    with proxy.http.stream("POST", CHAT_PATH, json=chat("duo", stream=True)) as response:
        body = response.read().decode()
    assert response.status_code == 200
    assert response.headers["x-omniroute-provider"] == "one"
    events = sse_events(body)
    assert streamed_text(events) == "okok"  # relayed, never replayed
    assert events[-2]["error"]["code"] == "stream_interrupted"
    assert events[-1] == "[DONE]"
    assert b.calls() == []  # no fallback once bytes reached the client
    assert proxy.breaker("one")["failureCount"] == 1
    proxy.settled()


# ---------------------------------------------------------------------------------------------
# Bad input (docs/api.md#the-proxy-api)


@pytest.fixture
def one_local(launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]) -> tuple[Proxy, Upstream]:
    up = upstreams()
    return launch(provider("loc", "local", up.url, "loc-1", "loc-2")), up


PAD = b"p" * 100_000
"""Makes a body as large as a coding agent's."""


@pytest.fixture(scope="module")
def untouched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proxy, Upstream]]:
    """One proxy shared by the tests whose requests must never reach an upstream (nothing to reset)."""
    fake = FakeUpstream("up")
    up = Upstream(fake, LiveServer(fake.app).start())
    path = tmp_path_factory.mktemp("untouched") / "config.toml"
    path.write_text(provider("loc", "local", up.url, "loc-1", "loc-2"))
    path.chmod(0o600)
    proxy = Proxy(path, path.with_name("state.db"))
    try:
        yield proxy.start(FAST), up
    finally:
        _stop_all([proxy.stop, up.server.stop])


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b'{"model": "loc/m1", "messages": [', 400, "invalid_json"),
        (b"\xff\xfe not utf-8", 400, "invalid_json"),
        (b"", 400, "invalid_json"),
        (b'["loc/m1"]', 400, "invalid_request"),
        (b'"loc/m1"', 400, "invalid_request"),
        (b"null", 400, "invalid_request"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, 400, "invalid_json", id="nested-too-deep"),
        (b'{"messages": []}', 400, "missing_model"),
        (b'{"model": 5}', 400, "missing_model"),
        (b'{"model": ""}', 400, "missing_model"),
        (b'{"model": ["loc/m1"]}', 400, "missing_model"),
        (b'{"model": "nope/m1"}', 404, "model_not_found"),
        # A name is kept (the trail, lockouts, the log, the state file): one of megabytes is no name.
        pytest.param(b'{"model": "loc/' + b"m" * 253 + b'"}', 400, "invalid_model", id="model-257-chars"),
        pytest.param(
            b'{"model": "nope/' + b"m" * 8_000_000 + b'"}', 400, "invalid_model", id="model-of-megabytes"
        ),
        # A stream asked for in words: neither quietly a stream nor quietly not one.
        (b'{"model": "loc/m1", "stream": "yes"}', 400, "invalid_stream"),
        (b'{"model": "loc/m1", "stream": 1}', 400, "invalid_stream"),
        (b'{"model": "loc/m1", "stream": "false"}', 400, "invalid_stream"),
        (b'{"model": "not-listed-anywhere"}', 404, "model_not_found"),
        # The same mistakes in bodies as large as a coding agent's (read by another parser):
        pytest.param(
            b'{"model": "loc/m1", "pad": "' + PAD + b'", "messages": [', 400, "invalid_json", id="large-cut"
        ),
        pytest.param(b'["loc/m1", "' + PAD + b'"]', 400, "invalid_request", id="large-array"),
        pytest.param(
            b'{"model": {"loc": "m1"}, "pad": "' + PAD + b'"}', 400, "missing_model", id="large-object-model"
        ),
        pytest.param(
            b'{"model": "loc/m1", "pad": "' + PAD + b'", "model": 5}',
            400,
            "missing_model",
            id="large-repeated",
        ),
        pytest.param(
            b'{"model": "loc/m1", "pad": "' + PAD + b'", "x": NaN}', 400, "invalid_json", id="large-nan"
        ),
        pytest.param(
            b'{"model": "loc/' + b"m" * 300 + b'", "pad": "' + PAD + b'"}',
            400,
            "invalid_model",
            id="large-long-model",
        ),
    ],
)
def test_bad_input_is_a_clear_error_and_reaches_no_upstream(
    untouched: tuple[Proxy, Upstream], body: bytes, status: int, code: str
) -> None:
    proxy, up = untouched
    response = proxy.http.post(CHAT_PATH, content=body, headers={"content-type": "application/json"})
    assert error_of(response, status)["code"] == code
    assert response.headers["x-request-id"]
    assert up.calls() == []
    assert proxy.rt.engine.stats.in_flight == 0


@pytest.mark.parametrize("header", ["x-session-id", "x-codex-session-id", "x-omniroute-session"])
def test_a_long_session_id_is_pinned_under_a_bounded_key(
    one_local: tuple[Proxy, Upstream], header: str
) -> None:
    """A session is kept (a pin, in memory and the state file, for `sessionAffinity.ttlMs`): 2,000
    requests with 60 KB ids grew the state file to 269 MB. A long id still pins its session."""
    proxy, up = one_local
    affinity = {"sessionAffinity": {"ttlMs": 60_000}}
    assert proxy.http.patch("/api/resilience", json=affinity).status_code == 200
    body = {"model": "loc/m1", "messages": [{"role": "user", "content": "hi"}]}
    long_id = "s" * 60_000
    for _ in range(2):
        assert proxy.http.post(CHAT_PATH, json=body, headers={header: long_id}).status_code == 200
    assert proxy.http.post(CHAT_PATH, json=body, headers={header: "s" * 256}).status_code == 200
    pins = proxy.rt.engine.pins
    assert sorted(len(k) for k in pins) == [65, 256]  # the long one by its digest, once
    assert len(up.calls()) == 3


def test_a_large_body_goes_upstream_as_it_came_with_the_attempts_model(
    one_local: tuple[Proxy, Upstream],
) -> None:
    proxy, up = one_local
    messages = [{"role": "user", "content": f"turn {i}: " + "x" * 2_000} for i in range(60)]
    body = {"messages": messages, "model": "loc/m1", "stream": True, "tools": [{"type": "function"}]}
    raw = json.dumps(body).encode()
    assert len(raw) > 100_000  # a coding agent's size, past where simdjson reads the body
    response = proxy.http.post(CHAT_PATH, content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 200
    record = proxy.http.get(f"/api/requests/{response.headers['x-request-id']}").json()["request"]
    assert (record["modelAsked"], record["stream"]) == ("loc/m1", True)
    [sent] = up.calls()
    assert sent.body == raw.replace(b'"model": "loc/m1"', b'"model": "m1"')


def test_body_over_32_mib_is_413(one_local: tuple[Proxy, Upstream]) -> None:
    proxy, up = one_local
    big = b'{"model": "loc/m1", "pad": "' + b"x" * (33 * 1024 * 1024) + b'"}'
    response = proxy.http.post(CHAT_PATH, content=big, headers={"content-type": "application/json"})
    assert error_of(response, 413)["code"] == "request_too_large"

    def chunked() -> Iterator[bytes]:  # no content-length: the proxy must count as it reads
        yield b'{"model": "loc/m1", "pad": "'
        for _ in range(33):
            yield b"x" * (1024 * 1024)
        yield b'"}'

    response = proxy.http.post(CHAT_PATH, content=chunked(), headers={"content-type": "application/json"})
    assert error_of(response, 413)["code"] == "request_too_large"
    assert up.calls() == []
    assert proxy.chat("loc/m1").status_code == 200  # and the proxy serves on
    proxy.settled()


def test_unknown_route_and_wrong_method_are_json(untouched: tuple[Proxy, Upstream]) -> None:
    proxy, _ = untouched
    missing = proxy.http.get("/v1/nothing")
    assert error_of(missing, 404)["code"] == "not_found"
    assert missing.headers["x-request-id"]
    wrong = proxy.http.get(CHAT_PATH)
    assert error_of(wrong, 405)["code"] == "method_not_allowed"
    assert wrong.headers["x-request-id"]
    assert wrong.headers["allow"] == "POST"  # a 405 says what is allowed (RFC 9110)
    listing = proxy.http.delete("/v1/models")
    assert error_of(listing, 405)["code"] == "method_not_allowed"
    assert listing.headers["allow"] == "GET, HEAD"


def test_a_trailing_slash_is_a_json_404_not_an_empty_redirect(untouched: tuple[Proxy, Upstream]) -> None:
    """Starlette answered `/v1/chat/completions/` with an empty 307 to a URL built from the request's
    Host header: no client follows a redirected POST with its body, and errors are JSON."""
    proxy, upstream = untouched
    before = len(upstream.fake.requests)  # (the module's other tests may have listed its models)
    for method, path in (("POST", CHAT_PATH + "/"), ("GET", "/api/requests/"), ("GET", "/v1/models/")):
        answer = proxy.http.request(method, path, json={} if method == "POST" else None)
        assert error_of(answer, 404)["code"] == "not_found", (method, path)
        assert "location" not in answer.headers
    assert len(upstream.fake.requests) == before


def test_the_messages_routes_answer_a_wrong_method_in_anthropics_shape(
    untouched: tuple[Proxy, Upstream],
) -> None:
    """Anthropic's clients read `{"type": "error", "error": {...}}` on its routes, 405 included."""
    proxy, _ = untouched
    for method, path in (("GET", "/v1/messages"), ("PUT", "/v1/messages/count_tokens")):
        answer = proxy.http.request(method, path)
        assert answer.status_code == 405, answer.text
        body = answer.json()
        assert body["type"] == "error" and body["error"]["type"] == "api_error", body
        assert f"{method} is not allowed on {path}" in body["error"]["message"]
        assert answer.headers["allow"] == "POST"


def test_client_credentials_and_session_headers_never_reach_the_upstream(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    config = '[server]\napi_keys = ["sk-proxy-client-1"]\n\n' + provider(
        "loc", "local", up.url, "loc-1", "loc-2"
    )
    proxy = launch(config, headers={"Authorization": "Bearer sk-proxy-client-1"})
    session = {"X-Session-Id": "sess-a", "x-codex-session-id": "sess-b", "x-omniroute-session": "sess-c"}
    response = proxy.chat("loc/m1", headers={**session, "Cookie": "c=1"})
    assert response.status_code == 200
    assert response.headers["x-request-id"]
    assert response.headers["x-omniroute-selected-connection-id"] == "loc-1"
    assert response.headers["x-omniroute-provider"] == "loc"

    pinned = proxy.pinned("loc/m1", "loc-2")
    assert pinned.headers["x-omniroute-selected-connection-id"] == "loc-2"

    first, second = up.calls()
    assert first.headers["authorization"] == "Bearer key-loc-1"
    assert second.headers["authorization"] == "Bearer key-loc-2"
    for sent in (first, second):
        assert sent.json["model"] == "m1"  # the bare model name
        text = json.dumps(sent.headers).lower()
        assert "sk-proxy-client-1" not in text
        assert "sess-" not in text
        assert not {"x-session-id", "x-codex-session-id", "x-omniroute-session", "cookie"} & set(sent.headers)
        assert "x-omniroute-connection" not in sent.headers


def test_api_keys_guard_v1_and_every_answer_has_a_request_id(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    config = '[server]\napi_keys = ["sk-proxy-client-1"]\n\n' + provider("loc", "local", up.url, "loc-1")
    proxy = launch(config)
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "Basic sk-proxy-client-1"}):
        denied = proxy.chat("loc/m1", headers=headers)
        assert error_of(denied, 401)["code"] == "invalid_api_key"
        assert denied.headers["x-request-id"]
        assert error_of(proxy.http.get("/v1/models", headers=headers), 401)
    assert up.calls() == []
    ok = proxy.chat("loc/m1", headers={"Authorization": "Bearer sk-proxy-client-1"})
    assert ok.status_code == 200
    ids = {ok.headers["x-request-id"], denied.headers["x-request-id"]}
    assert len(ids) == 2  # one id per request


def test_an_unexpected_error_is_a_json_500_without_internals(
    one_local: tuple[Proxy, Upstream], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, _ = one_local

    async def broken(request: object, endpoint: str) -> None:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(proxy.rt.pipeline, "handle", broken)
    response = proxy.chat("loc/m1")
    assert error_of(response, 500)["code"] == "internal_error"
    assert "secret internal detail" not in response.text
    assert response.headers["x-request-id"]


def test_pinning_an_unknown_connection_is_404(untouched: tuple[Proxy, Upstream]) -> None:
    proxy, up = untouched
    assert error_of(proxy.pinned("loc/m1", "ghost"), 404)["code"] == "connection_not_found"
    assert up.calls() == []


# ---------------------------------------------------------------------------------------------
# Upstream faults never lose a request


FAULTS = {
    "refused": None,  # the provider's base_url has no listener
    "reset": Reply("reset"),
    "hang": Reply("hang"),  # past [server] first_byte_timeout_ms
    "closed-before-data": Reply("stream_die", die_after=0),
}
SERVER_TIMEOUTS = "[server]\nfirst_byte_timeout_ms = 400\nidle_timeout_ms = 400\n\n"


def _faulty(a: Upstream, fault: str) -> str:
    return FakeUpstream.refused_url() if fault == "refused" else a.url


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_upstream_fault_falls_back_to_the_next_target(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], fault: str, stream: bool
) -> None:
    a, b = upstreams("a"), upstreams("b")
    reply = FAULTS[fault]
    if reply is not None:
        a.fake.default(reply)
    b.fake.default(Reply("stream", chunks=2) if stream else Reply("json"))
    config = (
        SERVER_TIMEOUTS
        + provider("one", "local", _faulty(a, fault), "one-1")
        + provider("two", "local", b.url, "two-1")
        + combo("duo", "one/m1", "two/m1")
    )
    proxy = launch(config)
    response = proxy.chat("duo", stream=stream)
    assert response.status_code == 200
    assert response.headers["x-omniroute-provider"] == "two"
    assert response.headers["x-omniroute-fallback-attempts"] == "1"
    if stream:
        assert streamed_text(sse_events(response.text)) == "hihi"
    else:
        assert response.json()["choices"][0]["message"]["content"] == "hello from b"
    assert proxy.breaker("one")["failureCount"] == 1
    assert proxy.connection("one-1")["status"] == "cooling"
    wait_until(lambda: a.fake.in_flight == 0, what="the faulty upstream request to end")
    proxy.settled()


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_upstream_fault_on_the_only_target_is_a_well_formed_error(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], fault: str, stream: bool
) -> None:
    a = upstreams("a")
    reply = FAULTS[fault]
    if reply is not None:
        a.fake.default(reply)
    # Cooling off: the answer is about the failed attempt itself, not a cooldown.
    url = _faulty(a, fault)
    proxy = launch(
        SERVER_TIMEOUTS + provider("one", "local", url, "one-1"),
        settings={"connectionCooldown": {"local": {"baseCooldownMs": 0}}},
    )
    response = proxy.chat("one/m1", stream=stream)
    error = error_of(response, 502)
    assert error["code"] == "upstream_unreachable"
    # The upstream's failure first, in words, naming the connection (and as data in upstreamError).
    words = error["upstreamError"]["message"]
    assert error["upstreamError"] == {"connectionId": "one-1", "status": None, "message": words}
    assert words.endswith(f" at {url}")
    assert error["message"].startswith(f"one-1: {words}")
    if fault == "refused":
        assert words.startswith("connection refused at ")
    assert response.headers["x-request-id"]
    assert proxy.breaker("one")["failureCount"] == 1
    wait_until(lambda: a.fake.in_flight == 0, what="the faulty upstream request to end")
    proxy.settled()


def test_upstream_fault_with_cooling_on_is_429_with_retry_after(launch: Callable[..., Proxy]) -> None:
    url = FakeUpstream.refused_url()
    proxy = launch(provider("one", "local", url, "one-1"))
    response = proxy.chat("one/m1")
    error = error_of(response, 429)
    assert error["code"] == "all_targets_cooling"
    assert response.headers["retry-after"] == "2"  # the local class cools for 2 s
    # The cooldown is this request's own doing: the answer says first what the upstream did.
    assert error["message"].startswith(f"one-1: connection refused at {url}; no target is available")
    assert error["upstreamError"] == {
        "connectionId": "one-1",
        "status": None,
        "message": f"connection refused at {url}",
    }
    conn = proxy.connection("one-1")
    assert conn["lastErrorType"] == "network_error"
    assert conn["lastError"] == "connection refused"
    proxy.settled()


def test_stream_idle_past_idle_timeout_ends_with_an_error_event(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    a = upstreams("a")
    a.fake.default(Reply("stream", chunks=3, delay_ms=3000))  # first chunk at once, then silence
    proxy = launch(SERVER_TIMEOUTS + provider("one", "local", a.url, "one-1"))
    response = proxy.chat("one/m1", stream=True)
    assert response.status_code == 200
    events = sse_events(response.text)
    assert streamed_text(events) == "hi"
    assert events[-2]["error"]["code"] == "stream_interrupted"
    assert events[-1] == "[DONE]"
    assert proxy.connection("one-1")["lastErrorType"] == "stall"
    wait_until(lambda: a.fake.in_flight == 0, what="the proxy to drop the stalled stream")
    proxy.settled()


def test_stream_of_pings_is_aborted_by_the_throughput_watchdog(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    a = upstreams("a")
    a.fake.default(Reply("stream_pings", delay_ms=100))
    watchdog = {"enabled": True, "warmupMs": 0, "windowMs": 1000, "minUsefulBytesPerSecond": 4}
    proxy = launch(
        provider("one", "local", a.url, "one-1"),
        settings={"streamRecovery": {"throughputWatchdog": watchdog}},
    )
    started = time.monotonic()
    response = proxy.chat("one/m1", stream=True)
    elapsed = time.monotonic() - started
    assert response.status_code == 200
    assert response.text.startswith(": ping")  # relayed as it came
    events = sse_events(response.text)
    assert events[-2]["error"]["code"] == "stream_stalled"
    assert events[-1] == "[DONE]"
    assert 1.0 <= elapsed < 10, elapsed  # judged only after warm-up (0) plus one full 1 s window
    conn = proxy.connection("one-1")
    assert (conn["lastErrorType"], proxy.breaker("one")["failureCount"]) == ("stall", 1)
    wait_until(lambda: a.fake.in_flight == 0, what="the proxy to drop the aborted stream")
    proxy.settled()


def test_steady_stream_is_not_aborted_by_the_watchdog(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    a = upstreams("a")
    a.fake.default(Reply("stream", chunks=15, delay_ms=100, chunk_text="steady text "))
    watchdog = {"enabled": True, "warmupMs": 0, "windowMs": 1000, "minUsefulBytesPerSecond": 4}
    proxy = launch(
        provider("one", "local", a.url, "one-1"),
        settings={"streamRecovery": {"throughputWatchdog": watchdog}},
    )
    response = proxy.chat("one/m1", stream=True)
    events = sse_events(response.text)
    assert streamed_text(events) == "steady text " * 15
    assert not any(isinstance(e, dict) and "error" in e for e in events)
    assert events[-1] == "[DONE]"
    assert proxy.connection("one-1")["lastError"] is None
    proxy.settled()


# ---------------------------------------------------------------------------------------------
# The other endpoints, and what an OpenAI client does


def test_completions_endpoint(one_local: tuple[Proxy, Upstream]) -> None:
    proxy, up = one_local
    response = proxy.http.post("/v1/completions", json={"model": "loc/m2", "prompt": "Say hi"})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "hello from up"
    [sent] = up.calls("/v1/completions")
    assert sent.json == {"model": "m2", "prompt": "Say hi"}
    assert response.headers["x-omniroute-selected-connection-id"] == "loc-1"


def test_embeddings_endpoint(one_local: tuple[Proxy, Upstream]) -> None:
    proxy, up = one_local
    # `stream` means nothing to embeddings: the answer is plain JSON whatever the client says.
    response = proxy.http.post(
        "/v1/embeddings", json={"model": "loc/m1", "input": ["a", "b"], "stream": True}
    )
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert [d["index"] for d in body["data"]] == [0, 1]
    [sent] = up.calls("/v1/embeddings")
    assert sent.json["model"] == "m1"
    assert sent.json["input"] == ["a", "b"]


def test_models_lists_targets_combos_and_upstream_models(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    a, b = upstreams("a", ("m1", "m2")), upstreams("b", ("x1",))
    proxy = launch(
        provider("one", "local", a.url, "one-1")
        + provider("two", "local", b.url, "two-1")
        + combo("duo", "one/m1", "two/x1")
    )
    response = proxy.http.get("/v1/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    ids = [m["id"] for m in body["data"]]
    assert ids == ["duo", "one/m1", "two/x1", "one/m2"]
    assert all(m["object"] == "model" for m in body["data"])

    # A bare model name goes to the provider whose upstream lists it.
    bare = proxy.chat("x1")
    assert bare.status_code == 200
    assert bare.headers["x-omniroute-provider"] == "two"
    assert b.calls()[0].json["model"] == "x1"


def test_an_openai_client_works_against_base_url_v1(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    api_key = "sk-local-openai-client"
    config = f'[server]\napi_keys = ["{api_key}"]\n\n' + provider("loc", "local", up.url, "loc-1")
    proxy = launch(config)
    up.fake.by_model("m2", Reply("stream", chunks=4, chunk_text="to"))
    # What the SDK does: base_url + "/chat/completions", `Authorization: Bearer <api_key>`, JSON body.
    headers = {"Authorization": f"Bearer {api_key}", "Accept": "application/json"}
    with httpx.Client(base_url=f"{proxy.url}/v1", headers=headers, timeout=30.0) as openai:
        models = openai.get("/models").json()
        assert "loc/m1" in [m["id"] for m in models["data"]]

        completion = openai.post("/chat/completions", json=chat("loc/m1")).json()
        assert completion["object"] == "chat.completion"
        assert completion["choices"][0]["message"] == {"role": "assistant", "content": "hello from up"}

        text = ""
        done = False
        with openai.stream("POST", "/chat/completions", json=chat("loc/m2", stream=True)) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                assert chunk["object"] == "chat.completion.chunk"
                text += chunk["choices"][0]["delta"].get("content") or ""
    assert (text, done) == ("totototo", True)
    assert [r.headers["authorization"] for r in up.calls()] == ["Bearer key-loc-1"] * 2
    proxy.settled()


# ---------------------------------------------------------------------------------------------
# Restart (acceptance case 32 over HTTP)


def _snapshot(proxy: Proxy) -> dict[str, Any]:
    http = proxy.http
    return {
        "breakers": {b["provider"]: b for b in http.get("/api/monitoring/health").json()["providerBreakers"]},
        "connections": {c["id"]: c for c in http.get("/api/resilience/connections").json()["connections"]},
        "lockouts": {(x["provider"], x["connectionId"], x["model"]): x for x in proxy.lockouts()},
        "resilience": http.get("/api/resilience").json(),
        "settings": http.get("/api/settings").json(),
    }


def _no_lockouts(conn: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in conn.items() if k != "lockouts"}


def _same_but_time(
    before: dict[str, Any], after: dict[str, Any], key: str, tolerance_ms: int = 10_000
) -> None:
    """Equal in every field but `key`, a remaining time that may only have run down (by < tolerance)."""
    assert {k: v for k, v in after.items() if k != key} == {k: v for k, v in before.items() if k != key}
    assert before[key] - tolerance_ms <= after[key] <= before[key]


def test_case_32_restart_keeps_breakers_cooldowns_terminal_states_lockouts_and_settings(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    a, b = upstreams("a"), upstreams("b")
    config = provider("loc", "local", a.url, "loc-1", "loc-2") + provider(
        "key", "apikey", b.url, "key-1", "key-2", "key-3"
    )
    proxy = launch(config)
    patch = {
        "connectionCooldown": {"apikey": {"baseCooldownMs": 60000}, "local": {"baseCooldownMs": 45000}},
        "providerBreaker": {"local": {"resetTimeoutMs": 120000}},
    }
    assert proxy.http.patch("/api/resilience", json=patch).status_code == 200
    lockout = {"modelLockout": {"enabled": True, "baseCooldownMs": 300000}}
    assert proxy.http.patch("/api/settings", json=lockout).status_code == 200

    a.fake.default(Reply("error", status=503))
    # Both loc connections fail in one request: breaker OPEN (local opens at 2), both cooling.
    assert error_of(proxy.chat("loc/m1"), 503)["code"] == "provider_circuit_open"
    b.fake.script(Reply("error", status=401), Reply("error", status=503), Reply("error", status=404))
    proxy.pinned("key/m1", "key-1")  # expired
    proxy.pinned("key/m1", "key-2")  # cooling 60 s, level 1
    proxy.pinned("key/m1", "key-3")  # lockout of key:key-3:m1 for 300 s
    before = _snapshot(proxy)
    assert before["breakers"]["loc"]["state"] == "OPEN"
    assert before["breakers"]["key"]["failureCount"] == 1
    assert [before["connections"][c]["status"] for c in ("loc-1", "loc-2", "key-1", "key-2", "key-3")] == [
        "cooling",
        "cooling",
        "expired",
        "cooling",
        "active",
    ]
    # 503 and 404 are both in the default errorCodes: every failed triple is locked.
    assert set(before["lockouts"]) == {
        ("loc", "loc-1", "m1"),
        ("loc", "loc-2", "m1"),
        ("key", "key-2", "m1"),
        ("key", "key-3", "m1"),
    }
    proxy.settled()

    proxy.stop()
    proxy.start()  # a new Runtime on the same state.db (no settings patch: they must come from disk)
    after = _snapshot(proxy)

    assert after["resilience"] == before["resilience"]
    assert after["settings"] == before["settings"]
    assert after["resilience"]["connectionCooldown"]["apikey"]["baseCooldownMs"] == 60000
    assert set(after["breakers"]) == set(before["breakers"])
    for pid, breaker in before["breakers"].items():
        _same_but_time(breaker, after["breakers"][pid], "retryAfterMs")
    assert set(after["connections"]) == set(before["connections"])
    for cid, conn in before["connections"].items():
        restored = after["connections"][cid]
        _same_but_time(_no_lockouts(conn), _no_lockouts(restored), "cooldownRemainingMs")
        assert [x["model"] for x in restored["lockouts"]] == [x["model"] for x in conn["lockouts"]]
    assert set(after["lockouts"]) == set(before["lockouts"])
    for triple, entry in before["lockouts"].items():
        _same_but_time(entry, after["lockouts"][triple], "remainingMs")

    # And the restored state steers traffic: the OPEN provider and the blocked connections are skipped.
    calls = (len(a.calls()), len(b.calls()))
    assert error_of(proxy.chat("loc/m1"), 503)["code"] == "provider_circuit_open"
    assert proxy.pinned("key/m1", "key-1").status_code == 503
    assert error_of(proxy.pinned("key/m1", "key-3"), 404)["code"] == "model_not_found"  # not_found lock
    assert (len(a.calls()), len(b.calls())) == calls
    served = proxy.pinned("key/m2", "key-3")
    assert served.status_code == 200
    proxy.settled()


def test_a_connection_pinned_twice_is_asked_about_not_guessed(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """Two X-OmniRoute-Connection headers pinned the request to whichever the proxy read first, in
    silence (found by a docs trial; the management API refuses a repeated query parameter alike)."""
    up = upstreams("loc")
    proxy = launch(provider("loc", "local", up.url, "loc-1", "loc-2"))
    twice = proxy.http.post(
        CHAT_PATH,
        json=chat("loc/m1"),
        headers=[("X-OmniRoute-Connection", "loc-1"), ("X-OmniRoute-Connection", "loc-2")],
    )
    assert error_of(twice, 400)["message"] == "X-OmniRoute-Connection is given more than once; give one"
    assert up.calls() == []
    (record,) = proxy.http.get("/api/requests").json()["requests"]
    assert (record["state"], record["status"], record["code"]) == ("failed", 400, "invalid_request")
    assert proxy.pinned("loc/m1", "loc-2").headers["x-omniroute-selected-connection-id"] == "loc-2"
