"""The report store: what every proxied request clamped and saved, in one SQLite file.

Every worker of a multi-worker server writes to the same file, so the report reflects all of
them. Writes happen on a background thread, batched, so the request path only enqueues a
record; token counting (tiktoken) happens there too. Readers in the same process call
`flush()` first so they see their own latest requests.

Totals are kept per hour (and owner, and kind), so the report covers every instance and
restart that used the file, over any window (`?since=`, `--since`), to the hour; requests and
hours older than `report.keepDays` are pruned. `runs` records each `ctxbudget serve` start.

Sinks (OpenTelemetry in `proxy/report/telemetry.py`, Prometheus in `proxy/report/metrics.py`)
get each record with its JSON entry on the same thread, so the request path pays for none of them.

One record never costs another theirs: client strings are made storable (`report_entry`), a batch
the database refuses is written again one record at a time (only the bad one is lost), and
while the database does not answer, records wait in memory (`PENDING_BYTES`) and are written
when it answers again; what is dropped is counted per owner (`lost`).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from ctxbudget.caps import SEGMENT_KINDS
from ctxbudget.caps.types import evolve
from ctxbudget.memory.pg import DatabaseUnavailable, Migration, PgDatabase, migrate
from ctxbudget.memory.sqlite import Database, connect
from ctxbudget.proxy.report import arms as holdout_arms
from ctxbudget.proxy.report.arms import Arms
from ctxbudget.proxy.report.ledger import KEEP_DECISIONS, PruneLedger
from ctxbudget.proxy.report.record import (
    RequestRecord,
    entry_and_text,
    loads_entry,
    storable,
    storable_record,
    tally_of,
)
from ctxbudget.proxy.report.summary import HOUR, read_summary, with_chunks
from ctxbudget.proxy.report.tally import Tally
from ctxbudget.proxy.tokens import TokenCounter, trim_memory

log = logging.getLogger("ctxbudget.report")

SCHEMA_VERSION = 10
"""8: pruning decisions keyed by their result's digest too; 9: the holdout's arms (`arms.py`);
10: a request's segments in chunks shared by its conversation's later requests (`_SCHEMA_10`)."""
IDLE_SECONDS = 2.0
"""After this long without requests, the writer returns freed memory to the OS."""
KEEP_REQUESTS = 2000
"""Request rows kept per owner for `/context/budget/requests/{id}`; older ones are pruned."""
KEEP_CONVERSATIONS = 20_000
"""Session rows and holdout conversation rows (`arms`) kept per owner, the newest; older ones
are pruned (a key that names a new session on every request grew both without end, within
`keepDays`); arms by when they were drawn. A conversation pruned and seen again draws the same
arm (`arms.draw`)."""
RETRY_SECONDS = 1.0
"""While the database does not answer, the records kept are tried again this often."""
PENDING_BYTES = 64 * 1024 * 1024
"""Records kept while the database does not answer, at most (their JSON text: 5.4 KB for a
request with 20 clamped tool results, so ~12,000 such requests); past it the oldest are
dropped and counted as lost."""
CHUNKS_KNOWN_SECONDS = 60.0
"""How long a writer trusts that a chunk it wrote is still stored (`ReportStore._chunks`):
a chunk is pruned once no kept request names it, which another worker's prune may find
between two requests of a conversation; after this long the next request that names it
writes it again (`ON CONFLICT DO NOTHING`: a chunk still there costs no page)."""
KEEP_DAYS = 90.0
"""Default of `report.keepDays`: requests and hourly totals older than this are pruned."""
_SUMS = (
    "seen, clamped, would_clamp, chars_before, chars_after, saved_chars, saved_tokens,"
    " would_save_chars, would_save_tokens, saved_usd, would_save_usd"
)
_COUNTS = "requests, clamp_errors, upstream_errors, unpriced"
SUMMARY_COUNTS = (
    "summaries",
    "summaries_failed",
    "summaries_priced",
    "summaries_input",
    "summaries_output",
    "summaries_usd",
)
"""Per hour and owner (schema 7): the summaries ctxbudget asked for the owner's results
(`contextPruning.summarize`), those that failed, those priced, their tokens and their cost."""


def _columns(names: str) -> list[str]:
    return [c.strip() for c in names.split(",")]


_SESSION_SUMS_5 = (
    "requests", "billed", "priced", "input", "cache_read", "cache_write", "output",
    "without_input", "without_cache_read", "without_cache_write", "cost_usd", "without_usd",
    "saved_tokens", "memory_tokens", "busts_client", "busts_ctxbudget",
)  # fmt: skip
SESSION_SUMS = (*_SESSION_SUMS_5, "prunes", "busts_planned")
"""Per-session sums: requests, those with usage (`billed`) and with a price (`priced`), the
provider's usage, the usage without ctxbudget, money both ways, clamp savings, memory tokens,
cache busts by the client and by ctxbudget, results pruned and the busts pruning planned
(a prune in a warm session: `pays`)."""
_SESSION_ADDS = (*SESSION_SUMS, "tools_inline_requests")
"""The per-session columns summed request by request (`SESSION_SUMS`, and since schema 6 the
requests that sent MCP tools inline)."""
_REAL = ("cost_usd", "without_usd")
_SESSION_SUMS_DDL = ", ".join(
    f"{c} {'REAL' if c in _REAL else 'INTEGER'} NOT NULL DEFAULT 0" for c in _SESSION_SUMS_5
)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run TEXT PRIMARY KEY,
    started REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS totals (
    run TEXT NOT NULL,
    kind TEXT NOT NULL,
    seen INTEGER NOT NULL DEFAULT 0,
    clamped INTEGER NOT NULL DEFAULT 0,
    would_clamp INTEGER NOT NULL DEFAULT 0,
    chars_before INTEGER NOT NULL DEFAULT 0,
    chars_after INTEGER NOT NULL DEFAULT 0,
    saved_chars INTEGER NOT NULL DEFAULT 0,
    saved_tokens INTEGER NOT NULL DEFAULT 0,
    would_save_chars INTEGER NOT NULL DEFAULT 0,
    would_save_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run, kind)
);
CREATE TABLE IF NOT EXISTS run_counts (
    run TEXT PRIMARY KEY,
    requests INTEGER NOT NULL DEFAULT 0,
    clamp_errors INTEGER NOT NULL DEFAULT 0,
    upstream_errors INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS requests (
    id TEXT PRIMARY KEY,
    run TEXT NOT NULL,
    ts REAL NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS requests_ts ON requests (run, ts);
"""
# Schema N+1 from N (the fresh schema above is version 1, then these run in order).
_UPGRADES = (
    # 2: money saved, from litellm's input prices; requests whose model has no price.
    "ALTER TABLE totals ADD COLUMN saved_usd REAL NOT NULL DEFAULT 0;"
    "ALTER TABLE totals ADD COLUMN would_save_usd REAL NOT NULL DEFAULT 0;"
    "ALTER TABLE run_counts ADD COLUMN unpriced INTEGER NOT NULL DEFAULT 0",
    # 3: an owner per request, total and count, so each proxy key sees only its own report.
    # Rows from before belong to `default`, which no key holder sees (the admin sees all).
    "ALTER TABLE totals RENAME TO totals_v2;"
    "CREATE TABLE totals (run TEXT NOT NULL, owner TEXT NOT NULL, kind TEXT NOT NULL,"
    " seen INTEGER NOT NULL DEFAULT 0, clamped INTEGER NOT NULL DEFAULT 0,"
    " would_clamp INTEGER NOT NULL DEFAULT 0, chars_before INTEGER NOT NULL DEFAULT 0,"
    " chars_after INTEGER NOT NULL DEFAULT 0, saved_chars INTEGER NOT NULL DEFAULT 0,"
    " saved_tokens INTEGER NOT NULL DEFAULT 0, would_save_chars INTEGER NOT NULL DEFAULT 0,"
    " would_save_tokens INTEGER NOT NULL DEFAULT 0, saved_usd REAL NOT NULL DEFAULT 0,"
    " would_save_usd REAL NOT NULL DEFAULT 0, PRIMARY KEY (run, owner, kind));"
    "INSERT INTO totals SELECT run, 'default', kind, seen, clamped, would_clamp, chars_before,"
    " chars_after, saved_chars, saved_tokens, would_save_chars, would_save_tokens, saved_usd,"
    " would_save_usd FROM totals_v2;"
    "DROP TABLE totals_v2;"
    "ALTER TABLE run_counts RENAME TO run_counts_v2;"
    "CREATE TABLE run_counts (run TEXT NOT NULL, owner TEXT NOT NULL,"
    " requests INTEGER NOT NULL DEFAULT 0, clamp_errors INTEGER NOT NULL DEFAULT 0,"
    " upstream_errors INTEGER NOT NULL DEFAULT 0, unpriced INTEGER NOT NULL DEFAULT 0,"
    " PRIMARY KEY (run, owner));"
    "INSERT INTO run_counts SELECT run, 'default', requests, clamp_errors, upstream_errors,"
    " unpriced FROM run_counts_v2;"
    "DROP TABLE run_counts_v2;"
    "ALTER TABLE requests ADD COLUMN owner TEXT NOT NULL DEFAULT 'default';"
    "CREATE INDEX requests_owner ON requests (owner, run, ts)",
    # 4: totals per hour instead of per run, so the report spans restarts and instances.
    # A run's totals move to the hour it started in (its requests' own hours are not known).
    f"CREATE TABLE totals_by_hour (hour INTEGER NOT NULL, owner TEXT NOT NULL,"
    f" kind TEXT NOT NULL, seen INTEGER NOT NULL DEFAULT 0, clamped INTEGER NOT NULL DEFAULT 0,"
    f" would_clamp INTEGER NOT NULL DEFAULT 0, chars_before INTEGER NOT NULL DEFAULT 0,"
    f" chars_after INTEGER NOT NULL DEFAULT 0, saved_chars INTEGER NOT NULL DEFAULT 0,"
    f" saved_tokens INTEGER NOT NULL DEFAULT 0, would_save_chars INTEGER NOT NULL DEFAULT 0,"
    f" would_save_tokens INTEGER NOT NULL DEFAULT 0, saved_usd REAL NOT NULL DEFAULT 0,"
    f" would_save_usd REAL NOT NULL DEFAULT 0, PRIMARY KEY (hour, owner, kind));"
    f"INSERT INTO totals_by_hour SELECT CAST(coalesce(r.started, 0) / {HOUR} AS INTEGER),"
    f" t.owner, t.kind, {', '.join(f'sum(t.{c})' for c in _columns(_SUMS))}"
    f" FROM totals t LEFT JOIN runs r ON r.run = t.run GROUP BY 1, 2, 3;"
    f"DROP TABLE totals;"
    f"CREATE TABLE counts_by_hour (hour INTEGER NOT NULL, owner TEXT NOT NULL,"
    f" requests INTEGER NOT NULL DEFAULT 0, clamp_errors INTEGER NOT NULL DEFAULT 0,"
    f" upstream_errors INTEGER NOT NULL DEFAULT 0, unpriced INTEGER NOT NULL DEFAULT 0,"
    f" PRIMARY KEY (hour, owner));"
    f"INSERT INTO counts_by_hour SELECT CAST(coalesce(r.started, 0) / {HOUR} AS INTEGER),"
    f" c.owner, {', '.join(f'sum(c.{c})' for c in _columns(_COUNTS))}"
    f" FROM run_counts c LEFT JOIN runs r ON r.run = c.run GROUP BY 1, 2;"
    f"DROP TABLE run_counts;"
    f"CREATE INDEX requests_time ON requests (ts)",
    # 5: sessions, with the provider's usage and the money with and without ctxbudget.
    f"CREATE TABLE sessions (owner TEXT NOT NULL, id TEXT NOT NULL, format TEXT NOT NULL,"
    f" model TEXT, first REAL NOT NULL, last REAL NOT NULL, {_SESSION_SUMS_DDL},"
    f" last_bust TEXT, PRIMARY KEY (owner, id));"
    f"CREATE INDEX sessions_last ON sessions (owner, last)",
)


