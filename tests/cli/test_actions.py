"""Actions against a live instance: the state changes, `--json` is the API's answer, unknown ids exit 5."""

from __future__ import annotations

from typing import Any

from tests.cli.conftest import Instance

HEALTH = "/api/monitoring/health"
CONNECTIONS = "/api/resilience/connections"
LOCKOUTS = "/api/resilience/model-cooldowns"


def breaker_states(proxy: Instance) -> dict[str, str]:
    return {b["provider"]: b["state"] for b in proxy.api(HEALTH)["providerBreakers"]}


def connection(proxy: Instance, connection_id: str) -> dict[str, Any]:
    rows: list[dict[str, Any]] = proxy.api(CONNECTIONS)["connections"]
    return next(c for c in rows if c["id"] == connection_id)


def lockouts(proxy: Instance) -> set[tuple[str, str]]:
    return {(item["connectionId"], item["model"]) for item in proxy.api(LOCKOUTS)["items"]}


def test_reset_breaker_one(proxy: Instance) -> None:
    proxy.open_breaker("alpha")
    proxy.open_breaker("beta")
    result = proxy.cli("reset", "breaker", "alpha")
    assert (result.code, result.stdout) == (0, "Reset 1 breaker (alpha).\n")
    assert breaker_states(proxy) == {"alpha": "CLOSED", "beta": "OPEN"}


def test_reset_breaker_all_json(proxy: Instance) -> None:
    proxy.open_breaker("alpha")
    proxy.open_breaker("beta")
    assert proxy.cli("reset", "breaker", "--all", "--json").json() == {"ok": True, "resetCount": 2}
    assert breaker_states(proxy) == {"alpha": "CLOSED", "beta": "CLOSED"}


def test_reset_breaker_unknown_provider_exits_5(proxy: Instance) -> None:
    result = proxy.cli("reset", "breaker", "nope")
    assert result.code == 5
    assert result.stderr == f"omniroute: no provider 'nope' at {proxy.url}\n"
    assert result.stdout == ""


def test_reset_breaker_needs_exactly_one_of_provider_or_all(proxy: Instance) -> None:
    neither = proxy.cli("reset", "breaker")
    assert (neither.code, neither.stderr) == (2, "omniroute: give PROVIDER, or --all for every one\n")
    both = proxy.cli("reset", "breaker", "alpha", "--all")
    assert (both.code, both.stderr) == (2, "omniroute: give PROVIDER or --all, not both\n")


def test_reset_connection_one(proxy: Instance) -> None:
    proxy.cool("alpha-1")
    answer = proxy.cli("reset", "connection", "alpha-1", "--json").json()
    assert answer == {"ok": True, "connection": connection(proxy, "alpha-1")}
    assert answer["connection"]["status"] == "active"
    assert answer["connection"]["backoffLevel"] == 0


def test_reset_connection_all(proxy: Instance) -> None:
    proxy.cool("alpha-1")
    proxy.cool("beta-1")
    result = proxy.cli("reset", "connection", "--all")
    assert (result.code, result.stdout) == (0, "Cleared 3 connections: alpha-1, alpha-2, beta-1.\n")
    assert [c["status"] for c in proxy.api(CONNECTIONS)["connections"]] == ["active", "active", "active"]


def test_reset_connection_all_json_is_the_list_of_answers(proxy: Instance) -> None:
    proxy.cool("alpha-2")
    answers = proxy.cli("reset", "connection", "--all", "--json").json()
    assert answers == [{"ok": True, "connection": c} for c in proxy.api(CONNECTIONS)["connections"]]


def test_reset_connection_unknown_exits_5(proxy: Instance) -> None:
    for bad in ("nope", "..", "a/b"):
        result = proxy.cli("reset", "connection", bad)
        assert result.code == 5, (bad, result.stderr)
        assert result.stderr.startswith(f"omniroute: no connection '{bad}'")


def test_disable_then_enable(proxy: Instance) -> None:
    result = proxy.cli("disable", "beta-1")
    assert (result.code, result.stdout) == (0, "Disabled connection beta-1 (now disabled).\n")
    assert connection(proxy, "beta-1")["enabled"] is False
    answer = proxy.cli("enable", "beta-1", "--json").json()
    assert answer == {"connection": connection(proxy, "beta-1")}
    assert answer["connection"]["status"] == "active"


def test_enable_unknown_connection_exits_5(proxy: Instance) -> None:
    for command in ("enable", "disable"):
        result = proxy.cli(command, "ghost")
        assert (result.code, result.stderr) == (5, f"omniroute: no connection 'ghost' at {proxy.url}\n")


def test_reenable_model_on_every_connection(proxy: Instance) -> None:
    proxy.lock("alpha-1", "m1")
    proxy.lock("alpha-2", "m1")
    proxy.lock("alpha-2", "m2")
    result = proxy.cli("reenable", "alpha/m1")
    assert (result.code, result.stdout) == (0, "Lifted 2 lockouts of alpha/m1.\n")
    assert lockouts(proxy) == {("alpha-2", "m2")}


def test_reenable_model_on_one_connection_json(proxy: Instance) -> None:
    proxy.lock("alpha-1", "m1")
    proxy.lock("alpha-2", "m1")
    answer = proxy.cli("reenable", "alpha/m1", "--connection", "alpha-2", "--json").json()
    assert answer == {"ok": True, "removed": 1}
    assert lockouts(proxy) == {("alpha-1", "m1")}


def test_reenable_keeps_slashes_in_the_model_name(proxy: Instance) -> None:
    proxy.lock("alpha-1", "org/model-7b")
    assert proxy.cli("reenable", "alpha/org/model-7b", "--json").json() == {"ok": True, "removed": 1}


def test_reenable_all(proxy: Instance) -> None:
    proxy.lock("alpha-1", "m1")
    proxy.lock("alpha-2", "m2")
    assert proxy.cli("reenable", "--all", "--json").json() == {"ok": True, "removed": 2}
    assert lockouts(proxy) == set()
    again = proxy.cli("reenable", "--all")  # nothing left: still fine for a cron job
    assert (again.code, again.stdout) == (0, "Lifted 0 lockouts.\n")


def test_reenable_not_found_exits_5(proxy: Instance) -> None:
    no_lockout = proxy.cli("reenable", "alpha/m1")
    assert no_lockout.code == 5
    assert no_lockout.stderr == (
        "omniroute: no lockout on alpha/m1; `omniroute lockouts` lists the active ones\n"
    )
    no_provider = proxy.cli("reenable", "nope/m1")
    assert (no_provider.code, no_provider.stderr) == (5, f"omniroute: no provider 'nope' at {proxy.url}\n")
    wrong_connection = proxy.cli("reenable", "alpha/m1", "--connection", "beta-1")
    assert wrong_connection.code == 5
    assert "provider 'alpha' has no connection 'beta-1'" in wrong_connection.stderr


def test_reenable_bad_usage_exits_2(proxy: Instance) -> None:
    cases = {
        ("reenable", "alpha"): "PROVIDER/MODEL: expected e.g. openai/gpt-4o-mini (got 'alpha')",
        ("reenable", "/m1"): "PROVIDER/MODEL: expected e.g. openai/gpt-4o-mini (got '/m1')",
        ("reenable",): "give PROVIDER/MODEL, or --all for every one",
        ("reenable", "alpha/m1", "--all"): "give PROVIDER/MODEL or --all, not both",
        ("reenable", "--all", "--connection", "alpha-1"): "--connection cannot be combined with --all",
    }
    for args, message in cases.items():
        result = proxy.cli(*args)
        assert (result.code, result.stderr) == (2, f"omniroute: {message}\n"), args
