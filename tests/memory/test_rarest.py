"""`search_rarest`: recall's first question to a store (and deep's second hop), the rarest
query words that fit a scan, searched. PostgreSQL answers it in one statement; it must agree
with the two steps it replaces (`frequencies`, then `search`), on both backends."""

from __future__ import annotations

import pytest

from ctxbudget.memory import NewMemory
from ctxbudget.memory.store import rarest_first, search_rarest_in_steps
from tests.conftest import Backend

TEXTS = [
    "the standup is at 9:30 in the blue room",
    "the deploy script lives in the ops repository",
    "deploys happen on tuesdays after the standup",
    "the orionwave deadline is the first friday of march",
    "orion notes: the café on the corner has the best espresso",
    "the blue room projector needs a new cable",
    "the deploy_script flag skips the migrations",
    *(f"the filler memory number {i} says nothing much" for i in range(40)),
]


@pytest.mark.parametrize("prefix", [False, True], ids=["words", "prefixes"])
@pytest.mark.parametrize(
    "words",
    [
        ["deploy", "standup"],  # both fit
        ["the", "orion", "deadline"],  # "the" is in every memory: skipped
        ["the", "nothing"],  # both common: nothing fits, nothing searched
        ["zebra", "blue"],  # a word no memory has counts 0 and is kept
        ["café", "espresso"],  # a word search folds: PostgreSQL takes the two steps
        ["deploy_script", "flag"],  # a word search splits
        ["ori", "dep"],  # prefixes of 3 letters
    ],
)
def test_search_rarest_agrees_with_counting_then_searching(
    backend: Backend, words: list[str], prefix: bool
) -> None:
    store = backend.open()
    store.add_many([NewMemory(owner="default", text=t) for t in TEXTS])
    store.add(NewMemory(owner="alice", text="the orion deadline moved, alice says"))

    got = store.search_rarest("default", words, scan=12, limit=5, prefix=prefix)

    _, counts = store.frequencies("default", words, prefix=prefix)
    kept, skipped = rarest_first(words, counts, 12)
    assert got.words == kept
    assert got.skipped == skipped
    expected = store.search("default", " ".join(kept), limit=5, prefix=prefix) if kept else []
    assert [(m.id, round(s, 9)) for m, s in got.found] == [(m.id, round(s, 9)) for m, s in expected]
    assert all(m.owner == "default" for m, _ in got.found)
    steps = search_rarest_in_steps(store, "default", words, scan=12, limit=5, prefix=prefix)
    assert steps == got


def test_the_common_word_is_skipped_and_said(backend: Backend) -> None:
    store = backend.open()
    store.add_many([NewMemory(owner="default", text=t) for t in TEXTS])

    got = store.search_rarest("default", ["the", "orionwave"], scan=10, limit=5)

    assert got.words == ["orionwave"]
    assert got.skipped == [("the", len(TEXTS))]
    assert [m.text for m, _ in got.found] == [TEXTS[3]]


def test_an_owner_without_memories_finds_nothing(backend: Backend) -> None:
    store = backend.open()
    store.add(NewMemory(owner="alice", text="the orion deadline moved"))

    got = store.search_rarest("bob", ["orion", "deadline"], scan=100, limit=5)

    assert got.found == []
    assert got.words == ["orion", "deadline"]  # counted 0 for bob: kept, and nothing matched
    assert got.skipped == []
    assert store.search_rarest("bob", [], scan=100, limit=5).found == []


def test_rarest_first_takes_ties_in_the_order_given() -> None:
    counts = {"a1": 5, "b2": 5, "c3": 5}
    assert rarest_first(["c3", "a1", "b2"], counts, 10) == (["c3", "a1"], [("b2", 5)])
    assert rarest_first(["x"], {}, 0) == (["x"], [])  # a word no memory has costs nothing
