"""PostgreSQL for the stores, the way `memory/sqlite.py` is SQLite: a pool of connections,
statements written once with `?` placeholders for both, and versioned migrations that run once
even when several proxies start at the same time.

Imported only when `database.url` is set (psycopg and its pool are loaded then).

- `PgDatabase.fetchall(sql, args)` / `execute` / `executemany`: one statement each, on a
  pooled connection in autocommit; `?` become psycopg's `%s`; NUMERIC sums come back as int or
  float, as SQLite gives them. `prepare=True` prepares a statement on a connection's first use
  of it (psycopg's default waits for the fifth), for hot statements whose planning costs more
  than their execution.
- `PgDatabase.transaction()`: one connection for the block, committed on exit, rolled back on
  error; `tx.execute(...)` inside it.
- `migrate(db, component, migrations)`: under a transaction-scoped advisory lock, the
  component's version is read from `ctxbudget_schema` and the missing steps run in order.
- Connections run without JIT compilation and with custom plans only (`_configure`).
- A database that is down, or a pool with no free connection within `connect_timeout`, raises
  `DatabaseUnavailable` (the proxy answers 503 on routes that need it). A call that finds no
  idle connection asks the server with a connection of its own first, so while the server
  refuses connections calls fail at once rather than after the pool's timeout (`_take`).
- After a restart of the server, the pool's connections are stale: each one taken from the
  pool is checked first (an empty query), and the first that fails has every idle one checked
  at once (`_pooled`), so the call gets a fresh connection instead of a 503, or fails at once
  when the server is down. A single statement whose connection breaks under it is run once
  more on a fresh one: every single statement here is a read or an idempotent write
  (transactions get the check only; nothing of theirs commits before their end). The pool's
  reconnection gives up after `connect_timeout` and starts again on the next call, so a
  database that comes back is used at once, not after the pool's growing backoff (1, 2, 4 ...
  128 s by default).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar

_PLACEHOLDER = re.compile(r"\?")
_T = TypeVar("_T")
QUICK_SECONDS = 0.05
"""How long a call waits for a pooled connection before asking whether the server is up."""
ANSWER_SECONDS = 1.0
"""How long the answer to that question is reused."""


class DatabaseUnavailable(Exception):
    """The database did not answer (down, unreachable, or every connection busy)."""


def to_pg(sql: str) -> str:
    """A statement written for SQLite's `?` placeholders, in psycopg's `%s` style.

    >>> to_pg("SELECT 100 % 7, x FROM t WHERE a = ? AND b LIKE 'a%'")
    "SELECT 100 %% 7, x FROM t WHERE a = %s AND b LIKE 'a%%'"
    """
    return _PLACEHOLDER.sub("%s", sql.replace("%", "%%"))


def _plain(row: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(
        (int(v) if v == v.to_integral_value() else float(v)) if isinstance(v, Decimal) else v
        for v in row
    )


class PgCursor:
    """What a statement gave: its rows (fetched at once) and how many rows it changed."""

    def __init__(self, rows: list[tuple[Any, ...]], rowcount: int) -> None:
        self._rows = rows
        self.rowcount = rowcount

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._rows

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows[0] if self._rows else None


class PgTx:
    """Statements inside one transaction (`PgDatabase.transaction()`)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(
        self, sql: str, args: Iterable[Any] = (), *, prepare: bool | None = None
    ) -> PgCursor:
        cur = self.conn.execute(to_pg(sql), tuple(args), prepare=prepare)
        rows = [_plain(r) for r in cur.fetchall()] if cur.description else []
        return PgCursor(rows, cur.rowcount)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(to_pg(sql), [tuple(r) for r in rows])


