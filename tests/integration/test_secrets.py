"""Keys an upstream echoes never leave the proxy (issue #10).

Upstreams quote the key they were sent in every place they can: an error body, response headers, a
stream's error event, a success body. Then every API answer, the CLI's `--json` views, the
console's connection rows and detail panes, every log line, every event and the raw bytes of the
state file (database and WAL) are searched for each configured key, and for the credential-shaped
strings the upstreams made up.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from omniroute_tui import snapshot
from proxy import logs
from proxy.config import load_config
from proxy.runtime import Runtime
from proxy.store import SqliteStore
from proxy.upstream import redirected
from tests.cli.conftest import run
from tests.fakes import Reply
from tests.integration.test_proxy import CHAT_PATH, Proxy, Upstream, chat, provider

KEY_A = "key-alpha-SECRET-0123456789"  # no credential shape: only the configured list finds it
KEY_B = "sk-proj-SECRETbeta0123456789"
CLIENT_KEY = "client-SECRET-key-0123456789"
MADE_UP = "sk-ant-api03-MADEUPbyTheUpstream00"  # not configured: its shape gives it away
BEARER = "MADEUPbearerTOKEN0123456789"
SECRETS = (KEY_A, KEY_B, CLIENT_KEY, MADE_UP, BEARER)


def config(url_a: str, url_b: str) -> str:
    return (
        f'[server]\napi_keys = ["{CLIENT_KEY}"]\n\n'
        f'[providers.one]\nclass = "apikey"\nbase_url = "{url_a}"\nrate_limit = false\n\n'
        f'[[providers.one.connections]]\nid = "one-1"\napi_key = "{KEY_A}"\n\n'
        f'[providers.two]\nclass = "apikey"\nbase_url = "{url_b}"\nrate_limit = false\n\n'
        f'[[providers.two.connections]]\nid = "two-1"\napi_key = "{KEY_B}"\n\n'
        '[combos.duo]\nstrategy = "priority"\ntargets = ["one/m1", "two/m1"]\n'
    )


def echo_text(key: str) -> str:
    return f"Incorrect API key provided: {key}. Sent: Authorization: Bearer {key}; also {MADE_UP}, Bearer {BEARER}"


def leaks(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


def test_an_echoed_key_is_in_no_answer_view_log_event_or_state_file(
    launch: Callable[..., Proxy],
    upstreams: Callable[..., Upstream],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    a, b = upstreams("a"), upstreams("b")
    proxy = launch(
        config(a.url, b.url),
        headers={"Authorization": f"Bearer {CLIENT_KEY}"},
        settings={"connectionCooldown": {"apikey": {"baseCooldownMs": 0}}},
    )
    unsubscribe = logs.log_events(proxy.rt.bus)  # as `serve` does: every event is a log line
    seen: list[str] = []

    def answer(response: httpx.Response) -> None:
        seen.append(response.text)
        seen.append(json.dumps(dict(response.headers)))

    error_body = {"error": {"message": echo_text(KEY_A), "type": "invalid_request_error", "code": None}}
    echo_headers = {
        "retry-after": KEY_A,
        "retry-after-ms": f"Bearer {KEY_A}",
        "x-echo": KEY_A,
        "content-type": f"application/json; key={KEY_A}",
    }
    stream_error = (
        'data: {"choices": [{"index": 0, "delta": {"content": "' + KEY_B + '"}}]}\n\n'
        'data: {"error": {"message": "' + echo_text(KEY_B) + '", "code": "invalid_api_key"}}\n\n'
        "data: [DONE]\n\n"
    )
    # Every place an upstream can put it: error bodies (JSON and text) and headers, then (two)
    # a stream whose content and error event quote the key, and a success body that does.
    a.fake.script(
        Reply("error", status=401, body=error_body, headers=echo_headers),
        Reply("error", status=429, body=echo_text(KEY_A), headers=echo_headers),
        Reply("error", status=500, body=echo_text(KEY_A), headers={"retry-after": KEY_A}),
        Reply("error", status=400, body=echo_text(KEY_A)),
    )
    b.fake.script(
        Reply("error", status=200, body=stream_error, headers={"content-type": "text/event-stream"}),
        Reply("json", body={"choices": [{"index": 0, "message": {"content": f"your key is {KEY_B}"}}]}),
        Reply("error", status=403, body=echo_text(KEY_B)),
    )
    for _ in range(4):
        answer(proxy.http.post(CHAT_PATH, json=chat("one/m1")))
        proxy.rt.engine.reset_connection("one-1")  # let the next scripted answer through
    with proxy.http.stream("POST", CHAT_PATH, json=chat("two/m1", stream=True)) as streamed:
        seen.append("".join(streamed.iter_text()))
    answer(proxy.http.post(CHAT_PATH, json=chat("two/m1")))
    answer(proxy.http.post(CHAT_PATH, json=chat("two/m1")))
    assert [len(a.calls()), len(b.calls())] == [4, 3]
    proxy.settled()

    # What the upstreams said is still there, without the keys.
    connection = proxy.connection("two-1")
    assert connection["lastError"].startswith("403: Incorrect API key provided: ***.")
    assert "Bearer ***" in connection["lastError"]

    for path in (
        "/api/resilience/connections",
        "/api/monitoring/health",
        "/api/resilience/model-cooldowns",
        "/api/events",
        "/api/settings",
        "/api/resilience",
    ):
        answer(proxy.http.get(path))
    for view in ("connections", "cooldowns", "lockouts", "breakers", "status"):
        result = run(view, "--json", "--url", proxy.url)
        assert result.code in (0, 6), result.stderr
        seen.extend((result.stdout, result.stderr))
    seen.extend(json.dumps(event.to_dict()) for event in proxy.rt.bus.after(0))
    # The console: each connection's row and detail pane (with its event history).
    read = proxy.rt.read
    history = [snapshot.event_entry(event) for event in proxy.rt.bus.after(0)]
    now = read.now()
    for conn in read.connections(now):
        seen.append(repr(snapshot.connection_row(conn)))
        seen.append(
            repr(snapshot.connection_detail(conn, read.lockouts_of(conn.provider, conn.id, now), history))
        )
    unsubscribe()

    state = proxy.state_path
    proxy.stop()  # the final persist, then the store closes
    raw = b"".join(p.read_bytes() for p in (state, Path(f"{state}-wal")) if p.exists())
    assert read_connection_error(state, "two-1").startswith("403: Incorrect API key provided: ***.")

    assert [leaks(text) for text in seen if leaks(text)] == []
    assert [r.getMessage() for r in caplog.records if leaks(r.getMessage())] == []
    assert [s for s in SECRETS if s.encode() in raw] == []
    assert any("Incorrect API key provided: ***" in r.getMessage() for r in caplog.records)


def read_connection_error(path: Path, connection_id: str) -> str:
    db = sqlite3.connect(path)
    try:
        (data,) = db.execute("SELECT data FROM connections WHERE id = ?", (connection_id,)).fetchone()
    finally:
        db.close()
    error: str = json.loads(data)["last_error"]
    return error


def test_a_state_file_written_before_scrubbing_is_scrubbed_on_start(tmp_path: Path) -> None:
    """An older version stored what the upstream said, key and all, and rewrote the row at every
    failure: the key is in the live row and in the free space the earlier versions of the row left."""
    state = tmp_path / "state.db"
    SqliteStore(state).close()  # the schema
    db = sqlite3.connect(state)
    db.execute("PRAGMA secure_delete=OFF")  # as an older version wrote it
    sql = "INSERT OR REPLACE INTO connections (id, data) VALUES (?, ?)"
    for n in range(20):
        for connection_id in ("one-1", "two-1"):
            record = {
                "connection_id": connection_id,
                "provider": connection_id.split("-")[0],
                "enabled": True,
                "terminal": "expired",
                "last_error": f"401: attempt {n}: " + echo_text(KEY_A),
                "last_error_type": "expired",
                "error_code": 401,
                "last_error_at": 1_767_225_600_000.0 + n,
            }
            db.execute(sql, (connection_id, json.dumps(record)))
            db.commit()
    # two-1 was reset since: its row says nothing any more, but the file's free space still does.
    db.execute(sql, ("two-1", json.dumps({"connection_id": "two-1", "provider": "two", "enabled": True})))
    db.commit()
    db.close()
    assert KEY_A.encode() in state.read_bytes()

    path = tmp_path / "config.toml"
    path.write_text(config("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"))
    path.chmod(0o600)
    runtime = Runtime.open(load_config(path, {}, explicit=True), state, env={})
    try:
        error = runtime.engine.connections["one-1"].health.last_error
        assert error is not None and error.startswith("401: attempt 19: Incorrect API key provided: ***.")
        assert not leaks(error)
    finally:
        runtime.store.close()
    raw = b"".join(p.read_bytes() for p in (state, Path(f"{state}-wal")) if p.exists())
    assert [s for s in SECRETS if s.encode() in raw] == []
    assert read_connection_error(state, "one-1").startswith(
        "401: attempt 19: Incorrect API key provided: ***."
    )


def test_a_clean_state_file_is_left_as_it_is(tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    SqliteStore(state).close()
    store = SqliteStore(state)
    try:
        assert store.purge(lambda text: KEY_A in text) is False
    finally:
        store.close()


ODD_KEY = 'pl"ain\\Secret/Value<42>&x+AbC/dEf=='
"""A key with the characters encoders escape differently: `"` and `\\` (all), `/` (PHP), `<`, `>`, `&`
(Go)."""


def _php(text: str) -> str:
    return json.dumps(text)[1:-1].replace("/", "\\/")


def _go(text: str) -> str:
    return json.dumps(text)[1:-1].replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _every_char(text: str) -> str:
    return "".join(f"\\u{ord(c):04X}" for c in text)


ODD_FORMS = (ODD_KEY, json.dumps(ODD_KEY)[1:-1], _php(ODD_KEY), _go(ODD_KEY), _every_char(ODD_KEY))


def _strings(text: str) -> list[str]:
    """`text`, and every string in it once decoded, if it is JSON."""
    found = [text]
    try:
        stack = [json.loads(text)]
    except ValueError:
        return found
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


JSON_TYPE = {"content-type": "application/json"}


def _error_saying(words: str) -> Callable[[str], str]:
    """An upstream's OpenAI-style error body, `words` then a key in some written form."""
    return lambda form: '{"error": {"message": "' + words + form + '", "type": "invalid"}}'


