"""The tokens of the blocks a session's requests moved, carried from one request to the next.

The report prices each answer (`proxy/report/record.py` `billing`) from the tokens of every
block ctxbudget changed in the request, as the client sent it and as forwarded
(`PrefixChange.moved`): an agent's session moves more of them every turn (each clamped tool
result stays clamped), and looking each one's count up again, both sides, was a line of Python
a block a request (~6 µs a block, 0.3 ms at turn 300 on the event loop). Request N+1 moves the
blocks request N did, the very same bytes objects (the clamps and the client prefix keep them
by message), and the turn's: their counts are taken from N's (`MovedTokens`, kept on the
session's mirror), the blocks compared by identity in C, and only the blocks after them are
counted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import compress, count
from operator import attrgetter, is_not, or_
from typing import NamedTuple

from ctxbudget.proxy.cache.blocks import block_tokens, counted, size_of
from ctxbudget.proxy.cache.sessions import Moved

ENTRY_BYTES = 160
"""What one moved block's entry costs beyond its bytes (two list slots, a tuple of counts)."""


class MovedTokens(NamedTuple):
    """A request's moved blocks (`PrefixChange.moved`) and their tokens, in order."""

    encoding: str
    """The encoding they were counted in."""
    client: list[object]
    """Each block as the client sent it (held: its id names no other object while kept); None
    for a large block only the offload process could count (its count may come later:
    `PrefixChange.late`), never carried over."""
    forwarded: list[object]
    """Each block as forwarded, held likewise."""
    tokens: list[tuple[int, int]]
    """Each block's tokens as the client sent it and as forwarded."""
    sizes: list[int]
    """What each entry holds: its blocks' bytes and `ENTRY_BYTES`."""
    weight: int
    """`sizes` in all."""


def fresh(moved: Sequence[Moved], last: MovedTokens | None, encoding: str) -> list[int]:
    """Which of `moved`'s blocks are not `last`'s at the same place, the very same objects
    both sides (compared in C) or the same bytes: those are counted, the others' tokens are
    `last`'s. A conversation going on moves the blocks it did and the turn's, and the few
    before the list (the system prompt, serialised again each request) as other objects of
    the same bytes."""
    if last is None or last.encoding != encoding:
        return list(range(len(moved)))
    top = min(len(moved), len(last.tokens))
    clients = map(is_not, map(attrgetter("client"), moved[:top]), last.client)
    forwards = map(is_not, map(attrgetter("forwarded"), moved[:top]), last.forwarded)
    # another object of the same bytes (memcmp) is counted alike
    other = [
        i
        for i in compress(count(), map(or_, clients, forwards))
        if moved[i].client != last.client[i] or moved[i].forwarded != last.forwarded[i]
    ]
    return [*other, *range(top, len(moved))]


def moved_tokens(
    moved: Sequence[Moved],
    count_bytes: Callable[[bytes], int],
    late: Mapping[str, int],
    last: MovedTokens | None,
    encoding: str,
) -> MovedTokens:
    """The tokens of `moved`'s blocks, those carried from `last` (`fresh`) as they were, the
    others counted (`count_bytes`; `late`, large blocks' counts by label)."""
    todo = fresh(moved, last, encoding)
    n = len(moved)
    if last is not None and len(todo) < n:
        tokens, sizes = last.tokens[:n], last.sizes[:n]
        weight = last.weight - sum(last.sizes[n:])
    else:
        tokens, sizes, weight = [], [], 0
    # this request's objects, carried or not (equal bytes: the next request may resend these)
    client: list[object] = list(map(attrgetter("client"), moved))
    forwarded: list[object] = list(map(attrgetter("forwarded"), moved))
    for i in todo:
        m = moved[i]
        found = late.get(m.label)
        counts = (
            block_tokens(m.client, count_bytes, found),
            block_tokens(m.forwarded, count_bytes, found),
        )
        size = ENTRY_BYTES + size_of(m.client) + size_of(m.forwarded)
        if not counted(m.client):
            client[i] = None
        if not counted(m.forwarded):
            forwarded[i] = None
        if i < len(tokens):
            weight -= sizes[i]
            tokens[i], sizes[i] = counts, size
        else:
            tokens.append(counts)
            sizes.append(size)
        weight += size
    return MovedTokens(encoding, client, forwarded, tokens, sizes, weight)
