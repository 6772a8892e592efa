"""The pipeline's recall stage: recall for the user turn, then let the wire adapter place it.

Everything that touches the memory store (`proxy/stores.py`) runs in a worker thread, so a
slow disk, another process holding the database or a slow server never stalls the event loop,
and asks deep recall's LLM rewriter first when it is configured. A memory database that does
not answer costs a request its memories, never the request: it is forwarded without them
(`Skipped`: a header and the report say why); while the stores' breaker is open, at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from memory.pg import DatabaseUnavailable
from memory.query import UserTurn, message_text, runtime_agent
from memory.recaller import Recaller, RecallReport, RecallRequest
from proxy.config.settings import Settings
from proxy.pipeline.headers import RequestOptions
from proxy.report.prices import context_window
from proxy.stores import MemoryStores
from proxy.tokens import TokenCounter
from proxy.upstream.rewrite import Rewriter
from proxy.wire.types import WireRequest


@dataclass(frozen=True)
class Skipped:
    """Recall did not run for a request, and why: the report's `memorySkipped` and the
    `x-context-budget-memories-skipped` header."""

    reason: str
    header: str


DATABASE_DOWN = Skipped(
    "the memory database did not answer: forwarded without memories (recall is skipped at "
    "once until a background check sees the database again)",
    "database-unavailable",
)


class RecallStage:
    """Recall and injection for one request (`inject`), against the app's memory stores."""

    def __init__(self, stores: MemoryStores, tokens: TokenCounter, env: Mapping[str, str]) -> None:
        self._stores = stores
        self._tokens = tokens
        self._env = env
        self._rewriter = Rewriter()

    async def inject(
        self,
        body: WireRequest,
        turn: UserTurn | None,
        owner: str,
        settings: Settings,
        options: RequestOptions,
    ) -> RecallReport | Skipped | None:
        """Recall for `turn` and place the memories in `body`; what recall did, or None when
        there was nothing to do, or `Skipped` when the memory database does not answer (the
        request goes without, at once while the breaker is open)."""
        if not (settings.recall.inject and options.memories) or turn is None:
            return None
        if self._stores.down(settings):
            return DATABASE_DOWN if turn.query else None
        try:
            # an empty store, the common case, is answered on the loop without waiting, and
            # without reading the turn (~8 µs)
            if self._stores.empty(owner, settings) or not turn.query:
                return None
            return await self._inject(body, turn, owner, settings, options)
        except DatabaseUnavailable as exc:
            self._stores.failed(settings, exc)
            return DATABASE_DOWN

    async def _inject(
        self,
        body: WireRequest,
        turn: UserTurn,
        owner: str,
        settings: Settings,
        options: RequestOptions,
    ) -> RecallReport | None:
        words: list[str] = []
        note: str | None = None
        if settings.rewrite is not None:
            profile = await asyncio.to_thread(
                lambda: self._recaller(settings).profile_for(owner, turn, options.profile)
            )
            if profile is not None and profile.name == "deep":
                words, note = await self._rewriter.words(
                    turn.query, settings.rewrite, self._env, owner=owner
                )
        encoding = settings.encoding_for(body.model)
        tokens = self._tokens
        system = body.system_text()
        request = RecallRequest(
            owner=owner,
            agent=options.agent or runtime_agent(system, turn.text, *_first_user(body)),
            profile=options.profile,
            complexity=options.complexity,
            max_chars=settings.memory_max_chars(options.enabled),
            count_tokens=lambda text: tokens.count(text, encoding, owner=owner),
            context_window=context_window(body.model, settings.context_windows),
            system_text=system,
            extra_words=words,
            rewrite_note=note,
        )
        # One hop to a worker thread: opening the store and recall both touch the database.
        recalled = await asyncio.to_thread(lambda: self._recaller(settings).recall(turn, request))
        if recalled is None:
            return None
        body.inject(recalled.lines, settings.recall.placement)
        return recalled.report

    def _recaller(self, settings: Settings) -> Recaller:
        return Recaller(self._stores.store(settings), settings.recall)


def _first_user(body: WireRequest) -> tuple[str, ...]:
    """The text of the request's first user message (where OpenClaw 9.x moves its runtime
    line), or nothing."""
    items = body.get("messages") or body.get("input")
    if not isinstance(items, list):
        return ()
    for item in items:
        if isinstance(item, dict) and item.get("role") == "user":
            text = message_text(item)
            return (text,) if text else ()
    return ()
