"""The demo (docs/console.md#the-demo): the real proxy against the simulated upstreams, every layer moving.

The flaky upstream runs on a compressed schedule (3 s failing / 3 s healthy) and the local breaker and
cooldown profiles are shortened, so the whole DEGRADED -> OPEN -> HALF_OPEN -> CLOSED cycle happens in
seconds; everything else runs exactly as `omniroute serve --demo` does.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy import demo, serve
from proxy.demo import DemoTraffic, FlakySchedule
from proxy.resilience.events import Event
from proxy.runtime import Runtime

FAST_FLAKY = FlakySchedule(bad_s=3.0, good_s=3.0, lead_s=0.0, bad_ratio=1.0)
WATCH_LIMIT_S = 60.0
POLL_S = 0.2


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def breaker_path(events: list[Event], provider: str) -> list[str]:
    return [e.to for e in events if e.layer == "breaker" and e.key == provider]


def went_open_then_closed(path: list[str]) -> bool:
    """OPEN, later HALF_OPEN, later CLOSED (in that order)."""
    if "OPEN" not in path:
        return False
    rest = path[path.index("OPEN") :]
    if "HALF_OPEN" not in rest:
        return False
    return "CLOSED" in rest[rest.index("HALF_OPEN") :]


def conditions(runtime: Runtime, events: list[Event], traffic: DemoTraffic) -> dict[str, bool]:
    engine = runtime.engine
    now = engine.clock.now()
    requests = runtime.read.requests()
    return {
        "flaky breaker degraded": "DEGRADED" in breaker_path(events, "flaky"),
        "flaky breaker opened and closed again": went_open_then_closed(breaker_path(events, "flaky")),
        "a ratelimited connection cooled": any(
            e.layer == "connection" and e.key.startswith("ratelimited-") and e.to == "cooling" for e in events
        ),
        "models/missing-model locked": any(
            e["provider"] == "models" and e["model"] == "missing-model" for e in runtime.read.lockouts_api()
        ),
        "twokeys-dead expired": engine.connections["twokeys-dead"].health.status(now) == "expired",
        "twokeys-live served": traffic.served_by.get("twokeys", 0) > 0,
        "healthy served": traffic.served_by.get("healthy", 0) > 0,
        "claude served messages": traffic.served_by.get("claude", 0) > 0,
        "a claude key cooled after a 529": any(
            e.layer == "connection" and e.key.startswith("claude-") and e.to == "cooling" for e in events
        ),
        # the Requests tab's trail shows what the layers did to the traffic
        "a fallback in the trail": any(a.outcome == "fallback" for r in requests for a in r.attempts),
        "a skip in the trail": any(r.skipped for r in requests),
        "a wait in the trail": any(r.waits for r in requests),
        "a stream with its usage in the trail": any(r.stream and r.usage is not None for r in requests),
    }


async def watch(runtime: Runtime, events: list[Event], traffic: DemoTraffic) -> dict[str, bool]:
    """Poll until every condition held once (each is sticky), or the limit passes."""
    seen: dict[str, bool] = {}
    deadline = time.monotonic() + WATCH_LIMIT_S
    while time.monotonic() < deadline:
        for name, held in conditions(runtime, events, traffic).items():
            seen[name] = seen.get(name, False) or held
        if all(seen.values()):
            break
        await asyncio.sleep(POLL_S)
    return seen


async def wait_started(is_started: Callable[[], bool], task: asyncio.Task[Any]) -> None:
    async with asyncio.timeout(10):
        while not is_started():
            if task.done():
                await task
                raise AssertionError("the proxy server stopped while starting")
            await asyncio.sleep(0.01)


async def test_demo_moves_every_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo, "DEFAULT_FLAKY_SCHEDULE", FAST_FLAKY)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    events: list[Event] = []

    async with serve.instance(serve.Options(demo=True, port=port), env={}) as runtime:
        assert runtime.demo is True
        assert runtime.config.server.port == port
        assert runtime.config.server.default_combo == "demo"
        assert set(runtime.config.providers) == set(demo.UPSTREAM_KINDS)
        assert runtime.settings.document("settings")["modelLockout"]["enabled"] is True
        assert runtime.settings.document("resilience")["comboCooldownWait"]["maxWaitMs"] == 6000
        runtime.settings.patch(
            {
                "providerBreaker": {"local": {"resetTimeoutMs": 1000}},
                "connectionCooldown": {"local": {"baseCooldownMs": 200, "maxBackoffSteps": 1}},
            },
            "resilience",
        )
        unsubscribe = runtime.bus.subscribe(events.append)
        sock = serve.bind_socket("127.0.0.1", port)
        server = serve.make_server(runtime, sock)
        server_task = asyncio.create_task(server.serve(sockets=[sock]))
        traffic = DemoTraffic(base_url, rate_per_s=15.0, seed=7)
        try:
            await wait_started(lambda: server.started, server_task)
            traffic.start()
            seen = await watch(runtime, events, traffic)
            async with httpx.AsyncClient(base_url=base_url, timeout=10.0) as client:
                response = await client.get("/api/monitoring/health")
        finally:
            await traffic.stop()
            server.should_exit = True
            await server_task
            sock.close()
            unsubscribe()

    assert seen == dict.fromkeys(seen, True), f"not seen: {[k for k, v in seen.items() if not v]}"
    assert traffic.sent > 0
    assert traffic.answered.get(200, 0) > 0

    assert response.status_code == 200
    health = response.json()
    assert set(health["providerHealth"]) == set(demo.UPSTREAM_KINDS)
    assert health["connections"]["total"] == 9
    assert health["connections"]["terminal"] >= 1  # twokeys-dead
    assert [
        (lock["provider"], lock["connectionId"], lock["model"], lock["reason"]) for lock in health["lockouts"]
    ] == [("models", "models-1", "missing-model", "not_found")]
    assert health["requests"]["total"] > 0
    assert health["requests"]["ok"] > 0

    # Everything the demo started is gone: upstream servers, the traffic task, the proxy.
    leftovers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert leftovers == []


async def test_demo_environment_stops_its_upstreams(tmp_path: Path) -> None:
    async with demo.demo_environment(tmp_path, port=23456) as config:
        urls = {pid: p.base_url for pid, p in config.providers.items()}
        assert config.warnings == ()
        assert (tmp_path / "demo-config.toml").stat().st_mode & 0o777 == 0o600
        async with httpx.AsyncClient(timeout=5.0) as client:
            listed = (await client.get(urls["models"] + "/models")).json()
    assert config.server.port == 23456
    assert [m["id"] for m in listed["data"]] == ["llama3"]
    async with httpx.AsyncClient(timeout=5.0) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(urls["healthy"] + "/models")


async def test_demo_refuses_a_public_host_without_token() -> None:
    with pytest.raises(serve.StartupError, match=r"refusing to listen on 0\.0\.0\.0"):
        async with serve.instance(serve.Options(demo=True, host="0.0.0.0", port=free_port()), env={}):
            pass


def _omniroute() -> str | None:
    found = shutil.which("omniroute") or str(Path(sys.executable).parent / "omniroute")
    return found if Path(found).exists() else None


def test_omniroute_serve_demo_subprocess() -> None:
    exe = _omniroute()
    if exe is None:
        pytest.skip("the `omniroute` console script is not installed in this environment")
    help_run = subprocess.run([exe, "serve", "--help"], capture_output=True, text=True, timeout=30)
    if help_run.returncode != 0 or "--demo" not in help_run.stdout:
        pytest.skip("`omniroute serve --demo` is not available yet (no `serve` command with --demo)")

    port = free_port()
    proc = subprocess.Popen(
        [exe, "serve", "--demo", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        health: dict[str, Any] = {}
        deadline = time.monotonic() + 30
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=2.0) as client:
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    response = client.get("/api/monitoring/health")
                except httpx.TransportError:
                    time.sleep(0.1)
                    continue
                assert response.status_code == 200
                health = response.json()
                if health["requests"]["total"] > 0:  # the built-in traffic is flowing
                    break
                time.sleep(0.1)
        assert proc.poll() is None, proc.communicate(timeout=5)[1]
        assert set(health["providerHealth"]) == set(demo.UPSTREAM_KINDS)
        assert health["requests"]["total"] > 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            _, stderr = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert f"serving on http://127.0.0.1:{port}/v1" in stderr
