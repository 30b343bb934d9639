"""A real instance for the CLI to talk to, and a way to run `omniroute` exactly as a shell would.

The instance is the real app (`create_app(Runtime.open(...))`, lifespan on) on a uvicorn
`LiveServer` on an ephemeral port, with a FakeClock so every remaining time is exact. Tests put
the engine into states by driving its layers directly, between commands (the server thread is
idle then). `run(...)` invokes the typer app through CliRunner, which goes through the same
`Edge.main` as the installed script, so exit codes and stderr are what a shell sees.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from omniroute_tui.cli import app
from proxy.app import create_app
from proxy.config import load_config
from proxy.engine import Engine
from proxy.resilience.clock import FakeClock
from proxy.runtime import Runtime
from tests.fakes import FakeUpstream, LiveServer, serve
from tests.two_providers import config_text

TOKEN = "cli-mgmt-token-0123456789"


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        import json

        assert self.code == 0, self.stderr
        return json.loads(self.stdout)


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    """`omniroute ARGS...` in-process; never raises (an escaped exception fails the test here)."""
    # `serve` (and `tui`) configure the process's logging on the streams they are given: in-process
    # those are CliRunner's, closed once it returns. Put the test process's logging back after.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        result = CliRunner().invoke(app, list(args), env=env)
    finally:
        root.handlers, root.level = handlers, level
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"omniroute {' '.join(args)} escaped the edge") from result.exception
    return Result(result.exit_code, result.stdout, result.stderr)


@dataclass
class Instance:
    """One running proxy: the engine in-process, its URL, and an httpx client that reads the API directly."""

    runtime: Runtime
    server: LiveServer
    clock: FakeClock
    token: str | None
    cli_config: Path
    """A config whose [server] names this instance's port (and token): for the no-`--url` path."""

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def engine(self) -> Engine:
        return self.runtime.engine

    def api(self, path: str) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        response = httpx.get(self.url + path, headers=headers, timeout=10)
        assert response.status_code == 200, response.text
        return response.json()

    def cli(self, *args: str) -> Result:
        """`omniroute ARGS... --url URL [--token TOKEN]`."""
        extra = ["--url", self.url] + (["--token", self.token] if self.token else [])
        return run(*args, *extra)

    # -- states (call between commands only) ------------------------------------------------

    def open_breaker(self, provider: str) -> None:
        breaker = self.engine.providers[provider].breaker
        for _ in range(breaker.policy.failure_threshold):
            breaker.record_failure(self.clock.now())

    def cool(self, connection_id: str) -> None:
        conn = self.engine.connections[connection_id]
        cls = self.engine.providers[conn.spec.provider].spec.provider_class
        conn.health.record_failure(
            self.clock.now(),
            self.engine.settings.cooldown_policy(cls),
            error="503 server_error",
            error_type="server_error",
            code=503,
        )

    def lock(self, connection_id: str, model: str) -> None:
        provider = self.engine.connections[connection_id].spec.provider
        self.engine.lockouts.record_failure(
            provider,
            connection_id,
            model,
            self.clock.now(),
            self.engine.settings.lockout(),
            status=404,
            reason="not_found",
        )


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No OMNIROUTE_* from the developer's shell, and platform dirs inside tmp_path."""
    for name in ("OMNIROUTE_URL", "OMNIROUTE_MANAGEMENT_TOKEN", "OMNIROUTE_CONFIG", "OMNIROUTE_STATE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def upstream() -> Iterator[str]:
    fake = FakeUpstream("alpha-upstream")
    with serve(fake.app) as live:
        yield live.url + "/v1"


@pytest.fixture
def make_instance(tmp_path: Path, upstream: str) -> Iterator[Callable[..., Instance]]:
    started: list[Instance] = []

    def make(token: str | None = None) -> Instance:
        n = len(started)
        text = config_text(upstream, FakeUpstream.refused_url(), token)
        config_path = tmp_path / f"config-{n}.toml"
        config_path.write_text(text)
        config_path.chmod(0o600)
        clock = FakeClock()
        runtime = Runtime.open(
            load_config(config_path, {}, explicit=True), tmp_path / f"state-{n}.db", clock=clock, env={}
        )
        server = LiveServer(create_app(runtime), lifespan="on").start()
        cli_config = tmp_path / f"cli-{n}.toml"
        token_line = f'management_token = "{token}"\n' if token else ""
        cli_config.write_text(
            f"[server]\nport = {server.port}\n{token_line}"
            + config_text(upstream, FakeUpstream.refused_url(), None)
        )
        cli_config.chmod(0o600)
        instance = Instance(runtime, server, clock, token, cli_config)
        started.append(instance)
        return instance

    yield make
    for instance in started:
        instance.server.stop()


@pytest.fixture
def proxy(make_instance: Callable[..., Instance]) -> Instance:
    """An instance without a management token (it answers loopback clients)."""
    return make_instance()


@pytest.fixture
def secured(make_instance: Callable[..., Instance]) -> Instance:
    """An instance that requires TOKEN."""
    return make_instance(TOKEN)
