"""The one scrubber: configured secrets and credential shapes out of upstream text."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.scrub import REDACTED, Scrubber, StreamScrubber, scrub_shapes

KEY = 'k3y/with"quote-0123'


def test_configured_secrets_as_written_and_as_json_escapes_them() -> None:
    scrub = Scrubber([KEY, None, ""])
    assert scrub(f"bad key {KEY}!") == f"bad key {REDACTED}!"
    assert scrub('{"message": "bad key k3y/with\\"quote-0123"}') == '{"message": "bad key ***"}'
    assert scrub.secrets(f"x{KEY}x".encode()) == b"x***x"


SHORT = {'"': '\\"', "\\": "\\\\", "/": "\\/"}


def escaped(secret: str, ways: list[int]) -> str:
    r"""`secret` with each character written one of the ways a JSON encoder may: as itself (0), as
    `\uXXXX` in lower (1) or upper case (2), or as its short escape (3, where it has one)."""
    out = []
    for char, way in zip(secret, ways, strict=False):
        if way in (1, 2):
            units = [ord(char)] if ord(char) < 0x10000 else [
                0xD800 + ((ord(char) - 0x10000) >> 10), 0xDC00 + ((ord(char) - 0x10000) & 0x3FF)
            ]  # fmt: skip
            text = "".join(f"\\u{u:04x}" for u in units)
            out.append(text.upper().replace("\\U", "\\u") if way == 2 else text)
        elif way == 3 and char in SHORT:
            out.append(SHORT[char])
        else:
            out.append(char)
    return "".join(out)


@settings(max_examples=300, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from([*'abcXYZ019/+=<>&"\\-_.', "é", "ß", "\U0001f600"]),
        min_size=8,
        max_size=40,
    ),
    st.data(),
)
def test_a_secret_is_found_however_a_json_encoder_escaped_it(secret: str, data: st.DataObject) -> None:
    r"""PHP writes `\/`, Go `\u003c` for `<`, some encoders escape every character, others write
    UTF-8 as is: any mix of those, in error text and in relayed content, is replaced whole."""
    ways = data.draw(st.lists(st.integers(0, 3), min_size=len(secret), max_size=len(secret)))
    written = escaped(secret, ways)
    scrub = Scrubber([secret, "another-secret-0123"])
    assert scrub(f'{{"message": "bad key {written}!"}}') == f'{{"message": "bad key {REDACTED}!"}}'
    assert scrub.secrets(f"key={written};".encode()) == f"key={REDACTED};".encode()
    lines = StreamScrubber(scrub)
    event = f'data: {{"error": {{"message": "{written}"}}}}\n\n'.encode()
    assert secret.encode() not in lines.feed(event) + lines.flush()


def test_content_without_a_secret_or_an_odd_escape_is_passed_on_as_it_is() -> None:
    scrub = Scrubber([KEY])
    body = b'{"content": "line\\none \\"quoted\\" \\\\ path"}'
    assert scrub.secrets(body) is body
    assert scrub.secrets(b'{"content": "caf\\u00e9 a\\/b"}') == b'{"content": "caf\\u00e9 a\\/b"}'


def test_shapes_are_replaced_in_error_text_only() -> None:
    text = "sk-ant-api03-abcdefgh and sk-proj-ABCDEFGHIJ and Bearer abc.def-ghi_jkl= and bearer   12345678"
    assert scrub_shapes(text) == "*** and *** and Bearer *** and bearer   ***"
    scrub = Scrubber()
    assert scrub(text) == scrub_shapes(text)
    assert scrub.secrets(text.encode()) == text.encode()  # content is left as it is
    # Not credentials: a short tail, a word that merely contains "sk-", the bare word "Bearer".
    for text in ("sk-short", "task-forcelongword", "Bearer", "the Bearer of news"):
        assert scrub_shapes(text) == text


def test_a_short_secret_is_not_searched_for() -> None:
    assert Scrubber(["abc"])("abcabc") == "abcabc"


def test_longest_secret_first() -> None:
    scrub = Scrubber(["secret-0123", "secret-0123-and-more"])
    assert scrub("secret-0123-and-more") == REDACTED


@settings(max_examples=150, deadline=None)
@given(
    before=st.text(alphabet="abc \n", max_size=40),
    after=st.text(alphabet="abc \n", max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=6),
    error=st.booleans(),
)
def test_a_stream_is_scrubbed_wherever_its_chunks_are_cut(
    before: str, after: str, cuts: list[int], error: bool
) -> None:
    """A key split between two chunks is found: nothing of a line is passed on before its end."""
    middle = (
        f'data: {{"error": "{KEY} sk-ant-api03-xxxxxxxxxx"}}\n'
        if error
        else f"data: {KEY} sk-ant-api03-xxxxxxxxxx\n"
    )
    data = (before + middle + after).encode()
    scrubber = StreamScrubber(Scrubber([KEY]))
    out = b""
    start = 0
    for cut in sorted({min(c, len(data)) for c in cuts}):
        out += scrubber.feed(data[start:cut])
        start = cut
    out += scrubber.feed(data[start:]) + scrubber.flush()
    # The configured key always goes; a shape only from an error event (elsewhere it is content).
    scrubbed_middle = middle.replace(KEY, REDACTED)
    if error:
        scrubbed_middle = scrubbed_middle.replace("sk-ant-api03-xxxxxxxxxx", REDACTED)
    assert out == (before + scrubbed_middle + after).encode()


def test_a_stream_line_longer_than_the_limit_is_passed_on_in_pieces() -> None:
    scrub = Scrubber([KEY])
    scrubber = StreamScrubber(scrub)
    big = b"x" * (StreamScrubber.MAX_PENDING + 1)
    # All but as much as one secret can span: the rest may begin one.
    assert scrubber.feed(big) == big[: len(big) - scrub.reach]
    assert scrubber.feed(b"tail") == b""
    assert scrubber.flush() == big[len(big) - scrub.reach :] + b"tail"


@settings(max_examples=60, deadline=None)
@given(
    at=st.integers(0, 3 * StreamScrubber.MAX_PENDING),
    cuts=st.lists(st.integers(0, 4 * StreamScrubber.MAX_PENDING), max_size=5),
    ways=st.lists(st.integers(0, 3), min_size=len(KEY), max_size=len(KEY)),
    percent=st.booleans(),
    inside=st.floats(0, 1),
)
def test_a_secret_in_an_event_longer_than_the_limit_is_found_wherever_the_chunks_are_cut(
    at: int, cuts: list[int], ways: list[int], percent: bool, inside: float
) -> None:
    """An event too long to hold whole goes on in pieces: a piece never ends inside a secret,
    however it is written, wherever the upstream's reads cut it (one read ends inside it)."""
    written = quote(KEY, safe="") if percent else escaped(KEY, ways)
    text = b"x" * at + written.encode() + b"x" * (3 * StreamScrubber.MAX_PENDING - at)
    data = b"data: " + text + b"\n\n"
    within = len(b"data: ") + at + round(inside * len(written))
    scrubber = StreamScrubber(Scrubber([KEY]))
    out, start = [], 0
    for cut in sorted({min(c, len(data)) for c in [*cuts, within]}):
        out.append(scrubber.feed(data[start:cut]))
        start = cut
    out += [scrubber.feed(data[start:]), scrubber.flush()]
    assert b"".join(out) == data.replace(written.encode(), REDACTED.encode())


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"], ids=["LF", "CRLF"])
def test_a_stream_event_is_passed_on_once_its_blank_line_has_come(eol: bytes) -> None:
    scrubber = StreamScrubber(Scrubber([KEY]))
    first = b"event: delta" + eol + b"data: {}" + eol + eol
    assert scrubber.feed(first + b"data: {") == first  # a complete event on, the rest held
    assert scrubber.feed(b'"x": 1}' + eol) == b""  # its line ended, the event not yet
    assert scrubber.feed(eol) == b'data: {"x": 1}' + eol + eol


