"""A non-streaming upstream answer is read within bounds of time and size (found by the chaos test).

The proxy reads a non-streaming answer whole before relaying it. An upstream that sends its headers
and then trickles bytes forever (keep-alive pings on a non-streaming request) reset the idle timeout
with every byte: the request never ended, held its connection slot and grew its buffer for as long
as the upstream went on, whether or not its client was still there. Now the body must be complete
within `first_byte_timeout_ms` of the headers and may not exceed `MAX_UPSTREAM_BODY_BYTES`; either
failure is an upstream failure like a dropped connection (fallback, then a 502).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from proxy import upstream as upstream_module
from proxy.app import create_app
from proxy.config import load_config
from proxy.runtime import Runtime
from tests.fakes import FakeUpstream, LiveServer, Reply

CONFIG = """
[server]
first_byte_timeout_ms = {first_byte_ms}
idle_timeout_ms = {idle_ms}

[providers.solo]
class = "local"
base_url = "{url}"

[[providers.solo.connections]]
id = "solo-1"
disable_cooling = true  # one connection: the answer is its own error, not "all targets cooling"
"""
CHAT = {"model": "solo/m1", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def fake() -> Iterator[tuple[FakeUpstream, str]]:
    upstream = FakeUpstream("solo-upstream")
    with LiveServer(upstream.app) as live:
        try:
            yield upstream, live.url + "/v1"
        finally:
            upstream.reset()  # end whatever still pings


@pytest.fixture
def proxy(tmp_path: Path, fake: tuple[FakeUpstream, str]) -> Iterator[tuple[Runtime, httpx.Client]]:
    yield from _served(tmp_path, fake[1], first_byte_ms=1000, idle_ms=1000)


@pytest.fixture
def impatient(tmp_path: Path, fake: tuple[FakeUpstream, str]) -> Iterator[tuple[Runtime, httpx.Client]]:
    """A proxy whose idle timeout (300 ms) is far shorter than its body deadline (4 s)."""
    yield from _served(tmp_path, fake[1], first_byte_ms=4000, idle_ms=300)


def _served(
    tmp_path: Path, url: str, *, first_byte_ms: int, idle_ms: int
) -> Iterator[tuple[Runtime, httpx.Client]]:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG.format(url=url, first_byte_ms=first_byte_ms, idle_ms=idle_ms))
    path.chmod(0o600)
    runtime = Runtime.open(load_config(path, {}, explicit=True), tmp_path / "state.db", env={})
    runtime.settings.patch({"comboCooldownWait": {"enabled": False}}, "resilience")
    with (
        LiveServer(create_app(runtime), lifespan="on") as live,
        httpx.Client(base_url=live.url, timeout=10) as client,
    ):
        yield runtime, client


def test_an_endless_trickle_on_a_non_streaming_request_ends_in_a_502(
    fake: tuple[FakeUpstream, str], proxy: tuple[Runtime, httpx.Client]
) -> None:
    upstream, _ = fake
    runtime, client = proxy
    upstream.script(Reply("stream_pings", delay_ms=50))  # a ping every 50 ms: never idle for 1 s
    started = time.monotonic()

    response = client.post("/v1/chat/completions", json=CHAT)

    assert response.status_code == 502
    assert "not complete within 1000 ms" in response.json()["error"]["message"]
    assert time.monotonic() - started < 5
    assert runtime.engine.connections["solo-1"].in_flight == 0
    deadline = time.monotonic() + 5
    while upstream.in_flight:  # the proxy let go of the upstream socket
        assert time.monotonic() < deadline, "the proxy still holds the upstream request"
        time.sleep(0.01)


def test_a_body_over_the_size_bound_is_an_upstream_failure(
    fake: tuple[FakeUpstream, str], proxy: tuple[Runtime, httpx.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream, _ = fake
    runtime, client = proxy
    monkeypatch.setattr(upstream_module, "MAX_UPSTREAM_BODY_BYTES", 1024 * 1024)
    upstream.script(Reply("big"))  # 5 MiB

    response = client.post("/v1/chat/completions", json=CHAT)

    assert response.status_code == 502
    assert "larger than 1048576 bytes" in response.json()["error"]["message"]
    assert runtime.engine.connections["solo-1"].in_flight == 0
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200  # under the bound: served


def test_a_slow_but_finite_body_within_the_deadline_is_served(
    fake: tuple[FakeUpstream, str], proxy: tuple[Runtime, httpx.Client]
) -> None:
    upstream, _ = fake
    _, client = proxy
    upstream.script(Reply("drip", drip_bytes=20, delay_ms=10))  # ~300 bytes in ~150 ms
    response = client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "hello from solo-upstream"


@pytest.mark.parametrize("status", [200, 500], ids=["answer", "error"])
def test_a_body_that_goes_quiet_past_the_idle_timeout_ends_at_the_idle_timeout(
    fake: tuple[FakeUpstream, str], impatient: tuple[Runtime, httpx.Client], status: int
) -> None:
    """The idle timeout bounds every wait for more of a body, not only a stream's: a non-streaming
    answer (or an error body) that stops halfway is not waited for until the body deadline."""
    upstream, _ = fake
    runtime, client = impatient
    upstream.script(Reply("drip", status=status, drip_bytes=20, delay_ms=3000))  # 20 bytes, then 3 s quiet
    started = time.monotonic()

    response = client.post("/v1/chat/completions", json=CHAT)

    took = time.monotonic() - started
    # An error is relayed as the upstream gave it (with what of its body came); an answer cut short
    # is a failed attempt.
    assert response.status_code == (502 if status == 200 else 500)
    assert took < 2.0, f"the proxy waited {took:.1f} s on a body quiet past its 0.3 s idle timeout"
    if status == 200:
        assert "idle" in response.json()["error"]["message"]
    assert runtime.engine.connections["solo-1"].in_flight == 0


def test_an_upstream_sets_no_cookie_for_the_next_client(
    fake: tuple[FakeUpstream, str], tmp_path: Path
) -> None:
    """The proxy serves many clients through one upstream session: a cookie one answer sets must not
    ride along with the next request (a client's session at the upstream is not another's)."""
    upstream, url = fake
    named = url.replace("127.0.0.1", "localhost")  # (aiohttp's default jar ignores cookies of an IP)
    for _, client in _served(tmp_path, named, first_byte_ms=1000, idle_ms=1000):  # (serves once)
        upstream.script(Reply("json", headers={"set-cookie": "session=client-a; Path=/"}))
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert [r.headers.get("cookie") for r in upstream.requests] == [None, None]
