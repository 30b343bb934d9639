"""The `omniroute` command line.

Imports stay inside commands: a read command must not pay for Textual or Starlette.

Layout: `instance` (serve, tui), `views` (status and the four tables), `traffic` (requests,
stats), `actions` (reset, reenable, enable, disable), `settings` and `config` groups; `client` talks to an instance, `output` prints,
`exit_codes` maps failures, and `edge` turns every failure into one line and an exit code.
"""

from __future__ import annotations

import inspect
from typing import Annotated

import typer

from omniroute_tui.cli import actions, config, instance, settings, traffic, views
from omniroute_tui.cli.edge import Edge
from proxy import __version__

__all__ = ["app", "main", "root"]

app = typer.Typer(
    name="omniroute",
    cls=Edge,
    help="Local LLM proxy with circuit breakers, cooldowns and model lockouts, plus its operator console.",
    epilog=(
        "Exit codes: 0 ok, 1 unexpected failure, 2 bad usage or invalid value, 3 no instance reachable,"
        " 4 authentication refused, 5 no such provider / connection / model, 6 status: the instance is degraded."
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"omniroute {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """omniroute: an OpenAI-compatible proxy for local LLM traffic, with OmniRoute's resilience layers."""


app.add_typer(instance.app)
app.add_typer(views.app)
app.add_typer(traffic.app)
app.add_typer(actions.app)
app.add_typer(actions.reset_app, name="reset", rich_help_panel=actions.PANEL)
app.add_typer(settings.app, name="settings", rich_help_panel="Settings and config")
app.add_typer(config.app, name="config", rich_help_panel="Settings and config")


def _flowing_help(*typers: typer.Typer) -> None:
    """In Rich markup mode Typer keeps a help paragraph's line breaks: a docstring wrapped at 100
    columns printed ragged on an 80-column terminal, and `omniroute --help` broke `tui`'s summary
    mid-sentence. Each command's help gets its paragraphs on one line each, for Rich to wrap to the
    terminal (a paragraph that starts with click's `\\b` keeps its lines), and its first paragraph
    as its summary."""
    for sub in typers:
        for command in sub.registered_commands:
            doc = command.help or inspect.getdoc(command.callback) or ""
            paragraphs = [p if p.startswith("\b") else " ".join(p.split()) for p in doc.split("\n\n")]
            command.help = "\n\n".join(paragraphs)
            if command.short_help is None:
                command.short_help = paragraphs[0]


_flowing_help(instance.app, views.app, traffic.app, actions.app, actions.reset_app, settings.app, config.app)


def main() -> None:
    app()
