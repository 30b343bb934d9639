"""The SSE parser (proxy/sse.py): the event-stream format as specified, linear cost, bounded memory.

The complexity checks count the bytes the parser scans or copies (`work`) for an input and for one
twice its size, in the same chunking: linear code does about twice the work, quadratic code four
times. The same measure applied to the parser this module replaced shows the quadratic growth, so
the measure is shown to tell them apart. Nothing here is timed.
"""

from __future__ import annotations

import json
import math
import random
import tracemalloc

import pytest

from proxy.sse import SSEEvent, SSEParser


def parse(*chunks: bytes, **kwargs: int) -> list[SSEEvent]:
    parser = SSEParser(**kwargs)
    events: list[SSEEvent] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    return events


def datas(*chunks: bytes) -> list[str]:
    return [e.data for e in parse(*chunks)]


def bytewise(stream: bytes) -> list[SSEEvent]:
    return parse(*(stream[i : i + 1] for i in range(len(stream))))


# -- the format -------------------------------------------------------------------------------------


def test_one_event_per_blank_line() -> None:
    assert datas(b"data: a\n\ndata: b\n\n") == ["a", "b"]


def test_multi_line_data_is_joined_with_newlines() -> None:
    stream = b'data: {"a":\ndata:  1}\n\n'
    [event] = parse(stream)
    assert event.data == '{"a":\n 1}'
    assert event.json_object() == {"a": 1}


def test_one_leading_space_is_removed_and_no_more() -> None:
    assert datas(b"data:a\n\ndata:  b\n\ndata:\n\ndata\n\n") == ["a", " b", "", ""]


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_every_line_ending(end: bytes) -> None:
    stream = b"data: a" + end + b"data: b" + end + end + b": ping" + end + b"data: c" + end + end
    assert datas(stream) == ["a\nb", "c"]
    assert [e.data for e in bytewise(stream)] == ["a\nb", "c"]


def test_a_crlf_split_between_chunks_is_one_line_end() -> None:
    # Were the LF read as a second line end, the blank line would dispatch "a" on its own.
    assert datas(b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n") == ["a\nb"]


def test_comments_unknown_fields_and_blank_lines_without_data_dispatch_nothing() -> None:
    assert parse(b": ping\n\n: ping\n\nfoo: bar\n\n\n\nevent: x\n\n") == []


def test_event_type_resets_and_last_id_persists() -> None:
    events = parse(
        b"event: delta\nid: 7\ndata: a\n\ndata: b\n\nid: 8\x00\ndata: c\n\nretry: 250\nretry: x\n\n"
    )
    assert [(e.event, e.id, e.data) for e in events] == [
        ("delta", "7", "a"),
        ("message", "7", "b"),
        ("message", "7", "c"),  # an id holding NUL is ignored
    ]


def test_retry_takes_only_digits() -> None:
    parser = SSEParser()
    parser.feed(b"retry: 250\n\nretry: 1x\n\n")
    assert parser.retry_ms == 250


def test_a_leading_bom_is_dropped() -> None:
    assert datas(b"\xef\xbb\xbfdata: a\n\n") == ["a"]
    assert datas(b"\xef\xbb", b"\xbfdata: a\n\n") == ["a"]


def test_an_event_not_ended_by_a_blank_line_is_never_dispatched() -> None:
    assert datas(b"data: a\n\ndata: b\n") == ["a"]


def test_a_character_split_between_chunks_decodes_whole() -> None:
    text = "héllo 世界"
    raw = f"data: {text}\n\n".encode()
    assert [e.data for e in bytewise(raw)] == [text]


def test_any_chunking_gives_the_same_events() -> None:
    rng = random.Random(5)
    parts = []
    for i in range(200):
        end = rng.choice([b"\n", b"\r\n", b"\r"])
        payload = json.dumps({"choices": [{"delta": {"content": f"tok{i} é"}}]}).encode()
        lines = [b"data: " + payload[:10], b"data:" + payload[10:]] if i % 3 == 0 else [b"data: " + payload]
        if i % 5 == 0:
            lines.insert(0, b": ping")
        parts.append(end.join(lines) + end + end)
    stream = b"".join(parts)
    whole = parse(stream)
    assert len(whole) == 200
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(stream)), 300))
        chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
        assert parse(*chunks) == whole


def test_json_object_of_a_chat_chunk_and_what_is_not_one() -> None:
    assert SSEEvent('{"choices": []}').json_object() == {"choices": []}
    for data in ("[DONE]", "[1, 2]", "not json", "", '"text"'):
        assert SSEEvent(data).json_object() is None
    assert SSEEvent("", oversize=True).json_object() is None


