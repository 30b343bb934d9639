"""`omniroute serve` stops the same way on SIGTERM (systemd), SIGINT (Ctrl+C) and SIGHUP (its terminal
went away): in-flight requests get the grace period, the database is closed, exit 0. A second
signal exits at once. Real processes, real signals."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
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

    def start(self, preexec_fn: Callable[[], object] | None = None) -> subprocess.Popen[bytes]:
        proc = self.proc = start_headless(self.args, preexec_fn=preexec_fn)
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


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_stop_signal_ignored_when_it_started_stays_ignored(
    serves: Callable[..., Serve], sig: signal.Signals
) -> None:
    """`nohup omniroute serve &` starts it with SIGHUP ignored (and a shell's background job has
    SIGINT ignored): by POSIX convention a program keeps that, so closing the terminal leaves the
    proxy serving. It stopped ("SIGHUP: stopping"; found by a lifecycle trial). SIGTERM still stops it."""
    instance = serves()
    proc = instance.start(preexec_fn=lambda: signal.signal(sig, signal.SIG_IGN))
    proc.send_signal(sig)
    clock = time.monotonic() + 1.0
    while time.monotonic() < clock:  # a stop closes the port at once
        assert proc.poll() is None and serving(instance.port), f"it stopped on {sig.name}"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert exit_code(proc, STOP_S) == 0
    instance.assert_closed_cleanly()


def stopped_with_a_request_in_flight(
    serves: Callable[..., Serve], upstream: tuple[FakeUpstream, str], answer_ms: float
) -> tuple[Serve, subprocess.Popen[bytes], InFlight]:
    """An instance sent SIGTERM while a request waits `answer_ms` for its upstream's answer."""
    fake, url = upstream
    fake.default(Reply("slow_headers", delay_ms=answer_ms))
    instance = serves(url)
    proc = instance.start()
    request = InFlight(instance.port)
    wait_for(lambda: fake.in_flight == 1, STOP_S, "the request reaching the upstream")
    proc.send_signal(signal.SIGTERM)
    return instance, proc, request


def test_in_flight_requests_get_the_grace_period(
    serves: Callable[..., Serve], upstream: tuple[FakeUpstream, str]
) -> None:
    instance, proc, request = stopped_with_a_request_in_flight(serves, upstream, 1000)
    assert request.result().status_code == 200
    assert exit_code(proc, STOP_S) == 0
    instance.assert_closed_cleanly()


def test_a_restart_during_the_stop_waits_for_it_instead_of_being_refused(
    serves: Callable[..., Serve], upstream: tuple[FakeUpstream, str]
) -> None:
    """`kill -TERM`, then at once `omniroute serve` on the same state file (a restart by hand, a
    script's): while the first gave its request its grace, the second was refused with exit 2,
    "in use by omniroute (pid N, serving on ...)" (found by a lifecycle trial). It waits."""
    first, proc, request = stopped_with_a_request_in_flight(serves, upstream, 1500)
    wait_for(lambda: port_refuses(first.port), STOP_S, "the first to begin its stop")
    again = start_headless(first.args)
    try:
        assert request.result().status_code == 200
        assert exit_code(proc, STOP_S) == 0
        wait_for(lambda: serving(first.port) or again.poll() is not None, STARTUP_S, "the restart serving")
        assert again.poll() is None, stderr_of(again)
    finally:
        again.send_signal(signal.SIGTERM)
        assert exit_code(again, STOP_S) == 0
    said = stderr_of(again)
    assert "in use by omniroute" not in said
    assert "waiting for the instance that is stopping on it to finish (pid" in said


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


# -- what a request still open when the server stops is told ---------------------------------------------


def _in_state(port: int, state: str) -> bool:
    """Whether a request of the instance is in `state` (`waiting`: out a cooldown; `slot`: for a
    concurrency slot), as its trail says."""
    try:
        answer = httpx.get(f"http://127.0.0.1:{port}/api/requests", timeout=2)
    except httpx.HTTPError:
        return False
    return any(r["state"] == state for r in answer.json()["requests"])


def test_a_request_waiting_out_a_cooldown_is_answered_at_once_when_the_server_stops(
    serves: Callable[..., Serve], upstream: tuple[FakeUpstream, str]
) -> None:
    """The wait could last a minute and a half: stopping answers it now, with a 503 that says why,
    instead of holding the stop for the grace period and then a bare 500 and a traceback."""
    fake, url = upstream
    fake.default(Reply("error", status=429, headers={"Retry-After": "30"}))  # both keys cool for 30 s
    instance = serves(url)
    proc = instance.start()
    request = InFlight(instance.port)
    wait_for(lambda: _in_state(instance.port, "waiting"), STOP_S, "the request waiting out the cooldown")
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    answer = request.result()
    assert time.monotonic() - sent < SHUTDOWN_GRACE_S  # not held for the grace period
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "server_stopping"
    assert answer.headers["retry-after"] == "1"
    assert exit_code(proc, STOP_S) == 0
    stderr = stderr_of(proc)
    assert "Traceback" not in stderr and "Exception in ASGI application" not in stderr, stderr
    instance.assert_closed_cleanly()


