from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import pytest

from ctxbudget.memory.sqlite import Database, connect, peek, reader


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    with closing(Database(tmp_path / "t.db")) as db:
        db.execute("CREATE TABLE t (x INTEGER)")
        yield db


def _rows(path: Path) -> list[int]:
    """The rows as another connection (another process) sees them."""
    with closing(Database(path)) as other:
        return [x for (x,) in other.fetchall("SELECT x FROM t ORDER BY x")]


def test_a_file_database_is_in_wal_mode(tmp_path: Path, db: Database) -> None:
    with closing(connect(tmp_path / "new" / "folder" / "c.db")) as conn:  # folder created
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert db.fetchall("PRAGMA journal_mode") == [("wal",)]


def test_a_transaction_rolls_back_on_error_and_commits_on_success(db: Database) -> None:
    with pytest.raises(ValueError, match=re.escape("boom (half done)")):
        with db.transaction() as conn:
            conn.execute("INSERT INTO t VALUES (1)")
            raise ValueError("boom (half done)")
    assert not db.conn.in_transaction and _rows(db.path) == []
    with db.transaction() as conn:
        conn.execute("INSERT INTO t VALUES (2)")
        assert _rows(db.path) == []  # not visible to others before the commit
    assert not db.conn.in_transaction and _rows(db.path) == [2]


def test_a_nested_transaction_joins_the_outer_one(db: Database) -> None:
    with db.transaction():
        with db.transaction() as inner:
            inner.execute("INSERT INTO t VALUES (1)")
        assert db.conn.in_transaction  # the inner exit did not commit
        assert _rows(db.path) == []
    assert _rows(db.path) == [1]
    with pytest.raises(RuntimeError, match=re.escape("outer fails")):
        with db.transaction() as outer:
            outer.execute("INSERT INTO t VALUES (2)")
            with db.transaction() as inner:
                inner.execute("INSERT INTO t VALUES (3)")
            raise RuntimeError("outer fails")
    assert _rows(db.path) == [1]  # the inner write went with the outer rollback


def test_threads_sharing_one_database_never_interleave_transactions(db: Database) -> None:
    def insert(n: int) -> None:
        for i in range(50):
            with db.transaction() as conn:
                conn.execute("INSERT INTO t VALUES (?)", (n * 1000 + i,))

    with ThreadPoolExecutor(8) as pool:  # re-raises "cannot start a transaction within ..."
        list(pool.map(insert, range(8)))
    assert _rows(db.path) == sorted(n * 1000 + i for n in range(8) for i in range(50))


def test_two_databases_on_one_file_lose_no_writes(db: Database) -> None:
    dbs = [db, Database(db.path)]  # as two processes would open it
    dbs[0].execute("CREATE TABLE counter (n INTEGER)")
    dbs[0].execute("INSERT INTO counter VALUES (0)")

    def work(n: int) -> None:
        for i in range(50):
            with dbs[n % 2].transaction() as conn:
                # read-modify-write: a lost update would show in the final count
                (count,) = conn.execute("SELECT n FROM counter").fetchone()
                conn.execute("UPDATE counter SET n = ?", (count + 1,))
                conn.execute("INSERT INTO t VALUES (?)", (n * 1000 + i,))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(work, range(4)))
    assert dbs[1].fetchall("SELECT n FROM counter") == [(200,)]
    assert _rows(db.path) == sorted(n * 1000 + i for n in range(4) for i in range(50))
    dbs[1].close()


def test_an_error_sqlite_already_rolled_back_is_the_one_raised(tmp_path: Path) -> None:
    db = Database(tmp_path / "t.db")
    db.execute("CREATE TABLE t (x)")
    db.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(20_000)])
    with pytest.raises(sqlite3.OperationalError, match="interrupted"):
        with db.transaction() as conn:
            conn.execute("INSERT INTO t VALUES (-1)")
            conn.set_progress_handler(lambda: 1, 1000)  # SQLite interrupts and rolls back
            conn.execute("UPDATE t SET x = x + 1")
    db.conn.set_progress_handler(None, 0)
    assert not db.conn.in_transaction
    assert db.fetchall("SELECT count(*) FROM t WHERE x = -1") == [(0,)]


def test_a_failed_commit_does_not_leave_the_connection_in_a_transaction(tmp_path: Path) -> None:
    db = Database(tmp_path / "t.db")
    db.execute("PRAGMA foreign_keys=ON")
    db.execute("CREATE TABLE p (id INTEGER PRIMARY KEY)")
    db.execute("CREATE TABLE c (p INTEGER REFERENCES p(id) DEFERRABLE INITIALLY DEFERRED)")
    db.execute("CREATE TABLE t (x)")
    with pytest.raises(sqlite3.IntegrityError):
        with db.transaction() as conn:
            conn.execute("INSERT INTO c VALUES (42)")  # fails only at COMMIT
    assert not db.conn.in_transaction
    with db.transaction() as conn:
        conn.execute("INSERT INTO t VALUES (1)")
    other = Database(tmp_path / "t.db")
    assert other.fetchall("SELECT x FROM t") == [(1,)]


def test_peek_says_none_at_once_when_sqlite_cannot_answer(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    db = Database(path)
    db.execute("CREATE TABLE t (x)")
    db.execute("INSERT INTO t VALUES (1)")
    db.close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("INSERT INTO t VALUES (2)")
    try:
        started = time.monotonic()
        assert peek(reader(path), "SELECT x FROM t") is None
        assert time.monotonic() - started < 0.5
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert peek(reader(path), "SELECT x FROM t") == [(1,)]
    assert peek(reader(path), "SELECT nope FROM t") is None
