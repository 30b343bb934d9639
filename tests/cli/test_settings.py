"""`omniroute settings`: typed values, the right API group, and every invalid value named with its range."""

from __future__ import annotations

import re
from typing import Any

import pytest

from proxy.settings import defaults
from tests.cli.conftest import Instance, run


def live(proxy: Instance) -> dict[str, Any]:
    return {**proxy.api("/api/resilience"), **proxy.api("/api/settings")}


def test_show_all_json_is_both_groups(proxy: Instance) -> None:
    doc = proxy.cli("settings", "show", "--json").json()
    assert doc == live(proxy)
    assert list(doc) == [
        "requestQueue", "connectionCooldown", "providerBreaker", "comboCooldownWait",
        "quotaShareConcurrencyLimit", "streamRecovery", "sessionAffinity", "modelLockout",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("section", "route", "path"),
    [
        ("requestQueue", "/api/resilience", ["requestQueue"]),
        ("providerBreaker.apikey", "/api/resilience", ["providerBreaker", "apikey"]),
        ("modelLockout", "/api/settings", ["modelLockout"]),
        ("modelLockout.errorCodes", "/api/settings", ["modelLockout", "errorCodes"]),
    ],
)
def test_show_section_json_is_that_part_of_the_api_document(
    proxy: Instance, section: str, route: str, path: list[str]
) -> None:
    expected: Any = proxy.api(route)
    for part in path:
        expected = expected[part]
    assert proxy.cli("settings", "show", section, "--json").json() == expected


def test_show_table_has_value_default_and_range(proxy: Instance) -> None:
    proxy.engine.settings.patch({"providerBreaker": {"apikey": {"failureThreshold": 20}}}, "resilience")
    result = proxy.cli("settings", "show", "providerBreaker.apikey")
    assert result.code == 0, result.stderr
    rows = {
        line.split()[0]: line for line in result.stdout.splitlines() if line.startswith("providerBreaker")
    }
    assert list(rows) == [
        "providerBreaker.apikey.failureThreshold",
        "providerBreaker.apikey.degradationThreshold",
        "providerBreaker.apikey.resetTimeoutMs",
    ]
    assert rows["providerBreaker.apikey.failureThreshold"].split()[1:8] == [
        "20", "*", "12", "an", "integer", "between", "1",
    ]  # fmt: skip
    assert "an integer between 1000 and 86400000" in rows["providerBreaker.apikey.resetTimeoutMs"]
    assert "* differs from the default" in result.stdout


def test_show_describes_each_class_with_the_right_article(proxy: Instance) -> None:
    """Not "a OAuth provider" or "a API-key connection": the article follows the sound of the name."""
    result = proxy.cli("settings", "show")  # COLUMNS=200: the description column is shown
    assert result.code == 0, result.stderr
    text = " ".join(result.stdout.split())  # the column wraps its cells
    assert "an OAuth provider's breaker" in text
    assert "an API-key connection" in text
    assert "a local provider" in text
    assert re.search(r"\ba (OAuth|API)", text) is None


def test_set_int_patches_resilience(proxy: Instance) -> None:
    result = proxy.cli("settings", "set", "providerBreaker.apikey.failureThreshold", "20")
    assert (result.code, result.stdout) == (0, "providerBreaker.apikey.failureThreshold = 20\n")
    assert proxy.api("/api/resilience")["providerBreaker"]["apikey"]["failureThreshold"] == 20
    assert proxy.engine.settings.breaker_policy("apikey").failure_threshold == 20


def test_set_json_is_the_patch_answer(proxy: Instance) -> None:
    answer = proxy.cli("settings", "set", "sessionAffinity.ttlMs", "60000", "--json").json()
    assert answer == proxy.api("/api/resilience")
    assert answer["sessionAffinity"] == {"ttlMs": 60000}


