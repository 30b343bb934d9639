"""Running out of file descriptors is the proxy's own problem, not the upstream's.

An operator runs `omniroute serve` with a low `ulimit -n` (a systemd `LimitNOFILE`, a laptop's
default of 1,024 under a busy agent). When the proxy has no descriptor left to open a socket to an
upstream, aiohttp raises `OSError(EMFILE, "Too many open files")`, and `proxy/upstream.py:
_network_outcome` turns it into a network failure *of the upstream*: the connection cools with an
escalating backoff (`lastError: "too many open files"`) and the provider's breaker counts it, goes
DEGRADED and OPEN, and keeps failing its probes for as long as the shortage lasts. A healthy
upstream ends up shunned, and an operator must reset it by hand after the load is gone.

What should happen: a failure to get a local resource counts against no layer (like a client that
went away), and the request is answered by the proxy (a 503 of its own), leaving breakers and
cooldowns as the upstream's real answers left them. (Found by a lifecycle trial.)
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from proxy.serve import MIN_OPEN_FILES
from tests.fakes import FakeUpstream, LiveServer, Reply
from tests.instances import OMNIROUTE, environment
from tests.processes import exit_code, free_port, wait_for
from tests.two_providers import config_text

FD_HEADROOM = 16
"""Descriptors left to the instance once it serves: room for about 8 requests in flight (each
holds its client's socket and its upstream's)."""
CLIENTS = 40


@pytest.fixture
def slow_upstream() -> Iterator[tuple[FakeUpstream, str]]:
    """A healthy upstream that takes a second and a half to answer."""
    fake = FakeUpstream("slow-but-healthy")
    fake.default(Reply("slow_headers", delay_ms=1500))
    server = LiveServer(fake.app).start()
    try:
        yield fake, server.url + "/v1"
    finally:
        server.stop()


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _crowd(port: int, n: int) -> list[object]:
    body = {"model": "alpha/m1", "messages": [{"role": "user", "content": "hi"}]}
    limits = httpx.Limits(max_connections=n + 1)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30, limits=limits) as client:

        async def one() -> object:
            try:
                return (await client.post("/v1/chat/completions", json=body)).status_code
            except httpx.HTTPError as exc:
                return type(exc).__name__

        return list(await asyncio.gather(*(one() for _ in range(n))))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_a_descriptor_shortage_is_not_blamed_on_a_healthy_upstream(
    tmp_path: Path, slow_upstream: tuple[FakeUpstream, str]
) -> None:
    _, url = slow_upstream
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(f"[server]\nport = {port}\n" + config_text(url, url, None))
    config.chmod(0o600)
    command = [*OMNIROUTE, "serve", "--config", str(config), "--state", str(tmp_path / "state.db")]
    # Measure what an idle instance holds, then start it again with that plus FD_HEADROOM.
    probe = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environment())
    try:
        wait_for(lambda: _up(port), 30, "serve answers")
        idle = _fds(probe.pid)
    finally:
        probe.send_signal(signal.SIGTERM)
        exit_code(probe, 10)
    limit = max(idle + FD_HEADROOM, MIN_OPEN_FILES)  # (fewer, and it refuses to start)

    def low_ulimit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    proc = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=environment(),
        preexec_fn=low_ulimit,
    )
    try:
        wait_for(lambda: _up(port), 30, "serve answers under the low ulimit")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as api:
            # Answer at once instead of waiting out cooldowns: the test is about what is blamed.
            patch = api.patch("/api/resilience", json={"comboCooldownWait": {"enabled": False}})
            assert patch.status_code == 200, patch.text
        asyncio.run(_crowd(port, CLIENTS))
        wait_for(lambda: _fds(proc.pid) <= idle + 2, 30, "the crowd's sockets are closed")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as api:
            connections = api.get("/api/resilience/connections").json()["connections"]
            breakers = api.get("/api/monitoring/health").json()["providerBreakers"]
        blamed = {
            c["id"]: (c["status"], c["backoffLevel"], c["lastError"])
            for c in connections
            if c["provider"] == "alpha" and (c["backoffLevel"] or c["status"] != "active")
        }
        alpha = next(b for b in breakers if b["provider"] == "alpha")
        assert not blamed, f"the upstream is blamed for the proxy's own descriptor shortage: {blamed}"
        assert (alpha["state"], alpha["failureCount"]) == ("CLOSED", 0), alpha
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()


def _up(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/api/monitoring/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