_PG_BASELINE = f"""
CREATE TABLE IF NOT EXISTS runs (run TEXT PRIMARY KEY, started DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS requests (id TEXT PRIMARY KEY, run TEXT NOT NULL,
    ts DOUBLE PRECISION NOT NULL, body TEXT NOT NULL, owner TEXT NOT NULL DEFAULT 'default');
CREATE INDEX IF NOT EXISTS requests_owner ON requests (owner, run, ts);
CREATE INDEX IF NOT EXISTS requests_time ON requests (ts);
CREATE TABLE IF NOT EXISTS totals_by_hour (hour BIGINT NOT NULL, owner TEXT NOT NULL,
    kind TEXT NOT NULL, {
    ", ".join(
        f"{c} {'DOUBLE PRECISION' if c.endswith('usd') else 'BIGINT'} NOT NULL DEFAULT 0"
        for c in _columns(_SUMS)
    )
}, PRIMARY KEY (hour, owner, kind));
CREATE TABLE IF NOT EXISTS counts_by_hour (hour BIGINT NOT NULL, owner TEXT NOT NULL,
    {", ".join(f"{c} BIGINT NOT NULL DEFAULT 0" for c in _columns(_COUNTS))},
    PRIMARY KEY (hour, owner));
CREATE TABLE IF NOT EXISTS sessions (owner TEXT NOT NULL, id TEXT NOT NULL,
    format TEXT NOT NULL, model TEXT, first DOUBLE PRECISION NOT NULL,
    last DOUBLE PRECISION NOT NULL, {
    ", ".join(
        f"{c} {'DOUBLE PRECISION' if c in _REAL else 'BIGINT'} NOT NULL DEFAULT 0"
        for c in _SESSION_SUMS_5
    )
}, last_bust TEXT, PRIMARY KEY (owner, id));
CREATE INDEX IF NOT EXISTS sessions_last ON sessions (owner, last)
"""
_SCHEMA_6 = """
CREATE TABLE IF NOT EXISTS pruned (owner TEXT NOT NULL, conversation TEXT NOT NULL,
    call_id TEXT NOT NULL, text TEXT NOT NULL, at {real} NOT NULL,
    PRIMARY KEY (owner, conversation, call_id));
CREATE INDEX IF NOT EXISTS pruned_at ON pruned (at);
CREATE TABLE IF NOT EXISTS summaries (owner TEXT NOT NULL, conversation TEXT NOT NULL,
    call_id TEXT NOT NULL, text TEXT NOT NULL, at {real} NOT NULL,
    PRIMARY KEY (owner, conversation, call_id));
ALTER TABLE sessions ADD COLUMN prunes {int} NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN busts_planned {int} NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN tools_inline {int} NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN tools_inline_tokens {int} NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN tools_inline_requests {int} NOT NULL DEFAULT 0
"""
"""6: pruning's decisions (`proxy/report/ledger.py`: what stands for each pruned result), the
summaries that may stand for one (`contextPruning.summarize`), each session's prunes and the
cache busts they planned, and the MCP tool definitions a session sent inline (Claude Code
without tool search): the most of them in one request, their tokens, and how many requests
sent any."""
_SCHEMA_7 = ";".join(
    f"ALTER TABLE counts_by_hour ADD COLUMN {c} {{{'real' if c.endswith('usd') else 'int'}}}"
    " NOT NULL DEFAULT 0"
    for c in SUMMARY_COUNTS
)
"""7: what each owner's summaries cost (`SUMMARY_COUNTS`), so the report says it for any
window whatever the requests kept."""
_SCHEMA_8_SQLITE = """
ALTER TABLE pruned RENAME TO pruned_v7;
CREATE TABLE pruned (owner TEXT NOT NULL, conversation TEXT NOT NULL, call_id TEXT NOT NULL,
    digest TEXT NOT NULL, text TEXT NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (owner, conversation, call_id, digest));
INSERT INTO pruned SELECT owner, conversation, call_id, '', text, at FROM pruned_v7;
DROP TABLE pruned_v7;
CREATE INDEX IF NOT EXISTS pruned_at ON pruned (at)
"""
_SCHEMA_8_PG = """
ALTER TABLE pruned ADD COLUMN digest TEXT NOT NULL DEFAULT '';
ALTER TABLE pruned DROP CONSTRAINT pruned_pkey;
ALTER TABLE pruned ADD PRIMARY KEY (owner, conversation, call_id, digest)
"""
"""8: each pruning decision bound to the result it was taken for (`digest`, in the key: two
results under one call id, in two runs of one task, each keep their own). Rows from before
get `''`, which no result digests to: never applied (`docs/pruning.md`, "Upgrading"), and
trimmed as the others are."""
_SCHEMA_10 = """
CREATE TABLE IF NOT EXISTS segment_chunks (owner TEXT NOT NULL, id TEXT NOT NULL,
    body TEXT NOT NULL, PRIMARY KEY (owner, id));
ALTER TABLE requests ADD COLUMN chunks TEXT NOT NULL DEFAULT ''
"""
"""10: a request's first segments, `CHUNK` at a time, in `segment_chunks` (their entries' JSON,
found by owner and digest: `Tally.chunks`), each written once and named in order by every
request that has it (`requests.chunks`, the digests space-separated); the request's row lists
only the segments after them (`proxy/report/tally.py`). Rows from before hold all their
segments and name no chunk: read as they are. A chunk no kept request names is pruned with
them."""
MIGRATIONS = (
    Migration(1, _SCHEMA, None),
    *(Migration(v, sql, None) for v, sql in enumerate(_UPGRADES[:-1], start=2)),
    Migration(5, _UPGRADES[-1], _PG_BASELINE),
    Migration(
        6,
        _SCHEMA_6.format(real="REAL", int="INTEGER"),
        _SCHEMA_6.format(real="DOUBLE PRECISION", int="BIGINT"),
    ),
    Migration(
        7,
        _SCHEMA_7.format(real="REAL", int="INTEGER"),
        _SCHEMA_7.format(real="DOUBLE PRECISION", int="BIGINT"),
    ),
    Migration(8, _SCHEMA_8_SQLITE, _SCHEMA_8_PG),
    Migration(
        9,
        holdout_arms.schema_9("REAL", "INTEGER"),
        holdout_arms.schema_9("DOUBLE PRECISION", "BIGINT"),
    ),
    Migration(10, _SCHEMA_10, _SCHEMA_10),
)
"""The report's schema, step by step, for both backends: SQLite files have walked every step
since version 1; PostgreSQL starts from the baseline of version 5, then walks on."""


