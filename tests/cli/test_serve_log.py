"""`omniroute serve` tells its log what happens: a real process, real traffic, real operator commands.

The instance serves one local provider whose upstream refuses connections, so one request makes its
breaker DEGRADED and its connection cool; `omniroute reset breaker` and `settings set` add an
operator action and a settings change. Each shows as one INFO line on serve's stderr.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.cli.conftest import run
from tests.fakes import FakeUpstream

OMNIROUTE = [sys.executable, "-c", "from omniroute_tui.cli import main; main()"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(tmp_path: Path, *args: str) -> Iterator[tuple[str, list[str]]]:
    """`omniroute serve ARGS` on a free port; yields its URL and, once it stopped, its stderr lines."""
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(
        f'[server]\nport = {port}\n\n[providers.down]\nclass = "local"\n'
        f'base_url = "{FakeUpstream.refused_url()}"\n\n[[providers.down.connections]]\nid = "down-1"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIROUTE_")}
    process = subprocess.Popen(
        [*OMNIROUTE, "serve", "--config", str(config), "--state", str(tmp_path / "state.db"), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(url + "/api/monitoring/health", timeout=1)
                break
            except httpx.TransportError:
                assert process.poll() is None, process.communicate()[1]
                assert time.monotonic() < deadline, "serve did not start"
                time.sleep(0.05)
        yield url, lines
    finally:
        process.send_signal(signal.SIGINT)
        try:
            _, stderr = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # no instance outlives its test, whatever failed
            process.kill()
            _, stderr = process.communicate()
        lines.extend(stderr.splitlines())


def operate(url: str) -> None:
    """A settings change, a breaker transition and a cooldown (one failed request), an operator action."""
    # Without waiting for the cooldown to pass: the request fails at once instead of retrying.
    assert run("settings", "set", "comboCooldownWait.enabled=false", "--url", url).code == 0
    reply = httpx.post(url + "/v1/chat/completions", json={"model": "down/m", "messages": []}, timeout=10)
    assert reply.status_code in (429, 502, 503)  # cooling or unavailable: either way it failed
    assert run("reset", "breaker", "down", "--url", url).code == 0


def test_json_log_has_one_object_per_line_and_one_line_per_event(tmp_path: Path) -> None:
    with serving(tmp_path, "--log-format", "json") as (url, lines):
        operate(url)
    records: list[dict[str, Any]] = [json.loads(line) for line in lines]  # every line is one object
    assert all({"ts", "level", "logger", "message"} <= r.keys() for r in records)
    events = [r for r in records if "layer" in r]
    assert all(r["level"] == "INFO" and r["logger"] == "omniroute.events" for r in events)
    changes = [(r["layer"], r["key"], r["from"], r["to"]) for r in events]
    assert ("breaker", "down", "CLOSED", "DEGRADED") in changes
    assert ("connection", "down-1", "active", "cooling") in changes
    assert ("breaker", "down", "DEGRADED", "CLOSED") in changes
    assert ("settings", "comboCooldownWait.enabled", "on", "off") in changes
    operators = [r["message"] for r in events if r["layer"] == "operator"]
    assert operators == [
        "operator: omniroute settings set comboCooldownWait.enabled=false (api)",
        "operator: omniroute reset breaker down (api)",
    ]
    assert records[0]["ts"].endswith("Z") and "T" in records[0]["ts"]


def test_text_log_at_the_default_level_says_every_change(tmp_path: Path) -> None:
    with serving(tmp_path) as (url, lines):
        operate(url)
    text = "\n".join(lines)
    assert " INFO breaker down: CLOSED -> DEGRADED (" in text
    assert " INFO connection down-1: active -> cooling (" in text
    assert " INFO operator: omniroute reset breaker down (api)" in text
    assert " INFO settings comboCooldownWait.enabled: on -> off (" in text


def test_log_level_warning_leaves_the_events_out(tmp_path: Path) -> None:
    with serving(tmp_path, "--log-level", "warning") as (url, lines):
        operate(url)
    assert lines and not any(" INFO " in line for line in lines)
    assert any("serving on" in line for line in lines)  # the start line is a warning: still there


def test_log_options_reject_unknown_values() -> None:
    for option, value in (("--log-level", "loud"), ("--log-format", "xml")):
        for command in ("serve", "tui"):
            result = run(command, option, value)
            assert result.code == 2 and option in result.stderr, (command, option)
