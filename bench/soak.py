"""Soak: minutes of mixed, faulty traffic against a real `omniroute serve`; does anything grow?

    python bench/soak.py                 # 10 minutes
    python bench/soak.py --minutes 3     # shorter
    python bench/soak.py --minutes 1 --concurrency 8 --warmup-minutes 0.25   # a quick look

Starts two fault-injecting fake upstreams (tests/fakes: 502 bursts, 429s, resets before and after
the headers, hangs, slow headers, dying and ping-only streams, slow drips, invalid JSON, 5 MB
bodies) in this process, and `omniroute serve` from this checkout as a subprocess on loopback
with a fresh config and state database. Then, for the given time, `--concurrency` clients send
chat requests (a combo, provider/model names, bare model names the router must look up), half
of them streamed, some with session ids drawn from an endless supply (session pins churn), some
hanging up before the headers, while waiting, or mid-stream, plus the management API a console
or a script would poll (health, connections, events) and an occasional settings PATCH.

Every `--sample-seconds` it reads the server's RSS, open file descriptors and threads from /proc.
The report: RSS at the end of the warm-up and at the end, the RSS slope after the warm-up (least
squares, KB per minute), fd and thread ranges, the state database's size, what the clients got,
and the errors: client-side transport failures, answers that are not a well-formed error or a
stream that does not end with `data: [DONE]`, requests without an answer within 30 s, and the
tracebacks and ERROR lines in the server's log. Linux only (/proc). Exits 0 when it ran, 1 when
something could not run, 2 when the run found errors or the server did not settle afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from proxy.sse import SSEParser  # noqa: E402
from tests.fakes import FakeUpstream, LiveServer, Reply  # noqa: E402

REQUEST_DEADLINE_S = 30.0

CONFIG = """
[server]
host = "127.0.0.1"
port = {port}
connect_timeout_ms = 1000
first_byte_timeout_ms = 2000
idle_timeout_ms = 2000

[providers.flaky]
class = "local"
base_url = "{a}"

[[providers.flaky.connections]]
id = "flaky-1"
priority = 1
max_concurrent = 3

[[providers.flaky.connections]]
id = "flaky-2"
priority = 2
max_concurrent = 4

[providers.keyed]
class = "apikey"
base_url = "{b}"

[[providers.keyed.connections]]
id = "keyed-1"
api_key = "sk-soak-1"
priority = 1

[[providers.keyed.connections]]
id = "keyed-2"
api_key = "sk-soak-2"
priority = 2
max_concurrent = 3

[combos.mix]
strategy = "priority"
targets = ["flaky/m1", "keyed/m1"]
"""

SETTINGS: dict[str, Any] = {
    "requestQueue": {
        "minTimeBetweenRequestsMs": 0,
        "requestsPerMinute": 1_000_000,
        "concurrentRequests": 4,
        "maxQueueDepth": 8,
        "maxWaitMs": 4000,
    },
    "connectionCooldown": {
        "local": {"baseCooldownMs": 200, "maxBackoffSteps": 2},
        "apikey": {"baseCooldownMs": 200, "maxBackoffSteps": 2, "useUpstreamRetryHints": False},
    },
    "providerBreaker": {
        "local": {"degradationThreshold": 4, "failureThreshold": 8, "resetTimeoutMs": 1000},
        "apikey": {"degradationThreshold": 5, "failureThreshold": 10, "resetTimeoutMs": 1000},
    },
    "comboCooldownWait": {"enabled": True, "maxWaitMs": 1500, "maxAttempts": 3, "budgetMs": 3000},
    "quotaShareConcurrencyLimit": {"enabled": True, "queueDepth": 3, "queueTimeoutMs": 1000},
    "streamRecovery": {
        "throughputWatchdog": {
            "enabled": True,
            "warmupMs": 500,
            "windowMs": 1000,
            "minUsefulBytesPerSecond": 1,
            "minUsefulBytes": 1,
        }
    },
    "sessionAffinity": {"ttlMs": 5000},
}

FAULTS: list[tuple[int, Reply]] = [
    (40, Reply("json")),
    (18, Reply("stream", chunks=8, delay_ms=10)),
    (6, Reply("error", status=502)),
    (3, Reply("error", status=429)),
    (3, Reply("reset")),
    (3, Reply("reset_after_headers")),
    (1, Reply("hang")),
    (3, Reply("slow_headers", delay_ms=200)),
    (3, Reply("stream_die", die_after=2, delay_ms=10)),
    (1, Reply("stream_pings", delay_ms=100)),
    (4, Reply("drip", chunks=5, drip_bytes=40, delay_ms=5)),
    (3, Reply("invalid_json")),
    (1, Reply("big")),
]
MODELS = [(55, "mix"), (15, "flaky/m1"), (15, "keyed/m1"), (10, "m1"), (5, "unlisted-model")]
BEHAVIOURS = [
    (40, "answer"),
    (30, "stream"),
    (10, "leave_early"),
    (10, "leave_waiting"),
    (10, "leave_mid_stream"),
]


def pick(rng: random.Random, table: list[tuple[int, Any]]) -> Any:
    return rng.choices([item for _, item in table], weights=[w for w, _ in table])[0]


class Bursty:
    """The fakes' chooser: random faults, where a 502 comes as a burst of three."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.burst = 0

    def __call__(self, model: str | None) -> Reply:
        if self.burst:
            self.burst -= 1
            return Reply("error", status=502)
        reply: Reply = pick(self.rng, FAULTS)
        if reply.kind == "error" and reply.status == 502:
            self.burst = 2
        return reply


