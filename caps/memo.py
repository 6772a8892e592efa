"""What the clamps remember between requests, held by their caller: `caps` itself keeps nothing.

An agent resends its history every turn: the same system prompt, the same tool results, often
the very message objects (`proxy/cache/resent.py`). The clamps are pure functions of what they
are given, so what they made last turn can be handed out again, as long as someone keeps it.
That someone is the caller: the proxy builds one `Memo` per app in `create_app` (held on its
state, cleared when the app closes) and one in the offload worker process; a test or a bench
passes a fresh one, or None to remember nothing. Two apps in one process share nothing.

Every value-keyed entry is found by the owner too (`Caps.owner`, in the key): one owner's
entries tell another nothing (`proxy/cache/registry.py` lists each cache, its key and bound).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ctxbudget.caps._kept import ByIdentity, ByValue, Generations, footprint

if TYPE_CHECKING:
    from ctxbudget.caps.resume import ClampState
    from ctxbudget.caps.types import Caps, ChatRequest, Clamp, ClampResult, Segment, ToolNames


class Memo:
    """The clamps' caches, at most 56 MB in all: one per app (or worker process), never shared
    between apps. The same results as no memo at all, byte for byte, only found faster."""

    def __init__(self) -> None:
        self.system_texts = ByValue(16 << 20)
        """A system text's bootstrap clamp, by owner, text and cap (`caps.bootstrap`): an
        agent sends the same system prompt every turn, and hashing it (~25 µs for 50 KB) is
        several times cheaper than finding and measuring its files again."""
        self.bodies = ByValue(8 << 20)
        """One file's head + tail cut, by body, cap, name and owner (`clamp_body`)."""
        self.tool_texts = ByValue(16 << 20)
        """A tool result's clamp, by text, what called it and `Caps` (its owner): every turn
        of a tool loop resends the earlier results unchanged."""
        self.calls = ByIdentity(8 << 20, _calls_weight)
        """An assistant message's tool calls (names, arguments), by the message object: every
        request of a tool loop reads all of them."""
        self.prunable: Generations[tuple[Any, ...], tuple[Segment | None]] = Generations(8 << 20)
        """A prunable result's segment, by owner, text, tool, call id and policy: every
        request of a long session finds the same old results prunable."""

    @property
    def weight(self) -> int:
        """What it keeps, by its entries' weights (at most the sum of the bounds above)."""
        return sum(
            c.weight
            for c in (
                self.system_texts,
                self.bodies,
                self.tool_texts,
                self.calls,
                self.prunable,
            )
        )

    def clear(self) -> None:
        """Let everything go (the app closes; the worker is past its memory bound)."""
        for cache in (
            self.system_texts,
            self.bodies,
            self.tool_texts,
            self.calls,
            self.prunable,
        ):
            cache.clear()


def _calls_weight(message: Any, found: tuple[Any, ...]) -> int | None:
    """What a message and its calls keep alive."""
    return footprint((message, found)) if found else None


def remembering(clamp: Clamp, memo: Memo) -> Clamp:
    """`clamp` that remembers in `memo` (what the proxy hands its wire adapters). Pickled (to
    the offload worker), it is `clamp` itself: a memo is its process's, and the worker binds
    its own."""
    return _Remembering(clamp, memo)


class _Remembering:
    def __init__(self, clamp: Clamp, memo: Memo) -> None:
        self.clamp = clamp
        self.memo = memo

    def __call__(
        self,
        request: ChatRequest,
        caps: Caps,
        *,
        tools: ToolNames | None = None,
        memo: Memo | None = None,
        resume: ClampState | None = None,
    ) -> ClampResult:
        memo = self.memo if memo is None else memo
        if resume is None:  # a stand-in clamp (tests) need not know of resuming
            return self.clamp(request, caps, tools=tools, memo=memo)
        return self.clamp(request, caps, tools=tools, memo=memo, resume=resume)

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return _unpickled, (self.clamp,)


def _unpickled(clamp: Clamp) -> Clamp:
    return clamp
