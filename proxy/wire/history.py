"""An agent's growing list, read once: request N+1 is request N's body with a turn or two
added to `messages` (`input`), and all the items before those are the same bytes.

Scanning that list cost three passes over it on every request: the `{` count that decides
the offload, the top-level scan that checks the document, and the split into items; then
each item was digested to be found in `resent`. A 300 KB request of a long session spent
~0.5 ms there. So the lists each owner sent last are remembered — where each item ends in
the body, the items, the objects they parsed to — and a body with the same bytes up to the
end of some of those items has only the rest read: the part before and after them, a number
standing for them, is scanned as a document of its own (`Tails` still skips the tools), and
the old items and their objects are taken as they were. Not all of them need to come back:
OpenClaw ends each request with a context message it drops from the next one.

Exact or nothing: the bytes before the old items must be the same too, the field's value must
start with the stand-in (a number drawn in this process: no client can write it elsewhere),
and anything unexpected falls back to the full scan, which says what is wrong with a bad
body.

>>> import orjson
>>> h = Histories(min_size=8)
>>> first = b'{"model":"m","messages":[{"a":1},{"b":2},{"ctx":0}],"n":1}'
>>> fields = TOP.decode(first)
>>> items = ITEMS.decode(fields["messages"])
>>> parsed = [orjson.loads(memoryview(i)) for i in items]
>>> h.remember(first, "", "messages", fields["messages"], items, parsed)
>>> later = b'{"model":"m","messages":[{"a":1},{"b":2},{"c":3}],"n":2}'
>>> found = h.find(later)
>>> bytes(found.fields["messages"]), bytes(found.fields["n"]), found.parsed == parsed[:2]
(b'[{"a":1},{"b":2},{"c":3}]', b'2', True)
>>> [bytes(i) for i in found.items]
[b'{"a":1}', b'{"b":2}', b'{"c":3}']
>>> h.find(b'{"model":"m","messages":[{"a":2},{"b":2}],"n":2}') is None  # changed: scanned
True
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec
from cachetools import LRUCache

from ctxbudget.proxy.wire.scan import ITEMS, TAILS, TOP, structure


class _History(NamedTuple):
    raw: bytes
    """The body it came in (nothing else of it is kept: no item holds another buffer)."""
    key: str
    start: int
    """Where its list's items start in `raw` (after the `[`)."""
    starts: list[int]
    """Where each item starts in `raw`."""
    ends: list[int]
    """Where each item ends."""
    structure: list[int]
    """`structure` from `start` to each item's end."""
    parsed: list[Any]


class Found(NamedTuple):
    """A body that extends a list its owner sent before."""

    key: str
    fields: dict[str, Any]
    """The body's top-level fields, as a full scan gives them."""
    items: list[Any]
    """The list's items as sent (the old ones from the body they came in)."""
    parsed: list[Any]
    """The old items' objects: the first `len(parsed)` of the list."""
    history: _History
    """What it extends."""
    tail: tuple[int, int] | None = None
    """The length and the `structure` of the tail (`Tails`) it ends with, when it was read with
    one: then its `fields` are known to be valid UTF-8 too (`Tails.read` checked the part it
    scanned, and the tail was checked when first seen)."""


class Histories:
    """The growing lists each owner sent last (`find`, `remember`): a few per owner, as an
    agent may run a subagent's session beside its own on one key."""

    def __init__(
        self, *, keep_bytes: int = 32 << 20, min_size: int = 8192, per_owner: int = 4
    ) -> None:
        self._by_owner: LRUCache[str, list[_History]] = LRUCache(
            maxsize=keep_bytes, getsizeof=lambda found: sum(_weight(h) for h in found)
        )
        """Each owner's last bodies, newest first (each weighs its bytes and its items)."""
        self._min = min_size
        """Shorter lists are scanned again: it costs little."""
        self._per_owner = per_owner
        self._last: tuple[bytes, str, Found | None] | None = None
        """The last `find` (the offload check and the parse ask about the same body)."""

    def clear(self) -> None:
        self._by_owner.clear()
        self._last = None

    def new_bytes(self, raw: bytes, owner: str = "") -> int:
        """The bytes of `raw` after the first items of a list `owner` sent before, where
        `raw` is those same bytes up to them; all of them when it extends none. Only compared
        (memcmp, a few times), nothing scanned: what the offload decides by before reading."""
        found = len(raw)
        for history in self._by_owner.get(owner, ()):
            kept = _kept(raw, history)
            if kept:
                found = min(found, len(raw) - history.ends[kept - 1])
        return found

    def drop(self, raw: bytes) -> None:
        """Forget the last `find`, of `raw`: a body read elsewhere (the offload worker's),
        which `remember` will not see, so nothing here holds it (up to 30 MB) after."""
        if self._last is not None and self._last[0] is raw:
            self._last = None

    def structure(self, raw: bytes, owner: str = "") -> int:
        """`structure(raw)`: its `{` and `[`, those of the old items counted once (and the
        tools: `Tails`)."""
        found = self.find(raw, owner) if owner in self._by_owner else None
        if found is None:
            return TAILS.structure(raw, owner)
        h, kept = found.history, len(found.parsed)
        end = h.ends[kept - 1]
        head = structure(raw, 0, h.start)
        if found.tail is None:
            return head + h.structure[kept - 1] + TAILS.structure(raw, owner, start=end)
        size, tail = found.tail  # read with it: the tail's bytes were compared then
        return head + h.structure[kept - 1] + structure(raw, end, len(raw) - size) + tail

    def find(self, raw: bytes, owner: str = "") -> Found | None:
        """`raw` read as an extension of a list `owner` sent before; None when it is not one."""
        last = self._last
        if last is not None and last[0] is raw and last[1] == owner:
            return last[2]
        found = None
        for history in self._by_owner.get(owner, ()):
            found = _extends(raw, history, owner)
            if found is not None:
                break
        self._last = (raw, owner, found)
        return found

    def remember(
        self, raw: bytes, owner: str, key: str, value: Any, items: list[Any], parsed: list[Any]
    ) -> None:
        """Remember `raw`'s list `key` (its raw `value`, `items` and their objects) as one
        `owner` sent; a short list is not kept."""
        last = self._last
        found = last[2] if last is not None and last[0] is raw and last[1] == owner else None
        if last is not None and last[0] is raw:
            self._last = None  # read: the body (up to 1 MiB, 30 in the worker) is not kept
        if len(value) < self._min or not items:
            return
        if found is not None and found.key == key:
            # the same head: the list starts where it did, its old items end where they did
            h, kept = found.history, len(found.parsed)
            start, starts, ends = h.start, h.starts[:kept], h.ends[:kept]
            counts = h.structure[:kept]
        else:
            data = bytes(value)
            at = raw.find(data)
            if at < 0 or raw.find(data, at + 1) >= 0:
                return  # not found once and only once: where it is stays unknown
            start, starts, ends, counts = at + 1, [], [], []
        if not _locate(raw, start, items, starts, ends, counts):
            return
        new = _History(raw, key, start, starts, ends, counts, list(parsed))
        kept_before = self._by_owner.get(owner, ())
        others = [h for h in kept_before if found is None or h is not found.history]
        entry = [new, *others][: self._per_owner]
        if sum(_weight(h) for h in entry) <= self._by_owner.maxsize:
            self._by_owner[owner] = entry


