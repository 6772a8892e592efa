"""The memory store in PostgreSQL: `MemoryStore` for any number of proxies sharing one database.

The same behaviour as `SQLiteMemoryStore` (owners, scopes, LRU eviction, access counts,
once-per-turn touches, word counts, batches, the monitor's tables), with PostgreSQL's built-in
full-text search in place of FTS5:

- Each memory keeps a `tsvector` of its words, tokenised as FTS5's `unicode61` does (letters
  and digits, case and diacritics folded) and stemmed by Snowball's original Porter stemmer
  (FTS5's `porter`), plus one lexeme naming its owner; its words also go to `postings`, an
  inverted index of (owner, lexeme, id) with each word's count and the memory's length, kept
  by `add_many` and `_delete` as FTS5 keeps its own.
- PostgreSQL ranks with `ts_rank`, which has no inverse document frequency. `search` ranks by
  BM25 instead, computed in one statement from `postings` the way FTS5's `bm25()` does
  (k1 = 1.2, b = 0.75, one phrase per query word and one per prefix, IDF floored at 1e-6),
  over the owner's own memories only: N, the average length and each word's document count
  are the owner's, so one owner's scores say nothing of another's text (SQLite gets there
  with `_search_own`).
- Adds take one advisory lock, as SQLite's write lock serialises them: ids stay `max(id) + 1,
  + 2, …` within a batch (recall's context links id ± 1 of one batch) and eviction sees the
  count it corrects.
"""

from __future__ import annotations

import logging
import re
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ctxbudget.memory.monitor import Monitor
from ctxbudget.memory.pg import PgDatabase, PgTx, migrate
from ctxbudget.memory.schema import MIGRATIONS, words_of
from ctxbudget.memory.store import (
    _COLUMNS,
    STOPWORDS,
    _row,
    checked_batch,
    log_evicted,
    search_rarest_in_steps,
)
from ctxbudget.memory.types import Memory, MemoryLimits, NewMemory, Rarest

log = logging.getLogger("ctxbudget.memory")

LOCK = "ctxbudget:memories"
"""The advisory lock every add and removal holds for its transaction."""

_TOKEN = re.compile(r"[^\W_]+")
_DIACRITICS = re.compile(r"[\u0300-\u036f]")


def tokens(text: str) -> list[str]:
    """The words FTS5's `unicode61` tokenizer finds: letters and digits, lower-cased, without
    diacritics.

    >>> tokens("Café at 9:30, re-deploy_script!")
    ['cafe', 'at', '9', '30', 're', 'deploy', 'script']
    """
    folded = _DIACRITICS.sub("", unicodedata.normalize("NFKD", text.lower()))
    return _TOKEN.findall(folded)


def owner_lexeme(owner: str) -> str:
    """The lexeme that names `owner` in every tsvector (letters and digits only: never a word
    of the text's, which are at most what `tokens` gives; it is 33 characters)."""
    import hashlib

    return "o" + hashlib.md5(owner.encode(), usedforsecurity=False).hexdigest()


_M = ", ".join(f"m.{c.strip()}" for c in _COLUMNS.split(","))
_INSERT = (
    "INSERT INTO memories (id, owner, text, category, source, scope, created, last_accessed,"
    " access_count, batch, length, tsv)"
    " SELECT first.v + t.ord, ?, t.text, t.category, t.source, t.scope, t.at, t.at, 0,"
    "  first.v + 1, t.length,"
    "  to_tsvector('ctxbudget', t.words) || array_to_tsvector(ARRAY[?::text])"
    " FROM (SELECT ?::bigint AS v) first,"
    "  unnest(?::text[], ?::text[], ?::text[], ?::text[], ?::float8[], ?::int[], ?::text[])"
    "  WITH ORDINALITY AS t(text, category, source, scope, at, length, words, ord)"
)
_OWNER = """c AS (SELECT n::float8 AS n, greatest(length::float8 / greatest(n, 1), 1) AS avgdl
      FROM owner_counts WHERE owner = ?)"""