class Sink(Protocol):
    """Something else that wants each finished request (telemetry). It may also have a
    `batch_done()`, called after the records of each batch (metrics count then)."""

    def record(self, r: RequestRecord, body: dict[str, Any]) -> None:
        """Take one request and its report entry (on the report's writer thread). Its
        segments' sums are `r.tally`'s (set by then); `body["segments"]` is their JSON."""
        ...


def open_db(path: Path) -> Database:
    """Open (and create or migrate) the report database at `path`."""
    db = Database(path)
    version = db.fetchall("PRAGMA user_version")[0][0]
    if version > SCHEMA_VERSION:
        db.close()
        raise RuntimeError(
            f"report database {path} has schema version {version}, newer than this "
            f"ctxbudget understands ({SCHEMA_VERSION}); upgrade ctxbudget or use another "
            "report.path"
        )
    if version < SCHEMA_VERSION:
        # Several workers may open a new file at once: migrate under the write lock, and
        # look again once holding it.
        with db.transaction() as conn:
            current = conn.execute("PRAGMA user_version").fetchone()[0]
            for step in MIGRATIONS:
                if step.version > current and step.sqlite is not None:
                    for statement in step.sqlite.split(";"):
                        if statement.strip():
                            conn.execute(statement)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    return db


_ADD_RUN = "INSERT INTO runs (run, started) VALUES (?, ?) ON CONFLICT DO NOTHING"


