"""Memories in and out: JSONL (ctxbudget's own, both ways) and Markdown (OpenClaw's `MEMORY.md`
and `memory/*.md`, in only).

JSONL: one object per line, `{"text", "category", "source", "scope", "created"}` — all but
`text` optional; `created` is ISO 8601 (UTC when it has no zone; a time in the future is
stored as the time of the import). A UTF-8 byte order mark at the start is skipped. Markdown:
one memory per bullet (`-`, `*`, `+`, `1.`), or per paragraph of plain text; headings, rules,
code fences and HTML comments are not memories, but a heading that names a category (`##
Preferences`, `## Facts`: any of `categories`, singular or plural) sets the category of what
follows it, until the next heading of its level or above. Parsing names the bad line and
writes nothing; the store adds a batch in one transaction (`SQLMemoryStore.add_many`).
`not_stored` leaves out what the store already holds, so importing an export back adds
nothing twice.

>>> notes = "# Me\\n- Likes tea\\n- Hates\\n  mornings\\n\\nLives in Oslo."
>>> [m.text for m in parse_markdown(notes, "o")]
['Likes tea', 'Hates mornings', 'Lives in Oslo.']
>>> notes = "# MEMORY\\n## Preferences\\n- Green tea\\n## Projects\\n- Zebra ships Friday"
>>> [(m.text, m.category) for m in parse_markdown(notes, "o", categories=["preference"])]
[('Green tea', 'preference'), ('Zebra ships Friday', 'fact')]
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from ctxbudget.memory.types import InvalidMemory, Memory, MemoryLimits, NewMemory

_FIELDS = ("text", "category", "source", "scope", "created")
_BULLET = re.compile(r"^\s{0,3}(?:[-*+]|\d{1,3}[.)])\s+(.*)$")
_SKIP = re.compile(r"^\s{0,3}(?:#{1,6}\s|(?:-{3,}|\*{3,}|_{3,})\s*$)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")


class InvalidImport(InvalidMemory):
    """A line of an import file that cannot become a memory; nothing was written."""


def parse_jsonl(text: str, owner: str, limits: MemoryLimits | None = None) -> list[NewMemory]:
    """The memories of a JSONL export, each checked against `limits` when given;
    `InvalidImport` naming the first bad line."""
    out = []
    for number, raw in enumerate(_without_bom(text).splitlines(), 1):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except ValueError as exc:
            raise InvalidImport(f"line {number}: not JSON ({exc})") from None
        except RecursionError:
            raise InvalidImport(
                f"line {number}: JSON nested too deeply (a memory is one flat object)"
            ) from None
        if not isinstance(item, dict):
            raise InvalidImport(f"line {number}: expected an object with a text")
        try:
            memory = from_dict(item, owner)
            out.append(memory.validate(limits) if limits is not None else memory)
        except InvalidMemory as exc:
            raise InvalidImport(f"line {number}: {exc}") from None
    return out


def from_dict(item: dict[str, Any], owner: str) -> NewMemory:
    """One memory from its JSON object (an import line, or an item of a POSTed list)."""
    unknown = sorted(set(item) - {*_FIELDS, "id", "owner", "lastAccessed", "accessCount"})
    if unknown:
        raise InvalidMemory(f"unknown field(s) {', '.join(unknown)}: use {', '.join(_FIELDS)}")
    for key in ("text", "category", "source", "scope"):
        if key in item and not isinstance(item[key], str):
            raise InvalidMemory(f"{key} must be a string")
    created = item.get("created")
    return NewMemory(
        owner=owner,
        text=item.get("text", ""),
        category=item.get("category", "fact"),
        source=item.get("source", "user_explicit"),
        scope=item.get("scope", "global"),
        created=None if created is None else _time(created),
    )


def parse_markdown(
    text: str, owner: str, *, category: str = "fact", categories: Iterable[str] = ()
) -> list[NewMemory]:
    """One memory per bullet or plain paragraph of a Markdown file, in `category` unless a
    heading above it names one of `categories`."""
    known = {c.lower(): c for c in categories}
    items: list[tuple[list[str], str]] = []
    headings: list[tuple[int, str | None]] = []
    """The headings in force: level, and the category each names (None: none)."""
    current: list[str] | None = None
    fenced = comment = False
    for line in _without_bom(text).splitlines():
        heading = _HEADING.match(line) if not (fenced or comment) else None
        if heading:
            level = len(heading.group(1))
            headings = [h for h in headings if h[0] < level]
            headings.append((level, _category(heading.group(2), known)))
            current = None
            continue
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            fenced, current = not fenced, None
            continue
        if comment or stripped.startswith("<!--"):
            comment = "-->" not in stripped
            current = None
            continue
        if fenced or not stripped or _SKIP.match(line):
            current = None
            continue
        bullet = _BULLET.match(line)
        named = next((c for _, c in reversed(headings) if c is not None), category)
        if bullet:
            current = [bullet.group(1).strip()]
            items.append((current, named))
        elif current is not None:
            current.append(stripped)  # a bullet's or paragraph's next line
        else:
            current = [stripped]
            items.append((current, named))
    return [
        NewMemory(owner=owner, text=" ".join(parts), category=named)
        for parts, named in items
        if " ".join(parts).strip()
    ]


def _category(heading: str, known: dict[str, str]) -> str | None:
    """The category a heading names (`Preferences` → `preference`), or None."""
    name = heading.strip().rstrip(":").strip().lower()
    return known.get(name) or (known.get(name[:-1]) if name.endswith("s") else None)


def not_stored(memories: Iterable[NewMemory], stored: Iterable[Memory]) -> list[NewMemory]:
    """`memories` without those `stored` already holds, or that came earlier in `memories`:
    the same text (whitespace aside) in the same scope. An import run twice, or an export
    imported back, adds nothing twice.

    >>> new = [NewMemory(owner="o", text="Likes  tea"), NewMemory(owner="o", text="Likes tea")]
    >>> [m.text for m in not_stored(new, [])]
    ['Likes  tea']
    """
    seen = {(m.scope, _content(m.text)) for m in stored}
    out = []
    for memory in memories:
        key = (memory.scope, _content(memory.text))
        if key not in seen:
            seen.add(key)
            out.append(memory)
    return out


def _content(text: str) -> str:
    return " ".join(text.split())


def export_jsonl(memories: Iterable[Memory]) -> str:
    """The memories as JSONL that `parse_jsonl` reads back."""
    return "".join(
        json.dumps(
            {
                "text": m.text,
                "category": m.category,
                "source": m.source,
                "scope": m.scope,
                "created": datetime.fromtimestamp(m.created, UTC).isoformat(),
            },
            ensure_ascii=False,
        )
        + "\n"
        for m in memories
    )


def _without_bom(text: str) -> str:
    """`text` without the byte order mark some editors put first (Notepad's UTF-8)."""
    return text[1:] if text.startswith("\ufeff") else text


def _time(value: Any) -> float:
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise InvalidMemory(f"created must be an ISO 8601 time, got {value!r}") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return when.timestamp()
    raise InvalidMemory(f"created must be an ISO 8601 time, got {value!r}")
