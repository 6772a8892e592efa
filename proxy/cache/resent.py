"""The items of an agent's history, parsed once: every turn resends them byte for byte.

An agent's request N+1 is request N plus a turn or two: the same 48 KB system prompt, the
same tool results, in the same bytes. Parsing them again cost ~70 µs of a 186 KB request,
and every later stage paid again for objects it had seen before: the clamps' caches hash
their texts (~25 µs for 50 KB) where a text seen before has its hash kept on the object.

So a large item of `messages` (`input`, `system`) is parsed once per owner and found again
by the digest of its bytes: the next request holds the very objects the last one did.
Those objects are shared between requests, so **nothing may change them in place**: the
wires and the clamps copy what they change (they always have: `_splice` relies on it).
`CTXBUDGET_CHECK_RESENT=1` (the test suite sets it) re-parses every item found and fails
the request if it no longer equals what was kept.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import xxhash

from ctxbudget.caps._kept import ChangedInPlace, Generations

__all__ = ["RESENT", "ChangedInPlace", "Resent"]

_SEED = secrets.randbits(64)
"""Unknown outside this process: no client can make two items digest alike."""


class Resent:
    """Parsed list items by owner and the digest of their bytes (`parse`)."""

    def __init__(
        self,
        *,
        max_bytes: int = 32 << 20,
        min_item: int = 128,
        min_list: int = 8192,
        max_items: int = 4096,
        check: bool = False,
    ) -> None:
        self._kept: Generations[tuple[str, bytes], Any] = Generations(max_bytes)
        """Items by owner and digest, each weighing what its objects take (`_weight`)."""
        self.min_item = min_item
        """Smaller items are not kept (`{"role": "user", "content": "ok"}`): parsing one
        takes less than a lookup, and nothing downstream keeps anything of it."""
        self.min_list = min_list
        """Smaller lists are parsed whole (`JsonBody.get`)."""
        self.max_items = max_items
        """Longer lists are parsed whole: one call beats many for thousands of small items."""
        self.check = check

    def parse(
        self,
        items: Sequence[Any],
        owner: str,
        loads: Callable[[memoryview], Any],
        *,
        taken: Sequence[Any] = (),
        index: Callable[[Any], int | None] | None = None,
    ) -> list[Any]:
        """Each of `items` (the client's bytes of each) parsed with `loads`, or as kept; never
        an object of `taken` (the items before them in the same list). `index`: where an
        object is in `taken` (None: not there), when the caller knows without looking at them
        all (`Conversation.where`)."""
        out: list[Any] = []
        # the ids of the objects already in the list, made at the first kept value found (a
        # conversation's new items are mostly new bytes: its 600 old ones not gone over);
        # with `index`, those of `out` only (OpenClaw's context message, the same bytes every
        # request, made a set of the whole history each turn)
        used: set[int] | None = None
        for item in items:
            view = memoryview(item)
            if len(view) < self.min_item:
                out.append(loads(view))
                continue
            key = (owner, xxhash.xxh3_128_digest(view, _SEED))
            value = self._kept.get(key)
            if value is None:
                value = loads(view)
                self._kept.put(key, value, weight=_weight(item))
            else:
                # the same bytes twice in one request: two objects, as a whole parse gives
                # (the kept one stays kept)
                if used is None:
                    used = set(map(id, out))
                    if index is None:
                        used.update(map(id, taken))
                if id(value) in used or (index is not None and index(value) is not None):
                    value = loads(view)
                elif self.check:
                    self.verify((view,), (value,), loads)
            if used is not None:
                used.add(id(value))
            out.append(value)
        return out

    def verify(
        self, items: Sequence[Any], parsed: Sequence[Any], loads: Callable[[memoryview], Any]
    ) -> None:
        """With `check`: `ChangedInPlace` unless each of `parsed` still equals its item."""
        for item, value in zip(items, parsed, strict=True):
            if loads(memoryview(item)) != value:
                raise ChangedInPlace(
                    "an item kept from an earlier request was changed in place: whatever "
                    "changed it must copy it instead (proxy/cache/resent.py)"
                )

    def clear(self) -> None:
        self._kept.clear()


def _weight(item: Any) -> int:
    """About the bytes an item's objects take: twice its text (a parsed character takes up to
    4 bytes; most are ASCII, one) and ~100 a list or object (`{}` parses to a 64-byte dict)."""
    data = bytes(item) if not isinstance(item, bytes) else item
    return 2 * len(data) + 100 * (data.count(b"{") + data.count(b"[")) + 400


RESENT = Resent(check=os.environ.get("CTXBUDGET_CHECK_RESENT") == "1")
