"""The memory store: a small interface, and its embedded SQLite implementation.

SQLite in WAL mode, so the CLI, the API and every worker of the proxy can use one file at
once; FTS5 (porter stemmer) for keyword search, ranked by BM25; the schema carries its
version (`PRAGMA user_version`) and is migrated forward on open. Each owner keeps at most
`max_memories` memories: adding one more evicts the least recently used, and says so in the
log. PostgreSQL implements the same `MemoryStore` in `memory/pgstore.py`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from memory.monitor import Monitor
from memory.schema import MIGRATIONS, VERSION, apply_sqlite, words_of
from memory.sqlite import Database, peek, reader
from memory.types import InvalidMemory, Memory, MemoryLimits, NewMemory, Rarest

log = logging.getLogger("ctxbudget.memory")


class MemoryStore(Protocol):
    """What recall and the CLI/API need from a store: `SQLiteMemoryStore`, or
    `memory.pgstore.PgMemoryStore` (`database.url`)."""

    limits: MemoryLimits

    @property
    def monitor(self) -> Monitor:
        """The budget monitor, in the store's database."""
        ...

    def close(self) -> None: ...

    def add(self, memory: NewMemory) -> tuple[Memory, list[Memory]]:
        """Store a validated memory; return it and any memories evicted to make room."""
        ...

    def add_many(self, memories: Sequence[NewMemory]) -> tuple[list[Memory], list[Memory]]:
        """Add all of `memories` (one owner) in one transaction, or none of them."""
        ...

    def has_any(self, owner: str) -> bool: ...

    def has_any_nowait(self, owner: str) -> bool | None:
        """`has_any` answered at once from an event loop, or None when it cannot be."""
        ...

    def get(self, owner: str, memory_id: int) -> Memory | None: ...

    def all(self, owner: str, *, scope: str | None = None) -> list[Memory]: ...

    def search(
        self, owner: str, query: str, *, limit: int = 20, prefix: bool = False
    ) -> list[tuple[Memory, float]]:
        """Memories matching `query` with their BM25 relevance (higher is better)."""
        ...

    def search_rarest(
        self, owner: str, words: Sequence[str], *, scan: int, limit: int, prefix: bool = False
    ) -> Rarest:
        """`search` for the rarest of `words`: taken rarest first while their matches fit in
        `scan` memories; a word too common to fit is skipped (`rarest_first`)."""
        ...

    def remove(self, owner: str, memory_id: int) -> bool: ...

    def neighbours(self, owner: str, ids: Iterable[int]) -> list[Memory]:
        """The owner's memories stored right before or after each of `ids` (id ± 1)."""
        ...

    def frequencies(
        self, owner: str, words: Iterable[str], *, prefix: bool = False
    ) -> tuple[int, dict[str, int]]:
        """The owner's memory count, and how many of those memories contain each word.

        With `prefix`, words of 3+ letters count every word they start (as `search` matches).
        """
        ...

    def touch(self, owner: str, ids: Iterable[int], *, now: float | None = None) -> None:
        """Count one access of each memory."""
        ...

    def touch_once(self, owner: str, turn: str, ids: Iterable[int]) -> bool:
        """Count one access of each memory, once per `turn` key; True the first time."""
        ...


_COLUMNS = "id, owner, text, category, source, scope, created, last_accessed, access_count, batch"
# Words that say nothing about which memory is meant, yet match most of them: function
# words, and the verbs and fillers of how people ask an agent for something ("should I use",
# "please show me"). Recall injects a memory only for a match on some other word of the turn
# (`memory/selection.py`): "Use tabs in Makefiles" is no answer to "how should I use orion?".
STOPWORDS = frozenset(
    "a an and are as at be but by can could did do does for from had has have how i if in is it"
    " its me my of on or our so than that the their them then there these they this to us was"
    " we were what when where which who why will with would you your"
    # issue 36: a memory matching only "use" was injected. Asking words only: "like", "more",
    # "she" and the like took 1-2 points off recall of LoCoMo's questions (docs/benchmarks.md)
    " also am been being get gets got just let may might must need needs please shall should"
    " tell use used uses using".split()
)
_WORD = re.compile(r"\w+", re.UNICODE)


