from __future__ import annotations

import doctest

from ctxbudget.memory import MemoryLimits, NewMemory
from ctxbudget.memory import context as context_module
from ctxbudget.memory.context import context
from ctxbudget.memory.profiles import PROFILES, RetrievalProfileName
from ctxbudget.memory.selection import select_memories
from tests.conftest import Backend
from tests.memory.memories import NOW, memory


def test_the_docstring_example_holds() -> None:
    assert doctest.testmod(context_module).failed == 0


def test_neighbours_lend_a_share_both_ways_within_one_batch_and_scope() -> None:
    memories = [
        memory(1, batch=1),
        memory(2, batch=1),
        memory(3, batch=1, scope="agent:coder"),  # another scope: no share
        memory(4, batch=1),
        memory(5, batch=5),  # added later, in another batch: another conversation
        memory(6, batch=None),  # stored before batches were recorded: alone
        memory(7, batch=None),
    ]
    scores = {2: 10.0, 4: 5.0, 6: 10.0}
    assert context(scores, memories, share=0.2) == {1: 2.0}
    assert context({1: 10.0, 2: 10.0}, memories, share=0.5) == {1: 5.0, 2: 5.0}


def test_context_is_deterministic_whatever_the_order_of_its_inputs() -> None:
    memories = [memory(i, batch=1 if i < 15 else 15) for i in range(1, 30)]
    scores = {i: float(i % 7) for i in range(1, 30)}
    first = context(scores, memories, share=0.2)
    assert context(dict(reversed(scores.items())), list(reversed(memories)), share=0.2) == first


def test_store_neighbours_are_the_owners_own(backend: Backend) -> None:
    store = backend.open()
    for i in range(3):
        store.add(NewMemory(owner="a", text=f"a {i}"))
        store.add(NewMemory(owner="b", text=f"b {i}"))
    a_ids = [m.id for m in store.all("a")]  # 1, 3, 5
    assert [m.text for m in store.neighbours("b", [a_ids[1]])] == ["b 0", "b 1"]
    assert store.neighbours("a", [a_ids[1]]) == []


def test_batches_are_recorded_and_single_adds_stand_alone(backend: Backend) -> None:
    store = backend.open()
    alone, _ = store.add(NewMemory(owner="a", text="one"))
    batch, _ = store.add_many([NewMemory(owner="a", text=t) for t in ("two", "three")])
    later, _ = store.add(NewMemory(owner="a", text="four"))
    assert alone.batch == alone.id and later.batch == later.id
    assert [m.batch for m in batch] == [batch[0].id, batch[0].id]
    assert [m.batch for m in store.all("a")] == [1, 2, 2, 4]


def test_balanced_injects_the_reply_to_a_matching_question(backend: Backend) -> None:
    store = backend.open(clock=lambda: NOW - 86_400)
    conversation = (
        "Caroline: the council meeting went well",
        "Caroline: do you play any instruments?",
        "Melanie: yes, the clarinet, since I was young",
        "Melanie: we went camping last weekend",
    )
    # imported together: one batch, one conversation
    store.add_many([NewMemory(owner="default", text=text) for text in conversation])
    # added on its own right after: no context from the conversation
    store.add(NewMemory(owner="default", text="Melanie: remember to buy milk"))

    def run() -> list[tuple[str, dict[str, float]]]:
        result = select_memories(
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
    assert "Melanie: remember to buy milk" not in signals or (
        signals["Melanie: remember to buy milk"]["context"] == 0
    )
    assert run() == first  # deterministic
    # lean keeps to the query's own words
    lean = select_memories(
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


def test_a_wider_window_lends_from_two_memories_away_within_the_batch_only() -> None:
    memories = [memory(i, batch=1) for i in range(1, 6)] + [memory(6, batch=6), memory(7, batch=6)]
    scores = {3: 10.0, 5: 5.0}
    one = context(scores, memories, share=0.2)
    assert one == {2: 2.0, 4: 3.0}  # 5's neighbour 6 is another batch
    two = context(scores, memories, share=0.2, window=2)
    assert two == {1: 2.0, 2: 2.0, 3: 1.0, 4: 3.0, 5: 2.0}
    reordered = context(
        dict(reversed(scores.items())), list(reversed(memories)), share=0.2, window=2
    )
    assert reordered == two


def test_around_asks_the_store_for_every_memory_within_the_window(backend: Backend) -> None:
    store = backend.open()
    added, _ = store.add_many([NewMemory(owner="a", text=f"turn {i}") for i in range(9)])
    ids = [m.id for m in added]
    middle = ids[4]
    assert [m.id for m in store.neighbours("a", context_module.around([middle], 1))] == [
        ids[3],
        ids[5],
    ]
    assert [m.id for m in store.neighbours("a", context_module.around([middle], 2))] == ids[2:7]


def test_deep_takes_context_from_two_turns_away_and_balanced_from_one(backend: Backend) -> None:
    store = backend.open(clock=lambda: NOW - 86_400)
    conversation = (
        "Caroline: did you see the clarinet concert?",
        "Melanie: oh yes, I loved every minute",
        "Caroline: you still play, right?",
        "Melanie: every evening, it keeps me calm",
        "Caroline: we should go hiking soon",
    )
    store.add_many([NewMemory(owner="default", text=text) for text in conversation])
    for i in range(20):
        store.add(NewMemory(owner="default", text=f"Caroline: note {i} about the weather"))

    def run(name: RetrievalProfileName) -> dict[str, float]:
        result = select_memories(
            store,
            "default",
            "the clarinet concert",
            PROFILES[name],
            "",
            limits=MemoryLimits(),
            now=NOW,
            max_chars=10_000,
            count_tokens=len,
        )
        return {c.memory.text: c.signals()["context"] for c in result.candidates}

    two_away = "Caroline: you still play, right?"
    balanced, deep = run("balanced"), run("deep")
    assert balanced["Melanie: oh yes, I loved every minute"] > 0
    assert two_away not in balanced
    assert deep[two_away] > 0
    assert run("deep") == deep
