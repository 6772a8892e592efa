"""WebSocket handshakes: answered 426, so a client that can fall back to HTTP does so at once.

Codex 0.169.0 with `supports_websockets = true` on its provider opens the Responses API as a
WebSocket first (`GET /v1/responses`, `Upgrade: websocket`, `openai-beta:
responses_websockets=2026-02-06`). ctxbudget relays HTTP only. Refused with 403 (uvicorn's
default), Codex retried five times with back-off before it fell back to HTTP, ~6 s more on
every `codex exec`; refused with 426 Upgrade Required it falls back after the first
(measured through the real server: 7.8 s → 1.4 s; docs/openclaw.md).

Two doors, one answer: `refuse` is the app's WebSocket route (any ASGI server, the tests'
clients), and `Refusal` is the WebSocket protocol `serve` and the demo give uvicorn, so the
handshake never reaches a WebSocket library. Under uvicorn's default (the `websockets`
library) a handshake that library found malformed — an old `Sec-WebSocket-Version`, a missing
or bad key, a POST — was answered by the library itself, 400 or 405 in plain text, before the
app's 426 (issue 35).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import orjson
from starlette.responses import JSONResponse
from starlette.websockets import WebSocket

MESSAGE = (
    "ctxbudget relays HTTP only, not WebSocket: send this request over HTTP (Codex: leave "
    "supports_websockets unset or false for this provider)"
)
STATUS = 426


def refusal() -> dict[str, Any]:
    """The refusal's body: OpenAI's error shape, naming the fix."""
    return {
        "error": {
            "message": MESSAGE,
            "type": "invalid_request_error",
            "param": None,
            "code": "websocket_not_supported",
        }
    }


async def refuse(websocket: WebSocket) -> None:
    """Refuse the handshake with 426 and an OpenAI-shaped error naming the fix."""
    try:
        await websocket.send_denial_response(JSONResponse(refusal(), status_code=STATUS))
    except RuntimeError:  # a server without the denial-response extension: a plain refusal
        await websocket.close()


class Refusal(asyncio.Protocol):
    """uvicorn's WebSocket protocol (`ws=`): whatever the handshake, the 426 `refuse` gives,
    then the connection closed. Nothing of the request is read past what uvicorn hands over
    (its head), and nothing reaches the app: there is nothing to authenticate or forward."""

    def __init__(self, config: Any = None, server_state: Any = None, **_: Any) -> None:
        # uvicorn builds it with its config and server state, which a refusal does not need
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's is one without subclassing asyncio's classes)
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return  # answered already: the rest of what the client sends is dropped
        body = orjson.dumps(refusal())
        head = (
            f"HTTP/1.1 {STATUS} Upgrade Required\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        transport.write(head.encode("ascii") + body)
        transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
