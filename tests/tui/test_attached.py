"""The console attached to an instance it does not host (`omniroute tui --url`).

First the mirror: built from the live stream's JSON, it must draw exactly the rows the hosted
console draws from the engine. Then the real thing: a real `omniroute serve`, the real console
attached to it over HTTP (Pilot), acting through it and seeing the effects over the API; the
server killed and restarted under it; quitting leaves the server running.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from textual.pilot import Pilot

from omniroute_tui import snapshot as snap
from omniroute_tui.app import OmniRouteApp
from omniroute_tui.cards import SettingsPane
from omniroute_tui.cards.fields import BoolField
from omniroute_tui.feed import RequestIndex
from omniroute_tui.remote import Remote, RemoteError, RemoteOperator
from proxy import untrusted
from tests.cli.conftest import run
from tests.instances import Serving, environment, serving
from tests.tui.conftest import settle
from tests.tui.snapshot_app import attached_snapshot_app, build_runtime, mirrored
from tests.tui.test_cards import field_at
from tests.tui.test_hostile import screen_lines

# -- the mirror draws what the engine draws -------------------------------------------------------


def test_the_mirror_draws_the_rows_the_engine_draws() -> None:
    runtime = build_runtime()
    hosted, attached = runtime.read, mirrored(runtime)
    now = hosted.now()
    assert [snap.breaker_row(b) for b in attached.breakers(now)] == [
        snap.breaker_row(b) for b in hosted.breakers(now)
    ]
    assert [snap.connection_row(c) for c in attached.connections(now)] == [
        snap.connection_row(c) for c in hosted.connections(now)
    ]
    by_key = {(v.provider, v.connection_id, v.model): v for v in attached.lockouts(now)}
    rows = [(snap.lockout_template(v), v.remaining_ms(now)) for v in hosted.lockouts(now)]
    assert rows == [
        (snap.lockout_template(by_key[(v.provider, v.connection_id, v.model)]), v.remaining_ms(now))
        for v in hosted.lockouts(now)
    ]
    assert (attached.open_breakers(now), attached.cooling(now)) == (
        hosted.open_breakers(now),
        hosted.cooling(now),
    )
    assert attached.traffic() == hosted.traffic()
    assert attached.lockout_table() == hosted.lockout_table()
    assert attached.started_at == hosted.started_at


def test_the_mirror_counts_down_on_its_own_clock() -> None:
    runtime = build_runtime()
    attached = mirrored(runtime)
    clock = runtime.clock
    later = clock.now() + 45_000  # the openai-main cooldown (30 s) is over; the OPEN breaker's timeout too
    clock.set(later)
    hosted = runtime.read
    assert {c.id: (c.status, c.remaining_ms) for c in attached.connections(later)} == {
        c.id: (c.status, c.remaining_ms) for c in hosted.connections(later)
    }
    assert {b.provider: (b.state, b.retry_after_ms) for b in attached.breakers(later)} == {
        b.provider: (b.state, b.retry_after_ms) for b in hosted.breakers(later)
    }


def event(seq: int, layer: str, key: str, to: str = "x") -> dict[str, Any]:
    return {"seq": seq, "ts": 1000.0 * seq, "layer": layer, "key": key, "from": "", "to": to, "reason": "r"}


def test_the_mirror_tells_a_row_event_once_its_row_has_come() -> None:
    """The server sends a change's event, then (within 250 ms) its row: a console told of the
    event before the row arrived would draw the old row and never look again."""
    mirror = mirrored(build_runtime())
    told: list[str] = []
    mirror.subscribe(lambda e: told.append(e.key))
    mirror.apply("event", event(101, "operator", "reset breaker groq"))
    assert told == ["reset breaker groq"]  # no row to wait for
    mirror.apply("event", event(102, "connection", "ollama-1", "disabled"))
    mirror.apply("event", event(103, "operator", "disable ollama-1"))
    assert told == ["reset breaker groq"]  # held, and what came after it waits its turn
    row = {"id": "ollama-1", "provider": "ollama", "status": "disabled", "enabled": False}
    mirror.apply("state", {"breakers": [], "connections": [row], "lockouts": {"upsert": [], "remove": []}})
    assert told == ["reset breaker groq", "ollama-1", "disable ollama-1"]
    view = mirror.connection("ollama-1", mirror.now())
    assert view is not None and view.status == "disabled" and not view.enabled


def test_a_snapshot_from_a_restarted_instance_starts_its_events_over() -> None:
    runtime = build_runtime()
    mirror = mirrored(runtime)  # instance ""
    told: list[int] = []
    mirror.subscribe(lambda e: told.append(e.seq))
    data = json.loads(untrusted.dumps(runtime.stream.snapshot_data()))
    data["events"] = [
        event(1, "operator", "reset breaker groq"),
        event(2, "operator", "reset breaker ollama"),
    ]
    mirror.apply("snapshot", data, instance="abcd1234")
    assert told == [1, 2]  # numbered from 1 again, and told all the same
    mirror.apply("snapshot", data, instance="abcd1234")
    assert told == [1, 2]  # the same instance resending them: told once


def test_a_snapshot_from_a_restarted_instance_starts_its_requests_over() -> None:
    """The console kept the finished requests of the instance it was attached to before a restart
    (hours-old rows no API would show, and a count that was not the instance's): a new instance's
    snapshot replaces them, while the same instance resending its snapshot keeps them."""
    runtime = build_runtime()
    mirror = mirrored(runtime)
    data = json.loads(untrusted.dumps(runtime.stream.snapshot_data()))
    old = {r["id"] for r in data["requests"]["recent"]}
    assert old
    index = RequestIndex()
    mirror.apply("snapshot", data, instance="abcd1234")
    index.refresh(mirror, mirror.now())
    assert set(index.by_id) == old
    mirror.apply("snapshot", data, instance="abcd1234")
    index.refresh(mirror, mirror.now())
    assert set(index.by_id) == old
    restarted = dict(data, requests=dict(data["requests"], recent=data["requests"]["recent"][:1], alive=[]))
    mirror.apply("snapshot", restarted, instance="ffff0000")
    index.refresh(mirror, mirror.now())
    assert set(index.by_id) == {data["requests"]["recent"][0]["id"]}
    assert [v.id for v, _ in index.finished] == [data["requests"]["recent"][0]["id"]]


@pytest.mark.parametrize("view", ["1", "2"], ids=["overview", "breakers"])
def test_attached_view(view: str, snap_compare) -> None:  # type: ignore[no-untyped-def]
    async def run_before(pilot: Pilot[object]) -> None:
        await settle(pilot)
        await pilot.press(view)
        await settle(pilot)

    assert snap_compare(attached_snapshot_app(), terminal_size=(80, 24), run_before=run_before)


# -- a real instance ------------------------------------------------------------------------------


def api(server: Serving, method: str, path: str, body: object = None) -> Any:
    response = httpx.request(method, server.url + path, json=body, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


async def until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> float:
    """Wait (on the app's loop) for `condition`; returns how long it took."""
    import asyncio

    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


@asynccontextmanager
async def attached(
    server: Serving, size: tuple[int, int] = (120, 40)
) -> AsyncIterator[tuple[OmniRouteApp, Pilot[int]]]:
    app = OmniRouteApp(remote=Remote(server.url, None))
    async with app.run_test(size=size) as pilot:
        assert app.remote is not None
        remote = app.remote
        await until(lambda: remote.mirror.ready and remote.connected, "the console to attach")
        yield app, pilot


async def test_the_attached_console_acts_through_the_api_and_sees_the_change(tmp_path: Path) -> None:
    with serving(tmp_path, tmp_path / "state.db") as server:
        async with attached(server) as (app, pilot):
            assert app.feed.url == f"attached to {server.url}"
            await pilot.press("3")
            await settle(pilot)
            table = app.table("connections")
            assert table.select_key("alpha-1")
            await pilot.press("e")  # disable, through PUT /api/providers/alpha-1
            await settle(pilot)
            [row] = [
                c
                for c in api(server, "GET", "/api/resilience/connections")["connections"]
                if c["id"] == "alpha-1"
            ]
            assert row["enabled"] is False
            remote = app.remote
            assert remote is not None
            await until(
                lambda: (
                    (c := remote.mirror.connection("alpha-1", remote.mirror.now())) is not None
                    and not c.enabled
                ),
                "the row",
            )

            # A change made elsewhere (the CLI, another console) shows within half a second.
            api(server, "PUT", "/api/providers/alpha-1", {"isActive": True})
            took = await until(
                lambda: (
                    (c := remote.mirror.connection("alpha-1", remote.mirror.now())) is not None and c.enabled
                ),
                "the change to show",
            )
            assert took < 2.0  # the bar is 0.5 s (bench/tui.py measures it); the margin is for CI
            await settle(pilot)
            table.select_key("alpha-1")
            selected = table.selected_row
            assert selected is not None and "disabled" not in str(selected.cells)


async def test_an_attached_console_has_the_statistics_as_soon_as_it_attaches(tmp_path: Path) -> None:
    """They were asked for every 5 s, the first time before the snapshot said recording was on: for
    5 s a console attached to a busy instance said "no traffic" on every tile."""
    with serving(tmp_path, tmp_path / "state.db") as server:
        async with attached(server) as (app, _):
            remote = app.remote
            assert remote is not None
            took = await until(lambda: "5m" in remote.mirror._stats, "the statistics")
            assert took < 2.5  # (the poll comes every 5 s; this one follows the snapshot)


async def test_the_attached_console_saves_settings_through_the_api(tmp_path: Path) -> None:
    path = "streamRecovery.throughputWatchdog.enabled"
    with serving(tmp_path, tmp_path / "state.db") as server:
        async with attached(server, size=(120, 60)) as (app, pilot):
            await pilot.press("5")
            await settle(pilot)
            pane = app.query_one(SettingsPane)
            switch = field_at(pane, path)
            assert isinstance(switch, BoolField) and switch.value is False
            switch.checkbox.focus()
            await pilot.press("space")
            await pilot.press("ctrl+s")
            await settle(pilot)
            assert (
                api(server, "GET", "/api/resilience")["streamRecovery"]["throughputWatchdog"]["enabled"]
                is True
            )

            # And a change made over the API reaches the card.
            api(
                server,
                "PATCH",
                "/api/resilience",
                {"streamRecovery": {"throughputWatchdog": {"enabled": False}}},
            )
            await until(lambda: switch.value is False, "the card to follow")


async def test_a_restarted_instance_is_reattached_and_quitting_leaves_it_running(tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    with serving(tmp_path, state) as server:
        async with attached(server) as (app, pilot):
            remote = app.remote
            assert remote is not None
            server.proc.send_signal(signal.SIGTERM)
            assert server.proc.wait(10) == 0
            await until(lambda: not remote.connected, "the console to notice")
            assert app.feed.url == f"reconnecting… {server.url}"
            # what it shows is what the instance said last: not LIVE (it said so, its uptime ticking)
            await until(lambda: any(" STALE " in line for line in screen_lines(app)), "the header to say so")
            assert not any(" LIVE " in line for line in screen_lines(app))
            # The same port and state file, as a service manager restarts it.
            command = list(server.proc.args)  # type: ignore[arg-type]
            with open(server.log, "a") as log:
                again = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, env=environment())
            try:
                await until(lambda: remote.connected, "the console to reattach", timeout=30)
                assert app.feed.url == f"attached to {server.url}"
                await until(lambda: any(" LIVE " in line for line in screen_lines(app)), "LIVE again")
                api(server, "PUT", "/api/providers/alpha-1", {"isActive": False})
                await until(
                    lambda: (
                        (c := remote.mirror.connection("alpha-1", remote.mirror.now())) is not None
                        and not c.enabled
                    ),
                    "a change after the restart",
                )
                await pilot.press("q")
                await settle(pilot)
                assert again.poll() is None  # quitting an attached console stops nothing
                assert api(server, "GET", "/api/monitoring/health")["version"]  # and it still answers
            finally:
                again.terminate()
                assert again.wait(20) == 0


async def test_an_action_while_the_instance_is_down_says_so_in_words(tmp_path: Path) -> None:
    """An operator who presses a key while the instance is down is told it could not be reached and
    that nothing changed: not an exception's class name (`ConnectError: [Errno 111] ...`)."""
    with serving(tmp_path, tmp_path / "state.db") as server:
        async with attached(server) as (app, pilot):
            remote = app.remote
            assert remote is not None
            await pilot.press("3")
            await settle(pilot)
            assert app.table("connections").select_key("alpha-1")
            server.proc.send_signal(signal.SIGTERM)
            assert server.proc.wait(10) == 0
            await until(lambda: not remote.connected, "the console to notice")
            await pilot.press("e")
            await until(lambda: any(n.title == "Action failed" for n in app._notifications), "the toast")
            [toast] = [n for n in app._notifications if n.title == "Action failed"]
            assert toast.message == f"{server.url} could not be reached: nothing changed", toast.message


def test_an_action_whose_answer_never_came_may_have_been_made() -> None:
    """Once the request is out, a broken link cannot say nothing changed: a real socket that reads
    the request and hangs up without answering."""
    listener = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"

    def hang_up() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)

    thread = threading.Thread(target=hang_up, daemon=True)
    thread.start()
    try:
        with pytest.raises(RemoteError) as raised:
            RemoteOperator(url, None).reset_breakers("alpha")
    finally:
        thread.join(5)
        listener.close()
    assert (
        str(raised.value)
        == f"{url} did not answer (the link broke): the change may or may not have been made"
    )


def test_resetting_every_connection_says_how_many_were_reset_before_the_instance_went() -> None:
    """`R` on Connections resets each connection in turn: if the instance goes midway, the toast
    cannot say nothing changed. A real socket answers the list and one reset, then stops listening."""
    listener = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    answers = [
        b'{"connections": [{"id": "a"}, {"id": "b"}, {"id": "c"}]}',
        b'{"ok": true}',
    ]

    def serve_two() -> None:
        for i, body in enumerate(answers):
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                if i == len(answers) - 1:
                    listener.close()  # before the answer: the next call must find nobody listening
                head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
                conn.sendall(head.encode() + b"connection: close\r\n\r\n" + body)

    thread = threading.Thread(target=serve_two, daemon=True)
    thread.start()
    with pytest.raises(RemoteError) as raised:
        RemoteOperator(url, None).reset_connection(None)
    thread.join(5)
    assert (
        str(raised.value)
        == f"1 of 3 connections were reset, then: {url} could not be reached: nothing changed"
    )


def test_an_unreachable_instance_exits_3_and_a_refused_token_4(tmp_path: Path) -> None:
    from tests.instances import free_port

    nobody = run("tui", "--url", f"http://127.0.0.1:{free_port()}")
    assert nobody.code == 3, nobody.stderr
    assert "no omniroute instance" in nobody.stderr


async def test_request_records_are_asked_for_only_while_the_requests_tab_shows(tmp_path: Path) -> None:
    """Under traffic the records are most of what the stream carries: an attached console away
    from the Requests tab does not ask for them, and has them all again when it comes back."""
    with serving(tmp_path, tmp_path / "state.db") as server:
        async with (
            attached(server) as (app, pilot),
            httpx.AsyncClient(base_url=server.url, timeout=10) as client,
        ):
            remote = app.remote
            assert remote is not None
            mirror = remote.mirror
            counters = 0
            told = remote.on_change

            def counting(kind: str) -> None:
                nonlocal counters
                counters += kind == "counters"
                told(kind)

            remote.on_change = counting

            async def send() -> str:
                answer = await client.post(
                    "/v1/chat/completions",
                    json={"model": "nowhere/none", "messages": [{"role": "user", "content": "hi"}]},
                )
                assert answer.status_code == 404
                return answer.headers["x-request-id"]

            async def stream_went_past() -> None:
                """Two counters messages (one a second) after the requests ended: the records'
                own polls (every 250 ms) have run at least four times since."""
                seen = counters
                await until(lambda: counters >= seen + 2, "two more counters messages")

            def mirrored() -> set[str]:
                return {view.id for view in mirror.finished_requests(0)[0]} | {
                    view.id for view in mirror.alive_requests()
                }

            assert not remote.requests_followed  # on the Overview
            away = [await send() for _ in range(3)]
            await stream_went_past()
            assert not set(away) & mirrored()

            await pilot.press("7")
            assert remote.requests_followed
            await until(lambda: set(away) <= mirrored(), "the records sent while away")
            shown = await send()
            await until(lambda: shown in mirrored(), "a record sent while shown")
            assert remote.connected and app.feed.url == f"attached to {server.url}"

            await pilot.press("1")
            assert not remote.requests_followed
            gone = await send()
            await stream_went_past()
            assert gone not in mirrored()
            assert remote.connected and app.feed.url == f"attached to {server.url}"


async def test_read_only_attached_changes_nothing(tmp_path: Path) -> None:
    with serving(tmp_path, tmp_path / "state.db") as server:
        app = OmniRouteApp(remote=Remote(server.url, None), read_only=True)
        async with app.run_test(size=(120, 40)) as pilot:
            remote = app.remote
            assert remote is not None
            await until(lambda: remote.mirror.ready and remote.connected, "the console to attach")
            assert "READ-ONLY" in app.status.line_text(0)
            await pilot.press("3")
            await settle(pilot)
            app.table("connections").select_key("alpha-1")
            for key in ("e", "r", "R"):
                await pilot.press(key)
                await settle(pilot)
        operator = [e for e in api(server, "GET", "/api/events")["events"] if e["layer"] == "operator"]
        assert operator == []
        [row] = [
            c
            for c in api(server, "GET", "/api/resilience/connections")["connections"]
            if c["id"] == "alpha-1"
        ]
        assert row["enabled"] is True


def test_the_mirror_draws_the_request_rows_the_trail_draws() -> None:
    from omniroute_tui.snapshot import request_detail, request_row

    runtime = build_runtime()
    hosted, attached = runtime.read, mirrored(runtime)
    now = hosted.now()
    assert attached.recording and attached.request_history == hosted.request_history
    assert [request_row(r, now) for r in attached.alive_requests()] == [
        request_row(r, now) for r in hosted.alive_requests()
    ]
    finished, mark = attached.finished_requests(0)
    expected, _ = hosted.finished_requests(0)
    assert [request_row(r, now) for r in finished] == [request_row(r, now) for r in expected]
    assert [request_detail(r) for r in finished] == [request_detail(r) for r in expected]
    assert attached.finished_requests(mark) == ([], mark)


def test_the_mirror_follows_a_record_to_its_end_and_keeps_it_once() -> None:
    runtime = build_runtime()
    attached = mirrored(runtime)
    [alive, *_] = runtime.read.alive_requests()
    _, mark = attached.finished_requests(0)
    data = alive.to_api()
    ended = {**data, "state": "done", "status": 200, "endedAt": data["startedAt"], "durationMs": 1200}
    version = attached.requests_version
    attached.apply("request", ended)
    assert attached.requests_version > version
    assert alive.id not in {r.id for r in attached.alive_requests()}
    new, mark = attached.finished_requests(mark)
    assert [(r.id, r.state, r.status) for r in new] == [(alive.id, "done", 200)]
    attached.apply("request", ended)  # said again (a snapshot after a reconnect): kept once
    assert attached.finished_requests(mark) == ([], mark)


def test_the_mirror_answers_every_request_question_of_the_read_model_as_the_trail_does() -> None:
    """The attached console reads a Mirror where the hosted one reads the proxy's read model: the
    two answer the same questions (`Observed`), with the same arguments."""
    runtime = build_runtime()
    hosted, attached = runtime.read, mirrored(runtime)
    newest, mark = attached.finished_requests(0, 2)
    expected, expected_mark = hosted.finished_requests(0, 2)
    assert [r.id for r in newest] == [r.id for r in expected] and len(newest) == 2
    assert mark == expected_mark
    changed, states = attached.alive_changed({})
    expected_changed, expected_states = hosted.alive_changed({})
    assert states == expected_states and states
    assert sorted(r.id for r in changed) == sorted(r.id for r in expected_changed)
    assert attached.alive_changed(states) == ([], states)


def test_a_tile_without_a_sparkline_shows_the_p50_it_has() -> None:
    """An attached console is sent no latency sparkline but polls each provider's 1-minute p50: its
    tiles said "no traffic" under steady traffic."""
    mirror = mirrored(build_runtime())
    breaker = mirror.breakers(mirror.now())[0]
    unsent = mirror.latency_series(breaker.provider, mirror.now(), snap.TILE_SPARK)
    assert snap.tile(breaker, unsent, 120.0).latency == "p50 120 ms"
    assert snap.tile(breaker, unsent, None).latency == ""  # no request in the minute: no traffic
    assert snap.tile(breaker, [100.0, 150.0], 120.0).latency.endswith(" 120 ms")  # hosted, as before


def test_a_disabled_connections_detail_says_so_once() -> None:
    runtime = build_runtime()
    view = runtime.read.connections(runtime.clock.now())[0]
    runtime.engine.set_connection_enabled(view.id, False)
    view = runtime.read.connection(view.id, runtime.clock.now())
    assert view is not None and view.status == "disabled" and not view.enabled
    title = snap.connection_detail(view, [], []).title
    assert title.count("disabled") == 1, title
