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
from itertools import accumulate, compress, count, islice
from operator import attrgetter, is_not
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
    weights: list[int]
    """What the first `k + 1` entries hold: their bytes and `ENTRY_BYTES` each."""

    @property
    def weight(self) -> int:
        return self.weights[-1] if self.weights else 0


def carried(moved: Sequence[Moved], last: MovedTokens | None, encoding: str) -> int:
    """How many of `moved`'s leading blocks are `last`'s, the very same objects both sides
    (two scans in C): their tokens are `last`'s."""
    if last is None or last.encoding != encoding or not last.tokens:
        return 0
    top = min(len(moved), len(last.tokens))
    run = _same_run(map(attrgetter("client"), moved), last.client, top)
    return _same_run(map(attrgetter("forwarded"), moved), last.forwarded, run)


def _same_run(new: object, old: list[object], top: int) -> int:
    return next(compress(count(), islice(map(is_not, new, old), top)), top)  # type: ignore[call-overload]


def moved_tokens(
    moved: Sequence[Moved],
    count_bytes: Callable[[bytes], int],
    late: Mapping[str, int],
    last: MovedTokens | None,
    encoding: str,
) -> MovedTokens:
    """The tokens of `moved`'s blocks, those carried from `last` (`carried`) as they were,
    the others counted (`count_bytes`; `late`, large blocks' counts by label)."""
    keep = carried(moved, last, encoding)
    tokens = last.tokens[:keep] if last is not None and keep else []
    client = last.client[:keep] if last is not None and keep else []
    forwarded = last.forwarded[:keep] if last is not None and keep else []
    weights = last.weights[:keep] if last is not None and keep else []
    for m in moved[keep:]:
        found = late.get(m.label)
        tokens.append(
            (
                block_tokens(m.client, count_bytes, found),
                block_tokens(m.forwarded, count_bytes, found),
            )
        )
        client.append(m.client if counted(m.client) else None)
        forwarded.append(m.forwarded if counted(m.forwarded) else None)
    sizes = (ENTRY_BYTES + size_of(m.client) + size_of(m.forwarded) for m in moved[len(weights) :])
    weights += accumulate(sizes, initial=weights[-1] if weights else 0)
    del weights[keep]  # the `initial`
    return MovedTokens(encoding, client, forwarded, tokens, weights)
