from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ctxbudget.caps import Segment
from ctxbudget.memory.pg import DatabaseUnavailable, PgDatabase
from ctxbudget.proxy.report import ReportStore, RequestRecord, build_report, render_text
from ctxbudget.proxy.report import store as report_module
from ctxbudget.proxy.report.page import render_html
from ctxbudget.proxy.report.record import HoldoutMark
from ctxbudget.proxy.report.usage import Usage
from tests.held import SLACK, held
from tests.pg import postgres_cluster

Where = Callable[[], Path | PgDatabase]


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    """Where a report store keeps its data, each call as another process would open it: the
    same SQLite file, or the same PostgreSQL database through a pool of its own."""
    if request.param == "sqlite":
        return lambda: tmp_path / "r.db"
    url = request.getfixturevalue("pg_url")
    return lambda: PgDatabase(url)


_SETTINGS = {
    "enabled": True,
    "config": {"path": None, "loadedAt": "2026-11-22T00:00:00Z", "error": None},
    "caps": {
        "web_fetch": {"value": 200, "source": "contextBudget.webFetchMaxChars", "from": "file"}
    },
    "encoding": "o200k_base",
}


def _sql(store: ReportStore, sql: str, args: tuple[object, ...]) -> None:
    """One statement on the store's database, as another program would run it."""
    if store.path is not None:
        with sqlite3.connect(store.path) as conn:
            conn.execute(sql, args)
    else:
        store._db.execute(sql, args)  # type: ignore[union-attr]


def _record(i: int, *, action: str = "clamped") -> RequestRecord:
    seg = Segment(
        kind="web_fetch",
        label=f"web_fetch call{i} https://example.com",
        before=1000,
        after=200,
        action=action,  # type: ignore[arg-type]
        cap=200,
        original="lorem ipsum " * 80,
        clamped="lorem ipsum " * 16,
    )
    kept = Segment(
        kind="bootstrap", label="/ws/SOUL.md", before=19, after=19, action="kept", cap=8000
    )
    return RequestRecord(
        id=f"cb-{i}",
        ts=time.time() + i,
        model="gpt-4o",
        enabled=action == "clamped",
        stream=False,
        status=200,
        duration_ms=1.0,
        segments=(seg, kept),
        encoding="o200k_base",
    )


def test_totals_and_recent_requests(where: Where) -> None:
    store = ReportStore(where(), run="run-1")
    for i in range(3):
        store.add(_record(i))
    store.add(_record(3, action="would-clamp"))
    store.flush()
    summary = store.summary(recent=2)
    totals = summary["totals"]
    assert totals["requests"] == 4
    assert totals["seen"] == 8
    assert totals["clamped"] == 3 and totals["wouldClamp"] == 1
    assert totals["savedChars"] == 3 * 800 and totals["wouldSaveChars"] == 800
    assert totals["byKind"]["web_fetch"]["savedTokens"] == 3 * 128
    assert totals["byKind"]["bootstrap"] == {
        **totals["byKind"]["bootstrap"],
        "seen": 4,
        "clamped": 0,
        "savedChars": 0,
    }
    assert [r["id"] for r in summary["recent"]] == ["cb-3", "cb-2"]
    assert store.request("cb-1")["segments"][0]["savedTokens"] == 128  # type: ignore[index]
    assert store.request("nope") is None
    store.close()


def test_a_second_store_on_the_same_file_sees_the_same_run(where: Where) -> None:
    """Two workers share one file: each sees the other's requests."""
    one = ReportStore(where(), run="shared", started=1.0)
    two = ReportStore(where(), run="shared", started=1.0)
    one.add(_record(1))
    two.add(_record(2))
    one.flush()
    two.flush()
    assert one.summary(recent=10)["totals"]["requests"] == 2
    assert len(two.summary(recent=10)["recent"]) == 2
    one.close()
    two.close()


