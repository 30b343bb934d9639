"""`--demo`: the real proxy against simulated upstreams on loopback ports, with a trickle of traffic.

A newcomer sees every resilience layer move within a minute, without any LLM installed:

- `healthy` (local): always 200, 20-80 ms.
- `flaky` (local): fails in bursts (mostly 503 for 20 s, then 200 for 25 s), so its breaker goes
  DEGRADED -> OPEN -> HALF_OPEN -> CLOSED, and the `demo` combo falls back to `healthy` meanwhile.
- `ratelimited` (apikey, two keys): every third request gets 429 `Retry-After: 5`, so its
  connections cool down and take turns.
- `models` (local): serves `llama3`, answers 404 `model_not_found` for anything else, so
  `models/missing-model` gets a model lockout (model lockout is enabled in the demo).
- `twokeys` (apikey): the key of `twokeys-dead` gets 401 (-> `expired`), `twokeys-live` serves.
- `claude` (apikey, two keys, `apis = ["messages"]`, `auth = "x-api-key"`): Anthropic's Messages
  API, as Claude Code uses it; every fourth request gets 529 `overloaded_error`, so a key cools
  and the other one serves.

Each upstream is a uvicorn server task in the caller's event loop; `demo_environment` writes a config
that points at them, and `DemoTraffic` sends the requests. The demo's state lives in a temporary
directory chosen by the caller (`proxy.serve.instance`).

One module per idea: `upstreams.py` (what each kind answers), `schedules.py` (when it misbehaves),
`servers.py` (running them on loopback ports), `config.py` (the config file and settings of the
demo), `environment.py` (all of it started, for `--demo`), `traffic.py` (the client trickle).
"""

from __future__ import annotations

from proxy.demo.config import (
    DEMO_PORT,
    DEMO_RESILIENCE_PATCH,
    DEMO_SETTINGS_PATCH,
    apply_demo_settings,
    demo_config_text,
)
from proxy.demo.environment import demo_environment
from proxy.demo.schedules import FlakySchedule
from proxy.demo.traffic import DemoTraffic
from proxy.demo.upstreams import DEMO_KEYS, UPSTREAM_KINDS, demo_upstream_app

DEFAULT_FLAKY_SCHEDULE = FlakySchedule()
"""What `demo_environment` and `demo_upstream_app` use when given no schedule, read from here at
call time: tests replace it (`monkeypatch.setattr(proxy.demo, "DEFAULT_FLAKY_SCHEDULE", ...)`)
for a faster cycle."""

__all__ = [
    "DEFAULT_FLAKY_SCHEDULE",
    "DEMO_KEYS",
    "DEMO_PORT",
    "DEMO_RESILIENCE_PATCH",
    "DEMO_SETTINGS_PATCH",
    "UPSTREAM_KINDS",
    "DemoTraffic",
    "FlakySchedule",
    "apply_demo_settings",
    "demo_config_text",
    "demo_environment",
    "demo_upstream_app",
]
