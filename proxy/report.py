"""The report store: what every proxied request clamped and saved, in one SQLite file.

Every worker of a multi-worker server writes to the same file, so the report reflects all of
them. Writes happen on a background thread, batched, so the request path only enqueues a
record; token counting (tiktoken) happens there too. Readers in the same process call
`flush()` first so they see their own latest requests.

Totals are kept per *run* (one `ctxbudget serve`); the report shows the latest run.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from caps import SEGMENT_KINDS, Segment
from proxy.tokens import TokenCounter, trim_memory

if TYPE_CHECKING:
    from proxy.telemetry import Telemetry

log = logging.getLogger("ctxbudget.report")

SCHEMA_VERSION = 2
IDLE_SECONDS = 2.0
"""After this long without requests, the writer returns freed memory to the OS."""
KEEP_REQUESTS = 2000
"""Request rows kept for `/context/budget/requests/{id}`; older ones are pruned."""

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
)


@dataclass(frozen=True, kw_only=True)
class RequestRecord:
    """What the proxy did with one request; queued by the app, written by the store."""

    id: str
    ts: float
    model: str | None
    enabled: bool
    stream: bool
    status: int
    duration_ms: float
    segments: tuple[Segment, ...]
    encoding: str
    route: str = "openai"
    memories: int = 0
    clamp_error: str | None = None
    upstream_error: str | None = None
    segment_tokens: tuple[int, ...] = ()
    """Tokens saved per segment, when the request path already counted them."""
    input_price: float | None = None
    """USD per input token of the request's model (litellm's map); None when unknown."""
    marks: dict[str, int] = field(default_factory=dict)
    """Wall-clock ns of the request's phases (start, parsed, clamped, recall_start, …, end)."""
    response_tail: bytes | None = None
    """The upstream's JSON body or last usage-bearing SSE event (kept only for telemetry)."""
    extra: dict[str, Any] = field(default_factory=dict)


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=30, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def open_db(path: Path) -> sqlite3.Connection:
    """Open (and create or migrate) the report database at `path`."""
    conn = _connect(path)
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise RuntimeError(
            f"report database {path} has schema version {version}, newer than this "
            f"ctxbudget understands ({SCHEMA_VERSION}); upgrade ctxbudget or use another "
            "report.path"
        )
    if version < SCHEMA_VERSION:
        # Several workers may open a new file at once: migrate under the write lock, and
        # look again once holding it.
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = conn.execute("PRAGMA user_version").fetchone()[0]
            if current == 0:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                current = 1
            for upgrade in _UPGRADES[current - 1 :]:
                for statement in upgrade.split(";"):
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return conn


def start_run(path: Path, run: str, started: float) -> None:
    """Record the start of a serving run (called once, before workers start)."""
    conn = open_db(path)
    try:
        conn.execute("INSERT OR IGNORE INTO runs (run, started) VALUES (?, ?)", (run, started))
    finally:
        conn.close()