def test_text_report_lists_segments_and_totals(where: Where) -> None:
    store = ReportStore(where(), run="r")
    store.add(_record(1))
    store.flush()
    settings = {
        "enabled": True,
        "config": {"path": None, "loadedAt": "2026-11-22T00:00:00Z", "error": None},
        "caps": {
            "web_fetch": {"value": 200, "source": "contextBudget.webFetchMaxChars", "from": "file"}
        },
        "encoding": "o200k_base",
    }
    text = render_text(build_report(store.summary(recent=5), settings=settings))
    assert "\nContext budget: ON" in text
    assert "- web fetch: 200 per result — from contextBudget.webFetchMaxChars (file)" in text
    assert ": 1 request, 2 segments seen, 1 clamped" in text
    assert "  - web_fetch web_fetch call1 https://example.com: 1,000 → 200 clamped" in text
    store.close()


def test_a_version_1_report_file_is_upgraded_and_keeps_its_totals(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    db = sqlite3.connect(path, isolation_level=None)
    for statement in report_module._SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)
    db.execute("PRAGMA user_version=1")
    db.execute("INSERT INTO runs VALUES ('old', ?)", (time.time() - 7200,))
    db.execute("INSERT INTO run_counts (run, requests) VALUES ('old', 7)")
    db.execute("INSERT INTO totals (run, kind, saved_chars) VALUES ('old', 'web_fetch', 900)")
    db.close()
    store = ReportStore(path, run="old")
    totals = store.summary(recent=5)["totals"]
    assert (totals["requests"], totals["savedChars"], totals["savedUsd"]) == (7, 900, 0.0)
    store.add(dataclasses.replace(_record(1), input_price=2.5e-6))
    store.flush()
    totals = store.summary(recent=5)["totals"]
    assert totals["requests"] == 8 and totals["savedUsd"] > 0
    store.close()
    version = sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0]
    assert version == report_module.SCHEMA_VERSION == 10
    # rows from before owners existed are `default`'s: no proxy key's owner sees them
    reopened = ReportStore(path, run="old")
    assert reopened.summary(recent=5, owner="default")["totals"]["requests"] == 8
    assert reopened.summary(recent=5, owner="alice")["totals"]["requests"] == 0
    reopened.close()


def test_client_text_no_database_takes_is_stored_as_u_fffd_and_costs_no_one_their_records(
    where: Where,
) -> None:
    """A lone surrogate (JSON's `\\ud800`) or a NUL in the model, session id or a label: the
    report shows U+FFFD there, every surface of it still renders, and the rest of the batch
    (another owner's requests) is written (issue 24, items 4 and 5)."""
    store = ReportStore(where(), run="r")
    for i in range(5):
        store.add(dataclasses.replace(_record(i), owner="alice", session="a"))
    seg = dataclasses.replace(_record(5).segments[0], label="web_fetch \ud800 \x00")
    store.add(
        dataclasses.replace(
            _record(5),
            owner="bob",
            model="gpt\ud800\x00",
            session="s\udfff",
            note="n\x00",
            segments=(seg,),
        )
    )
    store.flush()
    assert [(s["id"], s["model"]) for s in store.summary(recent=1, owner="bob")["sessions"]] == [
        ("s\ufffd", "gpt\ufffd\ufffd")
    ]
    assert store.summary(recent=10, owner="alice")["totals"]["requests"] == 5
    bobs = store.request("cb-5", owner="bob")
    assert bobs is not None
    assert (bobs["model"], bobs["note"]) == ("gpt\ufffd\ufffd", "n\ufffd")
    assert bobs["segments"][0]["label"] == "web_fetch \ufffd \ufffd"
    summary = store.summary(recent=10)
    assert len(summary["recent"]) == 6 and store.lost == 0
    report = build_report(summary, settings=_SETTINGS)
    json.dumps(report, ensure_ascii=False).encode()  # what JSONResponse does: no surrogate left
    render_text(report).encode()
    render_html(report).encode()
    # an id no request can have is simply not there (PostgreSQL refuses a NUL in a query)
    assert store.request("cb-\x00") is None and store.request("\ud800") is None
    store.close()


