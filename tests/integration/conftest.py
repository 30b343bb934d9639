"""A real proxy instance per test: config file, SQLite state, uvicorn on an ephemeral port, an httpx client.

The engine runs on a `FakeClock`, so every remaining time the API reports is an exact number. Tests
put the engine into a state by driving its layers directly (the app reads the same engine
in-process), and only between requests: the server thread is idle then, so nothing races.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import ASGIApp

from proxy.app import create_app
from proxy.config import load_config
from proxy.engine import Engine
from proxy.resilience.clock import FakeClock
from proxy.runtime import Runtime
from tests.fakes import FakeUpstream, LiveServer, serve
from tests.fakes.scripted import ScriptedUpstream
from tests.two_providers import config_text

# test_proxy.py's harness (fake upstreams and proxies started per test, stopped side by side) serves
# every module of this folder: its fixtures are offered here by name.
from tests.integration.test_proxy import launch, started, upstreams  # noqa: F401  isort: skip


@dataclass
class Instance:
    """One running proxy: its runtime (same process) and a client for its HTTP API."""

    config_path: Path
    state_path: Path
    token: str | None
    clock: FakeClock = field(default_factory=FakeClock)
    runtime: Runtime | None = None
    server: LiveServer | None = None
    client: httpx.Client | None = None

    def start(self) -> Instance:
        config = load_config(self.config_path, {}, explicit=True)
        self.runtime = Runtime.open(config, self.state_path, clock=self.clock, env={})
        self.server = LiveServer(create_app(self.runtime)).start()
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.client = httpx.Client(base_url=self.server.url, headers=headers, timeout=10.0)
        return self

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.server is not None:
            server, self.server = self.server, None
            server.stop()  # the lifespan stops the runtime: final persist, store closed

    def restart(self) -> Instance:
        """Stop everything and open the same config and state database again."""
        self.stop()
        return self.start()

    @property
    def engine(self) -> Engine:
        assert self.runtime is not None
        return self.runtime.engine

    @property
    def last_seq(self) -> int:
        """The sequence number of the newest event so far (`GET /api/events?after=` takes it)."""
        assert self.runtime is not None
        return self.runtime.bus.last_seq

    @property
    def http(self) -> httpx.Client:
        assert self.client is not None
        return self.client

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.http.get(path, **kwargs)

    def send(self, method: str, path: str, body: object = None, **kwargs: Any) -> httpx.Response:
        """`body` is sent as JSON; bytes are sent as they are (malformed input tests), labelled JSON
        like any client's body unless `headers` say otherwise (the Guard refuses other types)."""
        if isinstance(body, bytes):
            headers = {"content-type": "application/json", **kwargs.pop("headers", {})}
            return self.http.request(method, path, content=body, headers=headers, **kwargs)
        if body is None:
            return self.http.request(method, path, **kwargs)
        return self.http.request(method, path, json=body, **kwargs)


@pytest.fixture
def upstream() -> Iterator[tuple[FakeUpstream, str]]:
    """A fake upstream on a live server, and the base_url to configure for it."""
    fake = FakeUpstream("alpha-upstream")
    with serve(fake.app) as live:
        yield fake, live.url + "/v1"


@pytest.fixture
def make_instance(tmp_path: Path) -> Iterator[Callable[..., Instance]]:
    """`make_instance(token=None, alpha_url=None, state=None)` starts a proxy on a fresh config and state.

    `alpha_url` is where provider alpha sends traffic (default: a refused port, for tests that send none);
    `state` is the state database (default: a new one in tmp_path).
    """
    instances: list[Instance] = []

    def make(token: str | None = None, alpha_url: str | None = None, state: Path | None = None) -> Instance:
        config_path = tmp_path / f"config-{len(instances)}.toml"
        refused = FakeUpstream.refused_url()
        config_path.write_text(config_text(alpha_url or refused, refused, token))
        config_path.chmod(0o600)
        instance = Instance(config_path, state or tmp_path / f"state-{len(instances)}.db", token)
        instances.append(instance)
        return instance.start()

    yield make
    for instance in instances:
        instance.stop()


@pytest.fixture
def proxy(make_instance: Callable[..., Instance]) -> Instance:
    """A proxy without a management token (the API answers loopback clients) and with no upstream."""
    return make_instance()


@pytest.fixture
def guarded_app(tmp_path: Path) -> Iterator[Callable[[str | None], ASGIApp]]:
    """`guarded_app(token)`: the whole ASGI app (Guard included) of a memory-only runtime, not served, for
    calling it directly with a hand-made scope (e.g. a client address no real socket here can have)."""
    runtimes: list[Runtime] = []

    def make(token: str | None) -> ASGIApp:
        path = tmp_path / f"unit-{len(runtimes)}.toml"
        path.write_text(config_text(FakeUpstream.refused_url(), FakeUpstream.refused_url(), token))
        path.chmod(0o600)
        runtime = Runtime.open(load_config(path, {}, explicit=True), None, clock=FakeClock(), env={})
        runtimes.append(runtime)
        return create_app(runtime, manage_lifecycle=False)

    yield make
    for runtime in runtimes:
        runtime.store.close()


@pytest.fixture
def scripted() -> Iterator[Callable[[], ScriptedUpstream]]:
    """`scripted()` starts a ScriptedUpstream on a real loopback server; its `.url` is the base URL."""
    servers: list[LiveServer] = []

    def make() -> ScriptedUpstream:
        app = ScriptedUpstream()
        server = LiveServer(app).start()
        servers.append(server)
        app.url = server.url + "/v1"
        return app

    yield make
    for server in servers:
        server.stop()
