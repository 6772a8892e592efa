"""`memory/pg.py` against a real server: what a restart or an outage of PostgreSQL costs the
pool's callers (issue 24, item 6). Each test that stops the server runs a cluster of its own,
so the session's shared cluster is never disturbed."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from ctxbudget.memory.pg import DatabaseUnavailable, PgDatabase
from tests.pg import Cluster, postgres_cluster

# each test starts, stops and restarts a PostgreSQL server of its own: with the real servers
pytestmark = pytest.mark.e2e


@pytest.fixture
def own_cluster() -> Iterator[Cluster]:
    with postgres_cluster() as cluster:
        yield cluster


def _fill(db: PgDatabase, n: int) -> None:
    """`n` connections in the pool (each held at once for a moment)."""
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(lambda _: db.execute("SELECT pg_sleep(0.2)"), range(n)))


def test_after_a_restart_the_first_calls_get_fresh_connections(own_cluster: Cluster) -> None:
    """Every pooled connection is stale after a restart: the pool checks what it hands out,
    and the first stale one has all of them checked, so no call fails and none waits."""
    db = PgDatabase(own_cluster.new_database(), pool_size=6, connect_timeout=5)
    try:
        _fill(db, 6)
        own_cluster.stop()
        own_cluster.start()
        started = time.monotonic()
        for _ in range(5):
            assert db.fetchall("SELECT 1") == [(1,)]
        with db.transaction() as tx:
            assert tx.execute("SELECT 2").fetchall() == [(2,)]
        assert time.monotonic() - started < 2.5, "no check loop's backoff (1 s, 2 s, ...)"
    finally:
        db.close()


def test_a_statement_whose_connection_breaks_under_it_runs_once_more(pg_url: str) -> None:
    db = PgDatabase(pg_url, pool_size=2)
    try:
        db.execute("CREATE SEQUENCE once")
        # the first run ends its own connection (as a server restart would, after the check)
        kill_once = (
            "SELECT CASE WHEN nextval('once') = 1 THEN pg_terminate_backend(pg_backend_pid())"
            " ELSE true END"
        )
        assert db.fetchall(kill_once) == [(True,)]
        assert db.fetchall("SELECT last_value FROM once") == [(2,)]
    finally:
        db.close()


def test_a_database_back_after_a_long_outage_answers_the_next_call(own_cluster: Cluster) -> None:
    """The pool's reconnection backs off 1, 2, 4, 8 ... s while the server is down; once it is
    back, the next call must not wait for the end of such a pause."""
    db = PgDatabase(own_cluster.new_database(), pool_size=2, connect_timeout=1)
    try:
        assert db.fetchall("SELECT 1") == [(1,)]
        own_cluster.stop()
        down = time.monotonic()
        while time.monotonic() - down < 10:  # callers keep asking, as the proxy's do
            with pytest.raises(DatabaseUnavailable):
                db.fetchall("SELECT 1")
        own_cluster.start()
        started = time.monotonic()
        while True:
            try:
                assert db.fetchall("SELECT 1") == [(1,)]
                break
            except DatabaseUnavailable:
                assert time.monotonic() - started < 20
        assert time.monotonic() - started < 2.5, "answered at the next call, not the pool's"
    finally:
        db.close()


def test_calls_on_stale_connections_fail_at_once_when_the_server_is_down(
    own_cluster: Cluster,
) -> None:
    """A stale connection may mean a restart (take a fresh one) or an outage: a connection of
    our own tells which, so at the start of an outage the calls fail now, not after the pool's
    timeout (the memory stage then skips memories at once)."""
    db = PgDatabase(own_cluster.new_database(), pool_size=6, connect_timeout=5)
    try:
        _fill(db, 6)
        own_cluster.stop()

        def call(_: int) -> float:
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable):
                db.fetchall("SELECT 1")
            return time.monotonic() - started

        with ThreadPoolExecutor(6) as pool:
            took = list(pool.map(call, range(6)))
        assert max(took) < 2, f"not the pool's 5 s timeout: {took}"
    finally:
        db.close()


def test_a_server_that_refuses_connections_fails_calls_at_once() -> None:
    """No pooled connection and a server that is down: the call says so now, not after the
    pool's timeout (5 s here); the memory routes and the report answer 503 at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    db = PgDatabase(f"postgresql://postgres@127.0.0.1:{port}/none", connect_timeout=5)
    try:
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable, match="Connection refused"):
                db.fetchall("SELECT 1")
            with pytest.raises(DatabaseUnavailable):
                with db.transaction():
                    pass
            assert time.monotonic() - started < 1
    finally:
        db.close()
