"""Prices follow the provider's bill: cache writes at their lifetime's price (Anthropic's
5-minute writes 1.25× input, 1-hour writes 2×), from litellm's map (issue 23)."""

from __future__ import annotations

import doctest

import pytest

import proxy.report.billing
from proxy.report.billing import Shift, cost, without, write_price, writes_cost
from proxy.report.prices import Prices, prices
from proxy.report.usage import Usage


def test_doctests() -> None:
    assert doctest.testmod(proxy.report.billing).failed == 0


def test_the_map_prices_anthropic_writes_by_lifetime() -> None:
    sonnet = prices("claude-sonnet-4-5")
    assert sonnet is not None
    assert write_price(sonnet) == pytest.approx(1.25 * sonnet.input)
    assert write_price(sonnet, "1h") == pytest.approx(2 * sonnet.input)
    # a model litellm prices without a 1-hour write price: Anthropic's rule, 2× input
    bare = Prices(input=1e-6, output=5e-6, cache_read=0.1e-6, cache_write=1.25e-6)
    assert write_price(bare, "1h") == pytest.approx(2e-6)
    # OpenAI: no write premium in the map, a write is billed as input
    gpt = prices("gpt-4o")
    assert gpt is not None and write_price(gpt) == gpt.input


def test_one_hour_writes_cost_what_anthropic_bills() -> None:
    p = Prices(
        input=3e-6, output=15e-6, cache_read=0.3e-6, cache_write=3.75e-6, cache_write_1h=6e-6
    )
    used = Usage(input=10, cache_read=1_000, cache_write=3_000, output=20, cache_write_1h=2_000)
    assert used.cache_write_5m == 1_000
    expected = 10 * 3e-6 + 1_000 * 0.3e-6 + 1_000 * 3.75e-6 + 2_000 * 6e-6 + 20 * 15e-6
    assert cost(used, p) == pytest.approx(expected, abs=1e-15)
    assert writes_cost(1_000, 2_000, p) == pytest.approx(1_000 * 3.75e-6 + 2_000 * 6e-6)


def test_without_bills_new_blocks_at_the_lifetime_of_the_requests_writes() -> None:
    shift = Shift(client=300, forwarded=100, client_cached=False, forwarded_cached=False)
    hour = Usage(input=10, cache_read=50, cache_write=900, output=1, cache_write_1h=900)
    assert without(hour, [shift]) == Usage(
        input=10, cache_read=50, cache_write=1_100, output=1, cache_write_1h=1_100
    )
    # 1-hour breakpoints come first: the later blocks, where clamps are, went for 5 minutes
    mixed = Usage(input=10, cache_read=50, cache_write=900, output=1, cache_write_1h=600)
    assert without(mixed, [shift]) == Usage(
        input=10, cache_read=50, cache_write=1_100, output=1, cache_write_1h=600
    )


def test_a_json_answer_is_priced_where_it_is_unless_it_has_much_to_count() -> None:
    # Pricing a JSON answer counts the blocks ctxbudget moved: done on the loop when they are
    # counted already (an agent's clamped blocks, every later turn) or small, else in a thread.
    from proxy.cache.sessions import Moved, PrefixChange
    from proxy.report.record import INLINE_COUNT_BYTES, RequestRecord, billing_is_quick
    from proxy.tokens import TokenCounter

    tokens = TokenCounter()
    big = b'{"role":"system","content":"' + b"word " * INLINE_COUNT_BYTES + b'"}'
    small = b'{"role":"system","content":"short"}'

    def record(client: bytes) -> RequestRecord:
        moved = Moved(
            label="messages[0]",
            client=client,
            forwarded=small,
            client_cached=True,
            forwarded_cached=True,
            index=0,
        )
        change = PrefixChange(
            session="s",
            first=False,
            blocks=1,
            shared_client=1,
            shared_forwarded=1,
            client_cache_bust=False,
            bust=None,
            moved=(moved,),
        )
        return RequestRecord(
            id="r",
            ts=0.0,
            model="gpt-4o",
            enabled=True,
            stream=False,
            status=200,
            duration_ms=1.0,
            segments=(),
            encoding="o200k_base",
            prefix=change,
        )

    assert billing_is_quick(record(small), tokens)
    assert not billing_is_quick(record(big), tokens)
    tokens.count_bytes(big, "o200k_base", owner="default")  # as the first turn's pricing did
    assert billing_is_quick(record(big), tokens)
