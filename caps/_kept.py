"""The cache types the clamps remember with; their instances are the caller's (`caps.Memo`).

What a clamp made of a message is kept by the message's identity.

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
import sys
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
_CHECK = os.environ.get("CTXBUDGET_CHECK_RESENT") == "1"


class ChangedInPlace(RuntimeError):
    """A shared object no longer equals what it was: something changed it in place."""


class Generations(Generic[K, T]):
    """A map of bounded weight, in two generations: new entries and those found again go in
    the new one; when it holds half the weight it becomes the old one, and the old one is
    dropped. What is used stays, what is not goes within two turns of the generations.

    A lookup is two dict lookups in C. `cachetools.LRUCache` keeps an exact order with a
    Python-level update on every hit (~1.5 µs): at a hundred lookups per request (one per
    message of a long session) that cost more than it saved.

    >>> kept = Generations(max_weight=4)
    >>> kept.put("a", 1, weight=2)
    >>> kept.put("b", 2, weight=2)  # the new generation is full: it becomes the old one
    >>> kept.get("a"), kept.get("b")  # found in the old one: back in the new one
    (1, 2)
    >>> kept.put("c", 3, weight=2); kept.get("a")  # "a" went with the old generation
    """

    def __init__(self, max_weight: int) -> None:
        self.max_weight = max_weight
        self._half = max_weight // 2
        self._new: dict[K, tuple[T, int]] = {}
        self._old: dict[K, tuple[T, int]] = {}
        self._weight = 0
        """Of the new generation."""

    def get(self, key: K) -> T | None:
        found = self._new.get(key)
        if found is None:
            found = self._old.pop(key, None)
            if found is None:
                return None
            self._add(key, found)
        return found[0]

    def put(self, key: K, value: T, *, weight: int) -> None:
        """Keep `value` (not when it weighs more than half the bound)."""
        if weight <= self._half:
            self._old.pop(key, None)
            self._add(key, (value, weight))

    def _add(self, key: K, entry: tuple[T, int]) -> None:
        old = self._new.get(key)
        if old is not None:
            self._weight -= old[1]
        if self._weight + entry[1] > self._half:
            self._old, self._new, self._weight = self._new, {}, 0
        self._new[key] = entry
        self._weight += entry[1]

    @property
    def weight(self) -> int:
        """What both generations hold: at most `max_weight`."""
        return self._weight + sum(w for _, w in self._old.values())

    def clear(self) -> None:
        self._new.clear()
        self._old.clear()
        self._weight = 0


class ByValue:
    """Results of a pure function of hashable values, bounded by what it keeps (each entry:
    its string and bytes arguments, three times: they, the result's texts and a segment's
    `original`, ~1 KB of the rest) rather than by a count of entries of any size. One
    instance per function: the function is not part of the key.

    >>> kept = ByValue(20_000)
    >>> kept.get(str.upper, "a" * 1000) is kept.get(str.upper, "a" * 1000)  # kept
    True
    >>> kept.get(str.upper, "b" * 4000) is kept.get(str.upper, "b" * 4000)  # over half: not
    False
    """

    def __init__(self, max_weight: int) -> None:
        self.kept: Generations[tuple[Any, ...], tuple[Any]] = Generations(max_weight)

    def get(self, make: Callable[..., T], *args: Hashable) -> T:
        """`make(*args)`, or what it gave for equal `args` before."""
        found = self.kept.get(args)
        if found is None:
            found = (make(*args),)
            weight = 1024 + 3 * sum(len(a) for a in args if isinstance(a, str | bytes | bytearray))
            self.kept.put(args, found, weight=weight)
        result: T = found[0]
        return result

    @property
    def weight(self) -> int:
        return self.kept.weight

    def clear(self) -> None:
        self.kept.clear()


def weighed(max_weight: int) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """`functools.lru_cache` for a pure function of hashable values, bounded as `ByValue`
    (for the proxy's own module-level caches: never in `caps`, which keeps no state).

    >>> @weighed(20_000)
    ... def upper(text: str) -> str:
    ...     return text.upper()
    >>> upper("a" * 1000) is upper("a" * 1000)  # kept
    True
    >>> upper("b" * 4000) is upper("b" * 4000)  # over half the bound: made each time
    False
    """

    def wrap(function: Callable[..., T]) -> Callable[..., T]:
        kept = ByValue(max_weight)

        def cached(*args: Any) -> T:
            return kept.get(function, *args)

        cached.kept = kept.kept  # type: ignore[attr-defined]
        cached.cache_clear = kept.clear  # type: ignore[attr-defined]
        cached.__wrapped__ = function  # type: ignore[attr-defined]
        cached.__doc__ = function.__doc__
        cached.__name__ = function.__name__
        return cached

    return wrap


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
        self._memo: Generations[tuple[Any, ...], tuple[Any, Any]] = Generations(max_weight)

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
        if weight is not None:
            self._memo.put(key, (obj, result), weight=weight)
        return result

    @property
    def weight(self) -> int:
        return self._memo.weight

    def clear(self) -> None:
        self._memo.clear()


class OfObjects:
    """What was made of several objects, kept by their identities (and hashable extras): the
    view messages and write-back copies of `proxy/wire/view.py`, made of items an agent
    resends. Each entry keeps its objects (their ids name no other while it lives) and weighs
    all it keeps alive (`footprint`)."""

    def __init__(self, max_weight: int, *, check: bool = _CHECK) -> None:
        self.check = check
        self._memo: Generations[tuple[Any, ...], tuple[tuple[Any, ...], Any]] = Generations(
            max_weight
        )

    @property
    def weight(self) -> int:
        """What it keeps, by its entries' weights."""
        return self._memo.weight

    def get(
        self, held: tuple[Any, ...], extra: tuple[Any, ...], make: Callable[..., T], *args: Any
    ) -> T:
        """`make(*args)`, made of the objects `held` (and `extra`, by value), or what it gave
        for these very objects before."""
        key = (*extra, *map(id, held))
        try:
            found = self._memo.get(key)
        except TypeError:  # an extra that is not hashable (a client's odd id): made afresh
            return make(*args)
        if found is not None and all(a is b for a, b in zip(found[0], held, strict=True)):
            if self.check and make(*args) != found[1]:
                raise ChangedInPlace(
                    "an object kept by identity was changed in place: whatever changed it "
                    "must copy it instead (caps/_kept.py)"
                )
            result: T = found[1]
            return result
        result = make(*args)
        weight = footprint((key, held, result))
        if weight is not None:
            self._memo.put(key, (held, result), weight=weight)
        return result

    def clear(self) -> None:
        self._memo.clear()


def footprint(obj: Any, limit: int = 20_000) -> int | None:
    """About the bytes `obj` keeps alive (its strings, lists and dicts, walked); None past
    `limit` of them (not worth keeping: an entry must not hold more than it says)."""
    total = 0
    stack = [obj]
    for _ in range(limit):
        if not stack:
            return total
        item = stack.pop()
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None if stack else total


def message_weight(message: Any, result: Any) -> int | None:
    """What a message and what a clamp made of it keep alive; None under 1 KB of text (cheap
    to clamp again, and a new object every turn anyway) or past `footprint`'s limit."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        size = len(content)
    elif isinstance(content, list):
        # a part's text that is not a string is the client's mistake, left as sent: not ours
        # to raise on (the clamp would give up on the whole request)
        size = sum(
            len(text)
            for p in content
            if isinstance(p, dict) and isinstance(text := p.get("text"), str)
        )
    else:
        return None
    if size < 1024:
        return None
    return _sum(footprint(message), footprint(result))


def bytes_weight(obj: Any, data: bytes, min_size: int = 1024) -> int | None:
    """For a result that is an object's JSON: the JSON and what the object keeps alive; None
    under `min_size` bytes of JSON."""
    return _sum(footprint(obj), len(data)) if len(data) >= min_size else None


def _sum(*weights: int | None) -> int | None:
    return None if None in weights else sum(w for w in weights if w is not None)
