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


def test_a_name_with_a_newline_is_echoed_with_its_mark_not_a_space(proxy: Instance) -> None:
    """`no provider 'no pe'` would name a provider that was not asked for: the line shows the
    newline as the tables do (↵), on one line still."""
    result = proxy.cli("reset", "breaker", "no\npe")
    assert result.code == 5
    assert result.stderr == f"omniroute: no provider 'no↵pe' at {proxy.url}\n"


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


# -- several names per command (kubectl / gh style): all checked first, then all done -------------


def test_reset_breaker_several(proxy: Instance) -> None:
    proxy.open_breaker("alpha")
    proxy.open_breaker("beta")
    result = proxy.cli("reset", "breaker", "alpha", "beta")
    assert (result.code, result.stdout) == (0, "Reset 2 breakers (alpha, beta).\n")
    assert breaker_states(proxy) == {"alpha": "CLOSED", "beta": "CLOSED"}


def test_several_names_json_is_the_list_of_answers_in_order(proxy: Instance) -> None:
    proxy.open_breaker("beta")
    answers = proxy.cli("reset", "breaker", "beta", "alpha", "--json").json()
    assert answers == [{"ok": True, "resetCount": 1}, {"ok": True, "resetCount": 1}]
    cleared = proxy.cli("reset", "connection", "beta-1", "alpha-1", "-o", "json").json()
    assert [a["connection"]["id"] for a in cleared] == ["beta-1", "alpha-1"]


def test_a_name_given_twice_is_acted_on_once(proxy: Instance) -> None:
    proxy.open_breaker("alpha")
    result = proxy.cli("reset", "breaker", "alpha", "alpha")
    assert (result.code, result.stdout) == (0, "Reset 1 breaker (alpha).\n")


def test_reset_breaker_with_an_unknown_name_changes_nothing(proxy: Instance) -> None:
    proxy.open_breaker("alpha")
    result = proxy.cli("reset", "breaker", "alpha", "nope", "ghost")
    assert (result.code, result.stdout) == (5, "")
    assert result.stderr == f"omniroute: no provider 'nope' or 'ghost' at {proxy.url}; nothing was changed\n"
    assert breaker_states(proxy) == {"alpha": "OPEN", "beta": "CLOSED"}


def test_reset_connection_several(proxy: Instance) -> None:
    proxy.cool("alpha-1")
    proxy.cool("beta-1")
    result = proxy.cli("reset", "connection", "alpha-1", "beta-1")
    assert (result.code, result.stdout) == (0, "Cleared 2 connections: alpha-1, beta-1.\n")
    assert [c["status"] for c in proxy.api(CONNECTIONS)["connections"]] == ["active", "active", "active"]


def test_reset_connection_with_an_unknown_name_changes_nothing(proxy: Instance) -> None:
    proxy.cool("alpha-1")
    result = proxy.cli("reset", "connection", "alpha-1", "a/b")
    assert result.code == 5
    assert result.stderr == f"omniroute: no connection 'a/b' at {proxy.url}; nothing was changed\n"
    assert connection(proxy, "alpha-1")["status"] == "cooling"


def test_reset_connection_names_or_all(proxy: Instance) -> None:
    result = proxy.cli("reset", "connection", "alpha-1", "--all")
    assert (result.code, result.stderr) == (2, "omniroute: give ID or --all, not both\n")


def test_disable_and_enable_several(proxy: Instance) -> None:
    result = proxy.cli("disable", "alpha-1", "beta-1")
    assert (result.code, result.stdout) == (
        0,
        "Disabled 2 connections: alpha-1 (now disabled), beta-1 (now disabled).\n",
    )
    assert [connection(proxy, cid)["enabled"] for cid in ("alpha-1", "alpha-2", "beta-1")] == [
        False,
        True,
        False,
    ]
    answers = proxy.cli("enable", "alpha-1", "beta-1", "--json").json()
    assert answers == [
        {"connection": connection(proxy, "alpha-1")},
        {"connection": connection(proxy, "beta-1")},
    ]


def test_disable_with_an_unknown_name_changes_nothing(proxy: Instance) -> None:
    for command in ("disable", "enable"):
        result = proxy.cli(command, "alpha-1", "ghost")
        assert (result.code, result.stderr) == (
            5,
            f"omniroute: no connection 'ghost' at {proxy.url}; nothing was changed\n",
        )
    assert connection(proxy, "alpha-1")["enabled"] is True


def test_reenable_several(proxy: Instance) -> None:
    proxy.lock("alpha-1", "m1")
    proxy.lock("alpha-2", "m1")
    proxy.lock("alpha-2", "m2")
    proxy.lock("alpha-2", "m3")
    result = proxy.cli("reenable", "alpha/m1", "alpha/m2")
    assert (result.code, result.stdout) == (0, "Lifted 3 lockouts of alpha/m1, alpha/m2.\n")
    assert lockouts(proxy) == {("alpha-2", "m3")}


def test_reenable_several_with_one_not_locked_changes_nothing(proxy: Instance) -> None:
    proxy.lock("alpha-1", "m1")
    result = proxy.cli("reenable", "alpha/m1", "alpha/m9")
    assert result.code == 5
    assert result.stderr == (
        "omniroute: no lockout on alpha/m9; `omniroute lockouts` lists the active ones; nothing was changed\n"
    )
    nope = proxy.cli("reenable", "alpha/m1", "nope/m1")
    assert (nope.code, nope.stderr) == (
        5,
        f"omniroute: no provider 'nope' at {proxy.url}; nothing was changed\n",
    )
    assert lockouts(proxy) == {("alpha-1", "m1")}


def test_reenable_several_on_one_connection(proxy: Instance) -> None:
    proxy.lock("alpha-1", "m1")
    proxy.lock("alpha-2", "m1")
    proxy.lock("alpha-2", "m2")
    answers = proxy.cli("reenable", "alpha/m1", "alpha/m2", "--connection", "alpha-2", "--json").json()
    assert answers == [{"ok": True, "removed": 1}, {"ok": True, "removed": 1}]
    assert lockouts(proxy) == {("alpha-1", "m1")}
