"""How the console writes numbers, times and states: one place, so every view agrees.

Durations read like a stopwatch ("1m 05s"), instants are local wall-clock times ("14:03:27"),
and every state has a style class (`ok`, `warn`, `bad`, `probe`, `off`) that both the tables
(a Rich colour per row) and the Overview tiles (a TCSS class) use. The state name is always
written out as well: colour is never the only signal.
"""

from __future__ import annotations

import json
import math
import re
import time
from typing import Final

from omniroute_tui.untrusted import visible

# Style classes, from healthy to switched off.
OK: Final = "ok"
WARN: Final = "warn"
BAD: Final = "bad"
PROBE: Final = "probe"
OFF: Final = "off"
INFO: Final = "info"

ROW_COLOURS: Final[dict[str, str]] = {
    OK: "green",
    WARN: "yellow",
    BAD: "bold red",
    PROBE: "cyan",
    OFF: "bright_black",
    INFO: "",
}
"""Rich styles for table rows (DataTable cells cannot take TCSS classes)."""

TILE_COLOURS: Final[dict[str, str]] = {
    OK: "black on green",
    WARN: "black on yellow",
    BAD: "bold white on red",
    PROBE: "black on cyan",
    OFF: "black on bright_black",
    INFO: "reverse",
}
"""Breaker tiles on the Overview: a solid block per provider, readable without colour too."""

BREAKER_STYLES: Final[dict[str, str]] = {
    "CLOSED": OK,
    "DEGRADED": WARN,
    "OPEN": BAD,
    "HALF_OPEN": PROBE,
}
CONNECTION_STYLES: Final[dict[str, str]] = {
    "active": OK,
    "cooling": WARN,
    "banned": BAD,
    "expired": BAD,
    "credits_exhausted": BAD,
    "disabled": OFF,
}
EVENT_STYLES: Final[dict[str, str]] = {
    "OPEN": BAD,
    "DEGRADED": WARN,
    "HALF_OPEN": PROBE,
    "CLOSED": OK,
    "active": OK,
    "cooling": WARN,
    "banned": BAD,
    "expired": BAD,
    "credits_exhausted": BAD,
    "disabled": OFF,
    "locked": WARN,
    "unlocked": OK,
}

NONE: Final = "—"
"""What an empty cell shows (never happened, nothing left)."""

NO_CAP: Final = "∞"
"""A limit that is not set: unlimited, which a dash (nothing, never) would not say."""

_DURATION_CACHE: dict[int, str] = {}


def duration(ms: float) -> str:
    """`65_000` → `"1m 05s"`; whole seconds, rounded up so a live countdown never shows 0s early."""
    seconds = math.ceil(ms / 1000) if ms > 0 else 0
    cached = _DURATION_CACHE.get(seconds)
    if cached is not None:
        return cached
    if seconds < 60:
        text = f"{seconds}s"
    elif seconds < 3600:
        text = f"{seconds // 60}m {seconds % 60:02d}s"
    elif seconds < 86_400:
        text = f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    else:
        text = f"{seconds // 86_400}d {seconds % 86_400 // 3600:02d}h"
    if len(_DURATION_CACHE) < 100_000:  # countdowns repeat the same few thousand values
        _DURATION_CACHE[seconds] = text
    return text


def countdown(ms: float) -> str:
    """A remaining time, or `—` when nothing is left."""
    return duration(ms) if ms > 0 else NONE


def clock_time(ms: float | None) -> str:
    """Epoch ms → local `HH:MM:SS`; `—` for None (never happened)."""
    if ms is None:
        return NONE
    try:
        return time.strftime("%H:%M:%S", time.localtime(ms / 1000))
    except (OverflowError, OSError, ValueError):  # a time no clock can show (an instance's words)
        return "?"


def count(n: int) -> str:
    return f"{n:,}"


