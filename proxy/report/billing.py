"""What a request cost, and what it would have cost without ctxbudget, net of cache effects.

The actual cost is the provider's own usage (`proxy/report/usage.py`) times the model's prices
(`proxy/report/prices.py`), each token class at its price: uncached input, cache reads, cache
writes, output.

The cost without ctxbudget starts from the same usage and moves the tokens ctxbudget changed
(`proxy/cache/sessions.py` `Moved`): each changed block's forwarded tokens come out of the class
they were billed in, and the client's own tokens for that block go into the class they would
have been billed in. A block inside the prefix the client shared with the session's previous
request would have been a cache read; a new one is billed as a cache write when the reply
wrote to the cache (Anthropic), else as uncached input. A cache bust caused by ctxbudget moves
the unchanged blocks after it too: read without ctxbudget, billed again with it. So a memory
block is a cost, a clamp of a cached block saves a cache read's price, not a full one, and a
bust shows up as money lost. Output is the same either way.

>>> p = Prices(input=3e-6, output=15e-6, cache_read=0.3e-6, cache_write=3.75e-6)
>>> used = Usage(input=100, cache_read=10_000, cache_write=2_000, output=50)
>>> round(cost(used, p), 6)
0.01155
>>> # a clamp saved 1,500 of 4,000 tokens of a block in the cached prefix
>>> without(used, [Shift(client=4000, forwarded=2500, client_cached=True, forwarded_cached=True)])
Usage(input=100, cache_read=11500, cache_write=2000, output=50)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from proxy.report.prices import Prices
from proxy.report.usage import Usage


@dataclass(frozen=True, kw_only=True)
class Shift:
    """One block's tokens as forwarded and as the client sent it, and where each is billed."""

    client: int
    forwarded: int
    client_cached: bool
    forwarded_cached: bool


def cost(usage: Usage, prices: Prices) -> float:
    """USD for `usage` at `prices` (unrounded)."""
    return (
        usage.input * prices.input
        + usage.cache_read * prices.cache_read
        + usage.cache_write * prices.cache_write
        + usage.output * prices.output
    )


def without(usage: Usage, shifts: Iterable[Shift]) -> Usage:
    """The usage the request would have had with nothing clamped or injected."""
    fresh = "cache_write" if usage.cache_write > 0 else "input"
    totals = {
        "input": usage.input,
        "cache_read": usage.cache_read,
        "cache_write": usage.cache_write,
    }
    reads = usage.cache_read > 0  # a reply with no cache read: nothing was cached either way
    for shift in shifts:
        totals["cache_read" if reads and shift.forwarded_cached else fresh] -= shift.forwarded
        totals["cache_read" if reads and shift.client_cached else fresh] += shift.client
    return Usage(
        input=max(0, totals["input"]),
        cache_read=max(0, totals["cache_read"]),
        cache_write=max(0, totals["cache_write"]),
        output=usage.output,
    )
