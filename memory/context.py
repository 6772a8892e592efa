"""Conversation context: a memory stored right next to a relevant one shares its relevance.

Memories imported from a conversation (`ctxbudget memory import`, one turn each) answer each
other: "You play any instruments?" is followed by "Yeah, I play clarinet!", which shares no word
with "what instruments does Melanie play?". A memory whose neighbour (a memory with an id
at most `window` before or after it, added in the same batch, in the same scope) is a candidate
gets `share` × that neighbour's keyword score, and a neighbour that was no candidate becomes
one. Balanced looks one turn either way; deep two (the answer to a question is often a turn
or two after the turn that matches it).
Memories added one at a time (`memory add`, a chat agent's notes) are each their own batch:
separately added facts never lend each other relevance.

    >>> from ctxbudget.memory.types import Memory
    >>> def m(i, batch):
    ...     return Memory(id=i, owner="o", text="", category="fact", source="inferred",
    ...                   scope="global", created=0.0, last_accessed=0.0, access_count=0,
    ...                   batch=batch)
    >>> context({2: 10.0}, [m(1, 1), m(2, 1), m(3, 3)], share=0.2)
    {1: 2.0}
    >>> context({3: 10.0}, [m(1, 1), m(2, 1), m(3, 1), m(4, 4)], share=0.2, window=2)
    {1: 2.0, 2: 2.0}
    >>> around([10, 20], window=2)
    [9, 10, 11, 19, 20, 21]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ctxbudget.memory.types import Memory

SHARE = 0.2
"""Share of a neighbour's keyword score a memory gets (deep and balanced)."""
WINDOW = 2
"""How many memories either side lend context in deep (balanced: 1)."""


def around(ids: Iterable[int], window: int) -> list[int]:
    """The ids to ask `MemoryStore.neighbours` for (each id's ±1) so that it returns every
    memory within `window` ids of `ids`."""
    return sorted({i + d for i in ids for d in range(1 - window, window)})


def context(
    scores: Mapping[int, float], memories: Sequence[Memory], *, share: float, window: int = 1
) -> dict[int, float]:
    """Context points per memory id: `share` × the keyword scores of its neighbours within
    `window` ids either side.

    `scores`: the candidates' keyword scores by id; `memories`: the candidates and their
    neighbours, any order. Only non-zero points are returned.
    """
    by_id = {m.id: m for m in memories}
    out: dict[int, float] = {}
    for memory in sorted(by_id.values(), key=lambda m: m.id):
        if memory.batch is None:
            continue
        points = 0.0
        for other_id in (memory.id + d * side for d in range(1, window + 1) for side in (-1, 1)):
            other = by_id.get(other_id)
            if (
                other is not None
                and scores.get(other_id)
                and other.batch == memory.batch
                and other.scope == memory.scope
            ):
                points += share * scores[other_id]
        if points:
            out[memory.id] = points
    return out
