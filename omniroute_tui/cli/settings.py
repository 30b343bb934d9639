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

from omniroute_tui.cli.complete import complete_setting_keys, complete_setting_paths
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
        metavar="[SECTION]",
        help="A section or any part of one: requestQueue, providerBreaker.apikey...",
        autocompletion=complete_setting_paths,
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


EXAMPLE_PAIRS = "modelLockout.baseCooldownMs=60000 modelLockout.maxCooldownMs=90000"


@app.command("set")
def set_(
    assignments: Annotated[
        list[str],
        typer.Argument(
            metavar="KEY=VALUE",
            autocompletion=complete_setting_keys,
            help="Dotted keys and their values: true/false, an integer, or comma-separated integers for"
            " errorCodes. The form KEY VALUE (one setting) works too.",
            show_default=False,
        ),
    ],
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Change settings on the running instance, all in one atomic change (applies live and persists).

    Several keys go in one PATCH, so a cross-field rule (maxCooldownMs >= baseCooldownMs) can be met
    in one step, and one bad value changes nothing. modelLockout.* and the other sections are saved
    separately, so they cannot be mixed in one command.

    Examples: [bold]omniroute settings set providerBreaker.apikey.failureThreshold=20[/bold],
    [bold]omniroute settings set modelLockout.baseCooldownMs=60000 modelLockout.maxCooldownMs=90000[/bold],
    [bold]omniroute settings set modelLockout.errorCodes 404,429,503[/bold]
    """
    json_ = as_json(json_, output)
    pairs = _pairs(assignments)
    parsed = {key: _parse(key, value) for key, value in pairs}
    group = _one_group(list(parsed))
    patch: dict[str, Any] = {}
    for key, value in parsed.items():
        _merge(patch, _nest(key, value))
    with connect(url, token, config) as api:
        answer = api.call("PATCH", ROUTES[group], patch)

    def human() -> RenderableType:
        from rich.text import Text

        return Text("\n".join(f"{key} = {_text(_pick(answer, key))}" for key in parsed))

    emit(answer, json_=json_, human=human)


def _pairs(args: list[str]) -> list[tuple[str, str]]:
    """`KEY=VALUE...`, or the older `KEY VALUE` (two arguments, the first without `=`)."""
    if len(args) == 2 and "=" not in args[0]:
        return [(args[0], args[1])]
    pairs: list[tuple[str, str]] = []
    for arg in args:
        key, equals, value = arg.partition("=")
        if not equals or not key.strip():
            raise InvalidValue(
                f"expected KEY=VALUE (got {arg!r}); e.g. `omniroute settings set {EXAMPLE_PAIRS}`"
            )
        pairs.append((key.strip(), value))
    keys = [key for key, _ in pairs]
    twice = next((key for key in keys if keys.count(key) > 1), None)
    if twice is not None:
        raise InvalidValue(f"{twice} is given twice")
    return pairs


def _parse(key: str, value: str) -> object:
    """The typed value, range-checked against the schema the instance validates with."""
    from proxy.settings import field

    try:
        spec = field(key)
    except KeyError:
        _check_path(key, what="setting")  # names the closest key
        raise InvalidValue(
            f"{key} is a section, not a setting; `omniroute settings show {key}` lists its keys"
        ) from None
    try:
        return spec.parse(value)
    except ValueError as exc:
        message = str(exc)
        raise InvalidValue(message if "(got" in message else f"{message} (got {value!r})") from None


def _one_group(keys: list[str]) -> str:
    """The one API group all keys belong to.

    Each group is its own PATCH route; two PATCHes are not atomic (the second may be refused after
    the first applied), so keys of both groups in one command are refused rather than half applied.
    """
    groups = {key: _group_of(key) for key in keys}
    if len(set(groups.values())) == 1:
        return groups[keys[0]]
    first = next(k for k in keys if groups[k] == groups[keys[0]])
    other = next(k for k in keys if groups[k] != groups[keys[0]])
    routes = f"{ROUTES[groups[first]]}, {ROUTES[groups[other]]}"
    raise InvalidValue(
        f"{first} and {other} are saved separately ({routes}), so no one change can be atomic:"
        " set them in two commands; nothing was changed"
    )


def _merge(into: dict[str, Any], doc: dict[str, Any]) -> None:
    for key, value in doc.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


@app.command("reset")
def reset(
    section: Annotated[
        str,
        typer.Argument(
            help="A section or any part of one: modelLockout, providerBreaker.apikey...",
            autocompletion=complete_setting_paths,
        ),
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
