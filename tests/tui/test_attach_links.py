"""The live stream and the attached console when the link between them misbehaves, and when an
instance sends what this console cannot show (found by a trial of the attached console).

A real instance (the app on a real uvicorn server on loopback, in-process so that its ping interval
can be shortened), a real TCP relay between it and the reader that can cut the connections it
carries or stop forwarding them (a network gone without a close).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from omniroute_tui.app import OmniRouteApp
from omniroute_tui.cli.client import Api, Target
from omniroute_tui.cli.exit_codes import NoInstance
from omniroute_tui.remote import Remote
from proxy import stream
from proxy.app import create_app
from proxy.config import load_config
from proxy.resilience.lockout import LockoutSettings
from proxy.runtime import Runtime
from proxy.store import MemoryStore
from tests.fakes import FakeUpstream
from tests.fakes.server import LiveServer
from tests.tui.conftest import settle
from tests.tui.test_hostile import screen_lines
from tests.tui.test_remote_hostile import good_snapshot
from tests.two_providers import config_text


async def until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


class Relay:
    """A TCP relay on loopback: `cut()` closes every connection it carries (the client sees the
    connection end, the server too); `blackhole()` keeps them open but forwards nothing more, in
    either direction (a network that went away without a word: a cable, a VPN, a suspended laptop).
    New connections are accepted and forwarded unless black-holed."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.holding = False
        self.accepted = 0
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        self.listener.settimeout(0.1)
        while not self._stop:
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self.pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while not self._stop:
                ready, _, _ = select.select([a, b], [], [], 0.1)
                if self.holding:
                    continue  # nothing passes any more; the sockets stay open
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    (b if sock is a else a).sendall(data)
        except (OSError, ValueError):
            return
        finally:
            if not self.holding:
                for sock in (a, b):
                    with contextlib.suppress(OSError):
                        sock.close()

    def cut(self) -> None:
        with self._lock:
            pairs, self.pairs = self.pairs, []
        for a, b in pairs:
            for sock in (a, b):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()

    def blackhole(self) -> None:
        self.holding = True

    def close(self) -> None:
        self._stop = True
        self.listener.close()
        self._thread.join(2)
        self.holding = False
        self.cut()


@contextlib.contextmanager
def instance(monkeypatch: pytest.MonkeyPatch, lockouts: int = 0) -> Iterator[tuple[Runtime, Relay]]:
    """An instance pinging every 0.2 s of silence, whose readers give a link up after 1.5 s of
    nothing (the real ones: 15-20 s and 60 s), behind a relay."""
    monkeypatch.setattr(stream, "PING_S", 0.2)
    monkeypatch.setattr(stream, "SILENCE_LIMIT_S", 1.5)
    runtime = many_lockouts_runtime(lockouts)
    with LiveServer(create_app(runtime), lifespan="on") as server:
        relay = Relay(server.port)
        try:
            yield runtime, relay
        finally:
            relay.close()


def many_lockouts_runtime(count: int) -> Runtime:
    """The two test providers, with `count` model lockouts (rate-limited models: `not_found` locks
    are capped per connection) spread over their three connections. The table holds 10,000."""
    refused = FakeUpstream.refused_url()
    path = Path(tempfile.mkdtemp()) / "config.toml"
    path.write_text(config_text(refused, refused, None))
    path.chmod(0o600)
    runtime = Runtime(load_config(path, {}, explicit=True), MemoryStore(), env={})
    engine = runtime.engine
    now = engine.clock.now()
    settings = LockoutSettings(enabled=True)
    connections = list(engine.connections.values())
    for n in range(count):
        conn = connections[n % len(connections)]
        engine.lockouts.record_failure(
            conn.spec.provider, conn.spec.id, f"model-{n:05d}", now, settings, status=429,
            reason="rate_limited", hint_ms=3_600_000,
        )  # fmt: skip
    assert len(runtime.read.lockouts(now)) == count
    return runtime


