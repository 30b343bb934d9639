"""Terminals that cannot: `TERM=dumb` or no tty is refused with a pointer to `serve`, and a
locale that is not UTF-8 gets the console in ASCII, checked on a real pseudo-terminal."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from rich.cells import cell_len

from omniroute_tui.app import make_app
from omniroute_tui.terminal import refusal, to_ascii, wants_ascii
from omniroute_tui.untrusted import visible
from tests.processes import environment, free_port
from tests.tui.conftest import settle
from tests.tui.snapshot_app import CONFIG
from tests.tui.test_hostile import hostile_runtime, screen_lines

OMNIROUTE = [sys.executable, "-c", "from omniroute_tui.cli import main; main()"]


def tui_command(tmp_path: Path) -> list[str]:
    """`omniroute tui` on the fixed config, a state file in tmp_path and a free port."""
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    config.chmod(0o600)
    state = tmp_path / "s.db"
    return [*OMNIROUTE, "tui", "--config", str(config), "--state", str(state), "--port", str(free_port())]


@pytest.mark.parametrize("term", ["dumb", ""])
def test_a_dumb_terminal_is_refused_with_a_pointer_to_serve(term: str, tmp_path: Path) -> None:
    primary, secondary = os.openpty()  # a real tty: only TERM says it cannot
    try:
        done = subprocess.run(
            tui_command(tmp_path),
            stdin=secondary,
            stdout=secondary,
            stderr=subprocess.PIPE,
            env=environment(TERM=term),
            timeout=60,
            text=True,
        )
    finally:
        os.close(primary)
        os.close(secondary)
    assert done.returncode == 2
    assert "omniroute serve" in done.stderr and "TERM=" in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "s.db").exists()  # refused before anything was opened


def test_stderr_to_a_file_is_refused_not_filled_with_escape_codes(tmp_path: Path) -> None:
    primary, secondary = os.openpty()  # keys and stdout on a terminal; Textual draws on stderr
    try:
        done = subprocess.run(
            tui_command(tmp_path),
            stdin=secondary,
            stdout=secondary,
            stderr=subprocess.PIPE,
            env=environment(),
            timeout=60,
            text=True,
        )
    finally:
        os.close(primary)
        os.close(secondary)
    assert done.returncode == 2
    assert done.stderr.startswith("omniroute: the console needs a terminal, and its stderr is not one")
    assert "\x1b" not in done.stderr


def test_a_pipe_is_not_a_terminal() -> None:
    done = subprocess.run(
        [*OMNIROUTE, "tui", "--demo"], capture_output=True, text=True, env=environment(), timeout=60
    )
    assert done.returncode == 2
    assert "its stdin is not one" in done.stderr and "omniroute serve" in done.stderr


def test_refusal_and_charset_rules() -> None:
    class Tty:
        def isatty(self) -> bool:
            return True

    tty = Tty()
    assert refusal({"TERM": "xterm-256color"}, ("stdin", tty), ("stdout", tty)) is None
    assert refusal({"TERM": "dumb"}, ("stdin", tty)) is not None
    assert refusal({}, ("stdin", tty)) is not None
    assert "its stderr is not one" in (refusal({"TERM": "xterm"}, ("stdin", tty), ("stderr", None)) or "")
    headless = refusal({"TERM": "xterm"}, ("stdin", None)) or ""
    assert "`omniroute serve`" in headless
    # Attaching, the instance runs already: the advice is to watch it, not to start one (found by a
    # docs trial).
    attached = refusal({"TERM": "xterm"}, ("stdin", None), attached="http://127.0.0.1:20128") or ""
    assert "omniroute serve" not in attached and "watch http://127.0.0.1:20128 with" in attached
    assert wants_ascii({"LANG": "C"}) and wants_ascii({}) and wants_ascii({"LANG": "en_US.ISO-8859-1"})
    assert not wants_ascii({"LANG": "en_US.UTF-8"}) and not wants_ascii({"LC_ALL": "C.utf8", "LANG": "C"})
    assert wants_ascii({"LC_ALL": "C", "LANG": "en_US.UTF-8"})  # LC_ALL wins, as in C


async def test_every_tab_in_ascii_keeps_its_layout() -> None:
    app = make_app(hostile_runtime(), clock_frozen=True, ascii_only=True)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            for tab in "123456":
                await pilot.press(tab)
                await settle(pilot)
                for line in screen_lines(app):
                    shown = to_ascii(line)
                    assert shown.isascii() and cell_len(shown) == cell_len(line), line
            await pilot.press("4")
            await settle(pilot)
            assert "two\\nlines" in "\n".join(screen_lines(app))  # ASCII marks for a line break
    finally:
        make_app(hostile_runtime(), clock_frozen=True)  # back to Unicode marks for the other tests
    assert visible("a\nb") == "a↵b"


def test_to_ascii_keeps_widths() -> None:
    for text in ("╭─ Details ─╮", "▁▂▃▄▅▆▇█", "▲ ▼ → … · —", "日本語", "é ñ ü", "\u202e", "emoji 🙂"):
        shown = to_ascii(text)
        assert shown.isascii(), shown
        assert cell_len(shown) == cell_len(text), (text, shown)


def read_screen(fd: int, until: bytes, timeout: float) -> bytes:
    """Everything the console wrote to the pty until `until` appeared (or the deadline passed)."""
    seen = b""
    deadline = time.monotonic() + timeout
    while until not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError:
                break
    return seen


def test_the_console_under_lang_c_writes_only_ascii(tmp_path: Path) -> None:
    primary, secondary = os.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    os.set_blocking(primary, False)
    env = environment(LANG="C", LC_ALL="C")
    child = subprocess.Popen(
        tui_command(tmp_path),
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        env=env,
        start_new_session=True,
    )
    os.close(secondary)
    try:
        shown = read_screen(primary, b"Overview", 30)
        assert b"Overview" in shown, shown[-500:]
        shown += read_screen(primary, b"LIVE", 10)
        for _ in range(40):  # a key sent before the app listens is lost: say it until heard
            os.write(primary, b"q")
            shown += read_screen(primary, b"\x00", 0.5)
            if child.poll() is not None:
                break
        assert child.wait(timeout=10) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        os.close(primary)
    assert all(byte < 0x80 for byte in shown), sorted({chr(b) for b in shown if b >= 0x80})
    text = re.sub(rb"\x1b\[[0-9;?<>=$]*[a-zA-Z]", b"", shown)
    assert b"+- Recent events -" in text, text  # the borders, in ASCII
