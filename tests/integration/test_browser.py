"""What a web page can make a browser send is refused; what local clients send is served (issue #10).

A page on any site can have the browser send requests to 127.0.0.1: its own DNS name pointed at
127.0.0.1 (DNS rebinding: the `Host` header then names the page's site), a cross-site `fetch` or
form (an `Origin` header), or a body labelled `text/plain`, form data or multipart (the only kinds a
page may send across sites without a CORS preflight). Each is refused with its status, and nothing
it asked for happens. The same requests from a local client (loopback `Host`, no `Origin`, JSON)
are served, and so are the official `openai` SDK and curl.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from tests.fakes import Reply
from tests.integration.test_proxy import CHAT_PATH, Proxy, Upstream, chat, provider

JSON = {"content-type": "application/json"}
CHAT = json.dumps(chat("loc/m1")).encode()
RESET = b'{"provider": "loc"}'

# (why, method, path, headers, body, status, code)
CROSS_SITE: list[tuple[str, str, str, dict[str, str], bytes | None, int, str]] = [
    (
        "rebinding",
        "POST",
        "/api/resilience/reset",
        {"host": "evil.example", **JSON},
        RESET,
        421,
        "misdirected_request",
    ),
    (
        "rebinding",
        "DELETE",
        "/api/monitoring/health",
        {"host": "evil.example:20128"},
        None,
        421,
        "misdirected_request",
    ),
    (
        "rebinding",
        "GET",
        "/api/resilience/connections",
        {"host": "evil.example"},
        None,
        421,
        "misdirected_request",
    ),
    ("rebinding", "POST", CHAT_PATH, {"host": "evil.example", **JSON}, CHAT, 421, "misdirected_request"),
    ("rebinding", "GET", "/v1/models", {"host": "127.0.0.1.evil.example"}, None, 421, "misdirected_request"),
    ("rebinding", "POST", CHAT_PATH, {"host": "0.0.0.0:20128", **JSON}, CHAT, 421, "misdirected_request"),
    (
        "origin",
        "POST",
        "/api/resilience/reset",
        {"origin": "https://evil.example", **JSON},
        RESET,
        403,
        "forbidden_origin",
    ),
    ("origin", "POST", CHAT_PATH, {"origin": "https://evil.example", **JSON}, CHAT, 403, "forbidden_origin"),
    (
        "origin",
        "GET",
        "/api/resilience/connections",
        {"origin": "http://localhost:3000"},
        None,
        403,
        "forbidden_origin",
    ),
    ("origin", "GET", "/v1/models", {"origin": "null"}, None, 403, "forbidden_origin"),
    (
        "origin",
        "OPTIONS",
        CHAT_PATH,
        {"origin": "https://evil.example", "access-control-request-method": "POST"},
        None,
        403,
        "forbidden_origin",
    ),
    ("text/plain", "POST", CHAT_PATH, {"content-type": "text/plain"}, CHAT, 415, "unsupported_media_type"),
    (
        "text/plain",
        "POST",
        "/api/resilience/reset",
        {"content-type": "text/plain;charset=UTF-8"},
        RESET,
        415,
        "unsupported_media_type",
    ),
    (
        "form",
        "POST",
        "/api/resilience/reset",
        {"content-type": "application/x-www-form-urlencoded"},
        b"",
        415,
        "unsupported_media_type",
    ),
    (
        "form",
        "PATCH",
        "/api/settings",
        {"content-type": "application/x-www-form-urlencoded"},
        b'{"modelLockout": {"enabled": true}}',
        415,
        "unsupported_media_type",
    ),
    (
        "multipart",
        "POST",
        CHAT_PATH,
        {"content-type": "multipart/form-data; boundary=x"},
        CHAT,
        415,
        "unsupported_media_type",
    ),
    ("no type", "PUT", "/api/providers/loc-1", {}, b'{"isActive": false}', 415, "unsupported_media_type"),
]


@pytest.fixture
def local(launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]) -> tuple[Proxy, Upstream]:
    """A proxy with no token at all, as it runs by default, before its one upstream."""
    up = upstreams()
    return launch(provider("loc", "local", up.url, "loc-1")), up


def send(proxy: Proxy, method: str, path: str, headers: dict[str, str], body: bytes | None) -> httpx.Response:
    return proxy.http.request(method, path, headers=headers, content=body)


def untouched(proxy: Proxy, up: Upstream, seq: int) -> None:
    """Nothing a refused request asked for happened: no upstream call, no event, settings as they were."""
    assert up.calls() == []
    assert proxy.rt.bus.after(seq) == []
    assert proxy.rt.engine.connections["loc-1"].health.enabled is True
    proxy.settled()


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "status", "code"),
    [case[1:] for case in CROSS_SITE],
    ids=[f"{case[0]}-{case[1]}-{case[2]}" for case in CROSS_SITE],
)
def test_what_a_web_page_can_send_is_refused(
    local: tuple[Proxy, Upstream],
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes | None,
    status: int,
    code: str,
) -> None:
    proxy, up = local
    seq = proxy.rt.bus.last_seq
    settings = proxy.rt.settings.document()
    response = send(proxy, method, path, headers, body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert response.headers["x-request-id"]
    assert "access-control-allow-origin" not in response.headers
    assert proxy.rt.settings.document() == settings
    untouched(proxy, up, seq)


def test_the_same_requests_from_a_local_client_are_served(local: tuple[Proxy, Upstream]) -> None:
    proxy, up = local
    port = proxy.url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost", "app.localhost"):
        assert send(proxy, "POST", CHAT_PATH, {"host": host, **JSON}, CHAT).status_code == 200, host
        assert send(proxy, "GET", "/api/resilience/connections", {"host": host}, None).status_code == 200
    assert send(proxy, "POST", "/api/resilience/reset", JSON, RESET).status_code == 200
    assert (
        send(proxy, "POST", CHAT_PATH, {"content-type": "Application/JSON; charset=utf-8"}, CHAT).status_code
        == 200
    )
    # Bodiless requests need no type: GET never does, and neither does a POST or DELETE without a body.
    assert send(proxy, "GET", "/v1/models", {}, None).status_code == 200
    assert send(proxy, "POST", "/api/resilience/connections/loc-1/reset", {}, None).status_code == 200
    assert send(proxy, "DELETE", "/api/monitoring/health", {"content-length": "0"}, None).status_code == 200
    assert len(up.calls()) == 6


def test_allowed_hosts_and_origins_open_the_door_to_exactly_those(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    server = '[server]\nallowed_hosts = ["Proxy.LAN", "192.168.1.20"]\nallowed_origins = ["http://localhost:3000"]\n\n'
    proxy = launch(server + provider("loc", "local", up.url, "loc-1"))
    for host in ("proxy.lan:20128", "PROXY.lan", "192.168.1.20:20128"):
        assert send(proxy, "POST", CHAT_PATH, {"host": host, **JSON}, CHAT).status_code == 200, host
    assert send(proxy, "GET", "/v1/models", {"host": "other.lan"}, None).status_code == 421

    page = {"origin": "http://localhost:3000"}
    preflight = send(
        proxy,
        "OPTIONS",
        CHAT_PATH,
        {**page, "access-control-request-method": "POST", "access-control-request-headers": "content-type"},
        None,
    )
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert "content-type" in preflight.headers["access-control-allow-headers"]
    served = send(proxy, "POST", CHAT_PATH, {**page, **JSON}, CHAT)
    assert served.status_code == 200
    assert served.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert "x-request-id" in served.headers["access-control-expose-headers"]
    # An allowed page may not send what a form can: its body must still be JSON.
    assert send(proxy, "POST", CHAT_PATH, {**page, "content-type": "text/plain"}, CHAT).status_code == 415
    assert (
        send(proxy, "POST", CHAT_PATH, {"origin": "http://localhost:3001", **JSON}, CHAT).status_code == 403
    )


def test_with_tokens_a_lan_client_is_served_whatever_host_it_names(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    """How the proxy is opened to a LAN: both tokens set, a request that carries one is answered
    under any Host (the browser of a rebinding page has no token to send)."""
    up = upstreams()
    server = (
        '[server]\nmanagement_token = "mgmt-token-0123456789"\napi_keys = ["sk-lan-client-0123456789"]\n\n'
    )
    proxy = launch(server + provider("loc", "local", up.url, "loc-1"))
    lan = {"host": "192.168.1.20:20128"}
    client = {**lan, "authorization": "Bearer sk-lan-client-0123456789", **JSON}
    assert send(proxy, "POST", CHAT_PATH, client, CHAT).status_code == 200
    admin = {**lan, "authorization": "Bearer mgmt-token-0123456789"}
    assert send(proxy, "GET", "/api/resilience/connections", admin, None).status_code == 200
    for refused in (
        send(proxy, "POST", CHAT_PATH, {**lan, **JSON}, CHAT),
        send(proxy, "GET", "/api/resilience/connections", lan, None),
        send(proxy, "POST", "/v1/messages", {**lan, **JSON}, CHAT),
    ):
        assert refused.status_code == 401
        # What a 401 must say (RFC 9110, "401 Unauthorized"): how to authenticate.
        assert refused.headers["www-authenticate"] == 'Bearer realm="omniroute"'
    assert (
        send(proxy, "POST", CHAT_PATH, {**client, "origin": "https://evil.example"}, CHAT).status_code == 403
    )


def test_the_openai_sdk_works_unchanged(
    launch: Callable[..., Proxy], upstreams: Callable[..., Upstream]
) -> None:
    up = upstreams()
    up.fake.by_model("m2", Reply("stream", chunks=3, chunk_text="ok"))
    proxy = launch(
        '[server]\napi_keys = ["sk-sdk-client-0123456789"]\n\n' + provider("loc", "local", up.url, "loc-1")
    )
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-sdk-client-0123456789", max_retries=0)
    try:
        assert "loc/m1" in [m.id for m in client.models.list()]
        completion = client.chat.completions.create(
            model="loc/m1", messages=[{"role": "user", "content": "hi"}]
        )
        assert completion.choices[0].message.content == "hello from up"
        stream = client.chat.completions.create(
            model="loc/m2", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == "okokok"
        embedding = client.embeddings.create(model="loc/m1", input="hi")
        assert len(embedding.data[0].embedding) == 3
    finally:
        client.close()
    proxy.settled()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_with_a_json_content_type_works(local: tuple[Proxy, Upstream]) -> None:
    proxy, _ = local

    def curl(*args: str) -> Any:
        result = subprocess.run(
            ["curl", "-sS", "--max-time", "20", *args], capture_output=True, text=True, timeout=30, check=True
        )
        return json.loads(result.stdout)

    answer = curl(f"{proxy.url}{CHAT_PATH}", "-H", "Content-Type: application/json", "-d", CHAT.decode())
    assert answer["choices"][0]["message"]["content"] == "hello from up"
    assert "data" in curl(f"{proxy.url}/v1/models")
    assert curl("-X", "POST", f"{proxy.url}/api/resilience/connections/loc-1/reset")["ok"] is True
    # curl -d without a type labels the body a form: refused, as a page's form would be.
    refused = curl(f"{proxy.url}{CHAT_PATH}", "-d", CHAT.decode())
    assert refused["error"]["code"] == "unsupported_media_type"