# ---------------------------------------------------------------------- the server process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.1)
    return False


@dataclass
class Sample:
    t: float  # seconds since the traffic started
    rss_kb: int
    fds: int
    threads: int
    done: int


def read_proc(pid: int) -> tuple[int, int, int]:
    """(RSS in KB, open fds, threads) of one process."""
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd")), threads


# ---------------------------------------------------------------------- clients


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    done: int = 0

    def error(self, kind: str, detail: str) -> None:
        self.outcomes[kind] += 1
        if len(self.errors) < 20:
            self.errors.append(f"{kind}: {detail}")


def well_formed(status: int, content_type: str, body: bytes) -> str | None:
    if status >= 400:
        try:
            error = json.loads(body)["error"]
            if isinstance(error, dict) and isinstance(error.get("message"), str):
                return None
        except (ValueError, KeyError, TypeError):
            pass
        return f"{status} with a body that is not a JSON error: {body[:120]!r}"
    if content_type.startswith("text/event-stream"):
        events = SSEParser().feed(body)
        if not events or events[-1].data != "[DONE]":
            return f"a stream that does not end with [DONE]: ...{body[-120:]!r}"
    return None


async def chat(client: httpx.AsyncClient, rng: random.Random, tally: Tally, sessions: list[int]) -> None:
    behaviour = pick(rng, BEHAVIOURS)
    model = pick(rng, MODELS)
    stream = behaviour in ("stream", "leave_mid_stream") or (
        behaviour.startswith("leave") and rng.random() < 0.5
    )
    body = {"model": model, "messages": [{"role": "user", "content": "soak"}], "stream": stream}
    headers = {}
    if rng.random() < 0.3:  # a new session id most of the time: pins are created and must expire
        sessions[0] += 1
        headers["x-session-id"] = f"soak-{sessions[0] if rng.random() < 0.8 else rng.randrange(50)}"
    leave_after = {"leave_early": rng.uniform(0.005, 0.3), "leave_waiting": rng.uniform(0.2, 1.5)}.get(
        behaviour
    )
    leave_chunks = rng.randint(1, 3)
    try:
        async with asyncio.timeout(leave_after if leave_after is not None else REQUEST_DEADLINE_S):
            async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
                chunks: list[bytes] = []
                async for chunk in response.aiter_raw():
                    chunks.append(chunk)
                    if behaviour == "leave_mid_stream" and len(chunks) >= leave_chunks:
                        tally.outcomes["left"] += 1
                        return
                tally.statuses[response.status_code] += 1
                problem = well_formed(
                    response.status_code, response.headers.get("content-type", ""), b"".join(chunks)
                )
                if problem:
                    tally.error("malformed", problem)
                else:
                    tally.outcomes["answered" if response.status_code < 400 else "error answer"] += 1
    except TimeoutError:
        if leave_after is not None:
            tally.outcomes["left"] += 1
        else:
            tally.error("hung", f"{model} stream={stream}: no answer within {REQUEST_DEADLINE_S:g} s")
    except httpx.HTTPError as exc:
        tally.error("transport", f"{type(exc).__name__}: {exc}")
    finally:
        tally.done += 1