def test_an_entry_stored_with_a_lone_surrogate_before_the_fix_reads_back_as_u_fffd(
    where: Where,
) -> None:
    """Entries written by earlier versions kept the surrogate escaped in their JSON; reading
    one must not break the report for the 90 days it is kept (issue 24, item 4)."""
    store = ReportStore(where(), run="r")
    store.add(_record(1))
    store.flush()
    entry = store.request("cb-1")
    assert entry is not None
    old = json.dumps({**entry, "model": "gpt\ud800"})  # as dumps_entry fell back to the stdlib
    assert "\\ud800" in old
    _sql(store, "UPDATE requests SET body = ? WHERE id = 'cb-1'", (old,))
    assert store.request("cb-1")["model"] == "gpt\ufffd"  # type: ignore[index]
    report = build_report(store.summary(recent=5), settings=_SETTINGS)
    assert report["recent"][0]["model"] == "gpt\ufffd"
    json.dumps(report, ensure_ascii=False).encode()
    store.close()


def test_a_batch_the_database_refuses_is_written_one_by_one_and_only_the_bad_record_is_lost(
    where: Where,
) -> None:
    """An upstream's usage past a 64-bit integer fails its batch's transaction; the others in
    the batch (another owner's) are written again one by one, and the lost one is counted for
    its owner only (issue 24, items 5 and 12)."""
    store = ReportStore(where(), run="r", batch_seconds=0.5)  # all in one batch
    for i in range(20):
        store.add(dataclasses.replace(_record(i), owner="alice", session=f"a{i % 3}"))
    huge = Usage(input=2**63, cache_read=0, cache_write=0, output=1)
    store.add(dataclasses.replace(_record(20), owner="mallory", session="m", usage=huge))
    store.flush()
    assert store.summary(recent=50, owner="alice")["totals"]["requests"] == 20
    assert store.summary(recent=50, owner="alice")["lost"] == 0, "not another owner's loss"
    assert store.summary(recent=50, owner="mallory")["lost"] == 1
    assert store.summary(recent=50)["lost"] == 1 and store.request("cb-20") is None
    store.add(_record(21))
    store.flush()
    assert store.request("cb-21") is not None, "the writer goes on"
    store.close()


def test_one_owners_traffic_does_not_prune_anothers_records(where: Where) -> None:
    store = ReportStore(where(), run="r", keep_requests=3)
    for i in range(3):
        store.add(dataclasses.replace(_record(i), owner="alice"))
    store.flush()
    for i in range(3, 20):
        store.add(dataclasses.replace(_record(i), owner="bob"))
        store.flush()
    assert [r["id"] for r in store.summary(recent=10, owner="alice")["recent"]] == [
        "cb-2",
        "cb-1",
        "cb-0",
    ]
    bobs = [r["id"] for r in store.summary(recent=50, owner="bob")["recent"]]
    # pruned every 3 writes to the latest 4 (ts >= the 4th newest): never more than 6
    assert len(bobs) <= 6 and bobs[0] == "cb-19"
    store.close()


def test_the_report_spans_restarts_and_instances_and_a_window(where: Where) -> None:
    now = time.time()
    earlier = ReportStore(where(), run="monday", started=now - 5 * 86_400)
    earlier.add(dataclasses.replace(_record(1), ts=now - 5 * 86_400))
    earlier.close()  # that proxy stopped
    first = ReportStore(where(), run="a", started=now - 60)
    second = ReportStore(where(), run="b", started=now - 30)  # another instance, same file
    first.add(dataclasses.replace(_record(2), ts=now - 2 * 3600))
    second.add(dataclasses.replace(_record(3), ts=now))
    first.flush()
    second.flush()
    everything = second.summary(recent=10)
    assert everything["totals"]["requests"] == 3 and everything["runs"] == 3
    assert {r["id"] for r in everything["recent"]} == {"cb-1", "cb-2", "cb-3"}
    assert everything["since"] == (now - 5 * 86_400) // 3600 * 3600
    day = first.summary(recent=10, since=now - 86_400)
    assert day["totals"]["requests"] == 2 and [r["id"] for r in day["recent"]] == ["cb-3", "cb-2"]
    hour = first.summary(recent=10, since=now - 60)
    assert hour["totals"]["requests"] == 1 and hour["totals"]["savedChars"] == 800
    first.close()
    second.close()