async def test_a_stream_resumed_after_a_cut_says_attached_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The instance stayed up, so the console resumed without a snapshot, and only a snapshot said
    `attached`: it said `reconnecting…` and STALE for ever, while the changes kept coming."""
    monkeypatch.setattr("omniroute_tui.remote.BACKOFF_START_S", 0.05)
    with instance(monkeypatch) as (runtime, relay):
        app = OmniRouteApp(remote=Remote(relay.url, None))
        async with app.run_test(size=(120, 40)) as pilot:
            remote = app.remote
            assert remote is not None
            await until(lambda: remote.mirror.ready and remote.connected, "the console to attach")
            await until(lambda: remote.last_event_id is not None, "a message with an id")
            relay.cut()
            await until(lambda: not remote.connected, "the console to notice the cut")
            runtime.engine.set_connection_enabled("alpha-1", False, source="test")
            await until(
                lambda: (
                    (c := remote.mirror.connection("alpha-1", remote.mirror.now())) is not None
                    and not c.enabled
                ),
                "the change made meanwhile to arrive on the resumed stream",
            )
            await until(lambda: remote.connected, "the console to say it is attached again", timeout=5)
            await settle(pilot)
            assert app.feed.url == f"attached to {relay.url}"
            await until(lambda: any(" LIVE " in line for line in screen_lines(app)), "LIVE again", timeout=5)


async def test_a_network_that_stops_carrying_packets_is_noticed(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no close, the console said `attached` and LIVE for ever, over a state frozen at the
    cut: the missing pings now tell."""
    with instance(monkeypatch) as (_, relay):
        remote = Remote(relay.url, None)
        remote.start()
        try:
            await until(lambda: remote.mirror.ready and remote.connected, "the console to attach")
            relay.blackhole()
            await until(lambda: not remote.connected, "the console to notice the dead link", timeout=10)
            assert remote.status == f"reconnecting… {relay.url}"
        finally:
            await remote.stop()


def test_following_ends_no_instance_when_the_network_stops_carrying_packets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`events --follow` and `requests --follow` hung for ever on a dead link: they end as when the
    instance stops (exit 3), once the pings stop coming."""
    with instance(monkeypatch) as (_, relay):
        outcome: list[BaseException] = []

        def follow() -> None:
            with Api(Target(relay.url, None)) as api:
                try:
                    for _ in api.stream("/api/stream?kinds=event"):
                        pass
                except BaseException as exc:  # what ended it
                    outcome.append(exc)

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        deadline = time.monotonic() + 10
        while not relay.pairs and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)  # (its stream open, its snapshot read)
        relay.blackhole()
        reader.join(10)
        assert not reader.is_alive(), "still following a dead link"
        assert len(outcome) == 1 and isinstance(outcome[0], NoInstance), outcome
        assert "went silent" in str(outcome[0])


def test_following_an_instance_that_never_answers_says_how_long_it_waited(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It said "did not answer within 10 s" after waiting the stream's 60 (found by a lifecycle
    trial, against a SIGSTOPped instance)."""
    with instance(monkeypatch) as (_, relay):
        relay.blackhole()  # it takes the connection and never answers
        with Api(Target(relay.url, None)) as api, pytest.raises(NoInstance) as caught:
            for _ in api.stream("/api/stream?kinds=event"):
                pass
        assert f"did not answer within {stream.SILENCE_LIMIT_S:g} s" in str(caught.value)


