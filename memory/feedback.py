"""The second hop of deep recall: pseudo-relevance feedback from the best first-hop memories.

A multi-hop question names one thing and needs another: "what did Melanie's kids make in
pottery class?" finds the memories about pottery class, and the memory that answers it talks
about the kids' clay bowls without the word "pottery". The words the best first-hop memories
share, weighted by how rare they are among the owner's memories, are searched as a second
query, worth `WEIGHT` of the first. When the query names a speaker (`memory/speaker.py`), the
words are taken from that speaker's best memories first: what Melanie said about the pottery
class, not what Caroline asked about it. Nothing is learned or stored: the same memories and
the same query give the same words.

    >>> second_hop(
    ...     ["Melanie: the kids made clay bowls at the pottery class",
    ...      "Melanie: pottery class again, clay everywhere"],
    ...     {"melanie": 40, "kids": 9, "made": 12, "clay": 2, "bowls": 1, "pottery": 3,
    ...      "class": 6, "again": 20, "everywhere": 4},
    ...     total=100,
    ...     exclude={"pottery", "kids"},
    ...     terms=3,
    ... )
    ['clay', 'class', 'bowls']
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

from ctxbudget.memory.schema import words_of
from ctxbudget.memory.store import STOPWORDS
from ctxbudget.memory.types import Memory

FROM = 5
"""First-hop memories the second hop's words are taken from (the best, by keyword score;
`sources`)."""
TERMS = 10
"""Most words the second hop searches for."""
WEIGHT = 0.4
"""What a second-hop match is worth against a first-hop match of the same BM25 score."""
NAMED = 2.0
"""How much more a first-hop memory said by someone the query names counts when choosing the
`FROM` memories the second hop reads."""
POOL = 30
"""Most memories the second hop brings (its best, by BM25): each is one more candidate."""
SCAN = 2_000
"""Most matching memories the second hop ranks (its words rarest first, as the first hop's):
its words are meant to be rare, and a common one would cost as much as the first hop."""


def sources(
    found: Sequence[tuple[Memory, float]], named: Collection[int], *, n: int = FROM
) -> list[Memory]:
    """The `n` first-hop memories the second hop reads: the best by keyword score, that of a
    memory whose speaker the query names (`named`, ids) counted `NAMED` times; ties by id.

    >>> from ctxbudget.memory.types import Memory
    >>> def m(i):
    ...     return Memory(id=i, owner="o", text="", category="fact", source="inferred",
    ...                   scope="global", created=0.0, last_accessed=0.0, access_count=0)
    >>> [x.id for x in sources([(m(1), 3.0), (m(2), 2.0), (m(3), 1.2)], named={3}, n=2)]
    [1, 3]
    """

    def weight(pair: tuple[Memory, float]) -> tuple[float, int]:
        memory, score = pair
        return -score * (NAMED if memory.id in named else 1.0), memory.id

    return [memory for memory, _ in sorted(found, key=weight)[:n]]


def candidate_words(texts: Sequence[str], exclude: Collection[str]) -> list[str]:
    """The words of `texts` a second hop could search for, in a fixed order.

    Stopwords, numbers, words shorter than 3 letters and the query's own words are left out.
    """
    found = {
        w
        for text in texts
        for w in words_of(text)
        if len(w) >= 3 and not w.isdigit() and w not in STOPWORDS and w not in exclude
    }
    return sorted(found)


def second_hop(
    texts: Sequence[str],
    counts: Mapping[str, int],
    *,
    total: int,
    exclude: Collection[str],
    terms: int = TERMS,
) -> list[str]:
    """The `terms` words of `texts` that best say what they share, best first.

    A word's weight is its inverse document frequency among the owner's `total` memories
    (`counts`: how many hold each word), summed over the texts that hold it: a rare word the
    best memories share beats a word common to every memory. Ties go alphabetically.
    """
    weight: dict[str, float] = {}
    for text in texts:
        for word in candidate_words([text], exclude):
            count = max(counts.get(word, 0), 1)
            idf = math.log(1 + (total - count + 0.5) / (count + 0.5))
            weight[word] = weight.get(word, 0.0) + idf
    ranked = sorted(weight.items(), key=lambda pair: (-pair[1], pair[0]))
    return [word for word, _ in ranked[:terms]]
