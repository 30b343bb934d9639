"""`omniroute serve` as a real process on a state file, for the startup and state-lock tests:
started on a free port, waited for (its health answers) under a deadline, stopped at the end."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests import processes
from tests.fakes import FakeUpstream
from tests.processes import environment, free_port
from tests.two_providers import config_text

__all__ = ["OMNIROUTE", "Serving", "environment", "free_port", "proxy_config", "serving"]

OMNIROUTE = [sys.executable, "-c", processes.OMNIROUTE]
"""`omniroute`, from this checkout, with this Python."""


def proxy_config(folder: Path, port: int) -> Path:
    """`folder/config.toml` serving the two test providers on `port` (their upstreams refuse
    connections: nothing here sends them traffic)."""
    refused = FakeUpstream.refused_url()
    config = folder / "config.toml"
    config.write_text(f"[server]\nport = {port}\n" + config_text(refused, refused, None))
    config.chmod(0o600)
    return config


@dataclass
class Serving:
    """An `omniroute serve` process that answers on `port`; its stderr goes to `log`."""

    proc: subprocess.Popen[str]
    port: int
    config: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def wait_until_serving(proc: subprocess.Popen[str], port: int, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited {proc.returncode}: {log.read_text()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/monitoring/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"serve did not answer within {timeout} s: {log.read_text()}"
        time.sleep(0.05)  # polling a condition, under the deadline above


@contextmanager
def serving(tmp_path: Path, state: Path, name: str = "first") -> Iterator[Serving]:
    """`omniroute serve --state STATE --port P` with a config that names another port (nothing
    listens there): only the state file's lock can tell a client where this instance is."""
    folder = tmp_path / name
    folder.mkdir()
    config = proxy_config(folder, free_port())
    port = free_port()
    log = folder / "serve.log"
    command = [*OMNIROUTE, "serve", "--config", str(config), "--state", str(state), "--port", str(port)]
    with open(log, "w") as stderr:
        proc = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=stderr, text=True, env=environment()
        )
    try:
        wait_until_serving(proc, port, log)
        yield Serving(proc, port, config, log)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
