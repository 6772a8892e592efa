"""The user turn recall reads: a bounded excerpt of it (issue 24, item 3)."""

from __future__ import annotations

import doctest
import random

import memory.query
from memory.query import QUERY_HEAD, QUERY_TAIL, UserTurn, excerpt
from proxy.pipeline.chat_command import find_command


def _paste(chars: int, seed: int = 1) -> str:
    """`chars` of words that match nothing: a pasted log."""
    rnd = random.Random(seed)
    words = [f"w{rnd.randrange(10**9)}" for _ in range(chars // 10 + 1)]
    return " ".join(words)[:chars]


def test_doctests() -> None:
    assert doctest.testmod(memory.query).failed == 0


def test_a_long_turn_is_read_as_its_head_and_tail_only() -> None:
    paste = _paste(5_000_000)
    text = "[Sun 2026-11-22 11:28 UTC] When is the zebra deadline? " + paste
    text += " Who owns the zebra launch?\n\nRuntime: agent=main | host=vm"
    query = UserTurn(index=3, text=text, last=True).query
    assert len(query) <= QUERY_HEAD + QUERY_TAIL + 1
    assert query.startswith("When is the zebra deadline? ")  # the stamp is gone
    assert query.endswith(" Who owns the zebra launch?")  # so is the runtime line
    head, tail = query.split("\n")
    pasted = set(paste.split())
    assert set(head.split()[5:]) <= pasted and set(tail.split()[:-5]) <= pasted  # whole words


def test_a_short_turn_is_read_whole() -> None:
    text = "x" * (QUERY_HEAD + QUERY_TAIL)
    assert excerpt(text) is text
    assert excerpt("a " * 3_000)[:QUERY_HEAD] == ("a " * 3_000)[:QUERY_HEAD]


def test_the_key_still_covers_the_whole_turn() -> None:
    head, tail = "ask " * 1_000, " end" * 1_000
    one = UserTurn(index=1, text=head + _paste(100_000, seed=1) + tail, last=True)
    two = UserTurn(index=1, text=head + _paste(100_000, seed=2) + tail, last=True)
    assert one.query == two.query
    assert one.key != two.key  # another message, counted once on its own
    assert one.key == UserTurn(index=1, text=one.text, last=False).key


def test_the_chat_command_is_still_found() -> None:
    stamped = "[Sun 2026-11-22 11:28 UTC] /context budget json\n\nRuntime: agent=main"
    assert find_command(UserTurn(index=0, text=stamped, last=True, typed=stamped)) == "json"
    long = "/context budget " + _paste(1_000_000)
    assert find_command(UserTurn(index=0, text=long, last=True, typed=long)) is None
