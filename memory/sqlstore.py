"""One SQL layer for both memory stores: each operation of `MemoryStore` written once, over a
`Dialect` that holds what SQLite and PostgreSQL do differently.

`SQLMemoryStore` is the whole logic: validation, ids by batch (`max(id) + 1, + 2, …`), LRU
eviction past `memory.maxMemories`, the `words` table's counts, access counts, once-per-turn
touches, neighbours and the monitor. Its statements use `?` placeholders for both databases
(`memory.pg` turns them into psycopg's `%s`). A dialect is the rest, and small:

- the full-text index: FTS5 keeps its own by trigger on SQLite; on PostgreSQL each memory's
  tsvector, `postings` and `owner_counts.length` are written with it (`insert`, `delete`);
- ranking: FTS5's bm25() against BM25 summed from `postings` (`search`, `search_rarest`);
- a list as one parameter: `json_each` over JSON against `unnest` of a typed array (`rows`,
  `any_of`);
- serialising writers: SQLite's write lock, or an advisory lock (`lock`);
- `owner_by_id`, `top` and `version_sql`: an index hint, the last code point, the schema
  version's query.

`SQLiteMemoryStore` (`memory/store.py`) and `PgMemoryStore` (`memory/pgstore.py`) are each a
dialect and a constructor that opens and migrates the database.
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

from ctxbudget.memory.monitor import Monitor
from ctxbudget.memory.pg import PgDatabase, PgTx
from ctxbudget.memory.schema import words_of
from ctxbudget.memory.sqlite import Database
from ctxbudget.memory.types import InvalidMemory, Memory, MemoryLimits, NewMemory, Rarest

log = logging.getLogger("ctxbudget.memory")

DB = TypeVar("DB", Database, PgDatabase)
Tx = sqlite3.Connection | PgTx
"""A statement runner inside one transaction (`Database.transaction()`'s, or `PgTx`)."""

COLUMNS = "id, owner, text, category, source, scope, created, last_accessed, access_count, batch"
"""A memory's columns, in the order `memory_of` reads them."""


def memory_of(row: Sequence[Any]) -> Memory:
    """A `Memory` from a row of `COLUMNS`."""
    return Memory(
        id=int(row[0]),
        owner=str(row[1]),
        text=str(row[2]),
        category=str(row[3]),
        source=str(row[4]),  # type: ignore[arg-type]
        scope=str(row[5]),
        created=float(row[6]),
        last_accessed=float(row[7]),
        access_count=int(row[8]),
        batch=None if row[9] is None else int(row[9]),
    )


class Dialect(Protocol[DB]):
    """What one database does differently, for `SQLMemoryStore`."""

    top: str
    """SQL for the last code point, U+10FFFF: `word < prefix || top` bounds a prefix's range."""
    owner_by_id: str
    """The owner column where rows are found by id (SQLite's `+owner`: not the owner index)."""
    version_sql: str
    """The query whose one value is the schema version."""

    def rows(
        self, alias: str, columns: Mapping[str, str], values: Sequence[Sequence[Any]]
    ) -> tuple[str, tuple[Any, ...]]:
        """A FROM item named `alias` with a row per item of the equal-length lists `values`,
        one list per column (`columns`: name → PostgreSQL type), and its parameters."""
        ...

    def any_of(self, column: str, kind: str, values: Sequence[Any]) -> tuple[str, tuple[Any, ...]]:
        """A condition that `column` is one of `values` (of PostgreSQL type `kind`), and its
        parameters."""
        ...

    def lock(self, tx: Tx) -> None:
        """Serialise this transaction with every other add and removal."""
        ...

    def insert(self, tx: Tx, owner: str, memories: Sequence[NewMemory], *, first: int) -> int:
        """Insert checked `memories` (their `created` set) with ids `first + 1, + 2, …`, and
        their full-text index; the owner's memory count after."""
        ...

    def delete(self, tx: Tx, owner: str, ids: Sequence[int]) -> list[str]:
        """Delete the owner's memories `ids` and their full-text index; the texts gone."""
        ...

    def search(
        self, store: SQLMemoryStore[DB], owner: str, query: str, *, limit: int, prefix: bool
    ) -> list[tuple[Memory, float]]:
        """`MemoryStore.search`."""
        ...

    def search_rarest(
        self,
        store: SQLMemoryStore[DB],
        owner: str,
        words: Sequence[str],
        *,
        scan: int,
        limit: int,
        prefix: bool,
    ) -> Rarest:
        """`MemoryStore.search_rarest`."""
        ...


def checked_batch(
    memories: Sequence[NewMemory], limits: MemoryLimits, *, now: float
) -> list[NewMemory]:
    """`memories` validated as one batch for `add_many`: `InvalidMemory` names the first bad
    one by its position (`item 3: …`), a batch of several owners, or one larger than
    `memory.maxMemories`. `created` is set: `now` when missing, and a time after `now` (an
    import's) becomes `now`: a memory from the future would never age in recall's recency."""
    checked = []
    for number, memory in enumerate(memories, 1):
        try:
            valid = memory.validate(limits)
        except InvalidMemory as exc:
            raise InvalidMemory(f"item {number}: {exc}") from None
        if valid.created is None or valid.created > now:
            valid = dataclasses.replace(valid, created=now)
        checked.append(valid)
    owners = {m.owner for m in checked}
    if len(owners) > 1:
        raise InvalidMemory("a batch is for one owner, got " + ", ".join(sorted(owners)))
    if len(checked) > limits.max_memories:
        raise InvalidMemory(
            f"{len(checked):,} memories are more than memory.maxMemories "
            f"({limits.max_memories:,}): raise it, or import fewer"
        )
    return checked


class SQLMemoryStore(Generic[DB]):
    """`MemoryStore` over one database and its `Dialect`: every operation, once."""

    db: DB
    dialect: Dialect[DB]
    limits: MemoryLimits

    def __init__(
        self,
        db: DB,
        dialect: Dialect[DB],
        *,
        limits: MemoryLimits | None,
        clock: Callable[[], float],
    ) -> None:
        self.db = db
        self.dialect = dialect
        self.limits = limits or MemoryLimits()
        self._clock = clock

    def close(self) -> None:
        self.db.close()

    @property
    def monitor(self) -> Monitor:
        """The budget monitor, in this store's database."""
        return Monitor(self.db)

    @property
    def schema_version(self) -> int:
        return int(self.db.fetchall(self.dialect.version_sql)[0][0])

    def add(self, memory: NewMemory) -> tuple[Memory, list[Memory]]:
        (added,), evicted = self.add_many([memory])
        return added, evicted

    def add_many(self, memories: Sequence[NewMemory]) -> tuple[list[Memory], list[Memory]]:
        """Add all of `memories` (one owner) in one transaction, or none of them.

        `InvalidMemory` (nothing written) names the first bad one by its position (`item 3:
        …`); a batch larger than `memory.maxMemories` is refused the same way. Past the limit,
        the least recently used *older* memories are evicted.
        """
        checked = checked_batch(memories, self.limits, now=self._clock())
        if not checked:
            return [], []
        owner = checked[0].owner
        # One write transaction under the dialect's lock: concurrent adders (CLI, API,
        # workers, other proxies) queue instead of losing writes, ids stay consecutive within
        # a batch (recall's context links id ± 1 of one batch), and the eviction sees the
        # count it is correcting.
        with self.db.transaction() as tx:
            self.dialect.lock(tx)
            first = int(tx.execute("SELECT coalesce(max(id), 0) FROM memories").fetchall()[0][0])
            count = self.dialect.insert(tx, owner, checked, first=first)
            self._count_words(tx, owner, [m.text for m in checked], 1)
            evicted: list[Memory] = []
            excess = count - self.limits.max_memories
            if excess > 0:
                evicted = [
                    memory_of(r)
                    for r in tx.execute(
                        f"SELECT {COLUMNS} FROM memories WHERE owner = ? AND id <= ?"
                        " ORDER BY last_accessed, id LIMIT ?",
                        (owner, first, excess),
                    ).fetchall()
                ]
                self._delete(tx, owner, [m.id for m in evicted])
            added = [
                memory_of(r)
                for r in tx.execute(
                    f"SELECT {COLUMNS} FROM memories"
                    f" WHERE {self.dialect.owner_by_id} = ? AND id > ? ORDER BY id",
                    (owner, first),
                ).fetchall()
            ]
        for gone in evicted:
            log.info(
                "evicted memory %d of owner %s (least recently used, past memory.maxMemories=%d)",
                gone.id,
                gone.owner,
                self.limits.max_memories,
            )
        return added, evicted

    def has_any(self, owner: str) -> bool:
        """Whether `owner` has any memory (an index lookup: recall skips work when not)."""
        return bool(self.db.fetchall("SELECT 1 FROM memories WHERE owner = ? LIMIT 1", (owner,)))

    def has_any_nowait(self, owner: str) -> bool | None:
        """`has_any` answered at once from an event loop (`peek`), or None when it cannot be:
        recall is skipped for an owner with no memories without a trip to a worker thread."""
        rows = self.db.peek("SELECT 1 FROM memories WHERE owner = ? LIMIT 1", (owner,))
        return None if rows is None else bool(rows)

    def get(self, owner: str, memory_id: int) -> Memory | None:
        rows = self.db.fetchall(
            f"SELECT {COLUMNS} FROM memories WHERE owner = ? AND id = ?", (owner, memory_id)
        )
        return memory_of(rows[0]) if rows else None

    def all(self, owner: str, *, scope: str | None = None) -> list[Memory]:
        sql = f"SELECT {COLUMNS} FROM memories WHERE owner = ?"
        args: tuple[object, ...] = (owner,)
        if scope is not None:
            sql += " AND scope = ?"
            args += (scope,)
        return [memory_of(r) for r in self.db.fetchall(sql + " ORDER BY id", args)]

    def search(
        self, owner: str, query: str, *, limit: int = 20, prefix: bool = False
    ) -> list[tuple[Memory, float]]:
        """Memories matching any word of `query`, best first, with their BM25 relevance
        (higher is better). With `prefix`, words of 3+ letters also match as prefixes
        (`orion` finds orionwave)."""
        return self.dialect.search(self, owner, query, limit=limit, prefix=prefix)

    def search_rarest(
        self, owner: str, words: Sequence[str], *, scan: int, limit: int, prefix: bool = False
    ) -> Rarest:
        return self.dialect.search_rarest(self, owner, words, scan=scan, limit=limit, prefix=prefix)

    def neighbours(self, owner: str, ids: Iterable[int]) -> list[Memory]:
        wanted = sorted({n for i in ids for n in (i - 1, i + 1)})
        if not wanted:
            return []
        params: tuple[Any, ...]
        among, params = self.dialect.any_of("id", "bigint", wanted)
        rows = self.db.fetchall(
            f"SELECT {COLUMNS} FROM memories WHERE {self.dialect.owner_by_id} = ? AND {among}"
            " ORDER BY id",
            (owner, *params),
            prepare=True,
        )
        return [memory_of(r) for r in rows]

    def remove(self, owner: str, memory_id: int) -> bool:
        with self.db.transaction() as tx:
            self.dialect.lock(tx)
            return bool(self._delete(tx, owner, [memory_id]))

    def frequencies(
        self, owner: str, words: Iterable[str], *, prefix: bool = False
    ) -> tuple[int, dict[str, int]]:
        """The owner's memory count, and how many of those memories contain each word.

        With `prefix`, words of 3+ letters count every word they start (as `search` matches).
        One statement: the counts are of one moment, whatever writes meanwhile.
        """
        wanted = list(dict.fromkeys(words))
        params: tuple[Any, ...]
        table, params = self.dialect.rows("w", {"word": "text"}, [wanted])
        rows = self.db.fetchall(
            "SELECT (SELECT n FROM owner_counts WHERE owner = ?), w.word,"
            " CASE WHEN ? AND length(w.word) >= 3 THEN"
            "  (SELECT coalesce(sum(n), 0) FROM words WHERE owner = ? AND word >= w.word"
            f"   AND word < w.word || {self.dialect.top})"
            " ELSE (SELECT n FROM words WHERE owner = ? AND word = w.word) END"
            f" FROM {table}",
            (owner, prefix, owner, owner, *params),
            prepare=True,
        )
        if not rows:
            total = self.db.fetchall("SELECT n FROM owner_counts WHERE owner = ?", (owner,))
            return (int(total[0][0]) if total else 0), {}
        return int(rows[0][0] or 0), {str(r[1]): int(r[2] or 0) for r in rows}

    def touch(self, owner: str, ids: Iterable[int], *, now: float | None = None) -> None:
        """Count one access of each memory."""
        with self.db.transaction() as tx:
            self._touch(tx, owner, ids, self._clock() if now is None else now)

    def touch_once(self, owner: str, turn: str, ids: Iterable[int]) -> bool:
        """Count one access of each memory, once per `turn` key; True the first time."""
        now = self._clock()
        with self.db.transaction() as tx:
            fresh = tx.execute(
                "INSERT INTO turns (owner, key, at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                (owner, turn, now),
            ).rowcount
            if fresh:
                self._touch(tx, owner, ids, now)
                # Keep the table small: a turn older than a day will not come back.
                tx.execute("DELETE FROM turns WHERE at < ?", (now - 86_400,))
        return bool(fresh)

    def _touch(self, tx: Tx, owner: str, ids: Iterable[int], when: float) -> None:
        counts = Counter(ids)  # an id given twice counts twice
        if not counts:
            return
        params: tuple[Any, ...]
        table, params = self.dialect.rows(
            "t", {"id": "bigint", "n": "bigint"}, [list(counts), list(counts.values())]
        )
        tx.execute(
            "UPDATE memories SET last_accessed = ?, access_count = access_count + t.n"
            f" FROM {table} WHERE memories.id = t.id AND memories.owner = ?",
            (when, *params, owner),
        )

    def _delete(self, tx: Tx, owner: str, ids: Sequence[int]) -> int:
        """Delete the owner's memories `ids` with their word counts; how many went."""
        gone = self.dialect.delete(tx, owner, ids)
        self._count_words(tx, owner, gone, -1)
        return len(gone)

    def _count_words(self, tx: Tx, owner: str, texts: Iterable[str], delta: int) -> None:
        """Add `delta` to the owner's count of each word of `texts` (`frequencies` reads
        them); a word no memory has any more is dropped."""
        counts: Counter[str] = Counter()
        for text in texts:
            counts.update(words_of(text))
        if not counts:
            return
        words = sorted(counts)  # one order for every writer: no deadlock between two
        params: tuple[Any, ...]
        table, params = self.dialect.rows(
            "t", {"word": "text", "n": "bigint"}, [words, [counts[w] * delta for w in words]]
        )
        # `WHERE true`: SQLite's parser takes an upsert after a SELECT only with a WHERE
        tx.execute(
            f"INSERT INTO words (owner, word, n) SELECT ?, t.word, t.n FROM {table} WHERE true"
            " ON CONFLICT (owner, word) DO UPDATE SET n = words.n + excluded.n",
            (owner, *params),
        )
        if delta < 0:
            among, params = self.dialect.any_of("word", "text", words)
            tx.execute(
                f"DELETE FROM words WHERE owner = ? AND {among} AND n <= 0", (owner, *params)
            )
