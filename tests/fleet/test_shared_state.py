"""What three replicas sharing one Redis promise (docs/fleet.md#what-is-shared), as real processes.

Each test starts real `omniroute serve` replicas on loopback ports with the same config, a fake
upstream they all route to, and the machine's Redis under a key prefix of the test's own. A client
spreads requests round-robin, as a load balancer would. Propagation is measured from the moment
the triggering response is back to the moment another replica shows the change, by polling it.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.upstream import FakeUpstream, Reply
from tests.fleet.conftest import (
    PROPAGATION_S,
    REDIS_URL,
    TOKEN,
    Fleet,
    Replica,
    fleet_config,
    holds,
    wait_for,
)
from tests.instances import OMNIROUTE, environment
from tests.processes import free_port

NO_WAITING = {"comboCooldownWait": {"enabled": False}}
"""Answer at once when nothing is eligible: the tests watch the state, not the waiting."""


def propagates(replica: Replica, condition: Callable[[Replica], bool], what: str) -> float:
    """Seconds until `condition(replica)` holds (AssertionError beyond a second)."""
    start = time.monotonic()
    wait_for(lambda: condition(replica), 1.0, what, step=0.002)
    return time.monotonic() - start


def upstream_calls(fake: FakeUpstream, since: int = 0) -> int:
    return sum(1 for r in fake.requests[since:] if r.path.endswith("/chat/completions"))


def test_a_provider_failing_everywhere_opens_once_probes_once_fleet_wide_and_closes_once(
    make_fleet: Callable[..., Fleet], upstream: tuple[FakeUpstream, str]
) -> None:
    fake, _ = upstream
    fleet = make_fleet(3, disable_cooling=True)
    fleet.configure({**NO_WAITING, "providerBreaker": {"local": {"resetTimeoutMs": 1000}}})

    fake.default(Reply("error", status=503))
    answers = [fleet.next().chat().status_code for _ in range(3)]
    assert set(answers) == {503}
    for replica in fleet.replicas:
        wait_for(lambda r=replica: r.breaker()["state"] == "OPEN", 1.0, f"OPEN on {replica.name}")
    # Once the fleet knows, no replica sends the provider anything until the probe.
    before = upstream_calls(fake)
    assert {fleet.next().chat().status_code for _ in range(6)} == {503}
    assert upstream_calls(fake) == before
    for replica in fleet.replicas:
        opened = [e for e in replica.events("breaker", "alpha") if e["to"] == "OPEN"]
        assert len(opened) == 1, (replica.name, replica.events("breaker"))

    # The probe: the upstream now answers slowly (and well). While it is in flight, requests on every
    # replica find the fleet's one probe taken: exactly one request reaches the upstream.
    fake.default(Reply("slow_headers", delay_ms=1500))
    wait_for(lambda: fleet[1].breaker()["state"] == "HALF_OPEN", 3.0, "HALF_OPEN after the reset timeout")
    before = len(fake.requests)
    results: list[int] = []

    def send(replica: Replica) -> None:
        results.append(replica.chat().status_code)

    threads = [threading.Thread(target=send, args=(fleet.replicas[i % 3],)) for i in range(9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert upstream_calls(fake, before) == 1
    assert sorted(results) == [200] + [503] * 8, results

    for replica in fleet.replicas:
        wait_for(lambda r=replica: r.breaker()["state"] == "CLOSED", 1.0, f"CLOSED on {replica.name}")
        # The probe's owner took the new state at once; its event comes back through the feed.
        wait_for(
            lambda r=replica: any(e["to"] == "CLOSED" for e in r.events("breaker", "alpha")),
            1.0,
            f"the CLOSED event on {replica.name}",
        )
        closed = [e for e in replica.events("breaker", "alpha") if e["to"] == "CLOSED"]
        assert [e["reason"] for e in closed] == ["probe_succeeded"], [
            (r.name, [(e["from"], e["to"], e["reason"]) for e in r.events("breaker")]) for r in fleet.replicas
        ]
        assert len([e for e in replica.events("breaker", "alpha") if e["to"] == "OPEN"]) == 1


def test_a_429_seen_by_one_replica_keeps_the_others_off_that_key_within_100_ms(
    make_fleet: Callable[..., Fleet], upstream: tuple[FakeUpstream, str]
) -> None:
    fake, _ = upstream
    fleet = make_fleet(3, provider_class="apikey")
    fleet.configure(NO_WAITING)
    fake.script(Reply("error", status=429, headers={"retry-after": "30"}))

    response = fleet[0].chat()
    assert response.status_code == 200  # alpha-1 said 429, alpha-2 served
    assert response.headers["x-omniroute-selected-connection-id"] == "alpha-2"
    for replica in fleet.replicas[1:]:
        took = propagates(
            replica, lambda r: r.connection("alpha-1")["status"] == "cooling", "alpha-1 cooling"
        )
        assert took <= PROPAGATION_S, f"{replica.name} saw the cooldown after {took * 1000:.0f} ms"
        assert replica.connection("alpha-1")["cooldownRemainingMs"] > 25_000  # the hint's 30 s, fleet-wide
    before = upstream_calls(fake)
    for replica in (fleet[1], fleet[2]):
        served = replica.chat()
        assert served.status_code == 200
        assert served.headers["x-omniroute-selected-connection-id"] == "alpha-2"
    assert upstream_calls(fake, before) == 0 or all(
        r.headers.get("authorization", "").endswith("bbbb") for r in fake.requests[before:]
    )


def test_a_lockout_on_one_replica_is_every_replicas_lockout(
    make_fleet: Callable[..., Fleet], upstream: tuple[FakeUpstream, str]
) -> None:
    fake, _ = upstream
    fleet = make_fleet(3)
    fleet.configure(NO_WAITING)
    fleet.configure({"modelLockout": {"enabled": True}}, "/api/settings")
    fake.by_model("m2", Reply("error", status=404))

    assert fleet[0].chat("alpha/m2").status_code == 404
    for replica in fleet.replicas[1:]:
        took = propagates(
            replica,
            lambda r: len(r.client.get("/api/resilience/model-cooldowns").json()["items"]) == 2,
            "both connections locked for m2",
        )
        assert took <= PROPAGATION_S
    before = upstream_calls(fake)
    assert fleet[1].chat("alpha/m2").status_code == 404  # from the shared lockout, not the upstream
    assert upstream_calls(fake, before) == 0
    assert fleet[2].chat("alpha/m1").status_code == 200  # the other model still serves


def test_a_settings_patch_on_one_replica_is_live_on_another_within_100_ms(
    make_fleet: Callable[..., Fleet],
) -> None:
    fleet = make_fleet(3)
    response = fleet[0].patch("/api/resilience", {"providerBreaker": {"local": {"failureThreshold": 9}}})
    assert response.status_code == 200
    took = propagates(fleet[2], lambda r: r.breaker()["failureThreshold"] == 9, "the new threshold on C")
    assert took <= PROPAGATION_S
    # The settings events say what changed, once on each replica.
    for replica in fleet.replicas:
        wait_for(
            lambda r=replica: [e["to"] for e in r.events("settings")] == ["9"],
            1.0,
            f"one settings event on {replica.name}",
        )


def test_two_replicas_patching_at_once_both_changes_survive(make_fleet: Callable[..., Fleet]) -> None:
    fleet = make_fleet(2)
    results: list[int] = []
    patches = [
        (fleet[0], {"providerBreaker": {"local": {"failureThreshold": 9}}}),
        (fleet[1], {"connectionCooldown": {"local": {"baseCooldownMs": 4321}}}),
    ]
    threads = [
        threading.Thread(target=lambda r=r, p=p: results.append(r.patch("/api/resilience", p).status_code))
        for r, p in patches
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [200, 200]
    for replica in fleet.replicas:
        wait_for(
            lambda r=replica: holds(
                r.client.get("/api/resilience").json(),
                {
                    "providerBreaker": {"local": {"failureThreshold": 9}},
                    "connectionCooldown": {"local": {"baseCooldownMs": 4321}},
                },
            ),
            1.0,
            f"both changes on {replica.name}",
        )


def test_an_operator_reset_on_one_replica_is_seen_by_another_replicas_console(
    make_fleet: Callable[..., Fleet], upstream: tuple[FakeUpstream, str]
) -> None:
    fake, _ = upstream
    fleet = make_fleet(3, disable_cooling=True)
    fleet.configure(NO_WAITING)
    fake.default(Reply("error", status=503))
    fleet[0].chat()
    wait_for(lambda: fleet[0].breaker()["state"] == "OPEN", 1.0, "OPEN")

    # A's console: the live stream it attaches to (`omniroute tui --url`).
    seen: list[dict[str, Any]] = []
    ready = threading.Event()

    def watch() -> None:
        with (
            httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10) as client,
            client.stream("GET", f"{fleet[0].url}/api/stream", params={"kinds": "event,state"}) as response,
        ):
            for line in response.iter_lines():
                if line.startswith("data:"):
                    message = json.loads(line[5:])
                    seen.append(message)
                    ready.set()
                    events = _events(seen)
                    if any(e["layer"] == "breaker" and e["to"] == "CLOSED" for e in events) and any(
                        e["layer"] == "operator" for e in events
                    ):
                        return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    ready.wait(5)
    assert fleet[1].client.post("/api/resilience/reset", json={"provider": "alpha"}).status_code == 200
    watcher.join(5)
    events = _events(seen)
    assert any(e["layer"] == "operator" and e["key"] == "reset breaker alpha" for e in events), events
    assert any(e["layer"] == "breaker" and e["to"] == "CLOSED" and e["reason"] == "operator" for e in events)
    assert fleet[0].breaker()["state"] == "CLOSED"
    assert fleet[2].breaker()["state"] == "CLOSED"


def _events(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for m in messages:
        if "layer" in m:
            found.append(m)
        elif isinstance(m.get("event"), dict):
            found.append(m["event"])
    return found


def test_disabling_a_connection_on_one_replica_disables_it_everywhere(
    make_fleet: Callable[..., Fleet], upstream: tuple[FakeUpstream, str]
) -> None:
    fleet = make_fleet(3)
    assert fleet[2].client.put("/api/providers/alpha-1", json={"isActive": False}).status_code == 200
    for replica in fleet.replicas[:2]:
        assert (
            propagates(replica, lambda r: r.connection("alpha-1")["status"] == "disabled", "disabled")
            <= PROPAGATION_S
        )
        assert replica.chat().headers["x-omniroute-selected-connection-id"] == "alpha-2"


def test_health_names_the_backend_and_the_replicas(make_fleet: Callable[..., Fleet]) -> None:
    fleet = make_fleet(3)
    ids = {f"replica-{r.name}" for r in fleet.replicas}

    def all_listed() -> bool:
        listed = fleet[0].health()["fleet"]["replicas"]
        return {r["id"] for r in listed} == ids

    wait_for(all_listed, 3.0, "every replica in the Replicas list")
    health = fleet[0].health()
    assert health["stateBackend"]["kind"] == "redis" and health["stateBackend"]["connected"] is True
    assert health["fleet"]["replica"] == "replica-a"
    for entry in health["fleet"]["replicas"]:
        assert set(entry) >= {"id", "address", "uptimeMs", "inFlight", "lastSeen"}
    assert {e["address"] for e in health["fleet"]["replicas"]} == {r.url for r in fleet.replicas}


def test_a_replica_whose_config_differs_from_its_fleets_refuses_to_start_naming_the_difference(
    make_fleet: Callable[..., Fleet], tmp_path: Path, prefix: str, upstream: tuple[FakeUpstream, str]
) -> None:
    make_fleet(1)
    port = free_port()
    config = fleet_config(
        tmp_path, port, upstream[1], prefix=prefix, extra='\n[combos.fast]\ntargets = ["alpha/m1"]\n'
    )
    import subprocess

    result = subprocess.run(
        [*OMNIROUTE, "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment(),
    )
    assert result.returncode == 2, result.stderr
    assert "combo fast only in this replica" in result.stderr
    assert f"the replicas sharing {REDIS_URL} with key_prefix" in result.stderr  # the database too
    assert "Traceback" not in result.stderr


def test_a_replica_with_the_id_of_a_live_one_refuses_to_start_and_a_restart_after_a_crash_starts(
    make_fleet: Callable[..., Fleet], tmp_path: Path, prefix: str, upstream: tuple[FakeUpstream, str]
) -> None:
    """Two replicas under one id each skipped the other's changes as their own: settings stopped
    syncing, then a settings change on one waited forever. The second refuses to start; the same
    id after a `kill -9` (its key outlives it for seconds, unrefreshed) starts."""
    import subprocess

    first = make_fleet(1).replicas[0]
    config = fleet_config(tmp_path, free_port(), upstream[1], prefix=prefix)
    result = subprocess.run(
        [*OMNIROUTE, "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env=first.env,
    )
    assert result.returncode == 2, result.stderr
    assert f"replica id 'replica-{first.name}' is already live" in result.stderr
    assert "Traceback" not in result.stderr
    assert first.health()["status"]  # the first one serves on
    first.kill()
    port = free_port()
    again = Replica(
        "again",
        port,
        fleet_config(tmp_path, port, upstream[1], prefix=prefix),
        tmp_path / "again.log",
        first.env,
    )
    try:
        again.start()
    finally:
        again.stop()


def test_the_environment_chooses_the_backend_over_the_file(
    tmp_path: Path, prefix: str, upstream: tuple[FakeUpstream, str]
) -> None:
    port = free_port()
    config = fleet_config(tmp_path, port, upstream[1], prefix=prefix, backend="sqlite")
    replica = Replica(
        "env",
        port,
        config,
        tmp_path / "env.log",
        environment(
            OMNIROUTE_STATE_BACKEND="redis://127.0.0.1:6379/0", OMNIROUTE_STATE=str(tmp_path / "s.db")
        ),
    )
    try:
        replica.start()
        assert replica.health()["stateBackend"]["kind"] == "redis"
    finally:
        replica.stop()
    assert not (tmp_path / "s.db").exists()  # a fleet's replica keeps no state file


@pytest.mark.parametrize("value", ["mysql://x", "redis:"])
def test_a_bad_backend_in_the_environment_is_refused(tmp_path: Path, value: str) -> None:
    import subprocess

    result = subprocess.run(
        [*OMNIROUTE, "serve", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment(OMNIROUTE_STATE_BACKEND=value, OMNIROUTE_STATE=str(tmp_path / "s.db")),
    )
    assert result.returncode == 2
    assert "OMNIROUTE_STATE_BACKEND" in result.stderr and "Traceback" not in result.stderr


def test_an_operator_on_one_replica_frees_the_requests_waiting_on_another(
    make_fleet: Callable[..., Fleet], upstream: tuple[FakeUpstream, str]
) -> None:
    """A request on B waits out both keys' cooldown (a minute); the operator resets a key through A,
    and B's request is served at once; another waits, the operator turns waits off through A, and
    it is answered at once."""
    fake, _ = upstream
    fleet = make_fleet(2, provider_class="apikey")  # (an API key honours Retry-After: 60 s)
    a, b = fleet[0], fleet[1]

    def waiting_on_b() -> tuple[threading.Thread, list[httpx.Response]]:
        fake.default(Reply("error", status=429, headers={"Retry-After": "60"}))
        answers: list[httpx.Response] = []
        thread = threading.Thread(target=lambda: answers.append(b.chat()), daemon=True)
        thread.start()
        wait_for(
            lambda: any(r["state"] == "waiting" for r in b.client.get("/api/requests").json()["requests"]),
            5,
            "a request waiting on B",
        )
        return thread, answers

    thread, answers = waiting_on_b()
    fake.default(Reply("json"))
    assert a.client.post("/api/resilience/connections/alpha-1/reset").status_code == 200
    thread.join(5)
    assert [r.status_code for r in answers] == [200]

    thread, answers = waiting_on_b()
    assert a.patch("/api/resilience", NO_WAITING).status_code == 200
    thread.join(5)
    assert [r.status_code for r in answers] == [429]


@pytest.mark.parametrize("glob", ["[eu]", "*", "?"])
def test_a_key_prefix_with_glob_characters_finds_its_fleets_keys_and_no_others(
    tmp_path: Path, redis_client: Any, upstream: tuple[FakeUpstream, str], glob: str
) -> None:
    """The replicas found their keys with `SCAN MATCH <prefix>...*`, unescaped: with `team[eu]:`
    a replica started later found none of its fleet's records (a connection it had marked expired
    was active there) nor its replicas; with `*` or `?`, another fleet's too."""
    fake, url = upstream
    base = f"omniroute-test:{uuid.uuid4().hex[:10]}"
    prefix = f"{base}{glob}:"
    # Another fleet whose prefix the glob would match, with a connection of the same id expired.
    neighbour = f"{base}{'e' if glob == '[eu]' else 'x'}:"
    redis_client.hset(f"{neighbour}c:alpha-2", mapping={"v": 1, "r": json.dumps({"terminal": "expired"})})
    fleet = Fleet(tmp_path, url, prefix, provider_class="apikey")
    try:
        a = fleet.add("a")
        fleet.configure(NO_WAITING)
        fake.script(Reply("error", status=401))
        assert a.chat().status_code == 200  # alpha-1 expired, alpha-2 served
        assert a.connection("alpha-1")["status"] == "expired"
        b = fleet.add("b")
        wait_for(lambda: len(b.health()["fleet"]["replicas"]) == 2, 3, "both replicas listed")
        assert b.connection("alpha-1")["status"] == "expired"
        assert b.connection("alpha-2")["status"] == "active"
    finally:
        fleet.stop()
        for key in redis_client.scan_iter(match=f"{base}*", count=1000):
            redis_client.delete(key)
