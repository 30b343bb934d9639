"""Model lockouts of client-chosen names, over real HTTP (issue #20).

A client picks `provider/<anything>`; the upstream answers 404 and, with model lockout on, the
triple is locked `not_found`. Neither that request nor a later one blocked only by such locks may
get a 429 (resilience.md §7): no wait makes the model exist.

Proxies run on a FakeClock (conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx

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


def lock_rows(proxy: Instance) -> list[tuple[str, str, str, str]]:
    response = proxy.get("/api/resilience/model-cooldowns")
    assert response.status_code == 200
    items: list[dict[str, Any]] = response.json()["items"]
    return sorted((i["provider"], i["connectionId"], i["model"], i["reason"]) for i in items)


def upstream_404(response: httpx.Response) -> None:
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert (error["code"], error["message"]) == ("model_not_found", UPSTREAM_404)


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
