"""Session pins and Responses API owners across a fleet (docs/fleet.md#what-is-shared), as real
replicas: a session pinned through one replica is honoured by the next request on another, a
session that moved follows its current pin, a response created through one replica is reached
through any other, and a replica cut off from Redis goes on with its own pins.

Both connections of `alpha` point at one fake upstream; a scripted 503 makes the first attempt
fall back to `alpha-2`, so a pin (or a response's owner) names the connection routing would not
pick on its own (`alpha-1` comes first). Cooling is off, so that 503 leaves `alpha-1` eligible:
only the pin sends a request to `alpha-2`. Waiting for a recovery is off: a test that goes wrong
fails at once.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import redis

from tests.fakes.upstream import FakeUpstream, Reply
from tests.fleet.conftest import KEY_B, REDIS_URL, Fleet, Replica, TcpGate, wait_for

RESPONSES = 'apis = ["chat", "responses"]'
ALPHA = {"provider_class": "apikey", "disable_cooling": True}
"""An API-key provider's breaker takes a few 503s in its stride; no cooling: alpha-1 stays eligible."""
AFFINITY = {"sessionAffinity": {"ttlMs": 600_000}, "comboCooldownWait": {"enabled": False}}


def with_affinity(fleet: Fleet) -> list[Replica]:
    """Session affinity on (it is off by default), on every replica."""
    assert fleet[0].patch("/api/resilience", AFFINITY).status_code == 200
    for replica in fleet.replicas:
        wait_for(
            lambda r=replica: r.client.get("/api/resilience").json()["sessionAffinity"]["ttlMs"] == 600_000,
            2,
            f"affinity on {replica.name}",
        )
    return fleet.replicas


