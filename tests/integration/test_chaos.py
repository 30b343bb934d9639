"""Chaos: every promise holds when upstreams misbehave and clients walk away (issue #9, the proof).

A real proxy (uvicorn, SQLite state, the system clock) in front of two fault-injecting fake
upstreams, driven by clients that hang up at random points. Upstream faults, from a seeded script:
502 bursts, 429s, resets before and after the headers, hangs, slow headers, streams that die,
streams that only ping, slow drips, 200s that are not JSON and 5 MB bodies. Client behaviours:
wait for the answer, read a stream to its end, hang up before the headers (possibly while waiting
for a concurrency slot, a request-queue turn or a cooldown), or hang up mid-stream.

Two short phases first make sure the rarest cases happen at least once (a client leaving while it
waits for a semaphore slot, and while it waits out a cooldown), then the random phase mixes
everything. Afterwards:

- every request that stayed ended with an answer or a well-formed error (an OpenAI-style JSON
  error, or a stream that ends with `data: [DONE]`), and none hung;
- nothing is left behind: `inFlight` is 0 on every connection (the API's view and the engine's),
  no limiter or semaphore slot is held or waited for, no breaker holds a probe, no request is
  counted in flight, and both upstreams have no request open (the proxy let go of every socket);
- the events show exactly one `fail_open` per request that went ahead without a slot.

Bounded: a fixed seed, a fixed number of requests, deadlines on every wait, < 60 s in all.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.app import create_app
from proxy.config import load_config
from proxy.resilience import semaphore as semaphore_module
from proxy.resilience.breaker import BreakerState
from proxy.resilience.events import Event
from proxy.runtime import Runtime
from proxy.sse import SSEParser
from tests.fakes import FakeUpstream, LiveServer, Reply

SEED = 20261201
RANDOM_REQUESTS = 240
CLIENT_CONCURRENCY = 24
REQUEST_DEADLINE_S = 20.0  # far above the worst legitimate answer (hang 1.5 s + waits + fallbacks)
TEST_BUDGET_S = 60.0

CONFIG = """
[server]
connect_timeout_ms = 1000
first_byte_timeout_ms = 1500
idle_timeout_ms = 1500

[providers.flaky]
class = "local"
base_url = "{a}"

[[providers.flaky.connections]]
id = "flaky-1"
priority = 1
max_concurrent = 2

[[providers.flaky.connections]]
id = "flaky-2"
priority = 2
max_concurrent = 3

[providers.keyed]
class = "apikey"
base_url = "{b}"

[[providers.keyed.connections]]
id = "keyed-1"
api_key = "sk-chaos-1"
priority = 1

[[providers.keyed.connections]]
id = "keyed-2"
api_key = "sk-chaos-2"
priority = 2
max_concurrent = 2

