"""What a request cost, and what it would have cost without ctxbudget, net of cache effects.

The actual cost is the provider's own usage (`proxy/report/usage.py`) times the model's prices
(`proxy/report/prices.py`), each token class at its price: uncached input, cache reads, cache
writes at their lifetime's price (`write_price`: Anthropic's 5-minute writes 1.25× input, its
1-hour writes 2×), output. `cost` is the one place a bill is priced: the report, the
`x-context-budget-saved-usd` header and the metrics all go through it.

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
>>> # the same writes to a 1-hour cache: 2,000 × $6/MTok instead of × $3.75/MTok
>>> round(cost(Usage(input=100, cache_read=10_000, cache_write=2_000, output=50,
...                  cache_write_1h=2_000), p), 6)
0.01605
>>> # a clamp saved 1,500 of 4,000 tokens of a block in the cached prefix
>>> without(used, [Shift(client=4000, forwarded=2500, client_cached=True, forwarded_cached=True)])
Usage(input=100, cache_read=11500, cache_write=2000, output=50, cache_write_1h=0)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from ctxbudget.proxy.report.prices import Prices
from ctxbudget.proxy.report.usage import Usage


@dataclass(frozen=True, kw_only=True)
class Shift:
    """One block's tokens as forwarded and as the client sent it, and where each is billed."""

    client: int
    forwarded: int
    client_cached: bool
    forwarded_cached: bool


CacheTTL = Literal["5m", "1h"]
"""How long a provider keeps a cache write: Anthropic's `cache_control.ttl` (default 5m)."""


def write_price(prices: Prices, ttl: CacheTTL = "5m") -> float:
    """USD per token written to the prompt cache for `ttl`: the map's 5-minute write price
    (Anthropic 1.25× input; the input price where the map has none), or its 1-hour price
    (Anthropic 2× input; 2× input where the map has none).

    >>> p = Prices(input=3e-6, output=15e-6, cache_read=0.3e-6, cache_write=3.75e-6)
    >>> write_price(p), write_price(p, "1h")
    (3.75e-06, 6e-06)
    """
    if ttl == "1h":
        return prices.cache_write_1h if prices.cache_write_1h is not None else 2 * prices.input
    return prices.cache_write


def writes_cost(tokens_5m: int, tokens_1h: int, prices: Prices) -> float:
    """USD for cache writes of each lifetime: what a request that (re)writes a cached prefix
    pays for it, a cache bust's price included."""
    return tokens_5m * write_price(prices, "5m") + tokens_1h * write_price(prices, "1h")


def cost(usage: Usage, prices: Prices) -> float:
    """USD for `usage` at `prices` (unrounded): what the provider bills."""
    return (
        usage.input * prices.input
        + usage.cache_read * prices.cache_read
        + writes_cost(usage.cache_write_5m, usage.cache_write_1h, prices)
        + usage.output * prices.output
    )


def without(usage: Usage, shifts: Iterable[Shift]) -> Usage:
    """The usage the request would have had with nothing clamped or injected.

    A block billed fresh goes to the cache writes when the reply wrote to the cache, at the
    lifetime of the request's last writes: Anthropic requires 1-hour breakpoints before 5-minute
    ones, so the later blocks, where clamps and memories are, were written for 5 minutes
    unless every write was for an hour.
    """
    long = usage.cache_write > 0 and usage.cache_write_1h == usage.cache_write
    fresh = ("cache_write_1h" if long else "cache_write_5m") if usage.cache_write else "input"
    totals = {
        "input": usage.input,
        "cache_read": usage.cache_read,
        "cache_write_5m": usage.cache_write_5m,
        "cache_write_1h": usage.cache_write_1h,
    }
    reads = usage.cache_read > 0  # a reply with no cache read: nothing was cached either way
    for shift in shifts:
        totals["cache_read" if reads and shift.forwarded_cached else fresh] -= shift.forwarded
        totals["cache_read" if reads and shift.client_cached else fresh] += shift.client
    short, one_hour = max(0, totals["cache_write_5m"]), max(0, totals["cache_write_1h"])
    return Usage(
        input=max(0, totals["input"]),
        cache_read=max(0, totals["cache_read"]),
        cache_write=short + one_hour,
        output=usage.output,
        cache_write_1h=one_hour,
    )
