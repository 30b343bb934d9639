"""Pure ASGI middleware at the door: browsers, credentials, request ids, no tracebacks.

Checked in this order, each refusal a JSON error that names the rule:

1. `Host` (421): a request that no credential authenticates (`/api/*` without a management token,
   `/v1/*` without `server.api_keys`, anything else) must name this machine: a loopback name or
   address, or one of `server.allowed_hosts`. A web page that points its own DNS name at 127.0.0.1
   (DNS rebinding) sends its own name, so it is refused. A request without `Host` comes from no
   browser and is let through.
2. `Origin` (403): a browser says which page sent a request; only `server.allowed_origins`
   (default: none) may. Such an origin also gets its CORS preflight (`OPTIONS`) answered and
   `Access-Control-Allow-Origin` on every answer.
3. Credentials: `/v1/*` needs a key from `server.api_keys` when that list is set (401), as
   `Authorization: Bearer` or as `x-api-key` (how Anthropic's clients send theirs; the refusal is
   then in Anthropic's error shape on `/v1/messages`);
   `/api/*` needs `Bearer <management_token>` when one is set (401), else a loopback client (403).
   Compared in constant time.
4. `Content-Type` (415): a POST, PUT, PATCH or DELETE with a body must say `application/json`,
   which no page can send across sites without a preflight that step 2 refuses (a form or a
   no-cors fetch can only send text/plain, form data or multipart). A request without a body needs
   no type.

Every response carries `X-Request-Id`; an unexpected exception becomes a JSON 500 that says
nothing about our internals (the traceback goes to the log only).
"""

from __future__ import annotations

import hmac
import json
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Final, Protocol, runtime_checkable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.apis import anthropic_error_body
from proxy.config import ServerConfig, host_name, is_loopback_host, normal_origin
from proxy.responses import error_body

log = logging.getLogger("omniroute")

_HOSTS_CACHED: Final = 64
_UNSAFE_METHODS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_CORS_ALLOW_HEADERS: Final = (
    b"authorization, content-type, x-omniroute-connection, x-session-id, x-codex-session-id, "
    b"x-omniroute-session, x-api-key, anthropic-version, anthropic-beta"
)
_CORS_EXPOSE_HEADERS: Final = (
    b"x-request-id, x-omniroute-selected-connection-id, x-omniroute-provider, "
    b"x-omniroute-fallback-attempts, retry-after"
)