def _error_stream(error: str) -> str:
    """A stream that says something, then ends with `error` as its event."""
    return f'data: {{"choices": [{{"index": 0, "delta": {{"content": "hi"}}}}]}}\n\ndata: {error}\n\ndata: [DONE]\n\n'


def _every_door(
    launch: Callable[..., Proxy],
    upstreams: Callable[..., Upstream],
    caplog: pytest.LogCaptureFixture,
    key: str,
    *replies: Reply,
) -> tuple[Proxy, list[str]]:
    """One connection sent with `key`, whose upstream answers with `replies` (the fifth to a stream,
    the others to plain requests); everything the program then shows: the answers, the request
    records, the connection's last error, the events, the health document and the log, each JSON
    document's strings decoded too."""
    caplog.set_level(logging.INFO)
    up = upstreams("echo")
    config_text = (
        f'[providers.one]\nclass = "apikey"\nbase_url = "{up.url}"\nrate_limit = false\n\n'
        f"[[providers.one.connections]]\nid = \"one-1\"\napi_key = '{key}'\n"
    )
    proxy = launch(config_text, settings={"connectionCooldown": {"apikey": {"baseCooldownMs": 0}}})
    unsubscribe = logs.log_events(proxy.rt.bus)
    up.fake.script(*replies)
    seen: list[str] = []
    for _ in range(4):
        seen.append(proxy.http.post(CHAT_PATH, json=chat("one/m1")).text)
        proxy.rt.engine.reset_connection("one-1")  # let the next scripted answer through
    with proxy.http.stream("POST", CHAT_PATH, json=chat("one/m1", stream=True)) as streamed:
        seen.append("".join(streamed.iter_text()))
    seen.append(proxy.http.post(CHAT_PATH, json=chat("one/m1")).text)
    assert len(up.calls()) == len(replies)
    proxy.settled()
    for path in ("/api/requests", "/api/resilience/connections", "/api/events", "/api/monitoring/health"):
        seen.append(proxy.http.get(path).text)
    unsubscribe()
    return proxy, [t for text in seen for t in _strings(text)] + [r.getMessage() for r in caplog.records]


