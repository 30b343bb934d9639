"""Pure ASGI middleware at the door: request ids, client API keys, management auth, no tracebacks.

- `/v1/*`: when `server.api_keys` is set, a `Bearer` key from that list is required.
- `/api/*`: with a management token, `Bearer <token>` is required (constant-time compare);
  without one, only loopback clients are answered.
- Every response carries `X-Request-Id`; an unexpected exception becomes a JSON 500 that says
  nothing about our internals (the traceback goes to the log only).
"""

from __future__ import annotations

import hmac
import logging
import os

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.config import ServerConfig, is_loopback_host
from proxy.responses import error_body

log = logging.getLogger("omniroute")


class Guard:
    def __init__(self, app: ASGIApp, server: ServerConfig) -> None:
        self.app = app
        self.management_token = server.management_token.encode() if server.management_token else None
        self.api_keys = [k.encode() for k in server.api_keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = os.urandom(8).hex()
        scope.setdefault("state", {})["request_id"] = request_id
        rid_header = (b"x-request-id", request_id.encode())
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", []), rid_header]
            await send(message)

        denial = self._deny(scope)
        if denial is not None:
            status, body = denial
            await _answer(send_with_id, status, body)
            return
        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await _answer(
                    send_with_id, 500, error_body(500, "internal error; see the server log", "internal_error")
                )

    def _deny(self, scope: Scope) -> tuple[int, bytes] | None:
        path: str = scope.get("path", "")
        if path.startswith("/api/"):
            if self.management_token is None:
                client = scope.get("client")
                if client is None or not is_loopback_host(client[0]):
                    return 403, error_body(
                        403,
                        "the management API answers loopback clients only unless server.management_token is set",
                        "forbidden",
                    )
                return None
            if not _bearer_matches(scope, [self.management_token]):
                return 401, error_body(401, "missing or wrong management token", "unauthorized")
            return None
        if path.startswith("/v1/") and self.api_keys and not _bearer_matches(scope, self.api_keys):
            return 401, error_body(401, "missing or wrong API key", "invalid_api_key")
        return None


def _bearer_matches(scope: Scope, secrets: list[bytes]) -> bool:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() != b"bearer":
                return False
            token = token.strip()
            # Compare against every secret so the time taken does not tell which one nearly matched.
            matched = False
            for secret in secrets:
                matched |= hmac.compare_digest(token, secret)
            return matched
    return False


async def _answer(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
