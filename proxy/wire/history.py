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

The lists are kept in the app's `Conversations` (`proxy/wire/conversations.py`), with what the
stages decided for their items; this module reads a body against one of them.

>>> import orjson
>>> from ctxbudget.proxy.wire.conversations import Conversations
>>> h = Conversations(min_size=8)
>>> first = b'{"model":"m","messages":[{"a":1},{"b":2},{"ctx":0}],"n":1}'
>>> fields = TOP.decode(first)
>>> items = ITEMS.decode(fields["messages"])
>>> parsed = [orjson.loads(memoryview(i)) for i in items]
>>> h.remember(first, "", "messages", fields["messages"], items, parsed) is not None
True
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
from collections.abc import MutableSequence, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, overload

import msgspec

from ctxbudget.proxy.wire.scan import ITEMS, TAILS, TOP, structure

if TYPE_CHECKING:
    from ctxbudget.proxy.wire.conversations import Conversation


class Found(NamedTuple):
    """A body that extends a list its owner sent before."""

    key: str
    fields: dict[str, Any]
    """The body's top-level fields, as a full scan gives them."""
    items: Items
    """The list's items as sent (the old ones from the body they came in)."""
    kept: int
    """How many of the old items it has: the first `kept` of the list, whose objects are the
    first `kept` of `history.parsed`."""
    history: Conversation
    """What it extends."""
    tail: tuple[int, int] | None = None
    """The length and the `structure` of the tail (`Tails`) it ends with, when it was read with
    one (`Tails.read` checked the part it scanned, and the tail was checked when first seen)."""
    valid: bool = False
    """Its `fields` but the list are known to be valid UTF-8: read with a tail, or the part
    scanned (all but the old items) is ASCII. Else `check_utf8` checks them; never the whole
    body, whose old items were checked when first parsed (`isascii` of a 1 MB body: ~35 µs)."""

    @property
    def parsed(self) -> list[Any]:
        """The old items' objects (a copy: the parse makes the request's list from them)."""
        return self.history.parsed[: self.kept]


def locate(
    raw: bytes,
    start: int,
    items: Sequence[Any],
    starts: MutableSequence[int],
    ends: MutableSequence[int],
    counts: MutableSequence[int],
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


def extends(raw: bytes, history: Conversation, kept: int, owner: str) -> Found | None:
    """`raw` read as the first `kept` items of `history` (`kept_items`) and more, or None."""
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
            valid = True
        else:
            document = b"".join((view[:start], _STAND_IN, view[end:]))
            found_fields = TOP.decode(document)
            valid = document.isascii()
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
    items = Items(view, history.starts, history.ends, kept, new)
    return Found(history.key, fields, items, kept, history, tail, valid)


class Items(Sequence[Any]):
    """A body's list items as the client sent them: the old ones (where they were in the
    last body, the same bytes) sliced from it when one is asked for, the new ones as
    scanned. The stages take what they made of the old items from the conversation and
    hardly read one: slicing them all cost ~0.3 ms a request for a 300-turn conversation's
    670 items, ~0.4 µs a memoryview."""

    __slots__ = ("_view", "_starts", "_ends", "_kept", "_new")

    def __init__(
        self,
        view: memoryview,
        starts: Sequence[int],
        ends: Sequence[int],
        kept: int,
        new: list[Any],
    ) -> None:
        self._view, self._starts, self._ends = view, starts, ends
        self._kept, self._new = kept, new

    def __len__(self) -> int:
        return self._kept + len(self._new)

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            old = [self[i] for i in range(start, min(stop, self._kept))]
            return old + self._new[max(start - self._kept, 0) : max(stop - self._kept, 0)]
        if index < 0:
            index += len(self)
        if 0 <= index < self._kept:
            return self._view[self._starts[index] : self._ends[index]]
        if index < 0:
            raise IndexError(index)
        return self._new[index - self._kept]


def kept_items(raw: bytes, history: Conversation) -> int:
    """How many of `history`'s first items `raw` has, the same bytes from its start, each
    followed by `,` or `]` (a few short of all, then one more at a time; or found by
    halving).

    Each comparison starts where the bytes are known to be the same (and none is made past
    where they are known to differ): the body is compared about once, not once a try (a
    Messages body whose marker moved, ~1 MB at turn 300, was compared ~12 times over)."""
    old = memoryview(history.raw)
    ends = history.ends
    same, differs = 0, len(old) + 1  # the bytes up to `same` are equal; up to `differs` not

    def has(n: int) -> bool:
        nonlocal same, differs
        end = ends[n - 1]
        if end >= differs:
            return False
        if end > same:
            if not raw.startswith(old[same:end], same):
                differs = end
                return False
            same = end
        return raw[end : end + 1] in (b",", b"]")

    # a few items short of all first, then one more at a time: each match compares only the
    # bytes past the last one, and the first miss stops at its first differing byte. So the
    # body is compared about once: OpenClaw drops its context message (chat) or moves its
    # marker off the newest result (Messages), and trying all of them first compared it up
    # to there, then again from its first byte (a miss tells not where it differs)
    n = len(ends)
    low = max(n - _BACK, 0)
    if low == 0 or has(low):
        while low < n and has(low + 1):
            low += 1
        return low
    low, high = 0, low - 1  # has(low) holds (0 items: nothing to keep), has(high + 1) not
    while low < high:
        mid = (low + high + 1) // 2
        if has(mid):
            low = mid
        else:
            high = mid - 1
    return low


_BACK = 8
"""How many items short of all `kept_items` tries first (an agent resends all but its last
one or two: OpenClaw's context message, the result its marker moved off)."""


_STAND_IN = str(secrets.randbits(63)).encode()
"""What stands for the old items in the part of a body that is scanned: a number only this
process knows."""
_OPEN = b"[" + _STAND_IN
