"""A console with fixed state for snapshots and Pilot tests (posting's `posting_snapshot_app.py`).

Everything is deterministic: the config comes from a string, the engine runs on a `FakeClock`
(10 minutes after 2026-01-01T00:00:00Z when the app opens), every layer is put into a known
state by calling the engine directly, there is no server and no demo traffic, and the app runs
with `clock_frozen=True`, so nothing redraws unless a test asks for it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from omniroute_tui.app import OmniRouteApp, make_app
from omniroute_tui.remote import Mirror, Remote
from proxy import untrusted
from proxy.config import load_config
from proxy.engine import Attempt, Target
from proxy.readmodel import SkipView, WaitView
from proxy.resilience.clock import FakeClock
from proxy.resilience.lockout import LockoutSettings
from proxy.runtime import Runtime
from proxy.store import MemoryStore
from proxy.trail import AttemptRow, RequestRecord

CONFIG = """
[server]
port = 20128

[providers.openai]
class = "apikey"
base_url = "http://127.0.0.1:9/v1"

[[providers.openai.connections]]
id = "openai-main"
api_key = "sk-test-openai-main-0001"
priority = 1

[[providers.openai.connections]]
id = "openai-backup"
api_key = "sk-test-openai-backup-0002"
priority = 2
max_concurrent = 4

[providers.anthropic]
class = "oauth"
base_url = "http://127.0.0.1:9/v1"

[[providers.anthropic.connections]]
id = "anthropic-1"

[providers.ollama]
class = "local"
base_url = "http://127.0.0.1:9/v1"

[[providers.ollama.connections]]
id = "ollama-1"

[providers.groq]
class = "apikey"
base_url = "http://127.0.0.1:9/v1"

