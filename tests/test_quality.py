"""The gates, as tests: lint, format, types, and the one-way dependency rule."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; install the test extra: pip install -e '.[test]'")
    return path


def test_ruff_check_is_clean() -> None:
    result = subprocess.run([_tool("ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean() -> None:
    result = subprocess.run(
        [_tool("ruff"), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_proxy_is_clean() -> None:
    result = subprocess.run([_tool("mypy"), "proxy"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_console_is_clean() -> None:
    """The console too: its attached read model (the Mirror) must answer every question of the
    `Observed` protocol the hosted one does, which only the type checker sees whole."""
    result = subprocess.run([_tool("mypy"), "omniroute_tui"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_engine_imports_no_framework() -> None:
    """proxy/ never needs the console, and the engine never needs HTTP or UI frameworks."""
    code = (
        "import sys, proxy.engine, proxy.settings, proxy.store;"
        "bad = [m for m in ('omniroute_tui', 'textual', 'rich', 'typer', 'starlette', 'httpx', 'aiohttp', 'uvicorn')"
        " if m in sys.modules];"
        "print(','.join(bad))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_proxy_never_imports_the_console() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "proxy").rglob("*.py")
        if any(
            line.lstrip().startswith(("import omniroute_tui", "from omniroute_tui"))
            for line in p.read_text().splitlines()
        )
    ]
    assert offenders == []


# What the console may take from proxy/: the read model it observes through, the settings schema
# its cards edit, and the entry points that start, host or describe an instance. Never the engine,
# its layers' live objects (breakers, health, lockout tables), the pipeline or the store.
CONSOLE_MAY_IMPORT = {
    "proxy",  # __version__
    "proxy.readmodel",
    "proxy.settings",
    "proxy.resilience.errors",  # the settings schema's validation errors
    "proxy.resilience.outcome",  # the provider class names the cards offer
    "proxy.resilience.timefmt",  # the API's instants, read back
    "proxy.config",
    "proxy.serve",
    "proxy.runtime",
    "proxy.signals",
    "proxy.statelock",
    "proxy.logs",
    "proxy.demo",
    "proxy.sse",  # the server-sent events format, to read the live stream
    "proxy.scrub",  # the one scrubber: the CLI keeps its own token out of what it prints
}


def test_the_console_observes_only_through_the_read_model() -> None:
    import ast

    offenders = []
    for path in sorted((ROOT / "omniroute_tui").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            for module in modules:
                if (module == "proxy" or module.startswith("proxy.")) and module not in CONSOLE_MAY_IMPORT:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {module}")
    assert offenders == []