def test_a_key_the_upstream_escapes_its_own_way_leaves_by_no_door(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], caplog: pytest.LogCaptureFixture
) -> None:
    """PHP writes `\\/`, Go `\\u003c`, some encoders escape every character: the key is found in each
    form, in relayed errors, a success body, a stream's error event, the request records, the
    connection's last error, the events and the log, and none of them holds it, escaped or decoded."""

    error = _error_saying("Incorrect API key provided: ")
    proxy, texts = _every_door(
        launch,
        upstreams,
        caplog,
        ODD_KEY,
        Reply("error", status=400, body=error(_php(ODD_KEY)), headers=JSON_TYPE),
        Reply("error", status=400, body=error(_go(ODD_KEY)), headers=JSON_TYPE),
        Reply("error", status=429, body=error(_every_char(ODD_KEY)), headers=JSON_TYPE),
        Reply("error", status=200, body='{"choices": [{"index": 0, "message": {"content": "key ' + _go(ODD_KEY) + '"}}]}',
              headers=JSON_TYPE),
        Reply("error", status=200, body=_error_stream(error(_go(ODD_KEY))), headers={"content-type": "text/event-stream"}),
        Reply("error", status=401, body=error(_every_char(ODD_KEY).lower().replace("\\U", "\\u"))),
    )  # fmt: skip
    assert proxy.connection("one-1")["lastError"].startswith("401: ")  # the key is expired
    assert [t for t in texts if any(form in t for form in ODD_FORMS)] == []
    assert any("Incorrect API key provided: ***" in t for t in texts)


