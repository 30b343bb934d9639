"""`omniroute serve` refuses unsafe or broken setups at start, with one line and exit code 2.

Real processes on real files: each test runs `omniroute serve` (and `omniroute status`) as a shell
would, and waits for conditions under deadlines.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from proxy import __version__
from proxy.serve import MIN_OPEN_FILES
from proxy.store import SqliteStore
from tests.conditions import fill_up, small_disk, unwritable
from tests.instances import OMNIROUTE, environment, free_port, proxy_config, serving
from tests.integration.conftest import Instance
from tests.processes import serving as answers


def run(args: list[str], tmp_path: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMNIROUTE_STATE": str(tmp_path / "state.db")}
    env.pop("OMNIROUTE_MANAGEMENT_TOKEN", None)
    return subprocess.run(
        [*OMNIROUTE, "serve", *args], capture_output=True, text=True, timeout=timeout, env=env
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


# -- the state file (issue #21): every refusal is one line naming the file, exit 2 -----------------


def serve_once(tmp_path: Path, state: Path, port: int | None = None) -> subprocess.CompletedProcess[str]:
    """`omniroute serve` expected to refuse to start (a start that serves instead times out the test)."""
    config = proxy_config(tmp_path, port or free_port())
    return run(["--config", str(config), "--state", str(state)], tmp_path, timeout=20)


def test_a_state_file_that_cannot_be_written_is_refused_at_start(tmp_path: Path) -> None:
    """The issue's 0444 file run as another user: here the file is made unwritable for this very
    user (immutable as root), which is what SQLite meets either way."""
    state = tmp_path / "state.db"
    SqliteStore(state).close()
    with unwritable(state):
        result = serve_once(tmp_path, state)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"omniroute: {state}: cannot write the state database: ")
    assert f"{state} is not writable" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_a_full_disk_at_start_is_called_a_full_disk(tmp_path: Path) -> None:
    with small_disk(256) as disk:
        fill_up(disk)
        state = disk / "state.db"
        result = serve_once(tmp_path, state)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"omniroute: {state}: ")
    assert "the disk is full" in result.stderr
    assert "not a valid state database" not in result.stderr


def test_a_bad_stored_record_names_the_file_table_and_row(tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    store = SqliteStore(state)
    store.save_connections({"alpha-1": {"rate_limited_until": "soon"}})
    store.close()
    result = serve_once(tmp_path, state)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(
        f"omniroute: {state}: bad record in table connections, row 'alpha-1': rate_limited_until:"
    )
    assert "unexpected error" not in result.stderr


# -- one state file, one owner (issue #21) ---------------------------------------------------------


def test_a_second_instance_on_the_same_state_file_is_refused(tmp_path: Path) -> None:
    """Two instances on one file each kept their own engine and overwrote each other's settings."""
    state = tmp_path / "state.db"
    with serving(tmp_path, state) as first:
        second_port = free_port()
        result = run(
            ["--config", str(first.config), "--state", str(state), "--port", str(second_port)],
            tmp_path,
            timeout=30,
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr == (
            f"omniroute: {state} is in use by omniroute (pid {first.proc.pid}, serving on"
            f" 127.0.0.1:{first.port}); stop that instance first, or give this one another state file"
            f" (--state or OMNIROUTE_STATE); to watch it, attach the console: omniroute tui --url {first.url}\n"
        )
        assert httpx.get(first.url + "/api/monitoring/health", timeout=5).status_code == 200
        with socket.socket() as probe:  # the refused instance let go of its address too
            probe.bind(("127.0.0.1", second_port))


def test_a_symlink_to_a_held_state_file_is_the_same_state_file(tmp_path: Path) -> None:
    """A link to the file (or to its directory) named another lock file beside it: the second
    instance started and wrote its own settings into the first one's database."""
    state = tmp_path / "state.db"
    (tmp_path / "elsewhere").mkdir()
    linked = tmp_path / "elsewhere" / "linked.db"
    linked.symlink_to(state)
    (tmp_path / "dir-link").symlink_to(tmp_path, target_is_directory=True)
    with serving(tmp_path, state) as first:
        for other in (linked, tmp_path / "dir-link" / "state.db"):
            result = run(
                ["--config", str(first.config), "--state", str(other), "--port", str(free_port())],
                tmp_path,
                timeout=30,
            )
            assert result.returncode == 2, result.stderr
            assert f"is in use by omniroute (pid {first.proc.pid}" in result.stderr
        # and `status` finds the instance through the link (the config names a port nothing serves)
        command = [*OMNIROUTE, "status", "--json", "--config", str(first.config), "--state", str(linked)]
        status = subprocess.run(command, capture_output=True, text=True, timeout=30, env=environment())
        assert status.returncode == 0, status.stderr


def test_a_hard_link_to_a_held_state_file_is_the_same_state_file(tmp_path: Path) -> None:
    """A hard link is another name for the same file, with a lock file of its own beside it: the
    second instance started, with a write-ahead log of its own beside the same database."""
    state = tmp_path / "state.db"
    (tmp_path / "elsewhere").mkdir()
    hard = tmp_path / "elsewhere" / "hard.db"
    with serving(tmp_path, state) as first:
        os.link(state, hard)
        result = run(
            ["--config", str(first.config), "--state", str(hard), "--port", str(free_port())],
            tmp_path,
            timeout=30,
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr == (
            f"omniroute: {hard} is in use by another omniroute instance, under another name for the"
            " same file (a hard link); stop that instance first, or give this one another state file"
            " (--state or OMNIROUTE_STATE)\n"
        )
        assert not (tmp_path / "elsewhere" / "hard.db-wal").exists()  # nothing was opened in it
    # Once the first has stopped, the other name serves.
    with serving(tmp_path, hard, "second") as second:
        assert httpx.get(second.url + "/api/monitoring/health", timeout=5).status_code == 200


def test_a_lock_never_outlives_its_process(tmp_path: Path) -> None:
    """kill -9 leaves no stale lock: the kernel drops it with the process."""
    state = tmp_path / "state.db"
    with serving(tmp_path, state) as first:
        first.proc.kill()
        first.proc.wait(timeout=10)
    with serving(tmp_path, state, name="second") as second:
        assert httpx.get(second.url + "/api/monitoring/health", timeout=5).status_code == 200


def test_a_start_refused_for_its_port_creates_no_file(tmp_path: Path) -> None:
    """The address is bound before the state file is locked or opened."""
    state = tmp_path / "p.db"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = serve_once(tmp_path, state, port=taken.getsockname()[1])
    assert result.returncode == 2, result.stderr
    assert "cannot listen on" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]


def test_status_finds_the_instance_that_holds_the_state_file(tmp_path: Path) -> None:
    """Without --url, `omniroute status` asks the state file's lock where its instance serves;
    the config here names a port nothing listens on."""
    state = tmp_path / "state.db"
    with serving(tmp_path, state) as first:
        command = [*OMNIROUTE, "status", "--json", "--config", str(first.config), "--state", str(state)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=30, env=environment())
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["version"] == __version__
    after = subprocess.run(command, capture_output=True, text=True, timeout=30, env=environment())
    assert after.returncode == 3, after.stderr  # stopped: the lock is free, the config's port is empty


def test_a_start_refused_for_an_unwritable_state_file_leaves_no_file_behind(tmp_path: Path) -> None:
    """The operator does what the message says (makes the file writable again) and starts again: the
    refused start must not have left SQLite's -wal/-shm files behind, which SQLite creates with the
    state file's own mode (0444 for another user's read-only file) and which then refuse the next
    start in turn ("...state.db-shm is not writable by this user")."""
    state = tmp_path / "state.db"
    SqliteStore(state).close()
    with unwritable(state):
        result = serve_once(tmp_path, state)
    assert result.returncode == 2, result.stderr
    assert "is not writable" in result.stderr
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(("-wal", "-shm")))
    assert left == [], f"the refused start left {left} behind"


