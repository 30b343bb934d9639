"""`omniroute tui` hands its options to the console's entry point; `serve` refuses a bad setup with exit 2."""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.serve import Options
from tests.cli.conftest import Instance, run


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """`serve` and `tui` set up the process's logging (a handler on CliRunner's stream, which closes)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers, root.level = handlers, level


@pytest.fixture
def fake_console(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Options, bool]]:
    """A stand-in `omniroute_tui.app` whose run_tui records its call and returns 7, on a terminal
    that can (CliRunner's streams are not ttys; test_terminal.py runs the real refusal)."""
    calls: list[tuple[Options, bool]] = []

    def run_tui(options: Options, *, read_only: bool = False, ascii_only: bool = False) -> int:
        calls.append((options, read_only))
        return 7

    monkeypatch.setattr("omniroute_tui.terminal.refusal", lambda env, *streams, attached=None: None)

    module: Any = types.ModuleType("omniroute_tui.app")
    module.run_tui = run_tui
    monkeypatch.setitem(__import__("sys").modules, "omniroute_tui.app", module)
    return calls


def test_tui_passes_every_option_and_exits_with_the_console_code(
    fake_console: list[tuple[Options, bool]], tmp_path: Path
) -> None:
    args = ["tui", "--demo", "--read-only", "--host", "127.0.0.2", "--port", "20999"]
    result = run(*args, "--config", str(tmp_path / "c.toml"), "--state", str(tmp_path / "s.db"))
    assert result.code == 7
    assert fake_console == [
        (Options(config=str(tmp_path / "c.toml"), state=str(tmp_path / "s.db"), host="127.0.0.2", port=20999,
                 demo=True), True),
    ]  # fmt: skip


def test_tui_defaults(fake_console: list[tuple[Options, bool]]) -> None:
    assert run("tui").code == 7
    assert fake_console == [(Options(), False)]


def test_tui_rejects_a_bad_port(fake_console: list[tuple[Options, bool]]) -> None:
    result = run("tui", "--port", "70000")
    assert result.code == 2
    assert "--port" in result.stderr and "65535" in result.stderr
    assert fake_console == []


def test_serve_with_a_broken_config_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[server]\nport = "high"\n')
    result = run("serve", "--config", str(path))
    assert result.code == 2
    assert result.stderr.startswith(f"omniroute: {path}: ")


@pytest.fixture
def fake_headless(monkeypatch: pytest.MonkeyPatch) -> list[Options]:
    """`proxy.serve.run_headless` recording its options instead of serving."""
    calls: list[Options] = []
    monkeypatch.setattr("proxy.serve.run_headless", calls.append)
    return calls


DEMO_IGNORES = (
    "omniroute: --demo runs on its own simulated providers and a temporary state database: {what} ignored\n"
)


@pytest.mark.parametrize(
    ("extra", "what"),
    [
        (["--state", "s.db"], "--state is"),
        (["--config", "c.toml"], "--config is"),
        (["--config", "c.toml", "--state", "s.db"], "--config and --state are"),
    ],
)
def test_demo_says_on_stderr_which_options_it_ignores(
    fake_console: list[tuple[Options, bool]], fake_headless: list[Options], extra: list[str], what: str
) -> None:
    """--state (and --config) with --demo used to be dropped without a word."""
    for command, calls in (("serve", fake_headless), ("tui", fake_console)):
        result = run(command, "--demo", *extra)
        assert result.stderr == DEMO_IGNORES.format(what=what), command
        assert len(calls) == 1, command  # a note, not a refusal: the demo still runs


def test_demo_alone_and_state_without_demo_say_nothing(
    fake_console: list[tuple[Options, bool]], fake_headless: list[Options], tmp_path: Path
) -> None:
    for args in (["--demo"], ["--state", str(tmp_path / "s.db")]):
        assert run("serve", *args).stderr == ""
        assert run("tui", *args).stderr == ""
    assert len(fake_headless) == len(fake_console) == 2


def test_tui_passes_the_log_level_to_the_console(
    fake_console: list[tuple[Options, bool]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console's Events tab shows what the "omniroute" logger lets through: INFO with --log-level info."""
    seen: list[bool] = []
    module: Any = sys.modules["omniroute_tui.app"]
    monkeypatch.setattr(module, "run_tui", lambda *a, **k: seen.append(log_enabled(logging.INFO)) or 0)
    assert run("tui", "--log-level", "info", "--log-format", "json").code == 0
    assert run("tui").code == 0  # default: warnings and errors only, as before
    assert seen == [True, False]


def log_enabled(level: int) -> bool:
    return logging.getLogger("omniroute.events").isEnabledFor(level)


def test_tui_url_checks_the_instance_before_anything_else(secured: Instance) -> None:
    """Attaching needs an instance that answers and takes the token: exit 4 like every command
    when it refuses, before the console (or the terminal check) is even tried."""
    refused = run("tui", "--url", secured.url, "--token", "not-the-token")
    assert refused.code == 4, refused.stderr
    assert "refused the management token" in refused.stderr
    missing = run("tui", "--url", secured.url)
    assert missing.code == 4, missing.stderr
    # With the right token, the instance is fine: what stops it here is CliRunner's lack of a terminal.
    ok = run("tui", "--url", secured.url, "--token", secured.token or "")
    assert ok.code == 2 and "terminal" in ok.stderr, ok.stderr
