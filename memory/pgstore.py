"""The memory store in PostgreSQL: `MemoryStore` for any number of proxies sharing one database.

The same store as `SQLiteMemoryStore`, one SQL layer (`memory/sqlstore.py`: owners, scopes,
LRU eviction, access counts, once-per-turn touches, word counts, batches, the monitor's
tables), with `PgDialect`: PostgreSQL's built-in full-text search in place of FTS5.

- Each memory keeps a `tsvector` of its words, tokenised as FTS5's `unicode61` does (letters
  and digits, case and diacritics folded) and stemmed by Snowball's original Porter stemmer
  (FTS5's `porter`), plus one lexeme naming its owner; its words also go to `postings`, an
  inverted index of (owner, lexeme, id) with each word's count and the memory's length, kept
  by `PgDialect.insert` and `.delete` as FTS5 keeps its own.
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

import hashlib
import re
import time
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ctxbudget.memory.pg import PgDatabase, migrate
from ctxbudget.memory.schema import MIGRATIONS
from ctxbudget.memory.sqlstore import COLUMNS, SQLMemoryStore, Tx, memory_of
from ctxbudget.memory.store import STOPWORDS, search_rarest_in_steps
from ctxbudget.memory.types import Memory, MemoryLimits, NewMemory, Rarest

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
    return "o" + hashlib.md5(owner.encode(), usedforsecurity=False).hexdigest()


_M = ", ".join(f"m.{c.strip()}" for c in COLUMNS.split(","))
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


class PgDialect:
    """`Dialect` of PostgreSQL: a tsvector and `postings` written with each memory, and BM25
    summed from `postings` (the module's docstring)."""

    top = "chr(1114111)"
    owner_by_id = "owner"
    version_sql = "SELECT version FROM ctxbudget_schema WHERE component = 'memory'"

    def rows(
        self, alias: str, columns: Mapping[str, str], values: Sequence[Sequence[Any]]
    ) -> tuple[str, tuple[Any, ...]]:
        arrays = ", ".join(f"?::{kind}[]" for kind in columns.values())
        return f"unnest({arrays}) AS {alias}({', '.join(columns)})", tuple(map(list, values))

    def any_of(self, column: str, kind: str, values: Sequence[Any]) -> tuple[str, tuple[Any, ...]]:
        return f"{column} = ANY(?::{kind}[])", (list(values),)

    def lock(self, tx: Tx) -> None:
        """The advisory lock every add and removal holds for its transaction."""
        tx.execute("SELECT pg_advisory_xact_lock(hashtext(?))", (LOCK,))

    def insert(self, tx: Tx, owner: str, memories: Sequence[NewMemory], *, first: int) -> int:
        split = [tokens(m.text) for m in memories]
        tx.execute(
            _INSERT,
            (
                owner,
                owner_lexeme(owner),
                first,
                [m.text for m in memories],
                [m.category for m in memories],
                [m.source for m in memories],
                [m.scope for m in memories],
                [m.created for m in memories],
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
        row = tx.execute(
            "INSERT INTO owner_counts (owner, n, length) VALUES (?, ?, ?)"
            " ON CONFLICT (owner) DO UPDATE SET n = owner_counts.n + excluded.n,"
            " length = owner_counts.length + excluded.length RETURNING n",
            (owner, len(memories), sum(map(len, split))),
        ).fetchone()
        return int(row[0]) if row else 0

    def delete(self, tx: Tx, owner: str, ids: Sequence[int]) -> list[str]:
        gone = tx.execute(
            "WITH gone AS (DELETE FROM memories WHERE owner = ? AND id = ANY(?::bigint[])"
            "  RETURNING id, text, length, tsv),"
            " postings_gone AS (DELETE FROM postings x USING gone, unnest(gone.tsv) u"
            "  WHERE x.owner = ? AND x.lexeme = u.lexeme AND x.id = gone.id)"
            " SELECT text, length FROM gone",
            (owner, list(ids), owner),
        ).fetchall()
        if gone:
            tx.execute(
                "UPDATE owner_counts SET n = n - ?, length = length - ? WHERE owner = ?",
                (len(gone), sum(int(n) for _, n in gone), owner),
            )
        return [str(text) for text, _ in gone]

    def search(
        self,
        store: SQLMemoryStore[PgDatabase],
        owner: str,
        query: str,
        *,
        limit: int,
        prefix: bool,
    ) -> list[tuple[Memory, float]]:
        words = query_words(query)
        if not words:
            return []
        phrases = words + ([w for w in words if len(w) >= 3] if prefix else [])
        kinds = [False] * len(words) + [True] * (len(phrases) - len(words))
        rows = store.db.fetchall_planned_once(_SEARCH, (owner, phrases, kinds, owner, limit))
        return [(memory_of(r[:10]), float(r[10])) for r in rows]

    def search_rarest(
        self,
        store: SQLMemoryStore[PgDatabase],
        owner: str,
        words: Sequence[str],
        *,
        scan: int,
        limit: int,
        prefix: bool,
    ) -> Rarest:
        if not words or any(tokens(w) != [w] for w in words):
            # a word `search` would split or fold (`deploy_script`, `café`) is counted as
            # given but searched as its tokens: the two steps keep that exact
            return search_rarest_in_steps(
                store, owner, words, scan=scan, limit=limit, prefix=prefix
            )
        # one statement, one round trip (`_SEARCH_RAREST`)
        args = (owner, prefix, owner, owner, list(words), scan, prefix, owner, limit)
        rows = store.db.fetchall_planned_once(_SEARCH_RAREST, args)
        kept, skipped, skipped_n = rows[0][:3]
        found = [(memory_of(r[3:13]), float(r[13])) for r in rows if r[3] is not None]
        return Rarest(
            found=found,
            words=list(kept),
            skipped=list(zip(skipped, map(int, skipped_n), strict=True)),
        )


class PgMemoryStore(SQLMemoryStore[PgDatabase]):
    """`MemoryStore` in a PostgreSQL database (`database.url`)."""

    def __init__(
        self,
        db: PgDatabase,
        *,
        limits: MemoryLimits | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(db, PgDialect(), limits=limits, clock=clock)
        migrate(db, "memory", MIGRATIONS)