def test_history_past_keep_days_is_pruned(where: Where) -> None:
    now = time.time()
    store = ReportStore(where(), run="r", keep_days=1)
    store.add(dataclasses.replace(_record(1), ts=now - 3 * 86_400))
    store.flush()
    store.close()
    again = ReportStore(where(), run="r2", keep_days=1)
    again.add(dataclasses.replace(_record(2), ts=now))
    again.flush()
    summary = again.summary(recent=10)
    assert summary["totals"]["requests"] == 1 and [r["id"] for r in summary["recent"]] == ["cb-2"]
    assert again.request("cb-1") is None
    again.close()


def test_a_version_3_file_moves_each_runs_totals_to_the_hour_it_started(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    db = sqlite3.connect(path, isolation_level=None)
    for statement in report_module._SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)
    for upgrade in report_module._UPGRADES[:2]:
        for statement in upgrade.split(";"):
            db.execute(statement)
    db.execute("PRAGMA user_version=3")
    started = time.time() - 3 * 3600
    db.execute("INSERT INTO runs VALUES ('old', ?), ('older', ?)", (started, started - 86_400))
    db.execute("INSERT INTO run_counts (run, owner, requests) VALUES ('old', 'alice', 4)")
    db.execute("INSERT INTO run_counts (run, owner, requests) VALUES ('older', 'alice', 6)")
    db.execute(
        "INSERT INTO totals (run, owner, kind, saved_chars) VALUES ('old', 'alice', 'memory', 90)"
    )
    db.close()
    store = ReportStore(path, run="new")
    everything = store.summary(recent=5)["totals"]
    assert everything["requests"] == 10 and everything["byKind"]["memory"]["savedChars"] == 90
    recent = store.summary(recent=5, since=started)["totals"]
    assert recent["requests"] == 4  # the older run started a day before
    store.close()


@pytest.mark.e2e  # stops a PostgreSQL server of its own
def test_records_wait_through_a_database_outage_and_are_written_when_it_answers() -> None:
    """A short outage loses no record: they are kept (bounded) and written when the database
    answers again; past the bound the oldest are dropped and counted (issue 24, item 7)."""
    with postgres_cluster() as cluster:  # a cluster of its own: this test stops it
        url = cluster.new_database()
        store = ReportStore(PgDatabase(url, connect_timeout=1), run="r")
        store.add(_record(0))
        store.flush()
        cluster.stop()
        for i in range(1, 6):
            store.add(_record(i))
        store.flush(timeout=30)  # returns once a write was tried
        assert store.lost == 0
        # kept as text only while they wait (PENDING_BYTES counts the text)
        assert store._pending and all(e.body is None for e in store._pending)
        cluster.start()
        summary = _written(store, 6)
        assert summary["totals"]["requests"] == 6 and summary["lost"] == 0
        size = len(_entry_text(store))
        cluster.stop()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(report_module, "PENDING_BYTES", 3 * size + 100)
            for i in range(6, 12):
                store.add(dataclasses.replace(_record(i), owner=f"o{i % 2}"))
            store.flush(timeout=5)
            cluster.start()
            summary = _written(store, 9)
        assert summary["totals"]["requests"] == 9, "the 3 newest kept"
        assert summary["lost"] == 3
        assert [r["id"] for r in summary["recent"][:3]] == ["cb-11", "cb-10", "cb-9"]
        store.close()


