from __future__ import annotations

import logging
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ctxbudget.memory import InvalidMemory, MemoryLimits, MemoryStore, NewMemory, SQLiteMemoryStore
from ctxbudget.memory.schema import MIGRATIONS, apply_sqlite
from tests.conftest import Backend


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


def _store(backend: Backend, **limits: object) -> MemoryStore:
    return backend.open(
        limits=MemoryLimits(**limits),
        clock=Clock(),  # type: ignore[arg-type]
    )


def test_add_get_list_search_remove(backend: Backend) -> None:
    store = _store(backend)
    therapy, _ = store.add(
        NewMemory(owner="default", text="  Therapy Thursdays 3pm  ", category="preference")
    )
    zebra, _ = store.add(
        NewMemory(owner="default", text="The zebra project deadline is Friday", scope="agent:main")
    )
    assert therapy.text == "Therapy Thursdays 3pm" and therapy.source == "user_explicit"
    assert store.get("default", zebra.id) == zebra
    assert [m.id for m in store.all("default")] == [therapy.id, zebra.id]
    assert [m.id for m in store.all("default", scope="agent:main")] == [zebra.id]
    found = store.search("default", "when are the zebra deadlines?")
    assert [m.id for m, _ in found] == [zebra.id]  # stemmed: deadlines ~ deadline
    assert found[0][1] > 0
    assert store.search("default", "?!") == []
    assert store.search("default", 'zebra" OR text:*') != []  # user text is never FTS syntax
    assert store.remove("default", zebra.id) and not store.remove("default", zebra.id)
    assert store.search("default", "zebra") == []


def test_owners_never_see_each_other(backend: Backend) -> None:
    store = _store(backend)
    mine, _ = store.add(NewMemory(owner="alice", text="alice likes tea"))
    store.add(NewMemory(owner="bob", text="bob likes tea"))
    assert [m.owner for m, _ in store.search("alice", "tea")] == ["alice"]
    assert [m.owner for m in store.all("bob")] == ["bob"]
    assert store.get("bob", mine.id) is None
    assert not store.remove("bob", mine.id)


def test_least_recently_used_is_evicted_and_logged(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    store = _store(backend, max_memories=3)
    ids = [store.add(NewMemory(owner="default", text=f"memory {i}"))[0].id for i in range(3)]
    store.touch("default", [ids[0]])  # memory 0 was just used: memory 1 is now the oldest
    caplog.set_level(logging.INFO, logger="ctxbudget.memory")
    added, evicted = store.add(NewMemory(owner="default", text="memory 3"))
    assert [m.id for m in evicted] == [ids[1]]
    assert [m.id for m in store.all("default")] == [ids[0], ids[2], added.id]
    assert f"evicted memory {ids[1]} of owner default" in caplog.text
    assert store.get("default", ids[0]).access_count == 1  # type: ignore[union-attr]
    store.add(NewMemory(owner="other", text="other owners do not count"))
    assert len(store.all("default")) == 3


@pytest.mark.parametrize(
    ("memory", "message"),
    [
        (NewMemory(owner="default", text="   "), "text is empty"),
        (
            NewMemory(owner="default", text="x", category="secret"),
            "unknown category 'secret': use one of fact, pattern, preference",
        ),
        (NewMemory(owner="default", text="x" * 51), "over memory.maxChars (50)"),
        (NewMemory(owner="default", text="x", scope="team"), "scope must be 'global' or"),
        (
            NewMemory(owner="default", text="x", source="guessed"),  # type: ignore[arg-type]
            "source must be user_explicit or inferred",
        ),
    ],
)
def test_bad_memories_are_refused_and_nothing_is_written(
    backend: Backend, memory: NewMemory, message: str
) -> None:
    store = _store(backend, max_chars=50)
    with pytest.raises(InvalidMemory, match=re.escape(message)):
        store.add(memory)
    assert store.all("default") == []


def test_schema_is_versioned_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path / "m.db")
    assert store.schema_version == len(MIGRATIONS)
    store.close()
    db = sqlite3.connect(tmp_path / "m.db")
    newer = len(MIGRATIONS) + 1
    db.execute(f"PRAGMA user_version={newer}")
    db.close()
    with pytest.raises(RuntimeError, match=f"schema version {newer}, newer than this ctxbudget"):
        SQLiteMemoryStore(tmp_path / "m.db")


ADDER = """
import sys
from pathlib import Path
from ctxbudget.memory import MemoryLimits, NewMemory, SQLiteMemoryStore
store = SQLiteMemoryStore(Path(sys.argv[1]), limits=MemoryLimits(max_memories=1000))
for i in range(60):
    store.add(NewMemory(owner="default", text=f"{sys.argv[2]} memory {i}"))
"""


