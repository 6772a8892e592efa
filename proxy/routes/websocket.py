"""WebSocket handshakes: answered 426, so a client that can fall back to HTTP does so at once.

Codex 0.169.0 with `supports_websockets = true` on its provider opens the Responses API as a
WebSocket first (`GET /v1/responses`, `Upgrade: websocket`, `openai-beta:
responses_websockets=2026-02-06`). ctxbudget relays HTTP only. Refused with 403 (uvicorn's
default), Codex retried five times with back-off before it fell back to HTTP, ~6 s more on
every `codex exec`; refused with 426 Upgrade Required it falls back after the first
(measured through the real server: 7.8 s → 1.4 s; docs/openclaw.md).
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.websockets import WebSocket

MESSAGE = (
    "ctxbudget relays HTTP only, not WebSocket: send this request over HTTP (Codex: leave "
    "supports_websockets unset or false for this provider)"
)


async def refuse(websocket: WebSocket) -> None:
    """Refuse the handshake with 426 and an OpenAI-shaped error naming the fix."""
    body = {
        "error": {
            "message": MESSAGE,
            "type": "invalid_request_error",
            "param": None,
            "code": "websocket_not_supported",
        }
    }
    try:
        await websocket.send_denial_response(JSONResponse(body, status_code=426))
    except RuntimeError:  # a server without the denial-response extension: a plain refusal
        await websocket.close()
