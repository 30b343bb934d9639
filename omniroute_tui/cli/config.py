"""`omniroute config init|path|check`: the config file, without a running instance.

`init` probes the built-in local servers (`GET {base_url}/models`, all at once, about half a
second at most) and writes a starter file with the ones that answered, mode 0600 because the
file may later hold API keys.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any

import typer

from omniroute_tui import format as fmt
from omniroute_tui.cli.exit_codes import ExitCode, InvalidValue, Unexpected
from omniroute_tui.cli.options import ConfigOpt, JsonOpt, OutputOpt, StateOpt, as_json
from omniroute_tui.cli.output import cell, emit, note
from omniroute_tui.untrusted import visible

app = typer.Typer(help="Write, locate and validate the config file.", no_args_is_help=True)

PROBE_TIMEOUT_S = 0.5
"""A local server answers /models in milliseconds; anything slower is not worth waiting for at init."""


def _probe(base_url: str) -> bool:
    """Does an OpenAI-compatible server answer `GET {base_url}/models` with a 2xx in time?"""
    import httpx

    try:
        response = httpx.get(f"{base_url}/models", timeout=PROBE_TIMEOUT_S, trust_env=False)
    except httpx.HTTPError:
        return False
    return response.is_success


def detect_local_servers() -> dict[str, str]:
    """The built-in local providers (id → base_url) whose server answers right now."""
    from proxy import config as proxy_config

    builtins = dict(proxy_config.BUILTIN_LOCAL_PROVIDERS)
    with ThreadPoolExecutor(max_workers=len(builtins) or 1) as pool:
        answers = list(pool.map(_probe, builtins.values()))
    return {pid: url for (pid, url), ok in zip(builtins.items(), answers, strict=True) if ok}


def _write_private(path: Path, text: str, *, overwrite: bool) -> None:
    """Write `text` at `path`, mode 0600 whatever umask or earlier mode; never clobber unless asked."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            fd = -1  # the file object owns it now
            handle.write(text)
    finally:
        if fd != -1:
            os.close(fd)


@app.command("init")
def init(
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing config file.")] = False,
    json_: JsonOpt = False,
    output: OutputOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Write a starter config (mode 0600) with the local servers that answer now (ollama, lmstudio, llamacpp, vllm).

    Example: [bold]omniroute config init && omniroute config check[/bold]
    """
    json_ = as_json(json_, output)
    from proxy.config import render_starter_config, resolve_config_path

    path = resolve_config_path(config, os.environ)
    if path.exists() and not force:
        raise InvalidValue(
            f"{path} already exists; pass --force to overwrite it (`omniroute config check` validates it)"
        )
    detected = detect_local_servers()
    try:
        _write_private(path, render_starter_config(detected), overwrite=force)
    except FileExistsError:
        raise InvalidValue(f"{path} already exists; pass --force to overwrite it") from None
    except OSError as exc:
        raise Unexpected(f"cannot write {path}: {exc.strerror or exc}") from None
    found = ", ".join(detected) if detected else "none (the usual addresses are written)"
    text = f"Wrote {path} (mode 0600). Local servers answering: {found}. Next: omniroute config check"
    emit({"path": str(path), "detected": detected}, json_=json_, human=lambda: cell(text))


@app.command("path")
def path(
    json_: JsonOpt = False, output: OutputOpt = None, config: ConfigOpt = None, state: StateOpt = None
) -> None:
    """Show where the config file and the state database are (and whether they exist).

    Example: [bold]$EDITOR "$(omniroute config path --json | jq -r .config)"[/bold]
    """
    json_ = as_json(json_, output)
    from proxy.config import resolve_config_path, resolve_state_path

    config_path = resolve_config_path(config, os.environ)
    state_path = resolve_state_path(state, os.environ)
    data = {
        "config": str(config_path),
        "configExists": config_path.is_file(),
        "state": str(state_path),
        "stateExists": state_path.is_file(),
    }

    def human() -> Any:
        from rich.table import Table

        grid = Table.grid(padding=(0, 2))
        config_note = "exists" if data["configExists"] else "not found: the embedded default is used"
        grid.add_row(cell("config", "bold"), cell(config_path), cell(config_note, "dim"))
        state_note = "exists" if data["stateExists"] else "not found: created on first start"
        grid.add_row(cell("state", "bold"), cell(state_path), cell(state_note, "dim"))
        return grid

    emit(data, json_=json_, human=human)


@app.command("check")
def check(json_: JsonOpt = False, output: OutputOpt = None, config: ConfigOpt = None) -> None:
    """Load and validate the config file; exit 2 naming every problem.

    Example: [bold]omniroute config check --config ./config.toml[/bold]
    """
    json_ = as_json(json_, output)
    from proxy.config import ConfigError, check_config, resolve_config_path, shown_url

    config_path = resolve_config_path(config, os.environ)
    explicit = bool(config or os.environ.get("OMNIROUTE_CONFIG"))
    try:
        loaded = check_config(config_path, os.environ, explicit=explicit)
    except ConfigError as exc:
        # Every problem, one per line, as `serve` prints them (and exit 2, as `serve` does): a file
        # this command calls valid is one `serve` starts with.
        if json_:
            problems = [p.to_dict(exc.path) for p in exc.problems]
            path = str(exc.path) if exc.path is not None else None
            emit({"path": path, "valid": False, "problems": problems}, json_=True, human=lambda: None)
        lines = "\n".join(visible(line) for line in str(exc).splitlines())
        typer.echo(f"omniroute: {lines}", err=True)
        raise typer.Exit(int(ExitCode.USAGE)) from None
    for warning in loaded.warnings:
        note(f"warning: {warning}")
    server = loaded.server
    data = {
        "path": str(loaded.source) if loaded.source is not None else None,
        "valid": True,
        "problems": [],
        "server": {
            "host": server.host,
            "port": server.port,
            "managementToken": server.management_token is not None,
            "apiKeys": len(server.api_keys),
        },
        "providers": {
            pid: {
                "class": p.provider_class,
                "baseUrl": shown_url(p.base_url),
                "connections": [c.id for c in p.connections],
            }
            for pid, p in loaded.providers.items()
        },
        "combos": {name: list(c.targets) for name, c in loaded.combos.items()},
        "state": {"backend": loaded.state.shown, "keyPrefix": loaded.state.key_prefix},
        "warnings": list(loaded.warnings),
    }
    source = (
        str(config_path) if loaded.source is not None else f"no file at {config_path}; the embedded default"
    )
    connections = sum(len(p.connections) for p in loaded.providers.values())
    token = "set" if server.management_token else "not set"
    state = loaded.state
    # (Not reached from here: `serve` says at start whether Redis answers.)
    where = (
        f"{state.shown} under {state.key_prefix!r}, shared by a fleet" if state.shared else "the state file"
    )
    text = (
        f"{source}: OK. {fmt.counted(len(loaded.providers), 'provider')}, "
        f"{fmt.counted(connections, 'connection')}, {fmt.counted(len(loaded.combos), 'combo')};"
        f" listens on {server.host}:{server.port}; management token {token}; state in {where}."
    )
    emit(data, json_=json_, human=lambda: cell(text))