[[providers.groq.connections]]
id = "groq-1"
api_key = "sk-test-groq-dead-0003"
"""

MINUTE = 60_000.0
SECOND = 1000.0


def load_fixed_config(text: str = CONFIG):  # type: ignore[no-untyped-def]
    """The config from a string (via a private temp file: the loader reads files, and warns about
    readable ones holding keys)."""
    fd, name = tempfile.mkstemp(suffix=".toml")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return load_config(Path(name), {}, explicit=True)
    finally:
        os.unlink(name)


def build_runtime() -> Runtime:
    """A runtime whose three layers are in a known, mixed state at 00:10:00."""
    clock = FakeClock()
    runtime = Runtime(load_fixed_config(), MemoryStore(), clock=clock, env={})
    engine = runtime.engine
    start = clock.now()
    providers = engine.providers
    connections = engine.connections
    lockout = LockoutSettings(enabled=True)

    def at(minutes: float) -> float:
        clock.set(start + minutes * MINUTE)
        return clock.now()

    now = at(2)
    connections["groq-1"].health.mark_terminal(
        now, "expired", error="401 expired: Incorrect API key provided", code=401
    )
    now = at(3)
    engine.set_connection_enabled("openai-backup", False, source="api")
    now = at(5)
    for _ in range(8):
        providers["anthropic"].breaker.record_failure(now)
    now = at(6.5)
    providers["anthropic"].breaker.state(now)  # the reset timeout elapsed: HALF_OPEN
    now = at(9)
    for _ in range(8):
        providers["openai"].breaker.record_failure(now)
    traffic(runtime, at)
    now = at(9.5)
    for provider, conn, model, status, reason, hint in (
        ("ollama", "ollama-1", "llama3:70b", 404, "not_found", 20 * MINUTE),
        ("openai", "openai-main", "gpt-4o", 429, "rate_limited", 5 * MINUTE),
        ("anthropic", "anthropic-1", "claude-3-opus", 403, "forbidden", 12 * MINUTE),
        ("openai", "openai-backup", "gpt-4o-mini", 503, "server_error", 2 * MINUTE + 45 * SECOND),
    ):
        engine.lockouts.record_failure(
            provider, conn, model, now, lockout, status=status, reason=reason, hint_ms=hint
        )
    local = engine.settings.cooldown_policy("local")

    def refused(minute: float) -> None:
        connections["ollama-1"].health.record_failure(
            at(minute), local, error="connection refused", error_type="network_error", code=None
        )

    refused(9.6)
    refused(9.7)
    now = at(9 + 50 / 60)
    for _ in range(2):
        providers["ollama"].breaker.record_failure(now)
    now = at(9 + 55 / 60)
    connections["openai-main"].health.record_failure(
        now,
        engine.settings.cooldown_policy("apikey"),
        error="429 rate_limited: Rate limit reached for gpt-4o",
        error_type="rate_limited",
        code=429,
        hint_ms=30 * SECOND,
    )
    refused(9.95)
    now = at(9 + 59 / 60)
    engine.reset_breakers("groq", source="cli")
    now = at(10)
    stats = engine.stats
    stats.total, stats.ok, stats.failed = 1234, 1187, 47
    second = int(now // 1000)
    stats.per_second = {second - 30 + i: (i * 7) % 11 + (i // 5) for i in range(31)}
    return runtime


def traffic(runtime: Runtime, at: Callable[[float], float]) -> None:
    """A few request records in the trail, at fixed instants: a fallback, a skip and a wait, a
    stream with its usage, a failure, and two requests still alive (waiting, streaming)."""
    trail = runtime.trail
    assert trail is not None

    def attempt(
        target: str, connection: str, start: float, ms: float, status: int | None, outcome: str, reason: str
    ) -> AttemptRow:
        return (target, target.split("/")[0], connection, at(start), ms, status, outcome, reason)  # type: ignore[return-value]

    def request(n: int, minute: float, model: str, *, stream: bool = False) -> RequestRecord:
        at(minute)
        record = trail.begin(f"{n:04x}a1b2c3d4e5f6", "127.0.0.1", "chat/completions")
        record.model_asked, record.stream, record.route, record.bytes_in = model, stream, "combo", 412
        return record

    r = request(1, 9.02, "coding")
    r.attempts.append(attempt("openai/gpt-4o", "openai-main", 9.02, 180, 429, "fallback", "429 rate_limited"))
    r.attempts.append(attempt("ollama/llama3:70b", "ollama-1", 9.023, 2100, 200, "ok", "ok"))
    r.ttft_ms, r.usage, r.bytes_out = 520, (120, 392, 512), 9_812
    at(9.02 + 2.3 / 60)
    trail.end(r, 200)

    r = request(2, 9.1, "coding", stream=True)
    r.skipped = [
        SkipView("openai/gpt-4o", "openai-main", "cooling 12 s (429 rate_limited)", 12_000),
        SkipView("anthropic/claude-3-opus", None, "breaker OPEN, probe in 8 s", 8_000),
    ]
    r.waits = [WaitView(1_300, "nothing eligible; waited for ollama-1 (cooling)")]
    r.attempts.append(attempt("ollama/llama3:70b", "ollama-1", 9.13, 3_400, 200, "ok", "ok"))
    r.ttft_ms, r.usage, r.bytes_out = 1_590, (80, 300, 380), 30_120
    at(9.1 + 4.7 / 60)
    trail.end(r, 200)

    r = request(3, 9.25, "groq/llama-3.1-8b")
    r.route = "target"
    r.attempts.append(attempt("groq/llama-3.1-8b", "groq-1", 9.25, 95, 401, "returned", "401 expired"))
    r.code, r.message = "invalid_api_key", "groq-1: 401 Incorrect API key provided"
    at(9.25 + 0.1 / 60)
    trail.end(r, 401)

    r = request(4, 9.3, "coding")
    trail.state(r, "waiting")
    r.skipped = [SkipView("openai/gpt-4o", "openai-main", "cooling 4 s (429 rate_limited)", 4_000)]
    r = request(5, 9.4, "ollama/llama3:70b", stream=True)
    engine = runtime.engine
    r.current = Attempt(  # in flight: what the pipeline's attempt scope holds
        Target("ollama", "llama3:70b"),
        engine.providers["ollama"],
        engine.connections["ollama-1"],
        False,
        at(9.4),
    )
    at(9.4 + 0.9 / 60)
    trail.first_byte(r)


def snapshot_app(*, read_only: bool = False) -> OmniRouteApp:
    return make_app(build_runtime(), read_only=read_only, clock_frozen=True)


class StillRemote(Remote):
    """An attached console's link that never connects: its mirror holds what the test put in."""

    def start(self) -> None:
        self.connected = True  # as if its stream were up
        self.on_status(self.status)


def mirrored(runtime: Runtime) -> Mirror:
    """A mirror of `runtime` as an attached console would build it from the live stream (the same
    JSON, through a real encode and decode), on the runtime's clock."""
    mirror = Mirror(clock=runtime.clock.now)
    data = json.loads(untrusted.dumps(runtime.stream.snapshot_data()))
    mirror.apply("snapshot", data)
    mirror.health(data["health"])
    return mirror


def attached_snapshot_app(*, read_only: bool = False) -> OmniRouteApp:
    """The same fixed state, seen by a console attached to it instead of hosting it."""
    remote = StillRemote("http://127.0.0.1:20128", None, mirror=mirrored(build_runtime()))
    return OmniRouteApp(remote=remote, read_only=read_only, live=False)
