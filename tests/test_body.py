"""proxy/body.py: a request body is parsed once and sent on with only its model changed."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy import untrusted
from proxy.body import _LAZY_FROM, READ_MEMBERS, RequestBody, _read_members, parse

PAD = ("pad", "p" * _LAZY_FROM)
"""A member that makes a body large enough to be read by simdjson rather than orjson."""


def sent(raw: bytes, model: str = "m-up") -> bytes:
    document, exact = parse(raw)
    return RequestBody(raw, document, exact=exact).for_model(model)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(b'{"model": "p/m"}', b'{"model": "m-up"}', id="only"),
        pytest.param(b'{"messages": [], "model":"p/m"}', b'{"messages": [], "model":"m-up"}', id="last"),
        pytest.param(
            b'{ "stream" : true ,\n  "model"\t:\r\n "p/m" }\n',
            b'{ "stream" : true ,\n  "model"\t:\r\n "m-up" }\n',
            id="whitespace",
        ),
        pytest.param(
            b'{"x": "\\\\", "model": "p/\\"q\\"\\\\"}', b'{"x": "\\\\", "model": "m-up"}', id="escapes"
        ),
        pytest.param(
            b'{"model": "p/m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}',
            b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "model": "m-up"}',
            id="first-goes-last",
        ),
        pytest.param(
            b'{"model": "p/m", "big": 123456789012345678901234567890, "z": -0, "f": 1.50}',
            b'{"big": 123456789012345678901234567890, "z": -0, "f": 1.50, "model": "m-up"}',
            id="numbers-as-sent",
        ),
        pytest.param(
            b'{"messages": [], "model": "p/m", "stream": true}',
            b'{"messages": [], "model": "m-up", "stream": true}',
            id="middle",
        ),
        pytest.param(
            '{"a": "naïve ✓", "model": "p/é", "b": "ü"}'.encode(),
            '{"a": "naïve ✓", "model": "m-up", "b": "ü"}'.encode(),
            id="middle-utf8",
        ),
        pytest.param(
            b'{"a": {"model": "p/n"}, "model": "p/m", "c": [{"model": "p/m"}]}',
            b'{"a": {"model": "p/n"}, "model": "m-up", "c": [{"model": "p/m"}]}',
            id="nested-keys-untouched",
        ),
        pytest.param(
            b'{"model":"p/m","messages":[],"max_tokens":1}',
            b'{"messages":[],"max_tokens":1, "model": "m-up"}',
            id="compact-first-goes-last",
        ),
        pytest.param(
            b'{"model":"p/m","x":1,"model":"p/m"}',
            b'{"x":1,"model":"p/m", "model": "m-up"}',
            id="compact-first-repeated",
        ),
        pytest.param(
            b'{"model":"p\\/m","x":1}',
            b'{"x":1, "model": "m-up"}',
            id="compact-first-escaped",
        ),
        pytest.param(b'{"model":"p/m", "x":1}', b'{"x":1, "model": "m-up"}', id="compact-first-then-space"),
        pytest.param(
            b'{"model": "p/m", "k": "\\", \\"model\\": \\"p/m"}',
            b'{"k": "\\", \\"model\\": \\"p/m", "model": "m-up"}',
            id="a-string-that-looks-like-the-member",
        ),
    ],
)
def test_the_body_is_the_clients_bytes_with_only_the_model_changed(raw: bytes, expected: bytes) -> None:
    assert sent(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "p/x", "model": "p/m"}',
        b'{"model": "p/m", "messages": [], "model": "p/m", "x": 1}',
        b'{"a": 1, "model": "p/m", "b": 2, "model": "p/m", "c": 3}',
        b'{"a": 1, "\\u006dodel": "p/m", "model": "p/m", "c": 3}',
        b'{"a": 1, "model": "p/m", "model": "p/m", "c": {"model": "p/m"}}',
    ],
)
def test_a_repeated_model_key_is_read_as_the_attempts_model(raw: bytes) -> None:
    """A reader that takes the last of repeated keys (as this proxy reads the client's body, and as
    JavaScript, Python and Go read JSON) reads the attempt's model, whatever the client repeated."""
    out = sent(raw)
    assert json.loads(out)["model"] == "m-up"
    assert {k: v for k, v in json.loads(out).items() if k != "model"} == {
        k: v for k, v in json.loads(raw).items() if k != "model"
    }


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "p/m", "x": "\\ud800"}',  # a lone surrogate: the standard parser's reading
        b'\xef\xbb\xbf{"model": "p/m", "x": 1}',  # a byte order mark, which orjson refuses
    ],
)
def test_bodies_only_the_standard_parser_reads_are_encoded_again(raw: bytes) -> None:
    out = sent(raw)
    assert out.startswith(b'{"model": "m-up", ')
    assert json.loads(out) == {"model": "m-up", "x": json.loads(raw.decode("utf-8-sig"))["x"]}


