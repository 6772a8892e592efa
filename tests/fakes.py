"""A fake upstream for in-process tests: canned JSON or SSE, and a record of what it got.

It implements `proxy.upstream.http.UpstreamClient`, the Protocol the pipeline talks to, so the
proxy's own code runs unchanged; only the network is gone. The real stand-in server
(`tests/standin.py`) is for the end-to-end tests.

    fake = FakeUpstream()
    fake.answer_json({"id": "x", ...})            # next requests get this JSON
    fake.answer_sse([b"data: {...}\\n\\n", ...])   # or these SSE chunks
    fake.answer_sse(chunks, broken=True)          # ... then the connection drops
    fake.fail(UpstreamError("down", status=502))  # or this error
    fake.sent[-1].json                            # what the proxy sent
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from ctxbudget.proxy.errors import UpstreamError
from ctxbudget.proxy.upstream.http import Body, Parts


@dataclass
class Sent:
    """One request the proxy sent upstream."""

    method: str
    url: str
    headers: dict[str, str]
    sent: Body | None
    """As the proxy handed it over: whole, or in `Parts`, joined only when read (`body`), as
    a socket writes the pieces without joining them."""
    connect_timeout: float
    read_timeout: float

    @property
    def body(self) -> bytes | None:
        if isinstance(self.sent, Parts):
            self.sent = bytes(self.sent)
        return self.sent

    @property
    def json(self) -> Any:
        return orjson.loads(self.body) if self.body else None


@dataclass
class FakeReply:
    """`UpstreamReply` of canned bytes."""

    status: int
    headers: dict[str, str]
    chunks: list[bytes]
    broken: bool = False
    """Raise after the last chunk, as a dropped connection does."""
    released: bool = False
    closed: bool = False
    read_chunks: int = 0

    async def read(self) -> bytes:
        if self.broken:
            raise ConnectionResetError("connection reset by peer")
        self.released = True
        return b"".join(self.chunks)

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            self.read_chunks += 1
            yield chunk
        if self.broken:
            raise ConnectionResetError("connection reset by peer")

    def close(self) -> None:
        self.closed = True

    def release(self) -> None:
        self.released = True


def chat_completion(text: str = "hello", *, model: str = "m") -> dict[str, Any]:
    """A `chat.completion` JSON body."""
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
    }


def anthropic_message(text: str = "ok", *, output_tokens: int = 2) -> dict[str, Any]:
    """An Anthropic Messages JSON answer."""
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 10, "output_tokens": output_tokens},
    }


def answer_in(fake: FakeUpstream, wire: str) -> None:
    """Have `fake` answer the next request in `wire`'s format (`chat`, `messages` or
    `responses`)."""
    if wire == "responses":
        fake.answer_json(REPLIES["/v1/responses"])
    else:
        fake.answer_json(chat_completion(model="gpt-4o") if wire == "chat" else anthropic_message())


def chat_chunks(text: str = "hello", *, usage: bool = False) -> list[bytes]:
    """SSE `chat.completion.chunk` events for `text`, one per word, ending in [DONE]."""
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    out = []
    for i, word in enumerate(text.split(" ")):
        delta = {"content": word if i == 0 else " " + word}
        choice = {"index": 0, "delta": delta, "finish_reason": None}
        out.append(b"data: " + orjson.dumps({**base, "choices": [choice]}) + b"\n\n")
    stop = {"index": 0, "delta": {}, "finish_reason": "stop"}
    out.append(b"data: " + orjson.dumps({**base, "choices": [stop]}) + b"\n\n")
    if usage:
        counts = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
        out.append(b"data: " + orjson.dumps({**base, "choices": [], "usage": counts}) + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


@dataclass
class FakeUpstream:
    """`UpstreamClient` that answers every request with the canned reply set last."""

    sent: list[Sent] = field(default_factory=list)
    replies: list[FakeReply] = field(default_factory=list)
    started: bool = False
    _answer: tuple[int, dict[str, str], list[bytes], bool] = (
        200,
        {"content-type": "application/json"},
        [orjson.dumps(chat_completion())],
        False,
    )
    _error: UpstreamError | None = None
    hang: bool = False
    """Never answer: wait until cancelled (a slow upstream the client gives up on)."""
    cancelled: int = 0
    """Requests that were cancelled while waiting for the answer."""

    def answer_json(self, body: Any, *, status: int = 200) -> None:
        self._error = None
        self._answer = (status, {"content-type": "application/json"}, [orjson.dumps(body)], False)

    def answer_sse(self, chunks: list[bytes], *, broken: bool = False) -> None:
        self._error = None
        self._answer = (200, {"content-type": "text/event-stream"}, list(chunks), broken)

    def fail(self, error: UpstreamError) -> None:
        self._error = error

    @property
    def last(self) -> Sent:
        return self.sent[-1]

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.started = False

    async def request(
        self,
        method: str,
        url: str,
        *,
        body: Body | None,
        headers: Mapping[str, str],
        connect_timeout: float,
        read_timeout: float,
    ) -> FakeReply:
        self.sent.append(Sent(method, url, dict(headers), body, connect_timeout, read_timeout))
        if self.hang:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if self._error is not None:
            raise self._error
        status, reply_headers, chunks, broken = self._answer
        reply = FakeReply(status, dict(reply_headers), list(chunks), broken)
        self.replies.append(reply)
        return reply


REPLIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        **chat_completion(model="gpt-4o"),
        "usage": {
            "prompt_tokens": 40_000,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 38_000},
        },
    },
    "/v1/messages": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "hello"}],
        "stop_reason": "end_turn",
        "usage": {
            "input_tokens": 2_000,
            "output_tokens": 5,
            "cache_read_input_tokens": 38_000,
            "cache_creation_input_tokens": 0,
        },
    },
    "/v1/responses": {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "model": "gpt-4.1",
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "hello", "annotations": []}],
            }
        ],
        "usage": {
            "input_tokens": 40_000,
            "output_tokens": 5,
            "total_tokens": 40_005,
            "input_tokens_details": {"cached_tokens": 38_000},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    },
}
"""A canned answer in each format, with usage (the benchmarks' upstream)."""
