"""`GET /api/stats?scope=fleet` over real replicas (docs/fleet.md#statistics-of-the-fleet): each
replica publishes its statistics windows with its heartbeat, and any replica sums the live ones'.
Counts and errors add up exactly; the latency percentiles come from the merged histograms."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.fakes.upstream import FakeUpstream, Reply
from tests.fleet.conftest import Fleet, Replica, wait_for


def stats(replica: Replica, query: str = "") -> dict[str, Any]:
    response = replica.client.get(f"/api/stats{query}")
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def test_the_fleets_statistics_are_the_sum_of_each_replicas(
    make_fleet: Callable[..., Fleet], upstream: tuple[FakeUpstream, str]
) -> None:
    fake, _ = upstream
    fleet = make_fleet(3, provider_class="apikey", disable_cooling=True)
    a, b, c = fleet.replicas
    fleet.configure({"comboCooldownWait": {"enabled": False}})
    # A known traffic, different on each replica: 3 on A, 2 on B (one of them a 400), 1 slow on C.
    for _ in range(3):
        assert a.chat().status_code == 200
    fake.script(Reply("error", status=400))
    assert b.chat().status_code == 400
    assert b.chat().status_code == 200
    fake.script(Reply("slow_headers", delay_ms=300))
    assert c.chat().status_code == 200

    own = {r.name: stats(r) for r in fleet.replicas}
    assert [own[n]["providers"]["alpha"]["requests"] for n in "abc"] == [3, 2, 1]

    def summed(replica: Replica) -> dict[str, Any] | None:
        found = stats(replica, "?scope=fleet")
        return found if found["providers"]["alpha"]["requests"] == 6 else None

    for asked in fleet.replicas:  # any replica answers for the fleet (the others' within a heartbeat)
        found = wait_for(lambda r=asked: summed(r), 5, f"the fleet's sum on {asked.name}", step=0.05)
        assert found["scope"] == "fleet" and found["window"] == "5m"
        assert sorted(found["replicas"]["summed"]) == ["replica-a", "replica-b", "replica-c"]
        assert found["replicas"]["stale"] == [] and found["replicas"]["missing"] == []
        for kind, name in (("providers", "alpha"), ("connections", "alpha-1"), ("connections", "alpha-2")):
            parts = [own[n][kind][name] for n in "abc"]
            assert found[kind][name]["requests"] == sum(p["requests"] for p in parts), (kind, name)
            assert found[kind][name]["errors"] == sum(p["errors"] for p in parts), (kind, name)
        alpha = found["providers"]["alpha"]
        assert alpha["errorRate"] == round(1 / 6, 4)
        medians = [own[n]["providers"]["alpha"]["p50Ms"] for n in "abc"]
        assert min(medians) <= alpha["p50Ms"] <= max(medians)
        assert alpha["p95Ms"] >= 250  # C's slow request is the fleet's tail
    # The replica scope, the default, is each replica's own.
    assert stats(a, "?scope=replica")["providers"]["alpha"]["requests"] == 3

    # A replica that stops leaves the sum at once (its keys go with it).
    c.stop()
    wait_for(
        lambda: stats(a, "?scope=fleet")["replicas"]["summed"] == ["replica-a", "replica-b"],
        5,
        "C leaves the fleet's sum",
        step=0.05,
    )
    assert stats(a, "?scope=fleet")["providers"]["alpha"]["requests"] == 5


def test_a_bad_scope_is_a_400_on_a_fleet_too(make_fleet: Callable[..., Fleet]) -> None:
    (a,) = make_fleet(1).replicas
    bad = a.client.get("/api/stats?scope=all")
    assert bad.status_code == 400
    assert bad.json()["error"]["fields"][0]["field"] == "scope"
