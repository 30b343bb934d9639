"""Chaos with real replicas: a probe owner killed, Redis restarted under traffic, Redis cut off.

Each run checks what a client of the fleet sees (no request lost) and what the fleet ends up
knowing (one state, reconciled).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

import httpx
import redis

from tests.fakes.upstream import FakeUpstream, Reply
from tests.fleet.conftest import REDIS_URL, Fleet, OwnRedis, Replica, TcpGate, wait_for

NO_WAITING = {"comboCooldownWait": {"enabled": False}}


def connected(replica: Replica) -> bool:
    return bool(replica.health()["stateBackend"]["connected"])


def chat_calls(fake: FakeUpstream, since: int = 0) -> int:
    return sum(1 for r in fake.requests[since:] if r.path.endswith("/chat/completions"))


def test_killing_the_replica_that_holds_the_probe_lets_another_probe_once_its_lease_expires(
    make_fleet: Callable[..., Fleet],
    upstream: tuple[FakeUpstream, str],
    redis_client: redis.Redis,
    prefix: str,
) -> None:
    fake, _ = upstream
    lease_ms = 2000  # the probe timeout (server.first_byte_timeout_ms) is the lease's length
    fleet = make_fleet(3, disable_cooling=True, first_byte_timeout_ms=lease_ms)
    a, b, c = fleet[0], fleet[1], fleet[2]
    assert (
        a.patch(
            "/api/resilience", {**NO_WAITING, "providerBreaker": {"local": {"resetTimeoutMs": 1000}}}
        ).status_code
        == 200
    )
    for replica in (b, c):
        wait_for(
            lambda r=replica: (
                r.client.get("/api/resilience").json()["providerBreaker"]["local"]["resetTimeoutMs"] == 1000
            ),
            1,
            f"settings on {replica.name}",
        )
    fake.default(Reply("error", status=503))
    a.chat()
    for replica in fleet.replicas:
        wait_for(lambda r=replica: r.breaker()["state"] == "OPEN", 1, f"OPEN on {replica.name}")

    # A takes the probe, and the upstream never answers it.
    fake.default(Reply("hang"))
    wait_for(lambda: a.breaker()["state"] == "HALF_OPEN", 3, "the reset timeout elapsed")
    probe = threading.Thread(target=lambda: _quietly(a.chat), daemon=True)
    probe.start()
    lease = wait_for(lambda: redis_client.get(f"{prefix}probe:alpha"), 2, "A holds the lease")
    assert lease.startswith("replica-a:")
    taken_at = time.monotonic()
    a.kill()

    fake.default(Reply("json"))
    before = chat_calls(fake)
    # Until the dead owner's lease expires, nobody else probes.
    assert b.chat().status_code == 503 and c.chat().status_code == 503
    assert chat_calls(fake, before) == 0

    def closed_by_another_probe() -> bool:
        return b.chat().status_code == 200

    wait_for(closed_by_another_probe, lease_ms / 1000 + 3, "B probes once the lease expired", step=0.05)
    assert time.monotonic() - taken_at >= lease_ms / 1000 - 0.2
    for replica in (b, c):
        wait_for(lambda r=replica: r.breaker()["state"] == "CLOSED", 1, f"CLOSED on {replica.name}")
    assert chat_calls(fake, before) == 1  # one probe, then the requests of a CLOSED provider
    fake.reset()


def _quietly(call: Callable[[], object]) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the replica was killed under it
        call()


class Traffic:
    """A client spreading requests round-robin over the replicas until stopped; counts the answers."""

    def __init__(self, replicas: list[Replica]) -> None:
        self.replicas = replicas
        self.statuses: list[int] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            replica = self.replicas[i % len(self.replicas)]
            i += 1
            try:
                self.statuses.append(replica.chat().status_code)
            except httpx.HTTPError as exc:
                self.errors.append(repr(exc))
            time.sleep(0.005)


def test_redis_restarted_under_traffic_loses_no_request_and_the_state_is_reconciled(
    make_fleet: Callable[..., Fleet], own_redis: OwnRedis, upstream: tuple[FakeUpstream, str]
) -> None:
    fake, _ = upstream
    fleet = make_fleet(3, backend=own_redis.url)
    a = fleet[0]
    assert (
        a.patch("/api/resilience", {"providerBreaker": {"local": {"failureThreshold": 50}}}).status_code
        == 200
    )
    with Traffic(fleet.replicas) as traffic:
        wait_for(lambda: len(traffic.statuses) > 20, 10, "traffic flows")
        own_redis.stop()
        wait_for(lambda: not any(connected(r) for r in fleet.replicas), 5, "every replica notices")
        served_while_away = len(traffic.statuses)
        wait_for(lambda: len(traffic.statuses) > served_while_away + 20, 10, "traffic flows without Redis")
        own_redis.start()
        wait_for(lambda: all(connected(r) for r in fleet.replicas), 10, "every replica reconnects")
        served = len(traffic.statuses)
        wait_for(lambda: len(traffic.statuses) > served + 20, 10, "traffic flows after")
    assert traffic.errors == []
    assert set(traffic.statuses) == {200}, sorted(set(traffic.statuses))
    # Reconciled: the settings acknowledged before Redis left are the fleet's again.
    client = redis.Redis.from_url(own_redis.url, decode_responses=True)
    stored = client.hget(f"{fleet.prefix}settings", "r")
    assert stored is not None and '"failureThreshold":50' in stored
    del fake


def test_a_partition_then_heal_under_traffic(
    make_fleet: Callable[..., Fleet], gates: Callable[[int], TcpGate], upstream: tuple[FakeUpstream, str]
) -> None:
    fake, _ = upstream
    gate = gates(6379)
    fleet = make_fleet(0, provider_class="apikey")
    a = fleet.add("a", backend=gate.url)
    b = fleet.add("b", backend=REDIS_URL)
    fleet.configure(NO_WAITING)
    with Traffic([a, b]) as traffic:
        wait_for(lambda: len(traffic.statuses) > 10, 10, "traffic flows")
        gate.cut(drop=True)
        wait_for(lambda: not connected(a), 5, "A notices the partition")
        # While A is cut off, B learns of a cooldown; A does not (it cannot).
        fake.script(Reply("error", status=429, headers={"retry-after": "60"}))
        wait_for(
            lambda: (
                b.connection("alpha-1")["status"] == "cooling"
                or a.connection("alpha-1")["status"] == "cooling"
            ),
            5,
            "a 429 was seen",
        )
        gate.heal()
        wait_for(lambda: connected(a), 10, "A reconnects")
        wait_for(
            lambda: (
                a.connection("alpha-1")["status"] == "cooling"
                and b.connection("alpha-1")["status"] == "cooling"
            ),
            1,
            "one state again",
        )
    assert traffic.errors == []
    assert set(traffic.statuses) == {200}
