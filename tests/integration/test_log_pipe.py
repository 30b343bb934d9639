"""A log reader that stops reading must not stop the proxy.

`omniroute serve` logs to stderr, one line per engine event, and the operator decides where that
goes: a pipe to a log shipper, `| tee`, `2>&1 | less` left paused. When that reader stalls the pipe
fills, and every later log line blocks the process's event loop inside `write()`: health, the
management API and `/v1` stop answering, for as long as the reader sleeps. A SIGTERM then cannot
stop cleanly either: the deadline thread kills it after 4 s with exit 1 (docs/operations.md: the
clean stop exits 0).

The pipe is shrunk to one page (F_SETPIPE_SZ) so that a few dozen actions fill it. (Found by a
lifecycle trial.)
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
from pathlib import Path

import httpx

from tests.instances import OMNIROUTE, environment, proxy_config
from tests.processes import exit_code, free_port, wait_for

ACTIONS = 300
"""Two log lines each (the connection's transition and the operator line): some 50 KB of log."""


def _serving(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/api/monitoring/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_stalled_log_reader_does_not_stop_the_proxy(tmp_path: Path) -> None:
    port = free_port()
    config = proxy_config(tmp_path, port)
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)  # a pipe nobody reads, as small as Linux allows
    proc = subprocess.Popen(
        [*OMNIROUTE, "serve", "--config", str(config), "--state", str(tmp_path / "state.db")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=write_end,
        env=environment(),
        start_new_session=True,
    )
    os.close(write_end)
    try:
        wait_for(lambda: _serving(port), 30, "serve answers its health route")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            for i in range(ACTIONS):
                try:
                    response = client.post("/api/resilience/connections/alpha-1/reset")
                except httpx.TimeoutException:
                    raise AssertionError(
                        f"the proxy stopped answering after {i} operator actions: its log pipe is full"
                    ) from None
                assert response.status_code == 200
            assert client.get("/api/monitoring/health").status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert exit_code(proc, 10) == 0  # the clean stop, not the deadline's exit 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(read_end)