[combos.mix]
strategy = "priority"
targets = ["flaky/m1", "keyed/m1"]
"""

SETTINGS: dict[str, dict[str, Any]] = {
    "resilience": {
        "requestQueue": {
            "minTimeBetweenRequestsMs": 0,
            "requestsPerMinute": 100_000,
            "concurrentRequests": 3,
            "maxQueueDepth": 6,
            "maxWaitMs": 3000,
        },
        "connectionCooldown": {
            "local": {"baseCooldownMs": 200, "maxBackoffSteps": 2},
            "apikey": {"baseCooldownMs": 200, "maxBackoffSteps": 2, "useUpstreamRetryHints": False},
        },
        "providerBreaker": {
            "local": {"degradationThreshold": 3, "failureThreshold": 6, "resetTimeoutMs": 1000},
            "apikey": {"degradationThreshold": 4, "failureThreshold": 8, "resetTimeoutMs": 1000},
        },
        "comboCooldownWait": {"enabled": True, "maxWaitMs": 1500, "maxAttempts": 3, "budgetMs": 3000},
        "quotaShareConcurrencyLimit": {"enabled": True, "queueDepth": 2, "queueTimeoutMs": 2000},
        # On, so that streams which only ping end (pings keep the idle timeout from firing).
        "streamRecovery": {
            "throughputWatchdog": {
                "enabled": True,
                "warmupMs": 500,
                "windowMs": 1000,
                "minUsefulBytesPerSecond": 1,
                "minUsefulBytes": 1,
            }
        },
        "sessionAffinity": {"ttlMs": 5000},
    }
}

# (weight, replies): one draw scripts these replies in a row.
FAULTS: list[tuple[int, tuple[Reply, ...]]] = [
    (30, (Reply("json"),)),
    (14, (Reply("stream", chunks=5, delay_ms=20),)),
    (6, tuple(Reply("error", status=502) for _ in range(3))),  # a 502 burst
    (4, (Reply("error", status=429),)),
    (4, (Reply("reset"),)),
    (4, (Reply("reset_after_headers"),)),
    (2, (Reply("hang"),)),
    (4, (Reply("slow_headers", delay_ms=300),)),
    (4, (Reply("stream_die", die_after=2, delay_ms=20),)),
    (2, (Reply("stream_pings", delay_ms=100),)),
    (5, (Reply("drip", chunks=5, drip_bytes=40, delay_ms=5),)),
    (4, (Reply("invalid_json"),)),
    (1, (Reply("big"),)),
]
MODELS = [(60, "mix"), (15, "flaky/m1"), (15, "keyed/m1"), (10, "m1")]
BEHAVIOURS = [
    (35, "answer"),
    (25, "stream"),
    (15, "leave_early"),
    (10, "leave_waiting"),
    (15, "leave_mid_stream"),
]


def pick(rng: random.Random, table: list[tuple[int, Any]]) -> Any:
    return rng.choices([item for _, item in table], weights=[w for w, _ in table])[0]


def script(fake: FakeUpstream, rng: random.Random, count: int) -> None:
    replies: list[Reply] = []
    while len(replies) < count:
        replies.extend(pick(rng, FAULTS))
    fake.script(*replies)


async def until(
    condition: Callable[[], bool], timeout: float, what: str, state: Callable[[], object] = lambda: ""
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what} {state()}"
        await asyncio.sleep(0.005)


# -- the system under test ------------------------------------------------------------------------


@dataclass
class Chaos:
    runtime: Runtime
    proxy: LiveServer
    a: FakeUpstream
    b: FakeUpstream
    events: list[Event] = field(default_factory=list)
    fail_opens: Counter[str] = field(default_factory=Counter)

    @property
    def url(self) -> str:
        return self.proxy.url


@pytest.fixture
def chaos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Chaos]:
    a, b = FakeUpstream("upstream-a"), FakeUpstream("upstream-b")
    servers = [LiveServer(a.app).start(), LiveServer(b.app).start()]
    config_path = tmp_path / "config.toml"
    config_path.write_text(CONFIG.format(a=servers[0].url + "/v1", b=servers[1].url + "/v1"))
    config_path.chmod(0o600)
    runtime = Runtime.open(load_config(config_path, {}, explicit=True), tmp_path / "state.db", env={})
    for group, patch in SETTINGS.items():
        runtime.settings.patch(patch, group)
    fail_opens: Counter[str] = Counter()
    original = semaphore_module.ConnectionSemaphore._fail_open

    def counted(self: semaphore_module.ConnectionSemaphore, reason: str) -> None:
        fail_opens[self._key] += 1  # every request that goes ahead without a slot passes here
        original(self, reason)

    monkeypatch.setattr(semaphore_module.ConnectionSemaphore, "_fail_open", counted)
    state = Chaos(runtime, LiveServer(create_app(runtime), lifespan="on"), a, b, fail_opens=fail_opens)
    runtime.bus.subscribe(state.events.append)
    state.proxy.start()
    try:
        yield state
    finally:
        a.reset()  # cut what still hangs or pings, so every server stops at once
        b.reset()
        state.proxy.stop()
        for server in servers:
            server.stop()


# -- clients --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    behaviour: str
    outcome: str  # answered | error | left | broken | hung
    detail: str = ""


def _check_error(status: int, body: bytes) -> str | None:
    """None if `body` is a well-formed error answer, else what is wrong with it."""
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return f"{status} with a body that is not a JSON error: {body[:200]!r}"
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return f"{status} with a malformed error object: {body[:200]!r}"
    return None


def _check_stream(body: bytes) -> str | None:
    """None if an SSE body is well-formed and ends with `data: [DONE]`, else what is wrong."""
    events = SSEParser().feed(body)
    if not events or events[-1].data != "[DONE]":
        return f"a stream that does not end with [DONE]: ...{body[-200:]!r}"
    for event in events[:-1]:
        if event.json_object() is None:
            return f"a stream event that is not a JSON object: {event.data[:200]!r}"
    return None


async def one_request(client: httpx.AsyncClient, rng: random.Random, behaviour: str, model: str) -> Result:
    stream = behaviour in ("stream", "leave_mid_stream") or (
        behaviour.startswith("leave") and rng.random() < 0.5
    )
    body = {"model": model, "messages": [{"role": "user", "content": "chaos"}], "stream": stream}
    headers = {"x-session-id": f"session-{rng.randrange(8)}"} if rng.random() < 0.2 else {}
    leave_after_s = {"leave_early": rng.uniform(0.005, 0.3), "leave_waiting": rng.uniform(0.2, 1.5)}.get(
        behaviour
    )
    leave_after_chunks = rng.randint(1, 3)
    try:
        async with asyncio.timeout(leave_after_s if leave_after_s is not None else REQUEST_DEADLINE_S):
            async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
                chunks: list[bytes] = []
                async for chunk in response.aiter_raw():
                    chunks.append(chunk)
                    if behaviour == "leave_mid_stream" and len(chunks) >= leave_after_chunks:
                        return Result(behaviour, "left", "mid-stream")
                raw = b"".join(chunks)
                if response.status_code >= 400:
                    problem = _check_error(response.status_code, raw)
                    return Result(
                        behaviour, "broken" if problem else "error", problem or str(response.status_code)
                    )
                if response.headers.get("content-type", "").startswith("text/event-stream"):
                    problem = _check_stream(raw)
                    if problem:
                        return Result(behaviour, "broken", problem)
                return Result(behaviour, "answered")
    except TimeoutError:
        if leave_after_s is not None:
            return Result(behaviour, "left", "before the answer ended")
        return Result(behaviour, "hung", f"no answer within {REQUEST_DEADLINE_S} s")
    except httpx.HTTPError as exc:
        return Result(behaviour, "broken", f"{type(exc).__name__}: {exc}")


# -- invariants -----------------------------------------------------------------------------------


def _probe_held(chaos: Chaos) -> list[str]:
    now = chaos.runtime.engine.clock.now()
    held = []
    for pid, provider in chaos.runtime.engine.providers.items():
        breaker = provider.breaker
        if breaker.state(now) is BreakerState.HALF_OPEN and (
            not breaker.can_execute(now) or getattr(breaker, "_probe_until", None) is not None
        ):
            held.append(pid)
    return held


def _state(chaos: Chaos) -> dict[str, object]:
    engine = chaos.runtime.engine
    return {
        "requests in flight": engine.stats.in_flight,
        "upstream a in flight": chaos.a.in_flight,
        "upstream b in flight": chaos.b.in_flight,
        "connections": {
            c.id: {
                "in_flight": c.in_flight,
                "limiter": None if c.limiter is None else (c.limiter.running, c.limiter.queued),
                "semaphore": None if c.semaphore is None else (c.semaphore.in_use, c.semaphore.waiting),
            }
            for c in engine.connections.values()
        },
    }


def _idle(chaos: Chaos) -> bool:
    engine = chaos.runtime.engine
    return (
        engine.stats.in_flight == 0
        and chaos.a.in_flight == 0
        and chaos.b.in_flight == 0
        and all(
            c.in_flight == 0
            and (c.limiter is None or (c.limiter.running == 0 and c.limiter.queued == 0))
            and (c.semaphore is None or (c.semaphore.in_use == 0 and c.semaphore.waiting == 0))
            for c in engine.connections.values()
        )
    )


async def assert_nothing_left_behind(chaos: Chaos, client: httpx.AsyncClient) -> None:
    await until(
        lambda: _idle(chaos),
        15.0,
        "every request, slot and upstream socket to be released",
        lambda: _state(chaos),
    )
    connections = (await client.get("/api/resilience/connections")).json()["connections"]
    assert {c["id"]: c["inFlight"] for c in connections} == dict.fromkeys(
        ("flaky-1", "flaky-2", "keyed-1", "keyed-2"), 0
    )
    health = (await client.get("/api/monitoring/health")).json()
    assert health["requests"]["inFlight"] == 0
    assert _probe_held(chaos) == []


# -- the test -------------------------------------------------------------------------------------


async def test_chaos_every_request_ends_and_nothing_is_left_behind(chaos: Chaos) -> None:
    started = time.monotonic()
    rng = random.Random(SEED)
    engine = chaos.runtime.engine
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=16)
    async with httpx.AsyncClient(base_url=chaos.url, timeout=REQUEST_DEADLINE_S, limits=limits) as client:
        # 1. Clients leave while they wait for a semaphore slot. flaky-1 holds 2 slots; the upstream
        #    hangs, so two requests hold them and the next two queue for them.
        chaos.a.default(Reply("hang"))
        pinned = {"x-omniroute-connection": "flaky-1"}
        body = {"model": "flaky/m1", "messages": [{"role": "user", "content": "slot"}]}
        semaphore = engine.connections["flaky-1"].semaphore
        assert semaphore is not None
        waiting = [
            asyncio.create_task(client.post("/v1/chat/completions", json=body, headers=pinned))
            for _ in range(4)
        ]
        await until(
            lambda: semaphore.in_use == 2 and semaphore.waiting == 2, 5.0, "two requests queued for a slot"
        )
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        chaos.a.reset()  # the hangs end; the proxy's attempts fail over or answer 502 to nobody
        await assert_nothing_left_behind(chaos, client)

        # 2. A client leaves while it waits out a cooldown: every connection of the combo fails once
        #    and cools (1 s here), so the request waits instead of answering 429.
        chaos.runtime.settings.patch(
            {"connectionCooldown": {"local": {"baseCooldownMs": 1000}, "apikey": {"baseCooldownMs": 1000}}},
            "resilience",
        )
        chaos.a.burst(2)
        chaos.b.burst(2)
        leaving = asyncio.create_task(
            client.post(
                "/v1/chat/completions", json={"model": "mix", "messages": [{"role": "user", "content": "x"}]}
            )
        )

        def cooling_everywhere() -> bool:
            now = engine.clock.now()
            return all(c.health.status(now) == "cooling" for c in engine.connections.values())

        await until(
            lambda: (
                cooling_everywhere()
                and engine.stats.in_flight == 1
                and chaos.a.in_flight == chaos.b.in_flight == 0
            ),
            5.0,
            "the request to wait out the cooldowns",
        )
        leaving.cancel()
        await asyncio.gather(leaving, return_exceptions=True)
        # It is noticed while waiting (polled every 250 ms), well before the 1 s cooldown is over.
        await until(lambda: engine.stats.in_flight == 0, 0.9, "the waiting request to notice its client left")
        chaos.runtime.settings.patch(SETTINGS["resilience"], "resilience")
        await assert_nothing_left_behind(chaos, client)

        # 3. Everything at once, from a seeded script.
        chaos.a.reset()
        chaos.b.reset()
        script(chaos.a, rng, 1500)
        script(chaos.b, rng, 1500)
        gate = asyncio.Semaphore(CLIENT_CONCURRENCY)

        async def gated(behaviour: str, model: str, seed: int) -> Result:
            async with gate:
                return await one_request(client, random.Random(seed), behaviour, model)

        plan = [
            (pick(rng, BEHAVIOURS), pick(rng, MODELS), rng.randrange(1 << 30)) for _ in range(RANDOM_REQUESTS)
        ]
        results = await asyncio.gather(*(gated(*p) for p in plan))
        await assert_nothing_left_behind(chaos, client)

    summary = Counter((r.behaviour, r.outcome) for r in results)
    bad = [r for r in results if r.outcome in ("broken", "hung")]
    assert bad == [], f"{len(bad)} requests did not end well: {bad[:5]} (all: {dict(summary)})"
    # Whether a leaving client leaves before its answer comes is a race it may lose (the answer can
    # be faster than its timer): a third of the planned leaves is a real share of the run, whatever
    # the machine's speed (49-59 of 92 here; a fixed 40 failed under load). The phases above cover
    # each way of leaving once, deterministically.
    planned = sum(1 for behaviour, _, _ in plan if behaviour.startswith("leave"))
    assert sum(1 for r in results if r.outcome == "left") >= planned // 3, summary
    assert sum(1 for r in results if r.outcome in ("answered", "error")) >= 120, summary

    # One fail-open event per request that went ahead without a slot, on its connection.
    events = Counter(e.key for e in chaos.events if e.layer == "connection" and e.to == "fail_open")
    assert sum(chaos.fail_opens.values()) > 0, "the chaos never saturated a semaphore: make it harder"
    assert events == chaos.fail_opens
    assert time.monotonic() - started < TEST_BUDGET_S
