"""Redis away and back (docs/fleet.md#when-redis-is-away, docs/fleet.md#reconcile), with real replicas.

Replica A reaches Redis through a `TcpGate` the test cuts and heals; replica B reaches it directly.
While A is cut off, both keep serving and each records what it sees; when the gate heals, A
reconciles, and B, which never lost Redis, shows the merged state. One test per rule.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.cli.conftest import run
from tests.fakes.upstream import FakeUpstream, Reply
from tests.fleet.conftest import REDIS_URL, TOKEN, Fleet, OwnRedis, Replica, TcpGate, wait_for

NO_WAITING = {"comboCooldownWait": {"enabled": False}}


def connected(replica: Replica) -> bool:
    return bool(replica.health()["stateBackend"]["connected"])


def split_fleet(
    make_fleet: Callable[..., Fleet], gates: Callable[[int], TcpGate], **config: Any
) -> tuple[Fleet, Replica, Replica, TcpGate]:
    """A (through a gate) and B (direct), with answers at once when nothing is eligible."""
    gate = gates(6379)
    fleet = make_fleet(0, **config)
    a = fleet.add("a", backend=gate.url)
    b = fleet.add("b", backend=REDIS_URL)
    assert a.patch("/api/resilience", NO_WAITING).status_code == 200
    wait_for(
        lambda: b.client.get("/api/resilience").json()["comboCooldownWait"]["enabled"] is False, 1, "settings"
    )
    return fleet, a, b, gate


def cut_off(a: Replica, gate: TcpGate, *, drop: bool = False) -> None:
    gate.cut(drop=drop)
    wait_for(lambda: not connected(a), 5, "A notices it lost Redis")


def heal(a: Replica, gate: TcpGate) -> None:
    gate.heal()
    wait_for(lambda: connected(a), 10, "A is back and reconciled")


def test_a_replica_that_loses_redis_keeps_serving_and_says_so_everywhere(
    make_fleet: Callable[..., Fleet], gates: Callable[[int], TcpGate]
) -> None:
    _, a, b, gate = split_fleet(make_fleet, gates)
    cut_off(a, gate, drop=True)  # packets dropped: A learns it only from its own timeouts
    assert [a.chat().status_code for _ in range(5)] == [200] * 5  # fail-open on its memory tier
    health = a.health()["stateBackend"]
    assert health["kind"] == "redis" and health["connected"] is False and health["since"]
    lost = [e for e in a.events("state") if e["to"] == "disconnected"]
    assert len(lost) == 1 and lost[0]["key"] == "redis"
    status = run("status", "--url", a.url, "--token", TOKEN)
    assert "redis LOST" in status.stdout and "serving on this replica's memory" in status.stdout
    heal(a, gate)
    status = run("status", "--url", a.url, "--token", TOKEN, env={"COLUMNS": "200"})
    assert "redis, connected" in status.stdout and "replica replica-a, " in status.stdout
    assert [e["to"] for e in a.events("state")] == ["disconnected", "connected"]
    assert b.health()["stateBackend"]["connected"] is True


def test_reconcile_deadlines_merge_and_the_later_wins(
    make_fleet: Callable[..., Fleet], gates: Callable[[int], TcpGate], upstream: tuple[FakeUpstream, str]
) -> None:
    fake, _ = upstream
    _, a, b, gate = split_fleet(make_fleet, gates, provider_class="apikey")
    cut_off(a, gate)
    fake.script(Reply("error", status=429, headers={"retry-after": "120"}))
    assert a.chat().status_code == 200  # alpha-1 said 429 (cooling 120 s on A only), alpha-2 served
    fake.script(Reply("error", status=429, headers={"retry-after": "10"}))
    assert b.chat().status_code == 200  # alpha-1 cooling 10 s in Redis
    assert b.connection("alpha-1")["cooldownRemainingMs"] <= 10_000
    heal(a, gate)
    wait_for(
        lambda: b.connection("alpha-1")["cooldownRemainingMs"] > 100_000, 1, "B takes A's later deadline"
    )
    assert a.connection("alpha-1")["cooldownRemainingMs"] > 100_000


def test_reconcile_an_operator_reset_made_meanwhile_clears_what_was_decided_before_it(
    make_fleet: Callable[..., Fleet], gates: Callable[[int], TcpGate], upstream: tuple[FakeUpstream, str]
) -> None:
    """The operator resets a key through B while A, cut off, still cools it for a 429 it saw
    before: A's cooldown does not come back when A does. One A sees after the reset does."""
    fake, _ = upstream
    _, a, b, gate = split_fleet(make_fleet, gates, provider_class="apikey")
    cut_off(a, gate)
    fake.script(Reply("error", status=429, headers={"retry-after": "120"}))
    assert a.chat().status_code == 200  # alpha-1 cooling 120 s on A only
    assert b.client.post("/api/resilience/connections/alpha-1/reset").status_code == 200
    heal(a, gate)
    assert a.connection("alpha-1")["status"] == "active"
    assert b.connection("alpha-1")["status"] == "active"

    cut_off(a, gate)
    assert b.client.post("/api/resilience/connections/alpha-1/reset").status_code == 200
    fake.script(Reply("error", status=429, headers={"retry-after": "120"}))
    assert a.chat().status_code == 200  # after the reset: this cooldown stands
    heal(a, gate)
    wait_for(lambda: b.connection("alpha-1")["status"] == "cooling", 1, "B takes A's later cooldown")
    assert a.connection("alpha-1")["status"] == "cooling"


