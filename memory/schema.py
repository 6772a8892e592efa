"""The memory store's schema, one versioned list for both backends (`memory.pg.Migration`).

SQLite files walk every step from version 1 (`PRAGMA user_version` says where they are);
PostgreSQL databases start at the baseline of version 6, the first version it had, and take
the steps after it (`ctxbudget_schema` says where they are). Append, never edit.

PostgreSQL's text search: Snowball's original Porter stemmer (what FTS5's `porter` tokenizer
runs) for words; numbers and mixed words stemmed too; no stopwords (FTS5 has none). The text
is tokenised in Python first (`memory.pgstore.tokens`, as FTS5's `unicode61` does), so the
parser only ever sees plain words separated by spaces.
"""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from ctxbudget.memory.pg import Migration

_WORD = re.compile(r"\w+", re.UNICODE)


def words_of(text: str) -> set[str]:
    """The distinct lower-cased words of `text`, as counted in the `words` table."""
    return set(_WORD.findall(text.lower()))


@dataclass(frozen=True)
class Step(Migration):
    """A memory schema step; on SQLite, `then` runs after the statements (counting words
    needs Python's tokenizer)."""

    then: Callable[[sqlite3.Connection], None] | None = None


def _count_every_word(conn: sqlite3.Connection) -> None:
    counts: Counter[tuple[str, str]] = Counter()
    for owner, text in conn.execute("SELECT owner, text FROM memories"):
        counts.update((owner, w) for w in words_of(text))
    conn.executemany(
        "INSERT INTO words (owner, word, n) VALUES (?, ?, ?)",
        ((owner, word, n) for (owner, word), n in counts.items()),
    )


_V1 = """
CREATE TABLE memories (
    id INTEGER PRIMARY KEY,
    owner TEXT NOT NULL,
    text TEXT NOT NULL,
    category TEXT NOT NULL,
    source TEXT NOT NULL CHECK (source IN ('user_explicit', 'inferred')),
    scope TEXT NOT NULL,
    created REAL NOT NULL,
    last_accessed REAL NOT NULL,
    access_count INTEGER NOT NULL DEFAULT 0);
CREATE INDEX memories_owner_lru ON memories (owner, last_accessed, id);
CREATE VIRTUAL TABLE memories_fts USING fts5(
    text, content='memories', content_rowid='id', tokenize='porter unicode61');
CREATE TRIGGER memories_ai AFTER INSERT ON memories BEGIN
    INSERT INTO memories_fts (rowid, text) VALUES (new.id, new.text); END;
CREATE TRIGGER memories_ad AFTER DELETE ON memories BEGIN
    INSERT INTO memories_fts (memories_fts, rowid, text) VALUES ('delete', old.id, old.text); END
"""
# User turns whose recall was already counted: a tool loop sends one turn many times.
_V2 = "CREATE TABLE turns (owner TEXT NOT NULL, key TEXT NOT NULL, at REAL NOT NULL,"
_V2 += " PRIMARY KEY (owner, key))"
# The budget monitor: one usage record per recall, and agents whose next request is bumped one
# complexity tier (memory/monitor.py).
_V3 = """
CREATE TABLE usage (id INTEGER PRIMARY KEY, ts REAL NOT NULL, owner TEXT NOT NULL,
    agent TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX usage_ts ON usage (ts);
CREATE TABLE bumps (owner TEXT NOT NULL, agent TEXT NOT NULL, PRIMARY KEY (owner, agent))
"""
# Counting an owner's memories on every insert was O(n): keep the count by trigger. Search
# filtered owners after joining every match; with the owner in the index, FTS5 ranks only the
# owner's matches.
_V4 = """
CREATE TABLE owner_counts (owner TEXT PRIMARY KEY, n INTEGER NOT NULL);
INSERT INTO owner_counts (owner, n) SELECT owner, count(*) FROM memories GROUP BY owner;
DROP TRIGGER memories_ai;
DROP TRIGGER memories_ad;
DROP TABLE memories_fts;
CREATE VIRTUAL TABLE memories_fts USING fts5(
    text, owner, content='memories', content_rowid='id', tokenize='porter unicode61');
INSERT INTO memories_fts (memories_fts) VALUES ('rebuild');
CREATE TRIGGER memories_ai AFTER INSERT ON memories BEGIN
    INSERT INTO memories_fts (rowid, text, owner) VALUES (new.id, new.text, new.owner);
    INSERT INTO owner_counts (owner, n) VALUES (new.owner, 1)
        ON CONFLICT (owner) DO UPDATE SET n = n + 1; END;
CREATE TRIGGER memories_ad AFTER DELETE ON memories BEGIN
    INSERT INTO memories_fts (memories_fts, rowid, text, owner)
        VALUES ('delete', old.id, old.text, old.owner);
    UPDATE owner_counts SET n = n - 1 WHERE owner = old.owner; END
"""
# How many of an owner's memories contain each word: recall ranks the rarest query words first
# and skips words too common to rank cheaply. FTS5 can count this (fts5vocab) only by reading
# the word's whole posting list, 3 ms for a common word at 100k memories.
_V5 = """
CREATE TABLE words (owner TEXT NOT NULL, word TEXT NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (owner, word)) WITHOUT ROWID
"""
# Memories added in one batch (an import, a POST of a list) share its first id: recall's
# conversation context links neighbours of one batch only (memory/context.py). Older memories
# have none: each stands alone.
_V6 = "ALTER TABLE memories ADD COLUMN batch INTEGER"

