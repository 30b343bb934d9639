"""Run an instance: build the runtime from the command line's choices and serve it with uvicorn.

Shared by `omniroute serve` (headless) and `omniroute tui` (which runs the same server inside the
console's event loop). Everything that can be wrong with the setup (config, bind address, state
file and its lock) is raised as `StartupError` with one message, before anything serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import gc
import http.client
import json
import logging
import os
import signal
import socket
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import uvicorn

from proxy import __version__, logs
from proxy.app import create_app
from proxy.config import Config, ConfigError, load_config, resolve_config_path, resolve_state_path
from proxy.protocol import BoundedHttp
from proxy.runtime import Runtime
from proxy.signals import StopSignals, release_lost_terminal
from proxy.statelock import StateInUse, StateLock, lock_path
from proxy.store import StoreError

log = logging.getLogger("omniroute")

SHUTDOWN_GRACE_S = 3
"""In-flight requests get this long to finish once a stop begins (`q`, or a first signal); a stop
signal's deadline is one second more (proxy.signals)."""
HEALTH_PATH = "/api/monitoring/health"
YOUNG_GC_THRESHOLD = 10_000
"""Allocations (net of frees) that start a young collection; CPython's default is 700. The
objects of the requests in flight are alive together, so at 700 their number alone set off a
young collection every few requests under load, walking them all and moving them to an older
generation they died in anyway (a tenth of the CPU per request in bench/proxy.py). At 10,000 a
young collection is rare and still short (about a millisecond), and the garbage cycles waiting
for it stay a few megabytes at most."""

_NOT_PERMITTED = (errno.EACCES, errno.EPERM, errno.EROFS)


