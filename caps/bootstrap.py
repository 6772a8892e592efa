"""Bootstrap files: the `# Project Context` block of OpenClaw's system prompt.

OpenClaw renders each workspace file (AGENTS.md, SOUL.md, USER.md, ...) as a `## <path>` line
followed by the file's content, inside a block that starts with `# Project Context` and an
intro line, and ends at the next section (`## Silent Replies`, the cache boundary, the
`<!-- /openclaw:attempt:STABLE -->` marker, `## Runtime`, ...). 4.x prompts also have a
`# Dynamic Project Context` block below the cache boundary (HEARTBEAT.md). Both layouts are
recognised; see shared/OPENCLAW_WIRE.md §1.4.

A file body over its cap is cut to head + tail with OpenClaw's own marker (the 9.x style:
the head gets 3/4 of what the marker leaves, the tail 1/4), so the agent reads a truncation
it already knows how to handle. Everything outside the bodies — headings, intro lines, cache
and attempt markers — is left byte for byte.

**Lengths are UTF-16 code units**, the unit of OpenClaw's own `bootstrapMaxChars` (JavaScript
string length): an emoji counts 2. The marker counts toward the cap, and a clamped body is
never longer than the cap in UTF-16 units (so never in code points either).

>>> prompt = "# Project Context\\nLoaded project context:\\n## /w/AGENTS.md\\n" + "a" * 300
>>> text, [seg] = clamp_system_text(prompt + "\\n## Silent Replies\\nx", 200)
>>> seg.label, seg.before, seg.after, seg.action
('/w/AGENTS.md', 300, 200, 'clamped')
>>> print(seg.clamped.replace("a" * 10, "a…"))
a…a…a…a…a…a…a…aa
<BLANKLINE>
[...truncated, read AGENTS.md for full content...]
…(truncated AGENTS.md: kept 72+25 chars of 300)…
<BLANKLINE>
a…a…aaaaa

Edge cases:

>>> clamp_body("a" * 100, 100, "X.md") == "a" * 100   # exactly at the cap: kept as it is
True
>>> clamp_body("abc", 0, "X.md")                  # cap 0: nothing is left
''
>>> clamp_body("a" * 40, 30, "X.md")              # too small for any marker: a plain head cut
'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'
>>> clamp_body("a" * 100, 60, "X.md")             # compact marker when the full one can't fit
'aaaaaaaaaaaaaaaaaaaaaaaaaaa\\n[…truncated 27+9/100]\\naaaaaaaaa'
>>> body = clamp_body("\\U0001F600" * 80, 41, "X.md")  # emoji: 2 units each, never split
>>> utf16_len(body), "\\ufffd" in body.encode("utf-16-le", "replace").decode("utf-16-le")
(41, False)
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ctxbudget.caps._cut import head_tail
from ctxbudget.caps._text import utf16_len
from ctxbudget.caps.types import Segment

if TYPE_CHECKING:
    from ctxbudget.caps.memo import Memo

_BLOCK_TITLE = "Project Context\n"
_BLOCK_INTROS = (
    "The following project context files have been loaded:",  # <= 4.x
    "Loaded project context:",  # >= mid-2026
    "The following frequently-changing project context files",  # 4.x dynamic block
)
_NAMES = "AGENTS|SOUL|TOOLS|IDENTITY|USER|HEARTBEAT|BOOTSTRAP|MEMORY|memory"
# Matched against one line after `## `: a path whose basename is a bootstrap file name.
_HEADING = re.compile(rf"(?P<path>(?:[^\n]*[/\\])?(?P<name>(?:{_NAMES})\.md))")
_BLOCK_END = re.compile(
    r"\n(?:## (?:Silent Replies|Subagent Context|Group Chat Context|Conversation Context"
    r"|Heartbeats|Runtime|Temporal Context)\n"
    r"|<!-- (?:OPENCLAW_CACHE_BOUNDARY|/openclaw:attempt:STABLE|openclaw:attempt:DYNAMIC) -->"
    r"|# Dynamic Project Context\n)"
)
"""Where a Project Context block ends (one alternation: 11 separate finds cost 8x more)."""

# OpenClaw's own markers: 4.x/9.x (`kept H+T chars of N`), the 9.x AGENTS.md policy digest
# (`kept H+policy D+T chars of N`) and the compact form (`[…truncated H+T/N]`).
_TRUNCATED = re.compile(r"…\(truncated [^\n:]+: kept \d+(?:\+policy \d+)?\+\d+ chars of (\d+)\)…")
_TRUNCATED_COMPACT = re.compile(r"\[…truncated \d+\+\d+/(\d+)\]")
_PROBE = "…(truncated "
_PROBE_COMPACT = "[…truncated "
_NAME_END = re.compile(r"[\n:]")
_MISSING = "[MISSING] Expected at: "

HEAD_SHARE = 0.75
"""Share of the space left after the marker that goes to the head (OpenClaw 9.x)."""


def clamp_system_text(
    text: str, cap: int | None, owner: str = "", memo: Memo | None = None
) -> tuple[str, list[Segment]]:
    """Clamp each bootstrap file body in one system-prompt text to `cap` UTF-16 units.

    Returns the text (the same object when nothing changed) and one segment per file found.
    `cap=None` clamps nothing but still reports every file. `owner`: whose text it is (what
    is remembered of it is found by the owner too: `Caps.owner`); `memo`: where it is
    remembered (`caps.Memo`; None: nowhere).
    """
    if "Project Context\n" not in text:
        return text, []
    if memo is None:
        new, segments = _clamp(text, cap, owner, None)
    else:
        # An agent sends the same system prompt on every turn of a session: hashing it
        # (~25 µs for 50 KB) is several times cheaper than finding and measuring its files.
        clamp = functools.partial(_clamp, memo=memo)
        new, segments = memo.system_texts.get(clamp, text, cap, owner)
    # Hand back the caller's own object when nothing changed (the memo may hold an equal one).
    return (text if new == text else new), list(segments)


def _clamp(
    text: str, cap: int | None, owner: str, memo: Memo | None
) -> tuple[str, tuple[Segment, ...]]:
    segments: list[Segment] = []
    pieces: list[str] = []
    done = 0
    for path, name, start, end in _files(text):
        body = text[start:end]
        before = utf16_len(body)
        note = _note(body)
        if cap is None or before <= cap:
            segments.append(_segment(path, before, before, "kept", cap, note, body, body))
            continue
        clamped = cut(body, cap, name, owner, memo)
        segments.append(
            _segment(path, before, utf16_len(clamped), "clamped", cap, note, body, clamped)
        )
        pieces += [text[done:start], clamped]
        done = end
    if not pieces:
        return text, tuple(segments)
    pieces.append(text[done:])
    return "".join(pieces), tuple(segments)


def cut(body: str, cap: int, name: str, owner: str, memo: Memo | None) -> str:
    """`clamp_body`, remembered in `memo` (None: made afresh): an agent sends the same files
    on every turn; by `owner` too, which changes nothing of the result (`Caps.owner`)."""
    if memo is None:
        return clamp_body(body, cap, name, owner)
    return memo.bodies.get(clamp_body, body, cap, name, owner)


def clamp_body(body: str, cap: int, name: str, owner: str = "") -> str:
    """Cut `body` to at most `cap` UTF-16 units as head + marker + tail.

    The marker reports the original size: for a body OpenClaw already truncated, the raw size
    its own marker states, so a second cut is not counted as the first. `owner` changes
    nothing of the result: it is there for `cut`'s memo, which is found by owner.
    """
    size = utf16_len(body)
    if size <= cap:
        return body
    raw = _raw_size(body) or size
    markers = (  # the size they state is the raw one
        lambda head, tail, _: _full_marker(name, head, tail, raw),
        lambda head, tail, _: _compact_marker(name, head, tail, raw),
    )
    return head_tail(body, cap, markers, head_share=HEAD_SHARE)


def _full_marker(name: str, head: int, tail: int, raw: int) -> str:
    return (
        f"\n[...truncated, read {name} for full content...]\n"
        f"…(truncated {name}: kept {head}+{tail} chars of {raw})…\n"
    )


def _compact_marker(name: str, head: int, tail: int, raw: int) -> str:
    return f"[…truncated {head}+{tail}/{raw}]"


def _files(text: str) -> Iterator[tuple[str, str, int, int]]:
    """(path, file name, body start, body end) for every bootstrap file in every block.

    A block ends at its section's end or where the next block starts, so blocks never
    overlap and each heading is read once; one search for the section end serves every
    block before it. (Blocks that ran to the one end overlapped: 4,000 repeated
    `# Project Context` blocks, 240 KB, made 8 million segments in 112 s; issue 24.)
    """
    blocks = list(_blocks(text))
    section_end = -1  # where the first section end at or after the last search is
    for k, (_, first_line_end) in enumerate(blocks):
        if section_end < first_line_end:
            found = _BLOCK_END.search(text, first_line_end)
            section_end = found.start() if found else len(text)
        block_end = section_end
        if k + 1 < len(blocks):
            block_end = min(block_end, blocks[k + 1][0] - 1)
        headings = list(_headings(text, first_line_end, block_end))
        for i, (path, name, _, line_end) in enumerate(headings):
            start = line_end + 1
            end = headings[i + 1][2] - 1 if i + 1 < len(headings) else block_end
            if end < start:  # an empty file: OpenClaw drops the empty line
                start = end = line_end
            yield path, name, start, end


def _blocks(text: str) -> Iterator[tuple[int, int]]:
    """(start, end of the intro line) of each Project Context block. str.find, not `^`
    regexes: a multiline regex is tried at every position of a ~50 KB prompt."""
    at = text.find(_BLOCK_TITLE)
    while at >= 0:
        intro = at + len(_BLOCK_TITLE)
        for heading in ("# ", "# Dynamic "):
            start = at - len(heading)
            if (
                text.startswith(heading, start)
                and (start == 0 or text[start - 1] == "\n")
                and text.startswith(_BLOCK_INTROS, intro)
            ):
                line_end = text.find("\n", intro)
                yield start, len(text) if line_end < 0 else line_end
        at = text.find(_BLOCK_TITLE, intro)


def _headings(text: str, start: int, end: int) -> Iterator[tuple[str, str, int, int]]:
    """(path, name, line start, line end) of each `## <bootstrap path>` line in [start, end)."""
    at = text.find("\n## ", start, end)
    while at >= 0:
        line_start = at + 1
        line_end = text.find("\n", line_start, end)
        if line_end < 0:
            line_end = end
        found = _HEADING.fullmatch(text, line_start + 3, line_end)
        if found:
            yield found.group("path"), found.group("name"), line_start, line_end
        at = text.find("\n## ", line_end, end)


def _raw_size(body: str) -> int | None:
    """The raw size OpenClaw's own truncation marker in `body` states, if it has one.

    Linear in `body`: a marker's file name (`[^\\n:]+`) runs to the first `:` or newline
    after it, so every later probe before that point ends its name there too and fails the
    same way; the search goes on after it. Trying each probe (a body of nothing but
    `…(truncated ` repeated) scanned to the line's end each time: 10 s for 136 KB (issue 24).

    >>> _raw_size("…(truncated " * 3 + "…(truncated AGENTS.md: kept 5+3 chars of 900)…")
    900
    """
    at = body.find(_PROBE)
    while at >= 0:
        found = _TRUNCATED.match(body, at)
        if found:
            return int(found.group(1))
        stop = _NAME_END.search(body, at + len(_PROBE))
        if stop is None:
            break
        at = body.find(_PROBE, stop.end())
    # `\d+` cannot run into the next probe: each try reads only its own digits
    at = body.find(_PROBE_COMPACT)
    while at >= 0:
        found = _TRUNCATED_COMPACT.match(body, at)
        if found:
            return int(found.group(1))
        at = body.find(_PROBE_COMPACT, at + 1)
    return None


def _note(body: str) -> str | None:
    if body.startswith(_MISSING):
        return "missing file"
    raw = _raw_size(body)
    return f"already truncated by OpenClaw (raw {raw:,})" if raw else None


def _segment(
    path: str,
    before: int,
    after: int,
    action: str,
    cap: int | None,
    note: str | None,
    original: str,
    clamped: str,
) -> Segment:
    return Segment(
        kind="bootstrap",
        label=path,
        before=before,
        after=after,
        action="clamped" if action == "clamped" else "kept",
        cap=cap,
        note=note,
        original=original,
        clamped=clamped,
    )
