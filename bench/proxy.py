"""The proxy speed bars of docs/performance.md, in one command and one run: read the ratios, not the times.

    python bench/proxy.py                                # everything (about 5 minutes)
    python bench/proxy.py --seconds 1 --rounds 2 --connections 1,8 --skip-stream   # a quick look
    python bench/proxy.py --only direct,floor,omniroute  # leave LiteLLM out even when installed
    python bench/proxy.py --only omniroute,cooling,flapping --skip-stream   # rejections vs successes
    python bench/proxy.py --only unrecorded --skip-stream --skip-agent --recording-pairs 8 --recording-control
                                                         # recording's cost, and how far apart two
                                                         #   instances of the same program come out
    python bench/proxy.py --only unrecorded --skip-stream --skip-agent --recording-ring 1
                                                         # what keeping 2,000 records costs, apart
                                                         #   from the work of recording them
    python bench/proxy.py --only direct,floor,omniroute --connections 8 --skip-stream --skip-agent

Non-streaming: a fixed-reply nginx upstream (nginx-upstream.conf), `wrk` driving post.lua at 1, 8
and 32 connections against the upstream directly, against the *floor* (floor_proxy.py: Starlette +
aiohttp forwarding, nothing else), against omniroute (`omniroute serve`, this checkout), and
against LiteLLM's proxy when the `litellm` command is installed (it is never installed by this
script). Each figure is several short rounds in which the targets take turns, and every ratio is
the median of the per-round ratios: on a shared machine, load from elsewhere then hits both sides
of a ratio. The CPU time each target's processes spend per request is reported too: it moves far
less with that load than throughput does.

The coding-agent body: the same, at 4 connections (--agent-connections) against direct, the floor
and omniroute, with every request a 400 KB chat completion (60 messages, 30 tools: what a coding
agent sends each turn; `agent_body()` builds it, deterministically) instead of post.lua's small one.

Rejections, against the same omniroute and reported against its successes (cooldown-aware waiting
off, so that a rejection is answered, not waited out): *cooling*, a provider whose only key an
upstream 429 cooled for an hour before the run, so omniroute rejects every request itself
(429 all_targets_cooling); and *flapping*, one whose upstream answers 429 with Retry-After: 1, so
the key keeps coming back and each time a burst of requests finds it usable for a moment. A
rejection should cost no more than a success, and no rejected request should wait in the key's
request queue (whose pacing is 200 ms) for a turn it will not use.

Recording: pairs of fresh instances of `omniroute serve`, each pair started for the measurement
and stopped after it: *recorded* (this config as it is) and *unrecorded* (the same with `[server]
request_history = 0`: no request trail, no statistics), taking turns at 8 connections;
recorded / unrecorded throughput over every round of every pair is what recording costs (bar: at
most 5 %). Fresh pairs, not one instance of each, because two instances of the same program here
come out up to a tenth apart for as long as they live: `--recording-control` measures as many
pairs of two recorded instances and prints how far apart they came out.

Streaming: sse_upstream.py emits a 2,000-event SSE stream, one send per event, as fast as it can
(chat, then the same stream in the Messages API's form through `/v1/messages`, bar >= 0.90).
A Python client (aiohttp, `iter_any()`) reads it directly and through omniroute, alternately, and
counts events: the chunk rate is events / (last byte - first event), the time to first chunk is
request sent -> first event. A second upstream model pauses 200 ms after its first event: a relay
that buffers would hold that first event back until the pause is over.

Needs nginx and wrk (apt-get install -y nginx wrk), and aiohttp for the floor (pip install -e '.[bench]').
Exits 0 when everything ran (whether or not a bar is met), 1 when something could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# Loopback ports of this benchmark (18080 is the one in nginx-upstream.conf and
# litellm-config.yaml); --port-offset moves them all, so two runs on one machine do not collide.
PORTS = {
    "upstream": 18080,
    "sse": 18090,
    "floor": 14002,
    "omniroute": 14010,
    "litellm": 14000,
    "quiet": 14011,
    "recorded": 14012,
}
"""`quiet` and `recorded`: the fresh pairs of instances that measure recording's cost, one with
recording off (`unrecorded`) and one with it on, as `omniroute serve` runs by default."""
UPSTREAM_PORT, SSE_PORT, FLOOR_PORT, OMNI_PORT, LITELLM_PORT, QUIET_PORT, RECORDED_PORT = PORTS.values()
LITELLM_KEY = "sk-bench-master-0123456789abcdef"
TARGETS = ("direct", "floor", "omniroute", "unrecorded", "cooling", "flapping", "litellm")
REJECTIONS = ("cooling", "flapping")
"""Targets served by omniroute whose every request is refused (see the module docstring)."""
STREAM_CHUNKS = 2000
PAUSE_MS = 200.0


def omni_config() -> str:
    return f"""
[server]
host = "127.0.0.1"
port = {OMNI_PORT}

[providers.bench]
class = "local"
base_url = "http://127.0.0.1:{UPSTREAM_PORT}/v1"

[[providers.bench.connections]]
id = "bench-1"

[providers.sse]
class = "local"
base_url = "http://127.0.0.1:{SSE_PORT}/v1"
apis = ["chat", "messages"]

[[providers.sse.connections]]
id = "sse-1"

[providers.cooling]
class = "apikey"
base_url = "http://127.0.0.1:{UPSTREAM_PORT}/cooling/v1"

[[providers.cooling.connections]]
id = "cooling-1"
api_key = "sk-bench-cooling"

[providers.flapping]
class = "apikey"
base_url = "http://127.0.0.1:{UPSTREAM_PORT}/flapping/v1"

