"""Operator actions: `reset breaker|connection`, `reenable`, `enable`, `disable`.

The same actions as the console's `r`, `R` and `e` keys, each one management call per name
(docs/api.md#the-management-api). Like kubectl and gh, every action takes several names, and all of them are
checked against the instance before the first is acted on: one unknown name exits 5 naming it and
nothing changes. `--json` prints the API's answer unchanged for one name, and the list of answers,
in the order given, for several (and for `reset connection --all`, which has no bulk route).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote

import typer

from omniroute_tui import format as fmt
from omniroute_tui.cli.client import Api
from omniroute_tui.cli.complete import complete_connections, complete_locked_models, complete_providers
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

HEALTH = "/api/monitoring/health"
CONNECTIONS = "/api/resilience/connections"
LOCKOUTS = "/api/resilience/model-cooldowns"


def _names(values: list[str] | None, all_: bool, what: str) -> list[str]:
    """The names given, each once, in order; exactly one of names and --all."""
    names = list(dict.fromkeys(values or ()))
    if names and all_:
        raise InvalidValue(f"give {what} or --all, not both")
    if not names and not all_:
        raise InvalidValue(f"give {what}, or --all for every one")
    return names


def _quoted(names: Iterable[str]) -> str:
    return " or ".join(f"'{name}'" for name in names)


def _refuse(problems: list[str], given: int) -> None:
    """Exit 5 with every problem in one line, before anything was changed."""
    if problems:
        tail = "; nothing was changed" if given > 1 else ""
        raise NotFound("; ".join(problems) + tail)


def _check_known(api: Api, kind: str, names: list[str], known: Iterable[str]) -> None:
    known_names = set(known)
    unknown = [name for name in names if name not in known_names]
    if unknown:
        _refuse([f"no {kind} {_quoted(unknown)} at {api.target.url}"], len(names))


def _connection_ids(api: Api) -> dict[str, str]:
    """Every connection id of the instance → its provider."""
    return {c["id"]: c["provider"] for c in api.get(CONNECTIONS)["connections"]}


def _provider_ids(api: Api) -> list[str]:
    return [b["provider"] for b in api.get(HEALTH)["providerBreakers"]]


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


def _one_or_list(answers: list[Any]) -> Any:
    """One name: the API's answer unchanged (as before several were accepted); several: the list."""
    return answers[0] if len(answers) == 1 else answers


@reset_app.command("breaker")
def reset_breaker(
    providers: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="PROVIDER",
            autocompletion=complete_providers,
            help="Provider ids, as in `omniroute breakers`.",
            show_default=False,
        ),
    ] = None,
    all_: AllOpt = False,
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Reset providers' circuit breakers to CLOSED (failure count and open cycles cleared).

    Examples: [bold]omniroute reset breaker openai[/bold], [bold]omniroute reset breaker openai groq[/bold],
    [bold]omniroute reset breaker --all[/bold]
    """
    json_ = as_json(json_, output)
    names = _names(providers, all_, "PROVIDER")
    with connect(url, token, config) as api:
        if all_:
            answer = api.call("POST", "/api/resilience/reset", {})
            count = answer.get("resetCount", 0)
            emit(answer, json_=json_, human=_said(f"Reset {fmt.counted(count, 'breaker')}."))
            return
        _check_known(api, "provider", names, _provider_ids(api))
        answers = [
            api.call("POST", "/api/resilience/reset", {"provider": p}, names=f"provider {p!r}") for p in names
        ]
    count = sum(a.get("resetCount", 0) for a in answers)
    text = f"Reset {fmt.counted(count, 'breaker')} ({', '.join(names)})."
    emit(_one_or_list(answers), json_=json_, human=_said(text))


@reset_app.command("connection")
def reset_connection(
    connection_ids: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="ID",
            autocompletion=complete_connections,
            help="Connection ids, as in `omniroute connections`.",
            show_default=False,
        ),
    ] = None,
    all_: AllOpt = False,
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Clear connections' cooldown, backoff level and terminal state (banned, expired, credits_exhausted).

    A disabled connection stays disabled (see `omniroute enable`). With several ids or --all,
    --json prints the list of the API's answers, one per connection.

    Examples: [bold]omniroute reset connection openai-main[/bold], [bold]omniroute reset connection --all[/bold]
    """
    json_ = as_json(json_, output)
    names = _names(connection_ids, all_, "ID")
    with connect(url, token, config) as api:
        known = list(_connection_ids(api))
        if all_:
            names = known
        else:
            _check_known(api, "connection", names, known)
        answers = [_reset_one(api, cid) for cid in names]
    if len(names) == 1 and not all_:
        status = answers[0]["connection"]["status"]
        emit(answers[0], json_=json_, human=_said(f"Cleared connection {names[0]} (now {status})."))
        return
    text = f"Cleared {fmt.counted(len(names), 'connection')}" + (f": {', '.join(names)}." if names else ".")
    emit(answers, json_=json_, human=_said(text))


def _reset_one(api: Api, connection_id: str) -> Any:
    path = "/api/resilience/connections/" + _connection_path(connection_id, "/reset")
    return api.call("POST", path, {}, names=f"connection {connection_id!r}")


