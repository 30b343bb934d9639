"""A request waiting out a cooldown (cooldown-aware retry) looks again as soon as the operator acts or
a setting changes, not at the recovery it planned for: the reset the operator gave with one keystroke
frees it now, and turning waits off answers it now. Real proxy over real HTTP, on a fake clock that
never moves by itself: a wait that is not nudged never ends, so these tests cannot pass by waiting.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.fakes import FakeUpstream
from tests.fakes.upstream import Reply
from tests.integration.conftest import Instance

COOLING = Reply("error", status=429, headers={"Retry-After": "30"})
"""Both of alpha's keys answer 429: each is locked out of the model for 30 s."""
PROMPTLY_S = 5.0
"""Well under the planned wait, which on this clock never comes by itself."""


class Waiting:
    """One chat completion for alpha from a thread, sent once the instance's upstream cools both keys,
    and seen waiting out the cooldown before the test goes on."""

    def __init__(self, instance: Instance) -> None:
        assert instance.client is not None
        self.client = instance.client
        self.response: httpx.Response | None = None
        self.error: Exception | None = None
        body = {"model": "alpha/m1", "messages": [{"role": "user", "content": "hi"}]}

        def send() -> None:
            try:
                self.response = self.client.post("/v1/chat/completions", json=body, timeout=PROMPTLY_S * 2)
            except httpx.HTTPError as exc:
                self.error = exc

        self.thread = threading.Thread(target=send, daemon=True)
        self.thread.start()
        self.until(lambda: self.record()["state"] == "waiting", "the request waiting out the cooldown")

    def record(self) -> dict[str, Any]:
        records = self.client.get("/api/requests").json()["requests"]
        return records[-1] if records else {"state": None}

    def until(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + PROMPTLY_S
        while not condition():
            assert time.monotonic() < deadline, f"not within {PROMPTLY_S} s: {what}"
            time.sleep(0.02)

    def answer(self) -> httpx.Response:
        self.thread.join(PROMPTLY_S)
        assert self.response is not None, f"still waiting, or failed: {self.error!r} {self.record()}"
        return self.response


def waiting(
    make_instance: Callable[..., Instance], upstream: tuple[FakeUpstream, str]
) -> tuple[FakeUpstream, Instance, Waiting]:
    """A proxy whose upstream cools both of alpha's keys, and a request waiting out that cooldown."""
    fake, url = upstream
    instance = make_instance(alpha_url=url)
    fake.default(COOLING)
    return fake, instance, Waiting(instance)


def test_an_operator_re_enabling_a_lockout_frees_a_request_waiting_for_it(
    make_instance: Callable[..., Instance], upstream: tuple[FakeUpstream, str]
) -> None:
    fake, instance, request = waiting(make_instance, upstream)
    fake.default(Reply("json"))
    assert instance.client is not None
    sent = time.monotonic()
    # alpha-1's lockout for m1, re-enabled (the console's `r` on the Lockouts tab)
    reenable = {"provider": "alpha", "model": "m1", "connectionId": "alpha-1"}
    assert (
        instance.client.request("DELETE", "/api/resilience/model-cooldowns", json=reenable).status_code == 200
    )
    answer = request.answer()
    assert answer.status_code == 200 and time.monotonic() - sent < PROMPTLY_S
    assert answer.headers["x-omniroute-selected-connection-id"] == "alpha-1"
    record = request.record()
    assert record["state"] == "done" and len(record["waits"]) == 1


def test_turning_waits_off_answers_a_waiting_request_at_once(
    make_instance: Callable[..., Instance], upstream: tuple[FakeUpstream, str]
) -> None:
    _, instance, request = waiting(make_instance, upstream)
    assert instance.client is not None
    turned_off = {"comboCooldownWait": {"enabled": False}}
    assert instance.client.patch("/api/resilience", json=turned_off).status_code == 200
    answer = request.answer()
    assert answer.status_code == 429
    assert 1 <= int(answer.headers["retry-after"]) <= 30
    assert request.record()["state"] == "failed"


def test_a_nudge_that_frees_nothing_leaves_the_request_waiting_for_what_is_left(
    make_instance: Callable[..., Instance], upstream: tuple[FakeUpstream, str]
) -> None:
    """A change that frees nothing (another setting): the request looks, finds both keys still
    cooling, and waits again for the same recovery, which then serves it."""
    fake, instance, request = waiting(make_instance, upstream)
    assert instance.client is not None
    unrelated = {"providerBreaker": {"local": {"failureThreshold": 7}}}
    assert instance.client.patch("/api/resilience", json=unrelated).status_code == 200
    request.until(lambda: len(request.record()["waits"]) == 1, "the first wait over")
    request.until(lambda: request.record()["state"] == "waiting", "waiting again")
    assert request.response is None
    fake.default(Reply("json"))
    instance.clock.advance(31_000)  # the cooldown it waits for is over
    assert request.answer().status_code == 200
    waits = request.record()["waits"]
    assert len(waits) == 2 and waits[0]["ms"] < 1000 and waits[1]["ms"] > 29_000


def test_many_waiting_requests_some_of_their_clients_gone_are_all_freed_and_leave_nothing_behind(
    make_instance: Callable[..., Instance], upstream: tuple[FakeUpstream, str]
) -> None:
    """Overlap: eight requests wait out the same lockouts, three of their clients leave mid-wait,
    then one re-enable frees the rest together; no wait, wake-up or in-flight count is left over."""
    fake, instance, first = waiting(make_instance, upstream)
    assert instance.server is not None and instance.client is not None and instance.runtime is not None
    others = [Waiting(instance) for _ in range(4)]
    host, port = instance.server.url.removeprefix("http://").split(":")
    body = json.dumps({"model": "alpha/m1", "messages": [{"role": "user", "content": "hi"}]}).encode()
    leaving = []
    for _ in range(3):
        sock = socket.create_connection((host, int(port)), timeout=5)
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        leaving.append(sock)

    def states() -> list[str]:
        assert instance.client is not None
        return [r["state"] for r in instance.client.get("/api/requests").json()["requests"]]

    first.until(lambda: states().count("waiting") == 8, "eight requests waiting")
    for sock in leaving:
        sock.close()
    first.until(lambda: states().count("client_gone") == 3, "the three that left, ended")
    fake.default(Reply("json"))
    reenable = {"all": True}
    assert (
        instance.client.request("DELETE", "/api/resilience/model-cooldowns", json=reenable).status_code == 200
    )
    assert [w.answer().status_code for w in (first, *others)] == [200] * 5
    pipeline, engine = instance.runtime.pipeline, instance.runtime.engine
    first.until(lambda: engine.stats.in_flight == 0, "nothing in flight")
    assert (pipeline.waiting, pipeline._sleepers, pipeline._waiters) == (0, set(), set())
    assert sorted(states()) == ["client_gone"] * 3 + ["done"] * 5


def test_nudges_that_free_nothing_do_not_use_up_a_requests_waits(
    make_instance: Callable[..., Instance], upstream: tuple[FakeUpstream, str]
) -> None:
    """An operator tuning unrelated settings while a request waits (each save ends every wait) must
    not make it give up: only a wait that runs its course counts as one of `maxAttempts`; one ended
    early counts what it lasted against `budgetMs`, which still bounds the request."""
    fake, instance, request = waiting(make_instance, upstream)
    assert instance.client is not None
    max_attempts = instance.engine.settings.combo_wait().max_attempts
    for n in range(max_attempts + 2):
        unrelated = {"providerBreaker": {"local": {"failureThreshold": 7 + n % 2}}}
        assert instance.client.patch("/api/resilience", json=unrelated).status_code == 200
        request.until(lambda n=n: len(request.record()["waits"]) == n + 1, f"wait {n + 1} over")
        request.until(lambda: request.record()["state"] == "waiting", "waiting again")
    assert request.response is None, "gave up after its nudges"
    fake.default(Reply("json"))
    instance.clock.advance(31_000)  # the cooldown it waits for is over
    assert request.answer().status_code == 200
    assert len(request.record()["waits"]) == max_attempts + 3


def test_waits_that_run_their_course_still_end_at_max_attempts(
    make_instance: Callable[..., Instance], upstream: tuple[FakeUpstream, str]
) -> None:
    """Keys that cool again each time they recover: after `maxAttempts` full waits the request is
    answered, not sent into another wait."""
    fake, url = upstream
    instance = make_instance(alpha_url=url)
    assert instance.client is not None
    assert (
        instance.client.patch("/api/resilience", json={"comboCooldownWait": {"maxAttempts": 2}}).status_code
        == 200
    )
    fake.default(COOLING)
    request = Waiting(instance)
    for n in (1, 2):
        instance.clock.advance(31_000)  # the cooldown is over; the keys answer 429 and cool again
        request.until(lambda n=n: len(request.record()["waits"]) == n, f"wait {n} over")
        if n == 1:
            request.until(lambda: request.record()["state"] == "waiting", "waiting again")
    assert request.answer().status_code == 429
    assert len(request.record()["waits"]) == 2
