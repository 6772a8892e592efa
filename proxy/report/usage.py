"""The provider's usage, read from every reply: input, cache reads, cache writes, output.

Each format puts it somewhere else, with its own meaning for "input":

- chat completions: `usage` of the JSON body, or of the last SSE chunk when the request set
  `stream_options.include_usage` — `prompt_tokens` counts cached tokens too
  (`prompt_tokens_details.cached_tokens`), and cache writes where the upstream reports them
  (`cache_creation_input_tokens`, or litellm's `prompt_tokens_details.cache_write_tokens` and
  `cache_creation_token_details`, split by lifetime as Anthropic's);
- Anthropic Messages: `usage` of the body, or `message_start`'s `message.usage` then
  `message_delta`'s `usage` — `input_tokens` is already the uncached part, beside
  `cache_read_input_tokens` and `cache_creation_input_tokens`, which `cache_creation` splits
  by the cache's lifetime (`ephemeral_5m_input_tokens`, `ephemeral_1h_input_tokens`: a 1-hour
  write costs 2× input, a 5-minute one 1.25×);
- Responses: `usage` of the body, or `response.completed`'s `response.usage` —
  `input_tokens` counts cached tokens too (`input_tokens_details.cached_tokens`).

`Usage.input` is always the uncached input as billed. The reader keeps the relay cheap: SSE
bytes are only split into lines, and only a line holding `"usage"` is parsed.

>>> reader = UsageReader("messages")
>>> reader.feed(b'event: message_start\\ndata: {"message": {"usage": {"input_tokens": 5, "cache_')
>>> reader.feed(b'read_input_tokens": 90, "output_tokens": 1}}}\\n\\n')
>>> reader.feed(b'data: {"type": "message_delta", "usage": {"output_tokens": 7}}\\n\\n')
>>> reader.result()
Usage(input=5, cache_read=90, cache_write=0, output=7, cache_write_1h=0)
>>> UsageReader("chat").read_json(b'{"usage": {"prompt_tokens": 100, "completion_tokens": 3, '
...     b'"prompt_tokens_details": {"cached_tokens": 64}}}')
Usage(input=36, cache_read=64, cache_write=0, output=3, cache_write_1h=0)
>>> UsageReader("messages").read_json(b'{"usage": {"input_tokens": 4, "output_tokens": 9, '
...     b'"cache_creation_input_tokens": 700, "cache_creation": {"ephemeral_5m_input_tokens": '
...     b'200, "ephemeral_1h_input_tokens": 500}}}')
Usage(input=4, cache_read=0, cache_write=700, output=9, cache_write_1h=500)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from ctxbudget.proxy.sse import EVENT, LINE, Splitter, data_lines, event_data, split_events

MARKER = b'"usage"'
"""Bytes a reply line holds only where usage may be (a quote inside a string is escaped)."""
_NULLS = (b'"usage":null', b'"usage": null')
"""OpenAI puts `"usage":null` in every chunk of a stream that asked for usage but the last."""


def _has_usage(data: bytes) -> bool:
    """Whether `data` may hold a usage object: a `"usage"` key not followed by null. Counting
    runs in C: a stream of `"usage":null` chunks is not parsed chunk by chunk."""
    found = data.count(MARKER)
    return found > 0 and found > sum(data.count(null) for null in _NULLS)


_DETAILS = ("prompt_tokens_details", "input_tokens_details")
_DETAIL_COUNTS = ("cached_tokens", "cache_write_tokens")
_WRITE_DETAILS = ("cache_creation", "cache_creation_token_details")
"""Anthropic's `usage.cache_creation`; litellm's `prompt_tokens_details.cache_creation_token_
details` (an Anthropic model behind a chat completions route): writes by the cache's lifetime."""
_TTL_COUNTS = ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")


@dataclass(frozen=True, kw_only=True)
class Usage:
    """One reply's tokens, as the provider bills them."""

    input: int
    """Uncached input tokens."""
    cache_read: int
    """Input tokens read from the provider's prompt cache."""
    cache_write: int
    """Input tokens written to the provider's prompt cache."""
    output: int
    """Output tokens (reasoning included)."""
    cache_write_1h: int = 0
    """Of `cache_write`, the tokens written to a 1-hour cache (Anthropic's `ttl: "1h"`, billed
    at 2× input); the rest were written for 5 minutes (1.25×)."""

    @property
    def cache_write_5m(self) -> int:
        """Of `cache_write`, the tokens written to a 5-minute cache (the default lifetime)."""
        return self.cache_write - self.cache_write_1h

    def to_dict(self) -> dict[str, int]:
        """The report's `usage` object (`cacheWrite1h`: of `cacheWrite`, the 1-hour writes)."""
        return {
            "input": self.input,
            "cacheRead": self.cache_read,
            "cacheWrite": self.cache_write,
            "output": self.output,
            "cacheWrite1h": self.cache_write_1h,
        }