def open_pg(db: PgDatabase) -> PgDatabase:
    """Create or migrate the report's tables in `db` (once, whoever else starts)."""
    migrate(db, "report", MIGRATIONS)
    return db


def start_run(path: Path | PgDatabase, run: str, started: float) -> None:
    """Record the start of a serving run (called once, before workers start)."""
    if isinstance(path, Path):
        sqlite = open_db(path)
        try:
            sqlite.execute(_ADD_RUN, (run, started))
        finally:
            sqlite.close()
    else:
        open_pg(path).execute(_ADD_RUN, (run, started))


_UNAVAILABLE = (DatabaseUnavailable, sqlite3.OperationalError)
"""What keeps records for a later try: PostgreSQL not answering, and SQLite's operational
errors (locked past its 30 s busy timeout, disk full); anything else is the record's."""


class _Entry:
    """A described record waiting to be written: its JSON entry as text, and the fields it is
    stored under (the entry is parsed again to be written: kept as dicts, records waiting
    through an outage took ~4x the memory of their text)."""

    __slots__ = ("id", "owner", "at", "text", "body", "kinds", "prunes", "chunks")

    def __init__(self, body: dict[str, Any], text: str, tally: Tally) -> None:
        self.id: str = body["id"]
        self.owner: str = body["owner"]
        self.at: float = body["at"]
        self.text = text
        self.kinds = {k: v for k, v in tally.kind_totals().items() if k in SEGMENT_KINDS}
        """What its segments add to each kind's totals (`Tally.kind_totals`): carried from
        the conversation's last request, not summed again from its segments."""
        self.prunes = tally.pruned_now
        """Results it pruned (the session's `prunes`)."""
        self.chunks = tally.chunks
        """Its first segments' chunks (`Tally.chunks`), which `text` does not list: the
        conversation's earlier requests' own (shared), written once."""
        self.body: dict[str, Any] | None = body
        """The entry itself until its first write is tried (`_store` reads it); a record kept
        through an outage keeps only its text."""