def test_reconcile_a_terminal_state_wins_over_a_cooldown(
    make_fleet: Callable[..., Fleet], gates: Callable[[int], TcpGate], upstream: tuple[FakeUpstream, str]
) -> None:
    fake, _ = upstream
    _, a, b, gate = split_fleet(make_fleet, gates, provider_class="apikey")
    cut_off(a, gate)
    fake.script(Reply("error", status=401))
    assert a.chat().status_code == 200  # alpha-1: 401 -> expired, on A only
    assert a.connection("alpha-1")["status"] == "expired"
    fake.script(Reply("error", status=429, headers={"retry-after": "30"}))
    assert b.chat().status_code == 200
    assert b.connection("alpha-1")["status"] == "cooling"
    heal(a, gate)
    wait_for(lambda: b.connection("alpha-1")["status"] == "expired", 1, "B takes the terminal state")
    assert a.connection("alpha-1")["status"] == "expired"


def test_reconcile_breaker_counts_take_the_larger(
    make_fleet: Callable[..., Fleet], gates: Callable[[int], TcpGate], upstream: tuple[FakeUpstream, str]
) -> None:
    fake, _ = upstream
    _, a, b, gate = split_fleet(make_fleet, gates, provider_class="apikey", disable_cooling=True)
    cut_off(a, gate)
    fake.default(Reply("error", status=503))
    for _ in range(3):
        a.chat()  # both connections fail each time: 6 failures on A (apikey degrades at 7)
    b.chat()  # 2 failures in Redis
    assert a.breaker()["failureCount"] == 6 and b.breaker()["failureCount"] == 2
    heal(a, gate)
    wait_for(lambda: b.breaker()["failureCount"] == 6, 1, "B takes the larger count")
    assert a.breaker()["failureCount"] == 6


@pytest.mark.parametrize("b_patches_too", [False, True], ids=["only A changed", "both changed"])
def test_reconcile_settings_take_the_highest_version(
    make_fleet: Callable[..., Fleet], gates: Callable[[int], TcpGate], b_patches_too: bool
) -> None:
    _, a, b, gate = split_fleet(make_fleet, gates)
    cut_off(a, gate)
    # Acknowledged by A while away: live on A at once (fail-open).
    assert (
        a.patch("/api/resilience", {"providerBreaker": {"local": {"failureThreshold": 20}}}).status_code
        == 200
    )
    assert a.breaker()["failureThreshold"] == 20
    if b_patches_too:
        # Both wrote one version past the last shared one: a tie, and the fleet's version (B's) wins.
        assert (
            b.patch("/api/resilience", {"providerBreaker": {"local": {"failureThreshold": 30}}}).status_code
            == 200
        )
    heal(a, gate)
    expected = 30 if b_patches_too else 20
    for replica in (a, b):
        wait_for(
            lambda r=replica: r.breaker()["failureThreshold"] == expected, 1, f"{expected} on {replica.name}"
        )


