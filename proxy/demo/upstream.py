"""The demo's built-in upstream: an OpenAI chat completions endpoint that answers without a
model, and bills as OpenAI does.

It speaks the wire an agent's base URL expects — `POST /v1/chat/completions`, a JSON body
or SSE chunks ending in `data: [DONE]`, `GET /v1/models` — and reports usage the way the
provider does, so the proxy's report has real figures to show: `prompt_tokens` counted with
tiktoken's o200k_base over each tool definition and message (canonical JSON), of which
`prompt_tokens_details.cached_tokens` is the longest prefix of whole tools and messages it
has seen before (OpenAI's automatic prompt caching, its 1,024-token minimum aside), and a
usage chunk at the end of a stream that asked for one (`stream_options.include_usage`).

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
        """What the provider would bill for `body`: its prompt, the cached part, the answer."""
        parts = [("tool", t) for t in body.get("tools") or []]
        parts += [("message", m) for m in body.get("messages") or []]
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

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ]
    )
