"""The floor: the same stack as the product (Starlette on uvicorn, aiohttp to the upstream) with no
routing and no resilience. Whatever the product adds on top is measured against this.

    uvicorn floor_proxy:app --host 127.0.0.1 --port 14002 --no-access-log
"""

import os

import aiohttp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

UPSTREAM = os.environ.get("FLOOR_UPSTREAM", "http://127.0.0.1:18080")
_session: aiohttp.ClientSession | None = None


async def chat(request: Request) -> Response:
    global _session
    if _session is None:
        _session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))
    body = await request.body()
    async with _session.post(
        UPSTREAM + "/v1/chat/completions", data=body, headers={"content-type": "application/json"}
    ) as upstream:
        return Response(await upstream.read(), status_code=upstream.status, media_type="application/json")


app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
