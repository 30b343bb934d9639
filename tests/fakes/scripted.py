"""A loopback upstream that answers each POST with scripted SSE pieces (each written on its own,
`gap_s` apart), or a scripted JSON answer: for streams the other fakes do not send (an event split
over many writes, a stream cut between whole events, odd error events)."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send


def sse(name: str, data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    return f"event: {name}\ndata: {text}\n\n".encode()


@dataclass
class Scripted:
    pieces: list[bytes] = field(default_factory=list)
    status: int = 200
    gap_s: float = 0.02
    json_body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


class ScriptedUpstream:
    def __init__(self) -> None:
        self.queue: deque[Scripted] = deque()
        self.default: Scripted | None = None
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.url = ""
        """The base URL to configure (`http://127.0.0.1:<port>/v1`), set by the fixture that serves it."""

    def script(self, *answers: Scripted) -> None:
        self.queue.extend(answers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        body = await request.body()
        self.requests.append((scope["path"], {k: v for k, v in request.headers.items()}, body))
        answer = self.queue.popleft() if self.queue else self.default
        response: Response
        if answer is None:
            response = JSONResponse({"error": "nothing scripted"}, status_code=500)
        elif answer.json_body is not None:
            response = JSONResponse(answer.json_body, status_code=answer.status, headers=answer.headers)
        else:
            pieces, gap = list(answer.pieces), answer.gap_s

            async def body_pieces() -> AsyncIterator[bytes]:
                for piece in pieces:
                    yield piece
                    await asyncio.sleep(gap)

            response = StreamingResponse(
                body_pieces(),
                status_code=answer.status,
                media_type="text/event-stream",
                headers=answer.headers,
            )
        await response(scope, receive, send)
