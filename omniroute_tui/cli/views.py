"""Read commands: `status`, `breakers`, `cooldowns`, `lockouts`, `connections`.

Each one GETs one management route. `--json` prints that route's view unchanged (the health
document for `status`, a list for the four tables); otherwise a Rich table with every state
written out as well as coloured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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
    duration,
    emit,
    epoch_ms,
    note,
    state_cell,
    table,
)

if TYPE_CHECKING:
    from rich.console import RenderableType

app = typer.Typer()

PANEL = "Views"

ERROR_WIDTH = 40
"""Upstream error texts can be paragraphs; the table shows their start (`--json` has all of it)."""

HEALTH = "/api/monitoring/health"
CONNECTIONS = "/api/resilience/connections"
LOCKOUTS = "/api/resilience/model-cooldowns"


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
    emit(rows, json_=json_, human=lambda: _breakers_table(rows, epoch_ms(health.get("timestamp"))))


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
    emit(rows, json_=json_, human=lambda: _connections_table(rows))


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


def _status_view(h: dict[str, Any], url: str) -> RenderableType:
    from rich.table import Table
    from rich.text import Text

    b = h["circuitBreakers"]
    c = h["connections"]
    r = h["requests"]
    title = Text.assemble(
        (f"omniroute {h['version']}", "bold"), f" at {url}: ", (h["status"].upper(), _style(h["status"]))
    )
    title.append(f"  (up {duration(h['uptimeMs'])})")
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row(
        "Breakers",
        f"{b['open']} open, {b['halfOpen']} half-open, {b['degraded']} degraded, {b['closed']} closed"
        f" (of {b['total']})",
    )
    grid.add_row(
        "Connections",
        f"{c['active']} active, {c['coolingDown']} cooling, {c['terminal']} terminal, {c['disabled']} disabled"
        f" (of {c['total']})",
    )
    grid.add_row("Lockouts", f"{len(h['lockouts'])} active")
    grid.add_row(
        "Requests", f"{r['total']} total, {r['ok']} ok, {r['failed']} failed, {r['inFlight']} in flight"
    )
    now = epoch_ms(h.get("timestamp"))
    for breaker in h["providerBreakers"]:
        if breaker["state"] != "CLOSED":
            line = Text.assemble(breaker["provider"], " ", (breaker["state"], _style(breaker["state"])))
            line.append(f"  {breaker['failureCount']} failures")
            if breaker["retryAfterMs"]:
                line.append(f", retry in {duration(breaker['retryAfterMs'])}")
            if breaker["lastFailure"]:
                line.append(f", last failure {ago(breaker['lastFailure'], now)}")
            grid.add_row("  breaker", line)
    for lockout in h["lockouts"][:5]:
        grid.add_row(
            "  lockout",
            Text(
                f"{lockout['provider']}/{lockout['model']} on {lockout['connectionId']}: {lockout['reason']},"
                f" {duration(lockout['remainingMs'])} left"
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


def _breakers_table(rows: list[dict[str, Any]], now: float | None) -> RenderableType | None:
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
        )
    return t


def _in_flight(c: dict[str, Any]) -> str:
    return fmt.in_flight(c["inFlight"], c.get("maxConcurrent"))


def _connection_name(c: dict[str, Any]) -> str:
    return c["id"] if c.get("name") in (None, "", c["id"]) else f"{c['id']} ({c['name']})"


def _connections_table(rows: list[dict[str, Any]]) -> RenderableType | None:
    if not rows:
        note("No connections are configured.")
        return None
    return _connection_rows(rows, "In-flight/max", _in_flight, cooldown_style="")


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
) -> RenderableType:
    """The connections table and the cooldowns table differ only in their last column."""
    t = table(
        "Provider",
        "Connection",
        "Status",
        "Cooldown",
        "Backoff",
        "Last error",
        "Code",
        last_header,
        keep=3,
    )
    for c in rows:
        t.add_row(
            cell(c["provider"], "bold"),
            cell(_connection_name(c)),
            state_cell(c["status"]),
            cell(duration(c["cooldownRemainingMs"]), cooldown_style),
            cell(c["backoffLevel"]),
            cell(fmt.clip(c["lastError"], ERROR_WIDTH) if c["lastError"] else None),
            cell(c["errorCode"]),
            cell(last_value(c)),
        )
    return t


def _clock_time(iso: str | None) -> str:
    """An API timestamp in this machine's local time, `2026-01-01 00:02:00`."""
    from datetime import datetime

    at = epoch_ms(iso)
    return fmt.NONE if at is None else datetime.fromtimestamp(at / 1000).strftime("%Y-%m-%d %H:%M:%S")


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