def test_a_lone_surrogate_goes_on_escaped_as_it_came() -> None:
    out = sent(b'{"model": "p/m", "x": "\\ud800"}')
    assert b"\\ud800" in out
    assert json.loads(out)["x"] == "\ud800"


def test_an_integer_past_64_bits_is_never_rounded() -> None:
    """orjson reads it as a float: no path may send that reading on."""
    for raw in (
        b'{"model": "p/m", "seed": 123456789012345678901234567890}',
        b'{"seed": 123456789012345678901234567890, "model": "p/m", "s": 1, "model": "p/m", "t": 2}',
    ):
        assert json.loads(sent(raw))["seed"] == 123456789012345678901234567890


def test_each_attempt_gets_its_own_model_from_the_same_body() -> None:
    raw = b'{"model": "combo", "messages": []}'
    document, exact = parse(raw)
    body = RequestBody(raw, document, exact=exact)
    assert json.loads(body.for_model("a")) == {"messages": [], "model": "a"}
    assert json.loads(body.for_model('b"\u00e9')) == {"messages": [], "model": 'b"\u00e9'}
    assert json.loads(body.for_model("a")) == {"messages": [], "model": "a"}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"a": 1}', True),
        (b'"\\ud800"', True),  # legal JSON that orjson refuses
        (b"\xef\xbb\xbf{}", True),  # as the standard parser has always read it
        (b"{", False),
        (b"NaN", False),
        (b"", False),
        (b"\xff", False),
    ],
)
def test_parse_reads_as_the_standard_parser_does(raw: bytes, expected: bool) -> None:
    try:
        parse(raw)
    except (ValueError, RecursionError):
        assert not expected
    else:
        assert expected


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["model", "a", "m"]) | st.text(), inner, max_size=3)
    ),
    max_leaves=12,
)


@given(
    members=st.lists(
        st.tuples(st.sampled_from(["a", "messages", "model", "x"]) | st.text(), json_values), max_size=5
    ),
    model=st.text(min_size=1),
    position=st.integers(0, 5),
    indent=st.sampled_from([None, 0, 2]),
    ascii_only=st.booleans(),
    large=st.booleans(),
)
def test_any_body_reads_as_the_clients_with_the_attempts_model(
    members: list[tuple[str, object]],
    model: str,
    position: int,
    indent: int | None,
    ascii_only: bool,
    large: bool,
) -> None:
    members.insert(min(position, len(members)), ("model", model))
    if large:
        members.insert(position % (len(members) + 1), PAD)
    text = ", ".join(
        f"{json.dumps(k, ensure_ascii=ascii_only)}: {json.dumps(v, indent=indent, ensure_ascii=ascii_only)}"
        for k, v in members
    )
    raw = ("{" + text + "}").encode("utf-8", "surrogatepass")
    try:
        document, exact = parse(raw)
    except ValueError:
        return  # a lone surrogate written raw is not UTF-8: the proxy answers 400
    if not isinstance(document.get("model"), str):
        return  # the last `model` the client repeated is not a name: the proxy answers 400
    out = RequestBody(raw, document, exact=exact).for_model("up/m")
    expected = {k: v for k, v in json.loads(raw).items() if k != "model"}
    assert json.loads(out) == {**expected, "model": "up/m"}


@given(
    members=st.lists(
        st.tuples(st.sampled_from(["a", "messages", "model"]) | st.text(), json_values), max_size=4
    ),
    model=st.text(min_size=1),
    large=st.booleans(),
)
def test_a_compact_body_with_the_model_first_reads_with_the_attempts_model(
    members: list[tuple[str, object]], model: str, large: bool
) -> None:
    # The spelling of the JavaScript SDKs and most agents: no spaces, `model` first.
    raw = json.dumps(
        dict([("model", model), *members, *([PAD] if large else [])]), separators=(",", ":")
    ).encode()
    document, exact = parse(raw)
    if not isinstance(document.get("model"), str):
        return
    out = RequestBody(raw, document, exact=exact).for_model("up/m")
    expected = {k: v for k, v in json.loads(raw).items() if k != "model"}
    assert json.loads(out) == {**expected, "model": "up/m"}


