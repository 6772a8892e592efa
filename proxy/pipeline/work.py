"""A request's work, wherever it runs: the pipeline's one seam to it.

As httpx's client hands a request to a transport (`handle_async_request`) and never asks
whether it goes over HTTP/1, HTTP/2 or a mock, the pipeline (`proxy/pipeline/stages.py`)
holds a `Work` and never asks where it runs: here (`Here`, every call immediate), or in the
offload worker process for a large body (`proxy/pipeline/offload.py` `OffloadedRequest`,
which records changes and applies them there). `Executor` (`proxy/pipeline/executor.py`)
decides which, once, when the body arrives.

`Work.body` is the request as its format reads it (`WireRequest`): the stages find the user
turn, clamp, place memory and read fields through it. What a large body needs beyond that —
applying what was recorded (`settle`), counting a moved block later (`defer_count`),
encoding off the event loop (`upstream_body`) — is here, not on the format's request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ctxbudget.caps import Caps, Memo, Segment, ToolNames, prune_request, remembering
from ctxbudget.proxy.cache.blocks import Block
from ctxbudget.proxy.cache.sessions import PrefixChange, memory_added
from ctxbudget.proxy.tokens import TokenCounter
from ctxbudget.proxy.upstream.http import Body
from ctxbudget.proxy.wire.types import WireRequest


class Work(Protocol):
    """One request's work: its body, and what the pipeline asks of it beside the format."""

    @property
    def body(self) -> WireRequest:
        """The request as its format reads and changes it."""
        ...

    def as_sent(self) -> None:
        """Drop what a clamp already applied, before anything else changed the body: the
        holdout's requests go on as the client sent them (a large body was clamped while
        it was parsed, in the offload process; one parsed here is not clamped yet)."""
        ...

    def saved_tokens(
        self, segments: Sequence[Segment], tokens: TokenCounter, encoding: str, *, owner: str
    ) -> tuple[int, ...]:
        """Tokens each of `segments` (what `clamp` returned) saved, in `encoding`, counted
        for `owner` (`TokenCounter`)."""
        ...

    async def prune(self, caps: Caps, tools: ToolNames, memo: Memo | None = None) -> list[Segment]:
        """Apply the pruning decisions of `caps.pruned` (`caps.prune_request`: a second pass
        after `clamp`); the segments of the results pruned. `memo`: the app's (`caps.Memo`:
        the calls it reads are remembered there)."""
        ...

    async def settle(self) -> None:
        """Apply what `body.place_memory` and `body.inject` recorded, so `body.blocks()`
        shows it."""
        ...

    def memory_added(self, before: Sequence[Block]) -> dict[int, str]:
        """The memory block `inject` added since `before` (the blocks then), by block index,
        with its text; {} when it added none. Read after `settle`."""
        ...

    def defer_count(self, change: PrefixChange) -> PrefixChange:
        """`change` as the report will price it (the offload counts large moved blocks after
        the body went upstream)."""
        ...

    def ask_usage(self) -> bool:
        """`body.ask_usage()`: True when the stream now asks for usage and the usage-only
        chunk must be dropped from what the client sees."""
        ...

    def forget_usage(self) -> None:
        """Undo `ask_usage` (the upstream refused `stream_options`)."""
        ...

    async def upstream_body(self) -> Body:
        """`body.encode()`, without blocking the event loop (whole, or in `Parts`)."""
        ...

    async def litellm_values(self) -> dict[str, Any] | None:
        """`body.litellm_body()`, without blocking the event loop."""
        ...


class Here:
    """The work of a request parsed in this process: each call is immediate."""

    def __init__(self, body: WireRequest) -> None:
        self.body = body

    def as_sent(self) -> None:
        return None  # clamped later, by `clamp` with `apply=False`

    def saved_tokens(
        self, segments: Sequence[Segment], tokens: TokenCounter, encoding: str, *, owner: str
    ) -> tuple[int, ...]:
        return tuple(tokens.saved(s, encoding, owner=owner) for s in segments)

    async def prune(self, caps: Caps, tools: ToolNames, memo: Memo | None = None) -> list[Segment]:
        clamp = prune_request if memo is None else remembering(prune_request, memo)
        return self.body.clamp(clamp, caps, tools, apply=True)

    async def settle(self) -> None:
        return None

    def memory_added(self, before: Sequence[Block]) -> dict[int, str]:
        return memory_added(before, self.body.blocks())

    def defer_count(self, change: PrefixChange) -> PrefixChange:
        return change

    def ask_usage(self) -> bool:
        return self.body.ask_usage()

    def forget_usage(self) -> None:
        self.body.forget_usage()

    async def upstream_body(self) -> Body:
        return self.body.encode()

    async def litellm_values(self) -> dict[str, Any] | None:
        return self.body.litellm_body()
