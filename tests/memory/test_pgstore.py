"""What only the PostgreSQL store has: several processes on one database, migrations under
an advisory lock, its tokenizer (the behaviour both stores share is tested on both)."""

from __future__ import annotations

import subprocess
import sys
import threading

import psycopg
import pytest

from ctxbudget.memory import MemoryLimits, NewMemory
from ctxbudget.memory.pg import PgDatabase
from ctxbudget.memory.pgstore import PgMemoryStore, tokens
from ctxbudget.memory.schema import VERSION

ADDER = """
import sys
from ctxbudget.memory import MemoryLimits, NewMemory
from ctxbudget.memory.pg import PgDatabase
from ctxbudget.memory.pgstore import PgMemoryStore
store = PgMemoryStore(PgDatabase(sys.argv[1]), limits=MemoryLimits(max_memories=1000))
for i in range(60):
    store.add(NewMemory(owner="default", text=f"{sys.argv[2]} memory {i}"))
store.add_many([NewMemory(owner="default", text=f"{sys.argv[2]} batch {i}") for i in range(20)])
"""


@pytest.mark.e2e  # two adder processes of its own
def test_two_processes_adding_at_once_lose_nothing_and_batches_stay_whole(pg_url: str) -> None:
    procs = [
        subprocess.Popen([sys.executable, "-c", ADDER, pg_url, name])
        for name in ("first", "second")
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    store = PgMemoryStore(PgDatabase(pg_url))
    memories = store.all("default")
    assert len({m.text for m in memories}) == 160
    for name in ("first", "second"):
        batch = [m for m in memories if m.text.startswith(f"{name} batch")]
        ids = [m.id for m in batch]
        assert ids == list(range(ids[0], ids[0] + 20))  # one run of ids: context's neighbours
        assert {m.batch for m in batch} == {ids[0]}
    assert store.frequencies("default", ["memory", "batch"]) == (160, {"memory": 120, "batch": 40})
    store.close()


def test_an_empty_database_migrated_by_two_at_once_is_migrated_once(pg_url: str) -> None:
    stores: list[PgMemoryStore] = []
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def open_one() -> None:
        start.wait()
        try:
            stores.append(PgMemoryStore(PgDatabase(pg_url, pool_size=2)))
        except BaseException as exc:  # noqa: BLE001 (the test reports it)
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and len(stores) == 2
    one, two = stores
    assert one.schema_version == two.schema_version == VERSION
    one.add(NewMemory(owner="default", text="Standup is at 9:30"))
    assert [m.text for m, _ in two.search("default", "standup")] == ["Standup is at 9:30"]
    for store in stores:
        store.close()


def test_the_tokenizer_reads_text_as_fts5_unicode61_does(pg_url: str) -> None:
    assert tokens("Café at 9:30, re-deploy_script!") == [
        "cafe", "at", "9", "30", "re", "deploy", "script",
    ]  # fmt: skip
    store = PgMemoryStore(PgDatabase(pg_url), limits=MemoryLimits(max_memories=10))
    store.add(NewMemory(owner="default", text="Naïve café deploy_script ran"))
    for query in ("cafe", "CAFÉ", "naive", "script", "deploy"):
        assert [m.text for m, _ in store.search("default", query)] != [], query
    assert store.search("default", "' | owner:*") == []  # user text is never tsquery syntax
    store.close()


def test_a_search_planned_once_leaves_the_connection_planning_each_statement(
    pg_url: str,
) -> None:
    db = PgDatabase(pg_url, pool_size=1)  # one connection: the next statement gets it back
    try:
        store = PgMemoryStore(db)
        store.add(NewMemory(owner="default", text="the orion deadline is friday"))
        for _ in range(3):
            found = store.search_rarest("default", ["orion"], scan=100, limit=5)
            assert [m.text for m, _ in found.found] == ["the orion deadline is friday"]
            assert db.fetchall("SHOW plan_cache_mode") == [("force_custom_plan",)]
        with pytest.raises(psycopg.errors.DivisionByZero):
            db.fetchall_planned_once("SELECT 1 / 0")
        assert db.fetchall("SHOW plan_cache_mode") == [("force_custom_plan",)]
    finally:
        db.close()