def test_an_upstream_redirect_is_not_followed_so_no_key_or_prompt_goes_anywhere_else(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """A key goes only where `base_url` points. An upstream that answers with a redirect (a base_url
    written `http://` for an `https://` service, a compromised or misconfigured server) would have
    the key in its header, the provider's headers and, on a 307, the prompt sent on to wherever it
    names: the redirect is a failed attempt instead (the next target serves), said in words that
    tell the operator where it pointed, without the query a key may hide in."""
    one, two, elsewhere = upstreams("one"), upstreams("two"), upstreams("elsewhere")
    config_text = (
        f'[providers.one]\nclass = "apikey"\nbase_url = "{one.url}"\nauth = "x-api-key"\nrate_limit = false\n\n'
        f'[[providers.one.connections]]\nid = "one-1"\napi_key = "{KEY_A}"\n\n'
        f'[providers.two]\nclass = "apikey"\nbase_url = "{two.url}"\nrate_limit = false\n\n'
        f'[[providers.two.connections]]\nid = "two-1"\napi_key = "{KEY_B}"\n\n'
        '[combos.duo]\nstrategy = "priority"\ntargets = ["one/m1", "two/m1"]\n'
    )
    proxy = launch(config_text, settings={"connectionCooldown": {"apikey": {"baseCooldownMs": 0}}})
    away = f"{elsewhere.url}/chat/completions?key={KEY_A}"
    one.fake.script(
        Reply("json", status=307, body={}, headers={"location": away}),
        Reply("json", status=301, body={}, headers={"location": away}),
    )
    served = proxy.http.post(CHAT_PATH, json=chat("duo"))
    assert served.status_code == 200, served.text
    assert served.headers["x-omniroute-selected-connection-id"] == "two-1"
    proxy.rt.engine.reset_connection("one-1")
    refused = proxy.http.post(CHAT_PATH, json=chat("one/m1"))
    assert refused.status_code == 502, refused.text
    assert "redirect" in refused.text and f"{elsewhere.url}/chat/completions" in refused.text
    assert elsewhere.fake.requests == []
    assert len(one.calls()) == 2
    proxy.settled()
    texts = [refused.text] + [proxy.http.get(p).text for p in ("/api/requests", "/api/events")]
    assert [t for t in texts if KEY_A in t] == []


URL_KEY = "Kx9/+=abcdEFGH1234secret"
"""A key with characters a URL encodes (`/`, `+`, `=`): an upstream that quotes the URL or query it
was sent writes them `%2F`, `%2B`, `%3D`."""
URL_FORMS = (
    quote(URL_KEY, safe=""),
    re.sub("%[0-9A-F]{2}", lambda m: m.group().lower(), quote(URL_KEY, safe="")),  # lower-case hex
    quote(URL_KEY),  # `/` left as it is, as most URL encoders do
    "Kx9%2F+%3dabcdEFGH1234secret",  # a mix
)


def test_a_key_an_upstream_url_encodes_leaves_by_no_door(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], caplog: pytest.LogCaptureFixture
) -> None:
    """An upstream that quotes the URL it was sent (`?key=...`) writes the key percent-encoded: found
    in relayed errors, a success body, a stream's error event, the records, the connection's last
    error, the events and the log, in upper- and lower-case hex and half-encoded."""

    error = _error_saying("bad key in https://x.example/v1?key=")
    _, texts = _every_door(
        launch,
        upstreams,
        caplog,
        URL_KEY,
        Reply("error", status=400, body=error(URL_FORMS[0]), headers=JSON_TYPE),
        Reply("error", status=400, body=error(URL_FORMS[3]), headers=JSON_TYPE),
        Reply("error", status=200, body='{"choices": [{"index": 0, "message": {"content": "k=' + URL_FORMS[1] + '"}}]}',
              headers=JSON_TYPE),
        Reply("error", status=200, body='{"choices": [{"index": 0, "message": {"content": "k=' + URL_FORMS[2] + '"}}]}',
              headers=JSON_TYPE),
        Reply("error", status=200, body=_error_stream(error(URL_FORMS[2])), headers={"content-type": "text/event-stream"}),
        Reply("error", status=401, body=error(URL_FORMS[1])),
    )  # fmt: skip
    assert [t for t in texts if any(form in t for form in URL_FORMS)] == []
    assert any("?key=***" in t for t in texts) and any("k=***" in t for t in texts)