class StartupError(Exception):
    """The instance cannot start; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class Options:
    config: str | None = None
    state: str | None = None
    host: str | None = None
    port: int | None = None
    demo: bool = False


def load(options: Options, env: Mapping[str, str] = os.environ) -> tuple[Config, Path]:
    """The config and the state path the options and environment select (StartupError if unusable)."""
    explicit = bool(options.config or env.get("OMNIROUTE_CONFIG"))
    try:
        config = load_config(resolve_config_path(options.config, env), env, explicit=explicit)
    except ConfigError as exc:
        raise StartupError(str(exc.with_refusals(options.host, options.port))) from exc
    server = config.server
    if options.host is not None or options.port is not None:
        server = replace(
            server,
            host=options.host if options.host is not None else server.host,
            port=options.port if options.port is not None else server.port,
        )
        config = replace(config, server=server)
    refusals = config.refusals()  # the same rules `omniroute config check` reports as errors
    if refusals:
        raise StartupError("\n".join(p.message for p in refusals))
    return config, resolve_state_path(options.state, env)


@contextlib.asynccontextmanager
async def instance(options: Options, env: Mapping[str, str] = os.environ) -> AsyncIterator[Runtime]:
    """A runtime for the options (the demo included), opened without a socket or the state lock:
    for callers that bind their own socket (tests, screenshots). `listening` is what serves."""
    async with _configured(options, env) as (config, state_path):
        yield _runtime(options, config, state_path, env)


@contextlib.asynccontextmanager
async def listening(
    options: Options, env: Mapping[str, str] = os.environ
) -> AsyncIterator[tuple[Runtime, socket.socket]]:
    """What `serve` and `tui` run on: the address bound, then the state file locked, then opened.

    In that order, a start refused for its address touches no file, and one refused because
    another instance owns the state file opens nothing in it. The store is closed before the lock
    is given up, so whoever takes the file next never meets it half closed.
    """
    async with _configured(options, env) as (config, state_path):
        server = config.server
        sock = bind_socket(server.host, server.port, token=server.management_token)
        try:
            # A fleet's replicas keep their state in Redis, not in a file: no file to lock.
            with contextlib.nullcontext() if config.state.shared else _lock(state_path, sock) as lock:
                runtime = _runtime(options, config, state_path, env)
                runtime.state_lock = lock
                try:
                    yield runtime, sock
                finally:
                    runtime.store.close()  # idempotent: normally the lifespan closed it already
        finally:
            sock.close()


@contextlib.asynccontextmanager
async def _configured(options: Options, env: Mapping[str, str]) -> AsyncIterator[tuple[Config, Path]]:
    """The config and state path to run with; with `--demo`, simulated upstreams and a temporary
    state directory that live as long as the block."""
    if options.demo:
        from proxy.demo import demo_environment

        with tempfile.TemporaryDirectory(prefix="omniroute-demo-") as tmp:
            async with demo_environment(Path(tmp), host=options.host, port=options.port) as config:
                refusals = config.refusals()  # the demo has no token either: same rules as a real config
                if refusals:
                    raise StartupError("\n".join(p.message for p in refusals))
                yield config, Path(tmp) / "state.db"
        return
    yield load(options, env)


def _runtime(options: Options, config: Config, state_path: Path, env: Mapping[str, str]) -> Runtime:
    runtime = _open(config, state_path, env)
    if options.demo:
        from proxy.demo import apply_demo_settings

        runtime.demo = True
        apply_demo_settings(runtime.settings)
    return runtime


def _lock(state_path: Path, sock: socket.socket) -> StateLock:
    try:
        return StateLock.acquire(
            state_path,
            url=listen_url(sock),
            version=__version__,
            waiting=lambda owner: log.warning(
                "%s: waiting for the instance that is stopping on it to finish (%s)",
                state_path,
                owner.describe(),
            ),
        )
    except StateInUse as exc:
        raise StartupError(str(exc)) from None
    except OSError as exc:
        lock = lock_path(state_path)
        why = exc.strerror or str(exc)
        if exc.errno == errno.ENOSPC:
            reason = f"the disk is full ({why}); free space there or move the state file"
        elif exc.errno in _NOT_PERMITTED:
            # The lock file, or else the nearest directory that exists: the one that would not
            # take the missing ones (naming a directory that is not there tells nothing).
            blocker = lock if lock.exists() else next(p for p in lock.parents if p.exists())
            reason = f"{blocker} is not writable by this user ({why}); fix its owner, mode or mount, or choose another --state"
        elif exc.errno in (errno.EEXIST, errno.ENOTDIR) and (
            file := next((p for p in lock.parents if p.is_file()), None)
        ):
            reason = f"{file} is a file, not a directory; choose another --state"
        else:
            reason = why
        raise StartupError(f"{state_path}: cannot lock the state file ({lock.name}): {reason}") from exc


def listen_url(sock: socket.socket) -> str:
    """`http://127.0.0.1:20128` for a bound socket (IPv6 hosts in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _open(config: Config, state_path: Path, env: Mapping[str, str]) -> Runtime:
    try:
        return Runtime.open(config, state_path, env=env)
    except StoreError as exc:
        raise StartupError(str(exc)) from exc
    except OSError as exc:
        raise StartupError(f"{state_path}: cannot open the state database ({exc.strerror or exc})") from exc


def bind_socket(host: str, port: int, *, token: str | None = None) -> socket.socket:
    """Bind before serving so that "address in use" is a clear startup error, not a log line.

    `token`: the management token, to ask whoever holds the port what it is (`holder`).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # accepted sockets inherit it. With proto 0, Nagle + delayed ACK add ~40 ms to every response.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        other = holder(host, port, token) if exc.errno == errno.EADDRINUSE else None
        if other is not None:
            raise StartupError(
                f"cannot listen on {host}:{port}: {other} (stop it, or choose another --port)"
            ) from exc
        raise StartupError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc} "
            "(is another instance running? choose another --port)"
        ) from exc
    sock.listen(2048)
    sock.setblocking(False)
    return sock


HOLDER_PROBE_TIMEOUT_S = 0.5
"""Whoever holds the port is on this machine: an omniroute answers its health route in milliseconds."""


def holder(host: str, port: int, token: str | None = None) -> str | None:
    """What holds the port, when it is an omniroute (its health route says what `omniroute status`
    would): "another omniroute 0.4.0, up 12 min, is serving on HOST:PORT". None when it cannot be known."""
    probe = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    connection = http.client.HTTPConnection(probe, port, timeout=HOLDER_PROBE_TIMEOUT_S)
    try:
        connection.request("GET", HEALTH_PATH, headers={"Authorization": f"Bearer {token}"} if token else {})
        response = connection.getresponse()
        health = json.loads(response.read()) if response.status == 200 else None
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        connection.close()
    if not isinstance(health, dict):
        return None
    version, uptime_ms = health.get("version"), health.get("uptimeMs")
    if not isinstance(version, str) or not isinstance(uptime_ms, int | float):
        return None
    return f"another omniroute {version}, up {_uptime(uptime_ms)}, is serving on {host}:{port}"


def _uptime(ms: float) -> str:
    seconds = int(ms // 1000)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    hours, minutes = divmod(seconds // 60, 60)
    return f"{hours} h {minutes:02d} min" if hours < 48 else f"{hours // 24} days"


def make_server(runtime: Runtime, sock: socket.socket, *, log_level: str = "warning") -> uvicorn.Server:
    config = uvicorn.Config(
        create_app(runtime),
        http=BoundedHttp,  # httptools with a bounded request head (proxy.protocol)
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        log_config=None,
    )
    server = _Server(config, on_stop=runtime.stopping)
    # uvicorn would take over SIGINT/SIGTERM (not SIGHUP) for the duration of `serve()` and re-raise
    # them afterwards, killing the process by the signal after its clean stop. The process's own
    # handlers (proxy.signals) decide instead, the same way for `serve` and `tui`.
    server.capture_signals = _no_signal_capture  # type: ignore[method-assign]
    return server


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, *, on_stop: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_stop = on_stop

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn waits for open responses before the lifespan's shutdown: the live streams, which
        # never end by themselves, and the requests waiting (a cooldown can last a minute and a
        # half) end first, or every stop would wait out the grace period.
        self._on_stop()
        await super().shutdown(sockets)


@contextlib.contextmanager
def _no_signal_capture() -> Iterator[None]:
    yield


def settle_heap() -> None:
    """Set the heap up for serving: called once everything that lives as long as the process
    (modules, config, engine, widgets) exists.

    That heap is frozen, out of the collector's reach, so that a full collection walks only
    request-time objects (each one otherwise walked the whole startup heap, stalling the loop for
    tens of ms under load); young collections start at YOUNG_GC_THRESHOLD; and the C allocator
    keeps the memory requests free (`_keep_freed_memory`)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_THRESHOLD, older, oldest)
    _keep_freed_memory()


