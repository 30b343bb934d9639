"""A fleet under test: real `omniroute serve` replicas sharing a real Redis, a fake upstream.

The machine's Redis (127.0.0.1:6379, also on CI) serves the tests that need a healthy Redis;
each test has its own `key_prefix`, so tests never see each other's keys, and deletes them after.
Tests that stop, restart or cut Redis off start their own `redis-server` on a free port, or put a
`TcpGate` they control between the replicas and it. Without a reachable Redis these tests fail,
saying how to start one: they never skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.fakes.server import LiveServer
from tests.fakes.upstream import FakeUpstream
from tests.instances import OMNIROUTE, environment
from tests.processes import free_port

REDIS_URL = "redis://127.0.0.1:6379/0"
TOKEN = "fleet-t0ken-0123456789"
KEY_A = "sk-fleet-alpha-aaaaaaaaaaaa"
KEY_B = "sk-fleet-alpha-bbbbbbbbbbbb"
PROPAGATION_S = 0.1
"""docs/fleet.md#what-is-shared: a transition or a settings change on one replica is live on the others within 100 ms."""


def require_redis(url: str = REDIS_URL) -> redis.Redis:
    client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(
            f"these tests need a Redis server at {url} and none answers ({exc}). Start one with "
            "`redis-server --port 6379 --save '' --daemonize yes` (Debian/Ubuntu: "
            "`sudo apt-get install redis-server`), then run the tests again."
        )
    return client


def redis_server_binary() -> str:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
    )
    if found is None:
        pytest.fail(
            "the chaos tests start their own Redis: install redis-server (`sudo apt-get install redis-server`)"
        )
    return found


def wait_for(condition: Callable[[], Any], timeout: float, what: str, step: float = 0.005) -> Any:
    """Poll `condition` until it is truthy (returned) or the deadline passes (AssertionError)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(step)


@pytest.fixture
def redis_client() -> redis.Redis:
    return require_redis()


@pytest.fixture
def prefix(redis_client: redis.Redis) -> Iterator[str]:
    name = f"omniroute-test:{uuid.uuid4().hex[:10]}:"
    yield name
    keys = list(redis_client.scan_iter(match=f"{name}*", count=1000))
    if keys:
        redis_client.delete(*keys)


@pytest.fixture
def upstream() -> Iterator[tuple[FakeUpstream, str]]:
    fake = FakeUpstream("fleet-upstream", models=("m1", "m2"))
    server = LiveServer(fake.app).start()
    try:
        yield fake, server.url + "/v1"
    finally:
        server.stop()


def fleet_config(
    folder: Path,
    port: int,
    upstream_url: str,
    *,
    backend: str = REDIS_URL,
    prefix: str,
    provider_class: str = "local",
    disable_cooling: bool = False,
    first_byte_timeout_ms: int = 10_000,
    extra: str = "",
    provider_extra: str = "",
) -> Path:
    cooling = "disable_cooling = true\n" if disable_cooling else ""
    text = f"""[server]
port = {port}
management_token = "{TOKEN}"
first_byte_timeout_ms = {first_byte_timeout_ms}

[state]
backend = "{backend}"
key_prefix = "{prefix}"

