"""The wire adapter interface: everything the pipeline needs to know about one API format.

The pipeline (`proxy/pipeline.py`) is format-neutral. What differs between OpenAI chat
completions, Anthropic Messages and OpenAI Responses sits behind two small Protocols:

- `WireFormat`: one per format, stateless. Parses a body into a `WireRequest`; says where
  requests go upstream and with which credentials; shapes the proxy's own answers (errors,
  the `/context budget` command) as that format's JSON or SSE; says how usage looks in a reply.
- `WireRequest`: one parsed request. Finds the latest user turn and the system prompt,
  clamps its segments through `caps`, places recalled memories, and writes itself back by
  splicing: fields it did not change reach the upstream byte for byte.

Adding a format is one module implementing both, and its tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from caps import Caps, Clamp, Segment, ToolNames
from memory.inject import Placement
from memory.query import UserTurn
from proxy.errors import CtxBudgetError


@dataclass(frozen=True)
class Reply:
    """An answer the proxy makes itself (the chat command): JSON bytes, or SSE events."""

    body: bytes | AsyncIterator[bytes]
    media_type: str


class WireRequest(Protocol):
    """One parsed request of some format; changed in place by clamping and injection."""

    raw: bytes
    """The body as the client sent it."""

    @property
    def model(self) -> str | None: ...

    @property
    def stream(self) -> bool: ...

    @property
    def changed(self) -> bool:
        """Whether `encode()` would differ from `raw`."""
        ...

    def user_turn(self) -> UserTurn | None:
        """The latest real user text (agent-internal context skipped), or None."""
        ...

    def system_text(self) -> str:
        """The system prompt's text (for the memory budget's window share)."""
        ...

    def clamp(self, clamp: Clamp, caps: Caps, tools: ToolNames, *, apply: bool) -> list[Segment]:
        """Find and clamp this request's segments; keep the clamped text only when `apply`.

        Raises whatever the clamp raises: the pipeline decides between fail-open and closed.
        """
        ...

    def inject(self, lines: Sequence[str], placement: Placement) -> None:
        """Place a memory block of `lines` (cache-safe: `user` appends to the latest turn)."""
        ...

    def encode(self) -> bytes:
        """The body to send upstream: `raw` itself when nothing changed."""
        ...

    def litellm_body(self) -> dict[str, Any] | None:
        """The request as OpenAI chat values for a litellm route; None if the format has none."""
        ...


class WireFormat(Protocol):
    """One API format: parsing, upstream target, and the shapes of the proxy's own answers."""

    name: str
    """Short name, recorded with each request (`chat`, …)."""
    usage_marker: bytes
    """Bytes that appear in a reply chunk only where usage is (kept for telemetry)."""

    def parse(self, raw: bytes) -> WireRequest:
        """Check and parse a body; `BadRequest` that says what to fix."""
        ...

    def upstream_path(self, path: str, query: str) -> str:
        """Where the request goes, relative to the upstream base URL (query string kept)."""
        ...

    def upstream_headers(
        self, headers: Mapping[str, str], *, api_key: str | None, strip_auth: bool
    ) -> dict[str, str]:
        """Client headers to forward, with the upstream credential set.

        `api_key`: the configured upstream key (replaces the client's); `strip_auth`: the
        client's own credential is a proxy key and must not go upstream.
        """
        ...

    def error_body(self, error: CtxBudgetError) -> dict[str, Any]:
        """The proxy's own error in this format's error shape."""
        ...

    def stream_error(self, error: CtxBudgetError) -> bytes:
        """An SSE event telling a client mid-stream that the upstream broke."""
        ...

    def command_reply(self, text: str, request: WireRequest, *, request_id: str) -> Reply:
        """The `/context budget` answer as this format's reply (SSE when the request streams)."""
        ...
