"""Recall: BM25 candidates, one explainable score, a trust pass, then packing into a budget.

    score = 50 × relevance      keyword relevance: BM25, normalised to the best candidate
          + recency              today 50, yesterday 40, this week 30, this month 15, older 5
          + 10 × category weight (memory.categories)
          + source               user_explicit 10, inferred 0
          + log(access_count + 1) × 2

Recency is a step function rather than an exponential decay: a person reading
`recall --json` can check it at a glance, and a memory's rank does not drift between two
requests of the same tool loop (which would change the injected block and break the provider's
prompt cache) except when it crosses a day boundary.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from memory.profiles import Profile
from memory.store import MemoryStore
from memory.types import Memory, MemoryLimits

DAY = 86_400.0
_SYNONYMS = {
    "deadline": ["due", "duedate"],
    "due": ["deadline"],
    "meeting": ["call", "sync"],
    "call": ["meeting"],
    "prefer": ["like", "favorite"],
    "like": ["prefer", "favorite"],
    "favorite": ["prefer", "like"],
    "bug": ["error", "issue"],
    "error": ["bug", "failure"],
    "deploy": ["release", "ship"],
    "release": ["deploy", "ship"],
    "ship": ["deploy", "release"],
    "doctor": ["appointment", "therapy"],
    "therapy": ["appointment"],
    "appointment": ["meeting", "therapy"],
    "coffee": ["espresso"],
    "test": ["tests", "pytest"],
}
_WORD = re.compile(r"[A-Za-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def rewrite(query: str) -> list[str]:
    """Words of `query` plus one offline expansion: compound splits and synonyms."""
    words: list[str] = []
    for token in re.findall(r"[\w-]+", query):
        parts = [p for p in re.split(r"[_-]", _CAMEL.sub("_", token)) if p]
        words.extend(p.lower() for p in parts)
        if len(parts) > 1:
            words.append("".join(parts).lower())
    for word in list(words):
        words.extend(_SYNONYMS.get(word, ()))
    return list(dict.fromkeys(w for w in words if len(w) > 1))


@dataclass(frozen=True, kw_only=True)
class Scored:
    """One candidate with every signal of its score."""

    memory: Memory
    relevance: float
    recency: float
    category: float
    source: float
    access: float
    score: float

    def signals(self) -> dict[str, float]:
        return {
            "relevance": round(50 * self.relevance, 3),
            "recency": self.recency,
            "category": round(self.category, 3),
            "source": self.source,
            "access": round(self.access, 3),
            "score": round(self.score, 3),
        }


@dataclass(kw_only=True)
class Recall:
    """What recall found, chose and why."""

    profile: str
    reason: str
    query_words: list[str]
    candidates: list[Scored] = field(default_factory=list)
    dropped: list[tuple[Scored, str]] = field(default_factory=list)
    chosen: list[Scored] = field(default_factory=list)
    chars: int = 0
    tokens: int = 0
    bound_by: str = ""


def recency_points(age_seconds: float) -> float:
    """today 50 / yesterday 40 / this week 30 / this month 15 / older 5."""
    days = age_seconds / DAY
    if days < 1:
        return 50
    if days < 2:
        return 40
    if days < 7:
        return 30
    if days < 31:
        return 15
    return 5


def score(
    found: Iterable[tuple[Memory, float]], limits: MemoryLimits, *, now: float
) -> list[Scored]:
    found = list(found)
    best = max((r for _, r in found), default=0.0) or 1.0
    out = []
    for memory, relevance in found:
        rel = relevance / best
        rec = recency_points(now - max(memory.created, memory.last_accessed))
        cat = 10 * limits.categories.get(memory.category, 1.0)
        src = 10.0 if memory.source == "user_explicit" else 0.0
        acc = math.log(memory.access_count + 1) * 2
        out.append(
            Scored(
                memory=memory,
                relevance=rel,
                recency=rec,
                category=cat,
                source=src,
                access=acc,
                score=50 * rel + rec + cat + src + acc,
            )
        )
    # Highest score first; ties by id, so the order is always the same.
    return sorted(out, key=lambda s: (-s.score, s.memory.id))


def recall(
    store: MemoryStore,
    owner: str,
    query: str,
    profile: Profile,
    reason: str,
    *,
    limits: MemoryLimits,
    now: float,
    max_chars: int,
    count_tokens: Callable[[str], int],
    max_tokens: int | None = None,
    scope: str | None = None,
    format_line: Callable[[Memory], str] = lambda m: m.text,
) -> Recall:
    """Find, score, trust-check and pack memories for `query` into the budget."""
    words = rewrite(query) if profile.expand else [w.lower() for w in _WORD.findall(query)]
    words = list(dict.fromkeys(words))
    result = Recall(profile=profile.name, reason=reason, query_words=words)
    terms = " ".join(words)
    found = store.search(owner, terms, limit=profile.pool, prefix=profile.prefix) if words else []
    allowed = {"global", f"agent:{scope}"} if scope else {"global"}
    found = [(m, r) for m, r in found if m.scope in allowed]
    result.candidates = score(found, limits, now=now)
    for cand in result.candidates:
        why = _distrust(cand, profile, now)
        if why:
            result.dropped.append((cand, why))
            continue
        if len(result.chosen) >= profile.max_inject:
            result.bound_by = f"profile {profile.name} injects at most {profile.max_inject}"
            break
        line = format_line(cand.memory)
        tokens = count_tokens(line)
        if result.chars + len(line) + 1 > max_chars:
            result.bound_by = f"char budget {max_chars:,}"
            continue
        if max_tokens is not None and result.tokens + tokens > max_tokens:
            result.bound_by = f"token budget {max_tokens:,}"
            continue
        result.chosen.append(cand)
        result.chars += len(line) + 1
        result.tokens += tokens
    if not result.bound_by:
        result.bound_by = "candidates" if result.candidates else "no matching memories"
    return result


def _distrust(cand: Scored, profile: Profile, now: float) -> str | None:
    memory = cand.memory
    if len(memory.text) < profile.min_chars:
        return f"shorter than {profile.min_chars} chars"
    if profile.max_age_days is not None:
        age = (now - max(memory.created, memory.last_accessed)) / DAY
        if age > profile.max_age_days:
            return f"stale: unused for {age:.0f} days"
    if cand.relevance < profile.min_relevance:
        return f"relevance {cand.relevance:.2f} below the {profile.name} floor"
    return None