[providers.alpha]
class = "{provider_class}"
base_url = "{upstream_url}"
per_model_quota = false
{provider_extra}
[[providers.alpha.connections]]
id = "alpha-1"
api_key = "{KEY_A}"
priority = 1
{cooling}
[[providers.alpha.connections]]
id = "alpha-2"
api_key = "{KEY_B}"
priority = 2
{cooling}{extra}"""
    path = folder / f"config-{port}.toml"
    path.write_text(text)
    path.chmod(0o600)
    return path


@dataclass
class Replica:
    """One `omniroute serve` process of the fleet."""

    name: str
    port: int
    config: Path
    log: Path
    env: dict[str, str]
    proc: subprocess.Popen[str] | None = None
    client: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=15.0
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> Replica:
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(
                [*OMNIROUTE, "serve", "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                env=self.env,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"replica {self.name} exited {self.proc.returncode}: {self.log.read_text()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if self.client.get("/api/monitoring/health", timeout=1).status_code == 200:
                    return self
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"replica {self.name} did not serve within {timeout} s: {self.log.read_text()}"
                )
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        self.client.close()

    # -- what tests ask ----------------------------------------------------------------------------

    def logged(self, text: str, timeout: float = 2.0) -> None:
        """Wait until `text` is in the replica's log: a line is written by its log thread, after
        the request that logged it may have been answered."""
        wait_for(lambda: text in self.log.read_text(), timeout, f"{text!r} in replica {self.name}'s log")

    def chat(self, model: str = "alpha/m1", **headers: str) -> httpx.Response:
        return self.client.post(
            "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
            headers=headers,
        )

    def health(self) -> dict[str, Any]:
        return self.client.get("/api/monitoring/health").json()  # type: ignore[no-any-return]

    def breaker(self, provider: str = "alpha") -> dict[str, Any]:
        for b in self.health()["providerBreakers"]:
            if b["provider"] == provider:
                return b  # type: ignore[no-any-return]
        raise KeyError(provider)

    def connection(self, connection_id: str) -> dict[str, Any]:
        for c in self.client.get("/api/resilience/connections").json()["connections"]:
            if c["id"] == connection_id:
                return c  # type: ignore[no-any-return]
        raise KeyError(connection_id)

    def events(self, layer: str | None = None, key: str | None = None) -> list[dict[str, Any]]:
        events = self.client.get("/api/events").json()["events"]
        return [
            e for e in events if (layer is None or e["layer"] == layer) and (key is None or e["key"] == key)
        ]

    def patch(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return self.client.patch(path, json=body)


def holds(document: dict[str, Any], patch: dict[str, Any]) -> bool:
    """Whether a settings document has every value of `patch` (nested)."""
    return all(
        holds(document.get(k, {}), v) if isinstance(v, dict) else document.get(k) == v
        for k, v in patch.items()
    )


class Fleet:
    """N replicas on loopback ports with the same config (but their own port)."""

    def __init__(self, folder: Path, upstream_url: str, prefix: str, **config: Any) -> None:
        self.folder = folder
        self.upstream_url = upstream_url
        self.prefix = prefix
        self.config = config
        self.replicas: list[Replica] = []
        self._turn = 0

    def add(self, name: str | None = None, **overrides: Any) -> Replica:
        port = free_port()
        options = {**self.config, **overrides}
        config = fleet_config(self.folder, port, self.upstream_url, prefix=self.prefix, **options)
        name = name or "abcdefgh"[len(self.replicas)]
        env = environment(OMNIROUTE_REPLICA_ID=f"replica-{name}", OMNIROUTE_LOG_LEVEL="info")
        replica = Replica(name, port, config, self.folder / f"replica-{name}.log", env)
        self.replicas.append(replica)
        return replica.start()

    def configure(self, patch: dict[str, Any], path: str = "/api/resilience") -> None:
        """PATCH on the first replica, then wait until every other one serves it.

        A setting is live everywhere within ~100 ms, not at once: traffic sent to another replica
        straight after the PATCH can still meet the old value (a request that then waits out a
        cooldown the test meant to skip times out)."""
        response = self.replicas[0].patch(path, patch)
        assert response.status_code == 200, response.text
        for replica in self.replicas[1:]:
            wait_for(
                lambda r=replica: holds(r.client.get(path).json(), patch),
                2.0,
                f"settings on {replica.name}",
            )

    def next(self) -> Replica:
        """Round-robin, as a load balancer spreads requests."""
        replica = self.replicas[self._turn % len(self.replicas)]
        self._turn += 1
        return replica

    def stop(self) -> None:
        for replica in self.replicas:
            replica.stop()

    def __getitem__(self, index: int) -> Replica:
        return self.replicas[index]


@pytest.fixture
def gates() -> Iterator[Callable[[int], TcpGate]]:
    made: list[TcpGate] = []

    def make(target_port: int = 6379) -> TcpGate:
        gate = TcpGate(target_port)
        made.append(gate)
        return gate

    yield make
    for gate in made:
        gate.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def make_fleet(
    tmp_path: Path, prefix: str, upstream: tuple[FakeUpstream, str]
) -> Iterator[Callable[..., Fleet]]:
    fleets: list[Fleet] = []

    def make(count: int = 3, **config: Any) -> Fleet:
        fleet = Fleet(tmp_path, upstream[1], prefix, **config)
        fleets.append(fleet)
        for _ in range(count):
            fleet.add()
        return fleet

    yield make
    for fleet in fleets:
        fleet.stop()


# -- a Redis of the test's own, and a gate in front of it --------------------------------------------


class OwnRedis:
    """A `redis-server` on a free port that the test may stop and start again (no persistence:
    a restart comes back empty, the hardest case for "nothing acknowledged is lost")."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.folder = folder
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> OwnRedis:
        self.proc = subprocess.Popen(
            [
                redis_server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.folder),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_timeout=1)
        wait_for(lambda: _pings(client), 10, "own redis-server answers")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


class TcpGate:
    """A TCP proxy the test controls, between replicas and Redis: a partition as a replica sees it.

    `cut()` closes every connection and refuses new ones (Redis's host is gone: resets);
    `cut(drop=True)` keeps the connections open but forwards nothing either way (packets dropped:
    the replica only learns from its timeouts). `heal()` lets traffic through again."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.open = True
        self.dropping = False
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self.dropping:
                with self._lock:
                    self._conns.append(client)  # held open, never answered
                continue
            if not self.open:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=2)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data or not self.open:
                    break
                if self.dropping:
                    continue
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def cut(self, *, drop: bool = False) -> None:
        if drop:
            self.dropping = True
            return
        self.open = False
        self._close_all()

    def heal(self) -> None:
        if self.dropping:
            self.dropping = False
            self._close_all()  # what was held open carried nothing: the replica reconnects
        self.open = True

    def _close_all(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self._stopped = True
        self.open = False
        self._close_all()
        self._server.close()


def fleet_events(replica: Replica, **match: str) -> list[dict[str, Any]]:
    return [e for e in replica.events() if all(e.get(k) == v for k, v in match.items())]


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
