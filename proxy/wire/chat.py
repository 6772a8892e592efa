"""OpenAI chat completions (`POST /v1/chat/completions`): the first wire adapter.

System prompt: `system`/`developer` messages. Tool results: `tool` messages, named by the
assistant's `tool_calls`. Latest user turn: the last `user` message that is not OpenClaw's
internal-context block. Changes are spliced back into the client's bytes (`proxy/wire/body.py`):
only `messages` is re-serialised, and only when something changed.
"""

from __future__ import annotations

import copy
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import orjson

from ctxbudget.caps import Caps, Clamp, Segment, ToolNames
from ctxbudget.memory.inject import Placement, inject
from ctxbudget.memory.query import UserTurn, user_turn
from ctxbudget.proxy.cache.blocks import Block
from ctxbudget.proxy.config.settings import Settings
from ctxbudget.proxy.errors import CtxBudgetError
from ctxbudget.proxy.upstream.http import Body, forward_request_headers
from ctxbudget.proxy.wire.body import ChatBody, check_text_part, parse_chat_body
from ctxbudget.proxy.wire.conversations import Conversations
from ctxbudget.proxy.wire.pruned import chat_ids, second_pass
from ctxbudget.proxy.wire.types import (
    Asker,
    InProcessRequest,
    Reply,
    WireFormat,
    WireRequest,
    resumed,
)
from ctxbudget.proxy.wire.view import with_text

_SYSTEM_ROLES = ("system", "developer")
_TEXT_KINDS = ("text",)


class ChatCompletionsRequest(InProcessRequest):
    """A parsed chat completions request (`WireRequest`)."""

    _body: ChatBody

    def __init__(self, body: ChatBody) -> None:
        self.raw = body.raw
        self.note: str | None = None
        self._body = body
        self.messages: list[Any] = body.messages
        model = body.get("model")
        self.model: str | None = model
        self.stream: bool = body.get("stream") is True
        self._turn: tuple[UserTurn | None] | None = None
        self._options: dict[str, Any] | None = None
        """`stream_options` as forwarded, when the proxy changed them."""

    @property
    def changed(self) -> bool:
        return self.messages is not self._body.messages or self._options is not None

    def ask_usage(self) -> bool:
        """Ask the upstream for usage on a stream whose client did not
        (`stream_options.include_usage`); True when the body changed for it, and the
        usage-only chunk must be dropped from what the client sees."""
        if not self.stream:
            return False
        options = self._body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            return False
        if options is not None and not isinstance(options, dict):
            return False  # the client's own mistake: the upstream says so, not us
        self._options = {**(options or {}), "include_usage": True}
        return True

    def forget_usage(self) -> None:
        """Undo `ask_usage`: the body goes as the client sent it."""
        self._options = None

    def get(self, key: str) -> Any:
        """A top-level field as a Python value."""
        return self._body.get(key)

    def user_turn(self) -> UserTurn | None:
        if self._turn is None:  # found once, before anything changes the messages
            self._turn = (user_turn(self.messages),)
        return self._turn[0]

    def system_text(self) -> str:
        return "".join(
            m["content"]
            for m in self.messages
            if isinstance(m, dict)
            and m.get("role") in _SYSTEM_ROLES
            and isinstance(m.get("content"), str)
        )

    def clamp(self, clamp: Clamp, caps: Caps, tools: ToolNames, *, apply: bool) -> list[Segment]:
        if caps.pruned:  # the second pass: pruning's decisions applied
            return self._prune(clamp, caps, tools, apply=apply)
        if self.messages is self._body.messages:  # as parsed: the conversation's to resume
            found = self._body.extended("messages")
            state = found[0].clamp if found is not None else None
            resume = (state, found[1]) if found is not None and state is not None else None
            result = resumed(clamp, self._body, self.messages, caps, tools, resume=resume)
            if apply and result.changed:
                self.messages = result.request["messages"]
                self._clamped_by(result.state, self.messages)
            return list(result.segments)
        # a second pass over what the first changed: its own
        result = clamp({"messages": self.messages}, caps, tools=tools)
        if apply and result.changed:
            self.messages = result.request["messages"]
        return list(result.segments)

    def _prune(self, clamp: Clamp, caps: Caps, tools: ToolNames, *, apply: bool) -> list[Segment]:
        """Pruning's pass, carried from the conversation's last request (`second_pass`)."""
        messages = self.messages

        def whole() -> tuple[list[Any], list[Segment]]:
            result = clamp({"messages": messages}, caps, tools=tools)
            return (result.request["messages"] if result.changed else messages), list(
                result.segments
            )

        out, segments = second_pass(self._body, "messages", messages, caps, whole, chat_ids)
        if apply and out is not messages:
            self.messages = out
        return segments

    def inject(self, lines: Sequence[str], placement: Placement) -> None:
        self.messages = inject(self.messages, list(lines), placement)

    def blocks(self) -> list[Block]:
        return self._blocks_of((self.messages,), self._make_blocks)

    def _make_blocks(self) -> list[Block]:
        tools = self._body.raw_field("tools")
        head = [Block("tools", tools, tools)] if tools is not None else []
        return head + self._paired(self._body.messages, self.messages)

    def place_memory(self, index: int, text: str) -> None:
        at = index - (self._body.raw_field("tools") is not None)
        if 0 <= at < len(self.messages):
            self.messages = with_text(self.messages, at, text, "text")

    def encode(self) -> Body:
        if not self.changed:
            return self.raw
        changes: dict[str, Any] = {}
        if self.messages is not self._body.messages:
            changes["messages"] = self.messages
        if self._options is not None:
            changes["stream_options"] = self._options
        # what the clamp kept of the last request's list: written back as it was then
        return self._body.encode(changes, clamped=self.__dict__.get("_clamped"))

    def litellm_body(self) -> dict[str, Any]:
        # litellm's own copy: its provider adapters may change messages in place, and these
        # are shared with the owner's later requests (`proxy/cache/resent.py`)
        return self._body.to_dict({"messages": copy.deepcopy(self.messages)})


