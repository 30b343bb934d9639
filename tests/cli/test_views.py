"""Read commands against a live instance: `--json` is the API's view unchanged, tables say every state in words."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.cli.conftest import Instance, Result, run
from tests.fakes.server import LiveServer

HEALTH = "/api/monitoring/health"
CONNECTIONS = "/api/resilience/connections"
LOCKOUTS = "/api/resilience/model-cooldowns"


def busy(proxy: Instance) -> None:
    """alpha's breaker OPEN, alpha-1 cooling, m1 locked on alpha-2."""
    proxy.open_breaker("alpha")
    proxy.cool("alpha-1")
    proxy.lock("alpha-2", "m1")


def test_status_json_is_the_health_document(proxy: Instance) -> None:
    busy(proxy)
    health = proxy.api(HEALTH)
    assert health["status"] == "degraded"
    result = proxy.cli("status", "--json")
    assert result.code == 6  # degraded (see test_status_exit_code_says_whether_the_instance_is_healthy)
    assert json.loads(result.stdout) == health


def test_status_human_summary(proxy: Instance) -> None:
    busy(proxy)
    result = proxy.cli("status")
    assert result.code == 6, result.stderr
    out = result.stdout
    assert f"omniroute 0.1.0 at {proxy.url}: DEGRADED" in out
    assert "1 open, 0 half-open, 0 degraded, 1 closed (of 2)" in out
    assert "2 active, 1 cooling, 0 terminal, 0 disabled (of 3)" in out
    assert "1 active" in out  # lockouts
    assert "alpha OPEN  2 failures, retry in 15s" in out
    assert "alpha/m1 on alpha-2: not_found, 2m 00s left" in out
    assert [line.split() for line in out.splitlines() if line.startswith("State")] == [["State", "sqlite"]]


def test_status_exit_code_says_whether_the_instance_is_healthy(proxy: Instance) -> None:
    """0 when healthy, 6 when degraded, the output the same either way: `omniroute status -o json || page`."""
    for args in ((), ("--json",)):
        healthy = proxy.cli("status", *args)
        assert (healthy.code, healthy.stderr) == (0, "")
    proxy.engine.providers["alpha"].breaker.record_failure(proxy.clock.now())  # local: DEGRADED at 1
    assert proxy.api(HEALTH)["status"] == "degraded"
    for args in ((), ("--json",)):
        degraded = proxy.cli("status", *args)
        assert (degraded.code, degraded.stderr) == (6, "")
        assert "degraded" in degraded.stdout.lower()
    assert proxy.cli("breakers").code == 0  # only `status` answers "is it healthy?" with its code


def test_breakers_json_is_health_provider_breakers(proxy: Instance) -> None:
    proxy.open_breaker("alpha")
    rows = proxy.cli("breakers", "--json").json()
    assert rows == proxy.api(HEALTH)["providerBreakers"]
    assert [(b["provider"], b["state"]) for b in rows] == [("alpha", "OPEN"), ("beta", "CLOSED")]


def test_breakers_table_writes_states_and_durations(proxy: Instance) -> None:
    proxy.open_breaker("alpha")
    proxy.clock.advance(10_000)
    result = proxy.cli("breakers")
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "Provider", "Class", "State", "Failures", "Degraded/opens", "at", "Retry", "in",
        "Open", "cycles", "Last", "failure", "p50", "5m", "Errors", "5m",
    ]  # fmt: skip
    alpha = next(line for line in lines if line.startswith("alpha"))
    assert alpha.split() == ["alpha", "local", "OPEN", "2", "1", "/", "2", "5s", "1", "10s", "ago", "—", "—"]
    beta = next(line for line in lines if line.startswith("beta"))
    assert beta.split() == ["beta", "apikey", "CLOSED", "0", "7", "/", "12", "—", "0", "—", "—", "—"]


def test_connections_json_is_the_connections_list(proxy: Instance) -> None:
    proxy.cool("alpha-1")
    rows = proxy.cli("connections", "--json").json()
    assert rows == proxy.api(CONNECTIONS)["connections"]
    assert [(c["id"], c["status"]) for c in rows] == [
        ("alpha-1", "cooling"),
        ("alpha-2", "active"),
        ("beta-1", "active"),
    ]


def test_connections_table(proxy: Instance) -> None:
    proxy.cool("alpha-1")
    proxy.engine.set_connection_enabled("alpha-2", False)
    result = proxy.cli("connections")
    assert result.code == 0, result.stderr
    rows = {line.split()[1]: line.split() for line in result.stdout.splitlines()[2:]}
    assert rows["alpha-1"] == [
        "alpha",
        "alpha-1",
        "cooling",
        "2s",
        "1",
        "503",
        "server_error",
        "503",
        "0",
        "/",
        "∞",  # no cap: the console's notation (omniroute_tui.format.in_flight)
        "—",  # no traffic in the last 5 minutes: p50
        "—",  # and errors
    ]
    assert rows["alpha-2"][2] == "disabled"
    assert rows["beta-1"] == [
        "beta",
        "beta-1",
        "(Beta",
        "main)",
        "active",
        "—",
        "0",
        "—",
        "—",
        "0",
        "/",
        "2",
        "—",
        "—",
    ]