@pytest.mark.e2e  # two adder processes of its own
def test_two_processes_adding_at_once_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    SQLiteMemoryStore(path).close()  # created once, as `ctxbudget` would
    procs = [
        subprocess.Popen([sys.executable, "-c", ADDER, str(path), name])
        for name in ("first", "second")
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    texts = {m.text for m in SQLiteMemoryStore(path).all("default")}
    assert len(texts) == 120
    assert {t.split()[0] for t in texts} == {"first", "second"}


def test_an_older_store_is_migrated_with_its_memories(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path, isolation_level=None)
    for step in MIGRATIONS[:3]:  # a schema-v3 file
        apply_sqlite(db, step)
        db.execute(f"PRAGMA user_version={step.version}")
    db.execute(
        "INSERT INTO memories (owner, text, category, source, scope, created, last_accessed)"
        " VALUES ('default', 'Deploys happen on Tuesdays', 'fact', 'user_explicit', 'global',"
        " 1, 1)"
    )
    db.close()
    store = SQLiteMemoryStore(path, limits=MemoryLimits(max_memories=1))
    assert store.schema_version == len(MIGRATIONS)
    assert [m.text for m, _ in store.search("default", "deploy")] == ["Deploys happen on Tuesdays"]
    _, evicted = store.add(NewMemory(owner="default", text="the count came along too"))
    assert [m.text for m in evicted] == ["Deploys happen on Tuesdays"]


def test_word_counts_follow_adds_removals_and_evictions(backend: Backend) -> None:
    store = _store(backend, max_memories=2)
    first, _ = store.add(NewMemory(owner="default", text="coffee black, coffee hot"))
    store.add(NewMemory(owner="default", text="Coffee with oat milk"))
    store.add(NewMemory(owner="other", text="coffee never"))
    assert store.frequencies("default", ["coffee", "oat", "tea"]) == (
        2,
        {"coffee": 2, "oat": 1, "tea": 0},
    )
    assert store.frequencies("default", ["cof", "co"], prefix=True)[1] == {"cof": 2, "co": 0}
    _, evicted = store.add(NewMemory(owner="default", text="tea at four"))
    assert [m.id for m in evicted] == [first.id]
    assert store.frequencies("default", ["coffee", "black", "tea"])[1] == {
        "coffee": 1,
        "black": 0,
        "tea": 1,
    }
    oat = store.search("default", "oat")[0][0]
    assert store.remove("default", oat.id)
    assert store.frequencies("default", ["coffee", "oat"]) == (1, {"coffee": 0, "oat": 0})
    assert store.frequencies("other", ["coffee"]) == (1, {"coffee": 1})


def test_upgrading_a_v4_store_counts_its_words(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "m.db", isolation_level=None)
    for step in MIGRATIONS[:4]:
        apply_sqlite(db, step)
    db.execute("PRAGMA user_version=4")
    db.execute(
        "INSERT INTO memories (owner, text, category, source, scope, created, last_accessed)"
        " VALUES ('default', 'Deploys on Tuesdays, deploys only', 'fact', 'user_explicit',"
        " 'global', 1, 1)"
    )
    db.close()
    store = SQLiteMemoryStore(tmp_path / "m.db")
    assert store.schema_version == len(MIGRATIONS)
    assert store.frequencies("default", ["deploys", "tuesdays"]) == (
        1,
        {"deploys": 1, "tuesdays": 1},
    )


def test_the_loops_quick_look_answers_while_another_process_writes(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path / "m.db")
    assert store.has_any_nowait("default") is False
    store.add(NewMemory(owner="default", text="Standup at 9:30"))
    assert store.has_any_nowait("default") is True
    assert store.has_any_nowait("someone-else") is False
    holder = sqlite3.connect(tmp_path / "m.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    holder.execute("DELETE FROM memories")
    try:
        started = time.monotonic()
        assert store.has_any_nowait("default") is True  # committed state, at once
        assert time.monotonic() - started < 0.5  # waiting would take the 30 s busy timeout
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    store.close()


def test_threads_sharing_one_store_lose_no_write(backend: Backend) -> None:
    # The proxy's worker threads share one store. Before the shared connection was locked,
    # this lost ~2/3 of the adds ("cannot start a transaction within a transaction").
    from concurrent.futures import ThreadPoolExecutor

    store = backend.open(limits=MemoryLimits(max_memories=100_000))
    first = store.add(NewMemory(owner="default", text="seed note"))[0]

    def work(i: int) -> None:
        store.add(NewMemory(owner="default", text=f"note {i} about deploys"))
        if i % 3 == 0:
            store.touch_once("default", f"turn-{i}", [first.id])

    # 150 adds lose as surely as 600 did: 16 threads meet in the first few
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(work, range(150)))
    texts = {m.text for m in store.all("default")}
    assert texts == {"seed note"} | {f"note {i} about deploys" for i in range(150)}
    assert store.get("default", first.id).access_count == 50  # type: ignore[union-attr]
    store.close()


def test_one_owners_search_scores_tell_nothing_of_anothers_memories(tmp_path: Path) -> None:
    # bob guesses alice's PIN: with FTS5's store-wide bm25, the guess that matched alice's
    # memory scored differently from the others.
    def bobs_scores(alices_text: str) -> dict[str, float]:
        store = SQLiteMemoryStore(tmp_path / f"{abs(hash(alices_text))}.db")
        store.add(NewMemory(owner="alice", text=alices_text))
        for guess in ("1234", "4711", "9999"):
            store.add(NewMemory(owner="bob", text=f"guess {guess}"))
        found = store.search("bob", "1234 4711 9999")
        store.close()
        return {m.text.split()[1]: score for m, score in found}

    first = bobs_scores("my bank pin is 4711")
    assert first == bobs_scores("my bank pin is 1234") == bobs_scores("nothing like it")
    assert set(first) == {"1234", "4711", "9999"} and len(set(first.values())) == 1


def test_a_shared_store_ranks_an_owners_own_matches_by_relevance(backend: Backend) -> None:
    store = backend.open()
    store.add(NewMemory(owner="alice", text="deploys happen on tuesdays"))
    for text in ("standup at 9:30", "deploys go out after the deploy review", "lunch at noon"):
        store.add(NewMemory(owner="bob", text=text))
    found = store.search("bob", "when do deploys happen")
    assert [m.text for m, _ in found] == ["deploys go out after the deploy review"]
    assert found[0][1] > 0
    assert [m.owner for m, _ in store.search("alice", "deploys")] == ["alice"]
    store.close()