[[providers.flapping.connections]]
id = "flapping-1"
api_key = "sk-bench-flapping"
"""


# The bars (docs/performance.md#the-bars).
BAR_FLOOR_THROUGHPUT = 0.80
BAR_ADDED_P50 = 1.3
BAR_AGENT_THROUGHPUT = 0.85
"""The coding-agent body's throughput over the floor's, at AGENT_CONNECTIONS."""
AGENT_CONNECTIONS = 4
BAR_LITELLM = 20.0
BAR_STREAM_RATE = 0.90
BAR_MESSAGES_STREAM_RATE = 0.90
"""The Messages API relay (Claude Code's): its stream start holds the preamble back and its relay
watches every event for an `error`, and it must still keep up (issue #14)."""
MESSAGES_EXTRA_EVENTS = 5
"""message_start, content_block_start, content_block_stop, message_delta, message_stop."""
BAR_RECORDING = 0.95
"""omniroute / unrecorded throughput at 8 connections: recording costs under 5 %."""
BAR_REJECTION_CPU = 1.0
"""CPU per rejected request over CPU per success (issue #21: a rejection costs no more than a success)."""
PACING_MS = 200.0
"""requestQueue.minTimeBetweenRequestsMs by default: a p99 this long means rejections waited turns."""


# ---------------------------------------------------------------------- processes


class Processes:
    """Child processes in their own sessions, each logging to a temp file; all stopped on exit."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def start(
        self, name: str, cmd: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None
    ) -> None:
        log_path = self.tmp / f"{name}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd,
                cwd=cwd,
                env={**os.environ, **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append((name, proc, log_path))

    def session(self, name: str) -> int:
        """The session id of a started process (its pid: each one leads its own session)."""
        return next(proc.pid for n, proc, _ in self.procs if n == name)

    def log_tail(self, name: str) -> str:
        for n, _, path in self.procs:
            if n == name:
                return path.read_text(errors="replace")[-800:]
        return ""

    def stop_all(self) -> None:
        for _, proc, _ in reversed(self.procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)


def cpu_seconds(session: int) -> float:
    """CPU time (user + system) used so far by every live process of a session (nginx: master and
    worker). Read from /proc; 0 where there is none (not Linux)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[3]) == session:  # fields[3] is `session`; [11], [12] are utime, stime
            total += int(fields[11]) + int(fields[12])
    return total / tick


def offset_ports(offset: int) -> None:
    """Move every port of this benchmark by `offset` (--port-offset)."""
    global UPSTREAM_PORT, SSE_PORT, FLOOR_PORT, OMNI_PORT, LITELLM_PORT, QUIET_PORT, RECORDED_PORT
    UPSTREAM_PORT, SSE_PORT, FLOOR_PORT, OMNI_PORT, LITELLM_PORT, QUIET_PORT, RECORDED_PORT = (
        p + offset for p in PORTS.values()
    )


def moved(conf: Path, tmp: Path) -> Path:
    """A copy of `conf` (nginx or LiteLLM) in `tmp`, for this run's upstream port and temp files."""
    text = conf.read_text().replace(f"127.0.0.1:{PORTS['upstream']}", f"127.0.0.1:{UPSTREAM_PORT}")
    text = text.replace("/tmp/omr-bench-nginx", str(tmp / "nginx"))
    path = tmp / conf.name
    path.write_text(text)
    return path


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_port(port: int, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if port_open(port):
            return True
        time.sleep(0.1)
    return False


def api(port: int, method: str, path: str, body: object | None = None) -> tuple[int, Any]:
    """One request to omniroute (management API or proxy), answered as (status, JSON)."""
    import json
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=data,
        method=method,
        headers={"content-type": "application/json", "authorization": "Bearer sk-bench"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def prepare_rejections(port: int) -> None:
    """Waits off, then one request per rejection provider: its upstream's 429 cools the key.

    The apikey breaker is raised out of reach too: the flapping key's 429s (one a second) would
    otherwise open it within the run, and an open breaker rejects at selection, which is the cooling
    run's path again instead of a key that keeps coming back.
    """
    settings = {
        "comboCooldownWait": {"enabled": False},
        "providerBreaker": {"apikey": {"failureThreshold": 1000, "degradationThreshold": 999}},
    }
    status, _ = api(port, "PATCH", "/api/resilience", settings)
    if status != 200:
        raise RuntimeError(f"could not set the rejection runs' settings ({status})")
    for provider in REJECTIONS:
        api(port, "POST", "/v1/chat/completions", {"model": f"{provider}/bench-model", "messages": []})
    _, listing = api(port, "GET", "/api/resilience/connections")
    states = {c["id"]: c["status"] for c in listing["connections"]}
    if states.get("cooling-1") != "cooling":
        raise RuntimeError(f"the cooling provider's key is not cooling: {states}")


def omniroute_command() -> list[str]:
    """`omniroute` (the console script's entry point) run from this checkout with this Python.

    With cwd = the repository root, this checkout's `proxy` and `omniroute_tui` come first on
    sys.path, so the code measured is the code next to this file even when the package installed
    in the environment is another copy (a CI clone, a worktree)."""
    return [sys.executable, "-c", "import sys; from omniroute_tui.cli import main; sys.exit(main())"]


# ---------------------------------------------------------------------- non-streaming (wrk)


def agent_body(path: Path) -> Path:
    """A coding-agent-sized request, the same every run: about 400 KB of JSON, 60 messages (a
    system prompt, then 59 turns of 6,500 characters) and 30 tool definitions. Its `model` is MODEL,
    which post.lua replaces."""
    import json
    import random

    rng = random.Random(7)
    alphabet = "abcdefghijklmnopqrstuvwxyz    (){};=.\n"
    messages = [{"role": "system", "content": "You are a careful coding agent. " * 60}]
    for i in range(59):
        text = "".join(rng.choice(alphabet) for _ in range(6500))
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": "does a thing " * 8,
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}, "line": {"type": "integer"}},
                },
            },
        }
        for i in range(30)
    ]
    path.write_text(json.dumps({"model": "MODEL", "messages": messages, "tools": tools, "max_tokens": 1}))
    return path