def headers(result: Result) -> list[str]:
    """The column titles of a table (two spaces or more between them)."""
    assert result.code == 0, result.stderr
    return [title for title in result.stdout.splitlines()[0].strip().split("  ") if title]


def test_tables_have_the_consoles_column_titles(proxy: Instance) -> None:
    """An operator reads the same column in the console and in the CLI under the same name."""
    from omniroute_tui.snapshot import COLUMNS

    busy(proxy)
    for view in ("breakers", "connections", "lockouts"):
        titles = [column.label for column in COLUMNS[view]]
        assert [" ".join(h.split()) for h in headers(proxy.cli(view))] == titles, view


def test_in_flight_is_written_the_same_way_as_in_the_console(proxy: Instance) -> None:
    from omniroute_tui import format as fmt

    assert (fmt.in_flight(0, None), fmt.in_flight(1, 2)) == ("0 / ∞", "1 / 2")
    result = proxy.cli("connections")
    assert result.code == 0, result.stderr
    # the In-flight/max column, before the two traffic columns
    in_flight = {
        line.split()[1]: [c.strip() for c in line.rstrip().split("  ") if c.strip()][-3]
        for line in result.stdout.splitlines()[2:]
    }
    assert in_flight == {"alpha-1": "0 / ∞", "alpha-2": "0 / ∞", "beta-1": "0 / 2"}


def test_cooldowns_json_is_connections_filtered_to_cooling(proxy: Instance) -> None:
    proxy.cool("alpha-1")
    rows = proxy.cli("cooldowns", "--json").json()
    assert rows == [c for c in proxy.api(CONNECTIONS)["connections"] if c["status"] == "cooling"]
    assert [c["id"] for c in rows] == ["alpha-1"]


def test_cooldowns_table_counts_down(proxy: Instance) -> None:
    engine = proxy.engine
    engine.settings.patch({"connectionCooldown": {"local": {"baseCooldownMs": 65_000}}}, "resilience")
    proxy.cool("alpha-1")
    result = proxy.cli("cooldowns")
    assert "alpha-1" in result.stdout and "cooling" in result.stdout and "1m 05s" in result.stdout
    proxy.clock.advance(5_000)
    assert "1m 00s" in proxy.cli("cooldowns").stdout


def test_lockouts_json_is_the_items_list(proxy: Instance) -> None:
    proxy.lock("alpha-2", "m1")
    proxy.lock("alpha-1", "m2")
    rows = proxy.cli("lockouts", "--json").json()
    assert rows == proxy.api(LOCKOUTS)["items"]
    assert {(item["connectionId"], item["model"]) for item in rows} == {("alpha-2", "m1"), ("alpha-1", "m2")}


def test_lockouts_table(proxy: Instance) -> None:
    proxy.lock("alpha-2", "m1")
    proxy.clock.advance(55_000)
    result = proxy.cli("lockouts")
    row = next(line for line in result.stdout.splitlines() if line.startswith("alpha"))
    assert row.split()[:7] == ["alpha", "alpha-2", "m1", "not_found", "1", "1m", "05s"]


def test_a_clients_endless_model_name_leaves_the_other_columns_readable(proxy: Instance) -> None:
    """A model name is whatever a client sent (a 404 locks it out): a kept column that never wraps
    would take the whole width and squeeze the reason and the time left out of the table."""
    proxy.lock("alpha-2", "m" * 5_000)
    result = proxy.cli("lockouts")
    row = next(line for line in result.stdout.splitlines() if line.startswith("alpha"))
    assert max(len(line) for line in result.stdout.splitlines()) <= 200
    assert "m…" in row and "m" * 100 not in row
    assert row.split()[:2] == ["alpha", "alpha-2"]
    assert row.split()[3:7] == ["not_found", "1", "2m", "00s"]


def test_empty_views_print_a_note_on_stderr_and_nothing_on_stdout(proxy: Instance) -> None:
    for command, message in (
        ("cooldowns", "No connection is cooling down."),
        ("lockouts", "No model is locked out."),
    ):
        result = proxy.cli(command)
        assert (result.code, result.stdout, result.stderr) == (0, "", message + "\n")
        assert proxy.cli(command, "--json").json() == []


