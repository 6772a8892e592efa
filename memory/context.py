"""Conversation context: a memory stored right next to a relevant one shares its relevance.

Memories imported from a conversation (`ctxbudget memory import`, one turn each) answer each
other: "You play any instruments?" is followed by "Yeah, I play clarinet!", which shares no word
with "what instruments does Melanie play?". A memory whose neighbour (the memory with the id
just before or after it, added in the same batch, in the same scope) is a candidate gets
`share` × that neighbour's keyword score, and a neighbour that was no candidate becomes one.
Memories added one at a time (`memory add`, a chat agent's notes) are each their own batch:
separately added facts never lend each other relevance.

    >>> from memory.types import Memory
    >>> def m(i, batch):
    ...     return Memory(id=i, owner="o", text="", category="fact", source="inferred",
    ...                   scope="global", created=0.0, last_accessed=0.0, access_count=0,
    ...                   batch=batch)
    >>> context({2: 10.0}, [m(1, 1), m(2, 1), m(3, 3)], share=0.2)
    {1: 2.0}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from memory.types import Memory

SHARE = 0.2
"""Share of a neighbour's keyword score a memory gets (deep and balanced)."""


def context(
    scores: Mapping[int, float], memories: Sequence[Memory], *, share: float
) -> dict[int, float]:
    """Context points per memory id: `share` × the keyword scores of its neighbours.

    `scores`: the candidates' keyword scores by id; `memories`: the candidates and their
    neighbours, any order. Only non-zero points are returned.
    """
    by_id = {m.id: m for m in memories}
    out: dict[int, float] = {}
    for memory in sorted(by_id.values(), key=lambda m: m.id):
        if memory.batch is None:
            continue
        points = 0.0
        for other_id in (memory.id - 1, memory.id + 1):
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
