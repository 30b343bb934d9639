"""`omniroute serve` stops the same way on SIGTERM (systemd), SIGINT (Ctrl+C) and SIGHUP (its terminal
went away): in-flight requests get the grace period, the database is closed, exit 0. A second
signal exits at once. Real processes, real signals."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from proxy.serve import SHUTDOWN_GRACE_S
from tests.fakes import FakeUpstream
from tests.fakes.upstream import Reply
from tests.processes import (
    STARTUP_S,
    InFlight,
    Terminal,
    exit_code,
    free_port,
    integrity,
    port_is_free,
    port_refuses,
    serving,
    start_headless,
    wait_for,
)
from tests.two_providers import config_text

STOP_S = 10.0
SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]


class Serve:
    """`omniroute serve` on a tmp config (provider alpha at `upstream_url`) and state, on its own port."""

    def __init__(self, tmp_path: Path, upstream_url: str | None = None) -> None:
        refused = FakeUpstream.refused_url()
        config = tmp_path / "config.toml"
        config.write_text(config_text(upstream_url or refused, refused, None))
        config.chmod(0o600)
        self.port = free_port()
        self.state = tmp_path / "state.db"
        self.args = ["serve", "--config", str(config), "--state", str(self.state), "--port", str(self.port)]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> subprocess.Popen[bytes]:
        proc = self.proc = start_headless(self.args)
        wait_for(lambda: serving(self.port) or proc.poll() is not None, STARTUP_S, "the proxy serving")
        assert proc.poll() is None, stderr_of(proc)
        return proc

    def close(self) -> None:
        """Test teardown: no process left behind, whatever happened."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            stderr_of(self.proc)

    def assert_closed_cleanly(self) -> None:
        assert port_is_free(self.port)
        assert integrity(self.state) == "ok"
        # The last connection to close checkpoints the WAL and deletes it: the store was closed.
        assert not self.state.with_name("state.db-wal").exists()


def stderr_of(proc: subprocess.Popen[bytes]) -> str:
    """All it wrote to stderr (it has exited, or is about to be killed); closes the pipe."""
    return proc.communicate(timeout=STOP_S)[1].decode()


@pytest.fixture
def serves(tmp_path: Path) -> Iterator[Callable[..., Serve]]:
    """`serves(upstream_url=None)`: an instance, not started yet; stopped (killed) at teardown if still running."""
    made: list[Serve] = []

    def make(upstream_url: str | None = None) -> Serve:
        made.append(Serve(tmp_path, upstream_url))
        return made[-1]

    yield make
    for instance in made:
        instance.close()


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_serve_stops_cleanly_on(serves: Callable[..., Serve], sig: signal.Signals) -> None:
    instance = serves()
    proc = instance.start()
    proc.send_signal(sig)
    assert exit_code(proc, STOP_S) == 0
    instance.assert_closed_cleanly()
    stderr = stderr_of(proc)
    assert f"{sig.name}: stopping" in stderr
    assert "Traceback" not in stderr


def test_serve_stops_when_its_terminal_closes(serves: Callable[..., Serve]) -> None:
    """In the foreground of a terminal that goes away: SIGHUP, and a stderr that fails every write."""
    instance = serves()
    with Terminal(instance.args) as term:
        wait_for(lambda: serving(instance.port) or term.proc.poll() is not None, STARTUP_S, "serving")
        assert term.proc.poll() is None, bytes(term.screen)
        term.hang_up()
        assert exit_code(term.proc, STOP_S) == 0
    instance.assert_closed_cleanly()


def test_in_flight_requests_get_the_grace_period(
    serves: Callable[..., Serve], upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = upstream
    fake.default(Reply("slow_headers", delay_ms=1000))
    instance = serves(url)
    proc = instance.start()
    request = InFlight(instance.port)
    wait_for(lambda: fake.in_flight == 1, STOP_S, "the request reaching the upstream")
    proc.send_signal(signal.SIGTERM)
    assert request.result().status_code == 200
    assert exit_code(proc, STOP_S) == 0
    instance.assert_closed_cleanly()


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_second_signal_while_stopping_exits_at_once(
    serves: Callable[..., Serve], upstream: tuple[FakeUpstream, str], second: signal.Signals
) -> None:
    fake, url = upstream
    fake.default(Reply("hang"))  # holds the stop for its whole grace period
    instance = serves(url)
    proc = instance.start()
    InFlight(instance.port)
    wait_for(lambda: fake.in_flight == 1, STOP_S, "the request reaching the upstream")
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: port_refuses(instance.port), STOP_S, "the stop beginning (the port closed)")
    sent = time.monotonic()
    proc.send_signal(second)
    assert exit_code(proc, STOP_S) == 128 + second
    assert time.monotonic() - sent < SHUTDOWN_GRACE_S  # did not wait for the grace period
    assert integrity(instance.state) == "ok"  # WAL: consistent without a clean close
    assert port_is_free(instance.port)
    assert f"a second {second.name}: exiting at once" in stderr_of(proc)
