"""web_fetch results: clamp the page inside OpenClaw's untrusted-content wrapper.

A web_fetch result's `text` is the fetched page wrapped by OpenClaw:

    SECURITY NOTICE: ... (10 lines)


    <<<EXTERNAL_UNTRUSTED_CONTENT id="9b0b037e278b35bf">>>
    Source: Web Fetch
    ---
    <the page>
    <<<END_EXTERNAL_UNTRUSTED_CONTENT id="9b0b037e278b35bf">>>
    [Showing truncated web_fetch content. Full output: ...]     (9.x, when OpenClaw cut it)

The cap measures that whole `text` in UTF-16 units. Only the page is cut: the wrapper markers
and their id are never touched, the notice and the footer stay when they fit, and the cut says
so inline. A clamped text is never longer than the cap.

>>> text = wrap("x" * 500, "ab12")
>>> out = clamp_wrapped(text, 200)
>>> print(out)
<<<EXTERNAL_UNTRUSTED_CONTENT id="ab12">>>
Source: Web Fetch
---
xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx
[...truncated by ctxbudget: kept 35 of 500 chars...]
<<<END_EXTERNAL_UNTRUSTED_CONTENT id="ab12">>>
>>> utf16_len(out)
200
>>> print(clamp_wrapped(text, 120))  # no room for the note: the page goes, markers stay
<<<EXTERNAL_UNTRUSTED_CONTENT id="ab12">>>
Source: Web Fetch
---
<BLANKLINE>
<<<END_EXTERNAL_UNTRUSTED_CONTENT id="ab12">>>
>>> clamp_wrapped(text, 60) is None          # the markers alone do not fit: leave it whole
True
>>> clamp_wrapped(text, utf16_len(text)) == text   # exactly at the cap: unchanged
True
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ctxbudget.caps import passages
from ctxbudget.caps._text import utf16_head, utf16_len

_START = re.compile(r'<<<EXTERNAL_UNTRUSTED_CONTENT id="(?P<id>[^"\n]*)">>>\n')
_END = '<<<END_EXTERNAL_UNTRUSTED_CONTENT id="{id}">>>'
_NOTICE = "SECURITY NOTICE:"


@dataclass(frozen=True)
class _Parts:
    notice: str
    """Everything before the start marker (the security notice and its blank lines)."""
    head: str
    """Start marker, `Source:` and `---` lines: everything up to the page."""
    page: str
    tail: str
    """`\\n` + end marker."""
    footer: str
    """Anything after the end marker (OpenClaw 9.x's spill notice)."""


def _split(text: str) -> _Parts | None:
    start = _START.search(text)
    if start is None:
        return None
    end_marker = _END.format(id=start.group("id"))
    end = text.rfind("\n" + end_marker)
    if end < start.end():
        return None
    dashes = text.find("\n---\n", start.start(), end + 1)
    page_start = dashes + 5 if dashes >= 0 else start.end()
    if page_start > end:
        page_start = end
    tail_end = end + 1 + len(end_marker)
    return _Parts(
        notice=text[: start.start()],
        head=text[start.start() : page_start],
        page=text[page_start:end],
        tail=text[end:tail_end],
        footer=text[tail_end:],
    )


def split(text: str) -> tuple[str, str, str] | None:
    """(everything before the page, the page, everything after it) of a wrapped text, else
    None: what another cap may cut (the page) and what it must keep (markers, id, notice)."""
    parts = _split(text)
    if parts is None:
        return None
    return parts.notice + parts.head, parts.page, parts.tail + parts.footer


def wrapped(text: str) -> bool:
    """Whether `text` holds one intact untrusted-content wrapper (what a clamp cuts inside)."""
    return _split(text) is not None


def clamp_wrapped(
    text: str, cap: int, *, question: str | None = None, how: str = "ask web_fetch for the rest"
) -> str | None:
    """`text` cut to `cap` UTF-16 units inside its wrapper; `None` if that can't be done safely.

    Safe means: both markers and the id intact. What gives way first is the page, then the
    notice above the markers, then the footer below them. With a `question` (the `query`
    strategy) the page keeps its head and the passages that answer it (`caps.passages`; `how`
    ends each gap's note), else its head.
    """
    if utf16_len(text) <= cap:
        return text
    parts = _split(text)
    if parts is None:
        return None
    fixed = utf16_len(parts.head) + utf16_len(parts.tail)
    size = utf16_len(parts.page)
    for notice, footer in (
        (parts.notice, parts.footer),
        ("", parts.footer),
        ("", ""),
    ):
        room = cap - fixed - utf16_len(notice) - utf16_len(footer)
        page = None if question is None else passages.pick(parts.page, room, question, how=how)
        if page is None:
            page = _cut_page(parts.page, size, room)
        if page is not None:
            return f"{notice}{parts.head}{page}{parts.tail}{footer}"
    return None


def _cut_page(page: str, size: int, room: int) -> str | None:
    """The page cut to `room` units with an inline note, or None if not even that fits."""
    if room < 0:
        return None
    for _ in range(3):  # the note's digits shrink as the kept part does
        note = f"\n[...truncated by ctxbudget: kept {{}} of {size} chars...]"
        keep = room - utf16_len(note.format(room))
        if keep < 0:
            return "" if room >= 0 else None
        head = utf16_head(page, keep)
        out = head + note.format(utf16_len(head))
        if utf16_len(out) <= room:
            return out
        room -= 1
    return ""


def wrap(page: str, id_hex: str, *, source: str = "Web Fetch") -> str:
    """OpenClaw's wrapper without the notice (for examples and tests)."""
    return (
        f'<<<EXTERNAL_UNTRUSTED_CONTENT id="{id_hex}">>>\nSource: {source}\n---\n{page}\n'
        + _END.format(id=id_hex)
    )