def test_redis_restarted_empty_gets_back_everything_acknowledged_before(
    make_fleet: Callable[..., Fleet], own_redis: OwnRedis, upstream: tuple[FakeUpstream, str]
) -> None:
    fake, _ = upstream
    fleet = make_fleet(2, backend=own_redis.url, provider_class="apikey")
    a, b = fleet[0], fleet[1]
    assert (
        a.patch(
            "/api/resilience", {**NO_WAITING, "providerBreaker": {"apikey": {"failureThreshold": 40}}}
        ).status_code
        == 200
    )
    fake.script(Reply("error", status=429, headers={"retry-after": "300"}))
    assert a.chat().status_code == 200
    wait_for(lambda: b.connection("alpha-1")["status"] == "cooling", 1, "the cooldown is shared")

    own_redis.stop()
    wait_for(lambda: not connected(a) and not connected(b), 5, "both notice")
    own_redis.start()  # same port, no persistence: it comes back empty
    wait_for(lambda: connected(a) and connected(b), 10, "both reconnect")

    # A replica that starts now reads only Redis: it finds what the fleet had acknowledged.
    c = fleet.add("c", backend=own_redis.url)
    assert c.breaker()["failureThreshold"] == 40
    assert c.connection("alpha-1")["status"] == "cooling"
    assert c.connection("alpha-1")["cooldownRemainingMs"] > 250_000


def test_a_write_redis_refuses_once_does_not_keep_the_replica_out_of_the_fleet(
    make_fleet: Callable[..., Fleet], redis_client: Any, prefix: str
) -> None:
    """A command that fails while the change feed's own connection is fine (here a WRONGTYPE reply:
    a key another writer broke; a timeout or an OOM reply alike) puts the replica on its memory
    tier, and the feed's loop, which never failed, must not keep it there: it retries with backoff
    and reconciles, as when Redis itself was away."""
    fleet = make_fleet(0)
    a = fleet.add("a", backend=REDIS_URL)
    key = f"{prefix}b:alpha"
    redis_client.delete(key)
    redis_client.set(key, "not a hash")  # what a breaker write will find
    assert a.client.post("/api/resilience/reset", json={"provider": "alpha"}).status_code == 200
    wait_for(lambda: not connected(a), 5, "A to stop writing to Redis")
    redis_client.delete(key)  # the cause goes away
    wait_for(lambda: connected(a), 10, "A back in the fleet")
    assert [e["to"] for e in a.events("state")] == ["disconnected", "connected"]


# -- Redis behind what the replicas saw (found by a trial of the fleet) -------------------------


def test_after_redis_comes_back_empty_the_replicas_go_on_sharing_what_they_shared_before(
    make_fleet: Callable[..., Fleet], own_redis: OwnRedis, upstream: tuple[FakeUpstream, str]
) -> None:
    """The reconcile wrote each record back at version 1, while each replica kept the higher
    version it had seen: every later write conflicted and was given up (`gave up sharing ...
    after 16 conflicts`), and the other replicas' entries were ignored, until a restart."""
    fake, _ = upstream
    fleet = make_fleet(2, backend=own_redis.url, provider_class="apikey")
    a, b = fleet[0], fleet[1]
    fleet.configure(NO_WAITING)
    for _ in range(2):  # alpha-1's record moves a few versions: a 429 cools it, the operator clears it
        fake.script(Reply("error", status=429, headers={"retry-after": "300"}))
        assert a.chat().status_code == 200
        wait_for(lambda: b.connection("alpha-1")["status"] == "cooling", 1, "the cooldown is shared")
        assert a.client.post("/api/resilience/connections/alpha-1/reset").status_code == 200
        wait_for(lambda: b.connection("alpha-1")["status"] != "cooling", 1, "the reset is shared")

    own_redis.stop()
    wait_for(lambda: not connected(a) and not connected(b), 5, "both notice")
    own_redis.start()  # no persistence: it comes back empty
    wait_for(lambda: connected(a) and connected(b), 10, "both reconnect")

    fake.script(Reply("error", status=429, headers={"retry-after": "300"}))
    assert a.chat().status_code == 200  # served by alpha-2 after alpha-1's 429
    assert a.connection("alpha-1")["status"] == "cooling"
    wait_for(lambda: b.connection("alpha-1")["status"] == "cooling", 1, "A's cooldown reaches B")
    assert b.client.post("/api/resilience/connections/alpha-1/reset").status_code == 200
    wait_for(lambda: a.connection("alpha-1")["status"] != "cooling", 1, "B's reset reaches A")
    assert "gave up sharing" not in a.log.read_text() + b.log.read_text()