class ChatCompletions:
    """The chat completions format (`WireFormat`)."""

    name = "chat"
    provider = "openai"

    def parse(
        self, raw: bytes, *, owner: str = "default", conversations: Conversations | None = None
    ) -> ChatCompletionsRequest:
        body = parse_chat_body(raw, owner, conversations)
        messages = body.messages
        # the items the conversation's last request had passed: only the new ones are checked
        found = body.extended("messages")
        start = 0
        if found is not None and isinstance(found[0].checked, int):
            start = min(found[1], found[0].checked)
        _check_texts(messages, start)
        if body.conversation is not None:
            body.conversation.checked = len(messages)
        return ChatCompletionsRequest(body)

    generates = True

    def upstream_url(self, settings: Settings, path: str, query: str) -> str:
        return settings.upstream_url("/chat/completions", query)

    def upstream_headers(self, headers: Mapping[str, str], settings: Settings) -> dict[str, str]:
        return openai_headers(headers, settings)

    def admit(self, request: WireRequest, owner: str) -> None:
        return None

    def in_worker(self, owner: str, ask: Asker) -> tuple[WireFormat, Asker | None]:
        return self, None

    def watch_reply(self, request: WireRequest, owner: str) -> None:
        return None

    def error_body(self, error: CtxBudgetError) -> dict[str, Any]:
        return error.to_dict()

    def stream_error(self, error: CtxBudgetError) -> bytes:
        return b"data: " + orjson.dumps(error.to_dict()) + b"\n\n"

    def command_reply(self, text: str, request: WireRequest, *, request_id: str) -> Reply:
        model = request.model or "ctxbudget"
        if not request.stream:
            return Reply(completion(text, model=model, request_id=request_id), "application/json")
        options = None
        if isinstance(request, ChatCompletionsRequest):
            options = request.get("stream_options")
        usage = isinstance(options, dict) and bool(options.get("include_usage"))
        return Reply(
            completion_stream(text, model=model, request_id=request_id, include_usage=usage),
            "text/event-stream",
        )


def openai_headers(headers: Mapping[str, str], settings: Settings) -> dict[str, str]:
    """Headers for an OpenAI-compatible upstream: `authorization: Bearer` is the credential."""
    if settings.upstream_api_key:
        authorization: str | None = f"Bearer {settings.upstream_api_key}"
    elif settings.proxy_keys:
        authorization = None  # the client's header holds a proxy key, not a provider key
    else:
        authorization = headers.get("authorization")
    out = forward_request_headers(headers, authorization)
    if settings.proxy_keys:  # a proxy key may also come as x-api-key: it never goes upstream
        out = {k: v for k, v in out.items() if k.lower() != "x-api-key"}
    return out


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
    base = {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
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


def _check_texts(messages: list[Any], start: int = 0) -> None:
    """400 for a content part whose text is not a string, as OpenAI answers it. Other odd
    shapes (a role or `tool_calls` of the wrong type) the clamp leaves as sent, and the
    upstream says what it thinks of them. `start`: the messages before it passed already."""
    for index in range(start, len(messages)):
        message = messages[index]
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            for i, part in enumerate(content):
                # the usual part (a string text) costs one lookup: ~0.1 µs, not a call's ~0.8
                if isinstance(part, dict) and not isinstance(part.get("text"), str):
                    check_text_part(part, f"messages[{index}].content[{i}]", _TEXT_KINDS)
