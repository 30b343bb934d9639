"""The demo's environment: every simulated upstream started, and the demo config written for them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import proxy.demo as demo_package
from proxy.config import Config, load_config
from proxy.demo.config import DEMO_PORT, demo_config_text, write_private
from proxy.demo.schedules import FlakySchedule
from proxy.demo.servers import RunningUpstream, start_upstream, stop_upstreams
from proxy.demo.upstreams import UPSTREAM_KINDS, demo_upstream_app


@contextlib.asynccontextmanager
async def demo_environment(
    tmp: Path,
    *,
    host: str | None = None,
    port: int | None = None,
    flaky_schedule: FlakySchedule | None = None,
    seed: int | None = None,
) -> AsyncIterator[Config]:
    """Start every simulated upstream in the current event loop and yield the demo config.

    The config file is written into `tmp`; the proxy listens on `host`/`port` (default
    127.0.0.1:20128). The upstreams stop on exit. `flaky_schedule` defaults to
    `DEFAULT_FLAKY_SCHEDULE` (read at call time); `seed` makes the upstreams' randomness repeatable.
    """
    schedule = flaky_schedule or demo_package.DEFAULT_FLAKY_SCHEDULE
    running: list[RunningUpstream] = []
    try:
        for i, kind in enumerate(UPSTREAM_KINDS):
            app = demo_upstream_app(kind, flaky_schedule=schedule, seed=None if seed is None else seed + i)
            running.append(await start_upstream(app, kind))
        ports = {kind: r.port for kind, r in zip(UPSTREAM_KINDS, running, strict=True)}
        path = tmp / "demo-config.toml"
        write_private(
            path, demo_config_text(ports, host if host is not None else "127.0.0.1", port or DEMO_PORT)
        )
        yield load_config(path, explicit=True)
    finally:
        await stop_upstreams(running)
