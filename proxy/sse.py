"""An incremental parser for server-sent events (the WHATWG HTML "event stream" format).

The relay passes upstream bytes to the client untouched; this parser only watches them (for the
throughput watchdog), so it must cost little and never hold much:

- Linear time: each chunk is scanned once for line ends, and only the unfinished line at its end
  is kept (in a bytearray, extended in place). The old parser appended every chunk to a bytes
  buffer and rescanned it from the start, which is quadratic in the length of a line.
- Bounded memory: an event (its data lines so far plus the line in progress) may hold at most
  `max_event_bytes`. Past that the parser stops keeping its bytes, skips to the end of the event
  and reports it as one `SSEEvent` with `oversize=True` and no data: a well-formed answer, not a
  buffer that grows with whatever the upstream sends. Parsing resumes with the next event.
- The format as specified: lines end in CRLF, LF or CR (also when a CRLF is split between two
  chunks); a line starting with ":" is a comment; "field: value" loses one leading space; several
  `data:` lines of one event are joined with "\\n"; a blank line dispatches the event, and only if
  it had data; `event:` names it (default "message"); `id:` sets the last event id (kept across
  events, ignored when it holds NUL); `retry:` takes only digits. A leading BOM is dropped. Bytes
  are decoded as UTF-8 per line, so a character split between chunks decodes whole. An event not
  ended by a blank line when the stream stops is never dispatched.

`work` counts the bytes the parser scanned or copied: the tests compare it across input sizes to
check the complexity without timing anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from proxy import untrusted

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "SSEEvent", "SSEParser"]

DEFAULT_MAX_EVENT_BYTES = 1 << 20
"""1 MiB: chat and Responses events are tokens (a few hundred bytes); a megabyte is no longer a
delta worth inspecting, and 512 streams at the ceiling still fit in memory."""

_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"
_LF = 0x0A
_COLON = 0x3A


@dataclass(frozen=True, slots=True)
class SSEEvent:
    data: str
    """The event's data lines joined with "\\n" (empty for an oversize event)."""
    event: str = "message"
    id: str | None = None
    """The last event id seen so far in the stream, if any."""
    oversize: bool = False
    """The event was larger than the parser's bound: its data was dropped, not kept."""

    def json_object(self) -> dict[str, Any] | None:
        """The data as a JSON object; None for `[DONE]`, non-objects, invalid JSON and oversize events."""
        if self.oversize or not self.data or self.data == "[DONE]":
            return None
        # Read as a whole answer is (orjson first): the relay reads every event it passes on.
        parsed = untrusted.read_answer(self.data)
        return parsed if isinstance(parsed, dict) else None


class SSEParser:
    """Feed it the bytes of one stream, in any chunking; it returns the events each chunk completed."""

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        if max_event_bytes < 1:
            raise ValueError("max_event_bytes must be positive")
        self.max_event_bytes = max_event_bytes
        self.retry_ms: int | None = None
        """The last `retry:` value, if any."""
        self.work = 0
        """Bytes scanned or copied so far (a cost measure for tests, not a size)."""
        self.oversize_events = 0
        self._line = bytearray()  # the unfinished line (never holds a line end)
        self._data: list[bytes] = []  # the current event's data lines
        self._size = 0  # bytes the current event holds: its data lines (+1 each for the "\n")
        self._event_type = b""
        self._last_id: str | None = None
        self._skipping = False  # inside an oversize event: keep nothing until its blank line
        self._skipped_line = 0  # while skipping: length of the current line (only blank or not matters)
        self._after_cr = False  # the last chunk ended in CR: an LF starting the next one belongs to it
        self._first_line = True  # a BOM may start it

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        start = 0
        size = len(chunk)
        if self._after_cr and size:
            self._after_cr = False
            if chunk[0] == _LF:
                start = 1
        self.work += size - start
        for match in _LINE_END.finditer(chunk, start):
            end = match.start()
            if self._skipping:
                blank = self._skipped_line == 0 and end == start
                self._skipped_line = 0
                if blank:
                    self._end_oversize(events)
            elif self._line:
                self._line += chunk[start:end]
                self.work += len(self._line)
                line = bytes(self._line)
                self._line.clear()
                self._handle(line, events)
            else:
                self.work += end - start
                self._handle(chunk[start:end], events)
            start = match.end()
            if start == size and match.group() == b"\r":
                self._after_cr = True
        if start < size:
            if self._skipping:
                self._skipped_line += size - start
            else:
                self.work += size - start
                self._line += memoryview(chunk)[start:]  # no intermediate copy of the slice
                if self._size + len(self._line) > self.max_event_bytes:
                    self._skipped_line = len(self._line)
                    self._start_skipping()
        return events

    # -- one line -------------------------------------------------------------------------------

    def _handle(self, line: bytes, events: list[SSEEvent]) -> None:
        if self._first_line:
            self._first_line = False
            if line.startswith(_BOM):
                line = line[len(_BOM) :]
        if not line:
            self._dispatch(events)
            return
        if line[0] == _COLON:
            return  # a comment (pings are comments)
        field, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        self.work += len(value)
        if field == b"data":
            self._size += len(value) + 1
            if self._size > self.max_event_bytes:
                self._skipped_line = 0  # this line has ended: a blank line next ends the event
                self._start_skipping()
            else:
                self._data.append(value)
        elif field == b"event":
            self._event_type = value
        elif field == b"id" and b"\x00" not in value:
            self._last_id = value.decode("utf-8", "replace")
        elif field == b"retry" and value.isdigit():
            self.retry_ms = int(value)
        # Any other field (and an id with NUL, a retry that is not digits) is ignored, as specified.

    def _dispatch(self, events: list[SSEEvent]) -> None:
        data, self._data, self._size = self._data, [], 0
        event_type, self._event_type = self._event_type, b""
        if not data:
            return  # a blank line after no data lines dispatches nothing
        joined = b"\n".join(data)
        self.work += len(joined)
        events.append(
            SSEEvent(
                joined.decode("utf-8", "replace"),
                event_type.decode("utf-8", "replace") or "message",
                self._last_id,
            )
        )

    # -- oversize events ------------------------------------------------------------------------

    def _start_skipping(self) -> None:
        self._skipping = True
        self._line = bytearray()  # a fresh one: clear() would keep the large allocation
        self._data, self._size = [], 0

    def _end_oversize(self, events: list[SSEEvent]) -> None:
        self._skipping = False
        self.oversize_events += 1
        event_type, self._event_type = self._event_type, b""
        events.append(
            SSEEvent("", event_type.decode("utf-8", "replace") or "message", self._last_id, oversize=True)
        )
