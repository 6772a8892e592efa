"""What ctxbudget knows of each conversation's previous request: one object, one owner, one
bound (issue 34).

An agent's request N+1 is request N plus a turn or two. `Conversation` holds what was read and
decided for request N — its bytes, where each item of its growing list ends, the objects they
parsed to, and per item what the later stages made of them: the clamp's decisions
(`caps.ClampState`), the client blocks' serial bytes and digests (`ClientPrefix`), how far
the wire's checks got. Request N+1 is compared with it byte for byte (`find`: memcmp), and its
first k items are then the very objects request N had: every stage takes what it decided for
those k from here and works only the items after them.

`Conversations` is the one cache of them: built in `create_app` (`ProxyState.conversations`),
cleared when the app closes; the offload worker has its own. Each owner's few newest
conversations (an agent may run a subagent's beside its own on one key), found only by that
owner; at most `keep_bytes` in all, the owner holding the most giving way first, so one
tenant's long sessions never push out another's.

A state is never changed once its request is read: a later request copies what it extends
(two requests may extend one conversation, a subagent's and its parent's), or appends past
what is the state's and says how much is (`Checked.known`).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Sequence
from itertools import compress, count, islice
from operator import is_not
from typing import Any

from ctxbudget.caps import ClampState
from ctxbudget.caps._kept import footprint
from ctxbudget.proxy.cache.prefix import ClientPrefix
from ctxbudget.proxy.wire.history import Found, extends, kept_items, locate
from ctxbudget.proxy.wire.scan import TAILS, structure

STATE_BYTES_AN_ITEM = 400
"""What a conversation's state holds for each item beyond its object (list slots, the clamp's
per-item entries, serial digests): counted toward the bound, with the body and the objects."""


class Conversation:
    """One conversation's previous request: its growing list as read, and what each stage
    decided for its items."""

    __slots__ = (
        "raw",
        "key",
        "start",
        "starts",
        "ends",
        "structure",
        "parsed",
        "where",
        "clamp",
        "client",
        "checked",
        "view",
        "blocks",
        "spliced",
        "clamped",
        "tally",
        "pruned",
        "undecided",
        "weights",
        "weight",
    )

    def __init__(
        self,
        raw: bytes,
        key: str,
        start: int,
        starts: array[int],
        ends: array[int],
        counts: array[int],
        parsed: list[Any],
        weights: array[int],
        where: dict[int, int],
    ) -> None:
        self.raw = raw
        """The body it came in (nothing else of it is kept: no item holds another buffer)."""
        self.key = key
        """The list's field: `messages` or `input`."""
        self.start = start
        """Where its list's items start in `raw` (after the `[`)."""
        self.starts = starts
        """Where each item starts in `raw`."""
        self.ends = ends
        """Where each item ends."""
        self.structure = counts
        """`structure` from `start` to each item's end."""
        self.parsed = parsed
        """The items' objects (`proxy/cache/resent.py`), shared by the owner's requests: the
        very list the request's parse made (`JsonBody._items_parsed`), not a copy."""
        self.where = where
        """Each of `parsed`'s objects' index, by its id, and ids of objects of the requests
        before (an item dropped since): an object is in `parsed[:k]` when its entry `j` is
        below `k` and `parsed[j]` is it (`index_of`). Copied from the state extended (a
        memcpy, ~2 µs for 700 items) and the new items added, where a set of ids of the whole
        list was made again each request (~35 µs for 700)."""
        self.clamp: ClampState | None = None
        """The clamp's decisions for the request's messages, as the clamp saw them (chat's
        messages, or the view's: `view`)."""
        self.client: tuple[ClientPrefix, int] | None = None
        """The request's blocks as the client sent them, serialised and hashed, and how many
        blocks came before the list's (tools, system)."""
        self.checked: Any = None
        """How far the wire's checks of the items went, and what they carry from one item to
        the next (Messages: the `tool_use` ids seen); the format's own."""
        self.view: Any = None
        """The format's chat-shaped view of the items (Messages, Responses), per item."""
        self.blocks: dict[bool, tuple[list[Any], list[Any]]] = {}
        """The items' blocks (`paired`) as last made, with the forwarded items they show: as
        sent (True), and as changed (False)."""
        self.clamped: list[Any] | None = None
        """The list the clamp wrote (chat's messages, Messages' items as written back): the
        next request's clamp starts its own with the very items of this one, so its blocks
        are taken as made without comparing them (`InProcessRequest._paired`)."""
        self.spliced: tuple[list[Any], list[Any], list[int], array[int]] | None = None
        """The list as last written back (`JsonBody.encode`): its items, the chunks its JSON
        was sent in (but the closing `]`), where each chunk ends, where each item ends."""
        self.tally: Any = None
        """The report's tally of the request's segments (`proxy/report/tally.py`): each
        one's tokens and entry, and their sums."""
        self.pruned: Any = None
        """What pruning's second pass did to the list (`caps.prune.Applied`): the next
        request carries it for the items it repeats (`proxy/wire/pruned.py`)."""
        self.undecided: Any = None
        """The prunable results no decision was taken for (`proxy/pipeline/prune.py`)."""
        self.weights = weights
        """What the state holds for the items up to each one: its object (`footprint`) and
        `STATE_BYTES_AN_ITEM`.

        These four are arrays, not lists: a list of ints is a container the garbage
        collector walks item by item, each young collection the newest state's (copied a
        request), and a full one every kept state's; an array holds no objects (it visits
        only its type)."""
        self.weight = len(raw) + (weights[-1] if weights else 0)
        """What it holds: the body, and `weights` of all its items."""


