"""Pruning's decisions, kept where every worker and instance finds them: the report's database.

A pruned tool result must go out as the same bytes on every later request of its
conversation, whichever worker or instance serves it (`docs/pruning.md`). Each decision is a
row of `pruned` (owner, conversation, call id, digest of the result it was taken for → the
text that stands for that result), and the first writer wins: two workers that prune at once
keep one text. The digest binds a decision to its result (`caps.prune.digest`): a call id
alone does not name one (local models number their calls `call_0`, … in every conversation).
Rows from before schema 8 have none (`''`): no result has that digest, so they are never
applied (`docs/pruning.md`, "Upgrading").

On SQLite, `decisions` reads through a read-only connection that never waits (it is asked on
the event loop, on the requests that have a prunable result); on PostgreSQL it is a query to
ask from a thread. Either way a worker keeps what it read for `FRESH_SECONDS`, so a burst of
tool-loop requests asks once.

What this process read or decided is held in memory (`Held`: per owner and conversation,
bounded), so a database that stops answering changes no byte of a result already pruned:
the stage applies what is held, takes no new prune, and a breaker (`proxy/breaker.py`) skips
the database at once until a background check sees it again.

The texts are the client's (a result's head and tail, its call id) and may hold what neither
database's text takes (a lone surrogate, from JSON's `\\ud800`; a NUL, which PostgreSQL
refuses): they are stored escaped and read back as they were (`stored`, `loaded`), so every
worker sends the same bytes. Each owner keeps its newest `KEEP_DECISIONS` decisions and as
many summaries, as the report keeps each owner's newest requests.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeAlias

from ctxbudget.memory.pg import DatabaseUnavailable, PgDatabase
from ctxbudget.memory.sqlite import Database, peek, reader
from ctxbudget.proxy.breaker import Breaker
from ctxbudget.proxy.report.record import storable

log = logging.getLogger("ctxbudget.prune")

Decisions: TypeAlias = dict[tuple[str, str], str]
"""A conversation's decisions: (call id, digest of the result it was taken for) → the text
that stands for that result."""

FRESH_SECONDS = 1.0
"""How long a worker trusts what it read of a conversation's decisions. Another instance's
prune shows here within this long; a request of that conversation in between goes out
without it once (a cache bust), which the report shows."""
KEEP_DECISIONS = 4000
"""Decisions (rows of `pruned`) kept per owner, and summaries as many; past it the owner's
oldest go (a conversation that old sends its result whole again, once: a cache bust). One
key's flood never pushes out another key's (issue 35: 8,002 rows and 25 MB of tool text from
one key in minutes)."""
CHECK_SECONDS = 1.0
"""While the database does not answer, how often a background check asks it again."""
HELD_PER_OWNER = 1024
"""Conversations whose decisions each owner has held in memory, at most."""
HELD_CHARS = 32 << 20
"""Chars of decision texts held in memory in all, at most; past it the owner holding the most
gives up its least recent conversation."""

_ESCAPED = "\ufdd0"
"""Starts a text stored escaped (`stored`): a noncharacter, which no tool output is meant to
hold; a text that starts with it is escaped too, so reading back is never ambiguous."""
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def stored(text: str) -> str:
    """`text` as both databases' text takes it, and `loaded` gives back unchanged: one with a
    NUL or a lone surrogate is written as its JSON string (ASCII: `\\u0000`, `\\ud800`) after
    `_ESCAPED`; any other as it is.

    >>> stored("ok"), stored("bin \\x00")
    ('ok', '\\ufdd0"bin \\\\u0000"')
    >>> loaded(stored("a\\ud800")) == "a\\ud800"
    True
    """
    if text.isascii() and "\x00" not in text:
        return text  # the common case, without a regex
    if _UNSTORABLE.search(text) is None and not text.startswith(_ESCAPED):
        return text
    return _ESCAPED + json.dumps(text)


def loaded(text: str) -> str:
    """A text `stored` wrote, as it was."""
    if text.startswith(_ESCAPED):
        found: str = json.loads(text[1:])
        return found
    return text


class Held:
    """Each owner's conversations' decisions as this process read or took them, the newest
    `per_owner` conversations of each owner, `chars` of texts in all (past it the owner
    holding the most gives way: one key's flood evicts only its own, as the sessions do,
    `proxy/cache/sessions.py`). Not thread-safe: the ledger's lock guards it."""

    def __init__(self, *, per_owner: int = HELD_PER_OWNER, chars: int = HELD_CHARS) -> None:
        self._owners: dict[str, OrderedDict[str, tuple[float, Decisions, int]]] = {}
        self._weights: dict[str, int] = {}
        self._per_owner = per_owner
        self._chars = chars
        self._total = 0

    def get(self, owner: str, conversation: str) -> tuple[float, Decisions] | None:
        """When `conversation`'s decisions were read, and them; None when not held."""
        conversations = self._owners.get(owner)
        found = None if conversations is None else conversations.get(conversation)
        return None if found is None else (found[0], found[1])

    def put(self, owner: str, conversation: str, at: float, decisions: Decisions) -> None:
        conversations = self._owners.setdefault(owner, OrderedDict())
        old = conversations.pop(conversation, None)
        if old is not None:
            self._weigh(owner, -old[2])
        weight = sum(len(c) + len(d) + len(v) for (c, d), v in decisions.items()) + 64
        conversations[conversation] = (at, decisions, weight)
        self._weigh(owner, weight)
        if len(conversations) > self._per_owner:
            self._evict(owner)
        while self._total > self._chars and self._owners:
            self._evict(max(self._weights, key=self._weights.__getitem__))

    def _weigh(self, owner: str, weight: int) -> None:
        self._weights[owner] = self._weights.get(owner, 0) + weight
        self._total += weight

    def _evict(self, owner: str) -> None:
        conversations = self._owners[owner]
        _, (_, _, weight) = conversations.popitem(last=False)
        self._weigh(owner, -weight)
        if not conversations:
            del self._owners[owner], self._weights[owner]


