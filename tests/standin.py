"""A stand-in upstream LLM on 127.0.0.1 that speaks the exact OpenAI (and Anthropic) wire format.

The only stand-in in the test suite: the proxy in front of it is the real one. Behaviour is
driven by an `x_standin` object in the request body, which the proxy forwards untouched as an
unknown field:

    {"status": 429, "retry_after": "7"}   answer with that error status
    {"delay": 2.0}                        wait before answering (timeouts)
    {"chunks": 5, "chunk_delay": 0.3}     SSE pacing
    {"endless": true}                     stream until the client goes away
    {"tool_calls": true}                  answer with a web_fetch tool call

In a test: `with run_standin() as s: ... s.base_url ... s.received`. As a process (for the
benchmarks): `python -m tests.standin --port 0` prints `STANDIN_PORT=<port>`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class StandIn:
    """State of a running stand-in: what it received, and what became of its streams."""

    def __init__(self, *, record: bool = True) -> None:
        self.record = record
        self.received: list[Received] = []
        self.streams_completed = 0
        self.streams_cancelled = 0
        self.port = 0
        self.replies: dict[str, str] = {}
        """Model name → the assistant text to answer it with (default: a received-count line)."""

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    @property
    def anthropic_api_base(self) -> str:
        """What litellm takes as `api_base` for Anthropic (it posts to `<base>/v1/messages`)."""
        return self.root

    @property
    def last_json(self) -> Any:
        return self.received[-1].json

    def reset(self) -> None:
        self.received.clear()
        self.replies.clear()


def _error(status: int, message: str, retry_after: str | None = None) -> Response:
    headers = {"retry-after": retry_after} if retry_after else {}
    body = {"error": {"message": message, "type": "standin_error", "param": None, "code": None}}
    return JSONResponse(body, status_code=status, headers=headers)


def create_standin(state: StandIn) -> Starlette:
    async def record(request: Request) -> tuple[bytes, Any]:
        body = await request.body()
        if state.record:
            state.received.append(
                Received(request.method, request.url.path, dict(request.headers), body)
            )
        try:
            return body, json.loads(body) if body else None
        except ValueError:
            return body, None

    async def chat(request: Request) -> Response:
        _, data = await record(request)
        if not isinstance(data, dict):
            return _error(400, "body is not a JSON object")
        control = data.get("x_standin") or {}
        await asyncio.sleep(float(control.get("delay", 0)))
        if control.get("status"):
            return _error(int(control["status"]), "standin error", control.get("retry_after"))
        model = data.get("model", "standin")
        text = state.replies.get(
            str(model), f"standin: received {len(data.get('messages') or [])} messages"
        )
        cid = "chatcmpl-" + uuid.uuid4().hex[:12]
        created = int(time.time())
        tool = bool(control.get("tool_calls"))
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if not data.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": None if tool else text}
            if tool:
                message["tool_calls"] = [_tool_call()]
            return JSONResponse(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "logprobs": None,
                            "finish_reason": "tool_calls" if tool else "stop",
                        }
                    ],
                    "usage": usage,
                }
            )
        include_usage = bool((data.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            body = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return b"data: " + json.dumps(body).encode() + b"\n\n"

        async def events() -> AsyncIterator[bytes]:
            delay = float(control.get("chunk_delay", 0))
            done = False
            try:
                yield chunk({"role": "assistant", "content": ""})
                if control.get("endless"):
                    while True:
                        await asyncio.sleep(delay or 0.05)
                        yield chunk({"content": "."})
                if tool:
                    call = _tool_call()
                    yield chunk(
                        {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    **call,
                                    "function": {"name": "web_fetch", "arguments": ""},
                                }
                            ]
                        }
                    )
                    yield chunk(
                        {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "function": {"arguments": call["function"]["arguments"]},
                                }
                            ]
                        }
                    )
                    yield chunk({}, "tool_calls")
                else:
                    n = max(1, int(control.get("chunks", 3)))
                    step = -(-len(text) // n)
                    for i in range(0, len(text), step):
                        if delay:
                            await asyncio.sleep(delay)
                        yield chunk({"content": text[i : i + step]})
                    yield chunk({}, "stop")
                if include_usage:
                    body = {
                        "id": cid,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": usage,
                    }
                    yield b"data: " + json.dumps(body).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"
                done = True
            finally:
                if done:
                    state.streams_completed += 1
                else:
                    state.streams_cancelled += 1

        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        await record(request)
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "created": 1700000000, "owned_by": "standin"}
                    for m in ("standin-1", "standin-2")
                ],
            }
        )

    async def messages(request: Request) -> Response:
        """Anthropic Messages API."""
        _, data = await record(request)
        if not (request.headers.get("x-api-key") or request.headers.get("authorization")):
            return _anthropic_error(401, "authentication_error", "missing x-api-key")
        if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
            return _anthropic_error(400, "invalid_request_error", "messages: field required")
        for m in data["messages"]:
            if m.get("role") not in ("user", "assistant"):
                return _anthropic_error(400, "invalid_request_error", f"bad role {m.get('role')}")
        if not isinstance(data.get("max_tokens"), int):
            return _anthropic_error(400, "invalid_request_error", "max_tokens: field required")
        text = f"standin: received {len(data['messages'])} messages"
        mid = "msg_" + uuid.uuid4().hex[:12]
        model = data.get("model", "claude")
        if not data.get("stream"):
            return JSONResponse(
                {
                    "id": mid,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [{"type": "text", "text": text}],
                    "stop_reason": "end_turn",
                    "stop_sequence": None,
                    "usage": {"input_tokens": 12, "output_tokens": 6},
                }
            )

        def event(name: str, body: dict[str, Any]) -> bytes:
            return f"event: {name}\ndata: {json.dumps(body)}\n\n".encode()

        async def events() -> AsyncIterator[bytes]:
            yield event(
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": mid,
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": {"input_tokens": 12, "output_tokens": 1},
                    },
                },
            )
            yield event(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
            )
            yield event("ping", {"type": "ping"})
            for i in range(0, len(text), 8):
                yield event(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": text[i : i + 8]},
                    },
                )
            yield event("content_block_stop", {"type": "content_block_stop", "index": 0})
            yield event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 6},
                },
            )
            yield event("message_stop", {"type": "message_stop"})

        return StreamingResponse(events(), media_type="text/event-stream")

    async def received(request: Request) -> Response:
        return JSONResponse(
            [
                {
                    "method": r.method,
                    "path": r.path,
                    "headers": r.headers,
                    "body": r.body.decode(errors="replace"),
                }
                for r in state.received
            ]
        )

    async def reset(request: Request) -> Response:
        state.reset()
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/_standin/received", received, methods=["GET"]),
            Route("/_standin/reset", reset, methods=["POST"]),
        ]
    )


def _tool_call() -> dict[str, Any]:
    return {
        "id": "call_web_fetch_1",
        "type": "function",
        "function": {"name": "web_fetch", "arguments": '{"url": "https://example.com"}'},
    }


def _anthropic_error(status: int, kind: str, message: str) -> Response:
    return JSONResponse(
        {"type": "error", "error": {"type": kind, "message": message}}, status_code=status
    )


@contextmanager
def serve_app(app: Any) -> Iterator[int]:
    """Serve an ASGI app with uvicorn on an ephemeral 127.0.0.1 port in a thread; yield it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield int(sock.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@contextmanager
def run_standin(*, record: bool = True) -> Iterator[StandIn]:
    """Serve a stand-in on an ephemeral 127.0.0.1 port in a background thread."""
    state = StandIn(record=record)
    with serve_app(create_standin(state)) as port:
        state.port = port
        yield state


def main() -> None:
    parser = argparse.ArgumentParser(description="stand-in OpenAI upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--record", action="store_true", help="keep received requests")
    args = parser.parse_args()
    state = StandIn(record=args.record)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    state.port = sock.getsockname()[1]
    print(f"STANDIN_PORT={state.port}", flush=True)
    config = uvicorn.Config(create_standin(state), log_level="warning", lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
