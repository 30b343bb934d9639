"""The process's heap settings (proxy.serve.settle_heap): what a serving process sets up once."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from proxy.serve import YOUNG_GC_THRESHOLD, settle_heap


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_the_startup_heap_is_frozen(restored_gc: None) -> None:
    settle_heap()
    assert gc.get_freeze_count() > 0


def test_a_burst_of_request_time_objects_starts_no_collection(restored_gc: None) -> None:
    """Under load, the objects of the requests in flight (headers, parsed answers, frames) are
    alive together: with CPython's default young threshold (700) their mere number set off a
    young collection every few requests, which walked all of them and moved them to an older
    generation they died in anyway (bench/proxy.py: a tenth of the CPU). A burst of that size
    must not start one."""
    settle_heap()
    collections = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        burst = [{"i": i} for i in range(5_000)]  # several requests' worth, alive at once
        del burst
    finally:
        gc.callbacks.remove(seen)
    assert collections == []
    assert gc.get_threshold()[0] == YOUNG_GC_THRESHOLD >= 5_000
