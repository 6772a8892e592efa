"""The pipeline's memory stage: recall for the user turn, then let the wire adapter place it.

Owns the memory store of the config in force — the SQLite file at `memory.store.path`, or
PostgreSQL when `database.url` is set; reopened when either changes — and deep recall's LLM
rewriter. Everything that touches the store runs in a worker thread, so a slow disk, another
process holding the database or a slow server never stalls the event loop. A memory database
that does not answer costs a request its memories, never the request: it is forwarded
without them (`Skipped`: a header and the report say why), and the log says so once per
outage. After one such failure a breaker skips recall at once, without waiting for the
database, until a background check sees it answer again (`proxy/breaker.py`). Opening the
store holds no lock: requests that arrive while it opens wait for that one attempt, together.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from memory import DEFAULT_OWNER, MemoryStore, SQLiteMemoryStore
from memory.pg import DatabaseUnavailable
from memory.query import UserTurn
from memory.recaller import Recaller, RecallReport, RecallRequest
from proxy.breaker import Breaker
from proxy.config.database import open_database, redacted
from proxy.config.settings import Settings
from proxy.pipeline.headers import RequestOptions
from proxy.report.prices import context_window
from proxy.tokens import TokenCounter
from proxy.upstream.rewrite import Rewriter
from proxy.wire.types import WireRequest

log = logging.getLogger("ctxbudget.memory")

CHECK_SECONDS = 1.0
"""While the memory database does not answer, how often a background check asks it again."""


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


class _Opening:
    """One attempt to open a store, which every caller that arrives meanwhile waits for."""

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.done = threading.Event()
        self.store: MemoryStore | None = None
        self.error: BaseException | None = None

    def result(self) -> MemoryStore:
        self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.store is not None
        return self.store


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
        """Guards `_store`, `_key` and `_opening`; never held while connecting."""
        self._opening: _Opening | None = None
        self._closed = False
        self._outage = 0
        """Chat requests forwarded without memories since the database stopped answering."""
        self._settings: Settings | None = None
        """The settings of the latest request (the background check opens their store)."""
        self.breaker = Breaker(self._check, every=CHECK_SECONDS, recovered=self._recovered)

    def store(self, settings: Settings) -> MemoryStore:
        """The store of `settings`, opened on first use (from any thread). Raises
        `DatabaseUnavailable` when its database does not answer (the routes answer 503).

        No lock is held while opening: callers that arrive meanwhile wait for the same
        attempt, together (with the database down, six requests at once waited 2, 4, ... 12 s
        in turn behind a lock held while connecting)."""
        key = store_key(settings)
        with self._lock:
            store = self._store
            if store is not None and self._key == key:
                store.limits = settings.memory_limits  # the config may have been edited
                return store
            opening = self._opening
            mine = opening is None or opening.key != key
            if mine:
                opening = self._opening = _Opening(key)
        assert opening is not None
        if not mine:
            store = opening.result()
            store.limits = settings.memory_limits
            return store
        try:
            store = open_store(settings, self._env)
        except BaseException as exc:
            with self._lock:
                if self._opening is opening:
                    self._opening = None
            opening.error = exc
            opening.done.set()
            raise
        spare: MemoryStore | None
        with self._lock:
            if self._closed:
                spare = store  # the app closed while it opened: nobody else would close it
            else:
                spare = self._store  # an earlier config's store
                self._store, self._key = store, key
            if self._opening is opening:
                self._opening = None
        opening.store = store
        opening.done.set()
        if spare is not None:
            spare.close()
        store.limits = settings.memory_limits
        return store

    def warm(self, settings: Settings) -> None:
        """Open the store of `settings` in the background when it is a database's (the
        proxy's start): one that does not answer trips the breaker before the first request,
        which then goes on without memories at once instead of waiting for it."""
        if settings.database.url is None:
            return
        self._settings = settings

        def open_it() -> None:
            try:
                self.store(settings)
            except DatabaseUnavailable as exc:
                self._down(settings, exc)
            except Exception:
                log.exception("could not open the memory store")

        threading.Thread(target=open_it, name="ctxbudget-memory-open", daemon=True).start()

    def opened(self, settings: Settings) -> MemoryStore | None:
        """The store if it is already open for `settings` (opening may write: migrations)."""
        store = self._store
        return store if store is not None and self._key == store_key(settings) else None

    def close(self) -> None:
        self.breaker.close()
        with self._lock:
            self._closed = True
            store, self._store = self._store, None
        if store is not None:
            store.close()

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
        if not (settings.recall.inject and options.memories) or turn is None or not turn.query:
            return None
        self._settings = settings
        if self.breaker.down:
            self._outage += 1
            return DATABASE_DOWN
        try:
            return await self._inject(body, turn, owner, settings, options)
        except DatabaseUnavailable as exc:
            self._outage += 1
            self._down(settings, exc)
            return DATABASE_DOWN

    def _down(self, settings: Settings, exc: DatabaseUnavailable) -> None:
        if self.breaker.trip():
            log.warning(
                "memory database %s: %s; chat requests are forwarded without memories "
                "until a background check sees it again (every %.0f s)",
                redacted(settings.database.url or ""),
                exc,
                CHECK_SECONDS,
            )

    def _check(self) -> None:
        """The breaker's background check: the store opens and answers a query."""
        settings = self._settings
        if settings is not None:
            self.store(settings).has_any(DEFAULT_OWNER)

    def _recovered(self, seconds: float) -> None:
        log.warning(
            "memory database answers again after %.1f s: %d chat request(s) were forwarded "
            "without memories meanwhile",
            seconds,
            self._outage,
        )
        self._outage = 0

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