_LEXEME = "(tsvector_to_array(to_tsvector('ctxbudget', {})))[1]"
_BM25 = f"""
scored AS (
    SELECT x.id, round(sum(greatest(ln((c.n - x.df + 0.5) / (x.df + 0.5)), 1e-6) * x.tf * 2.2
        / (x.tf + 1.2 * (0.25 + 0.75 * x.length / c.avgdl))) * 1e9) / 1e9 AS score
    FROM c, phrases p, LATERAL (
        SELECT id, sum(tf)::float8 AS tf, min(length)::float8 AS length,
            count(*) OVER ()::float8 AS df
        FROM postings WHERE owner = ? AND lexeme >= p.lexeme
            AND lexeme < p.lexeme || CASE WHEN p.prefix THEN chr(1114111) ELSE chr(1) END
        GROUP BY id
    ) x
    GROUP BY x.id ORDER BY score DESC, x.id LIMIT ?
),
found AS (SELECT {_M}, s.score FROM scored s JOIN memories m ON m.id = s.id)"""
"""BM25 as FTS5's bm25() computes it (k1 = 1.2, b = 0.75) over the owner's postings, for the
`phrases` (i, lexeme, prefix) before it, in one pass: each phrase's range of lexemes in the
index (one lexeme, or every one a prefix starts) gives its matches with their term
frequencies and lengths, and their number (the phrase's document frequency, a window over
the range: no second pass); nothing reads a memory's row but the `limit` returned. (Two
passes, the ranges materialised and then counted, took ~15% longer.) Each range stays an
index range of its own (the grouped subquery is never flattened): as one join, on a table
not yet analysed, the planner read all of the owner's postings once per phrase. An upper
bound of `lexeme || chr(1)` is the lexeme alone: lexemes are letters and digits. Scores are
rounded to 1e-9 before ranking: equal scores summed in another order (another plan, after
ANALYZE) must not swap two memories, which would change the injected block."""
_SEARCH = f"""
WITH {_OWNER},
phrases AS MATERIALIZED (
    SELECT p.i, {_LEXEME.format("p.word")} AS lexeme, p.prefix
    FROM unnest(?::text[], ?::bool[]) WITH ORDINALITY AS p(word, prefix, i)
),{_BM25}
SELECT * FROM found ORDER BY score DESC, id
"""
"""`search`: one phrase per query word and one per prefix."""
_SEARCH_RAREST = f"""
WITH {_OWNER},
counted AS MATERIALIZED (
    SELECT q.i, q.word, coalesce(CASE WHEN ? AND length(q.word) >= 3
        THEN (SELECT sum(n) FROM words WHERE owner = ? AND word >= q.word
              AND word < q.word || chr(1114111))
        ELSE (SELECT n FROM words WHERE owner = ? AND word = q.word) END, 0)::bigint AS n
    FROM unnest(?::text[]) WITH ORDINALITY AS q(word, i)
),
fitting AS MATERIALIZED (
    SELECT i, word, n, sum(n) OVER (ORDER BY n, i ROWS UNBOUNDED PRECEDING) <= ? AS fits
    FROM counted
),
phrases AS MATERIALIZED (
    SELECT f.i * 2 + p.prefix::int AS i, {_LEXEME.format("f.word")} AS lexeme, p.prefix
    FROM fitting f, (VALUES (false), (true)) AS p(prefix)
    WHERE f.fits AND (NOT p.prefix OR (? AND length(f.word) >= 3))
),{_BM25},
words_used AS (
    SELECT coalesce(array_agg(word ORDER BY i) FILTER (WHERE fits), '{{}}') AS kept,
           coalesce(array_agg(word ORDER BY n, i) FILTER (WHERE NOT fits), '{{}}') AS skipped,
           coalesce(array_agg(n ORDER BY n, i) FILTER (WHERE NOT fits), '{{}}') AS skipped_n
    FROM fitting
)
SELECT w.kept, w.skipped, w.skipped_n, f.*
FROM words_used w LEFT JOIN found f ON true ORDER BY f.score DESC, f.id
"""
"""`search_rarest` in one statement (one round trip, not two): each word's memory count from
`words` (as `frequencies`), the words that fit in the scan rarest first (`rarest_first`: a
running sum over the words sorted by count), then `_BM25` over them. One row per match, each
with the words kept and skipped; one row of words alone when nothing matched."""