def test_a_request_waiting_for_a_concurrency_slot_is_answered_at_once_when_the_server_stops(
    serves: Callable[..., Serve], upstream: tuple[FakeUpstream, str]
) -> None:
    """Both keys hold one request at a time and both are upstream (hanging): a third waits for a
    slot (up to 30 s, then fail-open). The stop answers it now; the two upstream get the grace period."""
    fake, url = upstream
    fake.default(Reply("hang"))
    instance = serves(url)
    config = Path(instance.args[2])
    config.write_text(config.read_text().replace("priority = ", "max_concurrent = 1\npriority = "))
    proc = instance.start()
    upstream_ones = [InFlight(instance.port), InFlight(instance.port)]
    wait_for(lambda: fake.in_flight == 2, STOP_S, "two requests reaching the upstream")
    waiting = InFlight(instance.port)
    wait_for(lambda: _in_state(instance.port, "slot"), STOP_S, "the third waiting for a slot")
    proc.send_signal(signal.SIGTERM)
    waiting.thread.join(SHUTDOWN_GRACE_S - 0.5)
    assert not waiting.thread.is_alive(), "the waiting request was held for the grace period"
    assert waiting.result().json()["error"]["code"] == "server_stopping"
    assert [r.result().status_code for r in upstream_ones] == [503, 503]  # after the grace period
    assert len(fake.requests) == 2  # the waiting one was never sent
    assert exit_code(proc, STOP_S) == 0
    stderr = stderr_of(proc)
    assert "Traceback" not in stderr and "Exception in ASGI application" not in stderr, stderr


def test_a_request_still_upstream_when_the_grace_period_ends_is_answered_503(
    serves: Callable[..., Serve], upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = upstream
    fake.default(Reply("hang"))
    instance = serves(url)
    proc = instance.start()
    request = InFlight(instance.port)
    wait_for(lambda: fake.in_flight == 1, STOP_S, "the request reaching the upstream")
    proc.send_signal(signal.SIGTERM)
    answer = request.result()
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "server_stopping"
    assert exit_code(proc, STOP_S) == 0
    stderr = stderr_of(proc)
    assert "Traceback" not in stderr and "Exception in ASGI application" not in stderr, stderr
    instance.assert_closed_cleanly()


@pytest.mark.parametrize("api", ["chat", "messages"])
def test_a_stream_still_running_when_the_grace_period_ends_ends_with_its_apis_error_event(
    serves: Callable[..., Serve], upstream: tuple[FakeUpstream, str], api: str
) -> None:
    fake, url = upstream
    fake.default(Reply("stream", chunks=1000, chunk_text="ok", delay_ms=200))  # 200 s of tokens
    instance = serves(url)
    config = Path(instance.args[2])
    config.write_text(
        config.read_text().replace('class = "local"\n', 'class = "local"\napis = ["chat", "messages"]\n', 1)
    )
    proc = instance.start()
    body = {
        "model": "alpha/m1",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }
    path = "/v1/chat/completions" if api == "chat" else "/v1/messages"
    with httpx.stream("POST", f"http://127.0.0.1:{instance.port}{path}", json=body, timeout=10) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))  # the stream is flowing
        proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line]
    if api == "chat":
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2].removeprefix("data: "))["error"]["code"] == "server_stopping"
    else:  # Anthropic's error event, which its SDK raises on
        assert rest[-2] == "event: error"
        assert "server_stopping" in json.loads(rest[-1].removeprefix("data: "))["error"]["message"]
    assert exit_code(proc, STOP_S) == 0
    stderr = stderr_of(proc)
    assert "Traceback" not in stderr and "Exception in ASGI application" not in stderr, stderr
    instance.assert_closed_cleanly()


def test_a_count_tokens_still_upstream_when_the_grace_period_ends_is_answered_503_in_anthropics_shape(
    serves: Callable[..., Serve], upstream: tuple[FakeUpstream, str]
) -> None:
    """As for chat above, on the single-attempt route of the Messages API (proxy/passthrough.py): the
    cut request gets the proxy's own 503 `server_stopping` in Anthropic's shape, and nothing is
    logged as an unhandled exception."""
    fake, url = upstream
    fake.default(Reply("hang"))
    instance = serves(url)
    config = Path(instance.args[2])
    config.write_text(
        config.read_text().replace('class = "local"\n', 'class = "local"\napis = ["chat", "messages"]\n', 1)
    )
    proc = instance.start()
    answer: list[httpx.Response] = []
    body = {"model": "alpha/m1", "messages": [{"role": "user", "content": "hi"}]}

    def send() -> None:
        answer.append(
            httpx.post(f"http://127.0.0.1:{instance.port}/v1/messages/count_tokens", json=body, timeout=10)
        )

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    wait_for(lambda: fake.in_flight == 1, STOP_S, "the count reaching the upstream")
    proc.send_signal(signal.SIGTERM)
    thread.join(STOP_S)
    assert exit_code(proc, STOP_S) == 0
    stderr = stderr_of(proc)
    assert answer, "no answer"
    assert answer[0].status_code == 503, answer[0].text
    assert answer[0].json()["error"]["type"] == "overloaded_error"
    assert "server is stopping" in answer[0].json()["error"]["message"]
    assert "Traceback" not in stderr and "Exception in ASGI application" not in stderr, stderr
    instance.assert_closed_cleanly()


def test_an_operators_action_once_answered_survives_a_kill_right_after(serves: Callable[..., Serve]) -> None:
    """An operator who disables a leaked key is answered 200; a crash right after brought the key
    back (transitions reached the disk within half a second, after the answer). The answer now
    waits for the disk, as a settings change's does (found by a security trial)."""
    instance = serves()
    url = f"http://127.0.0.1:{instance.port}"
    proc = instance.start()
    for enabled in (False, True):
        answer = httpx.put(f"{url}/api/providers/alpha-1", json={"isActive": enabled})
        assert answer.status_code == 200, answer.text
        proc.kill()  # SIGKILL, at once
        stderr_of(proc)
        proc = instance.start()
        after = httpx.get(f"{url}/api/resilience/connections").json()["connections"]
        assert [c["enabled"] for c in after if c["id"] == "alpha-1"] == [enabled]
