"""OpenAI-style error answers: `{"error": {"message", "type", "code"}}`, never a traceback."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.responses import Response

from proxy import untrusted
from proxy.apis import error_type


def error_body(status: int, message: str, code: str, **extra: Any) -> bytes:
    error: dict[str, Any] = {"message": message, "type": error_type(status), "code": code}
    error.update(extra)
    return untrusted.dumps({"error": error})


class ErrorResponse(Response):
    """An error the proxy itself answers (not an upstream's, which is relayed as it came): it keeps
    its message and code, so a route of another wire API can say it in that API's shape
    (`reshaped`), and the request's record can keep them without decoding the body."""

    def __init__(
        self, status: int, message: str, code: str, body: bytes, headers: Mapping[str, str] | None
    ) -> None:
        super().__init__(body, status_code=status, media_type="application/json", headers=headers)
        self.message = message
        self.code = code

    def reshaped(self, body: bytes) -> Response:
        """The same answer (status, headers) with another body."""
        response = Response(body, status_code=self.status_code, media_type="application/json")
        response.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"] + [
            (b"content-length", str(len(body)).encode())
        ]
        return response


def error_response(
    status: int,
    message: str,
    code: str,
    *,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> ErrorResponse:
    return ErrorResponse(
        status, message, code, error_body(status, message, code, **extra), dict(headers) if headers else None
    )


def json_response(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        untrusted.dumps(data),
        status_code=status,
        media_type="application/json",
        headers=dict(headers) if headers else None,
    )


def sse_error(message: str, code: str) -> bytes:
    """The tail of a stream that cannot continue: an error event, then `[DONE]`."""
    payload = json.dumps({"error": {"message": message, "type": "upstream_error", "code": code}})
    return f"data: {payload}\n\ndata: [DONE]\n\n".encode()