def served_by(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.headers["x-omniroute-selected-connection-id"]


def created_id(events: str) -> str:
    """The response id a Responses API stream's `response.created` event names."""
    for line in events.splitlines():
        if line.startswith("data:"):
            data = json.loads(line[5:])
            if data.get("type") == "response.created":
                return str(data["response"]["id"])
    raise AssertionError(f"no response.created event in {events[:500]!r}")


def pin_to_alpha_2(fake: FakeUpstream, replica: Replica, session: str) -> None:
    fake.script(Reply("error", status=503))
    assert served_by(replica.chat(**{"x-session-id": session})) == "alpha-2"


def test_a_session_pinned_through_one_replica_is_honoured_by_the_next_request_on_another(
    make_fleet: Callable[..., Fleet], upstream: tuple[FakeUpstream, str]
) -> None:
    fake, _ = upstream
    a, b, c = with_affinity(make_fleet(3, **ALPHA))
    pin_to_alpha_2(fake, a, "sess-1")
    # At once: no wait between A's answer and B's request.
    assert served_by(b.chat(**{"x-session-id": "sess-1"})) == "alpha-2"
    assert served_by(c.chat(**{"x-session-id": "sess-1"})) == "alpha-2"
    # Without a session, or with another one, routing is as usual.
    assert served_by(b.chat()) == "alpha-1"
    assert served_by(b.chat(**{"x-session-id": "sess-2"})) == "alpha-1"


def test_a_session_id_of_any_length_and_characters_is_shared_under_a_bounded_key(
    make_fleet: Callable[..., Fleet],
    upstream: tuple[FakeUpstream, str],
    redis_client: redis.Redis,
    prefix: str,
) -> None:
    fake, _ = upstream
    a, b = with_affinity(make_fleet(2, **ALPHA))
    session = ("\u00fcber/" + "x" * 5000 + " *?[]").encode("latin-1")  # as a header carries it
    body = {"model": "alpha/m1", "messages": [{"role": "user", "content": "hi"}]}
    fake.script(Reply("error", status=503))
    first = a.client.post("/v1/chat/completions", json=body, headers={"x-session-id": session})
    assert served_by(first) == "alpha-2"
    again = b.client.post("/v1/chat/completions", json=body, headers={"x-session-id": session})
    assert served_by(again) == "alpha-2"
    keys = list(redis_client.scan_iter(match=f"{prefix}pin:*"))
    assert len(keys) == 1 and len(keys[0]) == len(prefix) + len("pin:#") + 64, keys


def test_a_session_that_moved_to_another_replica_and_back_follows_its_current_pin(
    make_fleet: Callable[..., Fleet], upstream: tuple[FakeUpstream, str]
) -> None:
    fake, _ = upstream
    a, b = with_affinity(make_fleet(2, **ALPHA))
    pin_to_alpha_2(fake, a, "sess-moving")  # A's memory: alpha-2
    fake.script(Reply("error", status=503))  # on B, alpha-2 fails: B re-pins to alpha-1
    assert served_by(b.chat(**{"x-session-id": "sess-moving"})) == "alpha-1"
    # Back on A, whose own pin (alpha-2, still live) is stale: the session stays on alpha-1.
    assert served_by(a.chat(**{"x-session-id": "sess-moving"})) == "alpha-1"


def test_a_response_created_through_one_replica_is_fetched_cancelled_and_deleted_through_another(
    make_fleet: Callable[..., Fleet], upstream: tuple[FakeUpstream, str]
) -> None:
    fake, _ = upstream
    a, b, c = with_affinity(make_fleet(3, **ALPHA, provider_extra=RESPONSES))
    for stream in (False, True):
        # Created by alpha-2, which routing would not pick on its own.
        fake.script(Reply("error", status=503), Reply("stream" if stream else "json"))
        created = a.client.post("/v1/responses", json={"model": "alpha/m1", "input": "hi", "stream": stream})
        assert served_by(created) == "alpha-2"
        ident = created.json()["id"] if not stream else created_id(created.text)
        fetched = b.client.get(f"/v1/responses/{ident}")
        assert fetched.status_code == 200, fetched.text
        assert fetched.json()["id"] == ident
        assert fake.requests[-1].headers["authorization"] == f"Bearer {KEY_B}"  # alpha-2's key
        cancelled = c.client.post(f"/v1/responses/{ident}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        deleted = b.client.delete(f"/v1/responses/{ident}")
        assert deleted.status_code == 200 and deleted.json()["deleted"] is True
        assert {r.headers["authorization"] for r in fake.requests if ident in r.path} == {f"Bearer {KEY_B}"}
    assert b.client.get("/v1/responses/resp_never_made").status_code == 404


def test_a_replica_cut_off_from_redis_serves_on_its_own_pins_and_shares_them_when_back(
    make_fleet: Callable[..., Fleet], gates: Callable[[int], TcpGate], upstream: tuple[FakeUpstream, str]
) -> None:
    fake, _ = upstream
    gate = gates(6379)
    fleet = make_fleet(0, **ALPHA)
    a = fleet.add("a", backend=gate.url)
    b = fleet.add("b", backend=REDIS_URL)
    with_affinity(fleet)
    pin_to_alpha_2(fake, a, "sess-before")
    gate.cut(drop=True)  # packets dropped: nothing answers, nothing refuses
    # Before and after A notices, its requests are served, on its own pins, without waiting for Redis.
    assert served_by(a.chat(**{"x-session-id": "sess-before"})) == "alpha-2"
    wait_for(lambda: not a.health()["stateBackend"]["connected"], 5, "A notices it lost Redis")
    for _ in range(3):
        response = a.chat(**{"x-session-id": "sess-before"})
        assert served_by(response) == "alpha-2"
        assert response.elapsed.total_seconds() < 0.5
    pin_to_alpha_2(fake, a, "sess-away")  # pinned while away: kept on A, B cannot know it yet
    pin_to_alpha_2(fake, a, "sess-both")
    assert served_by(b.chat(**{"x-session-id": "sess-both"})) == "alpha-1"  # B pins it later
    gate.heal()
    wait_for(lambda: a.health()["stateBackend"]["connected"], 10, "A is back and reconciled")
    # The reconcile wrote A's pin made while away, unless the fleet had a later one.
    assert served_by(b.chat(**{"x-session-id": "sess-away"})) == "alpha-2"
    assert served_by(b.chat(**{"x-session-id": "sess-both"})) == "alpha-1"
    assert served_by(a.chat(**{"x-session-id": "sess-both"})) == "alpha-1"
