"""Operator actions: `reset breaker|connection`, `reenable`, `enable`, `disable`.

The same actions as the console's `r`, `R` and `e` keys, each one management call (surface.md §3).
`--json` prints the API's answer unchanged; `reset connection --all` has no bulk route, so it
resets each connection in turn and prints the list of answers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote

import typer

from omniroute_tui.cli.client import Api
from omniroute_tui.cli.exit_codes import InvalidValue, NotFound
from omniroute_tui.cli.options import ConfigOpt, JsonOpt, OutputOpt, TokenOpt, UrlOpt, as_json, connect
from omniroute_tui.cli.output import cell, emit

if TYPE_CHECKING:
    from rich.console import RenderableType

app = typer.Typer()
reset_app = typer.Typer(
    help="Reset breakers to CLOSED, or clear connection cooldowns and terminal states.", no_args_is_help=True
)

PANEL = "Actions"

AllOpt = Annotated[bool, typer.Option("--all", help="Act on every one.")]


def _one_or_all(value: str | None, all_: bool, what: str) -> None:
    if value is not None and all_:
        raise InvalidValue(f"give {what} or --all, not both")
    if value is None and not all_:
        raise InvalidValue(f"give {what}, or --all for every one")


_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""What a config accepts as a connection id (proxy.config): anything else names no connection."""


def _connection_path(connection_id: str, suffix: str = "") -> str:
    # Checked here because "a/b" or ".." would otherwise reach a different route (or none) after
    # the server decodes the path, and the answer would not say "no such connection".
    if not _ID_RE.fullmatch(connection_id):
        raise NotFound(f"no connection '{connection_id}'")
    return f"{quote(connection_id, safe='')}{suffix}"


def _said(text: str) -> Callable[[], RenderableType]:
    """The human form of an action's answer: one sentence."""
    return lambda: cell(text)


@reset_app.command("breaker")
def reset_breaker(
    provider: Annotated[str | None, typer.Argument(help="Provider id, as in `omniroute breakers`.")] = None,
    all_: AllOpt = False,
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Reset a provider's circuit breaker to CLOSED (failure count and open cycles cleared).

    Examples: [bold]omniroute reset breaker openai[/bold], [bold]omniroute reset breaker --all[/bold]
    """
    json_ = as_json(json_, output)
    _one_or_all(provider, all_, "PROVIDER")
    body = {} if all_ else {"provider": provider}
    with connect(url, token, config) as api:
        answer = api.call("POST", "/api/resilience/reset", body, names=f"provider {provider!r}")
    count = answer.get("resetCount", 0)
    text = f"Reset {count} breaker{'s' if count != 1 else ''}" + ("." if all_ else f" ({provider}).")
    emit(answer, json_=json_, human=_said(text))


@reset_app.command("connection")
def reset_connection(
    connection_id: Annotated[
        str | None, typer.Argument(metavar="ID", help="Connection id, as in `omniroute connections`.")
    ] = None,
    all_: AllOpt = False,
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Clear a connection's cooldown, backoff level and terminal state (banned, expired, credits_exhausted).

    It stays disabled if it was disabled (see `omniroute enable`). With --all, --json prints the list
    of the API's answers, one per connection.

    Examples: [bold]omniroute reset connection openai-main[/bold], [bold]omniroute reset connection --all[/bold]
    """
    json_ = as_json(json_, output)
    _one_or_all(connection_id, all_, "ID")
    with connect(url, token, config) as api:
        if connection_id is not None:
            answer = _reset_one(api, connection_id)
            status = answer["connection"]["status"]
            emit(answer, json_=json_, human=_said(f"Cleared connection {connection_id} (now {status})."))
            return
        ids = [c["id"] for c in api.get("/api/resilience/connections")["connections"]]
        answers = [_reset_one(api, cid) for cid in ids]
    text = f"Cleared {len(ids)} connection{'s' if len(ids) != 1 else ''}" + (
        f": {', '.join(ids)}." if ids else "."
    )
    emit(answers, json_=json_, human=_said(text))


def _reset_one(api: Api, connection_id: str) -> Any:
    path = "/api/resilience/connections/" + _connection_path(connection_id, "/reset")
    return api.call("POST", path, {}, names=f"connection {connection_id!r}")


@app.command(rich_help_panel=PANEL)
def reenable(
    target: Annotated[
        str | None,
        typer.Argument(metavar="PROVIDER/MODEL", help="The locked model, e.g. openai/gpt-4o-mini."),
    ] = None,
    connection: Annotated[
        str | None, typer.Option("--connection", metavar="ID", help="Only on this connection.")
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Lift every model lockout.")] = False,
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Lift a model's lockouts, on every connection of its provider or on one.

    Exits 5 when that model has no lockout (see `omniroute lockouts`).

    Examples: [bold]omniroute reenable openai/gpt-4o-mini[/bold],
    [bold]omniroute reenable openai/gpt-4o-mini --connection openai-main[/bold], [bold]omniroute reenable --all[/bold]
    """
    json_ = as_json(json_, output)
    _one_or_all(target, all_, "PROVIDER/MODEL")
    if all_ and connection is not None:
        raise InvalidValue("--connection cannot be combined with --all")
    body: dict[str, object]
    if all_:
        body = {"all": True}
    else:
        assert target is not None
        provider, slash, model = target.partition("/")
        if not slash or not provider or not model:
            raise InvalidValue(f"PROVIDER/MODEL: expected e.g. openai/gpt-4o-mini (got {target!r})")
        body = {"provider": provider, "model": model}
        if connection is not None:
            body["connectionId"] = connection
    with connect(url, token, config) as api:
        answer = api.call("DELETE", "/api/resilience/model-cooldowns", body, names="provider or connection")
    removed = answer.get("removed", 0)
    if not all_ and removed == 0:
        where = f" on connection {connection}" if connection else ""
        raise NotFound(f"no lockout on {target}{where}; `omniroute lockouts` lists the active ones")
    noun = "lockout" if removed == 1 else "lockouts"
    emit(answer, json_=json_, human=_said(f"Lifted {removed} {noun}" + ("." if all_ else f" of {target}.")))


def _set_enabled(
    connection_id: str, enabled: bool, json_: bool, url: str | None, token: str | None, config: str | None
) -> None:
    with connect(url, token, config) as api:
        answer = api.call(
            "PUT",
            "/api/providers/" + _connection_path(connection_id),
            {"isActive": enabled},
            names=f"connection {connection_id!r}",
        )
    status = answer["connection"]["status"]
    verb = "Enabled" if enabled else "Disabled"
    emit(answer, json_=json_, human=_said(f"{verb} connection {connection_id} (now {status})."))


IdArg = Annotated[str, typer.Argument(metavar="ID", help="Connection id, as in `omniroute connections`.")]


@app.command(rich_help_panel=PANEL)
def enable(
    connection_id: IdArg,
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Put a disabled connection back into rotation.

    Example: [bold]omniroute enable openai-main[/bold]
    """
    json_ = as_json(json_, output)
    _set_enabled(connection_id, True, json_, url, token, config)


@app.command(rich_help_panel=PANEL)
def disable(
    connection_id: IdArg,
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Take a connection out of rotation until `omniroute enable`.

    Example: [bold]omniroute disable openai-main[/bold]
    """
    json_ = as_json(json_, output)
    _set_enabled(connection_id, False, json_, url, token, config)