MMAP_THRESHOLD = 4 * 1024 * 1024
"""Allocations from this size on get pages of their own (glibc's `M_MMAP_THRESHOLD`)."""
TRIM_THRESHOLD = 32 * 1024 * 1024
"""Free memory at the top of the heap is given back to the system past this much (`M_TRIM_THRESHOLD`)."""


def _keep_freed_memory() -> None:
    """Have glibc's allocator keep the memory a request frees for the next one, up to TRIM_THRESHOLD.

    A coding agent's request passes through as several buffers of its 400 KB (the body as it
    arrived, the body with the attempt's model, aiohttp's request). By default glibc gives the top of
    the heap back to the system as soon as they are freed, and the next request faults the same
    pages in again, zeroed: 260 page faults and about half the proxy's CPU per agent request under
    wrk (docs/performance.md). Allocations up to MMAP_THRESHOLD now
    come from the heap, and its free top is kept up to TRIM_THRESHOLD: the process holds on to what
    its busiest moment needed, and no more. Elsewhere than glibc, nothing changes."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: the C library's among them
    except (OSError, AttributeError):  # no mallopt (not glibc)
        return
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
"""glibc's `mallopt` parameters (malloc.h)."""


MIN_OPEN_FILES = 64
"""The fewest open files an instance starts with: its event loop, listening socket, state database
(with its write-ahead log and index), lock files and log take about thirty, and each request in
flight two more (its client's socket and its upstream's)."""


def open_files_limit(minimum: int = MIN_OPEN_FILES) -> None:
    """Raise this process's soft limit on open files to its hard one, as servers do (a laptop's
    default soft limit of 1,024 runs out under a busy agent long before the hard limit does); a
    StartupError naming the limit when even that is under `minimum` (without it the start failed
    deep in the event loop's setup, in words about the loop)."""
    try:
        import resource
    except ImportError:  # (Windows: no such limit)
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    if soft != resource.RLIM_INFINITY and soft < minimum:
        raise StartupError(
            f"the open-file limit is {soft} (ulimit -n) and omniroute needs at least {minimum}:"
            f" raise it (`ulimit -n 4096`, or LimitNOFILE= in a systemd unit)"
        )


def run_headless(options: Options) -> None:
    """`omniroute serve`: serve until SIGTERM, SIGINT or SIGHUP (proxy.signals), logging to stderr."""
    open_files_limit()

    async def main(signals: StopSignals) -> None:
        async with listening(options) as (runtime, sock):
            logs.log_events(runtime.bus)  # headless, the log is the only place state changes show
            server = runtime.config.server
            for warning in runtime.warnings:
                log.warning("%s", warning)
            log.warning("omniroute %s serving on http://%s:%d/v1", runtime.version, server.host, server.port)
            settle_heap()
            traffic = None
            if options.demo:
                from proxy.demo import DemoTraffic

                traffic = DemoTraffic(f"http://{server.host}:{server.port}")
                traffic.start()
            uvicorn_server = make_server(runtime, sock, log_level=logs.uvicorn_level())

            def stop(sig: signal.Signals) -> None:
                # A terminal that went away (SIGHUP, or a signal after a hang-up) fails every write:
                # stdio goes to /dev/null first, so that the log lines of the stop cannot fail.
                release_lost_terminal()
                log.warning("%s: stopping (in-flight requests get up to %d s)", sig.name, SHUTDOWN_GRACE_S)
                uvicorn_server.should_exit = True

            signals.attach(asyncio.get_running_loop(), stop)
            try:
                await uvicorn_server.serve(sockets=[sock])
            finally:
                signals.detach()
                if traffic is not None:
                    await traffic.stop()
                sock.close()

    with (
        StopSignals(deadline_s=SHUTDOWN_GRACE_S + 1, keep_ignored=True) as signals,
        asyncio.Runner(loop_factory=_fast_loop_factory()) as runner,
    ):
        runner.run(main(signals))


def _fast_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when it is installed (uvicorn[standard] brings it, except on Windows), as `uvicorn.run`
    would choose: `Server.serve()` runs on whatever loop it is given, and on the stdlib one the
    proxy spends about a fifth more CPU per request (bench/proxy.py)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