class UsageReader:
    """Reads the usage of one reply of format `wire` (`chat`, `messages`, `responses`):
    SSE bytes as relayed (`feed`, any chunking), or a whole JSON body (`read_json`)."""

    def __init__(self, wire: str) -> None:
        self._wire = wire
        self._fields: dict[str, int] = {}
        self.response_id: str | None = None
        """The reply's id, from the event that carries its usage."""
        self.response_model: str | None = None
        """The model that answered, from the same event."""
        self._lines = Splitter(LINE)
        self._result: tuple[dict[str, int], Usage] | None = None
        """The last `result`, and the fields it was made of."""

    def feed(self, chunk: bytes) -> None:
        """The next bytes of an SSE reply."""
        data = self._lines.feed(chunk)
        if _has_usage(data):
            for payload in data_lines(data, MARKER):
                if _has_usage(payload):
                    self._event(payload)

    def read_json(self, body: bytes) -> Usage | None:
        """The usage of a whole JSON reply, or None."""
        if MARKER in body:
            self._event(body)
        return self.result()

    def result(self) -> Usage | None:
        """The reply's usage so far, or None when it had none."""
        rest = self._lines.rest()  # a last line without its newline
        if _has_usage(rest):
            self.feed(rest + b"\n")
        f = self._fields
        if not f:
            return None
        if self._result is not None and self._result[0] == f:
            return self._result[1]  # asked again (the record, after the reply's headers)
        found = self._usage(f)
        self._result = (dict(f), found)
        return found

    def _usage(self, f: dict[str, int]) -> Usage:
        read = f.get("cache_read_input_tokens", f.get("cached_tokens", 0))
        short, long = (f.get(key, 0) for key in _TTL_COUNTS)
        write = f.get("cache_creation_input_tokens", f.get("cache_write_tokens", short + long))
        if self._wire == "chat":
            total = f.get("prompt_tokens", f.get("input_tokens", 0))
            output = f.get("completion_tokens", f.get("output_tokens", 0))
        else:
            total = f.get("input_tokens", 0)
            output = f.get("output_tokens", 0)
        # Anthropic's input_tokens is the uncached part already; OpenAI's counts the cache in.
        uncached = total if self._wire == "messages" else max(0, total - read - write)
        return Usage(
            input=uncached,
            cache_read=read,
            cache_write=write,
            output=output,
            cache_write_1h=min(long, write),
        )

    def _event(self, data: bytes) -> None:
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(event, dict):
            return
        holder: Any = event
        usage = event.get("usage")
        if not isinstance(usage, dict):  # Messages' message_start, Responses' response.*
            holder = event.get("message") or event.get("response")
            usage = holder.get("usage") if isinstance(holder, dict) else None
        if not isinstance(usage, dict):
            return
        for key, attr in (("id", "response_id"), ("model", "response_model")):
            if isinstance(holder.get(key), str):
                setattr(self, attr, holder[key])
        for key, value in usage.items():
            if key in _DETAILS and isinstance(value, dict):
                self._counts(value, _DETAIL_COUNTS)
                for inner in _WRITE_DETAILS:
                    if isinstance(value.get(inner), dict):
                        self._counts(value[inner], _TTL_COUNTS)
            elif key in _WRITE_DETAILS and isinstance(value, dict):
                self._counts(value, _TTL_COUNTS)
            elif _count(value):
                self._fields[key] = value

    def _counts(self, holder: dict[str, Any], keys: tuple[str, ...]) -> None:
        for key in keys:
            if _count(holder.get(key)):
                self._fields[key] = holder[key]


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class UsageChunkDropper:
    """Removes the usage-only chunk (`"choices": []` with `usage`) from a chat SSE stream.

    For a client that did not ask for usage when the proxy asked the upstream for it: the
    client gets exactly the bytes it would have got otherwise. The upstream's chunks do not
    align with SSE events, so bytes are passed on at event ends only (the rest of an event
    waits for its end, which a client needs before it can act on the event anyway).

    >>> drop = UsageChunkDropper()
    >>> drop.feed(b'data: {"choices": [{"delta": {}}]}\\n\\ndata: {"choices": [], "us')
    b'data: {"choices": [{"delta": {}}]}\\n\\n'
    >>> drop.feed(b'age": {"prompt_tokens": 3}}\\n\\ndata: [DONE]\\n\\n')
    b'data: [DONE]\\n\\n'
    >>> drop.close()
    b''
    """

    def __init__(self) -> None:
        self._events = Splitter(EVENT)

    def feed(self, chunk: bytes) -> bytes:
        """What the client gets of the stream so far (possibly nothing yet)."""
        done = self._events.feed(chunk)
        if not _has_usage(done):
            return done
        return b"".join(event for event in split_events(done) if not _usage_only(event))

    def close(self) -> bytes:
        """The rest at the end of the stream (an event without its blank line)."""
        held = self._events.rest()
        return b"" if _usage_only(held) else held


def _usage_only(event: bytes) -> bool:
    """Whether one SSE event is a chat chunk with no choices, only usage."""
    if not _has_usage(event):
        return False
    try:
        chunk = orjson.loads(event_data(event))
    except orjson.JSONDecodeError:
        return False
    return (
        isinstance(chunk, dict)
        and chunk.get("choices") == []
        and isinstance(chunk.get("usage"), dict)
    )
