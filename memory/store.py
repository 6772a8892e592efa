"""The memory store: a small interface, and its embedded SQLite implementation.

SQLite in WAL mode, so the CLI, the API and every worker of the proxy can use one file at
once; FTS5 (porter stemmer) for keyword search, ranked by BM25; the schema carries its
version (`PRAGMA user_version`) and is migrated forward on open. Each owner keeps at most
`max_memories` memories: adding one more evicts the least recently used, and says so in the
log. Every operation is written once, in `memory/sqlstore.py`; what is SQLite's own is
`SQLiteDialect` here. PostgreSQL's is in `memory/pgstore.py`.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ctxbudget.memory.monitor import Monitor
from ctxbudget.memory.schema import MIGRATIONS, VERSION, apply_sqlite
from ctxbudget.memory.sqlite import Database
from ctxbudget.memory.sqlstore import COLUMNS, SQLMemoryStore, Tx, memory_of
from ctxbudget.memory.types import Memory, MemoryLimits, NewMemory, Rarest


class MemoryStore(Protocol):
    """What recall and the CLI/API need from a store: `SQLiteMemoryStore`, or
    `memory.pgstore.PgMemoryStore` (`database.url`), both `memory.sqlstore.SQLMemoryStore`."""

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


class SQLiteDialect:
    """`Dialect` of SQLite: FTS5 keeps the full-text index by trigger, and ranks by bm25()."""

    top = "char(1114111)"
    # `+owner`: rows found by id are looked up by rowid; through the owner index, finding an
    # add's new rows read every memory of the owner, which made each add O(n) (~30x slower
    # at 100k)
    owner_by_id = "+owner"
    version_sql = "PRAGMA user_version"

    def rows(
        self, alias: str, columns: Mapping[str, str], values: Sequence[Sequence[Any]]
    ) -> tuple[str, tuple[Any, ...]]:
        # One JSON parameter, however many rows: SQLite has no arrays, and a statement takes
        # at most 32,766 parameters
        picks = ", ".join(f"json_extract(value, '$[{i}]') AS {c}" for i, c in enumerate(columns))
        data = json.dumps(list(zip(*values, strict=True)), ensure_ascii=False)
        return f"(SELECT {picks} FROM json_each(?)) AS {alias}", (data,)

    def any_of(self, column: str, kind: str, values: Sequence[Any]) -> tuple[str, tuple[Any, ...]]:
        if len(values) <= _LISTED:
            return f"{column} IN ({', '.join('?' * len(values))})", tuple(values)
        return f"{column} IN (SELECT value FROM json_each(?))", (
            json.dumps(list(values), ensure_ascii=False),
        )

    def lock(self, tx: Tx) -> None:
        """Nothing: `Database.transaction()` holds SQLite's write lock (`BEGIN IMMEDIATE`)."""

    def insert(self, tx: Tx, owner: str, memories: Sequence[NewMemory], *, first: int) -> int:
        # ids are max(id) + 1, + 2, …: the write lock is held; triggers keep FTS5's index
        # and `owner_counts`
        tx.executemany(
            "INSERT INTO memories (owner, text, category, source, scope, created,"
            " last_accessed, access_count, batch) VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?)",
            [
                (m.owner, m.text, m.category, m.source, m.scope, m.created, m.created, first + 1)
                for m in memories
            ],
        )
        return int(
            tx.execute("SELECT n FROM owner_counts WHERE owner = ?", (owner,)).fetchall()[0][0]
        )

    def delete(self, tx: Tx, owner: str, ids: Sequence[int]) -> list[str]:
        among, params = self.any_of("id", "bigint", ids)
        rows = tx.execute(
            f"DELETE FROM memories WHERE +owner = ? AND {among} RETURNING text", (owner, *params)
        ).fetchall()
        return [str(text) for (text,) in rows]

    def search(
        self, store: SQLMemoryStore[Database], owner: str, query: str, *, limit: int, prefix: bool
    ) -> list[tuple[Memory, float]]:
        match = fts_query(query, prefix=prefix)
        if match is None:
            return []
        if _shared(store.db):
            return _search_own(store, owner, query, match, limit=limit, prefix=prefix)
        rows = store.db.fetchall(
            f"SELECT {_M}, f.rank"
            " FROM (SELECT rowid, bm25(memories_fts, 1.0, 0.0) AS rank FROM memories_fts"
            "       WHERE memories_fts MATCH ? ORDER BY rank LIMIT ?) AS f"
            " JOIN memories m ON m.id = f.rowid"
            " WHERE m.owner = ? ORDER BY f.rank, m.id",
            (match, limit, owner),
        )
        # SQLite's bm25() is lower-is-better and negative; report it as a positive relevance.
        return [(memory_of(r[:10]), -float(r[10])) for r in rows]

    def search_rarest(
        self,
        store: SQLMemoryStore[Database],
        owner: str,
        words: Sequence[str],
        *,
        scan: int,
        limit: int,
        prefix: bool,
    ) -> Rarest:
        # SQLite answers in-process: two questions cost no round trip
        return search_rarest_in_steps(store, owner, words, scan=scan, limit=limit, prefix=prefix)


_M = ", ".join(f"m.{c.strip()}" for c in COLUMNS.split(","))
_LISTED = 900
"""Most values `SQLiteDialect.any_of` lists as parameters (recall's neighbours: a few hundred
at most; ~4% faster than `json_each`); more (an import's evictions) go as one JSON array."""


def _shared(db: Database) -> bool:
    """Whether memories of more than one owner are stored."""
    rows = db.fetchall("SELECT count(*) FROM owner_counts WHERE n > 0")
    return int(rows[0][0]) > 1


def _search_own(
    store: SQLMemoryStore[Database], owner: str, query: str, match: str, *, limit: int, prefix: bool
) -> list[tuple[Memory, float]]:
    """`search` in a store several owners share. FTS5's bm25() weighs words by their rarity
    in *every* owner's memories, so its scores and order would tell one owner about
    another's text. Here the owner's matches (FTS5 still finds them) are ranked by BM25 over
    the owner's own statistics only: word counts from the `words` table, lengths from the
    owner's matching memories."""
    phrase = '"' + owner.replace('"', '""') + '"'
    rows = store.db.fetchall(
        f"SELECT {_M} FROM memories_fts f JOIN memories m ON m.id = f.rowid"
        " WHERE memories_fts MATCH ? AND m.owner = ? ORDER BY m.id LIMIT ?",
        (f"owner : {phrase} AND {match}", owner, OWN_SCAN),
    )
    if not rows:
        return []
    found = list(dict.fromkeys(_WORD.findall(query.lower())))
    words = [w for w in found if w not in STOPWORDS] or found
    total, counts = store.frequencies(owner, words, prefix=prefix)
    memories = [memory_of(r) for r in rows]
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


def _migrate(db: Database) -> None:
    """Walk the file's schema forward from its `PRAGMA user_version` to `VERSION`."""
    with db.transaction() as conn:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > VERSION:
            raise RuntimeError(
                f"memory store {db.path} has schema version {version}, newer than this "
                f"ctxbudget knows ({VERSION}): upgrade ctxbudget"
            )
        for step in MIGRATIONS:
            if step.version > version:
                apply_sqlite(conn, step)
                conn.execute(f"PRAGMA user_version={step.version}")


class SQLiteMemoryStore(SQLMemoryStore[Database]):
    """`MemoryStore` in one SQLite file."""

    def __init__(
        self,
        path: Path,
        *,
        limits: MemoryLimits | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        super().__init__(Database(path), SQLiteDialect(), limits=limits, clock=clock)
        _migrate(self.db)
