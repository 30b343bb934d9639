"""`omniroute events`: the recent changes, and `--follow` on the live stream of a running instance."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from tests.cli.conftest import Instance
from tests.integration.test_proxy import wait_until
from tests.processes import OMNIROUTE, environment


def act(proxy: Instance, provider: str = "alpha") -> None:
    """An operator action over the API: one `operator` event."""
    response = httpx.post(proxy.url + "/api/resilience/reset", json={"provider": provider}, timeout=10)
    assert response.status_code == 200


def test_events_json_is_the_api_list_and_the_table_says_each_change(proxy: Instance) -> None:
    act(proxy)
    act(proxy, "beta")
    result = proxy.cli("events", "--json")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout) == proxy.api("/api/events")["events"]
    table = proxy.cli("events")
    assert table.code == 0, table.stderr
    assert "reset breaker alpha" in table.stdout and "reset breaker beta" in table.stdout
    assert "operator" in table.stdout


class Follower:
    """`omniroute ARGS` (a --follow command) as a real process; its stdout lines arrive on a queue."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", OMNIROUTE, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment(),
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def line(self, timeout: float = 20.0) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout} s") from None


@contextmanager
def following(proxy: Instance, *args: str) -> Iterator[Follower]:
    follower = Follower(*args, "--url", proxy.url)
    try:
        yield follower
    finally:
        if follower.proc.poll() is None:
            follower.proc.kill()
        follower.proc.wait(10)
        follower.reader.join(10)
        for pipe in (follower.proc.stdout, follower.proc.stderr):
            if pipe is not None:
                pipe.close()


def test_follow_prints_what_happened_then_each_change_as_a_json_line(proxy: Instance) -> None:
    act(proxy)
    with following(proxy, "events", "--follow", "--json") as follower:
        first = json.loads(follower.line())
        assert (first["layer"], first["key"]) == ("operator", "reset breaker alpha")
        act(proxy, "beta")
        second = json.loads(follower.line())
        assert (second["layer"], second["key"]) == ("operator", "reset breaker beta")
        assert second["seq"] == first["seq"] + 1
        assert follower.lines.empty()  # each once: the snapshot's events are not printed again

        proxy.server.stop()  # the instance goes: following ends, and says so
        assert follower.proc.wait(20) == 3
        assert follower.proc.stderr is not None
        assert "stream" in follower.proc.stderr.read()


def test_follow_writes_untrusted_text_as_plain_text(proxy: Instance) -> None:
    """A provider name is the operator's, but a reason may quote an upstream: the human lines pass
    every field through the same filter as the tables (no escape sequence reaches the terminal)."""
    bus = proxy.runtime.bus
    from proxy.resilience.events import Event

    with following(proxy, "events", "--follow") as follower:
        wait_until(lambda: proxy.runtime.stream.clients == 1, what="the follower to attach")
        loop = proxy.server._loop
        assert loop is not None
        loop.call_soon_threadsafe(
            bus.publish,
            Event(0.0, "connection", "alpha-1", "active", "cooling", "503: \x1b[2J[red]boom[/red]"),
        )
        line = follower.line()
        assert "\x1b[2J" not in line
        assert "[red]boom[/red]" in line  # shown as written, never read as markup
        assert "cooling" in line


def test_requests_follow_prints_each_request_once_as_it_ends(proxy: Instance) -> None:
    with following(proxy, "requests", "--follow", "--json") as follower:
        wait_until(lambda: proxy.runtime.stream.clients == 1, what="the follower to attach")
        for _ in range(2):
            answer = httpx.post(
                proxy.url + "/v1/chat/completions",
                json={"model": "alpha/m1", "messages": [{"role": "user", "content": "hi"}]},
                timeout=10,
            )
            assert answer.status_code == 200
        lines = [json.loads(follower.line()) for _ in range(2)]
        records = proxy.api("/api/requests")["requests"]
        assert lines == records  # each as the API shows it, in the order they ended
        assert follower.lines.empty()


def _record(rid: str, state: str = "done") -> dict[str, object]:
    return {"id": rid, "state": state, "status": 200, "attempts": []}


def test_requests_follow_prints_what_a_later_snapshot_says_ended_and_was_not_printed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A follower that fell behind (or reconnected past the buffer) is sent a snapshot instead of
    the records it missed: those that ended since it began following are printed from it, once,
    and those that ended before it began are not."""
    from omniroute_tui.cli.traffic import _follow

    def snapshot(*recent: str) -> tuple[str, dict[str, object]]:
        return "snapshot", {"requests": {"alive": [], "recent": [_record(r) for r in recent]}}

    _follow(
        iter(
            [
                snapshot("before"),
                ("request", _record("a")),
                snapshot("before", "a", "b", "c"),
                ("request", _record("c")),
                ("request", _record("d")),
            ]
        ),
        failed=False,
        json_=True,
    )
    printed = [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()]
    assert printed == ["a", "b", "c", "d"]


def test_requests_follow_prints_the_newest_n_first_then_each_as_it_ends(proxy: Instance) -> None:
    """`--limit` is the history it starts with, as without `--follow` (found by a docs trial: it
    printed nothing until the next request ended, whatever `--limit` said)."""

    def chat(model: str) -> str:
        answer = httpx.post(
            proxy.url + "/v1/chat/completions", json={"model": model, "messages": []}, timeout=10
        )
        return answer.headers["x-request-id"]

    chat("alpha/m1")
    before = chat("alpha/m2")
    with following(proxy, "requests", "--follow", "--json", "--limit", "1") as follower:
        assert json.loads(follower.line())["id"] == before  # the newest 1, not the one before it
        after = chat("alpha/m1")
        assert json.loads(follower.line())["id"] == after
        assert follower.lines.empty()
