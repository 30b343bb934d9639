"""A state file removed from under a running instance: nothing it acknowledges is lost.

An instance opens `state.db` once and writes through the descriptor it holds: removed while it runs
(an operator clearing the data folder to start afresh, a cleanup tool, `mv state.db state.db.bak`),
every later change went into the unlinked file, was answered 200, and the next start found none of
it (found by a lifecycle trial). Now the instance notices: a settings change is refused (500
`settings_not_saved`, nothing changed) and an operator's action is answered 500 `action_not_saved`
(it is in effect, and the answer says a restart would undo it). Real processes, a real restart.
"""

from __future__ import annotations

import signal
from pathlib import Path

import httpx

from tests.instances import proxy_config
from tests.processes import STARTUP_S, exit_code, free_port, serving, start_headless, wait_for


def test_changes_after_the_state_file_was_removed_are_refused_not_acknowledged(tmp_path: Path) -> None:
    port = free_port()
    config = proxy_config(tmp_path, port)
    state = tmp_path / "data" / "state.db"
    url = f"http://127.0.0.1:{port}"
    proc = start_headless(["serve", "--config", str(config), "--state", str(state)])
    try:
        wait_for(lambda: serving(port) or proc.poll() is not None, STARTUP_S, "serve answers")
        for name in ("state.db", "state.db-wal", "state.db-shm"):
            (state.parent / name).unlink(missing_ok=True)
        change = {"providerBreaker": {"local": {"failureThreshold": 77}}}
        refused = httpx.patch(f"{url}/api/resilience", json=change, timeout=10)
        assert refused.status_code == 500, refused.text
        assert refused.json()["error"]["code"] == "settings_not_saved"
        assert "removed or replaced" in refused.json()["error"]["message"]
        assert (
            httpx.get(f"{url}/api/resilience", timeout=10).json()["providerBreaker"]["local"][
                "failureThreshold"
            ]
            != 77
        )  # nothing changed

        disabled = httpx.put(f"{url}/api/providers/alpha-2", json={"isActive": False}, timeout=10)
        assert disabled.status_code == 500, disabled.text
        error = disabled.json()["error"]
        assert error["code"] == "action_not_saved"
        assert "in effect" in error["message"] and "restart would undo it" in error["message"]
        connections = httpx.get(f"{url}/api/resilience/connections", timeout=10).json()["connections"]
        assert next(c for c in connections if c["id"] == "alpha-2")["enabled"] is False  # live all the same
        proc.send_signal(signal.SIGTERM)
        assert exit_code(proc, 10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        assert proc.stderr is not None
        stderr = proc.stderr.read().decode()
        proc.stderr.close()
        proc.wait()
    assert "removed or replaced" in stderr  # the log says it too