def test_an_event_is_read_as_the_clients_libraries_read_it() -> None:
    """orjson reads events first (the relay reads every one it passes on); what it refuses and the
    standard parser still reads, as the clients' own libraries do, is still an object."""
    assert math.isnan(SSEEvent('{"x": NaN}').json_object()["x"])  # type: ignore[index]
    assert SSEEvent('{"x": -Infinity}').json_object() == {"x": float("-inf")}
    assert SSEEvent('{"usage": {"total_tokens": 12}}').json_object() == {"usage": {"total_tokens": 12}}
    assert SSEEvent("[" * 100_000 + "]" * 100_000).json_object() is None  # deeper than either goes
    assert SSEEvent('{"x": 1').json_object() is None


# -- the bound --------------------------------------------------------------------------------------


def test_an_oversize_event_is_reported_and_parsing_resumes() -> None:
    big = b"data: " + b"x" * 5000 + b"\n"
    stream = b"data: before\n\n" + big + b"data: more\n\n" + b"event: t\ndata: after\n\n"
    for events in (parse(stream, max_event_bytes=1024), parse(*[stream[i : i + 7] for i in range(0, len(stream), 7)], max_event_bytes=1024)):  # fmt: skip
        assert [(e.data, e.oversize) for e in events] == [("before", False), ("", True), ("after", False)]
        assert events[2].event == "t"


def test_many_small_data_lines_add_up_to_an_oversize_event() -> None:
    stream = b"data: 0123456789\n" * 200 + b"\ndata: ok\n\n"
    events = parse(stream, max_event_bytes=1024)
    assert [(e.data, e.oversize) for e in events] == [("", True), ("ok", False)]


def test_an_endless_line_keeps_memory_at_the_bound() -> None:
    """10 MiB of one line without a line end: the parser holds at most about its bound."""
    bound = 64 * 1024
    parser = SSEParser(max_event_bytes=bound)
    chunk = b"data: " + b"y" * 4090
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        for _ in range(2560):
            assert parser.feed(chunk) == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - base < 4 * bound
    assert parser.feed(b"\n\ndata: next\n\n") == [SSEEvent("", oversize=True), SSEEvent("next")]
    assert parser.oversize_events == 1


# -- the cost ---------------------------------------------------------------------------------------


class _OldParser:
    """The parser this module replaced (proxy/pipeline.py `_SSEParser`), with its work counted the
    same way: bytes copied by `+=` and `partition`, bytes scanned by `in`."""

    def __init__(self) -> None:
        self._buffer = b""
        self.work = 0

    def feed(self, chunk: bytes) -> None:
        self._buffer += chunk
        self.work += len(self._buffer)
        while True:
            self.work += len(self._buffer)  # the `b"\n" in buffer` scan
            if b"\n" not in self._buffer:
                return
            _, _, self._buffer = self._buffer.partition(b"\n")
            self.work += len(self._buffer)


def _one_long_event(size: int) -> list[bytes]:
    """A single data line of `size` bytes in 256-byte chunks: the old parser's worst case."""
    body = b"data: " + b"z" * size + b"\n\n"
    return [body[i : i + 256] for i in range(0, len(body), 256)]


def _many_small_events(size: int) -> list[bytes]:
    event = b'data: {"choices":[{"delta":{"content":"tok"}}]}\n\n'
    stream = event * (size // len(event))
    return [stream[i : i + 100] for i in range(0, len(stream), 100)]


def _work(parser: SSEParser | _OldParser, chunks: list[bytes]) -> int:
    for chunk in chunks:
        parser.feed(chunk)
    return parser.work


@pytest.mark.parametrize("shape", [_one_long_event, _many_small_events])
def test_twice_the_input_costs_twice_the_work(shape: object) -> None:
    assert callable(shape)
    size = 192 * 1024
    single = _work(SSEParser(), shape(size))
    double = _work(SSEParser(), shape(2 * size))
    assert single >= size  # every byte is looked at
    assert 1.8 < double / single < 2.2


def test_the_work_measure_exposes_a_quadratic_parser() -> None:
    size = 192 * 1024
    single = _work(_OldParser(), _one_long_event(size))
    double = _work(_OldParser(), _one_long_event(2 * size))
    assert double / single > 3.5
    assert single > 50 * _work(SSEParser(), _one_long_event(size))