async def manage(client: httpx.AsyncClient, rng: random.Random, tally: Tally) -> None:
    roll = rng.random()
    try:
        if roll < 0.05:  # a settings change, as the console's card or `omniroute settings set` makes
            value = rng.randrange(1, 20)
            response = await client.patch(
                "/api/resilience", json={"requestQueue": {"maxQueueDepth": value + 4}}
            )
        elif roll < 0.4:
            response = await client.get("/api/monitoring/health")
        elif roll < 0.7:
            response = await client.get("/api/resilience/connections")
        elif roll < 0.9:
            response = await client.get("/api/events", params={"after": rng.randrange(0, 10_000)})
        else:
            response = await client.get("/v1/models")
        if response.status_code != 200:
            path = response.request.url.path
            tally.error("management failed", f"{response.request.method} {path}: {response.status_code}")
        else:
            tally.outcomes["management"] += 1
    except httpx.HTTPError as exc:
        tally.error("transport", f"management: {type(exc).__name__}: {exc}")


async def drive(url: str, args: argparse.Namespace, pid: int, db: Path) -> tuple[list[Sample], Tally, float]:
    tally = Tally()
    samples: list[Sample] = []
    limits = httpx.Limits(max_connections=args.concurrency * 2, max_keepalive_connections=args.concurrency)
    end = time.monotonic() + args.minutes * 60
    started = time.monotonic()
    sessions = [0]

    async with httpx.AsyncClient(base_url=url, timeout=REQUEST_DEADLINE_S, limits=limits) as client:
        response = await client.patch("/api/resilience", json=SETTINGS)
        if response.status_code != 200:
            raise RuntimeError(f"could not apply the soak settings: {response.status_code} {response.text}")

        async def worker(n: int) -> None:
            rng = random.Random(args.seed * 1000 + n)
            while time.monotonic() < end:
                if rng.random() < 0.08:
                    await manage(client, rng, tally)
                else:
                    await chat(client, rng, tally, sessions)

        async def sampler() -> None:
            next_line = 0.0
            while time.monotonic() < end:
                rss, fds, threads = read_proc(pid)
                t = time.monotonic() - started
                samples.append(Sample(t, rss, fds, threads, tally.done))
                if t >= next_line:
                    size = db.stat().st_size if db.exists() else 0
                    print(
                        f"  {t / 60:5.1f} min  rss {rss / 1024:6.1f} MB  fds {fds:4d}  threads {threads:3d}"
                        f"  requests {tally.done:7d}  state.db {size / 1024:7.0f} KB",
                        flush=True,
                    )
                    next_line += 60
                await asyncio.sleep(args.sample_seconds)

        await asyncio.gather(sampler(), *(worker(n) for n in range(args.concurrency)))
        elapsed = time.monotonic() - started

    # Afterwards: does it settle? Every request in flight must end (waited on, with a deadline). A
    # fresh client: the traffic's pool may still hold connections that a stuck server never ends.
    in_flight: tuple[int, dict[str, int]] | str | None = None
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as client:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                health = (await client.get("/api/monitoring/health")).json()
                connections = (await client.get("/api/resilience/connections")).json()["connections"]
            except httpx.HTTPError as exc:
                in_flight = f"the API did not answer: {type(exc).__name__}"
            else:
                in_flight = (health["requests"]["inFlight"], {c["id"]: c["inFlight"] for c in connections})
                if in_flight[0] == 0 and not any(in_flight[1].values()):
                    break
            await asyncio.sleep(0.1)
    if not (isinstance(in_flight, tuple) and in_flight[0] == 0 and not any(in_flight[1].values())):
        tally.error("not settled", f"30 s after the traffic stopped: {in_flight}")
    return samples, tally, elapsed


# ---------------------------------------------------------------------- the report


def slope_kb_per_min(samples: list[Sample]) -> float:
    if len(samples) < 3:
        return float("nan")
    xs = [s.t / 60 for s in samples]
    ys = [float(s.rss_kb) for s in samples]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    num = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    den = sum((x - mean_x) ** 2 for x in xs)
    return num / den if den else float("nan")


