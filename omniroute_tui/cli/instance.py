"""Commands that run an instance: `serve` (headless) and `tui` (proxy and console in one process).

uvicorn, Starlette and Textual are imported inside these commands only.
"""

from __future__ import annotations

import os
import sys
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from omniroute_tui.cli.client import Target

from omniroute_tui.cli.options import ConfigOpt, StateOpt, TokenOpt
from omniroute_tui.untrusted import visible_lines

app = typer.Typer()

PANEL = "Run an instance"

HostOpt = Annotated[
    str | None, typer.Option("--host", help="Listen address (default from config: 127.0.0.1).")
]
PortOpt = Annotated[int | None, typer.Option("--port", min=1, max=65535, help="Listen port (default 20128).")]
DemoOpt = Annotated[
    bool,
    typer.Option(
        "--demo",
        help="Run against built-in simulated upstreams, state in a temporary directory (--config and --state are ignored).",
    ),
]


class LogLevel(StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


class LogFormat(StrEnum):
    text = "text"
    json = "json"


LogFormatOpt = Annotated[
    LogFormat,
    typer.Option(
        "--log-format",
        help="text, or json: one object per line (ts, level, logger, message, and an event's fields)."
        " The console (tui) shows its log in the Events tab, where the format does not apply.",
    ),
]


def _say_what_demo_ignores(demo: bool, config: str | None, state: str | None) -> None:
    """One line on stderr when --demo drops --config or --state, which it used to do without a word.

    Honouring them is not an option: the demo's settings and simulated providers would be written
    into the operator's real state database (or run against a config it does not match).
    """
    ignored = [name for name, value in (("--config", config), ("--state", state)) if demo and value]
    if ignored:
        verb = "is" if len(ignored) == 1 else "are"
        typer.echo(
            "omniroute: --demo runs on its own simulated providers and a temporary state database:"
            f" {' and '.join(ignored)} {verb} ignored",
            err=True,
        )


@app.command(rich_help_panel=PANEL)
def serve(
    demo: DemoOpt = False,
    host: HostOpt = None,
    port: PortOpt = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
    log_level: Annotated[
        LogLevel,
        typer.Option(
            "--log-level",
            help="The least severe log lines written: info (the default) has one line per breaker"
            " transition, cooldown, terminal state, lockout, settings change and operator action.",
        ),
    ] = LogLevel.info,
    log_format: LogFormatOpt = LogFormat.text,
) -> None:
    """Run the proxy headless, logging to stderr every state change of the engine.

    Example: [bold]omniroute serve --port 20128[/bold], then point clients at http://127.0.0.1:20128/v1;
    [bold]omniroute serve --log-format json 2>> omniroute.log[/bold]
    """
    from proxy import logs
    from proxy.serve import Options, StartupError, run_headless

    _say_what_demo_ignores(demo, config, state)
    logs.configure(log_level.value, log_format.value)
    try:
        run_headless(Options(config=config, state=state, host=host, port=port, demo=demo))
    except StartupError as exc:
        typer.echo(f"omniroute: {visible_lines(str(exc))}", err=True)  # (it may quote a --host)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        pass


@app.command(rich_help_panel=PANEL)
def tui(
    demo: DemoOpt = False,
    read_only: Annotated[
        bool,
        typer.Option(
            "--read-only", help="Watch only: every action is disabled (and the status line says so)."
        ),
    ] = False,
    host: HostOpt = None,
    port: PortOpt = None,
    config: ConfigOpt = None,
    state: StateOpt = None,
    log_level: Annotated[
        LogLevel,
        typer.Option(
            "--log-level",
            help="The least severe log lines shown in the Events tab (default warning; the engine's"
            " state changes are there anyway). debug shows no more than info.",
        ),
    ] = LogLevel.warning,
    log_format: LogFormatOpt = LogFormat.text,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            envvar="OMNIROUTE_URL",
            help="Attach to the instance running there (omniroute serve or tui) instead of hosting one;"
            " quitting leaves it running.",
        ),
    ] = None,
    token: TokenOpt = None,
) -> None:
    """Run the proxy and its operator console in one process (quitting stops both), or with --url
    attach the console to an instance that runs without it.

    Example: [bold]omniroute tui --demo[/bold] (simulated upstreams: every layer moves within a minute)
    """
    from omniroute_tui import terminal

    # Attached, the instance is checked first: with nothing to attach to, the terminal is moot.
    # (`--url ''` is a URL to check, not none: click leaves an empty OMNIROUTE_URL unset itself.)
    target = _reachable(url, token, ignored=(demo, host, port)) if url is not None else None
    problem = terminal.refusal(
        os.environ,
        ("stdin", sys.stdin),
        ("stdout", sys.stdout),
        ("stderr", sys.stderr),
        attached=target.url if target is not None else None,
    )
    if problem is not None:
        typer.echo(f"omniroute: {problem}", err=True)
        raise typer.Exit(2)

    if target is not None:
        from omniroute_tui.app import run_attached

        code = run_attached(
            target.url, target.token, read_only=read_only, ascii_only=terminal.wants_ascii(os.environ)
        )
        raise typer.Exit(code)
    _say_what_demo_ignores(demo, config, state)
    from proxy import logs

    # Only the level: the console sends every record to its Events tab (whose handler passes INFO
    # and above), so neither a stream nor a format applies there; --log-format is accepted so that
    # serve and tui take the same options.
    logs.set_level(log_level.value)
    from omniroute_tui.app import run_tui
    from proxy.serve import Options

    code = run_tui(
        Options(config=config, state=state, host=host, port=port, demo=demo),
        read_only=read_only,
        ascii_only=terminal.wants_ascii(os.environ),
    )
    raise typer.Exit(code)


def _reachable(url: str, token: str | None, *, ignored: tuple[object, ...]) -> Target:
    """`tui --url`: the instance answers and takes the token (else exit 3 or 4, as the CLI)."""
    from omniroute_tui.cli.client import Api, resolve_target

    if any(ignored):
        typer.echo(
            "omniroute: --demo, --host and --port are for hosting; attached, they are ignored", err=True
        )
    target = resolve_target(url, token, None)
    with Api(target) as api:
        api.get("/api/monitoring/health")
    return target