def test_a_state_path_under_a_directory_that_cannot_take_it_names_that_directory(tmp_path: Path) -> None:
    """`--state ro/sub/state.db` where `ro` may not be written: the refusal named `ro/sub`, which does
    not exist, as the directory that is not writable; it names `ro`, which the operator can fix."""
    locked = tmp_path / "ro"
    locked.mkdir()
    state = locked / "sub" / "state.db"
    with unwritable(locked):
        result = serve_once(tmp_path, state)
    assert result.returncode == 2, result.stderr
    assert f"{locked} is not writable by this user" in result.stderr, result.stderr
    assert f"{locked / 'sub'} is not writable" not in result.stderr


def test_a_fifo_or_a_file_in_the_way_of_the_state_path_is_named_at_once(tmp_path: Path) -> None:
    """A FIFO at the path held the start in open() without a word until a signal; a file where a
    folder of the path should be was `cannot lock the state file (state.db.lock): File exists`
    (found by a lifecycle trial)."""
    fifo = tmp_path / "fifo.db"
    os.mkfifo(fifo)
    result = serve_once(tmp_path, fifo)
    assert (result.returncode, result.stderr) == (2, f"omniroute: {fifo}: is a FIFO, not a state database\n")
    (tmp_path / "data").write_text("a file")
    state = tmp_path / "data" / "state.db"
    result = serve_once(tmp_path, state)
    assert result.returncode == 2, result.stderr
    assert f"{tmp_path / 'data'} is a file, not a directory" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_too_low_an_open_file_limit_is_named_and_a_low_soft_one_is_raised(tmp_path: Path) -> None:
    """Under `ulimit -n 10` the start failed inside the event loop's setup ("unexpected error:
    RuntimeError: Cannot close a running event loop", exit 1); a little higher it blamed the state
    file (found by a lifecycle trial). A soft limit under the hard one is raised to it, as servers
    do; a hard one too low for an instance is named (exit 2)."""
    import resource

    def limited(soft: int, hard: int) -> Callable[[], None]:
        return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    config = proxy_config(tmp_path, free_port())
    args = [*OMNIROUTE, "serve", "--config", str(config), "--state", str(tmp_path / "state.db")]
    refused = subprocess.run(
        args, capture_output=True, text=True, timeout=20, env=environment(), preexec_fn=limited(10, 10)
    )
    assert (refused.returncode, refused.stderr) == (
        2,
        f"omniroute: the open-file limit is 10 (ulimit -n) and omniroute needs at least {MIN_OPEN_FILES}:"
        " raise it (`ulimit -n 4096`, or LimitNOFILE= in a systemd unit)\n",
    )
    port = free_port()
    config = proxy_config(tmp_path, port)
    args = [*OMNIROUTE, "serve", "--config", str(config), "--state", str(tmp_path / "state.db")]
    proc = subprocess.Popen(
        args,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env=environment(),
        preexec_fn=limited(20, 4096),
    )
    try:
        deadline = time.monotonic() + 30
        while not answers(port) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1]
        with open(f"/proc/{proc.pid}/limits") as limits:
            line = next(row for row in limits if row.startswith("Max open files"))
        assert line.split()[3:5] == ["4096", "4096"], line  # the soft limit raised to the hard one
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # no instance outlives its test, whatever failed
            proc.kill()
            proc.communicate()