# Version 6 as PostgreSQL has it. `length` (words per memory) and `owner_counts.length` give
# BM25 its document lengths; `words.word` compares bytewise, so a prefix is a range.
_PG_BASELINE = """
CREATE TEXT SEARCH DICTIONARY ctxbudget_porter (TEMPLATE = snowball, LANGUAGE = porter);
CREATE TEXT SEARCH CONFIGURATION ctxbudget (COPY = simple);
ALTER TEXT SEARCH CONFIGURATION ctxbudget ALTER MAPPING FOR asciiword, word, numword
    WITH ctxbudget_porter;
CREATE TABLE memories (
    id BIGINT PRIMARY KEY,
    owner TEXT NOT NULL,
    text TEXT NOT NULL,
    category TEXT NOT NULL,
    source TEXT NOT NULL CHECK (source IN ('user_explicit', 'inferred')),
    scope TEXT NOT NULL,
    created DOUBLE PRECISION NOT NULL,
    last_accessed DOUBLE PRECISION NOT NULL,
    access_count BIGINT NOT NULL DEFAULT 0,
    batch BIGINT,
    length INTEGER NOT NULL,
    tsv TSVECTOR NOT NULL);
CREATE INDEX memories_owner_lru ON memories (owner, last_accessed, id);
CREATE INDEX memories_tsv ON memories USING gin (tsv);
CREATE TABLE owner_counts (owner TEXT PRIMARY KEY, n BIGINT NOT NULL,
    length BIGINT NOT NULL DEFAULT 0);
CREATE TABLE words (owner TEXT NOT NULL, word TEXT COLLATE "C" NOT NULL, n BIGINT NOT NULL,
    PRIMARY KEY (owner, word));
CREATE TABLE turns (owner TEXT NOT NULL, key TEXT NOT NULL, at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (owner, key));
CREATE INDEX turns_at ON turns (at);
CREATE TABLE usage (id BIGSERIAL PRIMARY KEY, ts DOUBLE PRECISION NOT NULL,
    owner TEXT NOT NULL, agent TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX usage_ts ON usage (ts);
CREATE TABLE bumps (owner TEXT NOT NULL, agent TEXT NOT NULL, PRIMARY KEY (owner, agent))
"""

# PostgreSQL: an inverted index of its own, as FTS5 keeps one: a row per memory and word with
# the word's count in it and the memory's length, so BM25 is summed from an index range per
# query word instead of each match's heap row and tsvector (~2-4 us a match through the GIN
# index; 15,000 matches at 100k memories). The GIN index had no other use.
_PG_V7 = """
CREATE TABLE postings (owner TEXT NOT NULL, lexeme TEXT COLLATE "C" NOT NULL, id BIGINT NOT NULL,
    tf INTEGER NOT NULL, length INTEGER NOT NULL,
    PRIMARY KEY (owner, lexeme, id) INCLUDE (tf, length));
INSERT INTO postings (owner, lexeme, id, tf, length)
    SELECT m.owner, u.lexeme, m.id, cardinality(u.positions), m.length
    FROM memories m, unnest(m.tsv) u WHERE u.positions IS NOT NULL;
DROP INDEX memories_tsv
"""

MIGRATIONS: Sequence[Step] = (
    Step(1, _V1, None),
    Step(2, _V2, None),
    Step(3, _V3, None),
    Step(4, _V4, None),
    Step(5, _V5, None, then=_count_every_word),
    Step(6, _V6, _PG_BASELINE),
    Step(7, None, _PG_V7),
)
"""Schema version N is reached by running every step up to N; append, never edit."""
VERSION = MIGRATIONS[-1].version


def sqlite_statements(sql: str) -> Iterator[str]:
    """The statements of `sql`, split at the semicolons that end one (not those inside a
    trigger's BEGIN … END).

    >>> list(sqlite_statements("CREATE TABLE t (x); CREATE TRIGGER a AFTER INSERT ON t "
    ...                        "BEGIN DELETE FROM t; DELETE FROM t; END"))  # doctest: +ELLIPSIS
    ['CREATE TABLE t (x);', 'CREATE TRIGGER a ... END;']
    """
    pending = ""
    for piece in sql.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                yield " ".join(pending.split())
            pending = ""
    if pending.strip(" \n;"):
        yield " ".join(pending.split())


def apply_sqlite(conn: sqlite3.Connection, step: Step) -> None:
    """Run one step on a SQLite connection (inside the caller's transaction)."""
    for statement in sqlite_statements(step.sqlite or ""):
        conn.execute(statement)
    if step.then is not None:
        step.then(conn)