@given(st.text())
def test_a_model_is_written_as_json_dumps_writes_it(model: str) -> None:
    # untrusted.dumps writes a lone string without json.dumps's encoder object: the same bytes,
    # UTF-8, or every non-ASCII character escaped when a lone surrogate keeps UTF-8 out.
    text = json.dumps(model, ensure_ascii=False)
    try:
        expected = text.encode()
    except UnicodeEncodeError:
        expected = json.dumps(model, ensure_ascii=True).encode()
    assert untrusted.dumps(model) == expected


_DOCUMENTS = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)  # past 64 bits too: orjson refuses those
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),  # lone surrogates too: UTF-8 cannot hold them
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@given(_DOCUMENTS)
def test_any_document_is_written_as_the_same_json(document: object) -> None:
    # orjson first, the standard writer for what it refuses: either way the same document.
    written = untrusted.dumps(document)
    assert json.loads(written) == document


def _orjson_members(raw: bytes) -> dict[str, object] | None:
    """READ_MEMBERS as the pipeline reads them from orjson's document (None: orjson refuses it, or
    it is not an object), nested values as `()`, as `_read_members` gives them."""
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(document, dict):
        return None
    return {
        name: () if isinstance(document[name], dict | list) else document[name]
        for name in READ_MEMBERS
        if name in document
    }


@given(
    document=st.dictionaries(st.sampled_from(["model", "stream", "a"]) | st.text(), json_values, max_size=5),
    repeat=st.sampled_from([None, "model", "stream"]),
    cut=st.integers(0, 200),
    insert=st.binary(max_size=3),
    drop=st.integers(0, 3),
)
def test_simdjson_reads_the_members_as_orjson_does_or_leaves_the_body_to_it(
    document: dict[str, object], repeat: str | None, cut: int, insert: bytes, drop: int
) -> None:
    """Whatever simdjson reads of a body, valid or mangled, orjson reads the same (last of repeated
    members included); where they could differ, simdjson leaves it to orjson."""
    raw = json.dumps(document, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if repeat is not None:
        raw = raw[:-1] + (b", " if document else b"") + f'"{repeat}": "again"}}'.encode()
    at = min(cut, len(raw))
    mangled = raw[:at] + insert + raw[at + drop :]
    for body in (raw, mangled):
        members = _read_members(body)
        if members is not None:
            expected = _orjson_members(body)
            assert expected is not None, body
            assert {k: v for k, v in members.items() if v is not None} == {
                k: v for k, v in expected.items() if v is not None
            }


@pytest.mark.parametrize(
    ("raw", "model", "stream", "exact"),
    [
        pytest.param(
            b'{"model": "p/m", "stream": true, "pad": "%s"}', "p/m", True, False, id="read-by-simdjson"
        ),
        pytest.param(
            b'{"model": "p/a", "pad": "%s", "model": "p/b"}', "p/b", None, False, id="repeated-last-wins"
        ),
        pytest.param(
            b'{"model": {"p": 1}, "stream": [true], "pad": "%s"}', "nested", "nested", False, id="nested"
        ),
        pytest.param(
            b'\xef\xbb\xbf{"model": "p/m", "pad": "%s"}', "p/m", None, True, id="bom-standard-parser"
        ),
        pytest.param(
            b'{"model": "p/m", "x": "\\ud800", "pad": "%s"}',
            "p/m",
            None,
            True,
            id="surrogate-standard-parser",
        ),
        pytest.param(
            b'{"model": "p/m", "seed": 123456789012345678901234567890, "pad": "%s"}',
            "p/m",
            None,
            False,
            id="bigint",
        ),
    ],
)
def test_a_large_body_reads_as_a_small_one(raw: bytes, model: str, stream: object, exact: bool) -> None:
    body = raw % (b"p" * _LAZY_FROM)
    document, was_exact = parse(body)
    assert was_exact is exact
    read = document.get("model")
    assert (read if isinstance(read, str) else "nested") == model
    flag = document.get("stream")
    assert (flag if flag is None or flag is True else "nested") == stream
    assert json.loads(RequestBody(body, document, was_exact).for_model("up/m"))["model"] == "up/m"


def test_a_large_body_that_is_not_an_object_is_not_read_as_one() -> None:
    document, _ = parse(b'["model", "%s"]' % (b"p" * _LAZY_FROM))
    assert isinstance(document, list)
