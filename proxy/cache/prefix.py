"""A request's blocks as the client sent them (`ClientPrefix`), serialised and hashed once.

An agent resends its whole history every turn: a block the client (an owner) sent before is
found by the bytes it sent (`_SERIALS`) or by the object the wire kept for it (`_CLIENT_KEPT`,
`proxy/cache/resent.py`), and is neither serialised nor hashed again. The conversation id
(`ClientPrefix.conversation`) comes from `shared_digest`, the same in every worker and every
instance.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from cachetools import LRUCache

from ctxbudget.caps._kept import ByIdentity, bytes_weight
from ctxbudget.proxy.cache.blocks import (
    _BYTES_KEPT,
    _BYTES_KEPT_MIN,
    DIGEST,
    Block,
    Digested,
    _data,
    _digest,
    _digested,
    _first_message,
    _hash,
    serial,
    shared_digest,
)
from ctxbudget.proxy.cache.resent import RESENT, ChangedInPlace

_SHARED_KNOWN: LRUCache[tuple[str, bytes], bytes] = LRUCache(maxsize=1024)
"""`shared_digest`s by owner and this process's digest of the same block."""


def _client_serial(block: Block, owner: str) -> tuple[bytes | Digested, bytes]:
    """A client block's `serial` bytes and their digest, found by the digest of the bytes the
    client (`owner`) sent when it sent them before: an agent resends its whole history every
    turn, and serialising it again took most of this stage (~0.1 ms of a 186 KB request)."""
    if isinstance(block.client, bytes) and len(block.client) >= _BYTES_KEPT_MIN:
        # a field passed on unread (OpenClaw's 110 KB of tools): the same object every turn
        # (`Tails`), its digest (~20 µs in the request path) made once
        return _BYTES_KEPT.get(_digested, block.client)
    if block.sent is None:  # a `Digested` block has none: its digest is made
        data = _data(block.client)
        return data, _hash(data)
    if not isinstance(block.client, dict):
        return _sent_serial(block.client, block.sent, owner)
    # an item parsed once (`resent`): the same object is the same bytes sent
    sent = block.sent
    return _CLIENT_KEPT.get(
        lambda client, who: _sent_serial(client, sent, who), block.client, owner
    )


def _sent_serial(client: Any, sent: Any, owner: str) -> tuple[bytes, bytes]:
    """`_client_serial` of a block by the bytes the client sent (`sent`)."""
    key = (owner, _digest(sent))  # per owner: a hit tells nothing of what others sent
    found = _SERIALS.get(key)
    if found is None:
        data = serial(client)  # the same bytes always parse to the same value
        found = (data, _digest(data))
        if SERIAL_ITEM_BYTES[0] <= len(data) <= SERIAL_ITEM_BYTES[1]:
            # a copy of its own: orjson's shrunk output pins ~4 KB of heap while it is kept
            _SERIALS[key] = (bytes(memoryview(data)), found[1])
    return found


def _client_weight(client: Any, found: tuple[bytes, bytes]) -> int | None:
    # smaller items are new objects every turn (`RESENT.min_item`): not worth keeping
    return bytes_weight(client, found[0], min_size=128)


_CLIENT_KEPT = ByIdentity(16 << 20, _client_weight)
"""`_client_serial` by the client's item itself: the same object every turn (`resent`), so
neither its bytes are digested again nor its serial looked up."""

SERIAL_ITEM_BYTES = (1024, 256 * 1024)
"""Blocks kept in `_SERIALS`: smaller ones cost ~1 µs to serialise, larger ones would crowd it."""
_SERIALS: LRUCache[tuple[str, bytes], tuple[bytes, bytes]] = LRUCache(
    maxsize=16 << 20, getsizeof=lambda found: len(found[0]) + 400
)
"""Client blocks' (serial bytes, digest) by owner and the digest of their sent bytes: at most
16 MB (with what Python keeps for each entry, ~400 bytes, counted)."""


class Observed(NamedTuple):
    """A request's blocks as `SessionTracker.observe` compared them: the next request of the
    conversation takes these for its leading blocks whose client bytes and forwarded objects
    are the very ones these were made from (an agent resends its history: a 300-turn
    conversation's 600 blocks were serialised, hashed and compared again every request)."""

    blocks: list[Block]
    """The blocks these were made of: a block of the next request that is the very same one
    (the wire takes a conversation's blocks as made, `paired`) has the same client and
    forwarded objects, so the same bytes."""
    forwarded_data: list[bytes | Digested]
    """Its serial bytes as forwarded."""
    forwarded: list[bytes]
    """Their digests."""
    changed: list[int]
    """The blocks forwarded other than the client sent them (digests differ), in order."""
    sizes: list[int]
    """`size_of` each forwarded block."""
    moved: tuple[Any, ...] = ()
    """What `SessionTracker.observe` found moved (`Moved`, by index): the next request takes
    those of its leading blocks cached on both sides, as they are."""
    cached: int = 0
    """How many leading blocks were cached on both sides (a `Moved` before it has both
    `client_cached` and `forwarded_cached`)."""
    joined: bytes = b""
    """`forwarded` joined, up to the sessions' `KEEP_BLOCKS`: what a session keeps."""
    source: list[Block] | None = None
    """The list's blocks as the wire made them (`ClientPrefix.taken`), the same objects as
    `blocks` after the ones before the list: the next request's wire says how many of its
    blocks it took from these, so they are not compared again."""
    takeable: list[bool] | None = None
    """`[True]` until the next request's observe takes `forwarded_data`, `forwarded` and
    `sizes` (cut and extended in place, where a long conversation's three lists were copied
    each request): a cell shared by its `_replace` copies. A second request extending the
    same conversation (a retry, two in flight) then makes its own. None: never taken."""


