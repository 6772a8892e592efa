"""Claude Code's and Codex's instruction files: bootstrap segments in the first user message.

Neither agent puts its instruction files in the system prompt. Claude Code sends them as one
text block of the first user message (shared/OPENCLAW_WIRE_FORMATS.md §7, captured from
2.1.330), one section per file — CLAUDE.md, CLAUDE.local.md, ~/.claude/CLAUDE.md, the
auto-memory MEMORY.md, managed policy files:

    <system-reminder>
    Codebase and user instructions are shown below. Be sure to adhere to these ...

    Contents of /w/CLAUDE.md (project instructions, checked into the codebase):

    <the file>

    Contents of /w/CLAUDE.local.md (user's private project instructions, not checked in):

    <the file>
    </system-reminder>

Codex (0.169.0) sends its AGENTS.md files (~/.codex/AGENTS.md, then the project's, joined by
`--- project-doc ---`) as the first part of its first user message item:

    # AGENTS.md instructions for /w

    <INSTRUCTIONS>
    <the files>
    </INSTRUCTIONS>

Each Claude Code section's body (after its `Contents of` line and the blank line, up to the
next `\\n\\nContents of ` line or `\\n</system-reminder>`) and Codex's text inside
`<INSTRUCTIONS>` is one bootstrap file under the bootstrap cap, cut as OpenClaw's own files
are (`caps.bootstrap.clamp_body`: head + tail, a marker naming the file by its path so the
model can read the rest). The wrapper, the preamble and the section lines stay byte for byte;
the same text gives the same bytes on every request, so the prompt cache holds.

>>> body = "Rule: be brief.\\n" * 40
>>> text = (
...     "<system-reminder>\\nCodebase and user instructions are shown below.\\n\\n"
...     "Contents of /w/CLAUDE.md (project instructions, checked into the codebase):\\n\\n"
...     + body + "\\n</system-reminder>"
... )
>>> out, [seg] = clamp_instructions(text, 400)
>>> seg.label, seg.before, seg.after, seg.action
('/w/CLAUDE.md', 640, 400, 'clamped')
>>> seg.note
'Claude Code: project instructions, checked into the codebase'
>>> print(out[out.index("[...") : out.index(")…") + 2])
[...truncated, read /w/CLAUDE.md for full content...]
…(truncated /w/CLAUDE.md: kept 217+73 chars of 640)…
>>> out.endswith("be brief.\\n\\n</system-reminder>"), clamp_instructions(out, 400)[0] == out
(True, True)
>>> codex = "# AGENTS.md instructions for /w\\n\\n<INSTRUCTIONS>\\n" + body + "</INSTRUCTIONS>"
>>> out, [seg] = clamp_instructions(codex, 200)
>>> seg.label, seg.after, out.endswith("\\n</INSTRUCTIONS>"), out.startswith(codex[:50])
('/w/AGENTS.md', 200, True, True)
>>> clamp_instructions("Please read /w/CLAUDE.md", 10)   # the user's own text: not ours
('Please read /w/CLAUDE.md', [])
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ctxbudget.caps._text import utf16_len
from ctxbudget.caps.bootstrap import cut
from ctxbudget.caps.types import Segment

if TYPE_CHECKING:
    from ctxbudget.caps.memo import Memo

_REMINDER = "<system-reminder>\n"
_REMINDER_END = "\n</system-reminder>"
_SECTION = "\n\nContents of "
_CODEX = "# AGENTS.md instructions for "
_CODEX_OPEN = "\n\n<INSTRUCTIONS>\n"
_CODEX_CLOSE = "\n</INSTRUCTIONS>"


def clamp_instructions(
    text: str, cap: int | None, owner: str = "", memo: Memo | None = None
) -> tuple[str, list[Segment]]:
    """Clamp each instruction file in one text block of a first user message to `cap`
    UTF-16 units. Returns the text (the same object when nothing changed) and one segment per
    file found; `cap=None` clamps nothing but reports every file. A text that is not one of
    the two wrappers (the user's own words) is never touched. `memo`: where the cuts are
    remembered (`caps.Memo`; None: nowhere)."""
    if text.startswith(_REMINDER):
        files = list(_claude_code(text))
    elif text.startswith(_CODEX):
        files = list(_codex(text))
    else:
        return text, []
    segments: list[Segment] = []
    pieces: list[str] = []
    done = 0
    for path, note, start, end in files:
        body = text[start:end]
        before = utf16_len(body)
        if cap is None or before <= cap:
            segments.append(_segment(path, note, cap, body, body))
            continue
        clamped = cut(body, cap, path, owner, memo)
        segments.append(_segment(path, note, cap, body, clamped))
        pieces += [text[done:start], clamped]
        done = end
    if not pieces:
        return text, segments
    pieces.append(text[done:])
    return "".join(pieces), segments


def _claude_code(text: str) -> Iterator[tuple[str, str, int, int]]:
    """(path, note, body start, body end) of each `Contents of` section of the first
    `<system-reminder>` block of `text`."""
    end = text.find(_REMINDER_END)
    if end < 0:
        return
    headers = list(_headers(text, end))
    for i, (path, note, _, body_start) in enumerate(headers):
        # a section runs to the blank line before the next one, or to the block's end
        body_end = headers[i + 1][2] if i + 1 < len(headers) else end
        yield path, note, body_start, max(body_start, body_end)


def _headers(text: str, end: int) -> Iterator[tuple[str, str, int, int]]:
    """(path, note, where the blank line before it starts, body start) of each well-formed
    `Contents of <path> (<description>):` line before `end`. One pass with str.find: the
    search resumes after each line."""
    at = text.find(_SECTION, 0, end)
    while at >= 0:
        line_start = at + 2
        line_end = text.find("\n", line_start, end)
        if line_end < 0:
            return
        found = _header(text[line_start + len("Contents of ") : line_end])
        if found is not None:
            path, description = found
            body_start = line_end + 1
            if text.startswith("\n", body_start) and body_start < end:
                body_start += 1  # the blank line after the header
            yield path, f"Claude Code: {description}", at, body_start
        at = text.find(_SECTION, line_end, end)


def _header(line: str) -> tuple[str, str] | None:
    """(path, description) of `<path> (<description>):`, the description holding no
    parentheses (Claude Code's are fixed phrases); a path may hold ` (`.

    >>> _header("/w/My (copy)/CLAUDE.md (project instructions, checked into the codebase):")
    ('/w/My (copy)/CLAUDE.md', 'project instructions, checked into the codebase')
    >>> _header("/w/CLAUDE.md") is None, _header(" (x):") is None
    (True, True)
    """
    if not line.endswith("):"):
        return None
    at = line.rfind(" (", 0, len(line) - 2)
    description = line[at + 2 : -2]
    if at <= 0 or "(" in description or ")" in description:
        return None
    return line[:at], description


def _codex(text: str) -> Iterator[tuple[str, str, int, int]]:
    """(path, note, body start, body end) of the text inside `<INSTRUCTIONS>`."""
    line_end = text.find("\n")
    if line_end < 0 or not text.startswith(_CODEX_OPEN, line_end):
        return
    directory = text[len(_CODEX) : line_end]
    start = line_end + len(_CODEX_OPEN)
    end = text.rfind(_CODEX_CLOSE, start - 1)
    if not directory or end < start - 1:
        return
    separator = "" if directory.endswith(("/", "\\")) else "/"
    yield f"{directory}{separator}AGENTS.md", "Codex: AGENTS.md files", start, max(start, end)


def _segment(path: str, note: str, cap: int | None, original: str, clamped: str) -> Segment:
    changed = clamped != original
    return Segment(
        kind="bootstrap",
        label=path,
        before=utf16_len(original),
        after=utf16_len(clamped),
        action="clamped" if changed else "kept",
        cap=cap,
        note=note,
        original=original,
        clamped=clamped,
    )
