"""The report of a growing conversation (issue 34): request N+1 resends request N's segments,
and each is counted, described and summed once, when first seen (`proxy/report/tally.py`);
what `/context/budget`, the headers and the totals say is what each request alone says."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from ctxbudget.caps import Segment
from ctxbudget.memory.pg import PgDatabase, migrate
from ctxbudget.proxy.cache.resent import RESENT
from ctxbudget.proxy.report.record import RequestRecord, report_entry
from ctxbudget.proxy.report.store import MIGRATIONS, ReportStore
from ctxbudget.proxy.report.tally import CHUNK, STRIDE, tally
from ctxbudget.proxy.tokens import TokenCounter
from tests.fakes import FakeUpstream, answer_in
from tests.inproc import InProcess, cutting_config, proxy_app, state_of

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench._growing import BUILDERS  # noqa: E402

PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages"}
SEGMENT_FIELDS = (
    "segments",
    "segmentsSeen",
    "clamped",
    "wouldClamp",
    "savedChars",
    "savedTokens",
    "wouldSaveChars",
    "wouldSaveTokens",
    "savedUsd",
    "wouldSaveUsd",
    "inputPricePerMTok",
)
"""What a report entry says of its segments (the rest is the session's: busts, money)."""
HEADERS = ("clamped", "saved-chars", "saved-tokens", "gross-saved-usd", "would-clamp")
HEADERS += ("would-save-chars", "would-save-tokens", "gross-would-save-usd")


def _config(tmp_path: Path, enabled: bool) -> dict[str, Any]:
    return cutting_config(tmp_path, enabled=enabled)


def _send(client: InProcess, fake: FakeUpstream, wire: str, raw: bytes) -> tuple[str, dict]:
    answer_in(fake, wire)
    r = client.post(PATHS[wire], content=raw)
    assert r.status_code == 200, r.text
    headers = {h: r.headers.get(f"x-context-budget-{h}") for h in HEADERS}
    return r.headers["x-context-budget-request-id"], headers


def _seen(client: InProcess, request_id: str) -> dict[str, Any]:
    reports = state_of(client).reports
    reports.flush()
    found = reports.request(request_id)
    assert found is not None
    return {k: found[k] for k in SEGMENT_FIELDS}


def _totals(client: InProcess) -> dict[str, Any]:
    reports = state_of(client).reports
    reports.flush()
    totals = reports.summary(recent=0)["totals"]
    return {k: v for k, v in totals.items() if k not in ("summaries", "money")}


def _added(into: dict[str, Any], more: dict[str, Any]) -> None:
    for key, value in more.items():
        if isinstance(value, dict):
            _added(into.setdefault(key, {}), value)
        else:
            into[key] = into.get(key, 0) + value


@pytest.mark.parametrize(("wire", "enabled"), [("chat", True), ("chat", False), ("messages", True)])
def test_a_grown_conversations_report_is_each_requests_report_alone(
    tmp_path: Path, wire: str, enabled: bool
) -> None:
    """One app, which carries each request's tally to the next of its conversation, against
    a fresh app for each request: every entry's segments and sums, every header, and the
    totals added up are the same."""
    bodies = BUILDERS[wire][1](24)
    grown: list[tuple[dict[str, Any], dict[str, Any]]] = []
    (tmp_path / "kept").mkdir()
    with proxy_app(tmp_path / "kept", _config(tmp_path / "kept", enabled)) as (client, fake):
        for raw in bodies:
            request_id, headers = _send(client, fake, wire, raw)
            grown.append((_seen(client, request_id), headers))
        grown_totals = _totals(client)
    fresh_totals: dict[str, Any] = {}
    for n, raw in enumerate(bodies):
        folder = tmp_path / f"fresh-{n}"
        folder.mkdir()
        with proxy_app(folder, _config(folder, enabled)) as (client, fake):
            request_id, headers = _send(client, fake, wire, raw)
            assert (_seen(client, request_id), headers) == grown[n], f"request {n}"
            _added(fresh_totals, _totals(client))
    _same(grown_totals, fresh_totals)
    action = "clamped" if enabled else "would-clamp"
    assert any(s["action"] == action for s in grown[-1][0]["segments"])  # it clamped


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Nested totals equal: counts exactly, money to the float's last digits (summed in
    another order)."""
    assert a.keys() == b.keys()
    for key, value in a.items():
        if isinstance(value, dict):
            _same(value, b[key])
        elif isinstance(value, float):
            assert value == pytest.approx(b[key], rel=1e-12), key
        else:
            assert value == b[key], key


class _Reads:
    """Reads of a segment's saving (`Segment.saved`): what the headers, the token counts, the
    report's entries and its sums each look at, on the request path and the writer thread."""

    def __init__(self) -> None:
        self.count = 0

    def reset(self) -> None:
        self.count = 0


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Reads]:
    found = _Reads()
    real = Segment.saved

    def saved(self: Segment) -> int:
        found.count += 1
        return real.fget(self)  # type: ignore[misc, no-any-return]

    monkeypatch.setattr(Segment, "saved", property(saved))
    # as in production: the test suite's re-check of every reuse works the whole list again
    monkeypatch.setattr(RESENT, "check", False)
    yield found