@pytest.mark.e2e  # stops a PostgreSQL server of its own
def test_records_kept_while_the_database_was_down_from_the_start_are_kept_as_text() -> None:
    # PENDING_BYTES bounds the text of what waits; an entry's dict (~4x its text) must not
    # stay beside it, also when the tables could not even be created yet
    with postgres_cluster() as cluster:
        url = cluster.new_database()
        cluster.stop()
        store = ReportStore(PgDatabase(url, connect_timeout=1), run="r")
        for i in range(3):
            store.add(_record(i))
        store.flush(timeout=30)  # returns once a write was tried
        assert len(store._pending) == 3 and all(e.body is None for e in store._pending)
        cluster.start()
        assert _written(store, 3)["totals"]["requests"] == 3
        store.close()


def _written(store: ReportStore, requests: int) -> dict[str, Any]:
    """The summary once `requests` are written (the database just started: its first answer
    may take a retry), or after 15 s."""
    deadline = time.monotonic() + 15
    while True:
        store.flush()
        try:
            summary = store.summary(recent=20)
        except DatabaseUnavailable:
            continue
        if summary["totals"]["requests"] >= requests or time.monotonic() > deadline:
            return summary


def _entry_text(store: ReportStore) -> str:
    found = store.request("cb-0")
    assert found is not None
    return json.dumps(found)


def test_a_loss_is_shown_plainly_with_a_minus_sign() -> None:
    """Issue 23: a negative saving printed as `$-0.000060`."""
    from ctxbudget.proxy.report.render import headline, money, net_text

    assert money(-0.00006) == "−$0.000060" and money(0.00006) == "$0.000060"
    assert money(-4e-9) == "$0.000000"  # rounds to nothing: no sign
    loss = {
        "sessions": 1,
        "billedRequests": 2,
        "savedUsd": -0.00006,
        "costUsd": 0.01006,
        "withoutCtxbudgetUsd": 0.01,
    }
    assert net_text(loss, 2) == (
        "saved −$0.000060 net of cache effects over 1 session: ctxbudget cost more than it "
        "saved (memories injected, cache busts)"
    )
    assert headline({"totals": {"requests": 2, "money": loss}}).startswith(
        "📉 ctxbudget saved −$0.000060 net of cache effects over 1 session"
    )
    assert net_text(None, 0) == "saved nothing yet: no requests kept"
    unbilled = {**loss, "billedRequests": 0}
    assert net_text(unbilled, 3) == "net saving unknown over 3 requests: no provider usage read yet"


def test_a_batch_adds_to_its_sessions_as_its_requests_one_by_one_would(tmp_path: Path) -> None:
    """The writer adds a batch to each session's row in one statement: the row is the one a
    statement a request gave (sums, first and last, the last model given)."""
    usage = Usage(input=1000, cache_read=4000, cache_write=500, output=20)

    def records() -> list[RequestRecord]:
        out = []
        for i in range(12):
            r = dataclasses.replace(
                _record(i),
                owner="alice",
                session=f"s{i % 2}",
                usage=usage,
                model=None if i == 10 else f"model-{i}",
            )
            out.append(r)
        return out

    def sessions(store: ReportStore) -> list[tuple[Any, ...]]:
        assert store.path is not None
        with sqlite3.connect(store.path) as conn:
            return conn.execute("SELECT * FROM sessions ORDER BY id").fetchall()

    made = records()
    one_by_one = ReportStore(tmp_path / "one.db", run="r")
    for r in made:
        one_by_one.add(r)
        one_by_one.flush()
    batched = ReportStore(tmp_path / "batch.db", run="r", batch_seconds=5)
    for r in made:
        batched.add(r)
    batched.flush()
    expected, got = sessions(one_by_one), sessions(batched)
    one_by_one.close()
    batched.close()
    assert len(got) == 2
    assert _rounded(got) == _rounded(expected)