def checked_batch(
    memories: Sequence[NewMemory], limits: MemoryLimits, *, now: float
) -> list[NewMemory]:
    """`memories` validated as one batch for `add_many` (both stores): `InvalidMemory` names
    the first bad one by its position (`item 3: …`), a batch of several owners, or one larger
    than `memory.maxMemories`. A `created` time after `now` (an import's) becomes `now`: a
    memory from the future would never age in recall's recency."""
    checked = []
    for number, memory in enumerate(memories, 1):
        try:
            valid = memory.validate(limits)
        except InvalidMemory as exc:
            raise InvalidMemory(f"item {number}: {exc}") from None
        if valid.created is not None and valid.created > now:
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


def rarest_first(
    words: Sequence[str], counts: Mapping[str, int], scan: int
) -> tuple[list[str], list[tuple[str, int]]]:
    """The words to rank by, in their own order, and the ones skipped with their counts.

    BM25 scores every memory a word matches, so a word in most memories costs the most and
    says the least (its IDF is near zero). Words are taken rarest first (ties in their own
    order) while the memories they match fit in `scan`; sorted so, the first word that does
    not fit is followed only by words that fit even less.

    >>> rarest_first(["the", "orion", "deadline"], {"the": 900, "orion": 3, "deadline": 40}, 100)
    (['orion', 'deadline'], [('the', 900)])
    """
    kept: set[str] = set()
    skipped: list[tuple[str, int]] = []
    scanned = 0
    for word in sorted(words, key=lambda w: counts.get(w, 0)):
        n = counts.get(word, 0)
        if n and scanned + n > scan:
            skipped.append((word, n))
            continue
        kept.add(word)
        scanned += n
    return [w for w in words if w in kept], skipped


def search_rarest_in_steps(
    store: MemoryStore,
    owner: str,
    words: Sequence[str],
    *,
    scan: int,
    limit: int,
    prefix: bool = False,
) -> Rarest:
    """`MemoryStore.search_rarest` as two questions to the store: how common each word is,
    then the search."""
    if not words:
        return Rarest(found=[], words=[], skipped=[])
    _, counts = store.frequencies(owner, words, prefix=prefix)
    kept, skipped = rarest_first(words, counts, scan)
    found = store.search(owner, " ".join(kept), limit=limit, prefix=prefix) if kept else []
    return Rarest(found=found, words=kept, skipped=skipped)


def search_rows(found: Sequence[tuple[Memory, float]]) -> list[dict[str, object]]:
    """`search` hits as the CLI and `GET /v1/memories?q=` show them: each memory with its
    `relevance` on a scale a person reads, 0-100, the best hit of this search 100 (to one
    decimal), and BM25's own number (`bm25`, 4 significant digits: 2.21e-06 for a word in
    most memories, which a person cannot read as "as good as the best")."""
    best = max((score for _, score in found), default=0.0)
    return [
        {
            **m.to_dict(),
            "relevance": round(100 * score / best, 1) if best > 0 else 0.0,
            "bm25": float(f"{score:.4g}"),
        }
        for m, score in found
    ]


def log_evicted(evicted: Sequence[Memory], limits: MemoryLimits) -> None:
    """Say which memories an add pushed out, one line each (both stores)."""
    for gone in evicted:
        log.info(
            "evicted memory %d of owner %s (least recently used, past memory.maxMemories=%d)",
            gone.id,
            gone.owner,
            limits.max_memories,
        )


def _row(row: tuple[object, ...]) -> Memory:
    return Memory(
        id=int(row[0]),  # type: ignore[call-overload]
        owner=str(row[1]),
        text=str(row[2]),
        category=str(row[3]),
        source=str(row[4]),  # type: ignore[arg-type]
        scope=str(row[5]),
        created=float(row[6]),  # type: ignore[arg-type]
        last_accessed=float(row[7]),  # type: ignore[arg-type]
        access_count=int(row[8]),  # type: ignore[call-overload]
        batch=None if row[9] is None else int(row[9]),  # type: ignore[call-overload]
    )


OWN_SCAN = 10_000
"""Most matches of one owner ranked in a shared store (an owner keeps `memory.maxMemories`,
100 by default)."""


def _same_word(token: str, word: str, *, prefix: bool) -> bool:
    """Whether a memory's token counts as the query word: FTS5 matched it through the porter
    stemmer (`deploys` for `deploy`), or through a prefix."""
    if token == word:
        return True
    if prefix and len(word) >= 3 and token.startswith(word):
        return True
    short, long_ = sorted((token, word), key=len)
    return len(short) >= 4 and long_.startswith(short) and len(long_) - len(short) <= 3


