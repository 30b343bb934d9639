"""`omniroute serve` refuses unsafe or broken setups at start, with one line and exit code 2."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from proxy import __version__
from tests.integration.conftest import Instance

OMNIROUTE = [sys.executable, "-c", "from omniroute_tui.cli import main; main()"]


def run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "OMNIROUTE_STATE": str(tmp_path / "state.db"), **env}
    environment.pop("OMNIROUTE_MANAGEMENT_TOKEN", None)
    return subprocess.run(
        [*OMNIROUTE, "serve", *args], capture_output=True, text=True, timeout=60, env=environment
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10"])
def test_non_loopback_host_without_token_and_keys_is_refused(tmp_path: Path, host: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        '[server]\nport = 1\n\n[providers.ollama]\n\n[[providers.ollama.connections]]\nid = "o-1"\n'
    )
    result = run(["--host", host, "--config", str(config)], tmp_path)
    assert result.returncode == 2
    assert "management_token" in result.stderr and "api_keys" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "state.db").exists()  # refused before anything was opened


def test_non_loopback_host_with_token_but_no_api_keys_is_still_refused(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[server]\nmanagement_token = "t0ken-0123456789"\n')
    config.chmod(0o600)
    result = run(["--host", "0.0.0.0", "--config", str(config)], tmp_path)
    assert result.returncode == 2
    assert "api_keys" in result.stderr


def test_a_broken_config_names_the_file_and_line(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[server]\nport = \n")
    result = run(["--config", str(config)], tmp_path)
    assert result.returncode == 2
    assert str(config) in result.stderr and "line 2" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_port_another_omniroute_holds_is_refused_with_what_holds_it(
    tmp_path: Path, proxy: Instance
) -> None:
    assert proxy.server is not None
    port = proxy.server.port
    result = run(["--config", str(proxy.config_path), "--port", str(port)], tmp_path)
    assert result.returncode == 2
    # Its engine runs on a FakeClock that has not moved: up 0 s.
    assert result.stderr == (
        f"omniroute: cannot listen on 127.0.0.1:{port}: another omniroute {__version__}, up 0 s,"
        f" is serving on 127.0.0.1:{port} (stop it, or choose another --port)\n"
    )


def test_a_port_something_else_holds_is_refused_with_the_plain_reason(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[providers.ollama]\n\n[[providers.ollama.connections]]\nid = "o-1"\n')
    with socket.socket() as blocker:  # listens, never answers: the probe gives up after its timeout
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        result = run(["--config", str(config), "--port", str(port)], tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        f"omniroute: cannot listen on 127.0.0.1:{port}: Address already in use"
        " (is another instance running? choose another --port)\n"
    )
