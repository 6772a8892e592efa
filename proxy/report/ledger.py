"""Pruning's decisions, kept where every worker and instance finds them: the report's database.

A pruned tool result must go out as the same bytes on every later request of its
conversation, whichever worker or instance serves it (`docs/pruning.md`). Each decision is a
row of `pruned` (owner, conversation, call id → the text that stands for the result), and the
first writer wins: two workers that prune at once keep one text.

On SQLite, `decisions` reads through a read-only connection that never waits (it is asked on
the event loop, on the requests that have a prunable result); on PostgreSQL it is a query to
ask from a thread. Either way a worker keeps what it read for `FRESH_SECONDS`, so a burst of
tool-loop requests asks once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from cachetools import LRUCache

from memory.pg import PgDatabase
from memory.sqlite import Database, peek, reader

FRESH_SECONDS = 1.0
"""How long a worker trusts what it read of a conversation's decisions. Another instance's
prune shows here within this long; a request of that conversation in between goes out
without it once (a cache bust), which the report shows."""


class PruneLedger:
    """The decisions of every conversation, read and written through one database."""

    def __init__(
        self, db: Database | PgDatabase, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._db = db
        self._reader = reader(db.path) if isinstance(db, Database) and _on_disk(db.path) else None
        self._clock = clock
        self._seen: LRUCache[tuple[str, str], tuple[float, dict[str, str]]] = LRUCache(4096)
        self._lock = threading.Lock()

    @property
    def waits(self) -> bool:
        """Whether reading may wait (PostgreSQL, or SQLite in memory): ask from a thread."""
        return self._reader is None

    def known(self, owner: str, conversation: str) -> dict[str, str] | None:
        """What this worker read of the conversation lately, or None."""
        with self._lock:
            found = self._seen.get((owner, conversation))
        if found is None or self._clock() - found[0] > FRESH_SECONDS:
            return None
        return found[1]

    def decisions(self, owner: str, conversation: str) -> dict[str, str]:
        """Call id → text of the conversation's pruned results (from a thread when `waits`)."""
        found = self.known(owner, conversation)
        if found is not None:
            return found
        sql = "SELECT call_id, text FROM pruned WHERE owner = ? AND conversation = ?"
        rows = peek(self._reader, sql, (owner, conversation)) if self._reader else None
        if rows is None:
            rows = self._db.fetchall(sql, (owner, conversation))
        found = {call_id: text for call_id, text in rows}
        self._remember(owner, conversation, found)
        return found

    def last_seen(self, owner: str, session: str) -> float | None:
        """When the report last saw a request of `session`, from any worker or instance (its
        writer lags by a batch, ~50 ms); None when it has none (from a thread when `waits`)."""
        sql = "SELECT last FROM sessions WHERE owner = ? AND id = ?"
        rows = peek(self._reader, sql, (owner, session)) if self._reader else None
        if rows is None:
            rows = self._db.fetchall(sql, (owner, session))
        return float(rows[0][0]) if rows else None

    def add(
        self, owner: str, conversation: str, decided: Mapping[str, str], *, at: float
    ) -> dict[str, str]:
        """Keep `decided` (call id → text) unless another writer decided first; return the
        conversation's decisions as they stand (a thread: this writes)."""
        rows = [(owner, conversation, call_id, text, at) for call_id, text in decided.items()]
        insert = (
            "INSERT INTO pruned (owner, conversation, call_id, text, at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (owner, conversation, call_id) DO NOTHING"
        )
        with self._db.transaction() as tx:
            tx.executemany(insert, rows)
            found = {
                call_id: text
                for call_id, text in tx.execute(
                    "SELECT call_id, text FROM pruned WHERE owner = ? AND conversation = ?",
                    (owner, conversation),
                ).fetchall()
            }
        self._remember(owner, conversation, found)
        return found

    def summaries(self, owner: str, conversation: str) -> dict[str, str]:
        """Call id → summary of the conversation's summarised results (from a thread when
        `waits`)."""
        sql = "SELECT call_id, text FROM summaries WHERE owner = ? AND conversation = ?"
        rows = peek(self._reader, sql, (owner, conversation)) if self._reader else None
        if rows is None:
            rows = self._db.fetchall(sql, (owner, conversation))
        return {call_id: text for call_id, text in rows}

    def add_summary(
        self, owner: str, conversation: str, call_id: str, text: str, *, at: float
    ) -> None:
        """Keep a result's summary (the first one written stands; from a thread)."""
        with self._db.transaction() as tx:
            tx.execute(
                "INSERT INTO summaries (owner, conversation, call_id, text, at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (owner, conversation, call_id) DO NOTHING",
                (owner, conversation, call_id, text, at),
            )

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()

    def _remember(self, owner: str, conversation: str, found: dict[str, str]) -> None:
        with self._lock:
            self._seen[(owner, conversation)] = (self._clock(), found)


def _on_disk(path: Path) -> bool:
    return str(path) != ":memory:"