def test_json_output_is_the_only_thing_on_stdout(proxy: Instance) -> None:
    busy(proxy)
    for command in ("status", "breakers", "connections", "cooldowns", "lockouts"):
        result = proxy.cli(command, "--json")
        assert result.stderr == ""
        assert result.code == (6 if command == "status" else 0)  # busy: degraded
        json.loads(result.stdout)  # the whole of stdout parses


def test_url_and_token_come_from_the_config(make_instance: Callable[..., Instance]) -> None:
    """No --url: the config's [server] port; its management_token too (here the instance requires it)."""
    secured = make_instance("cli-config-token-abcdef")
    result = run("breakers", "--json", "--config", str(secured.cli_config))
    assert result.json() == secured.api(HEALTH)["providerBreakers"]
    result = run("breakers", "--json", env={"OMNIROUTE_CONFIG": str(secured.cli_config)})
    assert result.code == 0, result.stderr


def test_url_and_token_from_the_environment(secured: Instance) -> None:
    env = {"OMNIROUTE_URL": secured.url, "OMNIROUTE_MANAGEMENT_TOKEN": secured.token or ""}
    assert run("lockouts", "--json", env=env).json() == []


HOSTILE = "m1\x1b]0;PWNED\x07\x1b[2J[link=http://x]y[/link]"


def test_status_shows_a_clients_model_name_as_visible_text(proxy: Instance) -> None:
    """A client chooses the model name a lockout keeps; `status` printed it raw, so any client of the
    proxy could retitle or clear the operator's terminal through it."""
    proxy.lock("alpha-2", HOSTILE)
    out = proxy.cli("status").stdout
    assert "\x1b" not in out and "\x07" not in out
    assert "[link=http://x]y[/link]" in out  # shown as written, never read as markup
    assert "alpha/m1\\x1b]0;PWNED" in out


def test_status_and_stats_show_a_hostile_instances_words_as_visible_text(tmp_path: Path) -> None:
    """Pointed at something that is not a trustworthy omniroute (`--url`), every word it sends is
    shown as text: its version, status, breaker rows and a statistics window."""
    health = {
        "status": "degraded\x1b[2J",
        "version": "[link=http://evil]9[/link]\x1b]0;PWNED\x07",
        "uptimeMs": 1000,
        "timestamp": "2026-12-04T00:00:00Z",
        "circuitBreakers": {"open": 1, "halfOpen": 0, "degraded": 0, "closed": 0, "total": 1},
        "connections": {"active": 1, "coolingDown": 0, "terminal": 0, "disabled": 0, "total": 1},
        "requests": {"total": 1, "ok": 1, "failed": 0, "inFlight": 0},
        "providerBreakers": [
            {"provider": "p\x1b[2J[red]", "state": "OPEN\x1b[2J", "failureCount": 1, "retryAfterMs": 0,
             "lastFailure": None},
        ],
        "lockouts": [],
    }  # fmt: skip
    stats = {"window": "[link=http://evil]5m[/link]\x1b[2J", "providers": {"p": {}}, "connections": {}}
    stats["providers"]["p"] = dict.fromkeys(
        ("requests", "errors", "errorRate", "p50Ms", "p95Ms", "ttftP50Ms", "tokensPerSecond"), 0
    )
    with answering({"/api/monitoring/health": health, "/api/stats": stats}) as url:
        for args in (("status",), ("stats",)):
            result = run(*args, "--url", url)
            out = result.stdout + result.stderr
            assert "\x1b" not in out and "\x07" not in out, args
            assert "[link=http://evil]" in out, (args, out)


@contextmanager
def answering(documents: dict[str, Any]) -> Iterator[str]:
    """A real HTTP server on loopback that answers each path's JSON document (404 elsewhere)."""

    async def answer(request: Request) -> Response:
        return JSONResponse(documents[request.url.path])

    server = LiveServer(Starlette(routes=[Route(path, answer) for path in documents])).start()
    try:
        yield server.url
    finally:
        server.stop()


def test_a_last_error_is_written_as_the_console_writes_it(proxy: Instance) -> None:
    """`503 the model server is overloaded`, not `503: {"error":{"message":"the model ser…`: in a
    40-character column the wrapper would leave no room for what the upstream said."""
    from omniroute_tui import format as fmt

    said = '503: {"error": {"message": "the model server is overloaded", "type": "server_error"}}'
    conn = proxy.engine.connections["alpha-1"]
    policy = proxy.engine.settings.cooldown_policy(proxy.engine.providers["alpha"].spec.provider_class)
    conn.health.record_failure(proxy.clock.now(), policy, error=said, error_type="server_error", code=503)
    assert fmt.readable_error(said) == "503 the model server is overloaded"
    for view in ("connections", "cooldowns"):
        result = proxy.cli(view)
        assert result.code == 0, result.stderr
        assert "503 the model server is overloaded" in result.stdout, result.stdout
        assert '{"error"' not in result.stdout
