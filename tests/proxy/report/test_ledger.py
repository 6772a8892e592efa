"""Pruning's decisions in the report's database (`proxy/report/ledger.py`): what the prune
stage cannot show through the app, a decision taken as the database stopped answering under
its write."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import ctxbudget.proxy.report.ledger as ledger_module
from ctxbudget.memory.pg import DatabaseUnavailable
from ctxbudget.memory.sqlite import Database
from ctxbudget.proxy.report.ledger import HELD_PER_OWNER, PruneLedger, loaded, stored
from ctxbudget.proxy.report.store import open_db


@pytest.fixture(autouse=True)
def _quick_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The breaker looks at the database every 20 ms, not every second: these tests wait for it
    to see the database again (a second each, on the layer's clock)."""
    monkeypatch.setattr(ledger_module, "CHECK_SECONDS", 0.02)


class Flaky(Database):
    """A database that does not answer while `down`, as PostgreSQL stopped would."""

    down = False

    def fetchall(self, sql: str, args: Iterable[Any] = ()) -> list[Any]:
        if self.down:
            raise DatabaseUnavailable("the database did not answer: connection refused")
        return super().fetchall(sql, args)

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        if self.down:
            raise DatabaseUnavailable("the database did not answer: connection refused")
        with super().transaction() as tx:
            yield tx


def test_a_decision_whose_write_failed_is_held_and_written_once_the_database_answers(
    tmp_path: Path,
) -> None:
    path = tmp_path / "report.db"
    open_db(path).close()
    db = Flaky(path)
    ledger = PruneLedger(db)
    try:
        db.down = True
        with pytest.raises(DatabaseUnavailable) as raised:
            ledger.add("alice", "s/1", {("call_0", "d0"): "[pruned]"}, at=1.0)
        ledger.failed(raised.value)
        assert ledger.down
        held = ledger.held("alice", "s/1")
        assert held == {("call_0", "d0"): "[pruned]"}, "the next request's bytes"
        db.down = False
        deadline = time.monotonic() + 10
        while ledger.breaker.down:
            assert time.monotonic() < deadline, "the background check did not see it again"
            time.sleep(0.01)
        rows = db.fetchall("SELECT owner, conversation, call_id, digest, text FROM pruned")
        assert rows == [("alice", "s/1", "call_0", "d0", "[pruned]")]
    finally:
        ledger.close()
        db.close()


def test_one_owners_outage_decisions_never_crowd_out_anothers(tmp_path: Path) -> None:
    path = tmp_path / "report.db"
    open_db(path).close()
    db = Flaky(path)
    ledger = PruneLedger(db)
    try:
        db.down = True
        for i in range(HELD_PER_OWNER + 50):  # one key's flood of conversations, all pruned
            with pytest.raises(DatabaseUnavailable):
                ledger.add("mallory", f"s/{i}", {("call_0", "d0"): "[pruned]"}, at=1.0)
        with pytest.raises(DatabaseUnavailable) as raised:
            ledger.add("alice", "s/1", {("call_0", "d0"): "[pruned]"}, at=2.0)
        ledger.failed(raised.value)
        db.down = False
        deadline = time.monotonic() + 10
        while ledger.breaker.down:
            assert time.monotonic() < deadline, "the background check did not see it again"
            time.sleep(0.01)
        alices = db.fetchall("SELECT conversation FROM pruned WHERE owner = 'alice'")
        assert alices == [("s/1",)], "alice's request went out pruned: its decision is kept"
        (mallorys,) = db.fetchall("SELECT COUNT(*) FROM pruned WHERE owner = 'mallory'")
        assert mallorys[0] == HELD_PER_OWNER  # a key's own flood is bounded
    finally:
        ledger.close()
        db.close()


@pytest.mark.parametrize("text", ["ok", "", "a\ud800b", "\x00", "\ufdd0x", "é\udfff", '"\\'])
def test_stored_texts_read_back_as_they_were(text: str) -> None:
    kept = stored(text)
    kept.encode("utf-8")  # any database's text takes it
    assert "\x00" not in kept and loaded(kept) == text
