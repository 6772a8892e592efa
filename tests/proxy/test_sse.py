from __future__ import annotations

import doctest

from hypothesis import given
from hypothesis import strategies as st

from ctxbudget.proxy import sse
from ctxbudget.proxy.sse import EVENT, LINE, Splitter, split_events

STREAM = (
    b'event: message_start\ndata: {"usage": {"input_tokens": 5}}\n\n'
    b'data: {"choices": [], "usage": {"prompt_tokens": 3}}\r\n\r\n'
    b"data: [DONE]\n\nunfinished"
)


def test_the_docstring_examples_hold() -> None:
    assert doctest.testmod(sse).failed == 0


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_chunking_gives_the_same_lines_and_events(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(STREAM)]
    chunks = [STREAM[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    for unit in (LINE, EVENT):
        splitter = Splitter(unit)
        out = [splitter.feed(chunk) for chunk in chunks]
        # what comes out is the stream itself, cut only at line or event ends
        assert b"".join(out) + splitter.rest() == STREAM
        for piece in out:
            assert piece == b"" or piece.endswith(b"\n")
    events = Splitter(EVENT)
    whole = b"".join(events.feed(chunk) for chunk in chunks)
    assert split_events(whole) == [
        b'event: message_start\ndata: {"usage": {"input_tokens": 5}}\n\n',
        b'data: {"choices": [], "usage": {"prompt_tokens": 3}}\r\n\r\n',
        b"data: [DONE]\n\n",
    ]
