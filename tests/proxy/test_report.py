from __future__ import annotations

import dataclasses
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from caps import Segment
from memory.pg import PgDatabase
from proxy.report import ReportStore, RequestRecord, build_report, render_text
from proxy.report import store as report_module

Where = Callable[[], Path | PgDatabase]


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    """Where a report store keeps its data, each call as another process would open it: the
    same SQLite file, or the same PostgreSQL database through a pool of its own."""
    if request.param == "sqlite":
        return lambda: tmp_path / "r.db"
    url = request.getfixturevalue("pg_url")
    return lambda: PgDatabase(url)


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
    assert version == report_module.SCHEMA_VERSION == 5
    # rows from before owners existed are `default`'s: no proxy key's owner sees them
    reopened = ReportStore(path, run="old")
    assert reopened.summary(recent=5, owner="default")["totals"]["requests"] == 8
    assert reopened.summary(recent=5, owner="alice")["totals"]["requests"] == 0
    reopened.close()


def test_one_record_with_a_lone_surrogate_does_not_cost_the_batch(where: Where) -> None:
    store = ReportStore(where(), run="r")
    for i in range(5):
        store.add(dataclasses.replace(_record(i), owner="alice"))
    store.add(dataclasses.replace(_record(5), owner="bob", model="\ud800", session="s"))
    store.flush()
    assert [(s["id"], s["model"]) for s in store.summary(recent=1, owner="bob")["sessions"]] == [
        ("s", "?")
    ]
    assert store.summary(recent=10, owner="alice")["totals"]["requests"] == 5
    assert store.request("cb-5", owner="bob")["model"] == "\ud800"  # type: ignore[index]
    assert len(store.summary(recent=10)["recent"]) == 6
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


def test_a_loss_is_shown_plainly_with_a_minus_sign() -> None:
    """Issue 23: a negative saving printed as `$-0.000060`."""
    from proxy.report.render import headline, money, net_text

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