class Guard:
    def __init__(self, app: ASGIApp, server: ServerConfig) -> None:
        self.app = app
        self.management_token = server.management_token.encode() if server.management_token else None
        self.api_keys = [k.encode() for k in server.api_keys]
        self.allowed_hosts = frozenset(server.allowed_hosts)
        self.allowed_origins = frozenset(server.allowed_origins)
        self._direct = app if isinstance(app, DirectAnswers) else None
        """The app, when it answers the requests it claims with the Guard's headers itself."""
        self._hosts: dict[bytes, bool] = {}
        """Host header -> allowed: the same few values arrive with every request, and reading one
        takes an IP address parse. At most _HOSTS_CACHED entries: a client cannot grow it."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        state = scope.get("state")
        if state is None:  # (uvicorn gives every scope one: `setdefault` would make a dict for nothing)
            state = scope["state"] = {}
        state["request_id"] = request_id
        added = [(b"x-request-id", request_id.encode())]
        raw = scope.get("headers", [])
        # By lower-case name, the first of repeated ones (as a browser sends one): built in C,
        # reversed so that the first of a repeated name is the one that stays. The pipeline reads
        # the same dict (HEADERS_KEY) instead of building it again.
        headers: dict[bytes, bytes] = dict(reversed(raw if isinstance(raw, list) else list(raw)))
        scope[HEADERS_KEY] = headers
        origin = headers.get(b"origin")
        if origin is not None and self._origin_allowed(origin):
            added += [
                (b"access-control-allow-origin", origin),
                (b"access-control-expose-headers", _CORS_EXPOSE_HEADERS),
                (b"vary", b"Origin"),
            ]
        path: str = scope.get("path", "")
        if not (origin is None and path.startswith("/v1/") and self._api_admitted(scope, headers)):
            # Anything but an API request that plainly passes every rule: the rules one by one.
            managed = _managed(path)
            needed = (
                self.management_token is not None
                if managed
                else path.startswith("/v1/") and bool(self.api_keys)
            )
            denial = self._door(headers, needed)
            preflight = scope.get("method") == "OPTIONS" and b"access-control-request-method" in headers
            if denial is None and origin is not None and preflight:
                # It carries no credential: answered before they are asked.
                await _preflight(stamping(send, added, scope))
                return
            if denial is None:
                denial = self._access(scope, headers, managed, needed)
            if denial is not None:
                status, body = denial
                await _answer(stamping(send, added, scope), status, _shaped(path, status, body))
                return
        try:
            direct = self._direct
            if direct is not None and direct.claims(scope):
                await direct.answer(scope, receive, send, added)
            else:
                await self.app(scope, receive, stamping(send, added, scope))
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if not scope.get(STARTED_KEY):
                body = error_body(500, "internal error; see the server log", "internal_error")
                await _answer(stamping(send, added, scope), 500, _shaped(path, 500, body))

    def _api_admitted(self, scope: Scope, headers: dict[bytes, bytes]) -> bool:
        """Does a `/v1/` request without an Origin plainly pass every rule? True only when the rules
        one by one (`_door`, `_access`) would let it through; False sends it to them, which decide."""
        if self.api_keys:  # the credential rule, instead of the Host rule
            if not (_bearer_matches(headers, self.api_keys) or _x_api_key_matches(headers, self.api_keys)):
                return False
        else:
            host = headers.get(b"host")
            if host is not None and self._hosts.get(host) is not True:
                return False  # not known to be allowed (yet): _door reads it
        return (
            scope.get("method") not in _UNSAFE_METHODS
            or headers.get(b"content-type") == b"application/json"
            or _json_or_empty(headers)
        )

    def _door(self, headers: dict[bytes, bytes], credential_needed: bool) -> tuple[int, bytes] | None:
        """Steps 1 and 2: the Host and Origin rules (`credential_needed`: a credential authenticates
        the path's requests, so the Host rule is not needed)."""
        if not credential_needed:
            host = headers.get(b"host")
            if host is not None and not self._host_allowed(host):
                return 421, error_body(
                    421,
                    "the Host header names another server: without a token this proxy answers only"
                    " requests addressed to a loopback name or address, or to one of server.allowed_hosts",
                    "misdirected_request",
                )
        origin = headers.get(b"origin")
        if origin is not None and not self._origin_allowed(origin):
            return 403, error_body(
                403,
                "requests from web pages are refused unless their origin is listed in server.allowed_origins",
                "forbidden_origin",
            )
        return None

    def _access(
        self, scope: Scope, headers: dict[bytes, bytes], managed: bool, credential_needed: bool
    ) -> tuple[int, bytes] | None:
        """Steps 3 and 4: credentials and the body's type (`managed`: the path is behind the
        management token; `credential_needed`: as for `_door`)."""
        if managed:
            if self.management_token is None:
                client = scope.get("client")
                if client is None or not is_loopback_host(client[0]):
                    return 403, error_body(
                        403,
                        "the management API answers loopback clients only unless server.management_token is set",
                        "forbidden",
                    )
            elif not _bearer_matches(headers, [self.management_token]):
                return 401, error_body(401, "missing or wrong management token", "unauthorized")
        elif credential_needed and not (
            _bearer_matches(headers, self.api_keys) or _x_api_key_matches(headers, self.api_keys)
        ):
            return 401, error_body(401, "missing or wrong API key", "invalid_api_key")
        if scope.get("method") in _UNSAFE_METHODS and not _json_or_empty(headers):
            return 415, error_body(
                415,
                "a request body must be JSON, sent as Content-Type: application/json",
                "unsupported_media_type",
            )
        return None

    def _host_allowed(self, header: bytes) -> bool:
        allowed = self._hosts.get(header)
        if allowed is None:
            name = host_name(header.decode("latin-1"))
            allowed = is_loopback_host(name) or name in self.allowed_hosts
            if len(self._hosts) < _HOSTS_CACHED:
                self._hosts[header] = allowed
        return allowed

    def _origin_allowed(self, header: bytes) -> bool:
        if not self.allowed_origins:
            return False
        origin = normal_origin(header.decode("latin-1"))
        return origin is not None and origin in self.allowed_origins


@runtime_checkable
class DirectAnswers(Protocol):
    """An app that answers the requests it `claims` with the Guard's headers (`added`) itself: it
    puts them on every answer it starts, and sets STARTED_KEY in the scope just before it starts
    one (`stamping` does both for a `send`). The Guard then does not wrap its `send` (a call per
    message, and the wrapper's making, for every request)."""

    def claims(self, scope: Scope) -> bool: ...

    async def answer(
        self, scope: Scope, receive: Receive, send: Send, added: list[tuple[bytes, bytes]]
    ) -> None: ...


def stamping(
    send: Send, added: list[tuple[bytes, bytes]], scope: Scope
) -> Callable[[Message], Awaitable[None]]:
    """`send`, with `added` put on the answer's start (after its own headers), and STARTED_KEY set in
    the scope before the start goes out (an exception after that cannot be answered any more).

    A plain function handing back `send`'s awaitable, not a coroutine of its own: no frame per
    message sent (a stream sends one per chunk)."""

    def send_stamped(message: Message) -> Awaitable[None]:
        if message["type"] == "http.response.start":
            scope[STARTED_KEY] = True
            message["headers"] = [*message.get("headers", []), *added]
        return send(message)

    return send_stamped


STARTED_KEY: Final = "omniroute.started"
"""Set in the ASGI scope when the request's answer has started."""

HEADERS_KEY: Final = "omniroute.headers"
"""Where the Guard leaves the request's headers by name (`dict[bytes, bytes]`) in the ASGI scope."""

_ID_POOL_BYTES: Final = 8 * 512
_ids = b""
_ids_at = 0


def new_request_id() -> str:
    """16 hex digits from the system's random source, read 512 ids at a time (one read per
    request was a system call per request)."""
    global _ids, _ids_at
    at = _ids_at
    if at >= len(_ids):
        _ids, at = os.urandom(_ID_POOL_BYTES), 0
    _ids_at = at + 8
    return _ids[at : at + 8].hex()


def _forget_ids() -> None:
    global _ids, _ids_at
    _ids, _ids_at = b"", 0


os.register_at_fork(after_in_child=_forget_ids)  # a forked child must not repeat its parent's ids


def _managed(path: str) -> bool:
    """Behind the management token (or loopback): the management API, and the metrics Prometheus scrapes."""
    return path.startswith("/api/") or path == "/metrics"


def _headers(scope: Scope) -> dict[bytes, bytes]:
    """The request's headers by lower-case name (the first of repeated ones, as a browser sends one)."""
    raw = scope.get("headers", [])
    # Built in C: reversed, so that the first of a repeated name is the one that stays.
    return dict(reversed(raw if isinstance(raw, list) else list(raw)))


def _json_or_empty(headers: dict[bytes, bytes]) -> bool:
    """Does the request say its body is JSON, or have no body at all?"""
    content_type = headers.get(b"content-type")
    if content_type is not None:
        return content_type.partition(b";")[0].strip().lower() == b"application/json"
    length = headers.get(b"content-length", b"0").strip()
    return b"transfer-encoding" not in headers and length.isdigit() and not length.lstrip(b"0")


def _bearer_matches(headers: dict[bytes, bytes], secrets: list[bytes]) -> bool:
    value = headers.get(b"authorization")
    if value is None:
        return False
    scheme, _, token = value.partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    token = token.strip()
    # Compare against every secret so the time taken does not tell which one nearly matched.
    matched = False
    for secret in secrets:
        matched |= hmac.compare_digest(token, secret)
    return matched


def _x_api_key_matches(headers: dict[bytes, bytes], secrets: list[bytes]) -> bool:
    """Anthropic's clients send their key as `x-api-key` (Claude Code with ANTHROPIC_API_KEY)."""
    token = headers.get(b"x-api-key")
    if token is None:
        return False
    matched = False
    for secret in secrets:
        matched |= hmac.compare_digest(token.strip(), secret)
    return matched


_CHALLENGE: Final = (b"www-authenticate", b'Bearer realm="omniroute"')
"""Both tokens (the management token, an API key) go as `Authorization: Bearer`."""


async def _answer(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append(_CHALLENGE)  # a 401 says how to authenticate (RFC 9110, "401 Unauthorized")
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _preflight(send: Send) -> None:
    """The answer to an allowed origin's CORS preflight: what it may send, for ten minutes."""
    await send(
        {
            "type": "http.response.start",
            "status": 204,
            "headers": [
                (b"access-control-allow-methods", b"GET, POST, PUT, PATCH, DELETE"),
                (b"access-control-allow-headers", _CORS_ALLOW_HEADERS),
                (b"access-control-max-age", b"600"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b""})


def _shaped(path: str, status: int, body: bytes) -> bytes:
    """One of the Guard's own answers (`error_body`'s shape) in the shape its route's clients read:
    Anthropic's on `/v1/messages`."""
    if path.startswith("/v1/messages"):
        return anthropic_error_body(status, json.loads(body)["error"]["message"])
    return body
