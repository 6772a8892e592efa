"""Retrieval profiles: how hard recall looks, and how much it may inject.

Deterministic and visible: the same query gives the same profile, rewrite and candidates, and
`auto` always says why it chose.

| profile  | query rewrite            | signals            | pool | scan   | trust pass | inject |
|----------|--------------------------|--------------------|------|--------|------------|--------|
| lean     | none                     | keywords           | 10   | 2,000  | strict     | 3–5    |
| balanced | split compound words     | + context ±1       | 30   | 8,000  | standard   | 6–10   |
| deep     | + prefix matching, LLM * | + context ±2, hop, | 100  | 15,000 | permissive | ≤ 14   |
|          |                          |   speaker          |      |        |            |        |

scan: the most matching memories BM25 ranks; query words are taken rarest first and a word too
common to fit is skipped (and reported). * when `memory.rewrite.model` is configured.
context: neighbouring memories of one conversation share relevance (`memory/context.py`), one
memory either side in balanced, two in deep; hop: the second hop, pseudo-relevance feedback
from the best first-hop memories (`memory/feedback.py`); speaker: points for a memory said by
someone the query names (`memory/speaker.py`).
Deep injects at most 1.4× what balanced does: its extra cost is in ranking, not in volume.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

from ctxbudget.memory import context, speaker

RetrievalProfileName = Literal["lean", "balanced", "deep"]
RequestedProfile = Literal["lean", "balanced", "deep", "auto"]
"""A retrieval profile, or `auto` to let `choose` pick one (config, header, CLI)."""
REQUESTED_PROFILES: tuple[RequestedProfile, ...] = get_args(RequestedProfile)


@dataclass(frozen=True, kw_only=True)
class RetrievalProfile:
    name: RetrievalProfileName
    pool: int
    """Candidates fetched by BM25 before scoring."""
    scan: int
    """At most this many matching memories are ranked by BM25: query words are taken rarest
    first, and a word whose matches would go past it is skipped as too common to rank."""
    min_inject: int
    max_inject: int
    expand: bool
    """Rewrite the query once: compound-word splits (`deployScript` → deploy, script)."""
    prefix: bool
    """Also match words by prefix (`deploy*`)."""
    min_chars: int
    """Trust pass: memories shorter than this are dropped."""
    max_age_days: float | None
    """Trust pass: memories not used or added for longer are dropped (None: keep)."""
    min_relevance: float
    """Trust pass: normalised relevance (keywords + second hop + context) below this is dropped."""
    context: float = 0.0
    """Share of a neighbouring memory's keyword score a memory gets (0: off)."""
    hop: bool = False
    """Search a second time for the words the best first-hop memories share."""
    window: int = 1
    """How many memories either side of a candidate lend it context."""
    speaker: float = 0.0
    """Points for a memory said by someone the query names (0: off)."""


PROFILES: dict[RetrievalProfileName, RetrievalProfile] = {
    "lean": RetrievalProfile(
        name="lean",
        pool=10,
        scan=2_000,
        min_inject=3,
        max_inject=5,
        expand=False,
        prefix=False,
        min_chars=12,
        max_age_days=180,
        min_relevance=0.35,
    ),
    "balanced": RetrievalProfile(
        name="balanced",
        pool=30,
        scan=8_000,
        min_inject=6,
        max_inject=10,
        expand=True,
        prefix=False,
        min_chars=8,
        max_age_days=365,
        min_relevance=0.15,
        context=context.SHARE,
    ),
    "deep": RetrievalProfile(
        name="deep",
        pool=100,
        # was 25,000: the second hop and context cost ~4 ms at 100k memories, paid for here
        scan=15_000,
        min_inject=1,
        max_inject=14,
        expand=True,
        prefix=True,
        min_chars=1,
        max_age_days=None,
        min_relevance=0.0,
        context=context.SHARE,
        hop=True,
        window=context.WINDOW,
        speaker=speaker.POINTS,
    ),
}

_WHY = re.compile(r"\b(why|how|compare|difference|explain|trade-?offs?|versus|vs)\b", re.I)
_CODE = re.compile(r"[A-Za-z][_.][A-Za-z]|[a-z][A-Z]|\(\)|`|/[\w.-]+/|\.py\b|\.ts\b")
"""Code terms. Only ever `search`ed, so `x_y` needs one letter each side: `[A-Za-z]+[_.]`
matched the same texts but, tried at each of n letters, ran to the end of the word: 25,000
letters took 6-12 s (issue 24)."""
_PARTS = re.compile(r"\?.+\?|\band\b.+\band\b|;|\n", re.S)


def choose(requested: RequestedProfile, query: str) -> tuple[RetrievalProfile, str]:
    """The profile to use for `query`, and why."""
    if requested != "auto":
        return PROFILES[requested], f"{requested} requested"
    words = len(query.split())
    if _CODE.search(query):
        return PROFILES["deep"], "auto: code terms in the query"
    if _WHY.search(query):
        return PROFILES["deep"], "auto: a why/how/compare question"
    if _PARTS.search(query) or words > 25:
        return PROFILES["deep"], f"auto: a multi-part query ({words} words)"
    if words <= 4:
        return PROFILES["lean"], f"auto: a short query ({words} word{'' if words == 1 else 's'})"
    return PROFILES["balanced"], f"auto: an ordinary query ({words} words)"
