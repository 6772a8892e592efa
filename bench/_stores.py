"""A fresh memory store for a bench: a SQLite file, or (`--database-url`) PostgreSQL.

On PostgreSQL each store gets a schema of its own (`bench_<name>_<random>`, found through
the connection's `search_path`), dropped by `close`, so a bench never touches other tables of
the database it is pointed at.
"""

from __future__ import annotations

import re
import secrets
import sys
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ctxbudget.memory import MemoryLimits, SQLiteMemoryStore  # noqa: E402
from ctxbudget.memory.pg import PgDatabase  # noqa: E402
from ctxbudget.memory.pgstore import PgMemoryStore  # noqa: E402

Store = SQLiteMemoryStore | PgMemoryStore


def open_store(folder: Path, name: str, limits: MemoryLimits, database_url: str | None) -> Store:
    """A new, empty store named `name`."""
    if database_url is None:
        return SQLiteMemoryStore(folder / f"{name}.db", limits=limits)
    schema = re.sub(r"\W", "_", f"bench_{name}_{secrets.token_hex(3)}").lower()
    admin = PgDatabase(database_url, pool_size=1)
    admin.execute(f"CREATE SCHEMA {schema}")
    admin.close()
    sep = "&" if "?" in database_url else "?"
    url = f"{database_url}{sep}options={quote(f'-c search_path={schema}')}"
    store = PgMemoryStore(PgDatabase(url, pool_size=2), limits=limits)
    store.bench_schema = schema  # type: ignore[attr-defined]
    store.bench_admin_url = database_url  # type: ignore[attr-defined]
    return store


def close_store(store: Store) -> None:
    """Close `store`; on PostgreSQL, drop its schema."""
    store.close()
    schema = getattr(store, "bench_schema", None)
    if schema is not None:
        admin = PgDatabase(store.bench_admin_url, pool_size=1)  # type: ignore[attr-defined]
        admin.execute(f"DROP SCHEMA {schema} CASCADE")
        admin.close()


def settle(store: Store) -> None:
    """After an import, on PostgreSQL: VACUUM ANALYZE, as autovacuum does within a minute of
    one, so a bench times what a running proxy gets (hint bits set, the planner's statistics
    known), not a table nothing has read yet (recall at 100k measured 2-3x slower without)."""
    if isinstance(store, PgMemoryStore):
        store.db.execute("VACUUM ANALYZE")


def size_mb(store: Store, folder: Path, name: str) -> float:
    """The store's size on disk, in MB (on PostgreSQL: its schema's tables and indexes)."""
    if isinstance(store, SQLiteMemoryStore):
        return sum(p.stat().st_size for p in folder.glob(f"{name}.db*")) / 1e6
    rows = store.db.fetchall(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = current_schema() AND c.relkind = 'r'"
    )
    return float(rows[0][0]) / 1e6
