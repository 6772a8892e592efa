"""The pipeline's memory stage: recall for the user turn, then let the wire adapter place it.

Owns the memory store of the config in force — the SQLite file at `memory.store.path`, or
PostgreSQL when `database.url` is set; reopened when either changes — and deep recall's LLM
rewriter. Everything that touches the store runs in a worker thread, so a slow disk, another
process holding the database or a slow server never stalls the event loop. A memory database
that does not answer costs a request its memories, never the request: it is forwarded
without them, and the log says so once per outage.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Hashable, Mapping

from memory import MemoryStore, SQLiteMemoryStore
from memory.pg import DatabaseUnavailable
from memory.query import UserTurn
from memory.recaller import Recaller, RecallReport, RecallRequest
from proxy.config.database import open_database, redacted
from proxy.config.settings import Settings
from proxy.pipeline.headers import RequestOptions
from proxy.report.prices import context_window
from proxy.tokens import TokenCounter
from proxy.upstream.rewrite import Rewriter
from proxy.wire.types import WireRequest

log = logging.getLogger("ctxbudget.memory")


def store_key(settings: Settings) -> Hashable:
    """What names the store of `settings`: a new key means another store to open."""
    db = settings.database
    if db.url is None:
        return ("sqlite", settings.memory_path)
    return ("postgres", db.url, db.password_env, db.pool_size, db.connect_timeout_seconds)


def open_store(settings: Settings, env: Mapping[str, str]) -> MemoryStore:
    """The memory store of `settings`, opened (and created or migrated).

    Raises `DatabaseUnavailable` when `database.url` is set and the database does not answer.
    """
    pg = open_database(settings.database, env)
    if pg is None:
        return SQLiteMemoryStore(settings.memory_path, limits=settings.memory_limits)
    from memory.pgstore import PgMemoryStore

    try:
        return PgMemoryStore(pg, limits=settings.memory_limits)
    except BaseException:
        pg.close()
        raise


class MemoryInjection:
    """Recall and injection for the proxy; also the memory routes' way to the store."""

    def __init__(self, tokens: TokenCounter, env: Mapping[str, str]) -> None:
        self._tokens = tokens
        self._env = env
        self._rewriter = Rewriter()
        self._store: MemoryStore | None = None
        self._key: Hashable = None
        self._lock = threading.Lock()
        self._outage = 0
        """Chat requests forwarded without memories since the database stopped answering."""

    def store(self, settings: Settings) -> MemoryStore:
        """The store of `settings`, opened on first use (from any thread). Raises
        `DatabaseUnavailable` when its database does not answer (the routes answer 503)."""
        key = store_key(settings)
        with self._lock:
            store = self._store
            if store is None or self._key != key:
                if store is not None:
                    store.close()
                    self._store = None
                store = self._store = open_store(settings, self._env)
                self._key = key
            store.limits = settings.memory_limits  # the config may have been edited
            return store

    def opened(self, settings: Settings) -> MemoryStore | None:
        """The store if it is already open for `settings` (opening may write: migrations)."""
        store = self._store
        return store if store is not None and self._key == store_key(settings) else None

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
        """Recall for `turn` and place the memories in `body`; what recall did, or None
        (also when the memory database does not answer: the request goes without)."""
        if not (settings.recall.inject and options.memories) or turn is None or not turn.query:
            return None
        try:
            recalled = await self._inject(body, turn, owner, settings, options)
        except DatabaseUnavailable as exc:
            self._outage += 1
            if self._outage == 1:
                log.warning(
                    "memory database %s: %s; chat requests are forwarded without memories "
                    "until it answers again",
                    redacted(settings.database.url or ""),
                    exc,
                )
            return None
        if self._outage:
            log.warning(
                "memory database answers again: %d chat request(s) were forwarded without "
                "memories while it did not",
                self._outage,
            )
            self._outage = 0
        return recalled

    async def _inject(
        self,
        body: WireRequest,
        turn: UserTurn,
        owner: str,
        settings: Settings,
        options: RequestOptions,
    ) -> RecallReport | None:
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
        # One hop to a worker thread: opening the store and recall both touch the database.
        recalled = await asyncio.to_thread(lambda: self._recaller(settings).recall(turn, request))
        if recalled is None:
            return None
        body.inject(recalled.lines, settings.recall.placement)
        return recalled.report

    def _recaller(self, settings: Settings) -> Recaller:
        return Recaller(self.store(settings), settings.recall)
