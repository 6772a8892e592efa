"""Head + marker + tail: the one way the newer caps cut a text, in UTF-16 units.

A marker says what was cut; its numbers are sized at their widest first, so the real (shorter)
ones always fit, and what they leave goes back to head and tail. When not even the compact
marker leaves room for `MIN_PART` units of text, the cut is a plain head (a cap that small
has no room to say anything).

>>> def marker(head, tail, size):
...     return f"[cut: kept {head}+{tail} of {size}]"
>>> head_tail("abcdefghij" * 10, 40, (marker,), head_share=0.5)
'abcdefgh\\n[cut: kept 8+8 of 100]\\ncdefghij'
>>> head_tail("short", 40, (marker,), head_share=0.5)     # under the cap: as it is
'short'
>>> head_tail("abcdefghij" * 10, 12, (marker,), head_share=0.5)   # no room for the marker
'abcdefghijab'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ctxbudget.caps._text import utf16_head, utf16_len, utf16_tail

Marker = Callable[[int, int, int], str]
"""`marker(head units kept, tail units kept, original size)`: what stands for the cut part."""

MIN_PART = 8
"""Below this many units for head + tail together, a marker is not worth its space."""


def head_tail(text: str, cap: int, markers: Sequence[Marker], *, head_share: float) -> str:
    """`text` cut to at most `cap` UTF-16 units: head, `\\n`, the first marker of `markers`
    that leaves room, `\\n`, tail; the head gets `head_share` of the room. Never splits a
    surrogate pair; deterministic; `text` itself when it fits."""
    size = utf16_len(text)
    if size <= cap:
        return text
    for marker in markers:
        room = cap - utf16_len(marker(cap, cap, size)) - 2
        if room < MIN_PART:
            continue
        best = None
        for _ in range(3):  # the real numbers are shorter: hand the slack back
            head = utf16_head(text, int(room * head_share))
            tail = utf16_tail(text, room - utf16_len(head))
            out = f"{head}\n{marker(utf16_len(head), utf16_len(tail), size)}\n{tail}"
            slack = cap - utf16_len(out)
            if slack < 0:
                break
            best = out
            if slack == 0:
                break
            room += slack
        if best is not None:
            return best
    return utf16_head(text, cap)
