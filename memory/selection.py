"""Memory selection: BM25 candidates, one explainable score, a trust pass, packing into a budget.

    score = 50 × relevance      keyword relevance: BM25 of the query's words
          + 50 × hop             deep's second hop: BM25 of the words the best memories share,
                                 × 0.4 (memory/feedback.py)
          + 50 × context         0.2 × the keyword relevance of the memories stored next to
                                 it in one conversation, one either side (balanced) or two
                                 (deep) (memory/context.py)
                                 (the three are normalised together: the best candidate's sum
                                 is 1)
          + speaker              deep: 25 when the query names who said the memory
                                 (`Melanie: …`, memory/speaker.py)
          + recency              today 50, yesterday 40, this week 30, this month 15, older 5
          + 10 × category weight (memory.categories)
          + source               user_explicit 10, inferred 0
          + log(access_count + 1) × 2

The report and `ctxbudget recall` show relevance on a 0-100 scale, the best candidate 100
(`Scored.signals`: `relevance`, and its parts `keyword`, `hop`, `context`), so
`score = relevance / 2 + speaker + recency + …`. A candidate is never injected when its
relevance rounds to 0 (`NO_RELEVANCE`), and a query word counts only when it is not a stop
word (`memory.store.STOPWORDS`: function words and asking verbs such as "use", "should",
"please"): a memory that matches the turn's stop words alone is no candidate, and a turn
of stop words only recalls nothing.

Recency is a step function rather than an exponential decay: a person reading
`recall --json` can check it at a glance, and a memory's rank does not drift between two
requests of the same tool loop (which would change the injected block and break the provider's
prompt cache) except when it crosses a day boundary.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from memory import feedback, speaker
from memory.context import around, context
from memory.monitor import scope_of
from memory.profiles import RetrievalProfile
from memory.store import STOPWORDS, MemoryStore
from memory.types import Memory, MemoryLimits

DAY = 86_400.0
CONTEXT_FROM = 30
"""The best candidates (by keyword score) whose neighbours get context points, divided by the
profile's context window (deep, two either side: 15), so that as many neighbours are read."""
NO_RELEVANCE = 0.005
"""Relevance (0-1, the best candidate 1) below which a candidate matched nothing that
counts: it shows as 0 on the 0-100 scale, e.g. a word in half the owner's memories, which
BM25 weighs at its floor (2e-6), or only neighbours of such matches. Never injected."""
_WORD = re.compile(r"[A-Za-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def rewrite(query: str) -> list[str]:
    """Words of `query` plus compound splits: `deployScript` → deploy, script, deployscript."""
    words: list[str] = []
    for token in re.findall(r"[\w-]+", query):
        parts = [p for p in re.split(r"[_-]", _CAMEL.sub("_", token)) if p]
        words.extend(p.lower() for p in parts)
        if len(parts) > 1:
            words.append("".join(parts).lower())
    return list(dict.fromkeys(w for w in words if len(w) > 1))


@dataclass(frozen=True, kw_only=True)
class Scored:
    """One candidate with every signal of its score."""

    memory: Memory
    relevance: float
    """Keyword relevance, 0–1 (with `hop` and `context`, the best candidate sums to 1)."""
    recency: float
    category: float
    source: float
    access: float
    score: float
    hop: float = 0.0
    """Second-hop relevance, 0–1."""
    context: float = 0.0
    """Relevance lent by neighbouring memories, 0–1."""
    speaker: float = 0.0
    """Points for a memory said by someone the query names (deep)."""

    @property
    def total(self) -> float:
        """All relevance, 0–1: what the trust pass checks."""
        return self.relevance + self.hop + self.context

    def signals(self) -> dict[str, float]:
        """The score's signals as the report and `recall` show them. Relevance on a scale a
        person reads, 0-100 (the best candidate of this recall 100): `relevance` the whole,
        `keyword`, `hop` and `context` its parts; it adds `relevance / 2` points to `score`."""
        return {
            "relevance": round(100 * self.total, 1),
            "keyword": round(100 * self.relevance, 1),
            "hop": round(100 * self.hop, 1),
            "context": round(100 * self.context, 1),
            "speaker": self.speaker,
            "recency": self.recency,
            "category": round(self.category, 3),
            "source": self.source,
            "access": round(self.access, 3),
            "score": round(self.score, 3),
        }


@dataclass(kw_only=True)
class Selection:
    """What `select_memories` found, chose and why."""

    profile: str
    reason: str
    query_words: list[str]
    candidates: list[Scored] = field(default_factory=list)
    skipped: list[tuple[str, int]] = field(default_factory=list)
    """Query words too common to rank within the profile's scan, with their memory counts."""
    hop_words: list[str] = field(default_factory=list)
    """The second hop's words (deep), best first."""
    dropped: list[tuple[Scored, str]] = field(default_factory=list)
    chosen: list[Scored] = field(default_factory=list)
    scopes: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per scope: its share of the token budget (from the scope weights) and tokens used."""
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
    found: Iterable[tuple[Memory, float]],
    limits: MemoryLimits,
    *,
    now: float,
    hop: Mapping[int, float] | None = None,
    context: Mapping[int, float] | None = None,
    speaker: Mapping[int, float] | None = None,
) -> list[Scored]:
    """Score candidates: `found` with their keyword BM25, plus raw second-hop and context
    scores by memory id (a memory only they found comes with keyword score 0), and speaker
    points by memory id."""
    found = list(found)
    hop, context, speaker = hop or {}, context or {}, speaker or {}
    raw = {m.id: r + hop.get(m.id, 0.0) + context.get(m.id, 0.0) for m, r in found}
    best = max(raw.values(), default=0.0) or 1.0
    out = []
    for memory, relevance in found:
        rel = relevance / best
        two = hop.get(memory.id, 0.0) / best
        ctx = context.get(memory.id, 0.0) / best
        rec = recency_points(now - max(memory.created, memory.last_accessed))
        cat = 10 * limits.categories.get(memory.category, 1.0)
        src = 10.0 if memory.source == "user_explicit" else 0.0
        acc = math.log(memory.access_count + 1) * 2
        said = speaker.get(memory.id, 0.0)
        out.append(
            Scored(
                memory=memory,
                relevance=rel,
                hop=two,
                context=ctx,
                recency=rec,
                category=cat,
                source=src,
                access=acc,
                speaker=said,
                score=50 * (rel + two + ctx) + said + rec + cat + src + acc,
            )
        )
    # Highest score first; ties by id, so the order is always the same.
    return sorted(out, key=lambda s: (-s.score, s.memory.id))


def select_memories(
    store: MemoryStore,
    owner: str,
    query: str,
    profile: RetrievalProfile,
    reason: str,
    *,
    limits: MemoryLimits,
    now: float,
    max_chars: int,
    count_tokens: Callable[[str], int],
    max_tokens: int | None = None,
    scope: str | None = None,
    scope_weights: dict[str, float] | None = None,
    extra_words: Iterable[str] = (),
    format_line: Callable[[Memory], str] = lambda m: m.text,
) -> Selection:
    """Find, score, trust-check and pack memories for `query` into the budget.

    `extra_words` (deep's LLM rewrite) are searched as well. With `max_tokens` and
    `scope_weights`, each scope (global, agent_recent, agent_patterns) first gets its share
    of the token budget; what a scope leaves unused then goes to the best remaining memories.
    """
    words = rewrite(query) if profile.expand else [w.lower() for w in _WORD.findall(query)]
    words = list(dict.fromkeys([*words, *(w.lower() for w in extra_words)]))
    result = Selection(profile=profile.name, reason=reason, query_words=words)
    # the rarest words while their matches fit the profile's scan, searched in one step;
    # a turn of stop words only ("what should I use?") asks for no memory
    content = [w for w in words if w not in STOPWORDS]
    if not content:
        result.bound_by = "only stop words in the query"
        return result
    first = store.search_rarest(
        owner, content, scan=profile.scan, limit=profile.pool, prefix=profile.prefix
    )
    result.skipped.extend(first.skipped)
    ranked, found = first.words, first.found
    allowed = {"global", f"agent:{scope}"} if scope else {"global"}
    found = [(m, r) for m, r in found if m.scope in allowed]
    hop: dict[int, float] = {}
    if profile.hop and found:
        hop = _second_hop(store, owner, found, words, profile, allowed, result)
    near: dict[int, float] = {}
    if profile.context and found:
        near = _context(store, owner, found, hop, profile, allowed)
    said = speaker.points(words, (m for m, _ in found), profile.speaker)
    # the second hop and context add candidates: score them all, keep the profile's pool
    scored = score(found, limits, now=now, hop=hop, context=near, speaker=said)
    result.candidates = scored[: profile.pool]
    trusted = []
    for cand in result.candidates:
        why = _distrust(cand, profile, now)
        if why:
            result.dropped.append((cand, why))
        else:
            trusted.append(cand)
    _pack(result, trusted, profile, max_chars, max_tokens, scope_weights, count_tokens, format_line)
    if not result.bound_by:
        if result.candidates:
            result.bound_by = "candidates"
        elif result.skipped and not ranked:
            result.bound_by = "every query word too common to rank"
        else:
            result.bound_by = "no matching memories"
    return result


def _second_hop(
    store: MemoryStore,
    owner: str,
    found: list[tuple[Memory, float]],
    words: list[str],
    profile: RetrievalProfile,
    allowed: set[str],
    result: Selection,
) -> dict[int, float]:
    """Second-hop scores by memory id (`memory/feedback.py`); memories only the second hop
    found are appended to `found` with keyword score 0."""
    # what the query's speaker said first (deep: `memory/speaker.py`)
    named = speaker.points(words, (m for m, _ in found), profile.speaker)
    texts = [m.text for m in feedback.sources(found, named)]
    exclude = set(words)
    total, counts = store.frequencies(owner, feedback.candidate_words(texts, exclude))
    chosen = feedback.second_hop(texts, counts, total=total, exclude=exclude)
    # rarest first, within the second hop's own (smaller) scan: a word too common to rank
    # cheaply is not searched (its words are no stopwords: `feedback.candidate_words`)
    second = store.search_rarest(owner, chosen, scan=feedback.SCAN, limit=feedback.POOL)
    result.hop_words = second.words
    have = {m.id for m, _ in found}
    hop: dict[int, float] = {}
    for memory, relevance in second.found:
        if memory.scope not in allowed:
            continue
        hop[memory.id] = feedback.WEIGHT * relevance
        if memory.id not in have:
            found.append((memory, 0.0))
    return hop


def _context(
    store: MemoryStore,
    owner: str,
    found: list[tuple[Memory, float]],
    hop: dict[int, float],
    profile: RetrievalProfile,
    allowed: set[str],
) -> dict[int, float]:
    """Context scores by memory id (`memory/context.py`); neighbours that were no candidate
    are appended to `found` with keyword score 0."""
    keyword = {m.id: r + hop.get(m.id, 0.0) for m, r in found}
    have = {m.id: m for m, _ in found}
    # Only the best candidates lend relevance: a low one's share would not make the cut.
    best = sorted((i for i, r in keyword.items() if r > 0), key=lambda i: (-keyword[i], i))
    extra = [
        m
        for m in store.neighbours(
            owner, around(best[: CONTEXT_FROM // profile.window], profile.window)
        )
        if m.id not in have and m.scope in allowed
    ]
    near = context(keyword, [*have.values(), *extra], share=profile.context, window=profile.window)
    found.extend((m, 0.0) for m in extra if m.id in near)
    return near


def _pack(
    result: Selection,
    trusted: list[Scored],
    profile: RetrievalProfile,
    max_chars: int,
    max_tokens: int | None,
    scope_weights: dict[str, float] | None,
    count_tokens: Callable[[str], int],
    format_line: Callable[[Memory], str],
) -> None:
    shares: dict[str, int] = {}
    if max_tokens is not None and scope_weights:
        weight = sum(scope_weights.values()) or 1.0
        shares = {k: int(max_tokens * w / weight) for k, w in scope_weights.items()}
    result.scopes = {k: {"share": v, "tokens": 0} for k, v in shares.items()}
    lines: dict[int, str] = {}
    tokens: dict[int, int] = {}
    chosen: set[int] = set()
    # First pass: each scope within its share; second: what the shares left, best first.
    for within_share in (True, False) if shares else (False,):
        for cand in trusted:
            if cand.memory.id in chosen:
                continue
            if len(chosen) >= profile.max_inject:
                result.bound_by = f"profile {profile.name} injects at most {profile.max_inject}"
                break
            if cand.memory.id not in lines:  # formatted and counted once, when first met
                lines[cand.memory.id] = format_line(cand.memory)
                tokens[cand.memory.id] = count_tokens(lines[cand.memory.id])
            size, cost = len(lines[cand.memory.id]) + 1, tokens[cand.memory.id]
            key = scope_of(cand.memory.scope, cand.memory.category)
            if result.chars + size > max_chars:
                result.bound_by = f"char budget {max_chars:,}"
                continue
            if max_tokens is not None and result.tokens + cost > max_tokens:
                result.bound_by = f"token budget {max_tokens:,}"
                continue
            if within_share:
                used = result.scopes.get(key, {"tokens": 0})["tokens"]
                if used + cost > shares.get(key, 0):
                    continue
            chosen.add(cand.memory.id)
            result.chars += size
            result.tokens += cost
            if key in result.scopes:
                result.scopes[key]["tokens"] += cost
    result.chosen = [c for c in trusted if c.memory.id in chosen]


def _distrust(cand: Scored, profile: RetrievalProfile, now: float) -> str | None:
    memory = cand.memory
    if cand.total < NO_RELEVANCE:  # every profile, deep's floor of 0 included
        return "relevance 0: it matches no query word that tells memories apart"
    if len(memory.text) < profile.min_chars:
        return f"shorter than {profile.min_chars} chars"
    if profile.max_age_days is not None:
        age = (now - max(memory.created, memory.last_accessed)) / DAY
        if age > profile.max_age_days:
            return f"stale: unused for {age:.0f} days"
    if cand.total < profile.min_relevance:
        return f"relevance {cand.total:.2f} below the {profile.name} floor"
    return None
