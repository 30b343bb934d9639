"""How a layer's policy dataclass declares its settings: the one place a default and a range are written.

A policy field whose metadata is `tunable(...)` is a live setting: its default is the field's
default (or, for the layers whose defaults differ by provider class, breaker and cooldown, the
value in that layer's `DEFAULT_..._POLICIES`), and the metadata carries its accepted range and its
help text. The settings schema (`proxy/settings.py`) is derived from these fields, and everything
that shows a setting (the API and its OpenAPI document, the console's cards, the CLI, the generated
tables of the docs, every validation message) reads that schema, so a default or a range changed
here changes everywhere.

It is metadata for `dataclasses.field(default=..., metadata=tunable(...))` rather than a field
factory of its own because type checkers know `dataclasses.field`'s defaults and no wrapper's.
Standard library only, like the rest of the engine: this module says what is tunable; the settings
layer decides how it is spelt on the wire (the field name in camelCase) and how it is validated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

HELP = "help"
MIN = "min"
MAX = "max"


def tunable(*, help: str, min: int | None = None, max: int | None = None) -> Mapping[str, Any]:
    """The metadata of a live setting. `min`/`max` bound an int (each item of an int tuple); in a
    policy that exists per provider class, `help` may say `{who}` and `{a_who}` ("API-key", "an API-key")."""
    return {HELP: help, MIN: min, MAX: max}


def is_tunable(field: dataclasses.Field[Any]) -> bool:
    return HELP in field.metadata
