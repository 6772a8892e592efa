"""Who said a memory: deep recall's entity awareness for memories that are conversation turns.

A conversation imported one turn per memory (`ctxbudget memory import`, one list
`POST /v1/memories`) keeps each turn as `Speaker: text`, often after a date:
`[8 May, 2023] Melanie: I've been running farther to de-stress`. A question about someone
("what does Melanie do to destress?") is answered by what that person said, but BM25 weighs a
name by its rarity alone: in a conversation between two people each name is in about half of
the memories, and a turn that *addresses* Melanie ("Thanks, Melanie!") matches her name as well
as one she says. A memory whose speaker the query names gets `POINTS` (deep), and deep's
second hop reads that speaker's memories first (`memory/feedback.py`).

The speaker is a label of one to three capitalised words before a colon at the start of the
text (after an optional `[…]` prefix); a topic label such as `Coffee: oat milk` counts as well:
a query that names it asks about that memory's subject. Nothing is learned or stored: the same
text and query give the same points.

    >>> speaker("[1:56 pm on 8 May, 2023] Caroline: I'm keen on counseling")
    'caroline'
    >>> speaker("Dr Jane Smith: take the pills at 8")
    'dr jane smith'
    >>> speaker("note: lowercase is no name") is None, speaker("Deploys are on Tuesdays") is None
    (True, True)
    >>> named(["what", "does", "melanie", "do"], "[8 May, 2023] Melanie: running, mostly")
    True
    >>> named(["what", "does", "melanie", "do"], "[8 May, 2023] Caroline: Thanks, Melanie!")
    False
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable

from ctxbudget.memory.store import STOPWORDS
from ctxbudget.memory.types import Memory

POINTS = 25.0
"""What a memory said by someone the query names adds to its score (deep): half of what the
best keyword match gets (50), so it lifts the named person's turns above others that match
as well, not above turns that match much better."""

_LABEL = re.compile(r"(?:\[[^\]\n]{0,80}\]\s*)?([A-Z][\w'.-]*(?: [A-Z][\w'.-]*){0,2}):\s")
_WORD = re.compile(r"\w+")


def speaker(text: str) -> str | None:
    """The lower-cased label before the first colon of `text` (see above), or None."""
    found = _LABEL.match(text)
    return found.group(1).lower() if found else None


def named(query_words: Collection[str], text: str) -> bool:
    """Whether the query (its lower-cased words) names the speaker of `text`: any word of the
    speaker's label, stopwords aside."""
    who = speaker(text)
    if who is None:
        return False
    return any(w in query_words for w in _WORD.findall(who) if w not in STOPWORDS)


def points(
    query_words: Collection[str], memories: Iterable[Memory], per: float
) -> dict[int, float]:
    """`per` points by id for each of `memories` whose speaker the query names (only those)."""
    if not per:
        return {}
    words = set(query_words)
    return {m.id: per for m in memories if named(words, m.text)}