def test_set_bool_and_list_patch_settings(proxy: Instance) -> None:
    assert proxy.cli("settings", "set", "modelLockout.enabled", "true").code == 0
    result = proxy.cli("settings", "set", "modelLockout.errorCodes", "404, 429,503")
    assert (result.code, result.stdout) == (0, "modelLockout.errorCodes = 404,429,503\n")
    lockout = proxy.api("/api/settings")["modelLockout"]
    assert (lockout["enabled"], lockout["errorCodes"]) == (True, [404, 429, 503])
    assert proxy.cli("settings", "set", "modelLockout.enabled", "false").code == 0
    assert proxy.api("/api/settings")["modelLockout"]["enabled"] is False


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "providerBreaker.apikey.failureThreshold",
            "0",
            "providerBreaker.apikey.failureThreshold: must be an integer between 1 and 1000 (got '0')",
        ),
        (
            "quotaShareConcurrencyLimit.queueDepth",
            "101",
            "quotaShareConcurrencyLimit.queueDepth: must be an integer between 0 and 100 (got '101')",
        ),
        (
            "requestQueue.maxWaitMs",
            "1.5",
            "requestQueue.maxWaitMs: must be an integer between 1 and 30000 (got '1.5')",
        ),
        ("modelLockout.enabled", "maybe", "modelLockout.enabled: must be true or false (got 'maybe')"),
        (
            "modelLockout.errorCodes",
            "404,99",
            "modelLockout.errorCodes: must be a list of at most 20 integers between 100 and 599 (item 1 is 99)"
            " (got '404,99')",
        ),
        (
            "providerBreaker.apikey.failureThreshol",
            "5",
            "unknown setting 'providerBreaker.apikey.failureThreshol'; did you mean"
            " providerBreaker.apikey.failureThreshold? sections: requestQueue, connectionCooldown,"
            " providerBreaker, comboCooldownWait, quotaShareConcurrencyLimit, streamRecovery, sessionAffinity,"
            " modelLockout",
        ),
        (
            "providerBreaker",
            "5",
            "providerBreaker is a section, not a setting; `omniroute settings show providerBreaker` lists its keys",
        ),
    ],
)
def test_set_invalid_value_exits_2_naming_field_and_range(
    proxy: Instance, key: str, value: str, message: str
) -> None:
    before = live(proxy)
    result = proxy.cli("settings", "set", key, value)
    assert (result.code, result.stdout, result.stderr) == (2, "", f"omniroute: {message}\n")
    assert live(proxy) == before


def test_set_checks_locally_before_any_request() -> None:
    """A bad value is rejected even with nothing listening: exit 2, not 3."""
    result = run("settings", "set", "sessionAffinity.ttlMs", "-1", "--url", "http://127.0.0.1:9")
    assert result.code == 2
    result = run("settings", "set", "--url", "http://127.0.0.1:9", "--", "sessionAffinity.ttlMs", "-1")
    assert result.stderr == (
        "omniroute: sessionAffinity.ttlMs: must be an integer between 0 and 86400000 (got '-1')\n"
    )


def test_set_cross_field_rule_rejected_by_the_instance_exits_2(proxy: Instance) -> None:
    result = proxy.cli("settings", "set", "providerBreaker.apikey.degradationThreshold", "12")
    assert result.code == 2
    assert result.stderr == (
        f"omniroute: rejected by {proxy.url}: providerBreaker.apikey.degradationThreshold:"
        " must be lower than failureThreshold (12)\n"
    )
    assert proxy.api("/api/resilience")["providerBreaker"]["apikey"]["degradationThreshold"] == 7


# -- several KEY=VALUE pairs: one atomic PATCH ------------------------------------------------------


def test_set_several_pairs_meets_a_cross_field_rule_in_one_step(proxy: Instance) -> None:
    """maxCooldownMs 90000 alone is below the default base (120000); with the base it is fine."""
    alone = proxy.cli("settings", "set", "modelLockout.maxCooldownMs=90000")
    assert alone.code == 2 and "maxCooldownMs" in alone.stderr
    result = proxy.cli(
        "settings", "set", "modelLockout.baseCooldownMs=60000", "modelLockout.maxCooldownMs=90000"
    )
    assert (result.code, result.stderr) == (0, "")
    assert result.stdout == "modelLockout.baseCooldownMs = 60000\nmodelLockout.maxCooldownMs = 90000\n"
    lockout = proxy.api("/api/settings")["modelLockout"]
    assert (lockout["baseCooldownMs"], lockout["maxCooldownMs"]) == (60000, 90000)


