"""Shell completion offers names from the running instance, and nothing (silently) when none answers.

The shell runs `_OMNIROUTE_COMPLETE=complete_bash COMP_WORDS=... COMP_CWORD=... omniroute` on each tab
press; `complete(...)` does the same through the CLI's own entry point.
"""

from __future__ import annotations

import time

import pytest

from tests.cli.conftest import Instance, Result, run
from tests.fakes import FakeUpstream


def complete(line: str, url: str | None) -> Result:
    """What bash offers for the last word of `line` (empty when it ends in a space)."""
    words = line.split(" ")
    env = {
        "_OMNIROUTE_COMPLETE": "complete_bash",
        "COMP_WORDS": " ".join(["omniroute", *words]),
        "COMP_CWORD": str(len(words)),
    }
    if url is not None:
        env["OMNIROUTE_URL"] = url
    return run(env=env)


def offered(line: str, url: str | None) -> list[str]:
    result = complete(line, url)
    assert (result.code, result.stderr) == (0, ""), result
    return result.stdout.split()


def test_providers(proxy: Instance) -> None:
    assert offered("reset breaker ", proxy.url) == ["alpha", "beta"]
    assert offered("reset breaker b", proxy.url) == ["beta"]
    assert offered("reset breaker alpha ", proxy.url) == ["beta"]  # a name already given is not offered again


def test_connections(proxy: Instance) -> None:
    for command in ("reset connection", "enable", "disable"):
        assert offered(f"{command} ", proxy.url) == ["alpha-1", "alpha-2", "beta-1"], command
    assert offered("enable alpha-1 a", proxy.url) == ["alpha-2"]
    assert offered("reenable alpha/m1 --connection al", proxy.url) == ["alpha-1", "alpha-2"]


def test_locked_models(proxy: Instance) -> None:
    assert offered("reenable ", proxy.url) == []
    proxy.lock("alpha-1", "m1")
    proxy.lock("alpha-2", "m1")
    proxy.lock("alpha-2", "org/m2")
    proxy.lock("alpha-2", "evil\nrm -rf ~\x1b[2J")
    assert offered("reenable ", proxy.url) == ["alpha/m1", "alpha/org/m2"]  # never a control character


def test_settings(proxy: Instance) -> None:
    sections = offered("settings show provider", proxy.url)
    assert sections[:2] == ["providerBreaker", "providerBreaker.oauth"]
    assert "providerBreaker.apikey.failureThreshold" in sections
    assert offered("settings reset modelLockout.e", proxy.url) == [
        "modelLockout.enabled",
        "modelLockout.errorCodes",
    ]
    keys = offered("settings set modelLockout.", proxy.url)
    assert "modelLockout.enabled" in keys and "modelLockout" not in keys  # only single settings
    assert offered("settings set modelLockout.enabled=true modelLockout.e", proxy.url) == [
        "modelLockout.errorCodes"
    ]
    assert offered("settings set modelLockout.enabled ", proxy.url) == []  # the VALUE of `KEY VALUE`


def test_the_url_option_on_the_line_is_used(proxy: Instance) -> None:
    assert offered(f"reset breaker --url {proxy.url} ", None) == ["alpha", "beta"]


def test_nothing_and_no_error_when_no_instance_answers() -> None:
    refused = FakeUpstream.refused_url().removesuffix("/v1")
    for line in ("reset breaker ", "enable ", "reenable ", "settings show ", "settings set "):
        started = time.monotonic()
        result = complete(line, refused)
        assert (result.code, result.stdout.strip(), result.stderr) == (0, "", ""), line
        assert time.monotonic() - started < 2


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "not a url"])
def test_nothing_for_an_unusable_url(url: str) -> None:
    assert complete("enable ", url).stdout.strip() == ""


def test_nothing_when_the_token_is_refused(secured: Instance) -> None:
    assert complete("enable ", secured.url).stdout.strip() == ""
