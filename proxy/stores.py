"""The memory store of the config in force, for every part of the app that reads or writes
memories: the pipeline's recall stage, the `/v1/memories` routes, the report.

The store is the SQLite file at `memory.store.path`, or PostgreSQL when `database.url` is set;
it is opened on first use and reopened when either changes. Opening holds no lock: requests
that arrive while it opens wait for that one attempt, together. A database that does not
answer trips a breaker (`proxy/breaker.py`): until a background check sees it answer again,
`down` says so at once, so recall is skipped without waiting for a connect timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable, Mapping

from cachetools import LRUCache

from ctxbudget.memory import DEFAULT_OWNER, MemoryStore, SQLiteMemoryStore
from ctxbudget.memory.pg import DatabaseUnavailable
from ctxbudget.proxy.breaker import Breaker
from ctxbudget.proxy.config.database import open_database, redacted
from ctxbudget.proxy.config.settings import Settings

log = logging.getLogger("ctxbudget.memory")

EMPTY_SECONDS = 1.0
"""How long an owner with no memories is taken at its word (`MemoryStores.empty`)."""
CHECK_SECONDS = 1.0
"""While the memory database does not answer, how often a background check asks it again."""


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
    from ctxbudget.memory.pgstore import PgMemoryStore

    try:
        return PgMemoryStore(pg, limits=settings.memory_limits)
    except BaseException:
        pg.close()
        raise


class MemoryStores:
    """Opens and holds the memory store of the settings in force; trips its breaker when the
    database does not answer."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = env
        self._store: MemoryStore | None = None
        self._key: Hashable = None
        self._lock = threading.Lock()
        """Guards `_store`, `_key` and `_opening`; never held while connecting."""
        self._opening: _Opening | None = None
        self._closed = False
        self._outage = 0
        """Requests that went without memories since the database stopped answering."""
        self._settings: Settings | None = None
        """The settings of the latest request (the background check opens their store)."""
        self.breaker = Breaker(self._check, every=CHECK_SECONDS, recovered=self._recovered)
        self._empty: LRUCache[str, float] = LRUCache(maxsize=4096)
        """Owners known to have no memories, and when that was read (`empty`)."""

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

    def empty(self, owner: str, settings: Settings) -> bool:
        """Whether `owner` is known to have no memories, answered on the event loop without
        waiting: a store that is open and says so at once (SQLite's read-only peek), its
        answer kept `EMPTY_SECONDS` (a syscall-heavy read was ~0.1 ms of every request). A
        memory added through this process clears it at once (`added`); one added by another
        process shows within `EMPTY_SECONDS`."""
        now = time.monotonic()
        known = self._empty.get(owner)
        if known is not None and now - known < EMPTY_SECONDS and self._key == store_key(settings):
            return True
        store = self.opened(settings)
        if store is None or store.has_any_nowait(owner) is not False:
            return False
        self._empty[owner] = now
        return True

    def added(self, owner: str) -> None:
        """`owner` has a memory now (the `/v1/memories` routes tell)."""
        self._empty.pop(owner, None)

    def down(self, settings: Settings) -> bool:
        """Whether the breaker is open (the database did not answer lately): then a request
        goes without memories at once, and is counted for the log line at recovery."""
        self._settings = settings
        if self.breaker.down:
            self._outage += 1
            return True
        return False

    def failed(self, settings: Settings, exc: DatabaseUnavailable) -> None:
        """The database did not answer a request: trip the breaker (logged once)."""
        self._outage += 1
        self._down(settings, exc)

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
