"""The process's heap settings (proxy.serve.settle_heap): what a serving process sets up once."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.serve import YOUNG_GC_THRESHOLD, settle_heap

ROOT = Path(__file__).resolve().parent.parent


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


FAULTS_PER_BURST = """
import resource, sys
if sys.argv[1] == "settled":
    from proxy.serve import settle_heap
    settle_heap()

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def burst():
    held = [b"x" * 400_000 for _ in range(8)]  # a few coding agents' request bodies at once
    del held

burst()
before = faults()
for _ in range(20):
    burst()
print((faults() - before) / 20)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's allocator and Linux's fault counts")
def test_memory_a_request_frees_is_kept_for_the_next_one() -> None:
    """A coding agent's request passes through as several 400 KB buffers. Left to its defaults,
    glibc gave them back to the system as they were freed, and every next request faulted the same
    pages in again (a page fault per 4 KB: half the proxy's CPU on such a request). A process set up
    for serving keeps them. (In processes of their own: the allocator's settings are for life.)"""

    def faults_per_burst(mode: str) -> float:
        run = subprocess.run(
            [sys.executable, "-c", FAULTS_PER_BURST, mode],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        return float(run.stdout)

    assert faults_per_burst("plain") > 100  # (what the test stands on: the default gives memory back)
    assert faults_per_burst("settled") < 10