class PgDatabase:
    """A pool of connections to one PostgreSQL database."""

    dialect = "postgres"

    def __init__(
        self,
        url: str,
        *,
        password: str | None = None,
        pool_size: int = 10,
        connect_timeout: float = 5.0,
        name: str = "ctxbudget",
    ) -> None:
        import psycopg
        from psycopg_pool import ConnectionPool, PoolTimeout

        self.url = url
        self._errors: tuple[type[BaseException], ...] = (psycopg.OperationalError, PoolTimeout)
        self._kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": max(1, round(connect_timeout)),
        }
        if password:
            self._kwargs["password"] = password
        self.pool = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            timeout=connect_timeout,
            kwargs=self._kwargs,
            configure=_configure,
            reconnect_timeout=connect_timeout,
            name=name,
            open=False,
        )
        self.pool.open(wait=False)  # a database that is down must not stop the proxy starting
        self._answered: tuple[float, str | None] = (-ANSWER_SECONDS, None)
        """When `_answers` last asked the server, and the error it gave (None: it answered)."""

    @contextmanager
    def _pooled(self) -> Iterator[Any]:
        """A connection from the pool, checked first (psycopg_pool's `check_connection`: an
        empty query). One that fails it is stale: the server restarted, or is down; every idle
        connection is then checked at once (`pool.check()`) and the call takes a fresh one,
        or fails at once when the server refuses connections (`_answers`).

        Not the pool's own `check=`: its loop waits 1, 2, 4 s between failed checks (the first
        call after a restart waited 5 s for a PoolTimeout with six stale connections), and the
        pool waits its whole timeout for a server that is down (six requests at the start of
        an outage took 2.4 s where a stale connection's error had taken 0.3 s)."""
        from psycopg_pool import ConnectionPool

        conn = self._take()
        try:
            ConnectionPool.check_connection(conn)
        except Exception:
            self.pool.putconn(conn)  # broken: the pool replaces it
            self.pool.check()
            self._answers(fresh=True)
            conn = self.pool.getconn()
        try:
            with conn:
                yield conn
        finally:
            self.pool.putconn(conn)

    def _take(self) -> Any:
        """A connection from the pool: one that is idle at once; else, unless the server
        refuses connections (then `OperationalError` now), the first one freed or made
        within the pool's timeout."""
        from psycopg_pool import PoolTimeout

        try:
            return self.pool.getconn(timeout=min(QUICK_SECONDS, self.pool.timeout))
        except PoolTimeout:
            self._answers()
        return self.pool.getconn()

    def _answers(self, *, fresh: bool = False) -> None:
        """Whether the server takes connections, asked with one of our own (not the pool's,
        which waits its timeout for a server that is down): `OperationalError` when it does
        not. The answer is reused for `ANSWER_SECONDS` unless `fresh`, so a busy pool costs
        at most one such connection a second."""
        import psycopg

        now = time.monotonic()
        if not fresh and now - self._answered[0] < ANSWER_SECONDS:
            if self._answered[1] is not None:
                raise psycopg.OperationalError(self._answered[1])
            return
        try:
            psycopg.connect(self.url, **self._kwargs).close()
        except psycopg.OperationalError as exc:
            self._answered = (now, str(exc))
            raise
        self._answered = (now, None)

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        try:
            with self._pooled() as conn:
                yield conn
        except self._errors as exc:
            raise DatabaseUnavailable(_describe(exc)) from exc

    def _once_more(self, work: Callable[[Any], _T]) -> _T:
        """`work(conn)` on a pooled connection, and once more on a fresh one when the
        connection broke under it (the server restarted after the check). Only for single
        statements, which here are reads or idempotent writes."""
        try:
            with self._pooled() as conn:
                try:
                    return work(conn)
                except self._errors:
                    if not conn.broken:
                        raise
            self.pool.check()  # the other idle connections are as stale
            with self._pooled() as conn:
                return work(conn)
        except self._errors as exc:
            raise DatabaseUnavailable(_describe(exc)) from exc

    def execute(
        self, sql: str, args: Iterable[Any] = (), *, prepare: bool | None = None
    ) -> PgCursor:
        return self._once_more(lambda conn: PgTx(conn).execute(sql, args, prepare=prepare))

    def fetchall(
        self, sql: str, args: Iterable[Any] = (), *, prepare: bool | None = None
    ) -> list[Any]:
        return self.execute(sql, args, prepare=prepare).fetchall()

    def fetchall_planned_once(self, sql: str, args: Iterable[Any] = ()) -> list[Any]:
        """`fetchall` of a prepared statement run with its generic plan: planned once per
        connection (and again after ANALYZE), not on every run.

        For statements whose plan does not depend on their arguments' values (memory search:
        an index range per word, whatever the word), where planning is a large share of the
        time: ~0.5 ms of the ~1.6 ms of a lean recall's search at 100k memories. Every other
        statement keeps custom plans (`_configure`)."""

        def work(conn: Any) -> list[Any]:
            conn.execute("SET plan_cache_mode = force_generic_plan")
            try:
                return PgTx(conn).execute(sql, args, prepare=True).fetchall()
            finally:
                if not conn.broken:
                    conn.execute("SET plan_cache_mode = force_custom_plan")

        return self._once_more(work)

    def peek(self, sql: str, args: Iterable[Any] = ()) -> list[Any] | None:
        """Always None: a database across the network cannot answer without waiting
        (`Database.peek` answers at once), so an event loop leaves the question to a worker
        thread (`fetchall`)."""
        return None

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with self.transaction() as tx:
            tx.executemany(sql, rows)

    @contextmanager
    def transaction(self) -> Iterator[PgTx]:
        with self._connection() as conn, conn.transaction():
            yield PgTx(conn)

    def close(self) -> None:
        self.pool.close()


