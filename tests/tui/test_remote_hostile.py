"""An attached console reading a server that sends what it cannot read (another version, a hostile
or broken server, something in the middle): it drops that connection and attaches again, rather
than stop following for good while its status line still says it is attached. A real HTTP server
on loopback plays the instance; the console's `Remote` reads it as it reads a real one.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from omniroute_tui.remote import Remote
from proxy import untrusted
from tests.fakes.server import LiveServer
from tests.tui.snapshot_app import build_runtime


def good_snapshot() -> dict[str, Any]:
    return json.loads(untrusted.dumps(build_runtime().stream.snapshot_data()))  # type: ignore[no-any-return]


class Instance:
    """Answers each stream connection with the next of `snapshots` (then the last one again), and
    /api/stats with the next of `stats`."""

    def __init__(self, snapshots: list[dict[str, Any]], stats: list[object]) -> None:
        self.snapshots, self.stats = snapshots, stats
        self.streams = self.polls = 0

    async def stream(self, request: Request) -> Response:
        data = self.snapshots[min(self.streams, len(self.snapshots) - 1)]
        self.streams += 1

        async def events() -> AsyncIterator[bytes]:
            yield f"id: inst-{self.streams}\nevent: snapshot\ndata: {json.dumps(data)}\n\n".encode()
            while True:
                await asyncio.sleep(0.2)
                yield b": ping\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def stats_answer(self, request: Request) -> Response:
        answer = self.stats[min(self.polls, len(self.stats) - 1)]
        self.polls += 1
        return JSONResponse(answer)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/api/stream", self.stream), Route("/api/stats", self.stats_answer)])


@pytest.fixture
def serving() -> Iterator[Callable[[Instance], str]]:
    servers: list[LiveServer] = []

    def serve(instance: Instance) -> str:
        servers.append(LiveServer(instance.app()).start())
        return servers[-1].url

    yield serve
    for server in servers:
        server.stop()


async def until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda s: s.update(health=[]), id="health-a-list"),
        pytest.param(lambda s: s.update(connections={"a": 1}), id="connections-an-object"),
        pytest.param(
            lambda s: s["health"].update(providerBreakers=["x", 1, None]), id="breakers-not-objects"
        ),
    ],
)
async def test_a_snapshot_the_console_cannot_read_is_dropped_and_it_attaches_again(
    serving: Callable[[Instance], str], spoil: Callable[[dict[str, Any]], None]
) -> None:
    bad = good_snapshot()
    spoil(bad)
    instance = Instance([bad, good_snapshot()], [{}])
    statuses: list[str] = []
    remote = Remote(serving(instance), None, on_status=statuses.append)
    remote.start()
    try:
        await until(lambda: remote.connected and remote.mirror.ready, "the console to attach")
        assert instance.streams == 2 and remote.reconnects >= 1
        assert remote.mirror.breakers(remote.mirror.now())  # the good snapshot's state, whole
    finally:
        await remote.stop()


async def test_a_statistics_answer_the_console_cannot_read_does_not_stop_the_polling(
    serving: Callable[[Instance], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("omniroute_tui.remote.STATS_POLL_S", 0.05)
    good = json.loads(json.dumps(build_runtime().read.stats("5m", 0).to_api()))
    instance = Instance([good_snapshot()], [{"providers": [1, 2], "connections": "x"}, good])
    remote = Remote(serving(instance), None)
    remote.start()
    try:
        await until(lambda: remote.connected, "the console to attach")
        await until(lambda: instance.polls >= 6, "the statistics polled again after the bad answer")
    finally:
        await remote.stop()


class Refusing(Instance):
    """Sends one snapshot and ends the stream (the instance stopped); every later stream is
    answered 401 (it came back with a management token the console does not have)."""

    async def stream(self, request: Request) -> Response:
        self.streams += 1
        if self.streams > 1:
            return JSONResponse({"error": {"message": "missing or wrong management token"}}, 401)
        body = f"id: inst-1\nevent: snapshot\ndata: {json.dumps(self.snapshots[0])}\n\n"
        return Response(body, media_type="text/event-stream")


@pytest.mark.parametrize("token", [None, "a-token-0123456789"])
async def test_a_refused_token_after_a_reconnect_says_so_not_reconnecting(
    serving: Callable[[Instance], str], monkeypatch: pytest.MonkeyPatch, token: str | None
) -> None:
    """An instance restarted with another management token answers the console's stream with 401:
    retrying cannot help until the operator acts, so the status line says what is wrong (and the
    console goes on trying, for the token may be put back)."""
    monkeypatch.setattr("omniroute_tui.remote.BACKOFF_START_S", 0.05)
    instance = Refusing([good_snapshot()], [{}])
    statuses: list[str] = []
    url = serving(instance)
    remote = Remote(url, token, on_status=statuses.append)
    remote.start()
    try:
        await until(lambda: instance.streams >= 3, "the console to try again after the refusal")
        refused = "needs a management token" if token is None else "refused the management token"
        assert remote.status == f"{url} {refused}: retrying"
        assert statuses[0] == f"attached to {url}" and statuses[-1] == remote.status
    finally:
        await remote.stop()


TOKEN = "Console/Token+0123456789"


class Echoing(Instance):
    """Quotes the console's Authorization back: in an event on the stream, in an action's error and
    in a refused setting's field."""

    async def stream(self, request: Request) -> Response:
        sent = request.headers.get("authorization", "")
        event = {
            "seq": 1,
            "ts": 0,
            "layer": "breaker",
            "key": "p",
            "from": "CLOSED",
            "to": "OPEN",
            "reason": sent,
        }
        body = (
            f"id: inst-1\nevent: snapshot\ndata: {json.dumps(self.snapshots[0])}\n\n"
            f"id: inst-2\nevent: event\ndata: {json.dumps(event)}\n\n"
        )

        async def events() -> AsyncIterator[bytes]:
            yield body.encode()
            while True:
                await asyncio.sleep(0.2)
                yield b": ping\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def refuse(self, request: Request) -> Response:
        sent = request.headers.get("authorization", "")
        fields = [{"field": "requestQueue.maxWaitMs", "message": f"not for {sent}"}]
        status = 400 if request.method == "PATCH" else 500
        return JSONResponse({"error": {"message": f"no, {sent}", "fields": fields}}, status)

    def app(self) -> Starlette:
        routes = [Route("/api/stream", self.stream), Route("/api/stats", self.stats_answer)]
        routes.append(Route("/api/{path:path}", self.refuse, methods=["POST", "PATCH", "DELETE"]))
        return Starlette(routes=routes)


