"""A replica starting on shared state another writer broke (a hand-edited key, another program
under the same prefix, a Redis restored from a bad dump): it refuses to start, as with a bad row
in a state file, in one line that names the Redis key to delete (the CLI's exit 2, never an
"unexpected error"), and the fleet's other records are untouched."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.config import load_config
from proxy.fleet.backend import FleetUnavailable
from proxy.runtime import Runtime
from tests.fleet.conftest import REDIS_URL, require_redis
from tests.fleet.test_overlap import CONFIG


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[tuple[Any, str, Callable[[], Runtime]]]:
    redis = require_redis()
    prefix = f"omniroute-test:{uuid.uuid4().hex[:10]}:"
    path = tmp_path / "r.toml"
    path.write_text(CONFIG.format(port=1, url=REDIS_URL, prefix=prefix))

    def open_replica() -> Runtime:
        return Runtime.open(load_config(path, {}, explicit=True), tmp_path / "unused.db")

    try:
        yield redis, prefix, open_replica
    finally:
        keys = list(redis.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            redis.delete(*keys)


@pytest.mark.parametrize(
    ("key", "write"),
    [
        pytest.param(
            "b:keys", lambda r, k: r.hset(k, mapping={"v": 3, "r": "{not json"}), id="record-not-json"
        ),
        pytest.param(
            "c:key-1", lambda r, k: r.hset(k, mapping={"v": "x", "r": "{}"}), id="version-not-a-number"
        ),
        pytest.param("b:keys", lambda r, k: r.set(k, "a string"), id="wrong-type"),
        pytest.param(
            "settings", lambda r, k: r.hset(k, mapping={"v": 2, "r": "[1,"}), id="settings-not-json"
        ),
        pytest.param(
            "b:keys", lambda r, k: r.hset(k, mapping={"v": 3, "r": '{"state": "WEIRD"}'}), id="unknown-state"
        ),
    ],
)
def test_a_key_no_replica_can_read_is_named_and_the_replica_does_not_start(
    shared: tuple[Any, str, Callable[[], Runtime]], key: str, write: Callable[[Any, str], object]
) -> None:
    redis, prefix, open_replica = shared
    write(redis, prefix + key)
    with pytest.raises(FleetUnavailable) as refused:
        open_replica()
    message = str(refused.value)
    assert f"{prefix}{key}" in message and "unused.db" not in message, message
    assert "delete" in message