def index_of(where: dict[int, int], items: Sequence[Any], item: Any) -> int | None:
    """Where `item` (the very object) is in `items`, by `where` (a `Conversation.where` whose
    `parsed` starts with `items`); None when it is not there."""
    j = where.get(id(item))
    return j if j is not None and j < len(items) and items[j] is item else None


def _ints() -> array[int]:
    """An empty array of offsets, counts or weights (signed 64-bit)."""
    return array("q")


def same_prefix(new: Sequence[Any], old: Sequence[Any], limit: int) -> int:
    """How many of the first `limit` items of `new` are the very objects of `old` (a C scan:
    ~20 ns an item, no Python per item)."""
    limit = min(limit, len(new), len(old))
    return next(compress(count(), islice(map(is_not, new, old), limit)), limit)


class Checked:
    """How far a format's check of a conversation's items went (`Conversation.checked`), and
    where each call id (a `tool_use`'s, a `function_call`'s) was first seen: what the next
    request's check resumes from.

    The next request's check appends its new ids to these very lists (`at`), where it copied
    them less the ids after the items it kept (~3 µs at turn 300, the lists of every call of
    the history); so `known` says how many of `firsts` are this check's. A request that
    extends one the next one already extended (a subagent's, a retry) finds more after them,
    and copies its own. A check runs whole on the event loop, never two at once."""

    __slots__ = ("count", "firsts", "calls", "known", "lenient")

    def __init__(
        self,
        count: int,
        firsts: list[tuple[int, str]],
        calls: dict[str, int],
        *,
        lenient: bool = False,
    ) -> None:
        self.count = count
        self.firsts = firsts
        """(item index, id) of each id's first call, in order; and those of the checks that
        extended this one after `known`."""
        self.calls = calls
        """The same, by id: what a result is looked up in."""
        self.known = len(firsts)
        """How many of `firsts` (and `calls`) are this check's."""
        self.lenient = lenient
        """Checked letting a result answer a call not seen (a Responses continuation's):
        resumed only by a request checked so too."""

    def at(self, kept: int, *, lenient: bool = False) -> tuple[int, Seen | None]:
        """Where a request that repeats the first `kept` messages starts checking, and the ids
        seen before it (from the start, with none, past what was checked): the very lists,
        for the check to go on appending to, when no id came after those items (nor from
        another request); else copies (a memcpy) less the ids after them."""
        if kept > self.count or (self.lenient and not lenient):
            return 0, None
        cut = bisect_left(self.firsts, (kept, ""), 0, self.known)
        if cut == len(self.firsts):
            return kept, (self.firsts, self.calls)
        calls = self.calls.copy()
        for _, gone in self.firsts[cut:]:
            del calls[gone]
        return kept, (self.firsts[:cut], calls)