def counted(n: int, noun: str) -> str:
    """`1 lockout`, `2 lockouts`, `1,234 connections`."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def in_flight(n: int, limit: int | None) -> str:
    """Requests in flight over the connection's cap: `1 / 4`, `0 / ∞` without one (console and CLI alike)."""
    return f"{n} / {limit if limit else NO_CAP}"


def rate(per_second: float) -> str:
    return f"{per_second:.1f}/s" if per_second < 100 else f"{per_second:,.0f}/s"


def clip(text: str | None, width: int) -> str:
    """One line, at most `width` cells: error texts are long and may span lines."""
    if not text:
        return NONE
    flat = visible(" ".join(text.split()), limit=width)
    return flat if len(flat) <= width else flat[: width - 1] + "…"


_STATUS_AND_BODY = re.compile(r"^\s*(?P<status>\d{3})\b[\s:]*(?P<body>[\[{].*)$", re.DOTALL)
_MESSAGE_FIELD = re.compile(r'"(?:message|detail|error_description)"\s*:\s*"(?P<text>(?:[^"\\]|\\.)*)')


def readable_error(text: str | None) -> str | None:
    """An upstream error as a person reads it: `401 Incorrect API key provided`, not
    `401: {"error": {"message": ...`. The JSON wrapper (whole, or cut short) gives up its message;
    text that is not one is returned as it is. The detail pane keeps the whole text."""
    if not text:
        return text
    match = _STATUS_AND_BODY.match(text)
    if match is None:
        return text
    status, body = match["status"], match["body"]
    message = _json_message(body)
    if message is None:
        found = _MESSAGE_FIELD.search(body)  # a body cut short is no JSON: find the field itself
        if found is None:
            return text
        try:
            message = json.loads(f'"{found["text"].removesuffix(chr(92))}"')
        except ValueError:
            message = found["text"]
    return f"{status} {message}"


def _json_message(body: str) -> str | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    for _ in range(3):  # {"error": {"message": ...}}, {"error": "..."}, {"message": ...}, [{...}]
        if isinstance(doc, list) and doc:
            doc = doc[0]
        if not isinstance(doc, dict):
            return None
        for key in ("message", "detail", "error_description"):
            if isinstance(doc.get(key), str):
                return str(doc[key])
        inner = doc.get("error")
        if isinstance(inner, str):
            return inner
        doc = inner
    return None


def latency(ms: float | None) -> str:
    """A measured duration: `340 ms`, `2.1 s`, `12 s`, `1m 05s`; `—` when there is no sample."""
    if ms is None:
        return NONE
    if ms < 1000:
        return f"{round(ms)} ms"
    if ms < 10_000:
        return f"{ms / 1000:.1f} s"
    if ms < 60_000:
        return f"{round(ms / 1000)} s"
    return duration(ms)


def percent(ratio: float | None) -> str:
    """An error rate: `0%`, `2.5%`, `100%`; `—` when there is no sample."""
    if ratio is None:
        return NONE
    value = ratio * 100
    return f"{value:.0f}%" if value == int(value) or value >= 10 else f"{value:.1f}%"


def traffic(requests: int, p50_ms: float | None, error_rate: float | None) -> tuple[str, str]:
    """The p50 and errors cells of a provider or connection over a window (console and CLI alike):
    `340 ms`, `2.5% of 40`; dashes without a request."""
    if not requests:
        return NONE, NONE
    return latency(p50_ms), f"{percent(error_rate or 0.0)} of {count(requests)}"


REQUEST_STATE_STYLES: Final[dict[str, str]] = {
    "queued": PROBE,
    "waiting": WARN,
    "slot": PROBE,
    "upstream": PROBE,
    "streaming": INFO,
    "done": OK,
    "failed": BAD,
    "client_gone": OFF,
}

OUTCOME_WORDS: Final[dict[str, str]] = {
    "ok": "",
    "fallback": "→ fallback",
    "returned": "→ returned to the client",
    "disconnect": "→ client gone",
    "local": "→ refused locally",
    "pending": "",
}
"""How the detail pane and `omniroute requests` end an attempt's line, by its outcome."""
