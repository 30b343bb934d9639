"""One process: the proxy serves while the console runs, and quitting stops both cleanly."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from textual.pilot import Pilot

from omniroute_tui.app import make_app, run_tui
from proxy import __version__, serve
from proxy.app import create_app
from tests.fakes import serve as serve_app
from tests.instances import free_port, serving
from tests.tui.snapshot_app import CONFIG, build_runtime

SIZE = (120, 40)


async def wait_until(pilot: Pilot[object], condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for a condition (the server binding, a task ending), not for a fixed time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not reached"
        await pilot.pause(0.02)


def port_is_closed(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


@pytest.mark.parametrize("how", ["q", "exit"])
async def test_quitting_stops_the_server_and_leaves_no_task(how: str) -> None:
    runtime = build_runtime()
    sock = serve.bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    before = asyncio.all_tasks()
    app = make_app(runtime, serve_sock=sock, clock_frozen=True)
    host = app.host
    assert host is not None
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: host.server is not None and host.server.started)
        async with httpx.AsyncClient() as client:
            response = await client.get(f"http://127.0.0.1:{port}/api/monitoring/health")
        assert response.status_code == 200
        assert response.json()["circuitBreakers"]["open"] == 1  # the same engine the console shows
        assert app.status.line_text(0).count(f"http://127.0.0.1:{port}/v1") == 1
        if how == "q":
            await pilot.press("q")
            await wait_until(pilot, lambda: host.task is not None and host.task.done())
        else:
            app.exit()  # any other way out stops the server too (on_unmount)
    assert app.return_code == 0
    assert host.task is not None and host.task.done() and host.task.exception() is None
    assert port_is_closed(port)
    assert runtime._persist_task is None  # the lifespan stopped the runtime
    leftover = {t for t in asyncio.all_tasks() - before if t is not asyncio.current_task() and not t.done()}
    assert leftover == set()


def test_a_busy_port_is_one_line_on_stderr_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    config.chmod(0o600)
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        code = run_tui(serve.Options(config=str(config), state=str(tmp_path / "state.db"), port=port))
    assert code == 2
    err = capsys.readouterr().err
    assert err == (
        f"omniroute: cannot listen on 127.0.0.1:{port}: Address already in use"
        " (is another instance running? choose another --port)\n"
    )


def test_a_port_another_omniroute_holds_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    config.chmod(0o600)
    with serve_app(create_app(build_runtime(), manage_lifecycle=False)) as other:
        code = run_tui(serve.Options(config=str(config), state=str(tmp_path / "state.db"), port=other.port))
    assert code == 2
    # build_runtime's engine started 10 minutes before its FakeClock's now.
    assert capsys.readouterr().err == (
        f"omniroute: cannot listen on 127.0.0.1:{other.port}: another omniroute {__version__}, up 10 min,"
        f" is serving on 127.0.0.1:{other.port} (stop it, or choose another --port)\n"
    )


def test_a_broken_config_is_reported_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[providers.x\n")
    code = run_tui(serve.Options(config=str(config), state=str(tmp_path / "state.db")))
    assert code == 2
    err = capsys.readouterr().err
    assert "invalid TOML" in err
    assert "Traceback" not in err


def test_a_state_file_that_serve_holds_is_refused_by_the_console(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tui` and `serve` on one state file each kept their own engine (issue #21): the second refuses."""
    state = tmp_path / "state.db"
    with serving(tmp_path, state) as running:
        code = run_tui(serve.Options(config=str(running.config), state=str(state), port=free_port()))
        assert code == 2
        err = capsys.readouterr().err
        assert err.startswith(
            f"omniroute: {state} is in use by omniroute (pid {running.proc.pid}, serving on 127.0.0.1:{running.port})"
        )
        assert err.rstrip().endswith(f"attach the console: omniroute tui --url {running.url}")
