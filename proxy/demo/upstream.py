"""The demo's built-in upstream: the three wire formats agents speak, answered without a
model, billed as OpenAI bills.

It speaks the wire an agent's base URL expects — `POST /v1/chat/completions` (OpenClaw), a JSON
body or SSE chunks ending in `data: [DONE]`, `GET /v1/models`; `POST /v1/messages` (Claude
Code, OpenClaw on Claude) and `POST /v1/responses` (Codex), JSON or their SSE events — and
reports usage the way the provider does, so the proxy's report has real figures to show:
`prompt_tokens` counted with tiktoken's o200k_base over each tool definition and message
(canonical JSON), of which `prompt_tokens_details.cached_tokens` is the longest prefix of whole
tools and messages it has seen before (OpenAI's automatic prompt caching, its 1,024-token
minimum aside), and a usage chunk at the end of a stream that asked for one
(`stream_options.include_usage`). Messages and Responses are billed the same way, in their own
usage fields (Messages: reads only, no cache writes: a demo has no breakpoints to honour).

Every answer is the same canned text; nothing is sent anywhere.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from proxy.tokens import TokenCounter

ENCODING = "o200k_base"
ANSWER = (
    "(ctxbudget demo: a stand-in answered, no model was asked.) The release notes say the "
    "deadline moved to Friday."
)
MODELS = ("gpt-5.5", "gpt-5.4-mini")
KEEP_PREFIXES = 100_000
"""Prefix digests remembered; past this the imitated cache starts over."""


class DemoUpstream:
    """The stand-in's state: the prompt prefixes it has cached, and what it billed."""

    def __init__(self) -> None:
        self.tokens = TokenCounter()
        self.cached: set[str] = set()
        self.billed: list[dict[str, Any]] = []
        """Each answer's `usage`, in order."""

    def usage(self, body: dict[str, Any], answer: str) -> dict[str, Any]:
        """What the provider would bill for `body`: its prompt, the cached part, the answer
        (chat completions' usage fields; the other formats rename them)."""
        parts = [("tool", t) for t in body.get("tools") or []]
        for key in ("system", "instructions"):  # Messages' and Responses' system prompt
            if body.get(key):
                parts.append((key, body[key]))
        messages = body.get("messages")
        if messages is None:  # Responses: a string or a list of items
            items = body.get("input")
            messages = items if isinstance(items, list) else [items]
        parts += [("message", m) for m in messages or []]
        digest = hashlib.sha256()
        prompt = cached = 0
        seen: list[str] = []
        for kind, part in parts:
            text = json.dumps([kind, part], sort_keys=True, ensure_ascii=False)
            digest.update(text.encode("utf-8", "surrogatepass"))
            prompt += self.tokens.count(text, ENCODING)
            key = digest.hexdigest()
            if key in self.cached:
                cached = prompt
            seen.append(key)
        if len(self.cached) > KEEP_PREFIXES:
            self.cached.clear()
        self.cached.update(seen)
        output = self.tokens.count(answer, ENCODING)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "total_tokens": prompt + output,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        self.billed.append(usage)
        return usage