class ClientPrefix:
    """A request's blocks as the client sent them, serialised and hashed once."""

    def __init__(
        self,
        blocks: Sequence[Block],
        owner: str = "",
        *,
        reuse: tuple[ClientPrefix, int, int] | None = None,
    ) -> None:
        """`reuse`: (an earlier request's prefix, not `spent`, start, stop) whose blocks
        `start:stop` hold the very client objects these do (a conversation's items:
        `Conversation.client`), taken as serialised and hashed then. A list of `blocks` is
        kept as it is (a wire's blocks are never changed in place)."""
        self.blocks = blocks if isinstance(blocks, list) else list(blocks)
        self.owner = owner
        self.observed: Observed | None = None
        """What `SessionTracker.observe` made of these blocks as forwarded (set by it)."""
        self.before: tuple[Observed, int] | None = None
        """The `observed` of the request these blocks' client objects were taken from
        (`reuse`), and where the list's blocks start: observe works only the blocks after
        those it finds the same (dropped once used: a prefix never holds a chain of earlier
        requests)."""
        start = stop = len(self.blocks)
        self._joined_from: tuple[bytes, int, int] | None = None
        """The digests joined of the prefix these blocks were taken from, and which of its
        blocks were taken (`joined`); not the prefix itself: no prefix holds a chain."""
        if reuse is not None:
            start, stop = reuse[1], reuse[2]
            if reuse[0].observed is not None:
                self.before = (reuse[0].observed, start)
            if reuse[0]._joined is not None:
                self._joined_from = (reuse[0]._joined, start, stop)
        self._joined: bytes | None = None
        self.taken: tuple[list[Block], list[Block] | None, int] | None = None
        """The list's blocks as the wire last made them for this request (`paired`), the
        conversation's last blocks it took some from (None: none), and how many: set by the
        wire, read by `SessionTracker.observe`."""
        self.spent = False
        """Its `data` and `digests` were taken by the next request's prefix (`reuse`): they
        are that one's now, and nothing is reused from these again."""
        found = [_client_serial(b, owner) for b in self.blocks[:start]]
        self.data = [data for data, _ in found]
        self.digests = [digest for _, digest in found]
        if reuse is not None:
            # the earlier prefix's lists, its first `start` made again: taken (cut in place)
            # once its request is done with them (observed: nothing reads them after), else
            # one copy of each (a long conversation's two lists, copied each request)
            head_data, head_digests = self.data, self.digests
            earlier = reuse[0]
            if earlier.observed is not None and not earlier.spent:
                earlier.spent = True
                self.data, self.digests = earlier.data, earlier.digests
                del self.data[stop:], self.digests[stop:]
            else:
                self.data, self.digests = earlier.data[:stop], earlier.digests[:stop]
            self.data[:start], self.digests[:start] = head_data, head_digests
            found = [_client_serial(b, owner) for b in self.blocks[stop:]]
            self.data += [data for data, _ in found]
            self.digests += [digest for _, digest in found]

    def conversation(self, session: str) -> str:
        """The conversation the request is part of: its session and the first message of its
        history (a chat system message skipped). Two OpenClaw conversations with the same
        system prompt share a session by prefix, but not a first message (it carries a
        time stamp). Pruning adds the conversation's first prunable result, which tells two
        runs of one task apart (`proxy/pipeline/prune.py` `_conversation`)."""
        i = _first_message(self.blocks)
        if i is None:
            return session
        key = (self.owner, self.digests[i])
        shared = _SHARED_KNOWN.get(key)
        if shared is None:  # the same first message every turn: hashed again only here
            shared = shared_digest(self.data[i])
            if shared is None:  # not digested so in the offload process: this process's id
                return f"{session}/{self.digests[i].hex()[:16]}"
            _SHARED_KNOWN[key] = shared
        return f"{session}/{shared.hex()[:16]}"

    def joined(self, limit: int) -> bytes:
        """The first `limit` blocks' digests joined (what a session keeps to compare the next
        request with), made once."""
        if self._joined is None:
            digests, taken = self.digests, self._joined_from
            self._joined_from = None
            if taken is not None and len(taken[0]) >= min(taken[2], limit) * DIGEST:
                old, start, stop = taken  # those blocks' digests, joined already
                stop = min(stop, limit)
                start = min(start, stop)
                self._joined = b"".join(
                    (*digests[:start], old[start * DIGEST : stop * DIGEST], *digests[stop:limit])
                )
            else:
                self._joined = b"".join(digests[:limit])
            if RESENT.check and self._joined != b"".join(digests[:limit]):
                raise ChangedInPlace("a conversation's client digests differ from last time")
        return self._joined

    def index_of(self, label: str) -> int | None:
        """The block labelled `label`. An item of the request's one list (`messages[i]`,
        `input[i]`) is where it must be, after the few blocks before the list (tools, system,
        instructions): found there, not by reading every label (pruning asks this of each
        pruned result, every request)."""
        name, sep, rest = label.partition("[")
        if sep and rest[-1:] == "]" and rest[:-1].isdigit():
            for head, block in enumerate(self.blocks[:4]):
                found, bracket, _ = block.label.partition("[")
                if not bracket:
                    continue
                if found != name:  # the request's list is another: no block has the label
                    return None
                at = head + int(rest[:-1])
                if at < len(self.blocks) and self.blocks[at].label == label:
                    return at
                break
        for i, block in enumerate(self.blocks):
            if block.label == label:
                return i
        return None
