"""The demo's configuration: the config file pointing at the simulated upstreams, and the live
settings it switches to (model lockout on, short cooldown waits), so every layer moves within a minute."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from proxy.demo.upstreams import DEMO_KEYS
from proxy.settings import Settings

DEMO_PORT = 20128

DEMO_SETTINGS_PATCH: dict[str, Any] = {
    # Only 404 locks a model: the default list also holds 503, which would lock `flaky/llama3` for
    # minutes and hide the breaker's recovery behind a lockout. Short lockouts are seen expiring.
    "modelLockout": {"enabled": True, "errorCodes": [404], "baseCooldownMs": 20_000, "maxCooldownMs": 120_000}
}
"""Applied to the settings group "settings" when the demo starts."""
DEMO_RESILIENCE_PATCH: dict[str, Any] = {
    # A demo client should not be held for the default 90 s while everything cools down; but it
    # does wait out `ratelimited`'s 5 s Retry-After when both keys cool, so the Requests tab
    # shows waits too.
    "comboCooldownWait": {"maxWaitMs": 6000, "budgetMs": 12000}
}
"""Applied to the settings group "resilience" when the demo starts."""


def apply_demo_settings(settings: Settings) -> None:
    """Switch the live settings to the demo's (model lockout on, short cooldown waits)."""
    settings.patch(DEMO_SETTINGS_PATCH, "settings")
    settings.patch(DEMO_RESILIENCE_PATCH, "resilience")


def demo_config_text(ports: Mapping[str, int], host: str = "127.0.0.1", port: int = DEMO_PORT) -> str:
    """The demo's config file: one provider per simulated upstream (`ports`: kind -> port)."""

    def url(kind: str) -> str:
        return json.dumps(f"http://127.0.0.1:{ports[kind]}/v1")

    k = {cid: json.dumps(key) for cid, key in DEMO_KEYS.items()}
    return f"""\
# omniroute --demo: simulated upstreams on loopback ports (written by proxy/demo/config.py).

[server]
host = {json.dumps(host)}
port = {port}
default_combo = "demo"
connect_timeout_ms = 2000
first_byte_timeout_ms = 15000
idle_timeout_ms = 15000

# Always answers 200 within 20-80 ms.
[providers.healthy]
class = "local"
base_url = {url("healthy")}

[[providers.healthy.connections]]
id = "healthy-1"

# Fails in bursts (mostly 503): its breaker degrades, opens, probes and closes again.
[providers.flaky]
class = "local"
base_url = {url("flaky")}

[[providers.flaky.connections]]
id = "flaky-1"

# Every third request of a key: 429 with Retry-After: 5 (connection cooldowns).
[providers.ratelimited]
class = "apikey"
base_url = {url("ratelimited")}

[[providers.ratelimited.connections]]
id = "ratelimited-a"
api_key = {k["ratelimited-a"]}

[[providers.ratelimited.connections]]
id = "ratelimited-b"
api_key = {k["ratelimited-b"]}

# Serves llama3; any other model is 404 model_not_found (model lockouts).
[providers.models]
class = "local"
base_url = {url("models")}

[[providers.models.connections]]
id = "models-1"

# The first key is dead (401: the connection becomes `expired`); the second one serves.
[providers.twokeys]
class = "apikey"
base_url = {url("twokeys")}

[[providers.twokeys.connections]]
id = "twokeys-dead"
api_key = {k["twokeys-dead"]}
priority = 1

[[providers.twokeys.connections]]
id = "twokeys-live"
api_key = {k["twokeys-live"]}
priority = 2

# Anthropic's Messages API (Claude Code's): every fourth request is 529 overloaded_error.
[providers.claude]
class = "apikey"
base_url = {url("claude")}
apis = ["messages"]
auth = "x-api-key"

[[providers.claude.connections]]
id = "claude-a"
api_key = {k["claude-a"]}

[[providers.claude.connections]]
id = "claude-b"
api_key = {k["claude-b"]}

# flaky first; healthy serves while flaky's breaker is open.
[combos.demo]
strategy = "priority"
targets = ["flaky/llama3", "healthy/llama3"]
"""


def write_private(path: Path, text: str) -> None:
    # 0600 from the start: the file holds (fake) inline keys, and load_config warns about readable ones.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
