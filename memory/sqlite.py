"""One way to open SQLite here: WAL, a busy timeout, and transactions that cannot interleave.

The memory store, the budget monitor and the report each keep one connection that the event
loop and worker threads share. SQLite serialises *connections*, not threads using one
connection: two threads that both `BEGIN IMMEDIATE` on it get "cannot start a transaction
within a transaction", and a reader can see a writer's half-done transaction. `Database`
holds a lock for every statement and for the whole of a `transaction()`, so each connection
is used by one thread at a time.

>>> db = Database(Path(":memory:"))
>>> with db.transaction():
...     _ = db.execute("CREATE TABLE t (x)")
...     _ = db.execute("INSERT INTO t VALUES (1)")
>>> db.execute("SELECT x FROM t").fetchall()
[(1,)]
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BUSY_TIMEOUT_MS = 30_000
"""How long a write waits for another process's write lock before it fails."""


def connect(path: Path) -> sqlite3.Connection:
    """A connection to `path` (created with its folder) in WAL mode, usable from any thread.

    Autocommit (`isolation_level=None`): a write outside `transaction()` commits at once.
    """
    if str(path) != ":memory:":
        path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(
        path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
    )
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    return conn


def reader(path: Path) -> sqlite3.Connection:
    """A read-only connection that never waits: `peek` through it from an event loop."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout=0")
    return conn


def peek(conn: sqlite3.Connection, sql: str, args: Iterable[Any] = ()) -> list[Any] | None:
    """The rows of a query on a `reader`, or None if SQLite cannot answer at once (locked,
    busy, missing). In WAL mode readers do not wait for writers, so None is rare."""
    try:
        return conn.execute(sql, tuple(args)).fetchall()
    except sqlite3.Error:
        return None


class Database:
    """One connection, used by one thread at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = connect(path)
        self.lock = threading.RLock()
        self._reader: sqlite3.Connection | None = None

    def execute(self, sql: str, args: Iterable[Any] = ()) -> sqlite3.Cursor:
        """Run one statement. Fetch from the cursor before another thread can run one."""
        with self.lock:
            return self.conn.execute(sql, tuple(args))

    def fetchall(
        self, sql: str, args: Iterable[Any] = (), *, prepare: bool | None = None
    ) -> list[Any]:
        """Run one query and return its rows (under the lock, so safe from any thread).

        `prepare` is `PgDatabase.fetchall`'s: sqlite3 keeps every statement prepared.
        """
        with self.lock:
            return self.conn.execute(sql, tuple(args)).fetchall()

    def peek(self, sql: str, args: Iterable[Any] = ()) -> list[Any] | None:
        """The rows of a query, from one thread only (an event loop), never waiting: None
        when SQLite is busy.

        Through a connection of its own, read-only and with no busy timeout (`reader`): it
        shares no lock with the threads that write, and a WAL reader does not wait for
        writers (~0.1 ms).
        """
        if self._reader is None:
            try:
                self._reader = reader(self.path)
            except sqlite3.Error:
                return None
        return peek(self._reader, sql, args)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> sqlite3.Cursor:
        with self.lock:
            return self.conn.executemany(sql, rows)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (`BEGIN IMMEDIATE`): committed on exit, rolled back on error.

        Other threads of this process wait for it; other processes wait up to the busy
        timeout for SQLite's write lock. Nested calls from the same thread join the outer one.
        """
        with self.lock:
            if self.conn.in_transaction:
                yield self.conn
                return
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
                self.conn.execute("COMMIT")
            except BaseException:
                # SQLite may have rolled back already (interrupted, disk full, I/O error):
                # a second ROLLBACK would raise and hide the real error. A failed COMMIT
                # leaves the transaction open: end it, or every later one would join it.
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self.lock:
            self.conn.close()
        if self._reader is not None:
            self._reader.close()
