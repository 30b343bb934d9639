"""The proxy server (and the demo's client traffic) as tasks in the console's event loop.

One process, one loop: the console reads the engine the server mutates without locks, because
nothing else runs while either of them runs. Stopping is ordered: the demo traffic first (it
would only produce errors), then uvicorn with its short grace period for in-flight requests,
whose lifespan stops the runtime (last persist, database closed).
"""

from __future__ import annotations

import asyncio
import socket

import uvicorn

from proxy import serve
from proxy.demo import DemoTraffic
from proxy.runtime import Runtime

START_TIMEOUT_S = 10.0


class ServerStopped(Exception):
    """The embedded server ended on its own (failed to start, or a signal stopped it)."""


class ProxyHost:
    """Owns the embedded uvicorn server task and, with `--demo`, the demo traffic."""

    def __init__(self, runtime: Runtime, sock: socket.socket, *, demo: bool = False) -> None:
        self.runtime = runtime
        self.sock = sock
        self.demo = demo
        self.base_url = serve.listen_url(sock)
        self.server: uvicorn.Server | None = None
        self.task: asyncio.Task[None] | None = None
        self._traffic: DemoTraffic | None = None
        self._stopping = False

    async def start(self) -> None:
        """Serve, and return once the lifespan has started the runtime (ServerStopped if it could not)."""
        if self._stopping:  # stopped before it started: a stop signal during startup
            return
        server = serve.make_server(self.runtime, self.sock)  # leaves the signals to run_tui's handlers
        self.server = server
        self.task = asyncio.create_task(_serve(server, self.sock), name="omniroute-server")
        async with asyncio.timeout(START_TIMEOUT_S):
            while not server.started:
                if self.task.done():
                    await self.task
                    if self._stopping:  # asked to stop while starting: not a failure
                        return
                    raise ServerStopped("the proxy server stopped while starting")
                await asyncio.sleep(0.01)
        if self.demo and not self._stopping:
            traffic = DemoTraffic(self.base_url)
            traffic.start()
            self._traffic = traffic

    async def stop(self) -> None:
        """Idempotent. In-flight requests get uvicorn's graceful-shutdown period, then are cut."""
        if self._stopping:
            if self.task is not None:
                await asyncio.gather(self.task, return_exceptions=True)
            return
        self._stopping = True
        traffic, self._traffic = self._traffic, None
        if traffic is not None:
            await traffic.stop()
        if self.server is not None:
            self.server.should_exit = True
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)
        else:
            self.sock.close()


async def _serve(server: uvicorn.Server, sock: socket.socket) -> None:
    try:
        await server.serve(sockets=[sock])
    except SystemExit as exc:  # uvicorn exits the process when the lifespan fails to start
        raise ServerStopped(f"the proxy server could not start (exit {exc.code})") from None
    finally:
        sock.close()
