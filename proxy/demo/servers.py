"""Running the simulated upstreams: one uvicorn server task each, on a free loopback port, in the caller's loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field

import uvicorn
from starlette.types import ASGIApp


class _UpstreamServer(uvicorn.Server):
    """A uvicorn server that leaves SIGINT/SIGTERM alone.

    Several servers share the loop; if each captured the signals, their handlers would be restored
    out of order on shutdown. The proxy's own server handles the signals and the demo stops after it.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass(slots=True)
class RunningUpstream:
    server: uvicorn.Server
    task: asyncio.Task[None]
    sock: socket.socket
    port: int = field(init=False)

    def __post_init__(self) -> None:
        self.port = int(self.sock.getsockname()[1])


UPSTREAM_START_TIMEOUT_S = 10.0


async def start_upstream(app: ASGIApp, kind: str) -> RunningUpstream:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        log_config=None,
        timeout_graceful_shutdown=1,
    )
    server = _UpstreamServer(config)
    running = RunningUpstream(
        server, asyncio.create_task(server.serve(sockets=[sock]), name=f"demo-{kind}"), sock
    )
    try:
        async with asyncio.timeout(UPSTREAM_START_TIMEOUT_S):
            while not server.started:
                if running.task.done():
                    await running.task  # raises the startup error, if it has one
                    raise RuntimeError(f"demo upstream {kind!r} stopped while starting")
                await asyncio.sleep(0.005)
    except BaseException:
        await stop_upstreams([running])
        raise
    return running


async def stop_upstreams(running: list[RunningUpstream]) -> None:
    for r in running:
        r.server.should_exit = True
    # The servers are gone when the demo is: their own failures at shutdown do not matter.
    await asyncio.gather(*(r.task for r in running), return_exceptions=True)
    for r in running:
        r.sock.close()