def _locate(
    raw: bytes,
    start: int,
    items: Sequence[Any],
    starts: list[int],
    ends: list[int],
    counts: list[int],
) -> bool:
    """Extend `starts`, `ends` and `counts` (of the first `len(ends)` items) to all `items`
    of the list whose items start at `start` in `raw`; False when an item is not where it
    should be."""
    at = ends[-1] if ends else start
    total = counts[-1] if counts else 0
    for item in items[len(ends) :]:
        while raw[at : at + 1] in _BETWEEN:  # `,` and white space before the item
            at += 1
        if not raw.startswith(item, at):
            return False
        end = at + len(item)
        total += structure(raw, at, end)
        starts.append(at)
        ends.append(end)
        counts.append(total)
        at = end
    return True


_BETWEEN = (b",", b" ", b"\n", b"\r", b"\t")


def _weight(history: _History) -> int:
    return len(history.raw) + 100 * len(history.ends)  # the objects are `resent`'s


def _extends(raw: bytes, history: _History, owner: str) -> Found | None:
    """`raw` read as the first items of `history` and more, or None."""
    kept = _kept(raw, history)
    if kept == 0:
        return None
    start, end = history.start, history.ends[kept - 1]
    view = memoryview(raw)
    try:
        # the part before the tools (`Tails`) with the stand-in, or the whole body with it
        read = TAILS.read(raw, owner, stand_in=(start, end, _STAND_IN))
        tail: tuple[int, int] | None = None
        if read is not None:
            found_fields, tail = read[0], read[1:]
        else:
            found_fields = TOP.decode(b"".join((view[:start], _STAND_IN, view[end:])))
        value = found_fields.get(history.key)
        # the field's value (the last one, were the key given twice) is where the stand-in
        # is: no client can write the stand-in elsewhere
        if value is None or bytes(memoryview(value)[: len(_OPEN)]) != _OPEN:
            return None
        new = ITEMS.decode(value)[1:]
    except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError):
        return None  # the full scan says what is wrong
    fields: dict[str, Any] = dict(found_fields)
    fields[history.key] = view[start - 1 : end + len(value) - len(_OPEN)]
    # the old items as slices of this body (the same bytes where they were in the last)
    items: list[Any] = [
        view[a:b] for a, b in zip(history.starts[:kept], history.ends[:kept], strict=True)
    ]
    items += new
    return Found(history.key, fields, items, history.parsed[:kept], history, tail)


def _kept(raw: bytes, history: _History) -> int:
    """How many of `history`'s first items `raw` has, the same bytes from its start, each
    followed by `,` or `]` (all, all but the last, or found by halving)."""
    old = memoryview(history.raw)
    ends = history.ends

    def has(n: int) -> bool:
        end = ends[n - 1]
        return raw.startswith(old[:end]) and raw[end : end + 1] in (b",", b"]")

    n = len(ends)
    if has(n):
        return n
    if n > 1 and has(n - 1):
        return n - 1
    low, high = 0, n - 2  # has(low) holds (0 items: nothing to keep), has(high + 1) does not
    while low < high:
        mid = (low + high + 1) // 2
        if has(mid):
            low = mid
        else:
            high = mid - 1
    return low


_STAND_IN = str(secrets.randbits(63)).encode()
"""What stands for the old items in the part of a body that is scanned: a number only this
process knows."""
_OPEN = b"[" + _STAND_IN


HISTORIES = Histories()
