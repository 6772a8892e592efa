"""The pipeline's memory stage: recall for the user turn, then let the wire adapter place it.

Owns the memory store of the config in force (reopened if `memory.store.path` changes) and
deep recall's LLM rewriter. Everything that touches SQLite runs in a worker thread, so a slow
disk or another process holding the database never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping

from memory import SQLiteMemoryStore
from memory.query import UserTurn
from memory.recaller import Recaller, RecallReport, RecallRequest
from proxy.headers import RequestOptions
from proxy.price_map import context_window
from proxy.rewrite import Rewriter
from proxy.settings import Settings
from proxy.tokens import TokenCounter
from proxy.wire.types import WireRequest


class MemoryInjection:
    """Recall and injection for the proxy; also the memory routes' way to the store."""

    def __init__(self, tokens: TokenCounter, env: Mapping[str, str]) -> None:
        self._tokens = tokens
        self._env = env
        self._rewriter = Rewriter()
        self._store: SQLiteMemoryStore | None = None
        self._lock = threading.Lock()

    def store(self, settings: Settings) -> SQLiteMemoryStore:
        """The store at `settings.memory_path`, opened on first use (from any thread)."""
        with self._lock:
            store = self._store
            if store is None or store.path != settings.memory_path:
                if store is not None:
                    store.close()
                store = self._store = SQLiteMemoryStore(
                    settings.memory_path, limits=settings.memory_limits
                )
            store.limits = settings.memory_limits  # the config may have been edited
            return store

    def opened(self, settings: Settings) -> SQLiteMemoryStore | None:
        """The store if it is already open for `settings` (opening may write: migrations)."""
        store = self._store
        return store if store is not None and store.path == settings.memory_path else None

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    async def inject(
        self,
        body: WireRequest,
        turn: UserTurn | None,
        owner: str,
        settings: Settings,
        options: RequestOptions,
    ) -> RecallReport | None:
        """Recall for `turn` and place the memories in `body`; what recall did, or None."""
        if not (settings.recall.inject and options.memories) or turn is None or not turn.query:
            return None
        store = self.opened(settings)
        if store is not None and store.has_any_nowait(owner) is False:
            return None  # the common case, answered on the loop without waiting
        words: list[str] = []
        note: str | None = None
        if settings.rewrite is not None:
            profile = await asyncio.to_thread(
                lambda: self._recaller(settings).profile_for(owner, turn, options.profile)
            )
            if profile is not None and profile.name == "deep":
                words, note = await self._rewriter.words(turn.query, settings.rewrite, self._env)
        encoding = settings.encoding_for(body.model)
        tokens = self._tokens
        request = RecallRequest(
            owner=owner,
            agent=options.agent,
            profile=options.profile,
            complexity=options.complexity,
            max_chars=settings.memory_max_chars(options.enabled),
            count_tokens=lambda text: tokens.count(text, encoding),
            context_window=context_window(body.model, settings.context_windows),
            system_text=body.system_text(),
            extra_words=words,
            rewrite_note=note,
        )
        # One hop to a worker thread: opening the store and recall both touch SQLite.
        recalled = await asyncio.to_thread(lambda: self._recaller(settings).recall(turn, request))
        if recalled is None:
            return None
        body.inject(recalled.lines, settings.recall.placement)
        return recalled.report

    def _recaller(self, settings: Settings) -> Recaller:
        return Recaller(self.store(settings), settings.recall)
