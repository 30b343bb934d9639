"""The console attached to one replica of a fleet (`omniroute tui --url`), against real replicas.

It shows the fleet's shared state and events, the replica it is attached to, a Replicas line on
Overview, and says so in its status line when that replica lost Redis.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from textual.pilot import Pilot
from textual.widgets import Static

from omniroute_tui.app import OmniRouteApp
from omniroute_tui.remote import Remote
from tests.fakes.upstream import FakeUpstream, Reply
from tests.fleet.conftest import REDIS_URL, TOKEN, Fleet, Replica, TcpGate, wait_for
from tests.tui.conftest import settle


async def until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@asynccontextmanager
async def attached(replica: Replica) -> AsyncIterator[tuple[OmniRouteApp, Pilot[int]]]:
    app = OmniRouteApp(remote=Remote(replica.url, TOKEN))
    async with app.run_test(size=(160, 40)) as pilot:
        remote = app.remote
        assert remote is not None
        await until(lambda: remote.mirror.ready and remote.connected, "the console to attach")
        yield app, pilot


def replicas_line(app: OmniRouteApp) -> str:
    return str(app.query_one("#overview-replicas", Static).render())


async def test_the_console_names_its_replica_lists_the_fleet_and_says_when_redis_is_lost(
    make_fleet: Callable[..., Fleet], gates: Callable[[int], TcpGate]
) -> None:
    gate = gates(6379)
    fleet = make_fleet(0)
    fleet.add("a", backend=REDIS_URL)
    b = fleet.add("b", backend=gate.url)
    wait_for(lambda: len(b.health()["fleet"]["replicas"]) == 2, 3, "both replicas listed")
    async with attached(b) as (app, pilot):
        await settle(pilot)
        await until(lambda: "replica replica-b" in app.status.line_text(0), "the replica in the title")
        await until(lambda: "Replicas 2" in replicas_line(app), "the Replicas line")
        line = replicas_line(app)
        assert "replica-a " in line and "replica-b (this)" in line and "in flight" in line
        assert "state:" not in app.status.line_text(0)

        gate.cut()
        await until(
            lambda: "state: redis lost" in app.status.line_text(0), "the lost Redis in the status line"
        )
        gate.heal()
        await until(lambda: "state:" not in app.status.line_text(0), "Redis back")


async def test_an_operator_reset_on_one_replica_shows_in_the_console_attached_to_another(
    make_fleet: Callable[..., Fleet], upstream: tuple[FakeUpstream, str]
) -> None:
    fake, _ = upstream
    fleet = make_fleet(2, disable_cooling=True)
    a, b = fleet[0], fleet[1]
    fleet.configure({"comboCooldownWait": {"enabled": False}})
    fake.default(Reply("error", status=503))
    b.chat()
    wait_for(lambda: a.breaker()["state"] == "OPEN", 1, "OPEN on A")
    async with attached(a) as (app, pilot):
        mirror = app.remote.mirror if app.remote else None
        assert mirror is not None
        await until(lambda: mirror.breaker("alpha", mirror.now()).state == "OPEN", "OPEN in A's console")  # type: ignore[union-attr]
        assert b.client.post("/api/resilience/reset", json={"provider": "alpha"}).status_code == 200
        await until(lambda: mirror.breaker("alpha", mirror.now()).state == "CLOSED", "CLOSED in A's console")  # type: ignore[union-attr]
        await until(
            lambda: any(
                e.layer == "operator" and e.key == "reset breaker alpha" for e in mirror.events_after(0)
            ),
            "the operator's event in A's console",
        )
        await pilot.press("4")  # the Events tab
        await settle(pilot)
