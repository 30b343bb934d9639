"""Shell completion of names from the running instance: providers, connections, locked models, settings.

The shell runs `omniroute` on every tab press, so each lookup is one quick GET with a short
timeout, and any failure (no instance, a refused token, a strange answer) completes nothing,
silently: a completion must never print an error into the command line being typed. The instance
is the one the command would talk to: --url, --token and --config when they come before the word
being completed, else OMNIROUTE_URL / the config, as for the command itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import typer

__all__ = [
    "TIMEOUT_S",
    "complete_connections",
    "complete_locked_models",
    "complete_providers",
    "complete_setting_keys",
    "complete_setting_paths",
]

TIMEOUT_S = 0.5
"""Per request. A local instance answers in milliseconds; a tab press must not hang on a dead one."""


def _ask(ctx: typer.Context, *paths: str) -> list[Any] | None:
    """The answers to GET `paths` from the instance the command line points at, or None."""
    from omniroute_tui.cli.client import Api, resolve_target

    params = ctx.params
    try:
        target = resolve_target(params.get("url"), params.get("token"), params.get("config"))
        with Api(target, timeout=TIMEOUT_S) as api:
            return [api.get(path) for path in paths]
    except Exception:  # no instance, no token, not omniroute: offer nothing rather than an error
        return None


def _given(ctx: typer.Context) -> list[str]:
    """The words already given to the command's arguments, in order (typer passes no `args`)."""
    words: list[str] = []
    for value in ctx.params.values():
        if isinstance(value, str):
            words.append(value)
        elif isinstance(value, list | tuple):
            words.extend(v for v in value if isinstance(v, str))
    return words


def _offer(names: Iterable[str], given: Iterable[str], incomplete: str) -> list[str]:
    """The names that extend what is typed, each once, without those already on the command line.

    Model names come from any client: one holding a control character or a line break (which is
    the shell's separator here) is left out rather than typed into the operator's command line.
    """
    skip = set(given)
    return [n for n in dict.fromkeys(names) if n.startswith(incomplete) and n not in skip and n.isprintable()]


def _names(ctx: typer.Context, names_of: Callable[[list[Any]], Iterable[str]], *paths: str) -> list[str]:
    """The names the instance lists (`names_of` its answers to GET `paths`); none if it does not answer."""
    answers = _ask(ctx, *paths)
    if answers is None:
        return []
    try:
        return list(names_of(answers))
    except (KeyError, TypeError, AttributeError):  # an answer of another shape
        return []


def _completer(
    names_of: Callable[[list[Any]], Iterable[str]], *paths: str
) -> Callable[[typer.Context, list[str], str], list[str]]:
    def complete(ctx: typer.Context, args: list[str], incomplete: str) -> list[str]:
        return _offer(_names(ctx, names_of, *paths), _given(ctx), incomplete)

    return complete


def _paths(doc: Any, prefix: str = "", *, leaves_only: bool) -> Iterable[str]:
    """Every dotted path of a settings document (`providerBreaker`, `providerBreaker.apikey`, ...)."""
    for key, value in doc.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            if not leaves_only:
                yield path
            yield from _paths(value, path + ".", leaves_only=leaves_only)
        else:
            yield path


def _setting_paths(answers: list[Any], *, leaves_only: bool) -> Iterable[str]:
    for doc in answers:
        yield from _paths(doc, leaves_only=leaves_only)


complete_providers = _completer(
    lambda a: (b["provider"] for b in a[0]["providerBreakers"]), "/api/monitoring/health"
)
complete_connections = _completer(
    lambda a: (c["id"] for c in a[0]["connections"]), "/api/resilience/connections"
)
complete_locked_models = _completer(
    lambda a: (f"{item['provider']}/{item['model']}" for item in a[0]["items"]),
    "/api/resilience/model-cooldowns",
)
_SETTINGS_ROUTES = ("/api/resilience", "/api/settings")
complete_setting_paths = _completer(lambda a: _setting_paths(a, leaves_only=False), *_SETTINGS_ROUTES)
"""Sections and any part of one, for `settings show` and `settings reset`."""


def complete_setting_keys(ctx: typer.Context, args: list[str], incomplete: str) -> list[str]:
    """Single settings, for `settings set`; nothing for the VALUE of the `KEY VALUE` form."""
    keys = _names(ctx, lambda a: _setting_paths(a, leaves_only=True), *_SETTINGS_ROUTES)
    assignments = ctx.params.get("assignments") or []
    if assignments and assignments[-1] in keys:
        return []
    return _offer(keys, [a.partition("=")[0] for a in assignments], incomplete)
