"""The `omniroute` command line.

Imports stay inside commands: a read command must not pay for Textual or Starlette.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from proxy import __version__

app = typer.Typer(
    name="omniroute",
    help="Local LLM proxy with circuit breakers, cooldowns and model lockouts, plus its operator console.",
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


@app.command()
def serve(
    demo: Annotated[bool, typer.Option("--demo", help="Run against built-in simulated upstreams.")] = False,
    host: Annotated[str | None, typer.Option("--host", help="Listen address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option("--port", min=1, max=65535, help="Listen port (default 20128).")] = None,
    config: Annotated[str | None, typer.Option("--config", help="Config file (env OMNIROUTE_CONFIG).")] = None,
    state: Annotated[str | None, typer.Option("--state", help="State database (env OMNIROUTE_STATE).")] = None,
) -> None:
    """Run the proxy headless (logs to stderr).

    Example: omniroute serve --port 20128, then point clients at http://127.0.0.1:20128/v1
    """
    from proxy.serve import Options, StartupError, run_headless

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        run_headless(Options(config=config, state=state, host=host, port=port, demo=demo))
    except StartupError as exc:
        typer.echo(f"omniroute: {exc}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        pass


def main() -> None:
    app()