def test_set_pairs_json_is_the_patch_answer(proxy: Instance) -> None:
    answer = proxy.cli(
        "settings",
        "set",
        "providerBreaker.apikey.failureThreshold=20",
        "sessionAffinity.ttlMs=0",
        "-o",
        "json",
    ).json()
    assert answer == proxy.api("/api/resilience")
    assert (answer["providerBreaker"]["apikey"]["failureThreshold"], answer["sessionAffinity"]["ttlMs"]) == (
        20,
        0,
    )


def test_set_pairs_with_one_bad_value_changes_nothing_and_names_it(proxy: Instance) -> None:
    before = live(proxy)
    result = run(
        "settings", "set", "sessionAffinity.ttlMs=0", "requestQueue.maxWaitMs=99999", "--url", proxy.url
    )
    assert (result.code, result.stderr) == (
        2,
        "omniroute: requestQueue.maxWaitMs: must be an integer between 1 and 30000 (got '99999')\n",
    )
    assert live(proxy) == before


def test_set_refuses_to_mix_model_lockout_with_the_other_sections(proxy: Instance) -> None:
    """Two groups are two PATCHes: the second could fail after the first applied, so it is refused."""
    before = live(proxy)
    result = proxy.cli("settings", "set", "modelLockout.enabled=true", "requestQueue.maxWaitMs=1000")
    assert result.code == 2
    assert result.stderr == (
        "omniroute: modelLockout.enabled and requestQueue.maxWaitMs are saved separately (/api/settings,"
        " /api/resilience), so no one change can be atomic: set them in two commands; nothing was changed\n"
    )
    assert live(proxy) == before


EXAMPLE = "e.g. `omniroute settings set modelLockout.baseCooldownMs=60000 modelLockout.maxCooldownMs=90000`"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["requestQueue.maxWaitMs=1000", "sessionAffinity.ttlMs"],
            f"expected KEY=VALUE (got 'sessionAffinity.ttlMs'); {EXAMPLE}",
        ),
        (["=5"], f"expected KEY=VALUE (got '=5'); {EXAMPLE}"),
        (["requestQueue.maxWaitMs"], f"expected KEY=VALUE (got 'requestQueue.maxWaitMs'); {EXAMPLE}"),
        (
            ["requestQueue.maxWaitMs=1000", "requestQueue.maxWaitMs=2000"],
            "requestQueue.maxWaitMs is given twice",
        ),
    ],
)
def test_set_pairs_bad_usage_exits_2(proxy: Instance, args: list[str], message: str) -> None:
    before = live(proxy)
    result = proxy.cli("settings", "set", *args)
    assert (result.code, result.stderr) == (2, f"omniroute: {message}\n")
    assert live(proxy) == before


def test_reset_section_loads_its_defaults(proxy: Instance) -> None:
    settings = proxy.engine.settings
    settings.patch(
        {"providerBreaker": {"apikey": {"failureThreshold": 30}, "local": {"failureThreshold": 9}}},
        "resilience",
    )
    settings.patch({"modelLockout": {"enabled": True, "errorCodes": [500]}}, "settings")

    result = proxy.cli("settings", "reset", "providerBreaker.apikey")
    assert (result.code, result.stdout) == (0, "providerBreaker.apikey is back to its defaults.\n")
    breakers = proxy.api("/api/resilience")["providerBreaker"]
    assert breakers["apikey"] == defaults()["providerBreaker"]["apikey"]
    assert breakers["local"]["failureThreshold"] == 9  # only the named part

    answer = proxy.cli("settings", "reset", "modelLockout", "--json").json()
    assert answer == {"modelLockout": defaults()["modelLockout"]} == proxy.api("/api/settings")


def test_reset_unknown_section_exits_2(proxy: Instance) -> None:
    result = proxy.cli("settings", "reset", "providerBreakers")
    assert result.code == 2
    assert result.stderr.startswith(
        "omniroute: unknown section 'providerBreakers'; did you mean providerBreaker?"
    )
    show = proxy.cli("settings", "show", "nope")
    assert show.code == 2 and "unknown section 'nope'" in show.stderr