@pytest.mark.parametrize("wire", ["chat", "messages"])
def test_turn_300_looks_only_at_its_new_segments(tmp_path: Path, wire: str, reads: _Reads) -> None:
    """Request N+1 adds a tool call and its result to a conversation of ~140 messages and
    ~55 segments: its headers, token counts, report entry and totals look at the new
    segment, not the ones request N had (read again, they would be ~3 reads each: what is
    looked at grows by the segment, so turn 66 shows it as turn 300 did, at a sixth of the
    requests' bytes)."""
    # the last a command's output, over its cap (not a user's turn: every tenth)
    bodies = BUILDERS[wire][1](66)
    with proxy_app(tmp_path, _config(tmp_path, True)) as (client, fake):
        for raw in bodies[:-1]:
            _send(client, fake, wire, raw)
        state_of(client).reports.flush()
        reads.reset()
        request_id, _ = _send(client, fake, wire, bodies[-1])
        state_of(client).reports.flush()
        looked = reads.count
        seen = _seen(client, request_id)
    assert seen["segmentsSeen"] > 50 and seen["clamped"] > 30
    assert looked > 0  # the new one was
    # the new segments (a result, and Messages' last newest one: its item is other bytes
    # now), each counted, described and summed; and at most a checkpoint's stride of old
    # ones summed again
    assert looked <= 3 * 3 + STRIDE, looked


def _rows(path: Path, sql: str, *args: object) -> list[Any]:
    """Rows of the report's SQLite file, as another program reads them."""
    with sqlite3.connect(path) as conn:
        return conn.execute(sql, args).fetchall()


@pytest.mark.parametrize("wire", ["chat", "messages"])
def test_turn_300_writes_what_turn_30_does(tmp_path: Path, wire: str) -> None:
    """The stored row of request N+1 holds its newest segments only, however long the
    history: its first ones are in the conversation's chunks, written once (a row at turn
    300 was 47 KB, at turn 30 7 KB); reading it gives the whole entry. Turn 66 has a chunk
    and more of its ~55 segments: a row holding them all shows there as at turn 300."""
    bodies = BUILDERS[wire][1](66)
    with proxy_app(tmp_path, _config(tmp_path, True)) as (client, fake):
        for raw in bodies[:-1]:
            _send(client, fake, wire, raw)
        state_of(client).reports.flush()
        chunks = _rows(tmp_path / "report.db", "SELECT count(*) FROM segment_chunks")[0][0]
        request_id, _ = _send(client, fake, wire, bodies[-1])
        seen = _seen(client, request_id)
        [(size, text)] = _rows(
            tmp_path / "report.db", "SELECT length(body), body FROM requests WHERE id = ?",
            request_id,
        )  # fmt: skip
        more = _rows(tmp_path / "report.db", "SELECT count(*) FROM segment_chunks")[0][0]
    assert len(seen["segments"]) == seen["segmentsSeen"] > CHUNK + 16
    assert len(orjson.loads(text)["segments"]) < CHUNK  # the rest in the chunks
    assert size < 12_000, size  # the entry's fields and fewer than CHUNK segments (all: ~16 KB)
    assert more - chunks <= 1  # at most the chunk it completed


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Path | PgDatabase]:
    """Where a report store keeps its data: a SQLite file, or a PostgreSQL database."""
    if request.param == "sqlite":
        return lambda: tmp_path / "r.db"
    url = request.getfixturevalue("pg_url")
    return lambda: PgDatabase(url)