async def test_a_console_attaches_to_an_instance_with_thousands_of_lockouts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first snapshot of 3,000 lockouts is 1.5 MiB, over the 1 MiB a message could be: it was
    dropped without a word and the console stayed at `connecting…` (and, having taken its id,
    resumed after it on every reconnect). The lockout table holds 10,000."""
    with instance(monkeypatch, lockouts=3_000) as (_, relay):
        remote = Remote(relay.url, None)
        remote.start()
        try:
            await until(lambda: remote.mirror.ready and remote.connected, "the console to attach", timeout=20)
            assert len(remote.mirror.lockouts(remote.mirror.now())) == 3_000
        finally:
            await remote.stop()


def stream_app(*messages: tuple[str, dict[str, Any]]) -> Starlette:
    """An instance whose stream sends `messages` (kind, data), then pings; its statistics are empty."""
    body = "".join(
        f"id: inst-{n}\nevent: {kind}\ndata: {json.dumps(data)}\n\n"
        for n, (kind, data) in enumerate(messages, 1)
    ).encode()

    async def stream(request: Request) -> Response:
        async def events() -> AsyncIterator[bytes]:
            yield body
            while True:
                await asyncio.sleep(0.2)
                yield b": ping\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def stats(request: Request) -> Response:
        return Response('{"window": "5m", "providers": {}, "connections": {}}', media_type="application/json")

    return Starlette(routes=[Route("/api/stream", stream), Route("/api/stats", stats)])


@pytest.mark.parametrize("ts", [1e300, -1e300, 1e20])
async def test_an_event_at_a_time_no_clock_can_show_does_not_crash_the_attached_console(ts: float) -> None:
    """An `event` whose `ts` is valid JSON of the right type but no time a clock can show ended the
    console with `OverflowError: timestamp out of range` (a traceback, exit 1)."""
    event = {"seq": 10**6, "ts": ts, "layer": "operator", "key": "reset breaker x", "from": "", "to": "",
             "reason": "api"}  # fmt: skip
    with LiveServer(stream_app(("snapshot", good_snapshot()), ("event", event))) as server:
        app = OmniRouteApp(remote=Remote(server.url, None))
        async with app.run_test(size=(120, 40)) as pilot:
            remote = app.remote
            assert remote is not None
            await until(lambda: remote.mirror.ready, "the snapshot")
            with contextlib.suppress(TimeoutError):  # (a crash can leave Pilot waiting)
                async with asyncio.timeout(10):
                    for tab in ("1", "6"):
                        await pilot.press(tab)
                        await settle(pilot)
                        await asyncio.sleep(0.6)  # (a redraw: at most twice a second)
                        await pilot.pause()
            assert app._exception is None and app.is_running, app._exception
            assert any(" ? " in line for line in screen_lines(app)), "the time is shown as unknown"


def _older_instance(snapshot: dict[str, Any]) -> None:
    del snapshot["settings"]["resilience"]["sessionAffinity"]


def _other_shapes(snapshot: dict[str, Any]) -> None:
    snapshot["settings"]["resilience"].update(requestQueue="x", connectionCooldown=[1])


@pytest.mark.parametrize("spoil", [_older_instance, _other_shapes], ids=["older-instance", "other-shapes"])
async def test_settings_documents_of_another_shape_do_not_crash_the_settings_tab(
    spoil: Callable[[dict[str, Any]], None],
) -> None:
    """A settings document without a section (an older instance) or with one of another type ended
    the console with a traceback when `5` opened the Settings tab. A missing section reads as its
    default; a value of another type is a message this console cannot read: it attaches again."""
    snapshot = good_snapshot()
    spoil(snapshot)
    with LiveServer(stream_app(("snapshot", snapshot))) as server:
        app = OmniRouteApp(remote=Remote(server.url, None))
        async with app.run_test(size=(120, 40)) as pilot:
            remote = app.remote
            assert remote is not None
            if spoil is _older_instance:
                await until(lambda: remote.mirror.ready, "the snapshot")
            else:
                await until(lambda: remote.reconnects > 0, "the unreadable snapshot to be given up")
            with contextlib.suppress(TimeoutError):  # (a crash while composing leaves Pilot waiting)
                async with asyncio.timeout(5):
                    await pilot.press("5")
                    await settle(pilot)
                    await pilot.pause()
            assert app._exception is None and app.is_running, app._exception
