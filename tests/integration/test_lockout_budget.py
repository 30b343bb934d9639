"""Client-chosen model names and the lockout table (issue #20, item 6), over real HTTP.

A client picks `provider/<anything>`, so every made-up name a 404 locks is a new lockout entry. The
`not_found` locks of one provider+connection share a budget (`NOT_FOUND_BUDGET`), least recently
failed evicted first, so such a flood can neither crowd real lockouts out of the 10,000-entry table
nor turn the upstream's 404 into a 429. What the table holds, and what it had to evict or refuse,
shows in `GET /api/monitoring/health` under `lockoutTable`.

Proxies run on a FakeClock (conftest.py). A flood of 10,000 404s is replayed through the engine's own
`select` / `record` (the code path every request takes) between requests: 10,000 round trips would
cost a minute of the shared CPU and prove nothing more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx

from proxy.engine import Attempt, Target
from proxy.resilience.lockout import MAX_LOCKOUT_ENTRIES, NOT_FOUND_BUDGET
from proxy.resilience.outcome import Outcome
from tests.fakes import FakeUpstream, Reply

if TYPE_CHECKING:  # fixtures hand these out; conftest modules are not imported by tests
    from tests.integration.conftest import Instance

Launch = Callable[..., "Instance"]
Served = tuple[FakeUpstream, str]

UPSTREAM_404 = "alpha-upstream: 404 Not Found"
"""The message of the fake upstream's own 404 body: proves an answer is the upstream's, not ours."""


def start(make_instance: Launch, upstream: Served) -> Instance:
    """A proxy whose provider `alpha` (alpha-1, alpha-2) is the fake upstream, with model lockout on."""
    fake, url = upstream
    proxy = make_instance(alpha_url=url)
    patched = proxy.send("PATCH", "/api/settings", {"modelLockout": {"enabled": True}})
    assert patched.status_code == 200, patched.text
    fake.default(Reply("error", status=404))  # the upstream serves no model unless a test says so
    return proxy


def chat(proxy: Instance, model: str, connection: str | None = None) -> httpx.Response:
    headers = {"X-OmniRoute-Connection": connection} if connection else {}
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return proxy.send("POST", "/v1/chat/completions", body, headers=headers)


def flood(proxy: Instance, names: range, prefix: str = "made-up") -> None:
    """What a client sending `alpha/<prefix>-<n>` for each n does to the engine: one 404 each, on alpha-1."""
    engine = proxy.engine
    for n in names:
        attempt = engine.select([Target("alpha", f"{prefix}-{n}", "alpha-1")])
        assert isinstance(attempt, Attempt)
        engine.record(attempt, Outcome.http(404, '{"error": {"code": "model_not_found"}}'))


def lock_rows(proxy: Instance) -> list[tuple[str, str, str, str]]:
    response = proxy.get("/api/resilience/model-cooldowns")
    assert response.status_code == 200
    items: list[dict[str, Any]] = response.json()["items"]
    return sorted((i["provider"], i["connectionId"], i["model"], i["reason"]) for i in items)


def table(proxy: Instance) -> dict[str, Any]:
    response = proxy.get("/api/monitoring/health")
    assert response.status_code == 200
    status: dict[str, Any] = response.json()["lockoutTable"]
    return status


def upstream_404(response: httpx.Response) -> None:
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert (error["code"], error["message"]) == ("model_not_found", UPSTREAM_404)


def test_a_flood_of_made_up_names_does_not_crowd_real_lockouts_out(
    make_instance: Launch, upstream: Served
) -> None:
    proxy = start(make_instance, upstream)
    fake, _ = upstream
    flood(proxy, range(10_000))

    # A real lockout: alpha is `local`, so a 429 locks the model (per-model quota); alpha-2 serves.
    fake.script(Reply("error", status=429), Reply("json"))
    served = chat(proxy, "alpha/m1")
    assert served.status_code == 200, served.text
    assert served.headers["x-omniroute-selected-connection-id"] == "alpha-2"
    rows = lock_rows(proxy)
    assert ("alpha", "alpha-1", "m1", "rate_limited") in rows
    # Of the made-up names, only alpha-1's 100 most recently failed are still held.
    assert len(rows) == NOT_FOUND_BUDGET + 1
    assert {model for _, _, model, reason in rows if reason == "not_found"} == {
        f"made-up-{n}" for n in range(10_000 - NOT_FOUND_BUDGET, 10_000)
    }

    # A new made-up name still gets the upstream's 404; its locks evict alpha-1's oldest.
    upstream_404(chat(proxy, "alpha/one-more"))
    rows = lock_rows(proxy)
    assert ("alpha", "alpha-1", "made-up-9900", "not_found") not in rows
    assert {
        ("alpha", "alpha-1", "one-more", "not_found"),
        ("alpha", "alpha-2", "one-more", "not_found"),
    } <= set(rows)
    assert table(proxy) == {
        "size": NOT_FOUND_BUDGET + 2,
        "capacity": MAX_LOCKOUT_ENTRIES,
        "full": False,
        "notFound": NOT_FOUND_BUDGET + 1,
        "notFoundBudget": NOT_FOUND_BUDGET,
        "evicted": 10_000 - NOT_FOUND_BUDGET + 1,
        "refused": 0,
    }


def test_a_made_up_name_gets_the_upstreams_404_and_later_a_404_never_a_429(
    make_instance: Launch, upstream: Served
) -> None:
    proxy = start(make_instance, upstream)
    fake, _ = upstream

    upstream_404(chat(proxy, "alpha/nonsense"))  # alpha-1, then alpha-2: both 404, both now locked
    assert len([r for r in fake.requests if r.path == "/v1/chat/completions"]) == 2
    assert lock_rows(proxy) == [
        ("alpha", "alpha-1", "nonsense", "not_found"),
        ("alpha", "alpha-2", "nonsense", "not_found"),
    ]

    # Blocked only by not_found locks: nothing is sent, and the answer is a 404 naming the locks.
    blocked = chat(proxy, "alpha/nonsense")
    assert blocked.status_code == 404, blocked.text
    assert "retry-after" not in blocked.headers
    error = blocked.json()["error"]
    assert error["code"] == "model_not_found"
    assert [(s["connectionId"], s["reason"]) for s in error["skipped"]] == [
        ("alpha-1", "locked"),
        ("alpha-2", "locked"),
    ]
    assert len([r for r in fake.requests if r.path == "/v1/chat/completions"]) == 2


def test_a_table_full_of_real_lockouts_refuses_visibly_and_the_client_still_gets_the_404(
    make_instance: Launch, upstream: Served
) -> None:
    proxy = start(make_instance, upstream)
    engine = proxy.engine
    settings = engine.settings.lockout()
    for n in range(MAX_LOCKOUT_ENTRIES):  # quota locks on models alpha serves: none is evictable
        engine.lockouts.record_failure(
            "alpha", "alpha-1", f"quota-{n}", proxy.clock.now(), settings, status=429, reason="rate_limited"
        )
    seq = proxy.last_seq

    upstream_404(chat(proxy, "alpha/made-up"))

    assert table(proxy) == {
        "size": MAX_LOCKOUT_ENTRIES,
        "capacity": MAX_LOCKOUT_ENTRIES,
        "full": True,
        "notFound": 0,
        "notFoundBudget": NOT_FOUND_BUDGET,
        "evicted": 0,
        "refused": 2,  # alpha-1's lock and alpha-2's
    }
    events = proxy.get("/api/events", params={"after": seq}).json()["events"]
    assert [(e["key"], e["reason"]) for e in events if e["layer"] == "lockout"] == [
        ("alpha:alpha-1:made-up", "lockout_table_full"),
        ("alpha:alpha-2:made-up", "lockout_table_full"),
    ]


def test_evicted_lockouts_do_not_come_back_after_a_restart(make_instance: Launch, upstream: Served) -> None:
    proxy = start(make_instance, upstream)
    flood(proxy, range(NOT_FOUND_BUDGET + 50))
    upstream_404(chat(proxy, "alpha/over-http", "alpha-1"))  # evicts one more
    kept = lock_rows(proxy)
    assert len(kept) == NOT_FOUND_BUDGET

    proxy.restart()

    assert lock_rows(proxy) == kept
    assert len(proxy.engine.lockouts) == NOT_FOUND_BUDGET
