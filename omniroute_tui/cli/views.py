"""Read commands: `status`, `breakers`, `cooldowns`, `lockouts`, `connections`, `events`.

Each one GETs one management route. `--json` prints that route's view unchanged (the health
document for `status`, a list for the four tables); otherwise a Rich table with every state
written out as well as coloured.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

import typer

from omniroute_tui import format as fmt
from omniroute_tui.cli.exit_codes import HEALTHY_STATUSES, ExitCode
from omniroute_tui.cli.options import (
    ConfigOpt,
    JsonOpt,
    OutputOpt,
    StateOpt,
    TokenOpt,
    UrlOpt,
    as_json,
    connect,
)
from omniroute_tui.cli.output import (
    STATE_STYLES,
    ago,
    cell,
    console,
    duration,
    emit,
    epoch_ms,
    note,
    state_cell,
    table,
)
from omniroute_tui.untrusted import visible

if TYPE_CHECKING:
    from rich.console import RenderableType

app = typer.Typer()

PANEL = "Views"

ERROR_WIDTH = 40
"""Upstream error texts can be paragraphs; the table shows their start (`--json` has all of it)."""

HEALTH = "/api/monitoring/health"
STATS = "/api/stats?window=5m"
"""The p50 and errors columns of the breakers and connections tables (the console's window too)."""
CONNECTIONS = "/api/resilience/connections"
LOCKOUTS = "/api/resilience/model-cooldowns"
EVENTS = "/api/events"
STREAM = "/api/stream"

FollowOpt = Annotated[
    bool,
    typer.Option(
        "--follow",
        "-f",
        help="Then print every new one as it happens (from the live stream), until Ctrl+C or the instance stops.",
    ),
]


@app.command(rich_help_panel=PANEL)
def status(
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
) -> None:
    """One-screen summary of the running instance (without --url: the one serving the state file);
    exits 6 when it is degraded (0 when healthy).

    Example: [bold]omniroute status --json | jq -r .status[/bold]
    """
    json_ = as_json(json_, output)
    with connect(url, token, config, state) as api:
        health = api.get(HEALTH)
    emit(health, json_=json_, human=lambda: _status_view(health, api.target.url))
    if health.get("status") not in HEALTHY_STATUSES:
        raise typer.Exit(int(ExitCode.DEGRADED))


@app.command(rich_help_panel=PANEL)
def breakers(
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Provider circuit breakers (CLOSED, DEGRADED, OPEN, HALF_OPEN).

    Example: [bold]omniroute breakers --json | jq -r '.[] | select(.state == "OPEN") | .provider'[/bold]
    """
    json_ = as_json(json_, output)
    with connect(url, token, config) as api:
        health = api.get(HEALTH)
        rows: list[dict[str, Any]] = health["providerBreakers"]
        stats = {} if json_ else api.get(STATS)["providers"]
    emit(rows, json_=json_, human=lambda: _breakers_table(rows, epoch_ms(health.get("timestamp")), stats))


@app.command(rich_help_panel=PANEL)
def connections(
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Every connection with its status, cooldown and last error.

    Example: [bold]omniroute connections --json | jq -r '.[] | select(.status != "active") | .id'[/bold]
    """
    json_ = as_json(json_, output)
    with connect(url, token, config) as api:
        rows: list[dict[str, Any]] = api.get(CONNECTIONS)["connections"]
        stats = {} if json_ else api.get(STATS)["connections"]
    emit(rows, json_=json_, human=lambda: _connections_table(rows, stats))


@app.command(rich_help_panel=PANEL)
def cooldowns(
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Connections that are cooling down (status "cooling").

    Example: [bold]omniroute cooldowns --json | jq 'length'[/bold]
    """
    json_ = as_json(json_, output)
    with connect(url, token, config) as api:
        everything: list[dict[str, Any]] = api.get(CONNECTIONS)["connections"]
    rows = [c for c in everything if c.get("status") == "cooling"]
    emit(rows, json_=json_, human=lambda: _cooldowns_table(rows))


@app.command(rich_help_panel=PANEL)
def lockouts(
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Active model lockouts, longest first.

    Example: [bold]omniroute lockouts --json | jq -r '.[] | "\\(.provider)/\\(.model) \\(.remainingMs)"'[/bold]
    """
    json_ = as_json(json_, output)
    with connect(url, token, config) as api:
        rows: list[dict[str, Any]] = api.get(LOCKOUTS)["items"]
    emit(rows, json_=json_, human=lambda: _lockouts_table(rows))


# ---------------------------------------------------------------------------------------------
# Human renderings.


def _state_line(
    backend: dict[str, Any], fleet: object, now: float | None, said: Callable[[object], str]
) -> str:
    """Where the state lives: `sqlite`, or a fleet's Redis, connected or lost (docs/fleet.md)."""
    kind = said(backend.get("kind"))
    if kind != "redis":
        return kind
    fleet = fleet if isinstance(fleet, dict) else {}
    replicas = fleet.get("replicas")
    live = len(replicas) if isinstance(replicas, list) else 0
    since = ago(backend.get("since"), now)
    if backend.get("connected") is True:
        return f"redis, connected {since}; replica {said(fleet.get('replica'))}, {live} live in the fleet"
    return f"redis LOST {since}: serving on this replica's memory, reconciling when it is back"


def _status_view(h: dict[str, Any], url: str) -> RenderableType:
    """Every word the instance sends is shown as visible text (`visible`): a lockout's model is a
    client's choice, and `--url` may point at anything."""
    from rich.table import Table
    from rich.text import Text

    def said(value: object) -> str:
        return visible(str(value))

    b = h["circuitBreakers"]
    c = h["connections"]
    r = h["requests"]
    status = said(h["status"])
    title = Text.assemble(
        (f"omniroute {said(h['version'])}", "bold"), f" at {url}: ", (status.upper(), _style(h["status"]))
    )
    title.append(f"  (up {duration(h['uptimeMs'])})")
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    rows = [
        (
            "Breakers",
            f"{said(b['open'])} open, {said(b['halfOpen'])} half-open, {said(b['degraded'])} degraded,"
            f" {said(b['closed'])} closed (of {said(b['total'])})",
        ),
        (
            "Connections",
            f"{said(c['active'])} active, {said(c['coolingDown'])} cooling, {said(c['terminal'])} terminal,"
            f" {said(c['disabled'])} disabled (of {said(c['total'])})",
        ),
        ("Lockouts", f"{len(h['lockouts'])} active"),
        (
            "Requests",
            f"{said(r['total'])} total, {said(r['ok'])} ok, {said(r['failed'])} failed,"
            f" {said(r['inFlight'])} in flight",
        ),
    ]
    now = epoch_ms(h.get("timestamp"))
    backend = h.get("stateBackend")
    if isinstance(backend, dict):
        rows.append(("State", _state_line(backend, h.get("fleet"), now, said)))
    for name, text in rows:
        grid.add_row(name, Text(text))
    for breaker in h["providerBreakers"]:
        if breaker["state"] != "CLOSED":
            line = Text.assemble(
                said(breaker["provider"]), " ", (said(breaker["state"]), _style(breaker["state"]))
            )
            line.append(f"  {said(breaker['failureCount'])} failures")
            if breaker["retryAfterMs"]:
                line.append(f", retry in {duration(breaker['retryAfterMs'])}")
            if breaker["lastFailure"]:
                line.append(f", last failure {ago(breaker['lastFailure'], now)}")
            grid.add_row("  breaker", line)
    for lockout in h["lockouts"][:5]:
        grid.add_row(
            "  lockout",
            Text(
                said(
                    f"{lockout['provider']}/{lockout['model']} on {lockout['connectionId']}: {lockout['reason']},"
                )
                + f" {duration(lockout['remainingMs'])} left"
            ),
        )
    if len(h["lockouts"]) > 5:
        grid.add_row("", Text(f"... {len(h['lockouts']) - 5} more: omniroute lockouts", style="dim"))
    outer = Table.grid()
    outer.add_row(title)
    outer.add_row(grid)
    return outer


def _style(state: str) -> str:
    return STATE_STYLES.get(state, "")


# Column titles are the console's (omniroute_tui.snapshot.COLUMNS, which this module must not import:
# it loads the engine); tests/cli/test_views.py keeps the two lists equal.


def _traffic(stats: dict[str, Any] | None) -> tuple[str, str]:
    if not stats:
        return fmt.NONE, fmt.NONE
    return fmt.traffic(stats["requests"], stats["p50Ms"], stats["errorRate"])


def _breakers_table(
    rows: list[dict[str, Any]], now: float | None, stats: dict[str, Any]
) -> RenderableType | None:
    if not rows:
        note("No providers are configured.")
        return None
    t = table(
        "Provider",
        "Class",
        "State",
        "Failures",
        "Degraded/opens at",
        "Retry in",
        "Open cycles",
        "Last failure",
        "p50 5m",
        "Errors 5m",
        keep=3,
    )
    for b in rows:
        t.add_row(
            cell(b["provider"], "bold"),
            cell(b["class"]),
            state_cell(b["state"]),
            cell(b["failureCount"]),
            cell(f"{b['degradationThreshold']} / {b['failureThreshold']}"),
            cell(duration(b["retryAfterMs"])),
            cell(b["openCycleCount"]),
            cell(ago(b["lastFailure"], now)),
            *(cell(text) for text in _traffic(stats.get(b["provider"]))),
        )
    return t


def _in_flight(c: dict[str, Any]) -> str:
    return fmt.in_flight(c["inFlight"], c.get("maxConcurrent"))


def _connection_name(c: dict[str, Any]) -> str:
    return c["id"] if c.get("name") in (None, "", c["id"]) else f"{c['id']} ({c['name']})"


def _connections_table(rows: list[dict[str, Any]], stats: dict[str, Any]) -> RenderableType | None:
    if not rows:
        note("No connections are configured.")
        return None
    return _connection_rows(rows, "In-flight/max", _in_flight, cooldown_style="", stats=stats)


def _cooldowns_table(rows: list[dict[str, Any]]) -> RenderableType | None:
    if not rows:
        note("No connection is cooling down.")
        return None
    return _connection_rows(rows, "Last error at", lambda c: ago(c["lastErrorAt"]), cooldown_style="yellow")


def _connection_rows(
    rows: list[dict[str, Any]],
    last_header: str,
    last_value: Callable[[dict[str, Any]], Any],
    *,
    cooldown_style: str,
    stats: dict[str, Any] | None = None,
) -> RenderableType:
    """The connections table and the cooldowns table differ only in their last column (and the
    connections table adds the 5-minute traffic)."""
    traffic = ("p50 5m", "Errors 5m") if stats is not None else ()
    t = table(
        "Provider",
        "Connection",
        "Status",
        "Cooldown",
        "Backoff",
        "Last error",
        "Code",
        last_header,
        *traffic,
        keep=3,
    )
    for c in rows:
        t.add_row(
            cell(c["provider"], "bold"),
            cell(_connection_name(c)),
            state_cell(c["status"]),
            cell(duration(c["cooldownRemainingMs"]), cooldown_style),
            cell(c["backoffLevel"]),
            cell(fmt.clip(fmt.readable_error(c["lastError"]), ERROR_WIDTH) if c["lastError"] else None),
            cell(c["errorCode"]),
            cell(last_value(c)),
            *((cell(text) for text in _traffic(stats.get(c["id"]))) if stats is not None else ()),
        )
    return t


def _clock_time(iso: str | None) -> str:
    """An API timestamp in this machine's local time, `2026-01-01 00:02:00`."""
    from datetime import datetime

    at = epoch_ms(iso)
    if at is None:
        return fmt.NONE
    try:
        return datetime.fromtimestamp(at / 1000).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):  # a time no clock can show (an instance's words)
        return "?"


def _lockouts_table(rows: list[dict[str, Any]]) -> RenderableType | None:
    if not rows:
        note("No model is locked out.")
        return None
    t = table("Provider", "Connection", "Model", "Reason", "Failures", "Remaining", "Expires at", keep=3)
    for lockout in rows:
        t.add_row(
            cell(lockout["provider"], "bold"),
            cell(lockout["connectionId"]),
            cell(lockout["model"]),
            cell(lockout["reason"]),
            cell(lockout["failureCount"]),
            cell(duration(lockout["remainingMs"]), "yellow"),
            cell(_clock_time(lockout["expiresAt"])),
        )
    return t


@app.command(rich_help_panel=PANEL)
def events(
    follow: FollowOpt = False,
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
) -> None:
    """Recent state changes (the last 1,000), oldest first; with --follow, one line per change as it
    happens (with --json, one Event object per line). Ctrl+C stops following (exit 0); exits 3 when
    the instance stops.

    Example: [bold]omniroute events -f --json | jq -r 'select(.layer == "breaker") | .key'[/bold]
    """
    json_ = as_json(json_, output)
    with connect(url, token, config, state) as api:
        if not follow:
            listed = api.get(EVENTS)["events"]
            emit(listed, json_=json_, human=lambda: _events_view(listed))
            return
        try:
            _follow_events(api.stream(f"{STREAM}?kinds=event"), json_=json_)
        except KeyboardInterrupt:
            return


def _follow_events(messages: Iterator[tuple[str, dict[str, Any]]], *, json_: bool) -> None:
    printed = -1  # the seq of the last event printed; -1 before the first snapshot
    for kind, data in messages:
        if kind == "snapshot":
            batch = data.get("events", [])
            if printed >= 0 and batch and batch[0].get("seq", 0) > printed + 1:
                # It fell behind and was sent a snapshot, which holds the last 200 events only.
                note(
                    f"(some events were missed: the next shown is #{batch[0]['seq']}, the last was #{printed})"
                )
        elif kind == "event":
            batch = [data]
        else:
            continue
        for event in batch:
            seq = event.get("seq", 0)
            if isinstance(seq, int) and seq > printed:
                _print_event(event, json_=json_)
                printed = seq


def _print_event(event: dict[str, Any], *, json_: bool) -> None:
    if json_:
        sys.stdout.write(json.dumps(event, ensure_ascii=False) + "\n")
        sys.stdout.flush()
        return
    from rich.text import Text

    line = Text.assemble(
        (fmt.clock_time(event.get("ts")), "dim"),
        "  ",
        cell(event.get("layer")),
        "  ",
        cell(event.get("key")),
        "  ",
        state_cell(str(event.get("from") or "")),
        " → ",
        state_cell(str(event.get("to") or "")),
        "  ",
        cell(event.get("reason"), "dim"),
    )
    console().print(line)
    sys.stdout.flush()


def _events_view(listed: list[dict[str, Any]]) -> RenderableType:
    t = table("time", "layer", "key", "from", "to", "reason", keep=3)
    for event in listed:
        t.add_row(
            fmt.clock_time(event.get("ts")),
            cell(event.get("layer")),
            cell(event.get("key")),
            state_cell(str(event.get("from") or "")),
            state_cell(str(event.get("to") or "")),
            cell(event.get("reason")),
        )
    if not listed:
        note("no events yet")
    return t