class ReportStore:
    """Writes request records on a background thread and answers report queries."""

    def __init__(
        self,
        path: Path | PgDatabase,
        *,
        run: str,
        started: float | None = None,
        batch_seconds: float = 0.05,
        sinks: Sequence[Sink] = (),
        keep_requests: int = KEEP_REQUESTS,
        keep_days: float = KEEP_DAYS,
        keep_decisions: int = KEEP_DECISIONS,
        keep_conversations: int = KEEP_CONVERSATIONS,
    ) -> None:
        self.path = path if isinstance(path, Path) else None
        """The SQLite file; None on PostgreSQL."""
        self.sinks = list(sinks)
        self.run = run
        self._batch_seconds = batch_seconds
        self._flush_now = threading.Event()
        self._tokens = TokenCounter()
        self._queue: queue.Queue[RequestRecord | None] = queue.Queue()
        self._deferred = 0
        """Records waiting for a late token count before they are queued (`add`)."""
        self._deferred_lock = threading.Lock()
        self._started = started if started is not None else time.time()
        self._lost: Counter[str] = Counter()
        """Requests this process could not record, per owner."""
        self._pending: deque[_Entry] = deque()
        """Described records not yet written (the database did not answer); writer only."""
        self._pending_bytes = 0
        self._tries = self._tried = 0
        """Writes of the pending records begun, and finished (`flush` waits for one more)."""
        self._down_since: float | None = None
        """When the database stopped answering the writer, while it does not."""
        self._retry_at = 0.0
        self._db: Database | PgDatabase
        self._migrated = True
        if isinstance(path, Path):
            self._db = open_db(path)
            self._db.execute(_ADD_RUN, (run, self._started))
        else:
            self._db = path
            try:  # a database that is down must not stop the proxy: retried on first use
                open_pg(path).execute(_ADD_RUN, (run, self._started))
            except DatabaseUnavailable as exc:
                self._migrated = False
                log.error("report database unavailable at start (retried later): %s", exc)
        self.ledger = PruneLedger(self._db, keep=keep_decisions)
        """Pruning's decisions, in the same database (`proxy/report/ledger.py`)."""
        self.arms = Arms(self._db)
        """The holdout's arms, in the same database (`proxy/report/arms.py`)."""
        self._writes = 0
        self._keep = keep_requests
        self._keep_conversations = keep_conversations
        self.keep_days = keep_days
        self._pruned = False  # the first batch prunes what expired while no one wrote
        self._chunks: set[tuple[str, str]] = set()
        """The chunks (owner, digest) this writer wrote lately: a request names them without
        writing them again. Forgotten at each prune of its own (it may have dropped some) and
        after `CHUNKS_KNOWN_SECONDS` (another worker's prune may have)."""
        self._chunks_since = time.monotonic()
        self._thread = threading.Thread(target=self._writer, name="ctxbudget-report", daemon=True)
        self._thread.start()

    # -- writing -------------------------------------------------------------------------

    def add(self, record: RequestRecord) -> None:
        """Queue `record`; returns at once. A record still waiting for a large block's token
        count (counted in the offload process after the body went upstream) is queued when
        the count is done, so the writer never waits on one: the records behind it, small
        requests' too, are written meanwhile."""
        late = record.prefix.late if record.prefix is not None else None
        if late is None or late.done():
            self._queue.put(record)
            return
        with self._deferred_lock:
            self._deferred += 1

        def queue(_: object) -> None:
            self._queue.put(record)
            with self._deferred_lock:
                self._deferred -= 1

        late.add_done_callback(queue)

    def add_later(self) -> Callable[[RequestRecord | None], None]:
        """A record to come (a stream's, while its pricing runs in a thread): `flush` waits
        for it as for one waiting for a late count; the function returned queues it (None:
        it will not come), once."""
        with self._deferred_lock:
            self._deferred += 1
        once = threading.Lock()

        def arrived(record: RequestRecord | None) -> None:
            if not once.acquire(blocking=False):
                return
            if record is not None:
                self._queue.put(record)
            with self._deferred_lock:
                self._deferred -= 1

        return arrived

    def flush(self, timeout: float = 10.0, *, late: float | None = None) -> None:
        """Wait until every queued record is written, and those waiting for a late token
        count (`add`) for up to `late` seconds (default: as long as the rest)."""
        now = time.monotonic()
        deadline = now + timeout
        late_deadline = now + (timeout if late is None else min(late, timeout))
        attempt = self._tries + 1
        while (now := time.monotonic()) < deadline:
            # records kept through an outage: one try of them begun from now, whatever it gives
            pending = self._pending and self._tried < attempt
            if not (
                self._queue.unfinished_tasks or pending or (self._deferred and now < late_deadline)
            ):
                return
            self._flush_now.set()
            time.sleep(0.001)

    @property
    def lost(self) -> int:
        """Requests this process could not record (every owner's)."""
        return sum(self._lost.values())

    def close(self) -> None:
        """Write what is queued, stop the writer and close the database."""
        self._queue.put(None)
        self._flush_now.set()
        self._thread.join(timeout=30)
        self.ledger.close()
        self._db.close()

    @contextlib.contextmanager
    def _transaction(self, conn: sqlite3.Connection | None) -> Iterator[Any]:
        """A write transaction: on the writer's own SQLite connection (reads never wait for
        a batch), or on a pooled PostgreSQL connection."""
        if conn is None:
            assert isinstance(self._db, PgDatabase)
            with self._db.transaction() as tx:
                yield tx
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _writer(self) -> None:
        conn = connect(self.path) if self.path is not None else None
        written = False
        try:
            while True:
                try:
                    # records kept through an outage are tried again every RETRY_SECONDS,
                    # or at once when a reader flushes
                    first = self._queue.get(timeout=0.05 if self._pending else IDLE_SECONDS)
                except queue.Empty:
                    if self._pending and (
                        self._flush_now.is_set() or time.monotonic() >= self._retry_at
                    ):
                        self._flush_now.clear()
                        self._write_pending(conn)
                    elif written and not self._pending:
                        # Idle after traffic: hand the freed request buffers back to the OS
                        # (glibc keeps them otherwise; ~30 MB after a burst of 32 at once).
                        trim_memory()
                        written = False
                    continue
                written = True
                # Gather for a moment and write one transaction: per-request writes would
                # compete with the request path for the GIL on every request.
                self._flush_now.wait(self._batch_seconds)
                self._flush_now.clear()
                batch = [first]
                while True:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                stop = any(r is None for r in batch)
                try:
                    self._take([r for r in batch if r is not None])
                    if self._pending and (
                        stop or self._down_since is None or time.monotonic() >= self._retry_at
                    ):
                        self._write_pending(conn)
                finally:
                    for _ in batch:
                        self._queue.task_done()
                if stop:
                    self._give_up()
                    return
        finally:
            if conn is not None:
                conn.close()

    def _take(self, records: list[RequestRecord]) -> None:
        """Describe `records` (their tokens counted), hand them to the sinks, and keep them
        to write; past `PENDING_BYTES` kept, the oldest are dropped."""
        for record in records:
            try:
                record = storable_record(record)
                made = tally_of(record, self._tokens)
                if record.tally is None:  # the sinks read it too
                    record = evolve(record, tally=made)
                body, text = entry_and_text(record, self._tokens, chunked=True)
                entry = _Entry(body, text, made)
            except Exception:
                self._lost[storable(record.owner)] += 1
                log.exception(
                    "could not make the report entry of request %s for the report", record.id
                )
                continue
            for sink in self.sinks:
                try:
                    sink.record(record, body)
                except Exception:
                    log.exception("%s could not take request %s", type(sink).__name__, record.id)
            self._pending.append(entry)
            self._pending_bytes += len(entry.text)
        for sink in self.sinks:
            done = getattr(sink, "batch_done", None)
            if done is not None:
                try:
                    done()
                except Exception:
                    log.exception("%s could not finish a batch", type(sink).__name__)
        dropped = 0
        while self._pending_bytes > PENDING_BYTES and len(self._pending) > 1:
            gone = self._pending.popleft()
            self._pending_bytes -= len(gone.text)
            self._lost[gone.owner] += 1
            dropped += 1
        if dropped:
            log.error(
                "report database unavailable and %d MiB of records kept: dropped the %d oldest "
                "(%d lost since start)",
                PENDING_BYTES >> 20,
                dropped,
                self.lost,
            )

    def _write_pending(self, conn: sqlite3.Connection | None) -> None:
        """Write the records kept, in one transaction; a batch the database refuses is written
        again one record at a time, so only the bad record is lost. While the database does
        not answer they stay kept (tried again after `RETRY_SECONDS`)."""
        entries = list(self._pending)
        self._tries += 1
        try:
            try:
                self._ready()
                self._store(conn, entries)
            except _UNAVAILABLE:
                raise
            except Exception:
                if len(entries) == 1:
                    raise
                log.warning(
                    "the database refused a batch of %d report records: writing them one by one",
                    len(entries),
                    exc_info=True,
                )
                for entry in entries:
                    try:
                        self._store(conn, [entry])
                    except _UNAVAILABLE:
                        raise
                    except Exception:
                        self._lose_first("could not write report record %s", entry)
                    else:
                        self._done(1)
                return
            self._done(len(entries))
        except _UNAVAILABLE as exc:
            if self._down_since is None:
                self._down_since = time.monotonic()
                log.error(
                    "report database unavailable, %d request(s) kept to write when it answers "
                    "(at most %d MiB; %d lost since start): %s",
                    len(self._pending),
                    PENDING_BYTES >> 20,
                    self.lost,
                    exc,
                )
            self._retry_at = time.monotonic() + RETRY_SECONDS
        except Exception:
            self._lose_first("could not write report record %s", entries[0])
        finally:
            self._tried = self._tries
            for entry in entries:  # kept for another try: as text only (PENDING_BYTES)
                entry.body = None

    def _done(self, n: int) -> None:
        """The first `n` kept records are written."""
        for _ in range(n):
            self._pending_bytes -= len(self._pending.popleft().text)
        if self._down_since is not None and not self._pending:
            log.warning(
                "report database answers again after %.1f s: the records kept meanwhile are "
                "written",
                time.monotonic() - self._down_since,
            )
            self._down_since = None

    def _lose_first(self, message: str, entry: _Entry) -> None:
        """The first kept record cannot be written: counted as lost, and why is logged."""
        self._pending.popleft()
        self._pending_bytes -= len(entry.text)
        self._lost[entry.owner] += 1
        log.exception(message + " (%d lost since start)", entry.id, self.lost)

    def _give_up(self) -> None:
        """At close: what the database still did not take is lost, and said so."""
        if not self._pending:
            return
        for entry in self._pending:
            self._lost[entry.owner] += 1
        log.error(
            "report database unavailable at shutdown: %d request(s) not recorded (%d lost since "
            "start)",
            len(self._pending),
            self.lost,
        )
        self._pending.clear()
        self._pending_bytes = 0

    def _ready(self) -> None:
        """Create or migrate PostgreSQL's tables if that could not be done at start."""
        if not self._migrated:
            assert isinstance(self._db, PgDatabase)
            open_pg(self._db).execute(_ADD_RUN, (self.run, self._started))
            self._migrated = True

    def _store(self, conn: sqlite3.Connection | None, entries: list[_Entry]) -> None:
        bodies = [e.body if e.body is not None else loads_entry(e.text) for e in entries]
        for e in entries:
            e.body = None
        rows = [
            (e.id, self.run, e.owner, e.at, e.text, " ".join(c for c, _ in e.chunks))
            for e in entries
        ]
        # a conversation's chunks, each written once: its later requests only name them
        if time.monotonic() - self._chunks_since > CHUNKS_KNOWN_SECONDS:
            self._chunks, self._chunks_since = set(), time.monotonic()
        chunks = {(e.owner, c): data for e in entries for c, data in e.chunks}
        written = [(o, c, data.decode()) for (o, c), data in chunks.items()]
        written = [row for row in written if (row[0], row[1]) not in self._chunks]
        pruned = False
        with self._transaction(conn) as tx:
            tx.executemany(
                "INSERT INTO requests (id, run, owner, ts, body, chunks) "
                "VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET run = excluded.run, owner = excluded.owner, "
                "ts = excluded.ts, body = excluded.body, chunks = excluded.chunks",
                rows,
            )
            if written:
                tx.executemany(
                    "INSERT INTO segment_chunks (owner, id, body) VALUES (?, ?, ?) "
                    "ON CONFLICT (owner, id) DO NOTHING",
                    written,
                )
            self._add_totals(tx, bodies, entries)
            self._add_sessions(tx, bodies, entries)
            holdout_arms.add_requests(tx, bodies)
            self._writes += len(entries)
            if self._writes >= min(200, self._keep) or not self._pruned:
                self._writes, self._pruned = 0, True
                self._prune(tx)
                pruned = True
        # known written once committed; a prune may have dropped any of them
        self._chunks = set() if pruned else self._chunks | {(o, c) for o, c, _ in written}

    def _add_totals(self, conn: Any, bodies: list[dict[str, Any]], entries: list[_Entry]) -> None:
        groups: dict[tuple[int, str], tuple[list[dict[str, Any]], list[_Entry]]] = {}
        for body, entry in zip(bodies, entries, strict=True):
            group = groups.setdefault((int(body["at"] // HOUR), body["owner"]), ([], []))
            group[0].append(body)
            group[1].append(entry)
        for (hour, owner), (grouped, kept) in groups.items():
            self._add_group_totals(conn, hour, owner, grouped, kept)

    def _add_group_totals(
        self,
        conn: Any,
        hour: int,
        owner: str,
        bodies: list[dict[str, Any]],
        entries: list[_Entry],
    ) -> None:
        summaries = [b for b in bodies if b.get("overhead")]
        conn.execute(
            _ADD_COUNTS,
            (
                hour,
                owner,
                len(bodies),
                sum(b["clampError"] is not None for b in bodies),
                sum(b["upstreamError"] is not None for b in bodies),
                sum(b["inputPricePerMTok"] is None for b in bodies),
                len(summaries),
                sum(not 200 <= b["status"] < 300 for b in summaries),
                sum(b["costUsd"] is not None for b in summaries),
                sum((b["usage"] or {}).get("input", 0) for b in summaries),
                sum((b["usage"] or {}).get("output", 0) for b in summaries),
                sum(b["costUsd"] or 0.0 for b in summaries),
            ),
        )
        for kind in SEGMENT_KINDS:
            rows = [e.kinds[kind] for e in entries if kind in e.kinds]
            if not rows:
                continue
            conn.execute(
                f"INSERT INTO totals_by_hour (hour, owner, kind, {_SUMS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (hour, owner, kind) DO UPDATE SET "
                + ", ".join(f"{c} = totals_by_hour.{c} + excluded.{c}" for c in _columns(_SUMS)),
                (hour, owner, kind, *(sum(column) for column in zip(*rows, strict=True))),
            )

    def _add_sessions(self, conn: Any, bodies: list[dict[str, Any]], entries: list[_Entry]) -> None:
        """One upsert per session a batch touched (an agent's session sends most of a batch:
        one statement a request was the writer's largest step), the same row as one a request:
        sums added, `last` and the `tools_inline` peaks the largest, `format` the last
        request's, `model` and `last_bust` the last one given. A request ctxbudget made itself
        (`overhead`: a summary) adds to the sums only: the session stays the agent's, in its
        format and model, last seen when the agent was (pruning reads that time)."""
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        for b, entry in zip(bodies, entries, strict=True):
            if b.get("session") is None:
                continue
            sums = _session_sums(b, entry.prunes)
            agent = not b.get("overhead")
            inline = b.get("toolsInline") or {"count": 0, "tokens": 0}
            row = rows.get((b["owner"], b["session"]))
            if row is None or (agent and not row["agent"]):
                rows[(b["owner"], b["session"])] = {
                    "agent": agent,
                    "format": b["wire"],
                    "model": b["model"],
                    "first": b["at"],
                    "last": b["at"],
                    "last_bust": b["cacheBust"],
                    "tools_inline": inline["count"],
                    "tools_inline_tokens": inline["tokens"],
                    "sums": sums if row is None else _added(row["sums"], sums),
                }
                continue
            row["sums"] = _added(row["sums"], sums)
            if not agent:
                continue
            row["format"] = b["wire"]
            row["model"] = b["model"] if b["model"] is not None else row["model"]
            row["last"] = max(row["last"], b["at"])
            row["last_bust"] = b["cacheBust"] if b["cacheBust"] is not None else row["last_bust"]
            row["tools_inline"] = max(row["tools_inline"], inline["count"])
            row["tools_inline_tokens"] = max(row["tools_inline_tokens"], inline["tokens"])
        for (owner, session), row in rows.items():
            conn.execute(
                _UPSERT_SESSION if row["agent"] else _ADD_TO_SESSION,
                (
                    owner,
                    session,
                    row["format"],
                    row["model"],
                    row["first"],
                    row["last"],
                    row["last_bust"],
                    row["tools_inline"],
                    row["tools_inline_tokens"],
                    *(row["sums"][c] for c in _SESSION_ADDS),
                ),
            )

    def _prune(self, conn: Any) -> None:
        """Requests, sessions and arms past the per-owner caps, and everything older than
        `keep_days`."""
        # per owner: one key's traffic must not push another's records out
        for (owner,) in conn.execute("SELECT DISTINCT owner FROM requests").fetchall():
            conn.execute(
                "DELETE FROM requests WHERE owner = ? AND ts < (SELECT ts FROM requests"
                " WHERE owner = ? ORDER BY ts DESC LIMIT 1 OFFSET ?)",
                (owner, owner, self._keep),
            )
            # each by its index (`sessions_last`, `arms_drawn`): this runs every 200 writes
            for table, seen in (("sessions", "last"), ("arms", "drawn")):
                conn.execute(
                    f"DELETE FROM {table} WHERE owner = ? AND {seen} < (SELECT {seen} FROM"
                    f" {table} WHERE owner = ? ORDER BY {seen} DESC LIMIT 1 OFFSET ?)",
                    (owner, owner, self._keep_conversations),
                )
        cutoff = time.time() - self.keep_days * 86_400
        conn.execute("DELETE FROM requests WHERE ts < ?", (cutoff,))
        conn.execute("DELETE FROM totals_by_hour WHERE hour < ?", (int(cutoff // HOUR),))
        conn.execute("DELETE FROM counts_by_hour WHERE hour < ?", (int(cutoff // HOUR),))
        conn.execute("DELETE FROM sessions WHERE last < ?", (cutoff,))
        conn.execute("DELETE FROM pruned WHERE at < ?", (cutoff,))
        conn.execute("DELETE FROM summaries WHERE at < ?", (cutoff,))
        conn.execute("DELETE FROM arms WHERE drawn < ? AND last < ?", (cutoff, cutoff))
        # the chunks of segments no kept request names any more (every 200 writes: the kept
        # requests' lists read, a few digests each)
        named = {
            (owner, chunk)
            for owner, chunks in conn.execute(
                "SELECT owner, chunks FROM requests WHERE chunks <> ''"
            ).fetchall()
            for chunk in chunks.split()
        }
        gone = [
            (owner, chunk)
            for owner, chunk in conn.execute("SELECT owner, id FROM segment_chunks").fetchall()
            if (owner, chunk) not in named
        ]
        if gone:
            conn.executemany("DELETE FROM segment_chunks WHERE owner = ? AND id = ?", gone)

    # -- reading -------------------------------------------------------------------------

    def request(self, request_id: str, *, owner: str | None = None) -> dict[str, Any] | None:
        """One request's record, as written (any run); only `owner`'s when given."""
        if storable(request_id) != request_id:
            return None  # a NUL or lone surrogate: no id holds one (PostgreSQL refuses NUL)
        sql, args = "SELECT owner, chunks, body FROM requests WHERE id = ?", [request_id]
        if owner is not None:
            sql, args = sql + " AND owner = ?", [*args, owner]
        if not self._migrated:
            self._ready()
        rows = self._db.fetchall(sql, args)
        if not rows:
            return None
        found, chunks, text = rows[0]
        entry: dict[str, Any] = loads_entry(text)
        with_chunks(self._db.fetchall, [(found, chunks, entry)])
        return entry

    def summary(
        self, *, recent: int, owner: str | None = None, since: float | None = None
    ) -> dict[str, Any]:
        """Totals since `since` (everything kept when None) and the `recent` latest requests:
        one owner's, or everyone's."""
        if not self._migrated:
            self._ready()
        summary = read_summary(self._db.fetchall, recent=recent, owner=owner, since=since)
        # a key sees how many of its own requests went unrecorded, not everyone's
        summary["lost"] = self.lost if owner is None else self._lost[owner]
        return summary

    def holdout_rows(
        self, *, owner: str | None = None, since: float | None = None
    ) -> list[dict[str, Any]]:
        """The conversations with an arm (`arms.conversations`): one owner's, or everyone's."""
        if not self._migrated:
            self._ready()
        return holdout_arms.conversations(self._db.fetchall, owner=owner, since=since)


def _added(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {c: a[c] + b[c] for c in _SESSION_ADDS}


def _session_sums(b: dict[str, Any], prunes: int) -> dict[str, Any]:
    """What one request adds to its session's row (`prunes`: the results it pruned)."""
    would = b["withoutUsage"] or {}
    return {
        **holdout_arms.billed_sums(b),
        "without_input": would.get("input", 0),
        "without_cache_read": would.get("cacheRead", 0),
        "without_cache_write": would.get("cacheWrite", 0),
        "saved_tokens": b["savedTokens"],
        "memory_tokens": b["memoryTokens"],
        "busts_client": int(b["clientCacheBust"]),
        "busts_ctxbudget": int(b["cacheBust"] is not None),
        "prunes": prunes,
        "busts_planned": int((b["cacheBust"] or "").endswith(" prune")),
        "tools_inline_requests": int(b.get("toolsInline") is not None),
    }


_ADD_COUNTS = (
    f"INSERT INTO counts_by_hour (hour, owner, {_COUNTS}, {', '.join(SUMMARY_COUNTS)}) "
    f"VALUES ({', '.join('?' * (6 + len(SUMMARY_COUNTS)))}) "
    "ON CONFLICT (hour, owner) DO UPDATE SET "
    + ", ".join(
        f"{c} = counts_by_hour.{c} + excluded.{c}" for c in (*_columns(_COUNTS), *SUMMARY_COUNTS)
    )
)
"""One hour's counts of one owner added to (`_add_group_totals`)."""
_UPSERT_SESSION = (
    f"INSERT INTO sessions (owner, id, format, model, first, last, last_bust, "
    f"tools_inline, tools_inline_tokens, {', '.join(_SESSION_ADDS)}) "
    f"VALUES ({', '.join('?' * (9 + len(_SESSION_ADDS)))}) "
    "ON CONFLICT (owner, id) DO UPDATE SET "
    "last = CASE WHEN excluded.last > sessions.last THEN excluded.last "
    "ELSE sessions.last END, "
    "format = excluded.format, model = coalesce(excluded.model, sessions.model), "
    "last_bust = coalesce(excluded.last_bust, sessions.last_bust), "
    + "".join(
        f"{c} = CASE WHEN excluded.{c} > sessions.{c} THEN excluded.{c} ELSE sessions.{c} END, "
        for c in ("tools_inline", "tools_inline_tokens")
    )
    + ", ".join(f"{c} = sessions.{c} + excluded.{c}" for c in _SESSION_ADDS)
)
"""One session's row added to (`_add_sessions`)."""
_ADD_TO_SESSION = (
    _UPSERT_SESSION.partition(" DO UPDATE SET ")[0]
    + " DO UPDATE SET "
    + ", ".join(f"{c} = sessions.{c} + excluded.{c}" for c in _SESSION_ADDS)
)
"""The sums of requests ctxbudget made itself added to a session's row (`_add_sessions`); a
session the report has no row of yet (its agent's requests not written) gets one from them."""
