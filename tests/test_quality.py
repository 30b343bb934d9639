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
