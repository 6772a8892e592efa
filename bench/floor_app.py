"""The floor: the least a Python proxy on this stack can do (for bench/overhead.py).

Starlette on uvicorn, reading the body and forwarding the raw bytes with one shared aiohttp
session: no parsing, no clamping, no report. What ctxbudget adds beyond this is its own cost.
"""

from __future__ import annotations

import os

import aiohttp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

UPSTREAM = os.environ.get("FLOOR_UPSTREAM", "")
_session: aiohttp.ClientSession | None = None


async def chat(request: Request) -> Response:
    global _session
    if _session is None:
        _session = aiohttp.ClientSession(auto_decompress=False)
    body = await request.body()
    headers = {"content-type": "application/json"}
    async with _session.post(f"{UPSTREAM}/chat/completions", data=body, headers=headers) as r:
        return Response(await r.read(), status_code=r.status, media_type="application/json")


app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