async def test_nothing_the_attached_console_shows_holds_its_own_token(
    serving: Callable[[Instance], str],
) -> None:
    from omniroute_tui.remote import RemoteError
    from proxy.resilience.errors import SettingsError

    remote = Remote(serving(Echoing([good_snapshot()], [{}])), TOKEN)
    remote.start()
    try:
        await until(lambda: any(e.key == "p" for e in remote.mirror.events_after(0)), "the echoed event")
        [event] = [e for e in remote.mirror.events_after(0) if e.key == "p"]
        assert event.reason == "Bearer ***"
        with pytest.raises(RemoteError) as failed:
            await asyncio.to_thread(remote.operator.reset_breakers, "p")
        assert TOKEN not in str(failed.value) and "***" in str(failed.value)
        with pytest.raises(SettingsError) as refused:
            await remote.settings.patch({"requestQueue": {"maxWaitMs": 1}}, "resilience")
        assert [f.message for f in refused.value.fields] == ["not for Bearer ***"]
    finally:
        await remote.stop()


async def test_what_an_attached_console_shows_stands_still_while_the_stream_is_down(
    serving: Callable[[Instance], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the instance is away the console shows what it said last, as of then: the uptime, a
    request's age and a countdown do not move on, and no breaker turns HALF_OPEN by itself (the
    instance, which alone knows, may have done anything meanwhile). Back, the clock runs again."""
    from omniroute_tui.remote import Mirror, wall_ms

    monkeypatch.setattr("omniroute_tui.remote.BACKOFF_START_S", 0.05)
    clock = [wall_ms()]
    mirror = Mirror(clock=lambda: clock[0])
    instance = Refusing([good_snapshot()], [{}])  # one snapshot, then the stream ends: away
    remote = Remote(serving(instance), None, mirror=mirror)
    remote.start()
    try:
        await until(lambda: instance.streams >= 2 and not remote.connected, "the stream to drop")
        shown = mirror.now()
        breakers = mirror.breakers(shown)
        assert any(b.state == "OPEN" for b in breakers)  # (the demo-sized state has some)
        clock[0] += 3_600_000  # an hour away
        assert mirror.now() == shown
        assert mirror.breakers(mirror.now()) == breakers
        remote._link(True)  # back (as a snapshot makes it)
        assert mirror.now() == clock[0]
        assert all(b.state != "OPEN" for b in mirror.breakers(mirror.now()))
    finally:
        await remote.stop()