def create_upstream(state: DemoUpstream | None = None) -> Starlette:
    """The stand-in's ASGI app."""
    upstream = state or DemoUpstream()

    async def chat(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            error = {"message": "body must be a JSON object with messages", "type": "invalid"}
            return JSONResponse({"error": error}, status_code=400)
        model = str(body.get("model") or MODELS[0])
        usage = upstream.usage(body, ANSWER)
        cid = "chatcmpl-demo" + uuid.uuid4().hex[:12]
        created = int(time.time())
        if not body.get("stream"):
            return JSONResponse(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": ANSWER},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": usage,
                }
            )
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            data = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": choices,
                **extra,
            }
            return b"data: " + json.dumps(data).encode() + b"\n\n"

        async def events() -> AsyncIterator[bytes]:
            yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}}])
            for word in ANSWER.split(" "):
                yield chunk([{"index": 0, "delta": {"content": word + " "}}])
            yield chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}])
            if include_usage:
                yield chunk([], usage=usage)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "demo"} for m in MODELS]
        return JSONResponse({"object": "list", "data": data})

    async def messages(request: Request) -> Response:
        body = await _body(request, "messages")
        if body is None:
            error = {"type": "invalid_request_error", "message": "messages: a list is required"}
            return JSONResponse({"type": "error", "error": error}, status_code=400)
        used = upstream.usage(body, ANSWER)
        cached = used["prompt_tokens_details"]["cached_tokens"]
        message = {
            "id": "msg_demo" + uuid.uuid4().hex[:12],
            "type": "message",
            "role": "assistant",
            "model": str(body.get("model") or "claude-demo"),
            "content": [{"type": "text", "text": ANSWER}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": used["prompt_tokens"] - cached,
                "cache_read_input_tokens": cached,
                "cache_creation_input_tokens": 0,
                "output_tokens": used["completion_tokens"],
            },
        }
        if not body.get("stream"):
            return JSONResponse(message)
        return StreamingResponse(_message_events(message), media_type="text/event-stream")

    async def responses(request: Request) -> Response:
        body = await _body(request, "input")
        if body is None:
            error = {"type": "invalid_request_error", "message": "input is required"}
            return JSONResponse({"error": error}, status_code=400)
        used = upstream.usage(body, ANSWER)
        text = {"type": "output_text", "text": ANSWER, "annotations": []}
        item = {
            "id": "msg_demo" + uuid.uuid4().hex[:12],
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [text],
        }
        response = {
            "id": "resp_demo" + uuid.uuid4().hex[:12],
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": str(body.get("model") or MODELS[0]),
            "output": [item],
            # what the SDKs' Response model reads: a demo uses no tools and no previous response
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "metadata": {},
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": used["prompt_tokens"],
                "input_tokens_details": used["prompt_tokens_details"],
                "output_tokens": used["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": used["total_tokens"],
            },
        }
        if not body.get("stream"):
            return JSONResponse(response)
        return StreamingResponse(_response_events(response), media_type="text/event-stream")

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/v1/responses", responses, methods=["POST"]),
        ]
    )


async def _body(request: Request, needs: str) -> dict[str, Any] | None:
    """The request's JSON object, or None when it is not one or lacks `needs`."""
    try:
        body = json.loads(await request.body())
    except ValueError:
        return None
    return body if isinstance(body, dict) and body.get(needs) is not None else None


def _words() -> list[str]:
    """The answer in pieces that add up to it exactly, as a stream's deltas must."""
    words = ANSWER.split(" ")
    return [w + " " for w in words[:-1]] + words[-1:]


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


async def _message_events(message: dict[str, Any]) -> AsyncIterator[bytes]:
    """`message` as Anthropic streams it: start, one text block word by word, delta, stop."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    yield _event("message_start", {"type": "message_start", "message": start})
    block = {"type": "text", "text": ""}
    yield _event(
        "content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}
    )
    for word in _words():
        delta = {"type": "text_delta", "text": word}
        yield _event(
            "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
        )
    yield _event("content_block_stop", {"type": "content_block_stop", "index": 0})
    end = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    yield _event(
        "message_delta",
        {"type": "message_delta", "delta": end, "usage": {"output_tokens": usage["output_tokens"]}},
    )
    yield _event("message_stop", {"type": "message_stop"})


async def _response_events(response: dict[str, Any]) -> AsyncIterator[bytes]:
    """`response` as the Responses API streams it, `sequence_number` on every event: created,
    the message item added, its text word by word, done, completed."""
    numbers = iter(range(1_000_000))

    def event(kind: str, **fields: Any) -> bytes:
        return _event(kind, {"type": kind, "sequence_number": next(numbers), **fields})

    pending = {**response, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=pending)
    yield event("response.in_progress", response=pending)
    item = response["output"][0]
    at = {"item_id": item["id"], "output_index": 0}
    yield event(
        "response.output_item.added",
        output_index=0,
        item={**item, "status": "in_progress", "content": []},
    )
    part = item["content"][0]
    yield event("response.content_part.added", **at, content_index=0, part={**part, "text": ""})
    for word in _words():
        yield event("response.output_text.delta", **at, content_index=0, delta=word)
    yield event("response.output_text.done", **at, content_index=0, text=ANSWER)
    yield event("response.content_part.done", **at, content_index=0, part=part)
    yield event("response.output_item.done", output_index=0, item=item)
    yield event("response.completed", response=response)
