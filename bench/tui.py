"""The console's cost, against the bars of docs/performance.md, in one command:

    python bench/tui.py                      # about 4 minutes
    python bench/tui.py --seconds 5 --rounds 1

(a) Proxy p99 latency at 8 connections, demo-sized state (200 connections, 1,000 lockouts), with
    the console open (the Textual app running headless in the proxy's own process and event loop,
    ticking live, on the Overview and on the Lockouts tab) versus headless (the same proxy, no
    console: as `omniroute serve` runs it, and with the console's gc.freeze()). A fixed-reply nginx
    upstream and `wrk -c8` (bench/post.lua), the proxy pinned to CPU 0 and nginx and wrk to CPU 1;
    many short rounds, the modes rotated in each; each ratio is the median of the per-round ratios
    (one run's p99 moves by a third with the machine's drift alone; the modes of one round run back
    to back), the ratio of the modes' median p99s beside it; bar: console p99 <= 1.3x headless p99.
(b) One redraw tick with 10,000 lockouts on the Lockouts tab: snapshot build + table apply, after
    the clock moved one second (so every countdown on screen changes). Bar: <= 50 ms.
(c) Resident memory: of the console process in (a) (peak) and of the 10,000-lockout process in
    (b). Bar: <= 200 MB.
(d) Attached observers: the headless proxy's p99 with one console attached over the live stream
    (`omniroute tui --url`, its own process, on CPU 1) and with ten `--follow` clients of which one
    never reads (9 `omniroute events -f` processes and a socket that is never read), against the
    same instance with nothing attached (*alone*). Each round serves every observer mode from one
    headless instance, the observers attached and detached in turn (rotated), so that what differs
    between turns is the observers, not the instance. Bars: <= 1.05x and <= 1.10x. The attached
    console toggles a connection once a second (so the stream carries events and rows) and reports
    how long each change took to reach its mirror; bar: <= 0.5 s. Its p99 is compared with the headless proxy's under the
    same toggles, sent by a plain API client (*toggled*): an operator changes things with or
    without a console, and the ratio is to say what attaching one costs. Each round also runs
    *toggled* a second time (*again*, an A/A) and the *control* (1 % of a core burnt in 0.1 ms
    slices on the console's core): what their ratios spread over is the benchmark's own resolution.
(e) One redraw tick on the Requests tab with 2,000 finished request records and 50 alive ones
    (whose ages tick), after the clock moved one second, and after 20 more requests ended. Bar:
    <= 50 ms.
(f) What attaching costs the proxy: the `snapshot` a console or a follower is sent first, built
    and encoded on the proxy's event loop, with (a)'s state and (e)'s requests. No bar: the loop
    serves nothing else meanwhile, so this is how long one attach holds every request back.

Read the ratios, not the times: the machine is shared and noisy. Needs nginx and wrk.
Exits 0 when everything ran (whether or not a bar is met), 1 when something could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # this checkout's code, even when another copy is installed

PROVIDERS = 20
CONNECTIONS_PER_PROVIDER = 10  # 200 connections
DEMO_LOCKOUTS = 1_000
TICK_LOCKOUTS = 10_000
BARS = {
    "p99_ratio": 1.3,
    "tick_ms": 50.0,
    "rss_mb": 200.0,
    "attached": 1.05,
    "followers": 1.10,
    "change_s": 0.5,
}
OBSERVED = ("alone", "toggled", "again", "control", "attached", "followers")
"""Turns of one headless instance per round (`observed_round`), with observers attached from other
processes or, *alone*, none (the followers' baseline). *again* is the toggled baseline run a second
time in each round (an A/A): the spread of its ratio to the first is the benchmark's own, which a
bar on the attached console's ratio cannot be finer than."""
FOLLOWERS = 10
CONTROL_RATE = 100
CONTROL_SLICE_MS = 0.1
"""The control of (d): the toggler, plus CPU burnt in CONTROL_RATE slices of CONTROL_SLICE_MS a
second (1 % of a core, the least disruptive way to take it) and nothing else: what any observer
taking that much of the load generator's core costs on this machine, whatever its design."""
FINISHED_REQUESTS = 2_000
ALIVE_REQUESTS = 50

NGINX_CONF = """
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx.err warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path {tmp};
  server {{
    listen 127.0.0.1:{port};
    location /v1/chat/completions {{
      default_type application/json;
      return 200 '{{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench-model","choices":[{{"index":0,"message":{{"role":"assistant","content":"pong"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}}}';
    }}
    location /v1/models {{
      default_type application/json;
      return 200 '{{"object":"list","data":[{{"id":"bench-model","object":"model","created":1700000000,"owned_by":"bench"}}]}}';
    }}
  }}
}}
"""


# -- the state ------------------------------------------------------------------------------------


def config_text(upstream_port: int) -> str:
    parts = []
    for p in range(PROVIDERS):
        parts.append(
            f'[providers.p{p:02d}]\nclass = "local"\nbase_url = "http://127.0.0.1:{upstream_port}/v1"\n'
        )
        for c in range(CONNECTIONS_PER_PROVIDER):
            parts.append(f'[[providers.p{p:02d}.connections]]\nid = "p{p:02d}-c{c}"\n')
    return "\n".join(parts)


def build_runtime(upstream_port: int, lockouts: int, *, fake_clock: bool) -> Any:
    from proxy.config import load_config
    from proxy.resilience.clock import FakeClock
    from proxy.resilience.lockout import LockoutSettings
    from proxy.runtime import Runtime
    from proxy.store import MemoryStore

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.toml"
        path.write_text(config_text(upstream_port))
        path.chmod(0o600)
        config = load_config(path, {}, explicit=True)
    runtime = Runtime(config, MemoryStore(), clock=FakeClock() if fake_clock else None, env={})
    engine = runtime.engine
    now = engine.clock.now()
    settings = LockoutSettings(enabled=True)
    connections = list(engine.connections.values())
    per_connection = -(-lockouts // len(connections))
    n = 0
    for m in range(per_connection):
        for conn in connections:
            if n == lockouts:
                break
            # Never the benchmark's model: the locks must cost the console, not block the traffic.
            hint = 3_600_000 - (n % 3600) * 1000  # an hour, staggered so countdowns differ
            engine.lockouts.record_failure(
                conn.spec.provider,
                conn.spec.id,
                f"locked-{m}",
                now,
                settings,
                status=404,
                reason="not_found",
                hint_ms=hint,
            )
            n += 1
    return runtime


# -- (a) the child process that serves -----------------------------------------------------------


class Stalls:
    """What delays requests besides their own work: how late a 5 ms sleep wakes up (the loop was
    busy elsewhere), and how long each full garbage collection takes."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.collections: list[float] = []
        self._gc_start = 0.0
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif info["generation"] == 2:
            self.collections.append((time.perf_counter() - self._gc_start) * 1000)

    async def watch(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(0.005)
            self.lags.append((time.perf_counter() - start) * 1000 - 5)

    def report(self) -> str:
        lags = sorted(self.lags) or [float("nan")]
        worst_gc = max(self.collections, default=0.0)
        return (
            f"STALLS lag_p99_ms={lags[int(len(lags) * 0.99)]:.1f} lag_max_ms={lags[-1]:.1f} "
            f"full_gcs={len(self.collections)} gc_max_ms={worst_gc:.1f}"
        )


async def serve_child(mode: str, port: int, upstream_port: int, tab: str) -> None:
    """One serving process. SIGUSR1: the measured run starts (watch the stalls from here);
    SIGTERM: stop, and print what was seen."""
    from proxy import serve

    runtime = build_runtime(upstream_port, DEMO_LOCKOUTS, fake_clock=False)
    sock = serve.bind_socket("127.0.0.1", port)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    stalls = Stalls()
    watching: list[asyncio.Task[None]] = []

    def measure() -> None:
        stalls.lags.clear()
        stalls.collections.clear()
        if not watching:  # one watcher: an instance of (d) is measured once per observer turn
            watching.append(asyncio.create_task(stalls.watch()))

    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, measure)
    ticks: list[float] = []
    if mode.startswith("headless"):
        server = serve.make_server(runtime, sock)
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
        task = asyncio.create_task(server.serve(sockets=[sock]))
        if mode == "headless-frozen":  # what `omniroute serve` (serve.py) and the console (app.py) do
            while not server.started:
                await asyncio.sleep(0.01)
            serve.settle_heap()
        await stop.wait()
        server.should_exit = True
        await task
    else:
        from omniroute_tui.app import make_app

        app = make_app(runtime, serve_sock=sock)
        collect = app.feed.collect

        def timed(*, force: bool = False) -> Any:
            start = time.perf_counter()
            result = collect(force=force)
            if result is not None:
                ticks.append((time.perf_counter() - start) * 1000)
            return result

        app.feed.collect = timed  # type: ignore[method-assign]
        async with app.run_test(size=(120, 40)) as pilot:
            if tab != "overview":
                await pilot.press({"breakers": "2", "connections": "3", "lockouts": "4", "events": "6"}[tab])
            await stop.wait()
            app.exit()
    for task in watching:
        task.cancel()
    print(stalls.report(), flush=True)
    if ticks:
        print(
            f"TICKS n={len(ticks)} median_ms={statistics.median(ticks):.2f} max_ms={max(ticks):.2f}",
            flush=True,
        )


# -- (b) the redraw tick ---------------------------------------------------------------------------


async def tick_bench(samples: int) -> dict[str, float]:
    """Times the console's own work for one tick on the Lockouts tab: the feed's snapshot build,
    the table's diff, and the repaint of the visible rows that the diff invalidated."""
    from omniroute_tui.app import make_app
    from proxy.resilience.lockout import LockoutSettings

    runtime = build_runtime(9, TICK_LOCKOUTS, fake_clock=True)
    engine = runtime.engine
    clock = engine.clock
    app = make_app(runtime, clock_frozen=True)

    def tick(force: bool = False) -> tuple[float, float, float]:
        start = time.perf_counter()
        snapshot = app.feed.collect(force=force)
        built = time.perf_counter()
        assert snapshot is not None and snapshot.table is not None
        app.status.show(snapshot.header)
        app.panes["lockouts"].apply(snapshot.table)
        applied = time.perf_counter()
        table = app.table("lockouts")
        table.render_lines(table.region.reset_offset)  # what the compositor repaints after the diff
        painted = time.perf_counter()
        return (built - start) * 1000, (applied - built) * 1000, (painted - applied) * 1000

    figures: dict[str, float] = {}
    async with app.run_test(size=(120, 40)) as pilot:
        app.feed.tab = "lockouts"  # the first time the tab shows: every row is new to the table
        figures["first_show_ms"] = sum(tick(force=True))
        await pilot.press("4")
        await pilot.pause()
        runs = []
        for _ in range(samples):
            clock.advance(1000)  # every countdown on screen changes
            runs.append(tick())
            await pilot.pause()
        for i, name in enumerate(("build_ms", "apply_ms", "repaint_ms")):
            figures[name] = statistics.median(r[i] for r in runs)
        totals = [sum(r) for r in runs]
        figures["tick_ms"], figures["tick_max_ms"] = statistics.median(totals), max(totals)
        # A burst: 100 new locks that sort to the top of the table, and 100 lifted.
        now = clock.now()
        settings = LockoutSettings(enabled=True)
        for i in range(100):
            engine.lockouts.record_failure(
                "p00",
                "p00-c0",
                f"fresh-{i}",
                now,
                settings,
                status=404,
                reason="not_found",
                hint_ms=7_200_000,
            )
        for provider, connection, model in engine.lockouts.keys()[:100]:
            engine.reenable(provider, model, connection, source="bench")
        clock.advance(1000)
        figures["burst_tick_ms"] = sum(tick())
        await pilot.pause()
        await pilot.press("1")
        await pilot.pause()
        clock.advance(1000)
        start = time.perf_counter()
        snapshot = app.feed.collect()
        assert snapshot is not None and snapshot.overview is not None
        app.overview.apply(snapshot.overview)
        figures["overview_tick_ms"] = (time.perf_counter() - start) * 1000
    figures["rss_mb"] = rss_mb(os.getpid(), "VmHWM")
    return figures


def attach_bench(samples: int) -> dict[str, float]:
    """(f): what a console or a follower attaching costs the proxy: the `snapshot` it is sent
    first, built and encoded on the proxy's event loop (nothing else runs meanwhile), with
    demo-sized state and a full request trail."""
    import orjson

    from proxy import serve

    runtime = build_runtime(9, DEMO_LOCKOUTS, fake_clock=True)
    fill_trail(runtime, FINISHED_REQUESTS, ALIVE_REQUESTS)
    serve.settle_heap()  # as `omniroute serve` does once it is up
    hub = runtime.stream
    builds, encodes = [], []
    size = 0
    for _ in range(samples):
        start = time.perf_counter()
        data = hub.snapshot_data()
        built = time.perf_counter()
        size = len(orjson.dumps(data))
        encodes.append((time.perf_counter() - built) * 1000)
        builds.append((built - start) * 1000)
    return {
        "build_ms": statistics.median(builds),
        "encode_ms": statistics.median(encodes),
        "total_max_ms": max(b + e for b, e in zip(builds, encodes, strict=True)),
        "kb": size / 1024,
    }


def fill_trail(runtime: Any, finished: int, alive: int, start: int = 0) -> None:
    """`finished` request records that ended (a fallback in every fifth) and `alive` that run on."""
    trail = runtime.trail
    clock = runtime.engine.clock
    for i in range(start, start + finished + alive):
        record = trail.begin(f"{i:016x}", "127.0.0.1", "chat/completions")
        record.model_asked, record.route = f"p{i % 20:02d}/model-{i % 7}", "target"
        if i >= start + finished:
            trail.state(record, "upstream")
            continue
        now = clock.now()
        if i % 5 == 0:
            record.attempts.append(("p00/m", "p00", "p00-c0", now, 40, 429, "fallback", "429 rate_limited"))
        record.attempts.append(("p01/m", "p01", "p01-c0", now, 120, 200, "ok", "ok"))
        record.usage = (20, 100, 120)
        trail.end(record, 200)


async def requests_tick_bench(samples: int) -> dict[str, float]:
    """Times one tick on the Requests tab: snapshot build, table diff, repaint."""
    from omniroute_tui.app import make_app

    runtime = build_runtime(9, 0, fake_clock=True)
    clock = runtime.engine.clock
    fill_trail(runtime, FINISHED_REQUESTS, ALIVE_REQUESTS)
    app = make_app(runtime, clock_frozen=True)

    def tick(force: bool = False) -> float:
        start = time.perf_counter()
        snapshot = app.feed.collect(force=force)
        assert snapshot is not None and snapshot.table is not None
        app.status.show(snapshot.header)
        app.panes["requests"].apply(snapshot.table)
        table = app.table("requests")
        table.render_lines(table.region.reset_offset)
        return (time.perf_counter() - start) * 1000

    figures: dict[str, float] = {}
    async with app.run_test(size=(120, 40)) as pilot:
        app.feed.tab = "requests"
        figures["first_show_ms"] = tick(force=True)
        await pilot.press("7")
        await pilot.pause()
        runs = []
        for _ in range(samples):
            clock.advance(1000)  # every alive request's age moves
            runs.append(tick())
            await pilot.pause()
        figures["tick_ms"], figures["tick_max_ms"] = statistics.median(runs), max(runs)
        fill_trail(runtime, 20, 0, start=FINISHED_REQUESTS + ALIVE_REQUESTS)
        clock.advance(1000)
        figures["burst_tick_ms"] = tick()
    return figures


# -- measuring helpers ---------------------------------------------------------------------------


def switches(pid: int | str = "self") -> int:
    """How many times the process gave up the CPU of its own accord (how often it slept and was
    woken): each wake-up of an observer on the load generator's core can preempt it."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():  # every thread's, not only the main one's
        with contextlib.suppress(OSError):
            found = re.search(r"^voluntary_ctxt_switches:\s+(\d+)", (task / "status").read_text(), re.M)
            total += int(found.group(1)) if found else 0
    return total


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 60.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.1)
    return False


def pinned(cpu: int, command: list[str]) -> list[str]:
    """The command on one CPU: the proxy on CPU 0, nginx and wrk on CPU 1, so that the load
    generator and the upstream never take turns with the process being measured (on a 2-core
    machine that turn-taking, not the console, set most of the p99 spread)."""
    if shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        return ["taskset", "-c", str(cpu), *command]
    return command


def wrk(port: int, seconds: int) -> dict[str, float]:
    out = subprocess.run(
        pinned(
            1,
            [
                "wrk",
                "-t1",
                "-c8",
                f"-d{seconds}s",
                "--timeout",
                "10s",
                "-s",
                str(HERE / "post.lua"),
                f"http://127.0.0.1:{port}/v1/chat/completions",
            ],
        ),
        capture_output=True,
        text=True,
        env={**os.environ, "BENCH_MODEL": "p00/bench-model"},
    )
    m = re.search(r"RESULT (.*)", out.stdout)
    if not m:
        raise RuntimeError(f"wrk produced no result: {(out.stdout + out.stderr)[-300:]!r}")
    return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


ATTACHED_TAB = "overview"
"""`--attached-tab`: the tab the attached console of (d) shows (it asks the stream for request
records only on the Requests tab)."""
OBSERVER_NICE = 0
"""`--observer-nice`: the niceness of the attached console and of its baseline's toggler."""


def observer(command: list[str]) -> list[str]:
    """An observer's command line: on CPU 1 (with the load generator), at OBSERVER_NICE."""
    command = pinned(1, command)
    return ["nice", "-n", str(OBSERVER_NICE), *command] if OBSERVER_NICE else command


def start_observers(
    mode: str, port: int, tmp: Path
) -> tuple[list[subprocess.Popen[bytes]], list[socket.socket]]:
    """(d): the attached console, or the followers (one of them a socket that never reads), or for
    *alone* nothing."""
    if mode == "alone":
        return [], []
    url = f"http://127.0.0.1:{port}"
    if mode in ("toggled", "again", "control"):
        burn = ["--burn"] if mode == "control" else []
        return [
            subprocess.Popen(
                observer([sys.executable, __file__, "--toggle", url, *burn]),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=ROOT,
            )
        ], []
    if mode == "attached":
        log = tmp / f"observer-{port}.log"
        with open(log, "wb") as out:
            console = subprocess.Popen(
                observer([sys.executable, __file__, "--observe", url, "--tab", ATTACHED_TAB]),
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        # As for the followers: the measure is of a console that is attached, not of its start
        # (its snapshot, which the attach figure of (d) times on its own).
        deadline = time.monotonic() + 60
        while b"ATTACHED" not in log.read_bytes():
            if console.poll() is not None or time.monotonic() > deadline:
                console.kill()
                raise RuntimeError(f"the attached console did not attach: {log.read_text()[-500:]}")
            time.sleep(0.05)
        return [console], []
    command = [
        sys.executable,
        "-c",
        "from omniroute_tui.cli import main; main()",
        "events",
        "-f",
        "--json",
        "--url",
        url,
    ]
    followers = [
        subprocess.Popen(pinned(1, command), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        for _ in range(FOLLOWERS - 1)
    ]
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(("127.0.0.1", port))
    stalled.sendall(f"GET /api/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    # The measure is of followers that follow, not of their start (a snapshot each): wait for them.
    deadline = time.monotonic() + 60
    while established(port) < FOLLOWERS:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {established(port)} of {FOLLOWERS} followers connected")
        time.sleep(0.1)
    return followers, [stalled]


def established(port: int) -> int:
    """TCP connections established to `port` on this machine (the proxy's side of each)."""
    out = subprocess.run(
        ["ss", "-Htn", "state", "established", f"( sport = :{port} )"],
        capture_output=True,
        text=True,
        check=False,
    )
    return len(out.stdout.splitlines())


async def toggle(url: str, *, burn: bool = False) -> None:
    """The baseline of the attached console in (d): the same toggles, from a plain API client;
    with `burn`, the control: CPU burnt in CONTROL_RATE slices a second besides."""
    import httpx

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    def burn_slice() -> None:
        until = time.perf_counter() + CONTROL_SLICE_MS / 1000
        while time.perf_counter() < until:
            pass
        if not stop.is_set():
            loop.call_later(1 / CONTROL_RATE, burn_slice)

    if burn:
        loop.call_soon(burn_slice)
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        target = (await client.get("/api/resilience/connections")).json()["connections"][-1]["id"]
        enabled = True
        while not stop.is_set():
            enabled = not enabled
            await client.put(f"/api/providers/{target}", json={"isActive": enabled})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)


async def observe(url: str, tab: str) -> None:
    """The attached console of (d), headless: toggles a connection once a second over the API and
    times each change until its own mirror shows it; prints CHANGES on SIGTERM."""
    import httpx

    from omniroute_tui.app import OmniRouteApp
    from omniroute_tui.remote import Remote

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    took: list[float] = []
    app = OmniRouteApp(remote=Remote(url, None))
    async with app.run_test(size=(120, 40)) as pilot, httpx.AsyncClient(base_url=url, timeout=10) as client:
        if tab == "requests":
            await pilot.press("7")
        remote = app.remote
        assert remote is not None
        while not (remote.connected and remote.mirror.ready):
            await asyncio.sleep(0.01)
        target = (await client.get("/api/resilience/connections")).json()["connections"][-1]["id"]
        print("ATTACHED", flush=True)  # run_mode measures from here: attached, not attaching
        # Woken by the mirror as it tells the console an event (once the rows it changed are in),
        # not by polling it: the harness must not add wake-ups of its own to the console's.
        told = asyncio.Event()
        remote.mirror.subscribe(lambda _event: told.set())
        enabled = True
        began, cpu_began = time.monotonic(), time.process_time()  # its start-up left out
        switches_began = switches()
        while not stop.is_set():
            enabled = not enabled
            started = time.perf_counter()
            told.clear()
            await client.put(f"/api/providers/{target}", json={"isActive": enabled})
            while (
                row := remote.mirror.connection(target, remote.mirror.now())
            ) is None or row.enabled != enabled:
                told.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(told.wait(), 0.1)
            took.append(time.perf_counter() - started)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
    if took:
        elapsed = time.monotonic() - began
        cpu = (time.process_time() - cpu_began) / elapsed
        wakeups = (switches() - switches_began) / elapsed
        print(
            f"CHANGES n={len(took)} median_s={statistics.median(took):.3f} max_s={max(took):.3f} cpu={cpu:.3f}"
            f" wakeups={wakeups:.0f}",
            flush=True,
        )


def start_served(
    served: str, tab: str, upstream: int, tmp: Path
) -> tuple[subprocess.Popen[bytes], int, Path]:
    """A serving child of this script on CPU 0 (`--serve`), its port and its log, once it listens."""
    port = free_port()
    log = tmp / f"{served}-{tab}-{port}.log"
    with open(log, "wb") as out:
        child = subprocess.Popen(
            pinned(
                0,
                [
                    sys.executable,
                    __file__,
                    "--serve",
                    served,
                    "--port",
                    str(port),
                    "--upstream",
                    str(upstream),
                    "--tab",
                    tab,
                ],
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    if not wait_port(port):
        stop_served(child)
        raise RuntimeError(f"{served} did not start: {log.read_text()[-500:]}")
    return child, port, log


def stop_served(child: subprocess.Popen[bytes]) -> None:
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()


def measured_turn(
    mode: str, child: subprocess.Popen[bytes], port: int, seconds: int, tmp: Path
) -> dict[str, Any]:
    """One measured wrk run against `child`, with `mode`'s observers attached for it (and stopped
    after): a warm-up, then `seconds` of wrk, and the proxy's CPU per request over them."""
    observers: list[subprocess.Popen[bytes]] = []
    sockets: list[socket.socket] = []
    try:
        if mode in OBSERVED:
            observers, sockets = start_observers(mode, port, tmp)
        wrk(port, 3)  # warm-up: connections, the upstream client pool, the console's first draws
        child.send_signal(signal.SIGUSR1)
        before = cpu_seconds(child.pid)
        result: dict[str, Any] = wrk(port, seconds)
        # The proxy's CPU per request: what the modes cost the process measured, which the
        # machine's load moves far less than it moves p99.
        result["cpu_us"] = (cpu_seconds(child.pid) - before) / max(result["requests"], 1) * 1e6
        result["rss_mb"] = rss_mb(child.pid, "VmHWM")
    finally:
        for observer in observers:
            observer.send_signal(signal.SIGTERM)
        for observer in observers:
            try:
                observer.wait(timeout=30)
            except subprocess.TimeoutExpired:
                observer.kill()
        for sock in sockets:
            sock.close()
    if mode == "attached":
        observed = tmp / f"observer-{port}.log"
        found = re.search(r"CHANGES (.*)", observed.read_text())
        if found is None:
            raise RuntimeError(f"the attached console reported nothing: {observed.read_text()[-500:]}")
        result.update({"change_" + k: float(v) for k, v in (kv.split("=") for kv in found.group(1).split())})
        observed.unlink()  # (the next round's attached turn writes its own)
    if result.get("errors") or result.get("non2xx"):
        print(f"  note: {mode} had {result['errors']:.0f} socket errors, {result['non2xx']:.0f} non-2xx")
    return result


def run_mode(mode: str, tab: str, upstream: int, seconds: int, tmp: Path) -> dict[str, Any]:
    """(a): `mode` served by a fresh child of its own, measured once, with the loop stalls (and the
    console's ticks) it saw."""
    child, port, log = start_served(mode, tab, upstream, tmp)
    try:
        result = measured_turn(mode, child, port, seconds, tmp)
    finally:
        stop_served(child)
    for name in ("TICKS", "STALLS"):
        found = re.search(name + r" (.*)", log.read_text())
        if found:
            prefix = "tick_" if name == "TICKS" else ""
            result.update({prefix + k: float(v) for k, v in (kv.split("=") for kv in found.group(1).split())})
    return result


def observed_round(
    modes: list[str], upstream: int, seconds: int, tmp: Path
) -> list[tuple[str, dict[str, Any]]]:
    """(d): the observer modes of one round, in turn, against **one** headless instance: each turn
    attaches its observers, measures, and detaches them. Two instances of the same program differ
    from each other by up to a tenth in p99 for as long as they live (the A/A said so when each mode
    had an instance of its own), which is twice the attached console's bar; on one instance the
    observers are all that differs between turns."""
    child, port, _ = start_served("headless-frozen", "-", upstream, tmp)
    try:
        return [(mode, measured_turn(mode, child, port, seconds, tmp)) for mode in modes]
    finally:
        stop_served(child)


def latency_bench(
    seconds: int, rounds: int, tabs: list[str], *, unfrozen: bool, observed: list[str]
) -> dict[str, list[dict[str, Any]]]:
    if not (shutil.which("nginx") and shutil.which("wrk")):
        raise RuntimeError("needs nginx and wrk (apt-get install -y nginx wrk)")
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="omr-tui-bench-") as tmp_name:
        tmp = Path(tmp_name)
        upstream = free_port()
        conf = tmp / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=tmp, port=upstream))
        nginx = subprocess.Popen(
            pinned(1, ["nginx", "-c", str(conf), "-p", str(tmp)]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            if not wait_port(upstream, 10):
                raise RuntimeError("nginx did not start")
            modes: list[tuple[str, str]] = [
                *([("headless", "-")] if unfrozen else []),
                ("headless-frozen", "-"),
                *(("console", t) for t in tabs),
                *([("observed", "-")] if observed else []),
            ]
            watched = ["alone", *observed] if observed else []
            for r in range(rounds):
                # Many short rounds, each in a rotated order: the machine's own drift (other
                # tenants, CPU frequency) moves p99 by more than the console does, and must fall
                # on every mode alike.
                for mode, tab in modes[r % len(modes) :] + modes[: r % len(modes)]:
                    if mode == "observed":
                        turns = watched[r % len(watched) :] + watched[: r % len(watched)]
                        done = observed_round(turns, upstream, seconds, tmp)
                    else:
                        key = f"console ({tab} tab)" if mode == "console" else mode
                        done = [(key, run_mode(mode, tab, upstream, seconds, tmp))]
                    for key, result in done:
                        runs.setdefault(key, []).append(result)
                        print(
                            f"  round {r + 1} {key:<26} p99 {result['p99_ms']:7.2f} ms  p50 {result['p50_ms']:6.2f} ms"
                            f"  cpu {result['cpu_us']:4.0f} us/req"
                            f"  {result['rps']:6.0f} req/s  rss {result['rss_mb']:5.1f} MB  loop stalls: max "
                            f"{result.get('lag_max_ms', float('nan')):5.1f} ms, full GCs "
                            f"{result.get('full_gcs', float('nan')):.0f} (max {result.get('gc_max_ms', float('nan')):.1f} ms)",
                            flush=True,
                        )
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(nginx.pid, signal.SIGTERM)
            nginx.wait(timeout=10)
    return runs


def paired(runs: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> float:
    """The median of the per-round p99 ratios: a round's modes run back to back, so the machine's
    drift between rounds (other tenants, CPU frequency), which moves p99 by more than what is
    measured, falls on both sides of each ratio (as in bench/proxy.py)."""
    return statistics.median(r["p99_ms"] / b["p99_ms"] for r, b in zip(runs, baseline, strict=True))


def verdict(ok: bool) -> str:
    return "meets the bar" if ok else "MISSES the bar"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=6, help="wrk duration per run")
    ap.add_argument("--rounds", type=int, default=7, help="alternating headless/console rounds")
    ap.add_argument(
        "--unfrozen", action="store_true", help="also measure the headless proxy without gc.freeze()"
    )
    ap.add_argument("--tabs", default="overview,lockouts", help="console tabs to measure, comma separated")
    ap.add_argument(
        "--observed",
        default="attached,followers",
        help="(d): observer modes to measure, comma separated (attached, followers; empty for none)",
    )
    ap.add_argument(
        "--observer-nice",
        type=int,
        default=0,
        metavar="N",
        help="(d): run the attached console and its baseline's toggler at niceness N (a diagnostic: on "
        "two cores they share the load generator's CPU, and what they take from it shows in p99)",
    )
    ap.add_argument(
        "--attached-tab",
        choices=["overview", "requests"],
        default="overview",
        help="(d): the tab the attached console shows (default: overview, where it opens)",
    )
    ap.add_argument("--observe", metavar="URL", help=argparse.SUPPRESS)
    ap.add_argument("--toggle", metavar="URL", help=argparse.SUPPRESS)
    ap.add_argument("--burn", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--samples", type=int, default=20, help="redraw ticks to time")
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--serve", choices=["headless", "headless-frozen", "console"], help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--tab", default="overview", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    global OBSERVER_NICE, ATTACHED_TAB
    OBSERVER_NICE = args.observer_nice
    ATTACHED_TAB = args.attached_tab
    observed = [m for m in args.observed.split(",") if m]
    if unknown := sorted(set(observed) - {"attached", "followers"}):
        ap.error(f"unknown observer modes {unknown}; choose among attached, followers")
    if "attached" in observed:
        # the attached console's baseline, the baseline again (the A/A), and the control
        observed[0:0] = ["toggled", "again", "control"]
    if args.toggle:
        asyncio.run(toggle(args.toggle, burn=args.burn))
        return 0
    if args.observe:
        asyncio.run(observe(args.observe, args.tab))
        return 0
    if args.serve:
        asyncio.run(serve_child(args.serve, args.port, args.upstream, args.tab))
        return 0

    print(f"(b) redraw tick, {TICK_LOCKOUTS:,} lockouts, Lockouts tab, 120x40 (in-process, frozen clock)")
    tick = asyncio.run(tick_bench(args.samples))
    print(
        f"  steady tick (every countdown on screen moved): build {tick['build_ms']:.1f} + apply "
        f"{tick['apply_ms']:.1f} + repaint {tick['repaint_ms']:.1f} = {tick['tick_ms']:.1f} ms median, "
        f"{tick['tick_max_ms']:.1f} ms max of {args.samples}"
    )
    print(
        f"  first show of the tab (250 rows into an empty table): {tick['first_show_ms']:.1f} ms; "
        f"a burst of 100 new + 100 lifted lockouts: {tick['burst_tick_ms']:.1f} ms; "
        f"an Overview tick: {tick['overview_tick_ms']:.1f} ms"
    )
    print(f"  peak RSS of this process: {tick['rss_mb']:.1f} MB")
    print(
        f"\n(e) redraw tick, Requests tab, {FINISHED_REQUESTS:,} finished + {ALIVE_REQUESTS} alive requests, 120x40"
    )
    requests_tick = asyncio.run(requests_tick_bench(args.samples))
    print(
        f"  steady tick (every alive request's age moved): {requests_tick['tick_ms']:.1f} ms median, "
        f"{requests_tick['tick_max_ms']:.1f} ms max of {args.samples}; first show "
        f"{requests_tick['first_show_ms']:.1f} ms; after 20 more ended: {requests_tick['burst_tick_ms']:.1f} ms"
    )
    print(
        f"\n(f) a console or follower attaching: its snapshot, built on the proxy's loop "
        f"({PROVIDERS * CONNECTIONS_PER_PROVIDER} connections, {DEMO_LOCKOUTS:,} lockouts, "
        f"{FINISHED_REQUESTS:,} + {ALIVE_REQUESTS} requests)"
    )
    attach = attach_bench(args.samples)
    print(
        f"  build {attach['build_ms']:.1f} + encode {attach['encode_ms']:.1f} ms median, "
        f"{attach['total_max_ms']:.1f} ms max of {args.samples}; {attach['kb']:.0f} KB sent"
    )
    failed = False
    runs: dict[str, list[dict[str, Any]]] = {}
    if not args.skip_latency:
        print(
            f"\n(a) proxy latency, wrk -c8, {PROVIDERS * CONNECTIONS_PER_PROVIDER} connections, "
            f"{DEMO_LOCKOUTS:,} lockouts, {args.rounds} round(s) of {args.seconds} s"
        )
        try:
            runs = latency_bench(
                args.seconds,
                args.rounds,
                [t for t in args.tabs.split(",") if t],
                unfrozen=args.unfrozen,
                observed=observed,
            )
        except RuntimeError as exc:
            print(f"  could not run: {exc}")
            failed = True

    print("\nfigures against the bars (docs/performance.md)")
    if runs:
        # `omniroute serve` freezes its startup heap out of the cyclic GC before serving (serve.py),
        # and so does the console (app.py): the bar compares with that headless proxy. The same
        # proxy without the freeze is shown for scale only (its full GC passes set its own p99).
        frozen_runs = [r["p99_ms"] for r in runs["headless-frozen"]]
        frozen = statistics.median(frozen_runs)
        bar = BARS["p99_ratio"]
        print(
            f"  headless p99 (as `omniroute serve` runs, with gc.freeze()): median {frozen:.2f} ms of "
            f"{len(frozen_runs)} runs, {min(frozen_runs):.2f}-{max(frozen_runs):.2f} ms"
        )
        if "headless" in runs:
            plain = statistics.median(r["p99_ms"] for r in runs["headless"])
            print(f"  headless p99 without gc.freeze() (for scale): median {plain:.2f} ms")
        for key, results in runs.items():
            if key.startswith("headless") or key in OBSERVED:
                continue
            p99s = [r["p99_ms"] for r in results]
            p99 = statistics.median(p99s)
            ticks = statistics.median(r.get("tick_median_ms", float("nan")) for r in results)
            ratio = paired(results, runs["headless-frozen"])
            print(
                f"  (a) p99 {key}: median {p99:.2f} ms ({min(p99s):.2f}-{max(p99s):.2f}), "
                f"{p99 / frozen:.2f}x the headless median; per round {ratio:.2f}x headless "
                f"(bar <= {bar}x): {verdict(ratio <= bar)}; live tick median {ticks:.1f} ms"
            )
    for key in OBSERVED:
        if key not in runs or key in ("alone", "toggled"):
            continue
        p99s = [r["p99_ms"] for r in runs[key]]
        p99 = statistics.median(p99s)
        if key in ("attached", "again", "control"):
            baseline, against = runs["toggled"], "headless under the same toggles"
            toggled = [r["p99_ms"] for r in baseline]
            print(
                f"  (d) headless p99 under the attached console's toggles, from a plain API client: "
                f"median {statistics.median(toggled):.2f} ms ({min(toggled):.2f}-{max(toggled):.2f})"
            )
        else:
            baseline, against = runs["alone"], "the same instance with nothing attached"
        base = statistics.median(r["p99_ms"] for r in baseline)
        ratio = paired(runs[key], baseline)
        what = {
            "attached": f"one attached console ({ATTACHED_TAB} tab)",
            "control": f"the control ({CONTROL_RATE * CONTROL_SLICE_MS / 1000:.0%} of a core burnt, nothing else)",
            "again": "the toggled baseline run again (an A/A: nothing differs but the turn it runs in)",
        }.get(key, f"{FOLLOWERS} followers, one never reading")
        cpu = statistics.median(r["cpu_us"] / b["cpu_us"] for r, b in zip(runs[key], baseline, strict=True))
        print(f"  (d) the proxy's CPU per request with {what}: x{cpu:.3f} the baseline's (per round, median)")
        judged = (
            f" (bar <= {BARS[key]}x): {verdict(ratio <= BARS[key])}"
            if key in BARS
            else " (no bar: the floor)"
        )
        print(
            f"  (d) p99 with {what}: median {p99:.2f} ms ({min(p99s):.2f}-{max(p99s):.2f}), {p99 / base:.2f}x "
            f"the baseline's median; per round {ratio:.2f}x {against}{judged}"
        )
        rounds = sorted(r["p99_ms"] / b["p99_ms"] for r, b in zip(runs[key], baseline, strict=True))
        if len(rounds) >= 4:
            q1, _, q3 = statistics.quantiles(rounds, n=4)
            print(
                f"      the rounds' own ratios: {rounds[0]:.2f}-{rounds[-1]:.2f}, middle half {q1:.2f}-{q3:.2f}"
            )
        if key == "attached":
            medians = [r["change_median_s"] for r in runs[key]]
            worst = max(r["change_max_s"] for r in runs[key])
            change = statistics.median(medians)
            cpu = statistics.median(r["change_cpu"] for r in runs[key])
            wakeups = statistics.median(r.get("change_wakeups", 0) for r in runs[key])
            print(
                f"  (d) the attached console's own CPU (on the load generator's core): {cpu:.0%} of a core, "
                f"woken {wakeups:.0f} times a second"
            )
            print(
                f"  (d) a change reaches the attached console in {change:.3f} s median, {worst:.3f} s worst of "
                f"{sum(int(r['change_n']) for r in runs[key])} (bar <= {BARS['change_s']} s): "
                f"{verdict(worst <= BARS['change_s'])}"
            )
    print(
        f"  (b) redraw tick with {TICK_LOCKOUTS:,} lockouts (build + apply + repaint): {tick['tick_ms']:.1f} ms median "
        f"(bar <= {BARS['tick_ms']:.0f} ms): {verdict(tick['tick_ms'] <= BARS['tick_ms'])}"
    )
    print(
        f"  (e) Requests tab tick, {FINISHED_REQUESTS:,} + {ALIVE_REQUESTS} requests: "
        f"{requests_tick['tick_ms']:.1f} ms median (bar <= {BARS['tick_ms']:.0f} ms): "
        f"{verdict(requests_tick['tick_ms'] <= BARS['tick_ms'])}"
    )
    rss = [
        tick["rss_mb"],
        *(r["rss_mb"] for key, rs in runs.items() if key.startswith("console") for r in rs),
    ]
    demo_sized = f"{max(rss[1:]):.1f} MB" if rss[1:] else "not measured (no --tabs run)"
    print(
        f"  (c) peak RSS: console with demo-sized state {demo_sized}, "
        f"{TICK_LOCKOUTS:,}-lockout console {tick['rss_mb']:.1f} MB (bar <= {BARS['rss_mb']:.0f} MB): "
        f"{verdict(max(rss) <= BARS['rss_mb'])}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
