"""The `/context budget` chat command: recognised in a request, answered by the proxy.

OpenClaw 9.x ends every request with an internal-context user message, stamps user text with
a `[Sun 2026-11-22 11:28 UTC]` prefix and moves its `Runtime:` line into the first user
message, so the command is looked for in the latest *real* user text, after the stamp, and
OpenClaw's appended runtime lines are ignored.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import orjson

from memory.query import INTERNAL_CONTEXT, latest_user, message_text

_RUNTIME_PREFIXES = ("Runtime:", "Reasoning:")
# OpenClaw 9.x stamps user text: "[Sun 2026-11-22 11:28 UTC] Please fetch ..."
_TIMESTAMP = re.compile(r"^\[[^\]\n]{3,64}\]\s*")

CommandMode = Literal["text", "json"]


def latest_user_text(messages: list[Any]) -> str | None:
    """The latest user text, skipping agent-internal blocks; None if the turn isn't a user's."""
    found = latest_user(messages)
    if found is None:
        return None
    index, text = found
    # Only a user's own turn: anything after it (a tool result, an answer) means a tool loop.
    after = [m for m in messages[index + 1 :] if not _internal(m)]
    return None if after else text


def _internal(message: Any) -> bool:
    text = message_text(message) if isinstance(message, dict) else None
    return (
        isinstance(message, dict)
        and message.get("role") == "user"
        and text is not None
        and text.lstrip().startswith(INTERNAL_CONTEXT)
    )


def find_command(messages: list[Any]) -> CommandMode | None:
    """`"text"` or `"json"` when the latest user text is `/context budget [json]`."""
    text = latest_user_text(messages)
    if text is None:
        return None
    lines = [line.strip() for line in text.strip().splitlines()]
    if not lines:
        return None
    if any(line and not line.startswith(_RUNTIME_PREFIXES) for line in lines[1:]):
        return None
    words = _TIMESTAMP.sub("", lines[0]).split()
    if words == ["/context", "budget"]:
        return "text"
    if words == ["/context", "budget", "json"]:
        return "json"
    return None


def completion(text: str, *, model: str, request_id: str) -> bytes:
    """A complete `chat.completion` answering with `text`."""
    return orjson.dumps(
        {
            "id": f"chatcmpl-{request_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
    )


async def completion_stream(
    text: str, *, model: str, request_id: str, include_usage: bool
) -> AsyncIterator[bytes]:
    """The same answer as SSE `chat.completion.chunk`s ending in `data: [DONE]`."""
    created = int(time.time())
    base = {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
    }

    def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
        body = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + orjson.dumps(body) + b"\n\n"

    yield chunk({"role": "assistant", "content": ""}, None)
    for start in range(0, len(text), 400):
        yield chunk({"content": text[start : start + 400]}, None)
    yield chunk({}, "stop")
    if include_usage:
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        yield b"data: " + orjson.dumps({**base, "choices": [], "usage": usage}) + b"\n\n"
    yield b"data: [DONE]\n\n"
