"""The benchmark's own logic, where a mistake would report a figure it did not measure."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "proxy.py"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_proxy_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_every_recording_pair_sets_recording_off_on_exactly_its_other_instance(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each pair must be one instance recording and one not: a pair of two recording instances
    is an A/A, and folded into the figure it pulls recording's cost towards nothing."""
    started: list[tuple[int, str]] = []  # (pair, the config it was started with)
    pair = 0

    def start(self: Any, name: str, cmd: list[str], **_: Any) -> None:
        config = Path(cmd[cmd.index("--config") + 1]).read_text()
        started.append((pair, config))

    def measure(targets: dict[str, Any], *_: Any) -> dict[str, list[dict[str, float]]]:
        nonlocal pair
        pair += 1
        return {name: [{"rps": 1.0, "cpu_us": 1.0}] for name in targets}

    monkeypatch.setattr(bench.Processes, "start", start)
    monkeypatch.setattr(bench.Processes, "session", lambda self, name: 0)
    monkeypatch.setattr(bench.Processes, "stop_all", lambda self: None)
    monkeypatch.setattr(bench, "wait_port", lambda port, timeout=30.0: True)
    monkeypatch.setattr(bench, "measure", measure)

    measured = bench.recording_pairs(tmp_path, pairs=5, rounds=1, seconds=1)

    assert len(measured.rps) == 5
    for n in range(5):
        configs = [config for p, config in started if p == n]
        assert len(configs) == 2
        off = [config for config in configs if "request_history = 0\n" in config]
        assert len(off) == 1, f"pair {n}: {len(off)} of its two instances record nothing"

    control = bench.recording_pairs(tmp_path, pairs=3, rounds=1, seconds=1, control=True)
    assert len(control.rps) == 3
    assert not any("request_history" in config for p, config in started if p >= 5)
