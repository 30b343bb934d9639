"""Options shared by several commands, declared once (typer `Annotated` aliases)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from omniroute_tui.cli.client import Api, resolve_target

__all__ = [
    "ConfigOpt",
    "JsonOpt",
    "Output",
    "OutputOpt",
    "StateOpt",
    "TokenOpt",
    "UrlOpt",
    "as_json",
    "connect",
]

ConfigOpt = Annotated[
    str | None,
    typer.Option("--config", help="Config file (default: platform config dir; env OMNIROUTE_CONFIG)."),
]
StateOpt = Annotated[
    str | None,
    typer.Option("--state", help="State database (default: platform data dir; env OMNIROUTE_STATE)."),
]
UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="OMNIROUTE_URL",
        # Escaped: typer renders help as Rich markup, where a bare `[server]` is a tag and vanishes.
        help=(
            "Instance to talk to, e.g. http://127.0.0.1:20128 (default: the instance serving the state"
            " file, as its lock file says; else the config's \\[server] host and port)."
        ),
    ),
]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="OMNIROUTE_MANAGEMENT_TOKEN",
        help="Management token (default: the config's server.management_token when --url is not given).",
    ),
]
JsonOpt = Annotated[
    bool,
    typer.Option("--json", help="Print the management API's JSON unchanged (nothing else on stdout)."),
]


class Output(StrEnum):
    """What `-o` accepts: only JSON, the one format besides the default table (kubectl's and gh's spelling)."""

    json = "json"


OutputOpt = Annotated[
    Output | None,
    typer.Option("-o", "--output", help="Output format: [bold]-o json[/bold] is the same as --json."),
]


def as_json(json_: bool, output: Output | None) -> bool:
    """Did the command line ask for JSON, as `--json` or as `-o json`?"""
    return json_ or output is Output.json


def connect(url: str | None, token: str | None, config: str | None, state: str | None = None) -> Api:
    """A client for the instance the options point at."""
    return Api(resolve_target(url, token, config, state=state))
