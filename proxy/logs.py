"""What an instance writes to its log, and in which format.

`omniroute serve` runs headless, so its log is the operator's only view of the engine: every state
change on the event bus (breaker transitions, cooldowns, terminal states, lockouts, settings
changes, operator actions) becomes one INFO line, and `--log-format json` writes one JSON object
per line (`ts`, `level`, `logger`, `message`, plus the event's fields) for a log collector.

The bus calls its subscribers inline on the request path, so the subscriber does the least it
can: nothing at all when INFO is off, else one formatted line per event.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Final, Literal, TextIO

from proxy.resilience.events import Event, EventBus
from proxy.resilience.timefmt import iso

__all__ = [
    "EVENT_LOGGER",
    "FORMATS",
    "LEVELS",
    "JsonFormatter",
    "configure",
    "event_message",
    "log_events",
    "set_level",
    "uvicorn_level",
]

Level = Literal["debug", "info", "warning", "error"]
Format = Literal["text", "json"]

LEVELS: Final[tuple[Level, ...]] = ("debug", "info", "warning", "error")
FORMATS: Final[tuple[Format, ...]] = ("text", "json")

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(message)s"

EVENT_LOGGER: Final = "omniroute.events"
"""The logger the bus's events are written to (a child of "omniroute", so one level governs both)."""

_EVENT_FIELDS: Final = ("seq", "layer", "key", "from", "to", "reason")
"""An event's fields in a JSON log line (its `ts` is the line's own: the two are the same instant)."""


def set_level(level: Level) -> None:
    """The level for the process's log: the root logger, which every other one inherits."""
    logging.getLogger().setLevel(level.upper())


def configure(level: Level = "info", fmt: Format = "text", stream: TextIO | None = None) -> None:
    """One handler on the root logger writing `fmt` lines to `stream` (stderr), at `level`."""
    handler = BackgroundHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in root.handlers:
        if isinstance(old, BackgroundHandler):
            old.close()
    root.handlers = [handler]
    set_level(level)


QUEUED_LINES: Final = 10_000
"""The most log lines waiting for a reader that does not keep up; past it they are dropped, counted."""
FLUSH_S: Final = 0.5
"""How long `flush` (and the interpreter's exit, through `logging.shutdown`) waits for the lines
still queued: a reader that stopped reading must not hold up a clean stop."""


class BackgroundHandler(logging.Handler):
    """Writes the log's lines to `stream` from a thread of its own.

    The log is written where the operator points stderr: a terminal, a file, or a pipe to whatever
    reads it (`| tee`, a log shipper, `2>&1 | less` left paused). A reader that stops reading fills
    the pipe, and a write to a full pipe blocks: written from the event loop, every log line would
    stop the proxy for as long as the reader sleeps. Here the loop only queues the line; a reader
    that never comes back costs QUEUED_LINES lines of memory, then lines dropped and counted (the
    count is written where the gap is, once lines go through again)."""

    def __init__(self, stream: TextIO, capacity: int = QUEUED_LINES) -> None:
        super().__init__()
        self.stream = stream
        self._capacity = capacity
        self._lines: deque[str] = deque()
        self._dropped = 0
        self._writing = False
        self._closed = False
        self._changed = threading.Condition(threading.Lock())
        threading.Thread(target=self._write_lines, name="omniroute-log", daemon=True).start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:
            self.handleError(record)
            return
        with self._changed:
            if self._dropped and len(self._lines) + 2 <= self._capacity:
                self._lines.append(self._gap(self._dropped))
                self._dropped = 0
            if self._dropped or len(self._lines) >= self._capacity:
                self._dropped += 1
                return
            self._lines.append(line)
            self._changed.notify_all()

    def _gap(self, dropped: int) -> str:
        notice = logging.makeLogRecord(
            {
                "name": "omniroute",
                "levelno": logging.WARNING,
                "levelname": "WARNING",
                "msg": f"{dropped} log line{'s' if dropped != 1 else ''} dropped here: the log's reader did not keep up",
            }
        )
        return self.format(notice) + "\n"

    def _write_lines(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._lines) or self._closed)
                if not self._lines:
                    return  # closed, and everything written
                text = "".join(self._lines)
                self._lines.clear()
                self._writing = True
            try:
                self.stream.write(text)
                self.stream.flush()
            except Exception:  # a stream that fails every write (a closed pipe): nothing to tell
                pass
            finally:
                with self._changed:
                    self._writing = False
                    self._changed.notify_all()

    def flush(self, timeout: float = FLUSH_S) -> None:
        """Wait until the lines queued so far are written, or `timeout` passed."""
        with self._changed:
            self._changed.wait_for(lambda: not self._lines and not self._writing, timeout)

    def close(self) -> None:
        self.flush()
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        super().close()


def uvicorn_level() -> str:
    """uvicorn's own level for the process's: its INFO lines only repeat our start line, so it stays at
    WARNING unless DEBUG was asked for."""
    effective = logging.getLogger("omniroute").getEffectiveLevel()
    if effective <= logging.DEBUG:
        return "debug"
    return "error" if effective >= logging.ERROR else "warning"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: `ts` (ISO 8601 UTC, as the API writes instants), `level`, `logger`,
    `message`, the event's fields for an event, and `exception` when there is one.

    ASCII only: names and reasons are untrusted text, and escaped they cannot break a line or reach
    the terminal that tails the log as control characters.
    """

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": iso(record.created * 1000),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        event = getattr(record, "event", None)
        if isinstance(event, Event):
            fields = event.to_dict()
            doc.update((name, fields[name]) for name in _EVENT_FIELDS)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=True)


def _printable(text: str) -> str:
    """Untrusted text (a client's model name, an upstream's error) as one line without control characters."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def event_message(event: Event) -> str:
    """`breaker flaky: CLOSED -> OPEN (503 server_error)`; an operator action as its CLI command."""
    reason = f" ({_printable(event.reason)})" if event.reason else ""
    if event.layer == "operator":  # the engine names an action by its CLI command, the reason is the source
        return f"operator: omniroute {_printable(event.key)}{reason}"
    change = f"{_printable(event.from_)} -> {_printable(event.to)}"
    return f"{event.layer} {_printable(event.key)}: {change}{reason}"


def log_events(bus: EventBus, logger: logging.Logger | None = None) -> Callable[[], None]:
    """Write every event published on `bus` to the log at INFO; returns the unsubscribe function."""
    log = logger if logger is not None else logging.getLogger(EVENT_LOGGER)

    def write(event: Event) -> None:
        if log.isEnabledFor(logging.INFO):  # cached by logging: off costs one dict lookup
            log.info("%s", event_message(event), extra={"event": event})

    return bus.subscribe(write)