def test_after_redis_comes_back_empty_a_settings_change_on_either_replica_is_live_on_the_other(
    make_fleet: Callable[..., Fleet], own_redis: OwnRedis
) -> None:
    """The same for the settings, whose version the first replica to reconcile wrote back as 1:
    a PATCH on it never reached the other, and one on the other never answered (it merged and
    wrote again for ever, holding the settings lock)."""
    fleet = make_fleet(2, backend=own_redis.url)
    a, b = fleet[0], fleet[1]
    for threshold in (11, 12, 13):
        fleet.configure({"providerBreaker": {"local": {"failureThreshold": threshold}}})

    own_redis.stop()
    wait_for(lambda: not connected(a) and not connected(b), 5, "both notice")
    own_redis.start()
    wait_for(lambda: connected(a) and connected(b), 10, "both reconnect")

    for source, target, threshold in ((a, b, 21), (b, a, 22)):
        answer = source.patch(
            "/api/resilience", {"providerBreaker": {"local": {"failureThreshold": threshold}}}
        )
        assert answer.status_code == 200, answer.text
        wait_for(
            lambda t=target, n=threshold: t.breaker()["failureThreshold"] == n,
            1,
            f"the change on {source.name} is live on {target.name}",
        )


def test_a_record_deleted_under_running_replicas_goes_on_being_shared(
    make_fleet: Callable[..., Fleet], redis_client: Any, prefix: str, upstream: tuple[FakeUpstream, str]
) -> None:
    """docs/fleet.md tells the operator to delete a key no replica can read. The running replicas had
    seen its versions: with versions counted from 1 again, a write of either conflicted for good,
    and neither took the other's entries for newer."""
    fake, _ = upstream
    fleet = make_fleet(2, provider_class="apikey")
    a, b = fleet[0], fleet[1]
    fleet.configure(NO_WAITING)
    fake.script(Reply("error", status=429, headers={"retry-after": "300"}))
    assert a.chat().status_code == 200
    wait_for(lambda: b.connection("alpha-1")["status"] == "cooling", 1, "the cooldown is shared")
    assert a.client.post("/api/resilience/connections/alpha-1/reset").status_code == 200
    wait_for(lambda: b.connection("alpha-1")["status"] != "cooling", 1, "the reset is shared")

    assert redis_client.delete(f"{prefix}c:alpha-1") == 1
    fake.script(Reply("error", status=429, headers={"retry-after": "300"}))
    assert a.chat().status_code == 200
    wait_for(lambda: b.connection("alpha-1")["status"] == "cooling", 1, "A's cooldown reaches B")
    assert b.client.post("/api/resilience/connections/alpha-1/reset").status_code == 200
    wait_for(lambda: a.connection("alpha-1")["status"] != "cooling", 1, "B's reset reaches A")


def test_a_reconcile_that_meets_a_broken_record_replaces_it_and_the_replica_is_back(
    make_fleet: Callable[..., Fleet],
    gates: Callable[[int], TcpGate],
    redis_client: Any,
    prefix: str,
    upstream: tuple[FakeUpstream, str],
) -> None:
    """A reconcile that met a record another writer broke raised: the replica stayed `connected:
    false` for ever (even once the key was deleted) and what it decided while away never reached
    the fleet. A broken record reads as none, at the reconcile as at run time, and is replaced."""
    fake, _ = upstream
    _, a, b, gate = split_fleet(make_fleet, gates, provider_class="apikey")
    cut_off(a, gate)
    fake.script(Reply("error", status=429, headers={"retry-after": "300"}))
    assert a.chat().status_code == 200  # A, cut off, cools alpha-1 on its own
    broken = f"{prefix}c:alpha-1"
    redis_client.hset(broken, mapping={"v": 3, "r": "{not json"})
    heal(a, gate)
    wait_for(
        lambda: b.connection("alpha-1")["status"] == "cooling", 1, "A's cooldown from while away reaches B"
    )
    assert json.loads(redis_client.hget(broken, "r"))["rate_limited_until"] is not None
    a.logged(f"the shared record {broken} is unreadable")