def fts_query(text: str, *, prefix: bool = False) -> str | None:
    """An FTS5 query matching any word of `text` (quoted: user text is never FTS syntax).

    With `prefix`, words of 3+ letters also match as prefixes (`"orion"*` finds orionwave).
    """
    found = list(dict.fromkeys(_WORD.findall(text.lower())))
    words = [w for w in found if w not in STOPWORDS] or found  # all stopwords: keep them
    terms = [f'"{w}"' for w in words]
    if prefix:
        terms += [f'"{w}"*' for w in words if len(w) >= 3]
    return "text : (" + " OR ".join(terms) + ")" if terms else None


class SQLiteMemoryStore:
    """`MemoryStore` in one SQLite file."""

    def __init__(
        self,
        path: Path,
        *,
        limits: MemoryLimits | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.limits = limits or MemoryLimits()
        self._clock = clock
        self._db = Database(path)
        self._quick: sqlite3.Connection | None = None
        self._migrate()

    def close(self) -> None:
        self._db.close()
        if self._quick is not None:
            self._quick.close()

    def _migrate(self) -> None:
        with self._db.transaction() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > VERSION:
                raise RuntimeError(
                    f"memory store {self.path} has schema version {version}, newer than this "
                    f"ctxbudget knows ({VERSION}): upgrade ctxbudget"
                )
            for step in MIGRATIONS:
                if step.version > version:
                    apply_sqlite(conn, step)
                    conn.execute(f"PRAGMA user_version={step.version}")

    @property
    def monitor(self) -> Monitor:
        """The budget monitor, in this store's database."""
        return Monitor(self._db)

    @property
    def schema_version(self) -> int:
        return int(self._db.fetchall("PRAGMA user_version")[0][0])

    def add(self, memory: NewMemory) -> tuple[Memory, list[Memory]]:
        (added,), evicted = self.add_many([memory])
        return added, evicted

    def add_many(self, memories: Sequence[NewMemory]) -> tuple[list[Memory], list[Memory]]:
        """Add all of `memories` (one owner) in one transaction, or none of them.

        `InvalidMemory` (nothing written) names the first bad one by its position (`item 3:
        …`); a batch larger than `memory.maxMemories` is refused the same way. Past the limit,
        the least recently used *older* memories are evicted.
        """
        now = self._clock()
        checked = checked_batch(memories, self.limits, now=now)
        if not checked:
            return [], []
        owner = checked[0].owner
        # One write transaction: concurrent adders (CLI, API, workers) queue on the lock
        # instead of losing writes, and the eviction sees the count it is correcting.
        with self._db.transaction() as conn:
            first = conn.execute("SELECT coalesce(max(id), 0) FROM memories").fetchone()[0]
            # ids are max(id) + 1, + 2, …: the batch is named by its first
            conn.executemany(
                "INSERT INTO memories (owner, text, category, source, scope, created,"
                " last_accessed, access_count, batch) VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?)",
                [
                    (m.owner, m.text, m.category, m.source, m.scope, when, when, first + 1)
                    for m in checked
                    for when in (now if m.created is None else m.created,)
                ],
            )
            self._count_words(conn, owner, [m.text for m in checked], 1)
            count = conn.execute("SELECT n FROM owner_counts WHERE owner = ?", (owner,)).fetchone()[
                0
            ]
            evicted: list[Memory] = []
            excess = count - self.limits.max_memories
            if excess > 0:
                evicted = [
                    _row(r)
                    for r in conn.execute(
                        f"SELECT {_COLUMNS} FROM memories WHERE owner = ? AND id <= ?"
                        " ORDER BY last_accessed, id LIMIT ?",
                        (owner, first, excess),
                    ).fetchall()
                ]
                conn.executemany("DELETE FROM memories WHERE id = ?", [(m.id,) for m in evicted])
                self._count_words(conn, owner, [m.text for m in evicted], -1)
            # `+owner`: the new rows by rowid range; the owner index would read every memory
            # of the owner, which made each add O(n) (~30x slower at 100k)
            added = [
                _row(r)
                for r in conn.execute(
                    f"SELECT {_COLUMNS} FROM memories WHERE +owner = ? AND id > ? ORDER BY id",
                    (owner, first),
                ).fetchall()
            ]
        log_evicted(evicted, self.limits)
        return added, evicted

    def has_any(self, owner: str) -> bool:
        """Whether `owner` has any memory (an index lookup: recall skips work when not)."""
        return bool(self._db.fetchall("SELECT 1 FROM memories WHERE owner = ? LIMIT 1", (owner,)))

    def has_any_nowait(self, owner: str) -> bool | None:
        """`has_any`, from one thread only (an event loop), never waiting: None when SQLite
        is busy.

        A connection of its own, read-only and with no busy timeout: it shares no lock with
        the threads that write, and a WAL reader does not wait for writers. Recall is skipped
        for an owner with no memories without a trip to a worker thread (~0.1 ms).
        """
        if self._quick is None:
            try:
                self._quick = reader(self.path)
            except sqlite3.Error:
                return None
        rows = peek(self._quick, "SELECT 1 FROM memories WHERE owner = ? LIMIT 1", (owner,))
        return None if rows is None else bool(rows)

    def get(self, owner: str, memory_id: int) -> Memory | None:
        rows = self._db.fetchall(
            f"SELECT {_COLUMNS} FROM memories WHERE owner = ? AND id = ?", (owner, memory_id)
        )
        return _row(rows[0]) if rows else None

    def all(self, owner: str, *, scope: str | None = None) -> list[Memory]:
        sql = f"SELECT {_COLUMNS} FROM memories WHERE owner = ?"
        args: tuple[object, ...] = (owner,)
        if scope is not None:
            sql += " AND scope = ?"
            args += (scope,)
        return [_row(r) for r in self._db.fetchall(sql + " ORDER BY id", args)]

    def search(
        self, owner: str, query: str, *, limit: int = 20, prefix: bool = False
    ) -> list[tuple[Memory, float]]:
        match = fts_query(query, prefix=prefix)
        if match is None:
            return []
        if self._shared():
            return self._search_own(owner, query, match, limit=limit, prefix=prefix)
        rows = self._db.fetchall(
            f"SELECT {', '.join('m.' + c.strip() for c in _COLUMNS.split(','))}, f.rank"
            " FROM (SELECT rowid, bm25(memories_fts, 1.0, 0.0) AS rank FROM memories_fts"
            "       WHERE memories_fts MATCH ? ORDER BY rank LIMIT ?) AS f"
            " JOIN memories m ON m.id = f.rowid"
            " WHERE m.owner = ? ORDER BY f.rank, m.id",
            (match, limit, owner),
        )
        # SQLite's bm25() is lower-is-better and negative; report it as a positive relevance.
        return [(_row(r[:10]), -float(r[10])) for r in rows]

    def search_rarest(
        self, owner: str, words: Sequence[str], *, scan: int, limit: int, prefix: bool = False
    ) -> Rarest:
        # SQLite answers in-process: two questions cost no round trip
        return search_rarest_in_steps(self, owner, words, scan=scan, limit=limit, prefix=prefix)

    def _search_own(
        self, owner: str, query: str, match: str, *, limit: int, prefix: bool
    ) -> list[tuple[Memory, float]]:
        """`search` in a store several owners share. FTS5's bm25() weighs words by their
        rarity in *every* owner's memories, so its scores and order would tell one owner
        about another's text. Here the owner's matches (FTS5 still finds them) are ranked by
        BM25 over the owner's own statistics only: word counts from the `words` table,
        lengths from the owner's matching memories."""
        phrase = '"' + owner.replace('"', '""') + '"'
        rows = self._db.fetchall(
            f"SELECT {', '.join('m.' + c.strip() for c in _COLUMNS.split(','))}"
            " FROM memories_fts f JOIN memories m ON m.id = f.rowid"
            " WHERE memories_fts MATCH ? AND m.owner = ? ORDER BY m.id LIMIT ?",
            (f"owner : {phrase} AND {match}", owner, OWN_SCAN),
        )
        if not rows:
            return []
        found = list(dict.fromkeys(_WORD.findall(query.lower())))
        words = [w for w in found if w not in STOPWORDS] or found
        total, counts = self.frequencies(owner, words, prefix=prefix)
        memories = [_row(r) for r in rows]
        tokens = [_WORD.findall(m.text.lower()) for m in memories]
        average = sum(map(len, tokens)) / len(tokens) or 1.0
        scored = []
        for memory, toks in zip(memories, tokens, strict=True):
            score = 0.0
            for word in words:
                tf = sum(1 for t in toks if _same_word(t, word, prefix=prefix))
                if not tf:
                    continue
                df = max(counts.get(word, 0), 1)
                idf = math.log(1 + (total - df + 0.5) / (df + 0.5))
                score += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * len(toks) / average))
            scored.append((memory, score))
        scored.sort(key=lambda pair: (-pair[1], pair[0].id))
        return scored[:limit]

    def neighbours(self, owner: str, ids: Iterable[int]) -> list[Memory]:
        wanted = sorted({n for i in ids for n in (i - 1, i + 1)})
        out: list[Memory] = []
        # SQLite allows 32,766 parameters; recall asks for a few hundred at most.
        for start in range(0, len(wanted), 900):
            chunk = wanted[start : start + 900]
            marks = ", ".join("?" * len(chunk))
            out += [
                _row(r)
                for r in self._db.fetchall(
                    # `+owner`: look the ids up by rowid, not through the owner index
                    f"SELECT {_COLUMNS} FROM memories WHERE +owner = ? AND id IN ({marks})"
                    " ORDER BY id",
                    (owner, *chunk),
                )
            ]
        return out

    def _shared(self) -> bool:
        """Whether memories of more than one owner are stored."""
        rows = self._db.fetchall("SELECT count(*) FROM owner_counts WHERE n > 0")
        return int(rows[0][0]) > 1

    def remove(self, owner: str, memory_id: int) -> bool:
        with self._db.transaction() as conn:
            gone = conn.execute(
                "DELETE FROM memories WHERE owner = ? AND id = ? RETURNING text", (owner, memory_id)
            ).fetchall()
            self._count_words(conn, owner, [text for (text,) in gone], -1)
        return bool(gone)

    @staticmethod
    def _count_words(
        conn: sqlite3.Connection, owner: str, texts: Iterable[str], delta: int
    ) -> None:
        counts: Counter[str] = Counter()
        for text in texts:
            counts.update(words_of(text))
        conn.executemany(
            "INSERT INTO words (owner, word, n) VALUES (?, ?, ?)"
            " ON CONFLICT (owner, word) DO UPDATE SET n = n + excluded.n",
            ((owner, word, n * delta) for word, n in counts.items()),
        )
        if delta < 0:
            conn.executemany(
                "DELETE FROM words WHERE owner = ? AND word = ? AND n <= 0",
                ((owner, word) for word in counts),
            )

    def frequencies(
        self, owner: str, words: Iterable[str], *, prefix: bool = False
    ) -> tuple[int, dict[str, int]]:
        with self._db.lock:
            conn = self._db.conn
            total = conn.execute("SELECT n FROM owner_counts WHERE owner = ?", (owner,)).fetchone()
            counts: dict[str, int] = {}
            for word in words:
                if prefix and len(word) >= 3:
                    row = conn.execute(
                        "SELECT coalesce(sum(n), 0) FROM words WHERE owner = ? AND word >= ?"
                        " AND word < ?",
                        (owner, word, word + "\U0010ffff"),
                    ).fetchone()
                else:
                    row = conn.execute(
                        "SELECT n FROM words WHERE owner = ? AND word = ?", (owner, word)
                    ).fetchone()
                counts[word] = int(row[0]) if row else 0
        return (int(total[0]) if total else 0), counts

    def touch_once(self, owner: str, turn: str, ids: Iterable[int]) -> bool:
        now = self._clock()
        with self._db.transaction() as conn:
            fresh = conn.execute(
                "INSERT OR IGNORE INTO turns (owner, key, at) VALUES (?, ?, ?)", (owner, turn, now)
            ).rowcount
            if fresh:
                self._touch(owner, ids, now)
                # Keep the table small: a turn older than a day will not come back.
                conn.execute("DELETE FROM turns WHERE at < ?", (now - 86_400,))
        return bool(fresh)

    def touch(self, owner: str, ids: Iterable[int], *, now: float | None = None) -> None:
        self._touch(owner, ids, self._clock() if now is None else now)

    def _touch(self, owner: str, ids: Iterable[int], when: float) -> None:
        self._db.executemany(
            "UPDATE memories SET last_accessed = ?, access_count = access_count + 1"
            " WHERE owner = ? AND id = ?",
            [(when, owner, i) for i in ids],
        )
