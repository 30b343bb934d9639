"""Startup cost: a read command imports no server, no console and no engine (run in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import Instance

ROOT = Path(__file__).resolve().parents[2]

NEVER = ("textual", "starlette", "uvicorn", "aiohttp", "proxy.engine", "proxy.app", "proxy.runtime")
"""Not for any command that only talks to an instance."""

SCRIPT = """
import json, sys
sys.argv = ["omniroute", *json.loads(sys.argv[1])]
import omniroute_tui.cli as cli
code = "not run"
if sys.argv[1:]:
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code
with open(OUT, "w") as out:
    json.dump({"code": code, "modules": sorted(sys.modules)}, out)
"""


def loaded(tmp_path: Path, *args: str) -> tuple[object, set[str]]:
    """Run `omniroute ARGS` in a new interpreter; its exit code and every module it imported."""
    out = tmp_path / "modules.json"
    script = SCRIPT.replace("OUT", repr(str(out)))
    result = subprocess.run(
        [sys.executable, "-c", script, json.dumps(list(args))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    return data["code"], set(data["modules"])


def offenders(modules: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in forbidden))


def test_importing_the_cli_loads_nothing_heavy(tmp_path: Path) -> None:
    code, modules = loaded(tmp_path)
    assert code == "not run"
    assert offenders(modules, (*NEVER, "rich", "httpx", "proxy.settings", "proxy.config")) == []


def test_json_read_command_imports_no_server_console_or_engine(tmp_path: Path, proxy: Instance) -> None:
    code, modules = loaded(tmp_path, "breakers", "--json", "--url", proxy.url)
    assert code == 0
    assert "httpx" in modules  # it did talk to the instance (and `import httpx` brings rich along by itself)
    assert offenders(modules, (*NEVER, "proxy.settings")) == []


@pytest.mark.parametrize(
    "args",
    [
        ("status",),
        ("connections",),
        ("lockouts",),
        ("requests",),
        ("stats",),
        ("settings", "show", "providerBreaker"),
    ],
)
def test_human_read_commands_import_no_server_console_or_engine(
    tmp_path: Path, proxy: Instance, args: tuple[str, ...]
) -> None:
    code, modules = loaded(tmp_path, *args, "--config", str(proxy.cli_config))
    assert code == 0
    assert "rich.table" in modules and "proxy.config" in modules
    assert offenders(modules, NEVER) == []
