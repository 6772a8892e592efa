"""Where a request's provider blocks lie, by column, made from the previous request's.

A session's cache mirror (`proxy/cache/mirrors.py`) bills each request from its provider
blocks: their prefix digests, bytes, breakpoints and estimated tokens, and where each ends.
An agent's request N+1 is request N and a turn, so the columns of the blocks it shares with
N at its start are N's: copied (a list slice, memcpy speed), and only the blocks after them
are read one by one. The tokens are the bytes at the session's scale; when an answer moved
the scale (an Anthropic session's, each answer), they are counted again in one pass in C.

The report prices a request's classes from it too (`Layout.classes`): each of our blocks it
counted at its own tokens, the rest of each class's stretch at one density.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate, chain, compress, count, repeat
from operator import itemgetter, lt, mul, sub
from typing import NamedTuple

from ctxbudget.proxy.cache.mirror import Lifetime, Predicted, TokenClass, shared_start

Part = tuple[bytes, int, Lifetime | None]
"""One provider block: the digest of the prompt up to and including it, its bytes, and its
breakpoint's lifetime."""


class Layout(NamedTuple):
    """One copy of a request's provider blocks, by column, in order. The number columns are
    arrays: the next request's copy of them is a memcpy, not a reference taken to each of
    ~1,300 int objects (a 300-turn Anthropic history)."""

    keys: list[bytes]
    sizes: array[int]
    """Bytes."""
    ttls: list[Lifetime | None]
    marks: list[int]
    """Where the breakpoints are (the blocks with a lifetime)."""
    first: array[int]
    """`first[g]`: the index of our block `g`'s first provider block (one more at the end)."""
    groups: list[list[Part]]
    """The groups it was made of (`lay_out`: the next request compares its own with them)."""
    scale: float
    """Tokens per byte."""
    tokens: array[int]
    """`round(size * scale)` each."""
    ends: array[int]
    """`ends[k]`: where the first `k` blocks end, in tokens."""
    size: int
    """Bytes in all."""

    @property
    def total(self) -> int:
        return self.ends[-1]

    def has(self, group: int) -> bool:
        """Whether our block `group` has provider blocks here."""
        return 0 <= group < len(self.first) - 1 and self.first[group + 1] > self.first[group]

    def span(self, group: int) -> tuple[int, int]:
        """Where our block `group` starts and ends, in tokens."""
        return self.ends[self.first[group]], self.ends[self.first[group + 1]]

    def spans(self, groups: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
        """Those of our blocks `groups` (sorted, none negative) that have provider blocks here
        (`has`), and where each starts and ends (`span`): made in C, not a line a block."""
        groups = groups[: bisect_left(groups, len(self.first) - 1)]
        firsts = list(map(self.first.__getitem__, groups))
        nexts = list(map(self.first.__getitem__, map((1).__add__, groups)))
        found = list(map(lt, firsts, nexts))
        if not all(found):
            groups = list(compress(groups, found))
            firsts = list(compress(firsts, found))
            nexts = list(compress(nexts, found))
        ends = self.ends.__getitem__
        return list(groups), list(map(ends, firsts)), list(map(ends, nexts))

    def classes(
        self,
        starts: Sequence[int],
        stops: Sequence[int],
        counted: Sequence[int],
        density: float,
        predicted: Predicted,
    ) -> dict[TokenClass, float]:
        """The tokens of each class of `predicted`: our blocks that start and end at `starts`
        and `stops` (`spans`, in order) at their `counted` tokens, the rest at `density`
        (`MirrorView.exact`).

        A block inside one class's stretch is all its tokens; the ones a stretch's end cuts
        (at most two a stretch) are split by their tokens here: sums over runs of blocks (one
        bisect a stretch), not a line a block (a session's clamped results are one more a
        turn)."""
        out: dict[TokenClass, float] = {"read": 0.0, "5m": 0.0, "1h": 0.0, "input": 0.0}
        rest: dict[TokenClass, int] = {"read": 0, "5m": 0, "1h": 0, "input": 0}
        # each class's stretches (an OpenAI read may end inside a block: it splits it)
        stretches: list[tuple[int, int, TokenClass]] = []
        at = 0
        spans = predicted.spans or ((predicted.total, "input"),)
        for stop, kind in spans:
            if stop > at:
                stretches.append((at, stop, kind))
                rest[kind] += stop - at
                at = stop
        if at < self.total:  # past the last span: its class
            stretches.append((at, self.total, spans[-1][1]))
            rest[spans[-1][1]] += self.total - at
        wide = list(map(lt, starts, stops))
        if not all(wide):  # a block of no tokens here has none in any class
            starts = list(compress(starts, wide))
            stops = list(compress(stops, wide))
            counted = list(compress(counted, wide))
        summed = list(accumulate(counted, initial=0))
        widths = list(accumulate(map(sub, stops, starts), initial=0))
        for low, high, kind in stretches:
            first = bisect_right(stops, low)  # the blocks that end past its start
            end = bisect_left(starts, high)  # and start before its end
            whole = first, end
            for k in () if first >= end else (first,) if first == end - 1 else (first, end - 1):
                if starts[k] < low or stops[k] > high:  # cut by the stretch: its share
                    n = min(stops[k], high) - max(starts[k], low)
                    out[kind] += n * (counted[k] / (stops[k] - starts[k]))
                    rest[kind] -= n
                    whole = (k + 1, whole[1]) if k == first else (whole[0], k)
            if whole[0] < whole[1]:
                out[kind] += summed[whole[1]] - summed[whole[0]]
                rest[kind] -= widths[whole[1]] - widths[whole[0]]
        for kind, n in rest.items():
            out[kind] += n * density
        return out


def lay_out(
    groups: list[list[Part]], scale: float, last: Layout | None = None, *, same: int = 0
) -> Layout:
    """The `Layout` of a copy's provider blocks, grouped by our block; the first `same`
    groups those of `last` (the session's previous request of this copy), whose columns are
    taken as they were."""
    if last is None:
        same = 0
    shared = last.first[same] if last is not None else 0
    fresh = list(chain.from_iterable(groups[same:]))
    keys = last.keys[:shared] if last is not None else []
    keys += map(itemgetter(0), fresh)
    sizes = last.sizes[:shared] if last is not None else array("q")
    sizes.extend(map(itemgetter(1), fresh))
    ttls = last.ttls[:shared] if last is not None else []
    ttls += map(itemgetter(2), fresh)
    marks = last.marks[: bisect_left(last.marks, shared)] if last is not None else []
    marks += compress(count(shared), map(itemgetter(2), fresh))
    first = last.first[: same + 1] if last is not None else array("q", (0,))
    first.extend(accumulate(map(len, groups[same:]), initial=shared))
    del first[same + 1]  # the `initial`, there already
    before = last.size - sum(last.sizes[shared:]) if last is not None else 0
    size = before + sum(map(itemgetter(1), fresh))
    if last is None or last.scale != scale:
        shared = 0  # at another scale: every block counted again
    tokens = last.tokens[:shared] if last is not None else array("q")
    tokens.extend(map(float.__round__, map(mul, repeat(float(scale)), sizes[shared:])))
    ends = last.ends[: shared + 1] if last is not None else array("q", (0,))
    ends.extend(accumulate(tokens[shared:], initial=ends[-1]))
    del ends[shared + 1]
    return Layout(keys, sizes, ttls, marks, first, groups, scale, tokens, ends, size)


def same_groups(groups: Sequence[list[Part]], last: Layout | None) -> int:
    """How many leading groups are `last`'s: the very lists (kept by `mirror_groups`, compared
    at once) or equal ones (a block made again from a new object of the same bytes)."""
    return 0 if last is None else shared_start(groups, last.groups)
