"""proxy/guard.py's Host rule, with its cache of the Host values it has seen."""

from __future__ import annotations

from proxy.config import ServerConfig
from proxy.guard import Guard


async def _app(scope: object, receive: object, send: object) -> None:  # never reached here
    raise AssertionError


def test_host_verdicts_stay_right_past_the_cache_and_on_repeat() -> None:
    guard = Guard(_app, ServerConfig(allowed_hosts=("proxy.lan",)))
    hosts = [f"evil{i}.example".encode() for i in range(200)] + [b"127.0.0.1:20128", b"proxy.lan", b"[::1]"]
    for _ in range(2):  # the second time round, the first 64 come from the cache
        assert [guard._host_allowed(h) for h in hosts] == [False] * 200 + [True, True, True]
    assert len(guard._hosts) == 64  # however many names a client makes up
