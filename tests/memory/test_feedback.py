from __future__ import annotations

import dataclasses
import doctest

import pytest

from memory import MemoryLimits, NewMemory, feedback, speaker
from memory.feedback import candidate_words, second_hop, sources
from memory.profiles import PROFILES
from memory.selection import select_memories
from memory.store import STOPWORDS
from tests.conftest import Backend
from tests.memory.memories import NOW, memory


def test_the_docstring_example_holds() -> None:
    assert doctest.testmod(feedback).failed == 0


def test_second_hop_words_skip_stopwords_numbers_and_the_query() -> None:
    texts = ["We met at 10 for the pottery class", "The clay class was fun"]
    assert candidate_words(texts, exclude={"pottery"}) == ["class", "clay", "fun", "met"]


def test_second_hop_is_deterministic_whatever_the_order_of_its_inputs() -> None:
    texts = ["alpha beta gamma", "beta gamma delta", "gamma delta epsilon"]
    counts = {"alpha": 3, "beta": 3, "gamma": 3, "delta": 3, "epsilon": 3}
    first = second_hop(texts, counts, total=50, exclude=set(), terms=3)
    # ties (same idf) go alphabetically; a word more texts share ranks first
    assert first == ["gamma", "beta", "delta"]
    again = second_hop(list(reversed(texts)), dict(counts), total=50, exclude=set(), terms=3)
    assert again == first


def test_deep_finds_the_second_hop_and_says_which_words_it_searched(backend: Backend) -> None:
    # memories added a day apart: no conversation context, only the second hop links them
    clock = iter(range(0, 10**8, 86_400))
    store = backend.open(clock=lambda: NOW - 30 * 86_400 + next(clock))
    texts = [
        "Melanie signed the kids up for a pottery class",
        "Melanie: the pottery class made clay bowls",
        "The kids brought home clay bowls and a clay cup",
        "Caroline adopted a dog called Oscar",
        # BM25 needs a collection: a word in half of four memories has no weight
        *(f"Caroline wrote note {i} about the weather" for i in range(20)),
    ]
    for text in texts:
        store.add(NewMemory(owner="default", text=text))

    def run() -> list[tuple[str, dict[str, float]]]:
        result = select_memories(
            store,
            "default",
            "what pottery did Melanie make",
            PROFILES["deep"],
            "",
            limits=MemoryLimits(),
            now=NOW,
            max_chars=10_000,
            count_tokens=len,
        )
        assert "clay" in result.hop_words
        return [(c.memory.text, c.signals()) for c in result.chosen]

    first = run()
    by_text = dict(first)
    third = by_text["The kids brought home clay bowls and a clay cup"]
    assert third["keyword"] == 0 and third["hop"] > 0 and third["context"] == 0
    assert third["relevance"] == third["hop"] > 0  # the whole, 0-100
    assert "Caroline adopted a dog called Oscar" not in by_text
    assert run() == first == run()  # same query, same memories: same block, same signals


def test_a_second_hop_match_counts_weight_of_a_first_hop_match(backend: Backend) -> None:
    # all a month old (same recency), same category and source: only relevance differs
    store = backend.open(clock=lambda: NOW - 60 * 86_400)
    for text in (
        "Melanie signed the kids up for a pottery class",
        "Melanie: the pottery class made clay bowls",
        "The kids brought home clay bowls, a clay cup and a clay vase",
        *(f"Caroline wrote note {i} about the weather" for i in range(20)),
    ):
        store.add(NewMemory(owner="default", text=text))
    result = select_memories(
        store,
        "default",
        "what pottery did Melanie make",
        PROFILES["deep"],
        "",
        limits=MemoryLimits(),
        now=NOW,
        max_chars=10_000,
        count_tokens=len,
    )
    by_text = {c.memory.text: c for c in result.chosen}
    found = by_text["The kids brought home clay bowls, a clay cup and a clay vase"]
    source = by_text["Melanie: the pottery class made clay bowls"]
    assert found.relevance == 0 and found.hop > 0  # only the second hop reached it
    # the same searches recall made: the query's words, then the second hop's
    deep = PROFILES["deep"]
    words = [w for w in result.query_words if w not in STOPWORDS]
    first = store.search_rarest(
        "default", words, scan=deep.scan, limit=deep.pool, prefix=deep.prefix
    )
    second = store.search_rarest(
        "default", result.hop_words, scan=feedback.SCAN, limit=feedback.POOL
    )
    bm25_first = {m.id: r for m, r in first.found}[source.memory.id]
    bm25_second = {m.id: r for m, r in second.found}[found.memory.id]
    # a second-hop match counts WEIGHT of a first-hop match of the same BM25 score
    assert found.hop / source.relevance == pytest.approx(feedback.WEIGHT * bm25_second / bm25_first)
    assert 0 < feedback.WEIGHT < 1
    assert found.score < source.score


def test_sources_count_the_named_speakers_memories_double_ties_by_id() -> None:
    found = [(memory(i), float(10 - i)) for i in range(1, 9)]  # 9.0, 8.0, ... 2.0
    assert [m.id for m in sources(found, named=set(), n=3)] == [1, 2, 3]
    # 7 scores 3.0, counted 6.0: past 4 (6.0, by id) and 5 (5.0)
    assert [m.id for m in sources(found, named={7}, n=5)] == [1, 2, 3, 4, 7]
    assert [m.id for m in sources(list(reversed(found)), named={7}, n=5)] == [1, 2, 3, 4, 7]


def test_deep_reads_the_named_speakers_memories_for_its_second_hop(backend: Backend) -> None:
    clock = iter(range(0, 10**8, 86_400))
    store = backend.open(clock=lambda: NOW - 60 * 86_400 + next(clock))
    texts = [
        # what Caroline asks Melanie matches the query best (short, both words)
        *(f"Caroline: Melanie, how is the baking going {i}?" for i in range(6)),
        "Melanie: baking sourdough with a rye starter has become my weekend ritual",
        "the rye starter needs feeding twice a day",
        *(f"Caroline wrote note {i} about the weather" for i in range(20)),
    ]
    for text in texts:
        store.add(NewMemory(owner="default", text=text))

    def run(points: float) -> list[str]:
        result = select_memories(
            store,
            "default",
            "what is Melanie baking",
            dataclasses.replace(PROFILES["deep"], speaker=points),
            "",
            limits=MemoryLimits(),
            now=NOW,
            max_chars=10_000,
            count_tokens=len,
        )
        return result.hop_words

    assert "rye" not in run(0.0)  # Caroline's five questions are all the second hop reads
    assert "rye" in run(speaker.POINTS)
    assert run(speaker.POINTS) == run(speaker.POINTS)