def _rounded(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [tuple(round(v, 12) if isinstance(v, float) else v for v in row) for row in rows]


def test_a_segment_sent_again_has_the_entry_of_its_own_tokens_and_price() -> None:
    """The same segment with other tokens or another price gets its own figures, and the
    report's module keeps nothing of a record once it is gone: what a conversation carries
    is on its state (`Conversation.tally`), within the conversations' bound."""
    from ctxbudget.proxy.report.record import report_entry
    from ctxbudget.proxy.tokens import TokenCounter

    tokens = TokenCounter()
    segment = Segment(kind="web_fetch", label="u", before=900, after=400, action="clamped", cap=400)

    def entry(saved: int, price: float | None, s: Segment = segment) -> dict[str, Any]:
        record = RequestRecord(
            id="r", ts=0.0, model="m", enabled=True, stream=False, status=200,
            duration_ms=1.0, segments=(s,), encoding="o200k_base",
            segment_tokens=(saved,), input_price=price,
        )  # fmt: skip
        found: dict[str, Any] = report_entry(record, tokens)["segments"][0]
        return found

    assert entry(100, 1e-6)["savedUsd"] == pytest.approx(1e-4)
    assert entry(120, 1e-6)["savedTokens"] == 120
    assert entry(100, 2e-6)["savedUsd"] == pytest.approx(2e-4)
    assert entry(100, None)["savedUsd"] is None
    big = "中" * 500_000  # 1 MB of text in memory
    with held() as kept:
        for i in range(64):  # segments of 1 MB texts and 1 MB URLs, each gone after its record
            entry(i, None, Segment(
                kind="tool_output", label=f"t{i}", before=1, after=0, action="clamped", cap=0,
                original=big + str(i), clamped="", call_id=f"call_{i}",
                url="https://example.com/" + "a" * (1 << 20) + str(i),
            ))  # fmt: skip
    assert kept.bytes <= SLACK


# Each owner keeps a bounded number of session and holdout rows: a key that starts a new
# session (or conversation) on every request must not grow the database without end, and
# must never push out another key's rows.


def _flood_record(i: int, owner: str, at: float) -> RequestRecord:
    return RequestRecord(
        id=f"cb-{owner}-{i}",
        ts=at,
        model="gpt-4o",
        enabled=True,
        stream=False,
        status=200,
        duration_ms=1.0,
        segments=(),
        encoding="o200k_base",
        owner=owner,
        session=f"s-{owner}-{i}",
        holdout=HoldoutMark(conversation=f"c-{owner}-{i}", arm="budget"),
    )


def test_a_flood_of_new_sessions_keeps_each_owners_newest_rows(where: Where) -> None:
    store = ReportStore(where(), run="t", keep_requests=5, keep_conversations=20)
    now = time.time()
    for i in range(3):
        store.add(_flood_record(i, "bob", now + i))
    store.flush()
    for i in range(400):  # past the cap many times over, written in several batches
        store.add(_flood_record(i, "mallory", now + 10 + i))
        if i % 50 == 49:
            store.flush()
    store.flush()
    db = store._db  # the rows as any reader of the database sees them

    def rows(table: str, owner: str) -> int:
        return int(db.fetchall(f"SELECT COUNT(*) FROM {table} WHERE owner = ?", (owner,))[0][0])

    try:
        for table in ("sessions", "arms"):
            # the cap, plus the writes between two prunes (`keep_requests`)
            assert rows(table, "mallory") <= 20 + 5
            assert rows(table, "bob") == 3  # another key's rows stay
        newest = db.fetchall(
            "SELECT conversation FROM arms WHERE owner = ? ORDER BY last DESC LIMIT 1",
            ("mallory",),
        )
        assert newest[0][0] == "c-mallory-399"  # the newest are the ones kept
    finally:
        store.close()
