"""What a memory is, and the limits that apply when people add one."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

Source = Literal["user_explicit", "inferred"]
SOURCES: tuple[Source, ...] = ("user_explicit", "inferred")
DEFAULT_OWNER = "default"
"""The one owner of a personal setup (no proxy keys): the CLI and every request share it."""

_SCOPE = re.compile(r"global|agent:[A-Za-z0-9_.-]+")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unstorable(name: str, value: object) -> str | None:
    """What is wrong with `value` as text a database keeps, naming the field `name`: a NUL
    (PostgreSQL's text refuses it) or a lone surrogate (not Unicode: no encoder takes it); None
    when it is fine. A memory is refused rather than changed: its text is what its owner gave.

    >>> unstorable("text", "tea\\x00")
    'text contains a NUL character (\\\\x00) at 3: remove it'
    >>> unstorable("text", "tea") is None
    True
    """
    if not isinstance(value, str) or (value.isascii() and "\x00" not in value):
        return None
    found = _UNSTORABLE.search(value)
    if found is None:
        return None
    if found.group() == "\x00":
        return f"{name} contains a NUL character (\\x00) at {found.start()}: remove it"
    return (
        f"{name} contains a lone surrogate (U+{ord(found.group()):04X}) at {found.start()}, "
        "which is not valid Unicode: fix the text's encoding"
    )


class InvalidMemory(ValueError):
    """A memory that cannot be stored as given; the message says what to fix."""


@dataclass(frozen=True, kw_only=True)
class Memory:
    """One stored memory."""

    id: int
    owner: str
    text: str
    category: str
    source: Source
    scope: str
    """`global`, or `agent:<name>` for one agent only."""
    created: float
    last_accessed: float
    access_count: int
    batch: int | None = None
    """The first id of the batch it was added in (an import, a list POST); None: stored
    before batches were recorded."""

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "owner": self.owner,
            "text": self.text,
            "category": self.category,
            "source": self.source,
            "scope": self.scope,
            "created": self.created,
            "lastAccessed": self.last_accessed,
            "accessCount": self.access_count,
        }


@dataclass(frozen=True, kw_only=True)
class Rarest:
    """`MemoryStore.search_rarest`'s answer."""

    found: list[tuple[Memory, float]]
    """The matches, best first, with their BM25 relevance."""
    words: list[str]
    """The words searched (in the order given)."""
    skipped: list[tuple[str, int]]
    """Words too common to rank within the scan, rarest first, with their memory counts."""


@dataclass(frozen=True, kw_only=True)
class MemoryLimits:
    """What a new memory must satisfy, from `memory.*` config."""

    max_chars: int = 2000
    """Longest memory text accepted, in characters."""
    max_memories: int = 100
    """Memories kept per owner; past it the least recently used is evicted."""
    categories: dict[str, float] = field(
        default_factory=lambda: {"preference": 1.0, "fact": 1.0, "pattern": 0.8}
    )
    """Allowed categories and their recall weights."""


@dataclass(frozen=True, kw_only=True)
class NewMemory:
    """A memory as a person gives it, checked by `validate`."""

    owner: str
    text: str
    category: str = "fact"
    source: Source = "user_explicit"
    scope: str = "global"
    created: float | None = None
    """When it was first known (epoch seconds; imports keep it); None: now."""

    def validate(self, limits: MemoryLimits) -> NewMemory:
        """This memory with its text stripped; `InvalidMemory` listing every problem."""
        text = self.text.strip() if isinstance(self.text, str) else ""
        problems = [
            problem
            for name in ("text", "category", "source", "scope", "owner")
            if (problem := unstorable(name, getattr(self, name))) is not None
        ]
        if problems:  # the checks below would quote the bad text back
            raise InvalidMemory("; ".join(problems))
        if not text:
            problems.append("text is empty: give the memory some text")
        elif len(text) > limits.max_chars:
            problems.append(
                f"text is {len(text):,} characters, over memory.maxChars ({limits.max_chars:,}): "
                "shorten it or raise memory.maxChars"
            )
        if self.category not in limits.categories:
            known = ", ".join(sorted(limits.categories))
            problems.append(
                f"unknown category {self.category!r}: use one of {known} "
                "(or add it to memory.categories)"
            )
        if self.source not in SOURCES:
            problems.append(f"source must be user_explicit or inferred, got {self.source!r}")
        if not isinstance(self.scope, str) or not _SCOPE.fullmatch(self.scope):
            problems.append(f"scope must be 'global' or 'agent:<name>', got {self.scope!r}")
        if not self.owner:
            problems.append("owner is empty")
        if self.created is not None and not (
            isinstance(self.created, int | float) and 0 <= self.created < 32_503_680_000
        ):
            problems.append(f"created must be a time after 1970, got {self.created!r}")
        if problems:
            raise InvalidMemory("; ".join(problems))
        return NewMemory(
            owner=self.owner,
            text=text,
            category=self.category,
            source=self.source,
            scope=self.scope,
            created=self.created,
        )
