from __future__ import annotations

import doctest

from memory import MemoryLimits, NewMemory, feedback
from memory.feedback import candidate_words, second_hop
from memory.profiles import PROFILES
from memory.recall import recall
from tests.conftest import Backend

NOW = 2_000_000_000.0


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
        result = recall(
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
    assert third["relevance"] == 0 and third["hop"] > 0 and third["context"] == 0
    assert "Caroline adopted a dog called Oscar" not in by_text
    assert run() == first == run()  # same query, same memories: same block, same signals


def test_the_second_hop_is_worth_less_than_the_first() -> None:
    assert 0 < feedback.WEIGHT < 1