Seen = tuple[list[tuple[int, str]], dict[str, int]]
"""The call ids seen before an item: in order (`Checked.firsts`), and by id."""


class Conversations:
    """The conversations each owner sent last (`find`, `remember`), bounded by bytes."""

    def __init__(
        self, *, keep_bytes: int = 48 << 20, min_size: int = 8192, per_owner: int = 4
    ) -> None:
        self._by_owner: dict[str, list[Conversation]] = {}
        """Each owner's conversations, newest first."""
        self._weights: dict[str, int] = {}
        self.keep_bytes = keep_bytes
        self._total = 0
        self._min = min_size
        """Shorter lists are scanned again: it costs little."""
        self._per_owner = per_owner
        self._last: tuple[bytes, str, Found | None] | None = None
        """The last `find` (the offload check and the parse ask about the same body)."""
        self._kept: tuple[bytes, str, tuple[Conversation, int] | None] | None = None
        """The last `_furthest`: the conversation a body repeats the most of, which `find`
        asks again of the body `new_bytes` asked about (each a compare of up to the whole
        body)."""

    @property
    def weight(self) -> int:
        """What it holds (bytes and `STATE_BYTES_AN_ITEM` an item): at most `keep_bytes`."""
        return self._total

    def clear(self) -> None:
        """Let everything go (the app closes; the worker is past its memory bound)."""
        self._by_owner.clear()
        self._weights.clear()
        self._total = 0
        self._last = None
        self._kept = None

    def new_bytes(self, raw: bytes, owner: str = "") -> int:
        """The bytes of `raw` after the first items of a list `owner` sent before, where
        `raw` is those same bytes up to them; all of them when it extends none. Only compared
        (memcmp, a few times), nothing scanned: what the offload decides by before reading."""
        furthest = self._furthest(raw, owner)
        return len(raw) if furthest is None else len(raw) - furthest[0].ends[furthest[1] - 1]

    def _furthest(self, raw: bytes, owner: str) -> tuple[Conversation, int] | None:
        """The conversation of `owner`'s that `raw` repeats the most bytes of, and how many of
        its items; None when it repeats none. A subagent's request shares its parent's first
        items and is often the newer: the parent's next turn must resume from the parent's,
        not from that one shared item with all the rest read again (on the event loop, as
        the offload was decided by `new_bytes`). Asked twice of one body (the offload's
        check, then the parse), it is compared once (`_kept`: a state never changes)."""
        asked = self._kept
        if asked is not None and asked[0] is raw and asked[1] == owner:
            return asked[2]
        best: tuple[Conversation, int] | None = None
        for conversation in self._by_owner.get(owner, ()):
            kept = kept_items(raw, conversation)
            if kept and (best is None or conversation.ends[kept - 1] > best[0].ends[best[1] - 1]):
                best = (conversation, kept)
        self._kept = (raw, owner, best)
        return best

    def drop(self, raw: bytes) -> None:
        """Forget the last `find`, of `raw`: a body read elsewhere (the offload worker's),
        which `remember` will not see, so nothing here holds it (up to 30 MB) after."""
        if self._last is not None and self._last[0] is raw:
            self._last = None
        if self._kept is not None and self._kept[0] is raw:
            self._kept = None

    def structure(self, raw: bytes, owner: str = "") -> int:
        """`structure(raw)`: its `{` and `[`, those of the old items counted once (and the
        tools: `Tails`)."""
        found = self.find(raw, owner) if owner in self._by_owner else None
        if found is None:
            return TAILS.structure(raw, owner)
        h, kept = found.history, found.kept
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
        furthest = self._furthest(raw, owner)
        self._kept = None  # found: `remember` or `drop` follows, with this body's answer
        # only the one `new_bytes` named: another would leave more to read than it said
        found = None if furthest is None else extends(raw, *furthest, owner)
        self._last = (raw, owner, found)
        return found

    def remember(
        self, raw: bytes, owner: str, key: str, value: Any, items: Sequence[Any], parsed: list[Any]
    ) -> Conversation | None:
        """Remember `raw`'s list `key` (its raw `value`, `items` and their objects) as one
        `owner` sent, and return its state for the stages to fill; None for a short list (not
        kept)."""
        last = self._last
        found = last[2] if last is not None and last[0] is raw and last[1] == owner else None
        if last is not None and last[0] is raw:
            self._last = None  # read: the body (up to 1 MiB, 30 in the worker) is not kept
        if len(value) < self._min or not items:
            return None
        if found is not None and found.key == key:
            # the same head: the list starts where it did, its old items end where they did
            h, kept = found.history, found.kept
            start, starts, ends = h.start, h.starts[:kept], h.ends[:kept]
            counts, weights = h.structure[:kept], h.weights[:kept]
            # past twice its items (a dropped item's id a request): made again, rarely
            where = h.where.copy() if len(h.where) <= 2 * len(parsed) + 64 else None
        else:
            where = None
            data = bytes(value)
            at = raw.find(data)
            if at < 0 or raw.find(data, at + 1) >= 0:
                return None  # not found once and only once: where it is stays unknown
            start = at + 1
            starts, ends, counts, weights = _ints(), _ints(), _ints(), _ints()
        if not locate(raw, start, items, starts, ends, counts):
            return None
        if where is None:
            where, done = {}, 0
        else:
            done = len(weights)
        where.update(zip(map(id, parsed[done:]), range(done, len(parsed)), strict=True))
        total = weights[-1] if weights else 0
        for n in range(len(weights), len(parsed)):  # the new items' objects, weighed once
            found_weight = footprint(parsed[n])
            total += STATE_BYTES_AN_ITEM + (
                found_weight if found_weight is not None else 8 * len(items[n])
            )
            weights.append(total)
        # the request's own list (`JsonBody._items_parsed` made it), not a copy: nothing
        # changes a request's list in place (the wires and the clamp copy what they change)
        new = Conversation(raw, key, start, starts, ends, counts, parsed, weights, where)
        if new.weight > self.keep_bytes:
            return None
        # the next turn of the conversation it extends takes its place; a request that only
        # starts the same (a subagent's, with its parent's system prompt) is one of its own
        replaced = None
        if found is not None and 2 * found.kept >= len(found.history.ends):
            replaced = found.history
        before = self._by_owner.get(owner, [])
        newest = [new, *(c for c in before if c is not replaced)][: self._per_owner]
        weight = sum(c.weight for c in newest)
        self._total += weight - self._weights.get(owner, 0)
        self._by_owner[owner] = newest
        self._weights[owner] = weight
        while self._total > self.keep_bytes:
            self._evict(owner)
        return new if any(c is new for c in self._by_owner.get(owner, ())) else None

    def grew(self, owner: str, conversation: Conversation, weight: int) -> None:
        """`conversation` (`owner`'s) holds `weight` more: what a stage decided for its new
        items (the clamp's copies of the messages it cut, their segments)."""
        if not any(c is conversation for c in self._by_owner.get(owner, ())):
            return  # let go already: what it holds goes with it
        conversation.weight += weight
        self._weights[owner] += weight
        self._total += weight
        while self._total > self.keep_bytes:
            self._evict(owner)

    def _evict(self, owner: str) -> None:
        """The oldest conversation of the owner holding the most goes (on a tie, `owner`'s,
        whose new one went over)."""
        most = max(self._weights, key=self._weights.__getitem__)
        if self._weights.get(owner, 0) >= self._weights[most]:
            most = owner
        conversations = self._by_owner[most]
        gone = conversations.pop()
        self._total -= gone.weight
        self._weights[most] -= gone.weight
        if not conversations:
            del self._by_owner[most]
            del self._weights[most]

    def owners(self) -> int:
        """Owners with a conversation kept."""
        return len(self._by_owner)
