from __future__ import annotations

import doctest
from pathlib import Path

from memory import MemoryLimits, NewMemory, SQLiteMemoryStore
from memory import context as context_module
from memory.context import WINDOW, context
from memory.profiles import PROFILES
from memory.recall import recall
from memory.types import Memory

NOW = 2_000_000_000.0


def _memory(i: int, created: float, scope: str = "global") -> Memory:
    return Memory(
        id=i,
        owner="o",
        text=f"memory {i}",
        category="fact",
        source="inferred",
        scope=scope,
        created=created,
        last_accessed=created,
        access_count=0,
    )


def test_the_docstring_example_holds() -> None:
    assert doctest.testmod(context_module).failed == 0


def test_neighbours_lend_a_share_both_ways_within_one_scope_and_window() -> None:
    memories = [
        _memory(1, 0.0),
        _memory(2, 10.0),
        _memory(3, 20.0, scope="agent:coder"),  # another scope: no share
        _memory(4, 30.0),
        _memory(5, 30.0 + WINDOW + 1),  # added later: another conversation
    ]
    scores = {2: 10.0, 4: 5.0}
    assert context(scores, memories, share=0.2) == {1: 2.0}
    assert context({1: 10.0, 2: 10.0}, memories, share=0.5) == {1: 5.0, 2: 5.0}


def test_context_is_deterministic_whatever_the_order_of_its_inputs() -> None:
    memories = [_memory(i, float(i)) for i in range(1, 30)]
    scores = {i: float(i % 7) for i in range(1, 30)}
    first = context(scores, memories, share=0.2)
    assert context(dict(reversed(scores.items())), list(reversed(memories)), share=0.2) == first


def test_store_neighbours_are_the_owners_own(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path / "m.db")
    for i in range(3):
        store.add(NewMemory(owner="a", text=f"a {i}"))
        store.add(NewMemory(owner="b", text=f"b {i}"))
    a_ids = [m.id for m in store.all("a")]  # 1, 3, 5
    assert [m.text for m in store.neighbours("b", [a_ids[1]])] == ["b 0", "b 1"]
    assert store.neighbours("a", [a_ids[1]]) == []


def test_balanced_injects_the_reply_to_a_matching_question(tmp_path: Path) -> None:
    store = SQLiteMemoryStore(tmp_path / "m.db", clock=lambda: NOW - 86_400)
    for text in (
        "Caroline: the council meeting went well",
        "Caroline: do you play any instruments?",
        "Melanie: yes, the clarinet, since I was young",
        "Melanie: we went camping last weekend",
    ):
        store.add(NewMemory(owner="default", text=text))

    def run() -> list[tuple[str, dict[str, float]]]:
        result = recall(
            store,
            "default",
            "which instruments does Melanie play",
            PROFILES["balanced"],
            "",
            limits=MemoryLimits(),
            now=NOW,
            max_chars=10_000,
            count_tokens=len,
        )
        return [(c.memory.text, c.signals()) for c in result.chosen]

    first = run()
    signals = dict(first)
    reply = signals["Melanie: yes, the clarinet, since I was young"]
    assert reply["context"] > 0
    assert run() == first  # deterministic
    # lean keeps to the query's own words
    lean = recall(
        store,
        "default",
        "which instruments does Melanie play",
        PROFILES["lean"],
        "",
        limits=MemoryLimits(),
        now=NOW,
        max_chars=10_000,
        count_tokens=len,
    )
    assert all(c.context == 0 and c.hop == 0 for c in lean.candidates)
