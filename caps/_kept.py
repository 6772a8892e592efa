"""What a clamp made of a message, kept by the message's identity.

The proxy hands the clamps the same message objects turn after turn (an agent resends its
history byte for byte, and the proxy parses each large item once: `proxy/cache/resent.py`).
A clamp's result for a message it saw before is then the very object it made last time: no
text hashed again for the caches below, no dict copied, and the proxy serialises the result
once, not every turn (it keeps bytes by identity too).

Keyed by `id()`, with the message itself kept in the entry: while an entry lives its id
cannot name another object. The contract is the one of `resent`: nothing changes a message
in place. `CTXBUDGET_CHECK_RESENT=1` computes every hit again and fails if it differs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from cachetools import LRUCache

T = TypeVar("T")
_CHECK = os.environ.get("CTXBUDGET_CHECK_RESENT") == "1"


class ChangedInPlace(RuntimeError):
    """A shared object no longer equals what it was: something changed it in place."""


class ByIdentity:
    """Results of a pure function of one object (and hashable extras), by its identity."""

    def __init__(
        self, max_weight: int, weigh: Callable[[Any, Any], int | None], *, check: bool = _CHECK
    ) -> None:
        """Entries of at most `max_weight` in all, each weighing `weigh(obj, result)` (about
        the bytes both hold; None: not worth keeping); `check`, compute every hit again and
        fail if it differs."""
        self.check = check
        self._weigh = weigh
        self._memo: LRUCache[tuple[Any, ...], tuple[Any, Any, int]] = LRUCache(
            maxsize=max_weight, getsizeof=lambda found: found[2]
        )

    def get(self, make: Callable[..., T], obj: Any, *args: Hashable) -> T:
        """`make(obj, *args)`, or what it gave for this very `obj` and equal `args` before."""
        key = (id(obj), args)
        found = self._memo.get(key)
        if found is not None and found[0] is obj:
            if self.check and make(obj, *args) != found[1]:
                raise ChangedInPlace(
                    "an object kept by identity was changed in place: whatever changed it "
                    "must copy it instead (caps/_kept.py)"
                )
            result: T = found[1]
            return result
        result = make(obj, *args)
        weight = self._weigh(obj, result)
        if weight is not None and weight <= self._memo.maxsize:
            self._memo[key] = (obj, result, weight)
        return result


def message_weight(message: Any, result: Any) -> int | None:
    """About the bytes a message and what a clamp made of it hold (its texts, twice); None
    under 1 KB of text: cheap to clamp again, and a new object every turn anyway."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        size = len(content)
    elif isinstance(content, list):
        size = sum(len(p.get("text") or "") for p in content if isinstance(p, dict))
    else:
        return None
    return 2 * size + 400 if size >= 1024 else None


def bytes_weight(obj: Any, data: bytes) -> int | None:
    """For a result that is an object's JSON: the JSON and the object, about twice it; None
    under 1 KB."""
    return 2 * len(data) + 400 if len(data) >= 1024 else None