class PruneLedger:
    """The decisions of every conversation, read and written through one database."""

    def __init__(
        self,
        db: Database | PgDatabase,
        *,
        clock: Callable[[], float] = time.monotonic,
        keep: int = KEEP_DECISIONS,
    ) -> None:
        self._db = db
        self._reader = reader(db.path) if isinstance(db, Database) and _on_disk(db.path) else None
        self._clock = clock
        self._keep = keep
        self._held = Held()
        self._lock = threading.Lock()
        self._unwritten: dict[tuple[str, str], tuple[Decisions, float]] = {}
        """Decisions taken while the database stopped answering under the write (the request
        went out pruned): held, and written when it answers again. At most
        `HELD_PER_OWNER` conversations an owner."""
        self.breaker = Breaker(self._check, every=CHECK_SECONDS, recovered=self._recovered)
        """Open while the database does not answer: the prune stage then applies what is
        held, at once, and prunes nothing new."""
        self._outage = 0

    @property
    def waits(self) -> bool:
        """Whether reading may wait (PostgreSQL, or SQLite in memory): ask from a thread."""
        return self._reader is None

    @property
    def down(self) -> bool:
        """Whether the database did not answer lately (the breaker is open): then a request
        with prunable results goes on with the decisions held, and is counted for the log
        line at recovery."""
        if self.breaker.down:
            self._outage += 1
            return True
        return False

    def failed(self, exc: DatabaseUnavailable) -> None:
        """The database did not answer a request's read or write: trip the breaker (logged
        once)."""
        self._outage += 1
        if self.breaker.trip():
            log.warning(
                "pruning's database: %s; the decisions this process holds are applied and no "
                "new prune is taken until a background check sees it again (every %.0f s)",
                exc,
                CHECK_SECONDS,
            )

    def known(self, owner: str, conversation: str) -> Decisions | None:
        """What this worker read of the conversation lately, or None."""
        with self._lock:
            found = self._held.get(owner, conversation)
        if found is None or self._clock() - found[0] > FRESH_SECONDS:
            return None
        return found[1]

    def held(self, owner: str, conversation: str) -> Decisions:
        """What this process read or decided of the conversation, however long ago (the
        database does not answer): empty when it holds nothing."""
        with self._lock:
            found = self._held.get(owner, conversation)
        return {} if found is None else found[1]

    def decisions(self, owner: str, conversation: str) -> Decisions:
        """The conversation's decisions (from a thread when `waits`)."""
        found = self.known(owner, conversation)
        if found is not None:
            return found
        args = (owner, stored(conversation))
        rows = peek(self._reader, _READ, args) if self._reader else None
        if rows is None:
            rows = self._db.fetchall(_READ, args)
        found = _decisions(rows)
        self._remember(owner, conversation, found)
        return found

    def last_seen(self, owner: str, session: str) -> float | None:
        """When the report last saw a request of `session`, from any worker or instance (its
        writer lags by a batch, ~50 ms); None when it has none (from a thread when `waits`)."""
        sql = "SELECT last FROM sessions WHERE owner = ? AND id = ?"
        args = (owner, storable(session))  # as the report files it
        rows = peek(self._reader, sql, args) if self._reader else None
        if rows is None:
            rows = self._db.fetchall(sql, args)
        return float(rows[0][0]) if rows else None

    def pruned_at(self, owner: str, conversation: str) -> float | None:
        """When the conversation's newest decision was taken, by any worker or instance:
        a request of its session then, written at once where the report's writer lags
        (from a thread when `waits`); None when it has none."""
        sql = "SELECT max(at) FROM pruned WHERE owner = ? AND conversation = ?"
        args = (owner, stored(conversation))
        rows = peek(self._reader, sql, args) if self._reader else None
        if rows is None:
            rows = self._db.fetchall(sql, args)
        return float(rows[0][0]) if rows and rows[0][0] is not None else None

    def add(
        self, owner: str, conversation: str, decided: Mapping[tuple[str, str], str], *, at: float
    ) -> Decisions:
        """Keep `decided` (as `Decisions`) unless another writer decided first; return the
        conversation's decisions as they stand (a thread: this writes). The owner's oldest
        past `KEEP_DECISIONS` go. A database that does not answer: `DatabaseUnavailable`,
        and `decided` is held, to apply and to write once it answers again."""
        try:
            found = self._write(owner, conversation, decided, at)
        except DatabaseUnavailable:
            key = (owner, conversation)
            with self._lock:
                found = {**self._held_now(owner, conversation), **decided}
                self._held.put(owner, conversation, self._clock(), found)
                # per owner: one key's flood of conversations must not crowd out another's
                if key in self._unwritten or self._unwritten_of(owner) < HELD_PER_OWNER:
                    earlier = self._unwritten.get(key, ({}, at))[0]
                    self._unwritten[key] = ({**earlier, **decided}, at)
            raise
        self._remember(owner, conversation, found)
        return found

    def _write(
        self, owner: str, conversation: str, decided: Mapping[tuple[str, str], str], at: float
    ) -> Decisions:
        key = stored(conversation)
        rows = [
            (owner, key, stored(call_id), digest, stored(text), at)
            for (call_id, digest), text in decided.items()
        ]
        insert = (
            "INSERT INTO pruned (owner, conversation, call_id, digest, text, at) "
            "VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (owner, conversation, call_id, digest) DO NOTHING"
        )
        with self._db.transaction() as tx:
            tx.executemany(insert, rows)
            tx.execute(_trim("pruned"), (owner, owner, self._keep - 1))
            return _decisions(tx.execute(_READ, (owner, key)).fetchall())

    def summaries(self, owner: str, conversation: str) -> dict[str, str]:
        """Call id → summary of the conversation's summarised results (from a thread when
        `waits`)."""
        sql = "SELECT call_id, text FROM summaries WHERE owner = ? AND conversation = ?"
        args = (owner, stored(conversation))
        rows = peek(self._reader, sql, args) if self._reader else None
        if rows is None:
            rows = self._db.fetchall(sql, args)
        return {loaded(call_id): loaded(text) for call_id, text in rows}

    def add_summary(
        self, owner: str, conversation: str, call_id: str, text: str, *, at: float
    ) -> None:
        """Keep a result's summary (the first one written stands; from a thread); the
        owner's oldest past `KEEP_DECISIONS` go."""
        with self._db.transaction() as tx:
            tx.execute(
                "INSERT INTO summaries (owner, conversation, call_id, text, at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (owner, conversation, call_id) DO NOTHING",
                (owner, stored(conversation), stored(call_id), stored(text), at),
            )
            tx.execute(_trim("summaries"), (owner, owner, self._keep - 1))

    def close(self) -> None:
        self.breaker.close()
        if self._reader is not None:
            self._reader.close()

    def _remember(self, owner: str, conversation: str, found: Decisions) -> None:
        with self._lock:
            self._held.put(owner, conversation, self._clock(), found)

    def _unwritten_of(self, owner: str) -> int:
        """The owner's conversations in `_unwritten` (only while the database is down)."""
        return sum(1 for held_owner, _ in self._unwritten if held_owner == owner)

    def _held_now(self, owner: str, conversation: str) -> Decisions:
        found = self._held.get(owner, conversation)
        return {} if found is None else found[1]

    def _check(self) -> None:
        """The breaker's background check: the database answers, and takes what was decided
        while it did not."""
        self._db.fetchall("SELECT 1")
        with self._lock:
            waiting, self._unwritten = self._unwritten, {}
        for (owner, conversation), (decided, at) in waiting.items():
            try:
                self._remember(owner, conversation, self._write(owner, conversation, decided, at))
            except DatabaseUnavailable:
                with self._lock:  # down again: kept for the next check
                    self._unwritten.setdefault((owner, conversation), (decided, at))
                raise
            except Exception:  # one conversation's rows must not keep the breaker open
                log.exception("could not write the decisions held for a conversation")

    def _recovered(self, seconds: float) -> None:
        log.warning(
            "pruning's database answers again after %.1f s: %d request(s) with prunable "
            "results went on meanwhile with the decisions held, and no new prune",
            seconds,
            self._outage,
        )
        self._outage = 0


_READ = (
    "SELECT call_id, digest, text FROM pruned WHERE owner = ? AND conversation = ? AND digest <> ''"
)
"""A conversation's decisions; rows from before schema 8 (no digest) are never read."""


def _decisions(rows: list[Any]) -> Decisions:
    return {(loaded(call_id), digest): loaded(text) for call_id, digest, text in rows}


def _trim(table: str) -> str:
    """Deletes an owner's rows of `table` older than its `?`+1-th newest (as the report trims
    each owner's requests: rows decided together share a time, and stay or go together)."""
    return (
        f"DELETE FROM {table} WHERE owner = ? AND at < (SELECT at FROM {table}"
        " WHERE owner = ? ORDER BY at DESC LIMIT 1 OFFSET ?)"
    )


def _on_disk(path: Path) -> bool:
    return str(path) != ":memory:"
