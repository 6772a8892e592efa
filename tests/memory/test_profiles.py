from __future__ import annotations

import time

from ctxbudget.memory.profiles import PROFILES, REQUESTED_PROFILES, RetrievalProfileName, choose

TWENTY_FIVE = " ".join(f"word{i}" for i in range(25))


def _auto(query: str) -> tuple[str, str]:
    profile, reason = choose("auto", query)
    return profile.name, reason


def test_an_explicit_profile_is_used_whatever_the_query() -> None:
    assert REQUESTED_PROFILES == ("lean", "balanced", "deep", "auto")
    names: tuple[RetrievalProfileName, ...] = ("lean", "balanced", "deep")
    for name in names:
        for query in ("why does proxy/app.py fail?", "coffee", TWENTY_FIVE):
            assert choose(name, query) == (PROFILES[name], f"{name} requested")


def test_auto_goes_deep_for_code_terms_first() -> None:
    code = ["look at proxy/app.py", "fix parse_args", "where is getUser", "call run() now", "`ls`"]
    for query in [*code, "why does proxy/app.py fail; and how?"]:
        assert _auto(query) == ("deep", "auto: code terms in the query"), query


def test_auto_goes_deep_for_why_and_how_questions() -> None:
    for query in ("why?", "how do I brew coffee at home", "compare tea versus coffee", "tradeoffs"):
        assert _auto(query) == ("deep", "auto: a why/how/compare question"), query


def test_auto_goes_deep_for_multi_part_queries() -> None:
    parts = [("book the dentist and call mum and pay rent", 9), ("dentist; rent", 2)]
    for query, words in [*parts, ("dentist?\nrent?", 2), (TWENTY_FIVE + " more", 26)]:
        assert _auto(query) == ("deep", f"auto: a multi-part query ({words} words)"), query


def test_auto_is_lean_up_to_four_words_then_balanced() -> None:
    assert _auto("coffee") == ("lean", "auto: a short query (1 word)")
    assert _auto("my usual coffee order") == ("lean", "auto: a short query (4 words)")
    assert _auto("my usual coffee order now") == ("balanced", "auto: an ordinary query (5 words)")
    assert _auto(TWENTY_FIVE) == ("balanced", "auto: an ordinary query (25 words)")


def test_choose_is_deterministic() -> None:
    queries = ["coffee", "my usual coffee order please", "why not", "a; b", "fix parse_args"]
    first = [choose("auto", q) for q in queries]
    assert [choose("auto", q) for q in reversed(queries)] == list(reversed(first))
    assert [p.name for p, _ in first] == ["lean", "balanced", "deep", "deep", "deep"]


def test_code_terms_are_found_in_linear_time() -> None:
    # `[A-Za-z]+[_.]`, tried at each letter of one long word, read to its end every time:
    # 25,000 letters took 6-12 s (issue 24); 100,000 take minutes
    started = time.perf_counter()
    assert _auto("a" * 100_000)[0] == "lean"  # one word, no code term
    assert _auto("a" * 100_000 + "_b")[0] == "deep"
    assert time.perf_counter() - started < 2