def _configure(conn: Any) -> None:
    # No JIT: every statement here is short, and a planner's estimate far above the rows
    # read (an index range with bounds known only at run time) compiled ~20 ms of code for a
    # search that then ran in a few. Custom plans, except where a statement asks for its
    # generic plan (`fetchall_planned_once`): the generic plan PostgreSQL chose by itself
    # after five runs made an earlier memory search 3x slower on small stores, and planning
    # most statements here costs well under a millisecond.
    conn.execute("SET jit = off")
    conn.execute("SET plan_cache_mode = force_custom_plan")


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"the database did not answer: {text}"


@dataclass(frozen=True)
class Migration:
    """One schema step: `version` reached, and the statements of each dialect (None: this
    dialect's baseline already has it)."""

    version: int
    sqlite: str | None
    postgres: str | None


def migrate(db: PgDatabase, component: str, migrations: Sequence[Migration]) -> int:
    """Bring `component`'s tables to the last version of `migrations`, once: several proxies
    starting together wait on one advisory lock, and each looks again once holding it.
    Returns the version. A database newer than `migrations` is refused."""
    latest = migrations[-1].version
    with db.transaction() as tx:
        tx.execute("SELECT pg_advisory_xact_lock(hashtext(?))", (f"ctxbudget:{component}",))
        tx.execute(
            "CREATE TABLE IF NOT EXISTS ctxbudget_schema ("
            " component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )
        row = tx.execute(
            "SELECT version FROM ctxbudget_schema WHERE component = ?", (component,)
        ).fetchone()
        current = row[0] if row else 0
        if current > latest:
            raise RuntimeError(
                f"the database's {component} tables are at version {current}, newer than this "
                f"ctxbudget understands ({latest}): upgrade ctxbudget"
            )
        for step in migrations:
            if step.version <= current or step.postgres is None:
                continue
            for statement in step.postgres.split(";"):
                if statement.strip():
                    tx.execute(statement)
        if current < latest:
            tx.execute(
                "INSERT INTO ctxbudget_schema (component, version) VALUES (?, ?) "
                "ON CONFLICT (component) DO UPDATE SET version = excluded.version",
                (component, latest),
            )
    return latest