def wrk(
    port: int, connections: int, seconds: int, model: str, key: str = "sk-bench", body: Path | None = None
) -> dict[str, float]:
    """One wrk run of post.lua; `body`: a file to send instead of its small request."""
    env = {**os.environ, "BENCH_MODEL": model, "BENCH_KEY": key}
    if body is not None:
        env["BENCH_BODY_FILE"] = str(body)
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{seconds}s",
            "-s",
            str(HERE / "post.lua"),
            f"http://127.0.0.1:{port}/v1/chat/completions",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    m = re.search(r"RESULT (.*)", out.stdout)
    if not m:
        raise RuntimeError(f"wrk produced no result: {(out.stdout + out.stderr)[-300:]!r}")
    return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


Rounds = dict[tuple[str, int], list[dict[str, float]]]
"""(target, connections) -> one wrk result per round."""
Target = tuple[int, str, str, int]
"""port, model, API key, and the session id of the serving processes (for their CPU time)."""


def wrk_cpu(target: Target, connections: int, seconds: int, body: Path | None = None) -> dict[str, float]:
    """One wrk run plus the target's CPU time per request (`cpu_us`), a figure that the load
    of other processes on the machine disturbs far less than throughput."""
    port, model, key, session = target
    before = cpu_seconds(session)
    result = wrk(port, connections, seconds, model, key, body)
    used = cpu_seconds(session) - before
    result["cpu_us"] = used * 1e6 / result["requests"] if result.get("requests") else 0.0
    return result


def measure(
    targets: dict[str, Target], connections: int, seconds: int, rounds: int, body: Path | None = None
) -> dict[str, list[dict[str, float]]]:
    """Every target at one connection count: a warm-up each, then `rounds` short rounds in which
    the targets take turns (in a rotating order), so that load from elsewhere on the machine falls
    on all of them alike and each ratio can be taken within a round."""
    for port, model, key, _ in targets.values():
        wrk(port, connections, 2, model, key, body)
    names = list(targets)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            runs[name].append(wrk_cpu(targets[name], connections, seconds, body))
    return runs


def summary(runs: list[dict[str, float]]) -> dict[str, float]:
    """Median throughput and latencies, summed errors, and the rounds' throughput spread."""
    rps = [r["rps"] for r in runs]
    mid = statistics.median(rps)
    return {
        "rps": mid,
        "p50_ms": statistics.median(r["p50_ms"] for r in runs),
        "p99_ms": statistics.median(r["p99_ms"] for r in runs),
        "max_ms": max(r.get("max_ms", 0.0) for r in runs),
        "cpu_us": statistics.median(r["cpu_us"] for r in runs),
        "errors": sum(r["errors"] for r in runs),
        "non2xx": sum(r["non2xx"] for r in runs),
        "spread": (max(rps) - min(rps)) / mid if mid else 0.0,
    }


def throughput_ratio(rounds: Rounds, a: str, b: str, c: int, figure: str = "rps") -> float | None:
    """Median over the rounds of a's figure over b's in the same round."""
    ra, rb = rounds.get((a, c)), rounds.get((b, c))
    if not ra or not rb or any(y[figure] <= 0 for y in rb):
        return None
    return statistics.median(x[figure] / y[figure] for x, y in zip(ra, rb, strict=True))


def added_p50(rounds: Rounds, c: int) -> tuple[float, float, float] | None:
    """Medians over the rounds: omniroute's and the floor's p50 minus the direct one, and their ratio."""
    d, f, o = (rounds.get((n, c)) for n in ("direct", "floor", "omniroute"))
    if not d or not f or not o:
        return None
    added_f = [fr["p50_ms"] - dr["p50_ms"] for dr, fr in zip(d, f, strict=True)]
    added_o = [orr["p50_ms"] - dr["p50_ms"] for dr, orr in zip(d, o, strict=True)]
    ratios = [ao / af if af > 0 else float("inf") for ao, af in zip(added_o, added_f, strict=True)]
    return statistics.median(added_o), statistics.median(added_f), statistics.median(ratios)


# ---------------------------------------------------------------------- streaming (aiohttp client)


@dataclass(frozen=True, slots=True)
class StreamRun:
    ttfb_ms: float  # request sent -> first event bytes
    body_ms: float  # first event bytes -> end of the stream
    events: int
    proxy_reads: int | None = None  # the relaying proxy's read calls during the stream

    @property
    def rate(self) -> float:
        """Events per second while the body flows (the first event is the start mark, not counted)."""
        return (self.events - 1) / (self.body_ms / 1000) if self.body_ms > 0 else float("inf")


async def read_stream(session: Any, url: str, model: str) -> StreamRun:
    body = {
        "model": model,
        "stream": True,
        "max_tokens": 4096,
        "messages": [{"role": "user", "content": "ping"}],
    }
    t0 = time.perf_counter()
    first = 0.0
    events = 0
    last = b""
    async with session.post(url, json=body, headers={"authorization": "Bearer sk-bench"}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url} {model}: HTTP {resp.status}: {(await resp.text())[:200]}")
        async for chunk in resp.content.iter_any():
            if not first:
                first = time.perf_counter()
            # Events end with a blank line; carry one byte so a "\n\n" split across reads counts.
            events += (last + chunk).count(b"\n\n")
            last = chunk[-1:]
    end = time.perf_counter()
    return StreamRun((first - t0) * 1000, (end - first) * 1000, events)