def report(
    samples: list[Sample], tally: Tally, elapsed: float, args: argparse.Namespace, log: str, db: Path
) -> int:
    warm = [s for s in samples if s.t >= args.warmup_minutes * 60]
    tracebacks = log.count("Traceback")
    error_lines = sum(1 for line in log.splitlines() if " ERROR " in line)
    print()
    print(f"soak: {elapsed / 60:.1f} min, {args.concurrency} clients, seed {args.seed}")
    print(
        f"requests: {tally.done} ({tally.done / elapsed:.0f}/s), outcomes {dict(sorted(tally.outcomes.items()))}"
    )
    print(f"statuses: {dict(sorted(tally.statuses.items()))}")
    if warm:
        first, last = warm[0], warm[-1]
        print(
            f"RSS: {first.rss_kb / 1024:.1f} MB after the {args.warmup_minutes:g} min warm-up,"
            f" {last.rss_kb / 1024:.1f} MB at the end, max {max(s.rss_kb for s in warm) / 1024:.1f} MB;"
            f" slope after the warm-up {slope_kb_per_min(warm):+.0f} KB/min over {len(warm)} samples"
        )
    print(
        f"fds: {min(s.fds for s in samples)}..{max(s.fds for s in samples)} (end {samples[-1].fds});"
        f" threads: {min(s.threads for s in samples)}..{max(s.threads for s in samples)} (end {samples[-1].threads})"
    )
    print(f"state.db: {db.stat().st_size / 1024:.0f} KB (+ WAL)" if db.exists() else "state.db: missing")
    kinds = ("hung", "malformed", "transport", "management failed", "not settled")
    client_errors = sum(tally.outcomes[k] for k in kinds)
    print(
        f"errors: {client_errors} client-side ({', '.join(f'{k} {tally.outcomes[k]}' for k in kinds)});"
        f" server log: {tracebacks} tracebacks, {error_lines} ERROR lines"
    )
    for line in tally.errors:
        print(f"  {line}")
    shown: set[str] = set()
    for block in log.split("Traceback (most recent call last):")[1:]:
        lines = []
        for line in block.splitlines():
            if re.match(r"\d{4}-\d\d-\d\d ", line):  # the next log record: the traceback is over
                break
            if line.strip():
                lines.append(line)
        tail = "\n    ".join(lines[-6:]) if lines else ""
        if tail and tail not in shown and len(shown) < 3:  # each distinct traceback once, at most three
            shown.add(tail)
            print(f"  server traceback, ends:\n    {tail}")
    for line in [line for line in log.splitlines() if " ERROR " in line][:3]:
        print(f"  server log: {line[:300]}")
    return 2 if client_errors or tracebacks or error_lines else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to send traffic (default 10)")
    parser.add_argument(
        "--warmup-minutes", type=float, default=None, help="left out of the slope (default: min(2, a fifth))"
    )
    parser.add_argument("--concurrency", type=int, default=16, help="clients sending at once (default 16)")
    parser.add_argument(
        "--sample-seconds", type=float, default=5.0, help="between two /proc readings (default 5)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--root",
        type=Path,
        default=ROOT,
        help="the checkout whose `omniroute serve` runs (default: this one; e.g. an older export, to compare)",
    )
    args = parser.parse_args(argv)
    if args.warmup_minutes is None:
        args.warmup_minutes = min(2.0, args.minutes / 5)
    if not os.path.isdir("/proc/self/fd"):
        print("soak: needs Linux /proc", file=sys.stderr)
        return 1

    a, b = FakeUpstream("soak-a"), FakeUpstream("soak-b")
    for n, fake in enumerate((a, b)):
        fake.recording = False
        fake.chooser = Bursty(args.seed + n)
    servers = [LiveServer(a.app).start(), LiveServer(b.app).start()]
    with tempfile.TemporaryDirectory(prefix="omniroute-soak-") as tmp_name:
        tmp = Path(tmp_name)
        port = free_port()
        config = tmp / "config.toml"
        config.write_text(CONFIG.format(port=port, a=servers[0].url + "/v1", b=servers[1].url + "/v1"))
        config.chmod(0o600)
        db = tmp / "state.db"
        log_path = tmp / "serve.log"
        command = [sys.executable, "-c", "import sys; from omniroute_tui.cli import main; sys.exit(main())"]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [*command, "serve", "--config", str(config), "--state", str(db)],
                cwd=args.root,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            if not wait_port(port):
                print(
                    f"soak: omniroute serve did not start:\n{log_path.read_text()[-2000:]}", file=sys.stderr
                )
                return 1
            print(
                f"soak: omniroute serve (pid {proc.pid}) on 127.0.0.1:{port}, {args.minutes:g} min",
                flush=True,
            )
            samples, tally, elapsed = asyncio.run(drive(f"http://127.0.0.1:{port}", args, proc.pid, db))
            return report(samples, tally, elapsed, args, log_path.read_text(errors="replace"), db)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            for fake in (a, b):
                fake.chooser = None
                fake.reset()
            for server in servers:
                server.stop()


if __name__ == "__main__":
    sys.exit(main())
