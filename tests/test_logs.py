"""proxy.logs: one line per bus event, untrusted text escaped, JSON lines for a collector."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator

import pytest

from proxy import logs
from proxy.resilience.events import Event, EventBus


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers, root.level = handlers, level


def published(*events: Event, fmt: logs.Format = "text", level: logs.Level = "info") -> list[str]:
    stream = io.StringIO()
    logs.configure(level, fmt, stream)
    bus = EventBus()
    unsubscribe = logs.log_events(bus)
    bus.publish_all(list(events))
    unsubscribe()
    written()
    return stream.getvalue().splitlines()


def written() -> None:
    """What was logged is written (the handler writes from a thread of its own)."""
    for handler in logging.getLogger().handlers:
        handler.flush()


def test_every_layer_is_one_line() -> None:
    lines = published(
        Event(1.0, "breaker", "flaky", "DEGRADED", "OPEN", "failures"),
        Event(2.0, "connection", "rl-1", "active", "banned", "403 banned"),
        Event(3.0, "lockout", "models:models-1:missing-model", "unlocked", "locked", "not_found"),
        Event(4.0, "settings", "modelLockout.enabled", "off", "on", "patch"),
        Event(5.0, "operator", "reenable models/missing-model", "", "", "console"),
    )
    assert [line.split(" INFO ", 1)[1] for line in lines] == [
        "breaker flaky: DEGRADED -> OPEN (failures)",
        "connection rl-1: active -> banned (403 banned)",
        "lockout models:models-1:missing-model: unlocked -> locked (not_found)",
        "settings modelLockout.enabled: off -> on (patch)",
        "operator: omniroute reenable models/missing-model (console)",
    ]


def test_untrusted_text_cannot_break_the_line_or_reach_the_terminal() -> None:
    [line] = published(
        Event(1.0, "lockout", "p:c:m\n2026 INFO forged\x1b]0;x\x07", "unlocked", "locked", "r\u202e")
    )
    assert line.endswith("lockout p:c:m\\n2026 INFO forged\\x1b]0;x\\x07: unlocked -> locked (r\\u202e)")


def test_json_lines_carry_the_event_fields() -> None:
    [line] = published(Event(1.0, "breaker", "flaky", "CLOSED", "DEGRADED", "failures"), fmt="json")
    record = json.loads(line)
    assert record.pop("ts").endswith("Z")
    assert record == {
        "level": "INFO",
        "logger": "omniroute.events",
        "message": "breaker flaky: CLOSED -> DEGRADED (failures)",
        "seq": 1,
        "layer": "breaker",
        "key": "flaky",
        "from": "CLOSED",
        "to": "DEGRADED",
        "reason": "failures",
    }
    assert line.isascii()


def test_json_lines_for_ordinary_records_and_exceptions() -> None:
    stream = io.StringIO()
    logs.configure("info", "json", stream)
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("omniroute").exception("could not persist")
    written()
    record = json.loads(stream.getvalue())
    assert (record["level"], record["logger"], record["message"]) == (
        "ERROR",
        "omniroute",
        "could not persist",
    )
    assert "ValueError: boom" in record["exception"]


def test_above_info_an_event_costs_no_formatting(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(event: Event) -> str:
        raise AssertionError("formatted while INFO is off")

    monkeypatch.setattr(logs, "event_message", fail)
    assert published(Event(1.0, "breaker", "flaky", "CLOSED", "OPEN", "x"), level="warning") == []


@pytest.mark.parametrize(
    ("level", "uvicorn"),
    [("debug", "debug"), ("info", "warning"), ("warning", "warning"), ("error", "error")],
)
def test_uvicorn_follows_the_level_but_keeps_its_start_chatter_out_of_info(
    level: logs.Level, uvicorn: str
) -> None:
    logs.set_level(level)
    assert logs.uvicorn_level() == uvicorn


class _FullPipe(io.StringIO):
    """A stream whose reader stopped reading: every write blocks until `resume` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.resume = threading.Event()

    def write(self, text: str) -> int:
        self.resume.wait()
        return super().write(text)


def test_a_reader_that_stops_reading_never_blocks_the_logger_and_is_told_what_it_missed() -> None:
    """A write to a full pipe blocks; written from the event loop, one log line stopped the proxy
    until the reader came back (`omniroute serve 2>&1 | less`, paused; found by a lifecycle trial)."""
    stream = _FullPipe()
    handler = logs.BackgroundHandler(stream, capacity=10)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("omniroute.test-full-pipe")
    log.propagate, log.handlers = False, [handler]
    try:
        done = threading.Event()

        def lines() -> None:
            for n in range(100):
                log.warning("line %d", n)
            done.set()

        threading.Thread(target=lines, daemon=True).start()
        assert done.wait(5), "logging blocked on a stream nobody reads"
        stream.resume.set()
        handler.flush(5)  # the reader is back, and has read what was queued
        log.warning("after")
        handler.flush(5)
        got = stream.getvalue().splitlines()
        assert "line 0" in got[:2] and "line 99" not in got
        assert got[-2:] == [
            f"{100 - len(got) + 2} log lines dropped here: the log's reader did not keep up",
            "after",
        ]
    finally:
        log.handlers = []
        handler.close()