@app.command(rich_help_panel=PANEL)
def reenable(
    targets: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="PROVIDER/MODEL",
            autocompletion=complete_locked_models,
            help="Locked models, e.g. openai/gpt-4o-mini.",
            show_default=False,
        ),
    ] = None,
    connection: Annotated[
        str | None,
        typer.Option(
            "--connection", metavar="ID", help="Only on this connection.", autocompletion=complete_connections
        ),
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Lift every model lockout.")] = False,
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Lift models' lockouts, on every connection of their provider or on one.

    Exits 5, changing nothing, when one of the models has no lockout (see `omniroute lockouts`).

    Examples: [bold]omniroute reenable openai/gpt-4o-mini[/bold],
    [bold]omniroute reenable openai/gpt-4o-mini openai/gpt-4o --connection openai-main[/bold],
    [bold]omniroute reenable --all[/bold]
    """
    json_ = as_json(json_, output)
    names = _names(targets, all_, "PROVIDER/MODEL")
    if all_ and connection is not None:
        raise InvalidValue("--connection cannot be combined with --all")
    if all_:
        with connect(url, token, config) as api:
            answer = api.call("DELETE", LOCKOUTS, {"all": True})
        removed = answer.get("removed", 0)
        emit(answer, json_=json_, human=_said(f"Lifted {fmt.counted(removed, 'lockout')}."))
        return
    bodies = [_lockout_body(target, connection) for target in names]
    with connect(url, token, config) as api:
        _check_locked(api, names, bodies, connection)
        answers = [api.call("DELETE", LOCKOUTS, body, names="provider or connection") for body in bodies]
    removed = sum(a.get("removed", 0) for a in answers)
    text = f"Lifted {fmt.counted(removed, 'lockout')} of {', '.join(names)}."
    emit(_one_or_list(answers), json_=json_, human=_said(text))


def _lockout_body(target: str, connection: str | None) -> dict[str, object]:
    provider, slash, model = target.partition("/")
    if not slash or not provider or not model:
        raise InvalidValue(f"PROVIDER/MODEL: expected e.g. openai/gpt-4o-mini (got {target!r})")
    body: dict[str, object] = {"provider": provider, "model": model}
    if connection is not None:
        body["connectionId"] = connection
    return body


def _check_locked(
    api: Api, names: list[str], bodies: list[dict[str, object]], connection: str | None
) -> None:
    """Every target names a known provider (and connection of it) and has an active lockout."""
    url = api.target.url
    providers = set(_provider_ids(api))
    owners = _connection_ids(api) if connection is not None else {}
    locked = {(item["provider"], item["model"], item["connectionId"]) for item in api.get(LOCKOUTS)["items"]}
    locked_anywhere = {(provider, model) for provider, model, _ in locked}
    problems: list[str] = []
    for target, body in zip(names, bodies, strict=True):
        provider, model = body["provider"], body["model"]
        if provider not in providers:
            problems.append(f"no provider '{provider}' at {url}")
        elif connection is not None and owners.get(connection) != provider:
            problems.append(f"provider '{provider}' has no connection '{connection}' at {url}")
        elif (
            (provider, model) not in locked_anywhere
            if connection is None
            else (provider, model, connection) not in locked
        ):
            where = f" on connection {connection}" if connection else ""
            problems.append(f"no lockout on {target}{where}; `omniroute lockouts` lists the active ones")
    _refuse(list(dict.fromkeys(problems)), len(names))  # a wrong --connection is said once


def _set_enabled(
    connection_ids: list[str],
    enabled: bool,
    json_: bool,
    url: str | None,
    token: str | None,
    config: str | None,
) -> None:
    names = list(dict.fromkeys(connection_ids))
    with connect(url, token, config) as api:
        _check_known(api, "connection", names, _connection_ids(api))
        answers = [
            api.call(
                "PUT",
                "/api/providers/" + _connection_path(cid),
                {"isActive": enabled},
                names=f"connection {cid!r}",
            )
            for cid in names
        ]
    verb = "Enabled" if enabled else "Disabled"
    now = [f"{cid} (now {a['connection']['status']})" for cid, a in zip(names, answers, strict=True)]
    if len(names) == 1:
        text = f"{verb} connection {now[0]}."
    else:
        text = f"{verb} {fmt.counted(len(names), 'connection')}: {', '.join(now)}."
    emit(_one_or_list(answers), json_=json_, human=_said(text))


IdsArg = Annotated[
    list[str],
    typer.Argument(
        metavar="ID",
        autocompletion=complete_connections,
        help="Connection ids, as in `omniroute connections`.",
        show_default=False,
    ),
]


@app.command(rich_help_panel=PANEL)
def enable(
    connection_ids: IdsArg,
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Put disabled connections back into rotation.

    Examples: [bold]omniroute enable openai-main[/bold], [bold]omniroute enable openai-main openai-backup[/bold]
    """
    _set_enabled(connection_ids, True, as_json(json_, output), url, token, config)


@app.command(rich_help_panel=PANEL)
def disable(
    connection_ids: IdsArg,
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Take connections out of rotation until `omniroute enable`.

    Examples: [bold]omniroute disable openai-main[/bold], [bold]omniroute disable openai-main openai-backup[/bold]
    """
    _set_enabled(connection_ids, False, as_json(json_, output), url, token, config)
