"""`omniroute settings show|set|reset`: the live resilience settings of a running instance.

Keys are the dotted wire names (`providerBreaker.apikey.failureThreshold`). A value is parsed and
range-checked here first, from the same schema the instance validates with (`proxy.settings`), so
a typo fails fast with the field and its accepted range; the instance then re-checks the merged
document (cross-field rules) and its 400 is reported the same way. Model Lockout lives under
`/api/settings`, everything else under `/api/resilience`.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Annotated, Any

import typer

from omniroute_tui.cli.exit_codes import InvalidValue
from omniroute_tui.cli.options import ConfigOpt, JsonOpt, OutputOpt, TokenOpt, UrlOpt, as_json, connect
from omniroute_tui.cli.output import cell, emit

if TYPE_CHECKING:
    from rich.console import RenderableType

app = typer.Typer(help="Show and change the resilience settings of a running instance.", no_args_is_help=True)

ROUTES = {"resilience": "/api/resilience", "settings": "/api/settings"}


def _group_of(path: str) -> str:
    from proxy.settings import SECTIONS

    top = path.split(".", 1)[0]
    return next(group for group, names in SECTIONS.items() if top in names)


def _known_paths() -> list[str]:
    """Every section, subsection and leaf path, in schema order."""
    from proxy.settings import SCHEMA

    paths: list[str] = []
    for spec in SCHEMA:
        parts = spec.path.split(".")
        for end in range(1, len(parts) + 1):
            prefix = ".".join(parts[:end])
            if prefix not in paths:
                paths.append(prefix)
    return paths


def _check_path(path: str, *, what: str) -> None:
    known = _known_paths()
    if path in known:
        return
    close = difflib.get_close_matches(path, known, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    sections = ", ".join(p for p in known if "." not in p)
    raise InvalidValue(f"unknown {what} {path!r}; {hint}sections: {sections}")


def _nest(path: str, value: object) -> dict[str, Any]:
    """`a.b.c`, 1 → `{"a": {"b": {"c": 1}}}`: the partial document PATCH takes."""
    doc: Any = value
    for part in reversed(path.split(".")):
        doc = {part: doc}
    result: dict[str, Any] = doc
    return result


def _pick(doc: Any, path: str) -> Any:
    for part in path.split("."):
        doc = doc[part]
    return doc


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


SectionArg = Annotated[
    str | None,
    typer.Argument(
        metavar="[SECTION]", help="A section or any part of one: requestQueue, providerBreaker.apikey..."
    ),
]


@app.command("show")
def show(
    section: SectionArg = None,
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Show the settings (all, or one section), each with its default and accepted range.

    --json prints the API's document for that section (both groups merged when no SECTION).

    Examples: [bold]omniroute settings show providerBreaker.apikey[/bold],
    [bold]omniroute settings show modelLockout --json | jq .errorCodes[/bold]
    """
    json_ = as_json(json_, output)
    if section is not None:
        _check_path(section, what="section")
    groups = [_group_of(section)] if section is not None else list(ROUTES)
    doc: dict[str, Any] = {}
    with connect(url, token, config) as api:
        for group in groups:
            doc.update(api.get(ROUTES[group]))
    data = _pick(doc, section) if section is not None else doc
    emit(data, json_=json_, human=lambda: _settings_table(doc, section))


def _settings_table(doc: dict[str, Any], section: str | None) -> RenderableType:
    from omniroute_tui.cli.output import table, wide
    from proxy.settings import SCHEMA

    described = wide()
    t = table("Setting", "Value", "Default", "Accepts", *(["What it does"] if described else []))
    any_changed = False
    for spec in SCHEMA:
        if section is not None and not (spec.path == section or spec.path.startswith(section + ".")):
            continue
        try:
            value = _pick(doc, spec.path)
        except (KeyError, TypeError):
            continue  # an older instance without this key
        default = list(spec.default) if isinstance(spec.default, tuple) else spec.default
        changed = value != default
        any_changed = any_changed or changed
        t.add_row(
            cell(spec.path),
            cell(_text(value) + (" *" if changed else ""), "bold yellow" if changed else "green"),
            cell(_text(default), "dim"),
            cell(spec.accepted()),
            *([cell(spec.help, "dim")] if described else []),
        )
    if any_changed:
        t.caption = "* differs from the default"
        t.caption_justify = "left"
    return t


@app.command("set")
def set_(
    key: Annotated[str, typer.Argument(help="Dotted key, e.g. providerBreaker.apikey.failureThreshold.")],
    value: Annotated[
        str, typer.Argument(help="true/false, an integer, or comma-separated integers for errorCodes.")
    ],
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Change one setting on the running instance (applies live and persists).

    Examples: [bold]omniroute settings set providerBreaker.apikey.failureThreshold 20[/bold],
    [bold]omniroute settings set modelLockout.errorCodes 404,429,503[/bold],
    [bold]omniroute settings set modelLockout.enabled true[/bold]
    """
    json_ = as_json(json_, output)
    from proxy.settings import field

    try:
        spec = field(key)
    except KeyError:
        _check_path(key, what="setting")  # names the closest key
        raise InvalidValue(
            f"{key} is a section, not a setting; `omniroute settings show {key}` lists its keys"
        ) from None
    try:
        parsed = spec.parse(value)
    except ValueError as exc:
        message = str(exc)
        raise InvalidValue(message if "(got" in message else f"{message} (got {value!r})") from None
    group = _group_of(key)
    with connect(url, token, config) as api:
        answer = api.call("PATCH", ROUTES[group], _nest(key, parsed))
    emit(answer, json_=json_, human=lambda: cell(f"{key} = {_text(_pick(answer, key))}"))


@app.command("reset")
def reset(
    section: Annotated[
        str, typer.Argument(help="A section or any part of one: modelLockout, providerBreaker.apikey...")
    ],
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Put a section (or one key) back to its defaults.

    Examples: [bold]omniroute settings reset providerBreaker[/bold],
    [bold]omniroute settings reset connectionCooldown.apikey[/bold]
    """
    json_ = as_json(json_, output)
    from proxy.settings import defaults

    _check_path(section, what="section")
    group = _group_of(section)
    with connect(url, token, config) as api:
        answer = api.call("PATCH", ROUTES[group], _nest(section, _pick(defaults(), section)))
    emit(answer, json_=json_, human=lambda: cell(f"{section} is back to its defaults."))