def read_calls(pid: int) -> int | None:
    """The read system calls a process has made so far (/proc/PID/io), None where unreadable."""
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("syscr:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


async def stream_bench(
    targets: dict[str, tuple[str, str]], runs: int, *, pause: bool = True, proxy_pid: int | None = None
) -> dict[str, dict[str, list[StreamRun]]]:
    """Alternate the targets run by run so machine noise falls on both alike. With `proxy_pid`,
    each omniroute run also counts the proxy's read calls (how many events each read carried)."""
    import aiohttp

    results: dict[str, dict[str, list[StreamRun]]] = {"fast": {}, "pause": {}}
    kinds = [("fast", "", runs, WARM["fast"]), ("pause", "-pause", 5, WARM["pause"])][: 2 if pause else 1]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for kind, model_suffix, count, warm in kinds:
            for name in targets:
                results[kind][name] = []
            for i in range(warm + count):
                for name, (url, model) in targets.items():
                    counted = proxy_pid if name == "omniroute" else None
                    reads = read_calls(counted) if counted is not None else None
                    run = await read_stream(session, url, model + model_suffix)
                    if (
                        reads is not None
                        and counted is not None
                        and (after := read_calls(counted)) is not None
                    ):
                        run = replace(run, proxy_reads=after - reads)
                    if i >= warm:
                        results[kind][name].append(run)
    return results


def run_async(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


# ---------------------------------------------------------------------- report


def median(values: list[float]) -> float:
    return statistics.median(values)


class Report:
    def __init__(self, out: TextIO = sys.stdout) -> None:
        self.out = out
        self.bars: list[tuple[str, str, str, bool | None]] = []

    def line(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def bar(self, name: str, bar: str, measured: str, met: bool | None) -> None:
        self.bars.append((name, bar, measured, met))

    def print_bars(self) -> None:
        self.line()
        self.line("bars (docs/performance.md)")
        width = max(len(b[0]) for b in self.bars) if self.bars else 10
        for name, bar, measured, met in self.bars:
            verdict = "n/a" if met is None else ("meets" if met else "MISSES")
            self.line(f"  {name:<{width}}  {bar:<14} {measured:<44} {verdict}")


def table(report: Report, rounds: Rounds) -> None:
    report.line(
        f"{'target':<10} {'conns':>5} {'req/s':>10} {'spread':>7} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'cpu us/req':>10} {'errors':>7} {'non2xx':>7}"
    )
    for (name, c), runs in rounds.items():
        r = summary(runs)
        report.line(
            f"{name:<10} {c:>5} {r['rps']:>10.1f} {r['spread']:>7.0%} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} "
            f"{r['cpu_us']:>10.0f} {int(r['errors']):>7} {int(r['non2xx']):>7}"
        )


def nonstream_section(report: Report, rounds: Rounds, conns: list[int], litellm: str) -> None:
    if rounds:
        table(report, rounds)
        report.line(
            "(medians of the rounds; spread: the rounds' req/s max - min over the median; cpu us/req: CPU time\n"
            " of the target's processes per request, user + system: direct is nginx)"
        )
        report.line("ratios below: medians of the per-round ratios (each round's targets ran back to back)")
    for c in conns:
        parts = [f"c={c}:"]
        floor_ratio = throughput_ratio(rounds, "omniroute", "floor", c)
        if floor_ratio is not None:
            parts.append(f"omniroute/floor throughput {floor_ratio:.2f}")
        cpu_ratio = throughput_ratio(rounds, "omniroute", "floor", c, "cpu_us")
        if cpu_ratio is not None:
            parts.append(f"CPU per request x{cpu_ratio:.2f} the floor's")
        added = added_p50(rounds, c)
        if added is not None:
            parts.append(f"added p50 {added[0]:.3f} ms vs floor {added[1]:.3f} ms (x{added[2]:.2f})")
        lite_ratio = throughput_ratio(rounds, "omniroute", "litellm", c)
        if lite_ratio is not None:
            parts.append(f"omniroute/litellm throughput {lite_ratio:.1f}")
        if len(parts) > 1:
            report.line(f"  {parts[0]} {', '.join(parts[1:])}")

    ratio = throughput_ratio(rounds, "omniroute", "floor", 8)
    name, bar = "throughput vs floor, 8 conns", f">= {BAR_FLOOR_THROUGHPUT:.2f}"
    if ratio is None:
        report.bar(name, bar, "not measured (needs c=8, floor, omniroute)", None)
    else:
        o, f = summary(rounds[("omniroute", 8)]), summary(rounds[("floor", 8)])
        measured = f"{ratio:.2f} ({o['rps']:.0f} vs {f['rps']:.0f} req/s)"
        cpu_ratio = throughput_ratio(rounds, "floor", "omniroute", 8, "cpu_us")
        if cpu_ratio is not None:  # what the ratio tends to when the machine is CPU-bound
            measured += f"; by CPU per request {cpu_ratio:.2f}"
        report.bar(name, bar, measured, ratio >= BAR_FLOOR_THROUGHPUT)
    added = added_p50(rounds, 1)
    name, bar = "added p50 vs floor's, 1 conn", f"<= {BAR_ADDED_P50:.1f}x"
    if added is None:
        report.bar(name, bar, "not measured (needs c=1, direct, floor, omniroute)", None)
    else:
        measured = f"{added[2]:.2f}x ({added[0]:.3f} vs {added[1]:.3f} ms)"
        report.bar(name, bar, measured, added[2] <= BAR_ADDED_P50)
    lite_conns = [c for (n, c) in rounds if n == "litellm"]
    c = 8 if 8 in lite_conns else (lite_conns[0] if lite_conns else 0)
    ratio = throughput_ratio(rounds, "omniroute", "litellm", c)
    name, bar = (
        f"throughput vs LiteLLM, {c} conns" if c else "throughput vs LiteLLM",
        f">= {BAR_LITELLM:.0f}x",
    )
    if ratio is None:
        report.bar(name, bar, litellm if not lite_conns else "not measured (needs omniroute)", None)
    else:
        o, lite = summary(rounds[("omniroute", c)]), summary(rounds[("litellm", c)])
        measured = f"{ratio:.1f}x ({o['rps']:.0f} vs {lite['rps']:.0f} req/s)"
        report.bar(name, bar, measured, ratio >= BAR_LITELLM)


RECORDING_CONNECTIONS = 8
"""The connection count of the recording bar."""


@dataclass
class RecordingPairs:
    """Per-round ratios (recorded / other instance, throughput and CPU per request), one list per
    pair of fresh instances; `other` says what the other instance was."""

    other: str
    rps: list[list[float]]
    cpu: list[list[float]]

    def pooled(self, figure: str = "rps") -> float:
        return statistics.median(r for pair in (self.rps if figure == "rps" else self.cpu) for r in pair)


def recording_pairs(
    tmp: Path, pairs: int, rounds: int, seconds: int, *, control: bool = False, ring: int | None = None
) -> RecordingPairs:
    """Recording's cost over `pairs` pairs of fresh `omniroute serve` instances, started for this
    and stopped after: one with recording on (the default request_history), one with
    `request_history = 0` (recording off) or, for the `control`, a second one with recording on:
    two instances that differ in nothing; with `ring`, one recording into a ring of that many
    records (`--recording-ring 1`: what the ring's size costs, apart from recording's work). Each pair takes turns in `rounds` rounds at
    RECORDING_CONNECTIONS after a warm-up that fills the request ring.

    Why fresh pairs rather than one instance of each for the whole run: two instances of the same
    program on this kind of machine differ by up to a tenth in throughput for as long as they
    live (the control shows it), which on one pair is twice the bar. Pairs start in alternating
    order, so neither side is always the one started first."""
    other = "twin" if control else "unrecorded" if ring is None else f"ring of {ring}"
    history = None if control else 0 if ring is None else ring
    result = RecordingPairs(other, [], [])
    for n in range(pairs):
        procs = Processes(tmp)
        sides = [("recorded", RECORDED_PORT, None), (other, QUIET_PORT, history)]
        if n % 2:
            sides.reverse()
        targets: dict[str, Target] = {}
        try:
            # (`kept`, not `history`: rebinding that name here made every pair after the second
            # two recording instances, an A/A folded into the figure.)
            for name, port, kept in sides:
                config = omni_config().replace(f"port = {OMNI_PORT}\n", f"port = {port}\n")
                if kept is not None:
                    config = config.replace("[server]\n", f"[server]\nrequest_history = {kept}\n")
                path = tmp / f"{name.replace(' ', '-')}-{n}.toml"
                path.write_text(config)
                path.chmod(0o600)
                cmd = [*omniroute_command(), "serve", "--config", str(path)]
                procs.start(
                    f"{name}-{n}", [*cmd, "--state", str(tmp / f"{name.replace(' ', '-')}-{n}.db")], cwd=ROOT
                )
            for name, port, _ in sides:
                if not wait_port(port):
                    raise RuntimeError(f"{name} did not start: {procs.log_tail(f'{name}-{n}')}")
                targets[name] = (port, "bench/bench-model", "sk-bench", procs.session(f"{name}-{n}"))
            # measure() warms each for 2 s: at this rate, well past the ring's 2,000 records.
            runs = measure(targets, RECORDING_CONNECTIONS, seconds, rounds)
        finally:
            procs.stop_all()
        pair = list(zip(runs["recorded"], runs[result.other], strict=True))
        result.rps.append([a["rps"] / b["rps"] for a, b in pair if b["rps"]])
        result.cpu.append([a["cpu_us"] / b["cpu_us"] for a, b in pair if b["cpu_us"]])
    return result


def recording_section(report: Report, measured: RecordingPairs, control: RecordingPairs | None) -> None:
    """Recording on vs off over fresh pairs; the control, when run, says how far apart two
    instances that differ in nothing come out."""
    c = RECORDING_CONNECTIONS
    report.line()
    report.line(
        f"recording on vs off (recorded / unrecorded), c={c}, {len(measured.rps)} pairs of fresh "
        "instances: medians of all their per-round ratios"
    )
    if measured.other != "unrecorded":  # --recording-ring: a diagnostic, not the bar
        report.line(
            f"  recorded / {measured.other}: throughput {measured.pooled():.3f} (pairs "
            + " ".join(f"{statistics.median(p):.3f}" for p in measured.rps if p)
            + f"), CPU per request x{measured.pooled('cpu'):.3f}"
        )
        return
    for label, pairs in (("on / off", measured), ("control, on / on", control)):
        if pairs is None or not any(pairs.rps):
            continue
        each = " ".join(f"{statistics.median(p):.3f}" for p in pairs.rps if p)
        each_cpu = " ".join(f"x{statistics.median(p):.3f}" for p in pairs.cpu if p)
        report.line(
            f"  {label:<16} throughput {pairs.pooled():.3f} (pairs {each}), "
            f"CPU per request x{pairs.pooled('cpu'):.3f} (pairs {each_cpu})"
        )
    name, bar = f"recording on vs off, {c} conns", f">= {BAR_RECORDING:.2f}"
    if not any(measured.rps):
        report.bar(name, bar, "not measured", None)
        return
    ratio = measured.pooled()
    noise = "" if control is None or not any(control.rps) else f"; control {control.pooled():.3f}"
    report.bar(name, bar, f"{ratio:.3f} ({len(measured.rps)} pairs{noise})", ratio >= BAR_RECORDING)


def agent_section(report: Report, rounds: Rounds, c: int) -> None:
    """The coding-agent body's figures (the same columns) and its bar."""
    report.line()
    report.line("coding-agent body (400 KB: 60 messages, 30 tools), medians of the rounds")
    table(report, rounds)
    name, bar = f"agent body throughput vs floor, {c} conns", f">= {BAR_AGENT_THROUGHPUT:.2f}"
    ratio = throughput_ratio(rounds, "omniroute", "floor", c)
    if ratio is None:
        report.bar(name, bar, "not measured (needs floor, omniroute)", None)
        return
    o, f = summary(rounds[("omniroute", c)]), summary(rounds[("floor", c)])
    measured = f"{ratio:.2f} ({o['rps']:.0f} vs {f['rps']:.0f} req/s)"
    cpu_ratio = throughput_ratio(rounds, "floor", "omniroute", c, "cpu_us")
    if cpu_ratio is not None:
        measured += f"; by CPU per request {cpu_ratio:.2f}"
    added = added_p50(rounds, c)
    if added is not None:
        report.line(f"  c={c}: added p50 {added[0]:.3f} ms vs floor {added[1]:.3f} ms (x{added[2]:.2f})")
    report.bar(name, bar, measured, ratio >= BAR_AGENT_THROUGHPUT)


def rejection_section(report: Report, rounds: Rounds, conns: list[int]) -> None:
    """Rejections against successes of the same omniroute, in the same rounds."""
    if not any((name, c) in rounds for name in REJECTIONS for c in conns):
        return
    report.line()
    report.line("rejections vs successes (the omniroute row), medians of the per-round ratios")
    for c in conns:
        parts = []
        for name in REJECTIONS:
            if (name, c) not in rounds:
                continue
            cpu = throughput_ratio(rounds, name, "omniroute", c, "cpu_us")
            rps = throughput_ratio(rounds, name, "omniroute", c)
            figures = summary(rounds[(name, c)])
            text = f"{name}: p99 {figures['p99_ms']:.1f} ms, slowest {figures['max_ms']:.0f} ms"
            if cpu is not None and rps is not None:
                text += f", CPU per request x{cpu:.2f} a success's, req/s x{rps:.2f}"
            parts.append(text)
        if parts:
            report.line(f"  c={c}: {'; '.join(parts)}")
    c = 8 if ("cooling", 8) in rounds else max((n for name, n in rounds if name == "cooling"), default=0)
    ratio = throughput_ratio(rounds, "cooling", "omniroute", c, "cpu_us") if c else None
    name, bar = f"CPU per rejection vs success, {c or 8} conns", f"<= {BAR_REJECTION_CPU:.2f}x"
    if ratio is None:
        report.bar(name, bar, "not measured (needs omniroute and cooling)", None)
    else:
        r, o = summary(rounds[("cooling", c)]), summary(rounds[("omniroute", c)])
        measured = f"x{ratio:.2f} ({r['cpu_us']:.0f} vs {o['cpu_us']:.0f} us/request)"
        report.bar(name, bar, measured, ratio <= BAR_REJECTION_CPU)
    flapping = [n for name, n in rounds if name == "flapping"]
    c = 8 if 8 in flapping else max(flapping, default=0)
    name, bar = f"p99 rejection, flapping key, {c or 8} conns", f"< {PACING_MS:.0f} ms"
    if not c:
        report.bar(name, bar, "not measured (needs flapping)", None)
    else:
        p99 = summary(rounds[("flapping", c)])["p99_ms"]
        report.bar(name, bar, f"{p99:.1f} ms (no rejected request waits a pacing turn)", p99 < PACING_MS)


WARM = {"fast": 3, "pause": 1}
"""Streams of each kind read first and left out of the figures."""


def relay_cpu(results: dict[str, dict[str, list[StreamRun]]], cpu: float) -> str:
    """The proxy's CPU per event it relayed, `cpu` seconds over every stream it carried (the warm-up
    ones included; cpu_seconds counts in clock ticks, so this is coarse for a short run)."""
    streams = sum(
        len(runs["omniroute"]) + WARM[kind] for kind, runs in results.items() if "omniroute" in runs
    )
    events = streams * STREAM_CHUNKS
    return f"the proxy's CPU per relayed event: {cpu / max(events, 1) * 1e6:.1f} us ({cpu:.2f} s over {streams} streams)"


def relay_reads(fast: dict[str, list[StreamRun]]) -> str | None:
    """How many events each of the proxy's reads carried, and the chunk-rate ratio of the streams
    with fewer reads against those with more: on two cores, where the scheduler puts the upstream,
    the proxy and the reader decides whether the proxy wakes for every few events or for a batch,
    and its CPU per event follows (docs/performance.md, "The 2,000-event relay")."""
    pairs = [(d, o) for d, o in zip(fast["direct"], fast["omniroute"], strict=True) if o.proxy_reads]
    if len(pairs) < 2:
        return None
    split = median([o.proxy_reads or 0 for _, o in pairs])
    few = [o.rate / d.rate for d, o in pairs if (o.proxy_reads or 0) <= split]
    many = [o.rate / d.rate for d, o in pairs if (o.proxy_reads or 0) > split]
    line = (
        f"the proxy's read calls per stream: median {split:.0f} ({STREAM_CHUNKS / split:.0f} events per read), "
        f"{min(o.proxy_reads or 0 for _, o in pairs)}-{max(o.proxy_reads or 0 for _, o in pairs)}"
    )
    if few and many:
        line += f"; ratio to direct {median(few):.2f} in the streams read in fewer calls, {median(many):.2f} in more"
    return line


def whole_streams(fast: dict[str, list[StreamRun]]) -> str:
    """The whole streams' times (request sent -> last event), omniroute's against direct's: the chunk
    rate starts its clock at the first event, so a relay whose first read carries most of a fast
    stream reads as fast as the client can parse, however late that read came."""
    ratio = median(
        [
            (d.ttfb_ms + d.body_ms) / (o.ttfb_ms + o.body_ms)
            for d, o in zip(fast["direct"], fast["omniroute"], strict=True)
            if o.ttfb_ms + o.body_ms > 0
        ]
    )
    return f"the whole stream, request sent -> last event: omniroute's rate {ratio:.2f} of direct's (no bar)"


def stream_section(report: Report, results: dict[str, dict[str, list[StreamRun]]], cpu: float) -> None:
    fast, pause = results["fast"], results["pause"]
    report.line()
    report.line(f"streaming: {STREAM_CHUNKS:,}-event SSE, {len(fast['direct'])} streams each, medians")
    report.line(
        f"{'path':<10} {'events':>7} {'chunks/s':>10} {'body ms':>8} {'ttfb ms':>8} {'ttfb(pause) ms':>15}"
    )
    for name, runs in fast.items():
        events = {r.events for r in runs}
        report.line(
            f"{name:<10} {'/'.join(map(str, sorted(events))):>7} {median([r.rate for r in runs]):>10.0f} "
            f"{median([r.body_ms for r in runs]):>8.2f} {median([r.ttfb_ms for r in runs]):>8.3f} "
            f"{median([r.ttfb_ms for r in pause[name]]):>15.3f}"
        )
    report.line(
        "(chunks/s: events / (end - first event); ttfb: request sent -> first event, in this fast stream\n"
        f" including the client's parsing of what came with it; ttfb(pause): the stream that pauses\n"
        f" {PAUSE_MS:.0f} ms after its first event, the one that shows buffering)"
    )
    report.line(whole_streams(fast))
    report.line(relay_cpu(results, cpu))
    if (reads := relay_reads(fast)) is not None:
        report.line(reads)
    expected = STREAM_CHUNKS + 1  # the events and [DONE]
    complete = all(r.events == expected for runs in fast.values() for r in runs)
    if not complete:
        report.line(f"warning: some streams did not carry {expected} events (see the events column)")
    d_rate, o_rate = median([r.rate for r in fast["direct"]]), median([r.rate for r in fast["omniroute"]])
    # Streams alternate direct / omniroute: compare each pair, then take the median.
    ratio = median([o.rate / d.rate for d, o in zip(fast["direct"], fast["omniroute"], strict=True)])
    report.bar(
        "SSE relay chunk rate vs direct",
        f">= {BAR_STREAM_RATE:.2f}",
        f"{ratio:.2f} ({o_rate:.0f} vs {d_rate:.0f} events/s)",
        ratio >= BAR_STREAM_RATE and complete,
    )
    # With a 200 ms pause after the first event, a relay that buffers delivers its first byte
    # after the pause; an unbuffered one within its ordinary per-request overhead.
    d_ttfb, o_ttfb = (
        median([r.ttfb_ms for r in pause["direct"]]),
        median([r.ttfb_ms for r in pause["omniroute"]]),
    )
    report.bar(
        "first chunk not held back",
        f"< {PAUSE_MS / 2:.0f} ms",
        f"{o_ttfb:.2f} ms via omniroute vs {d_ttfb:.2f} direct ({PAUSE_MS:.0f} ms pause follows)",
        o_ttfb < PAUSE_MS / 2,
    )


def messages_section(report: Report, results: dict[str, dict[str, list[StreamRun]]], cpu: float) -> None:
    fast = results["fast"]
    report.line()
    report.line(
        f"streaming, Messages API: {STREAM_CHUNKS:,} text deltas in Anthropic's SSE, {len(fast['direct'])} streams each, medians"
    )
    report.line(f"{'path':<10} {'events':>7} {'chunks/s':>10} {'body ms':>8} {'ttfb ms':>8}")
    for name, runs in fast.items():
        events = {r.events for r in runs}
        report.line(
            f"{name:<10} {'/'.join(map(str, sorted(events))):>7} {median([r.rate for r in runs]):>10.0f} "
            f"{median([r.body_ms for r in runs]):>8.2f} {median([r.ttfb_ms for r in runs]):>8.3f}"
        )
    report.line(whole_streams(fast))
    report.line(relay_cpu(results, cpu))
    if (reads := relay_reads(fast)) is not None:
        report.line(reads)
    expected = STREAM_CHUNKS + MESSAGES_EXTRA_EVENTS
    complete = all(r.events == expected for runs in fast.values() for r in runs)
    if not complete:
        report.line(f"warning: some streams did not carry {expected} events (see the events column)")
    d_rate, o_rate = median([r.rate for r in fast["direct"]]), median([r.rate for r in fast["omniroute"]])
    ratio = median([o.rate / d.rate for d, o in zip(fast["direct"], fast["omniroute"], strict=True)])
    report.bar(
        "Messages SSE relay chunk rate vs direct",
        f">= {BAR_MESSAGES_STREAM_RATE:.2f}",
        f"{ratio:.2f} ({o_rate:.0f} vs {d_rate:.0f} events/s)",
        ratio >= BAR_MESSAGES_STREAM_RATE and complete,
    )


# ---------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=2, help="wrk duration of one round (default 2)")
    ap.add_argument(
        "--rounds", type=int, default=4, help="rounds per figure, targets taking turns (default 4)"
    )
    ap.add_argument("--connections", default="1,8,32", help="wrk connection counts, comma-separated")
    ap.add_argument("--only", default=",".join(TARGETS), help=f"targets among {','.join(TARGETS)}")
    ap.add_argument("--skip-stream", action="store_true", help="leave out the streaming relay measurement")
    ap.add_argument(
        "--agent-connections",
        type=int,
        default=AGENT_CONNECTIONS,
        help=f"wrk connections for the 400 KB coding-agent body (default {AGENT_CONNECTIONS})",
    )
    ap.add_argument("--skip-agent", action="store_true", help="leave out the coding-agent body measurement")
    ap.add_argument(
        "--port-offset",
        type=int,
        default=0,
        help="add this to every port the benchmark uses (another run holds the default ones)",
    )
    ap.add_argument("--stream-runs", type=int, default=30, help="streams per path (default 30)")
    ap.add_argument(
        "--recording-pairs",
        type=int,
        default=4,
        help="pairs of fresh instances (recording on, off) that measure recording's cost (default 4)",
    )
    ap.add_argument(
        "--recording-ring",
        type=int,
        default=None,
        metavar="N",
        help="instead of recording off, set recording into a ring of N records against the default ring "
        "(a diagnostic: 1 measures what keeping the records costs)",
    )
    ap.add_argument(
        "--recording-control",
        action="store_true",
        help="also measure as many pairs of two recording instances: how far apart the same program comes out",
    )
    args = ap.parse_args(argv)
    wanted = [t.strip() for t in args.only.split(",") if t.strip()]
    unknown = sorted(set(wanted) - set(TARGETS))
    if unknown:
        ap.error(f"unknown targets {unknown}; choose among {','.join(TARGETS)}")
    conns = [int(c) for c in args.connections.split(",")]
    offset_ports(args.port_offset)
    for tool in ("nginx", "wrk"):
        if not shutil.which(tool):
            print(f"missing {tool}: apt-get install -y nginx wrk", file=sys.stderr)
            return 1
    busy = [
        p
        for p in (UPSTREAM_PORT, SSE_PORT, FLOOR_PORT, OMNI_PORT, QUIET_PORT, RECORDED_PORT, LITELLM_PORT)
        if port_open(p)
    ]
    if busy:
        print(f"ports already in use: {busy} (another benchmark running?)", file=sys.stderr)
        return 1

    report = Report()
    tmp = Path(tempfile.mkdtemp(prefix="omr-bench-"))
    procs = Processes(tmp)
    failed = False

    def need(name: str, port: int, timeout: float = 30.0) -> bool:
        nonlocal failed
        if wait_port(port, timeout):
            return True
        print(f"{name} did not start; its log ends:\n{procs.log_tail(name)}", file=sys.stderr)
        failed = True
        return False

    try:
        nginx_conf = moved(HERE / "nginx-upstream.conf", tmp)
        procs.start("nginx", ["nginx", "-c", str(nginx_conf)])
        if not need("nginx", UPSTREAM_PORT):
            return 1
        omni = "omniroute" in wanted or not args.skip_stream
        if not args.skip_stream:
            sse = [sys.executable, str(HERE / "sse_upstream.py"), "--port", str(SSE_PORT)]
            procs.start("sse", [*sse, "--chunks", str(STREAM_CHUNKS)])
            need("sse", SSE_PORT)
        targets: dict[str, Target] = {}
        if "direct" in wanted:
            targets["direct"] = (UPSTREAM_PORT, "bench-model", "sk-bench", procs.session("nginx"))
        if "floor" in wanted:
            procs.start(
                "floor",
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "floor_proxy:app",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(FLOOR_PORT),
                    "--no-access-log",
                    "--log-level",
                    "warning",
                ],
                cwd=HERE,
                env={"FLOOR_UPSTREAM": f"http://127.0.0.1:{UPSTREAM_PORT}"},
            )
            if need("floor", FLOOR_PORT):
                targets["floor"] = (FLOOR_PORT, "bench-model", "sk-bench", procs.session("floor"))
        rejections = [name for name in REJECTIONS if name in wanted]
        if omni or rejections:
            (tmp / "config.toml").write_text(omni_config())
            (tmp / "config.toml").chmod(0o600)  # it holds (bench) keys inline
            cmd = [*omniroute_command(), "serve", "--config", str(tmp / "config.toml")]
            procs.start("omniroute", [*cmd, "--state", str(tmp / "state.db")], cwd=ROOT)
            if need("omniroute", OMNI_PORT):
                session = procs.session("omniroute")
                if "omniroute" in wanted:
                    targets["omniroute"] = (OMNI_PORT, "bench/bench-model", "sk-bench", session)
                if rejections:
                    prepare_rejections(OMNI_PORT)
                for name in rejections:
                    targets[name] = (OMNI_PORT, f"{name}/bench-model", "sk-bench", session)
        litellm_note = "not installed" if shutil.which("litellm") is None else "not run (--only)"
        if "litellm" in wanted and shutil.which("litellm"):
            procs.start(
                "litellm",
                [
                    "litellm",
                    "--config",
                    str(moved(HERE / "litellm-config.yaml", tmp)),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(LITELLM_PORT),
                    "--num_workers",
                    "1",
                ],
                env={"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False"},
            )
            if need("litellm", LITELLM_PORT, timeout=120):
                time.sleep(3)
                targets["litellm"] = (LITELLM_PORT, "bench-model", LITELLM_KEY, procs.session("litellm"))
            else:
                litellm_note = "did not start"

        report.line(
            f"proxy benchmark: wrk -t1; per figure {args.rounds} x {args.seconds} s, targets interleaved, "
            f"after a 2 s warm-up; targets {', '.join(targets)}; {os.cpu_count()} CPUs"
        )
        rounds: Rounds = {}
        for c in conns if targets else ():
            try:
                for name, runs in measure(targets, c, args.seconds, args.rounds).items():
                    rounds[(name, c)] = runs
            except RuntimeError as exc:
                print(f"c={c}: {exc}", file=sys.stderr)
                failed = True
        report.line()
        nonstream_section(report, rounds, conns, litellm_note)
        if "unrecorded" in wanted:
            try:
                measured = recording_pairs(
                    tmp, args.recording_pairs, args.rounds, args.seconds, ring=args.recording_ring
                )
                control = None
                if args.recording_control:
                    control = recording_pairs(
                        tmp, args.recording_pairs, args.rounds, args.seconds, control=True
                    )
                recording_section(report, measured, control)
            except RuntimeError as exc:
                print(f"recording: {exc}", file=sys.stderr)
                failed = True
        rejection_section(report, rounds, conns)

        agent_targets = {n: t for n, t in targets.items() if n in ("direct", "floor", "omniroute")}
        if not args.skip_agent and agent_targets:
            c = args.agent_connections
            body = agent_body(tmp / "agent-body.json")
            try:
                measured = measure(agent_targets, c, args.seconds, args.rounds, body)
                agent_section(report, {(name, c): runs for name, runs in measured.items()}, c)
            except RuntimeError as exc:
                print(f"agent body, c={c}: {exc}", file=sys.stderr)
                failed = True

        if not args.skip_stream:
            if port_open(SSE_PORT) and port_open(OMNI_PORT):
                paths = {
                    "direct": (f"http://127.0.0.1:{SSE_PORT}/v1/chat/completions", "bench-model"),
                    "omniroute": (f"http://127.0.0.1:{OMNI_PORT}/v1/chat/completions", "sse/bench-model"),
                }
                messages = {
                    "direct": (f"http://127.0.0.1:{SSE_PORT}/v1/messages", "bench-model"),
                    "omniroute": (f"http://127.0.0.1:{OMNI_PORT}/v1/messages", "sse/bench-model"),
                }
                try:
                    # The proxy's CPU per relayed event: what the relay costs the process, which
                    # the machine's load moves far less than it moves a rate.
                    omni_session = procs.session("omniroute")
                    before = cpu_seconds(omni_session)
                    results = run_async(stream_bench(paths, args.stream_runs, proxy_pid=omni_session))
                    cpu = cpu_seconds(omni_session) - before
                    stream_section(report, results, cpu)
                    before = cpu_seconds(omni_session)
                    results = run_async(
                        stream_bench(messages, args.stream_runs, pause=False, proxy_pid=omni_session)
                    )
                    messages_section(report, results, cpu_seconds(omni_session) - before)
                except Exception as exc:
                    print(f"streaming benchmark failed: {exc!r}", file=sys.stderr)
                    failed = True
            else:
                failed = True
        report.print_bars()
        return 1 if failed else 0
    finally:
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
