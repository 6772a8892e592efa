"""`memory/sqlstore.py`: each operation of the memory store written once for SQLite and
PostgreSQL, and the same sequence of operations giving the same results on both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ctxbudget.memory import MemoryLimits, MemoryStore, NewMemory, SQLiteMemoryStore
from ctxbudget.memory.monitor import Usage, analysis
from ctxbudget.memory.transfer import export_jsonl, not_stored, parse_jsonl
from tests.conftest import Backend

EXPORT = """\
{"text": "The orion project deadline is Friday", "created": "2024-05-01T09:00:00Z"}
{"text": "Deploys go out on Tuesdays after standup", "created": "2024-05-02T09:00:00Z"}
{"text": "Prefers tabs in Makefiles", "category": "preference"}
{"text": "The orionwave dashboard lives at dash.example.com", "scope": "agent:ops"}
{"text": "Café meetings are on Mondays; deploys never on Fridays"}
"""


class Clock:
    """A clock that moves one second each time it is read: both stores see the same times."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_each_operation_is_written_once_for_both_stores() -> None:
    """The two stores are one SQL layer and a dialect each: a method of `MemoryStore` is
    defined on `SQLMemoryStore` alone, and each store adds only how it opens its database."""
    from ctxbudget.memory.pgstore import PgDialect, PgMemoryStore
    from ctxbudget.memory.sqlstore import SQLMemoryStore
    from ctxbudget.memory.store import SQLiteDialect

    operations = {n for n in vars(MemoryStore) if not n.startswith("_")} | {"schema_version"}
    assert {"add_many", "search", "remove", "touch_once", "monitor"} <= operations
    for name in sorted(operations):
        assert name in vars(SQLMemoryStore), f"{name} is not in the shared SQL layer"
    for store in (SQLiteMemoryStore, PgMemoryStore):
        assert issubclass(store, SQLMemoryStore)
        own = sorted(n for n in vars(store) if not n.startswith("__"))
        assert own == [], f"{store.__name__} defines {own} beside the shared layer"
    # what differs is data and the few steps the dialects name, the same in both
    steps = {n for n in vars(SQLiteDialect) if not n.startswith("_")}
    assert steps == {n for n in vars(PgDialect) if not n.startswith("_")}
    assert steps <= {
        *("top", "owner_by_id", "version_sql", "rows", "any_of", "lock"),
        *("insert", "delete", "search", "search_rarest"),
    }


def _operations(store: MemoryStore) -> dict[str, Any]:
    """The same sequence on one store: import (twice), add, search, recall's questions,
    touches, eviction, removal, export, and the budget monitor; what each answered."""
    out: dict[str, Any] = {}

    def memories(found: list[Any]) -> list[dict[str, object]]:
        return [m.to_dict() | {"batch": m.batch} for m in found]

    imported = parse_jsonl(EXPORT, "alice", store.limits)
    added, evicted = store.add_many(not_stored(imported, store.all("alice")))
    out["import"] = (memories(added), memories(evicted))
    again = store.add_many(not_stored(parse_jsonl(EXPORT, "alice"), store.all("alice")))
    out["import again"] = again
    out["single"] = memories([store.add(NewMemory(owner="alice", text="Standup is at 9:30"))[0]])
    out["search"] = [(m.id, s) for m, s in store.search("alice", "deploy friday")]
    out["prefix"] = [(m.id, s) for m, s in store.search("alice", "orion", prefix=True)]
    out["stopwords only"] = [m.id for m, _ in store.search("alice", "what is the")]
    out["no match"] = store.search("alice", "zebra")
    rarest = store.search_rarest("alice", ["deploys", "the", "orion"], scan=2, limit=5)
    out["rarest"] = [(m.id, s) for m, s in rarest.found]
    out["rarest words"] = (rarest.words, rarest.skipped)
    out["frequencies"] = store.frequencies("alice", ["orion", "deploys", "zebra", "orion"])
    out["frequencies prefix"] = store.frequencies("alice", ["orion", "dep"], prefix=True)
    out["nobody's frequencies"] = store.frequencies("nobody", [])
    out["neighbours"] = [m.id for m in store.neighbours("alice", [2, 6])]
    store.touch("alice", [1, 1, 3])
    out["touch once"] = [store.touch_once("alice", "turn-1", [2]) for _ in range(2)]
    out["touched"] = memories([m for i in (1, 2, 3) if (m := store.get("alice", i))])
    # a second owner: the store is shared, and each owner is ranked on its own memories
    store.add_many([NewMemory(owner="bob", text=f"Bob deploys service {n}") for n in range(3)])
    out["shared search"] = [m.id for m, _ in store.search("alice", "deploys friday")]
    out["bob's search"] = [m.id for m, _ in store.search("bob", "deploys service")]
    # past memory.maxMemories (6): the least recently used of alice's older memories go
    out["evict"] = [
        [m.id for m in gone]
        for gone in (
            store.add(NewMemory(owner="alice", text=f"Note number {n}"))[1] for n in range(3)
        )
    ]
    out["frequencies after eviction"] = store.frequencies("alice", ["orion", "note", "deploys"])
    out["remove"] = [store.remove("alice", 1), store.remove("alice", 1), store.remove("bob", 3)]
    out["get"] = [store.get("alice", 999), store.get("bob", 3) is not None]
    out["scoped"] = [m.id for m in store.all("alice", scope="agent:ops")]
    out["has any"] = [store.has_any("alice"), store.has_any("carol")]
    out["export"] = export_jsonl(store.all("alice"))
    out["batch too big"] = _refused(
        store, [NewMemory(owner="alice", text=f"m{n}") for n in range(7)]
    )
    out["two owners"] = _refused(
        store, [NewMemory(owner="alice", text="a"), NewMemory(owner="bob", text="b")]
    )
    usage = Usage(
        ts=1_700_000_100.0,
        owner="alice",
        agent="main",
        budget_profile="specialist-narrow",
        retrieval_profile="balanced",
        complexity="simple",
        budget=100,
        tokens_loaded=150,
        tokens_injected=90,
        per_scope={"global": 90},
    )
    store.monitor.record(usage)
    out["usage"] = store.monitor.records(since=0, owner="alice")
    out["bump"] = [store.monitor.take_bump("alice", "main") for _ in range(2)]
    out["analysis"] = analysis(store.monitor, {}, days=1, now=1_700_000_200.0)
    out["schema"] = store.schema_version  # type: ignore[attr-defined]
    return out