def _grown(turns: int, *, first: int = 0) -> list[RequestRecord]:
    """One conversation's records, each resending the last one's segments and adding one,
    their tallies carried as the pipeline carries them."""
    segments: list[Segment] = []
    records, previous = [], None
    for n in range(first, first + turns):
        segments.append(
            Segment(
                kind="tool_output",
                label=f"exec call_{n}",
                before=1000 + n,
                after=200,
                action="clamped",
                cap=200,
                message_index=2 * n,
                tool="exec",
                call_id=f"call_{n}",
            )  # fmt: skip
        )
        made = tally(
            segments, key=(), enabled=True, price=2.5e-6, saved_tokens=lambda s: s.saved // 4,
            previous=previous,
        )  # fmt: skip
        previous = made
        records.append(
            RequestRecord(
                id=f"cb-{n}",
                ts=1_800_000_000.0 + n,
                model="gpt-4o",
                enabled=True,
                stream=False,
                status=200,
                duration_ms=1.0,
                segments=made.segments,
                segment_tokens=made.tokens,
                encoding="o200k_base",
                input_price=2.5e-6,
                tally=made,
            )  # fmt: skip
        )
    return records


def _whole(record: RequestRecord) -> list[dict[str, Any]]:
    segments: list[dict[str, Any]] = report_entry(record, TokenCounter())["segments"]
    return segments


def test_a_grown_conversations_entries_read_back_whole(
    where: Callable[[], Path | PgDatabase],
) -> None:
    """Entries whose first segments are in chunks shared by their conversation read back
    whole, one by id and in the recent list, on either database; the chunks no kept request
    names are pruned with the requests."""
    records = _grown(80)
    store = ReportStore(where(), run="r", keep_requests=30)
    for record in records:
        store.add(record)
        store.flush()
    for record in records[-30:]:
        found = store.request(record.id)
        assert found is not None and found["segments"] == _whole(record), record.id
    recent = store.summary(recent=5)["recent"]
    assert [r["segments"] for r in recent] == [_whole(r) for r in reversed(records[-5:])]
    assert store.request(records[0].id) is None  # pruned: past the 30 kept
    fetch = store._db.fetchall  # noqa: SLF001 - the rows at rest
    named = {c for (cs,) in fetch("SELECT chunks FROM requests", []) for c in cs.split()}
    stored = {c for (c,) in fetch("SELECT id FROM segment_chunks", [])}
    assert stored == named and len(stored) == 2  # 80 segments: two whole chunks of 32
    store.close()


def _schema_9(where: Path | PgDatabase) -> None:
    """The report's database at schema 9, with one request of the conversation written then
    (its row holds all its segments)."""
    old = [m for m in MIGRATIONS if m.version <= 9]
    if isinstance(where, PgDatabase):
        migrate(where, "report", old)
        execute = where.execute
    else:
        db = sqlite3.connect(where, isolation_level=None)
        for step in old:
            for statement in (step.sqlite or "").split(";"):
                if statement.strip():
                    db.execute(statement)
        db.execute("PRAGMA user_version=9")
        execute = db.execute  # type: ignore[assignment]
    [record] = _grown(40)[-1:]
    text = orjson.dumps(report_entry(record, TokenCounter())).decode()
    execute(
        "INSERT INTO requests (id, run, owner, ts, body) VALUES (?, 'old', 'default', ?, ?)",
        (record.id, record.ts, text),
    )
    if not isinstance(where, PgDatabase):
        db.close()
    else:
        where.close()


def test_a_schema_9_report_is_upgraded_and_reads_its_rows_as_written(
    where: Callable[[], Path | PgDatabase],
) -> None:
    """A report written before chunks (schema 9) opens: its rows read back as they were, and
    the requests written after it keep their first segments in chunks."""
    _schema_9(where())
    store = ReportStore(where(), run="r")
    old = _grown(40)[-1]
    found = store.request(old.id)
    assert found is not None and found["segments"] == _whole(old)
    later = _grown(30, first=100)
    for record in later:
        store.add(record)
    store.flush()
    recent = store.summary(recent=31)["recent"]
    assert [r["segments"] for r in recent] == [_whole(r) for r in [*reversed(later), old]]
    named = store._db.fetchall(  # noqa: SLF001 - the rows at rest
        "SELECT count(*) FROM requests WHERE chunks <> ''", []
    )
    assert named[0][0] == 0  # 30 segments: not one whole chunk yet
    store.close()