@pytest.mark.parametrize(
    ("location", "shown"),
    [
        (
            "https://user:pw@api.example.com:8443/v1/chat?key=secret",
            " to https://api.example.com:8443/v1/chat:",
        ),
        ("http://api.example.com:99999/v1", " to http://api.example.com:99999/v1:"),  # no such port
        ("/relative/path?key=secret", " to /relative/path:"),
        ("http://[::1/x?key=secret", ", a redirect: not followed"),  # no URL at all: nothing shown
        (None, ", a redirect: not followed"),
    ],
)
def test_a_redirect_is_told_without_userinfo_or_query_whatever_its_location_holds(
    location: str | None, shown: str
) -> None:
    """An upstream writes the Location it likes: a port out of range made the words themselves fail."""
    words = redirected(302, location)
    assert words.startswith("answered 302") and shown in words
    assert "secret" not in words and "pw" not in words


def test_a_key_an_upstream_upper_cases_in_its_error_leaves_by_no_door(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream], caplog: pytest.LogCaptureFixture
) -> None:
    """Error text is scrubbed whatever the case the upstream wrote the key in: the relayed errors,
    a stream's error event, the records, the connection's last error, the events and the log."""
    shouted = ODD_KEY.upper()

    error = _error_saying("INVALID KEY ")
    proxy, texts = _every_door(
        launch,
        upstreams,
        caplog,
        ODD_KEY,
        Reply("error", status=400, body=error(_php(shouted)), headers=JSON_TYPE),
        Reply("error", status=429, body=error(shouted.lower()), headers=JSON_TYPE),
        Reply("error", status=400, body=error(_every_char(shouted)), headers=JSON_TYPE),
        Reply("error", status=200, body='{"choices": [{"index": 0, "message": {"content": "ok"}}]}', headers=JSON_TYPE),
        Reply("error", status=200, body=_error_stream(error(_go(shouted))), headers={"content-type": "text/event-stream"}),
        Reply("error", status=401, body=error(shouted)),
    )  # fmt: skip
    assert proxy.connection("one-1")["lastError"].startswith("401: ")
    forms = {f.lower() for f in (*ODD_FORMS, shouted, _php(shouted), _go(shouted), _every_char(shouted))}
    assert [t for t in texts if any(form in t.lower() for form in forms)] == []
    assert any("INVALID KEY ***" in t for t in texts)


def test_a_base_url_password_an_upstream_quotes_leaves_by_no_door(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """A base_url's user name and password are sent as `Authorization: Basic`: an upstream that
    quoted the password, or the header it was sent, handed it to the client, the connection's last
    error, the events and the trail (found by a trial)."""
    up = upstreams()
    password = "pass-word-secret-1234"
    basic = base64.b64encode(f"svc:{password}".encode()).decode()
    up.fake.script(
        Reply(
            "error",
            status=500,
            body={"error": {"message": f"denied: svc:{password} (Authorization: Basic {basic})"}},
        )
    )
    url = up.url.replace("http://", f"http://svc:{password}@")
    proxy = launch(provider("priv", "local", url) + '[[providers.priv.connections]]\nid = "priv-1"\n')
    response = proxy.http.post(CHAT_PATH, json=chat("priv/m1"))
    assert up.calls(), "the upstream was asked"
    assert up.calls()[0].headers["authorization"] == f"Basic {basic}"  # sent as it should be
    for text in (
        response.text,
        proxy.http.get("/api/resilience/connections").text,
        proxy.http.get("/api/events").text,
        proxy.http.get("/api/requests").text,
    ):
        assert password not in text and basic not in text
    assert "***" in response.text  # the upstream's words reach the client, scrubbed
    proxy.settled()