def _refused(store: MemoryStore, batch: list[NewMemory]) -> str:
    try:
        store.add_many(batch)
    except ValueError as exc:
        return str(exc)
    return "stored"


def test_the_same_operations_answer_the_same_on_both_backends(tmp_path: Path, pg_url: str) -> None:
    from ctxbudget.memory.pg import PgDatabase
    from ctxbudget.memory.pgstore import PgMemoryStore

    limits = MemoryLimits(max_memories=6)
    sqlite = SQLiteMemoryStore(tmp_path / "m.db", limits=limits, clock=Clock())
    pg = PgMemoryStore(PgDatabase(pg_url, pool_size=2), limits=limits, clock=Clock())
    try:
        on_sqlite, on_pg = _operations(sqlite), _operations(pg)
    finally:
        sqlite.close()
        pg.close()
    # BM25 is one formula on both, over each backend's own tokens (FTS5's unicode61, and
    # `memory.pgstore.tokens`): the same memories in the same order, scores a few % apart
    for step in ("search", "prefix", "rarest"):
        a, b = on_sqlite.pop(step), on_pg.pop(step)
        assert [i for i, _ in a] == [i for i, _ in b], step
        assert [s for _, s in a] == pytest.approx([s for _, s in b], rel=0.05), step
    differ = {s: (on_sqlite[s], on_pg[s]) for s in on_sqlite if on_sqlite[s] != on_pg[s]}
    assert not differ
    assert on_sqlite["evict"] != [[], [], []]  # the sequence did evict
    assert on_sqlite["touch once"] == [True, False]


def test_only_sqlite_answers_has_any_at_once(tmp_path: Path, pg_url: str) -> None:
    """The one answer that differs by design: a database across the network cannot answer
    from the event loop without waiting."""
    from ctxbudget.memory.pg import PgDatabase
    from ctxbudget.memory.pgstore import PgMemoryStore

    sqlite = SQLiteMemoryStore(tmp_path / "m.db")
    pg = PgMemoryStore(PgDatabase(pg_url, pool_size=1))
    try:
        for store in (sqlite, pg):
            store.add(NewMemory(owner="alice", text="tea"))
        assert sqlite.has_any_nowait("alice") is True
        assert sqlite.has_any_nowait("bob") is False
        assert pg.has_any_nowait("alice") is None
    finally:
        sqlite.close()
        pg.close()


def test_an_import_that_evicts_a_thousand_memories_keeps_the_counts(backend: Backend) -> None:
    """Past the lists SQLite takes as parameters (`memory.store._LISTED`): the evicted ids
    and their words go as one JSON array, and the counts recall ranks by stay right."""
    store = backend.open(limits=MemoryLimits(max_memories=1000), clock=Clock())
    store.add_many([NewMemory(owner="o", text=f"alpha {n}") for n in range(1000)])
    added, evicted = store.add_many([NewMemory(owner="o", text=f"beta {n}") for n in range(950)])
    assert (len(added), [m.id for m in evicted]) == (950, list(range(1, 951)))
    assert store.frequencies("o", ["alpha", "beta", "7"]) == (
        1000,
        {"alpha": 50, "beta": 950, "7": 1},
    )
    assert [m.id for m in store.neighbours("o", range(940, 1300))] == list(range(951, 1301))