def query_words(query: str) -> list[str]:
    """The words `search` matches (`fts_query`'s: stopwords out unless that leaves none).

    >>> query_words("When is the Orion deadline?")
    ['orion', 'deadline']
    """
    found = list(dict.fromkeys(tokens(query)))
    return [w for w in found if w not in STOPWORDS] or found


class PgMemoryStore:
    """`MemoryStore` in a PostgreSQL database (`database.url`)."""

    def __init__(
        self,
        db: PgDatabase,
        *,
        limits: MemoryLimits | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.limits = limits or MemoryLimits()
        self._clock = clock
        self._version = migrate(db, "memory", MIGRATIONS)

    @property
    def url(self) -> str:
        return self.db.url

    def close(self) -> None:
        self.db.close()

    @property
    def monitor(self) -> Monitor:
        """The budget monitor, in this store's database."""
        return Monitor(self.db)

    @property
    def schema_version(self) -> int:
        rows = self.db.fetchall("SELECT version FROM ctxbudget_schema WHERE component = 'memory'")
        return int(rows[0][0])

    def add(self, memory: NewMemory) -> tuple[Memory, list[Memory]]:
        (added,), evicted = self.add_many([memory])
        return added, evicted

    def add_many(self, memories: Sequence[NewMemory]) -> tuple[list[Memory], list[Memory]]:
        """`SQLiteMemoryStore.add_many`: one owner, one transaction, all or nothing."""
        now = self._clock()
        checked = checked_batch(memories, self.limits, now=now)
        if not checked:
            return [], []
        owner = checked[0].owner
        split = [tokens(m.text) for m in checked]
        with self.db.transaction() as tx:
            tx.execute("SELECT pg_advisory_xact_lock(hashtext(?))", (LOCK,))
            row = tx.execute("SELECT coalesce(max(id), 0) FROM memories").fetchone()
            first = int(row[0]) if row else 0
            tx.execute(
                _INSERT,
                (
                    owner,
                    owner_lexeme(owner),
                    first,
                    [m.text for m in checked],
                    [m.category for m in checked],
                    [m.source for m in checked],
                    [m.scope for m in checked],
                    [now if m.created is None else m.created for m in checked],
                    [len(t) for t in split],
                    [" ".join(t) for t in split],
                ),
            )
            tx.execute(
                "INSERT INTO postings (owner, lexeme, id, tf, length)"
                " SELECT m.owner, u.lexeme, m.id, cardinality(u.positions), m.length"
                " FROM memories m, unnest(m.tsv) u"
                " WHERE m.id > ? AND m.owner = ? AND u.positions IS NOT NULL",
                (first, owner),
            )
            _count_words(tx, owner, [m.text for m in checked], 1)
            row = tx.execute(
                "INSERT INTO owner_counts (owner, n, length) VALUES (?, ?, ?)"
                " ON CONFLICT (owner) DO UPDATE SET n = owner_counts.n + excluded.n,"
                " length = owner_counts.length + excluded.length RETURNING n",
                (owner, len(checked), sum(map(len, split))),
            ).fetchone()
            count = int(row[0]) if row else 0
            evicted: list[Memory] = []
            excess = count - self.limits.max_memories
            if excess > 0:
                evicted = [
                    _row(r)
                    for r in tx.execute(
                        f"SELECT {_COLUMNS} FROM memories WHERE owner = ? AND id <= ?"
                        " ORDER BY last_accessed, id LIMIT ?",
                        (owner, first, excess),
                    ).fetchall()
                ]
                _delete(tx, owner, [m.id for m in evicted])
            added = [
                _row(r)
                for r in tx.execute(
                    f"SELECT {_COLUMNS} FROM memories WHERE id > ? AND owner = ? ORDER BY id",
                    (first, owner),
                ).fetchall()
            ]
        log_evicted(evicted, self.limits)
        return added, evicted

    def has_any(self, owner: str) -> bool:
        return bool(self.db.fetchall("SELECT 1 FROM memories WHERE owner = ? LIMIT 1", (owner,)))

    def has_any_nowait(self, owner: str) -> bool | None:
        """Always None: a database across the network cannot answer without waiting, so the
        event loop leaves the question to the worker thread (`has_any`)."""
        return None

    def get(self, owner: str, memory_id: int) -> Memory | None:
        rows = self.db.fetchall(
            f"SELECT {_COLUMNS} FROM memories WHERE owner = ? AND id = ?", (owner, memory_id)
        )
        return _row(rows[0]) if rows else None

    def all(self, owner: str, *, scope: str | None = None) -> list[Memory]:
        sql = f"SELECT {_COLUMNS} FROM memories WHERE owner = ?"
        args: tuple[object, ...] = (owner,)
        if scope is not None:
            sql += " AND scope = ?"
            args += (scope,)
        return [_row(r) for r in self.db.fetchall(sql + " ORDER BY id", args)]

    def search(
        self, owner: str, query: str, *, limit: int = 20, prefix: bool = False
    ) -> list[tuple[Memory, float]]:
        """Memories matching any word of `query`, best first, with their BM25 relevance.

        With `prefix`, words of 3+ letters also match as prefixes (`orion` finds orionwave).
        """
        words = query_words(query)
        if not words:
            return []
        phrases = words + ([w for w in words if len(w) >= 3] if prefix else [])
        kinds = [False] * len(words) + [True] * (len(phrases) - len(words))
        rows = self.db.fetchall_planned_once(_SEARCH, (owner, phrases, kinds, owner, limit))
        return [(_row(r[:10]), float(r[10])) for r in rows]

    def search_rarest(
        self, owner: str, words: Sequence[str], *, scan: int, limit: int, prefix: bool = False
    ) -> Rarest:
        if not words or any(tokens(w) != [w] for w in words):
            # a word `search` would split or fold (`deploy_script`, `café`) is counted as
            # given but searched as its tokens: the two steps keep that exact
            return search_rarest_in_steps(self, owner, words, scan=scan, limit=limit, prefix=prefix)
        args = (owner, prefix, owner, owner, list(words), scan, prefix, owner, limit)
        rows = self.db.fetchall_planned_once(_SEARCH_RAREST, args)
        kept, skipped, skipped_n = rows[0][:3]
        found = [(_row(r[3:13]), float(r[13])) for r in rows if r[3] is not None]
        return Rarest(
            found=found,
            words=list(kept),
            skipped=list(zip(skipped, map(int, skipped_n), strict=True)),
        )

    def neighbours(self, owner: str, ids: Iterable[int]) -> list[Memory]:
        wanted = sorted({n for i in ids for n in (i - 1, i + 1)})
        if not wanted:
            return []
        return [
            _row(r)
            for r in self.db.fetchall(
                f"SELECT {_COLUMNS} FROM memories WHERE id = ANY(?::bigint[]) AND owner = ?"
                " ORDER BY id",
                (wanted, owner),
                prepare=True,
            )
        ]

    def remove(self, owner: str, memory_id: int) -> bool:
        with self.db.transaction() as tx:
            tx.execute("SELECT pg_advisory_xact_lock(hashtext(?))", (LOCK,))
            return bool(_delete(tx, owner, [memory_id]))

    def frequencies(
        self, owner: str, words: Iterable[str], *, prefix: bool = False
    ) -> tuple[int, dict[str, int]]:
        wanted = list(dict.fromkeys(words))
        rows = self.db.fetchall(
            "SELECT (SELECT n FROM owner_counts WHERE owner = ?), w.word,"
            " CASE WHEN ? AND length(w.word) >= 3 THEN"
            "  (SELECT coalesce(sum(n), 0) FROM words WHERE owner = ? AND word >= w.word"
            "   AND word < w.word || chr(1114111))"
            " ELSE (SELECT n FROM words WHERE owner = ? AND word = w.word) END"
            " FROM unnest(?::text[]) AS w(word)",
            (owner, prefix, owner, owner, wanted),
            prepare=True,
        )
        if not rows:
            total = self.db.fetchall("SELECT n FROM owner_counts WHERE owner = ?", (owner,))
            return (int(total[0][0]) if total else 0), {}
        return int(rows[0][0] or 0), {str(r[1]): int(r[2] or 0) for r in rows}

    def touch_once(self, owner: str, turn: str, ids: Iterable[int]) -> bool:
        now = self._clock()
        with self.db.transaction() as tx:
            fresh = tx.execute(
                "INSERT INTO turns (owner, key, at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                (owner, turn, now),
            ).rowcount
            if fresh:
                _touch(tx, owner, ids, now)
                # Keep the table small: a turn older than a day will not come back.
                tx.execute("DELETE FROM turns WHERE at < ?", (now - 86_400,))
        return bool(fresh)

    def touch(self, owner: str, ids: Iterable[int], *, now: float | None = None) -> None:
        with self.db.transaction() as tx:
            _touch(tx, owner, ids, self._clock() if now is None else now)


def _touch(tx: PgTx, owner: str, ids: Iterable[int], when: float) -> None:
    # an id given twice counts twice, as SQLite's one UPDATE per id does
    counts = Counter(ids)
    if counts:
        tx.execute(
            "UPDATE memories m SET last_accessed = ?, access_count = m.access_count + t.n"
            " FROM unnest(?::bigint[], ?::bigint[]) AS t(id, n) WHERE m.id = t.id AND m.owner = ?",
            (when, list(counts), list(counts.values()), owner),
        )


def _delete(tx: PgTx, owner: str, ids: list[int]) -> int:
    """Delete the owner's memories `ids` with their word and owner counts; how many went."""
    gone = tx.execute(
        "WITH gone AS (DELETE FROM memories WHERE owner = ? AND id = ANY(?::bigint[])"
        "  RETURNING id, text, length, tsv),"
        " postings_gone AS (DELETE FROM postings x USING gone, unnest(gone.tsv) u"
        "  WHERE x.owner = ? AND x.lexeme = u.lexeme AND x.id = gone.id)"
        " SELECT text, length FROM gone",
        (owner, ids, owner),
    ).fetchall()
    if gone:
        _count_words(tx, owner, [str(text) for text, _ in gone], -1)
        tx.execute(
            "UPDATE owner_counts SET n = n - ?, length = length - ? WHERE owner = ?",
            (len(gone), sum(int(n) for _, n in gone), owner),
        )
    return len(gone)


def _count_words(tx: PgTx, owner: str, texts: Iterable[str], delta: int) -> None:
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(words_of(text))
    if not counts:
        return
    words = sorted(counts)  # one order for every writer
    args: tuple[Any, ...] = (owner, words, [counts[w] * delta for w in words])
    tx.execute(
        "INSERT INTO words (owner, word, n) SELECT ?, w, n FROM unnest(?::text[], ?::bigint[])"
        " AS t(w, n) ON CONFLICT (owner, word) DO UPDATE SET n = words.n + excluded.n",
        args,
    )
    if delta < 0:
        tx.execute(
            "DELETE FROM words WHERE owner = ? AND word = ANY(?::text[]) AND n <= 0",
            (owner, words),
        )