def test_an_event_the_upstream_never_finished_can_be_dropped() -> None:
    scrubber = StreamScrubber(Scrubber([KEY]))
    assert scrubber.feed(b'data: {"a": 1}\n\ndata: {"choi') == b'data: {"a": 1}\n\n'
    scrubber.drop_partial()
    ending = b'data: {"error": {"code": "stream_interrupted"}}\n\ndata: [DONE]\n\n'
    assert scrubber.feed(ending) == ending
    assert scrubber.flush() == b""


UNSEEN = [f"zz-unseen-secret-{i:02d}" for i in range(17)]
"""Secrets no generated text holds: added to a scrubber, they take it past the substring tests
(`_LITERALS_UP_TO`) to the one regex, with the same replacements to make."""


@settings(max_examples=400, deadline=None)
@given(
    secrets=st.lists(
        st.text(alphabet=st.sampled_from([*"ab/+-", "é"]), min_size=8, max_size=12), min_size=1, max_size=3
    ),
    data=st.data(),
)
def test_few_secrets_searched_one_by_one_find_what_the_regex_finds(
    secrets: list[str], data: st.DataObject
) -> None:
    secret = data.draw(st.sampled_from(secrets))
    at = data.draw(st.integers(0, len(secret) - 1))
    way = data.draw(st.integers(0, 3))  # one character escaped one way (or none): the hard case
    written = escaped(secret, [way if i == at else 0 for i in range(len(secret))])
    around = st.sampled_from(["", "", "", "x ", "\\n", "\\\\", "é", "\\u00e9", "\\/"])
    content = (data.draw(around) + written + data.draw(around)).encode()
    assert Scrubber(secrets).secrets(content) == Scrubber([*secrets, *UNSEEN]).secrets(content)


def test_error_text_loses_a_secret_in_any_case() -> None:
    """An upstream may quote the key it was sent upper-cased (a log line, an error formatter): error
    text is scrubbed whatever the case. Content is not: see docs/operations.md."""
    scrub = Scrubber(["sk-UpStReAm/Key+Secret=0123456789"])
    assert scrub("bad key SK-UPSTREAM/KEY+SECRET=0123456789.") == f"bad key {REDACTED}."
    assert scrub("bad key sk-upstream\\/key+secret=0123456789") == f"bad key {REDACTED}"
    assert scrub.error_bytes(b'{"e": "SK-UPSTREAM%2FKEY%2BSECRET%3D0123456789"}') == b'{"e": "***"}'