class ReportStore:
    """Writes request records on a background thread and answers report queries."""

    def __init__(
        self,
        path: Path,
        *,
        run: str,
        started: float | None = None,
        batch_seconds: float = 0.05,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.path = path
        self.telemetry = telemetry
        self.run = run
        self._batch_seconds = batch_seconds
        self._flush_now = threading.Event()
        self._tokens = TokenCounter()
        self._queue: queue.Queue[RequestRecord | None] = queue.Queue()
        self._db = open_db(path)
        self._db.execute(
            "INSERT OR IGNORE INTO runs (run, started) VALUES (?, ?)",
            (run, started if started is not None else time.time()),
        )
        self._read_lock = threading.Lock()
        self._writes = 0
        self._thread = threading.Thread(target=self._writer, name="ctxbudget-report", daemon=True)
        self._thread.start()

    # -- writing -------------------------------------------------------------------------

    def add(self, record: RequestRecord) -> None:
        """Queue `record`; returns at once."""
        self._queue.put(record)

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every queued record is written."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            self._flush_now.set()
            time.sleep(0.001)

    def close(self) -> None:
        """Write what is queued, stop the writer and close the database."""
        self._queue.put(None)
        self._flush_now.set()
        self._thread.join(timeout=30)
        self._db.close()

    def _writer(self) -> None:
        conn = _connect(self.path)
        written = False
        try:
            while True:
                try:
                    first = self._queue.get(timeout=IDLE_SECONDS)
                except queue.Empty:
                    if written:
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
                records = [r for r in batch if r is not None]
                try:
                    if records:
                        self._write(conn, records)
                except Exception:
                    log.exception("could not write %d report records", len(records))
                finally:
                    for _ in batch:
                        self._queue.task_done()
                if any(r is None for r in batch):
                    return
        finally:
            conn.close()

    def _write(self, conn: sqlite3.Connection, records: list[RequestRecord]) -> None:
        bodies = [self._describe(r) for r in records]
        if self.telemetry is not None:
            for record, body in zip(records, bodies, strict=True):
                try:
                    self.telemetry.record(record, body)
                except Exception:
                    log.exception("could not record telemetry for %s", record.id)
        rows = [(b["id"], self.run, b["at"], orjson.dumps(b).decode()) for b in bodies]
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(
                "INSERT OR REPLACE INTO requests (id, run, ts, body) VALUES (?, ?, ?, ?)", rows
            )
            self._add_totals(conn, bodies)
            self._writes += len(records)
            if self._writes >= 200:
                self._writes = 0
                conn.execute(
                    "DELETE FROM requests WHERE ts < (SELECT ts FROM requests ORDER BY ts DESC "
                    "LIMIT 1 OFFSET ?)",
                    (KEEP_REQUESTS,),
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _add_totals(self, conn: sqlite3.Connection, bodies: list[dict[str, Any]]) -> None:
        conn.execute(
            "INSERT INTO run_counts (run, requests, clamp_errors, upstream_errors, unpriced) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (run) DO UPDATE SET "
            "requests = requests + excluded.requests, "
            "clamp_errors = clamp_errors + excluded.clamp_errors, "
            "upstream_errors = upstream_errors + excluded.upstream_errors, "
            "unpriced = unpriced + excluded.unpriced",
            (
                self.run,
                len(bodies),
                sum(b["clampError"] is not None for b in bodies),
                sum(b["upstreamError"] is not None for b in bodies),
                sum(b["inputPricePerMTok"] is None for b in bodies),
            ),
        )
        for kind in SEGMENT_KINDS:
            segs = [s for b in bodies for s in b["segments"] if s["kind"] == kind]
            if not segs:
                continue
            clamped = [s for s in segs if s["action"] == "clamped"]
            would = [s for s in segs if s["action"] == "would-clamp"]
            conn.execute(
                "INSERT INTO totals (run, kind, seen, clamped, would_clamp, chars_before, "
                "chars_after, saved_chars, saved_tokens, would_save_chars, would_save_tokens, "
                "saved_usd, would_save_usd) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (run, kind) DO UPDATE SET "
                "seen = seen + excluded.seen, clamped = clamped + excluded.clamped, "
                "would_clamp = would_clamp + excluded.would_clamp, "
                "chars_before = chars_before + excluded.chars_before, "
                "chars_after = chars_after + excluded.chars_after, "
                "saved_chars = saved_chars + excluded.saved_chars, "
                "saved_tokens = saved_tokens + excluded.saved_tokens, "
                "would_save_chars = would_save_chars + excluded.would_save_chars, "
                "would_save_tokens = would_save_tokens + excluded.would_save_tokens, "
                "saved_usd = saved_usd + excluded.saved_usd, "
                "would_save_usd = would_save_usd + excluded.would_save_usd",
                (
                    self.run,
                    kind,
                    len(segs),
                    len(clamped),
                    len(would),
                    sum(s["before"] for s in segs),
                    sum(s["after"] for s in segs),
                    sum(s["saved"] for s in clamped),
                    sum(s["savedTokens"] for s in clamped),
                    sum(s["saved"] for s in would),
                    sum(s["savedTokens"] for s in would),
                    sum(s["savedUsd"] or 0 for s in clamped),
                    sum(s["savedUsd"] or 0 for s in would),
                ),
            )

    def _describe(self, r: RequestRecord) -> dict[str, Any]:
        segments: list[dict[str, Any]] = []
        for i, s in enumerate(r.segments):
            if i < len(r.segment_tokens):
                saved_tokens = r.segment_tokens[i]
            else:
                saved_tokens = segment_tokens_saved(self._tokens, s, r.encoding)
            segments.append(
                {
                    "kind": s.kind,
                    "label": s.label,
                    "before": s.before,
                    "after": s.after,
                    "saved": s.saved,
                    "savedTokens": saved_tokens,
                    "savedUsd": usd(saved_tokens, r.input_price),
                    "action": s.action,
                    "cap": s.cap,
                    "messageIndex": s.message_index,
                    "tool": s.tool,
                    "callId": s.call_id,
                    "url": s.url,
                    "note": s.note,
                }
            )
        acted = [s for s in segments if s["action"] == "clamped"]
        would = [s for s in segments if s["action"] == "would-clamp"]
        saved_tokens = sum(s["savedTokens"] for s in acted)
        would_tokens = sum(s["savedTokens"] for s in would)
        return {
            "id": r.id,
            "at": r.ts,
            "model": r.model,
            "route": r.route,
            "enabled": r.enabled,
            "stream": r.stream,
            "status": r.status,
            "durationMs": round(r.duration_ms, 3),
            "encoding": r.encoding,
            "memories": r.memories,
            "clampError": r.clamp_error,
            "upstreamError": r.upstream_error,
            "segmentsSeen": len(segments),
            "clamped": len(acted),
            "wouldClamp": len(would),
            "savedChars": sum(s["saved"] for s in acted),
            "savedTokens": saved_tokens,
            "wouldSaveChars": sum(s["saved"] for s in would),
            "wouldSaveTokens": would_tokens,
            "inputPricePerMTok": None if r.input_price is None else round(r.input_price * 1e6, 6),
            "savedUsd": usd(saved_tokens, r.input_price),
            "wouldSaveUsd": usd(would_tokens, r.input_price),
            "segments": segments,
            **r.extra,
        }

    # -- reading -------------------------------------------------------------------------

    def _read(self, sql: str, args: Iterable[Any] = ()) -> list[Any]:
        with self._read_lock:
            return self._db.execute(sql, tuple(args)).fetchall()

    def request(self, request_id: str) -> dict[str, Any] | None:
        """One request's record, as written (any run)."""
        rows = self._read("SELECT body FROM requests WHERE id = ?", (request_id,))
        return orjson.loads(rows[0][0]) if rows else None

    def summary(self, *, recent: int) -> dict[str, Any]:
        """Totals for the latest run, and its `recent` latest requests."""
        return read_summary(self._read, recent=recent)


def read_summary(read: Any, *, recent: int) -> dict[str, Any]:
    """Totals and recent requests of the latest run, through `read(sql, args) -> rows`."""
    runs = read("SELECT run, started FROM runs ORDER BY started DESC, run DESC LIMIT 1")
    if not runs:
        return {"run": None, "since": None, "totals": _empty_totals(), "recent": []}
    run, started = runs[0]
    totals = _empty_totals()
    counts = read(
        "SELECT requests, clamp_errors, upstream_errors, unpriced FROM run_counts WHERE run = ?",
        (run,),
    )
    if counts:
        (
            totals["requests"],
            totals["clampErrors"],
            totals["upstreamErrors"],
            totals["unpricedRequests"],
        ) = counts[0]
    for row in read(
        "SELECT kind, seen, clamped, would_clamp, chars_before, chars_after, saved_chars, "
        "saved_tokens, would_save_chars, would_save_tokens, saved_usd, would_save_usd "
        "FROM totals WHERE run = ?",
        (run,),
    ):
        kind = dict(
            zip(
                (
                    "seen",
                    "clamped",
                    "wouldClamp",
                    "charsBefore",
                    "charsAfter",
                    "savedChars",
                    "savedTokens",
                    "wouldSaveChars",
                    "wouldSaveTokens",
                    "savedUsd",
                    "wouldSaveUsd",
                ),
                row[1:],
                strict=True,
            )
        )
        totals["byKind"][row[0]] = kind
        for key, value in kind.items():
            totals[key] += value
    rows = read("SELECT body FROM requests WHERE run = ? ORDER BY ts DESC LIMIT ?", (run, recent))
    return {
        "run": run,
        "since": started,
        "totals": totals,
        "recent": [orjson.loads(r[0]) for r in rows],
    }


def segment_tokens_saved(tokens: TokenCounter, segment: Segment, encoding: str) -> int:
    """Tokens a clamp saved (or would save) on `segment`: before minus after."""
    if segment.action == "kept" or segment.saved <= 0:
        return 0
    return max(
        0, tokens.count(segment.original, encoding) - tokens.count(segment.clamped, encoding)
    )


def usd(tokens: int, price: float | None) -> float | None:
    """`tokens` of input at `price` USD per token (unrounded: sums stay exact to display)."""
    return None if price is None else tokens * price


def _empty_totals() -> dict[str, Any]:
    zero = {
        "seen": 0,
        "clamped": 0,
        "wouldClamp": 0,
        "charsBefore": 0,
        "charsAfter": 0,
        "savedChars": 0,
        "savedTokens": 0,
        "wouldSaveChars": 0,
        "wouldSaveTokens": 0,
        "savedUsd": 0.0,
        "wouldSaveUsd": 0.0,
    }
    return {
        "requests": 0,
        "clampErrors": 0,
        "upstreamErrors": 0,
        "unpricedRequests": 0,
        **zero,
        "byKind": {kind: dict(zero) for kind in SEGMENT_KINDS},
    }
