"""Sessions, and what each request did to its session's cached prefix.

A provider caches a prompt by its prefix: tools, then the system prompt, then the messages in
order. An agent resends the whole prefix every turn and pays a fraction for the part the
provider has seen. ctxbudget changes some of those blocks (clamps, the memory block); if a
change is not the same every turn, the cached prefix breaks there and everything after it is
billed again. That is a cache bust *caused by ctxbudget*, and it can cost more than the clamps
save.

**Which session a request belongs to**, first that applies (`session_key`):

1. the client's `x-context-budget-session` header;
2. the session header of Claude Code (`x-claude-code-session-id`) or Codex (`session-id`);
3. the body's `prompt_cache_key` (Codex; OpenClaw's Responses continuations);
4. the session in the body's `metadata.user_id` (Claude Code's `{"session_id": …}`);
5. else the hash of the stable prefix: the model, the tools, and the first system text up to
   OpenClaw's cache boundary (`prefix:` + 16 hex digits). Requests that share that prefix
   share a provider cache, so counting them together is what the cache itself does.

**The prefix of a request** is its blocks in the provider's cache order (`Block`): tools, the
system prompt, then each message or input item, each as the client sent it and as forwarded.
`SessionTracker.observe` compares them with the session's previous request: the client's own
blocks that are unchanged (`shared_client`), the forwarded ones that are (`shared_forwarded`),
and — the point — the first block the client left unchanged but ctxbudget forwarded differently
(`bust`). A client that changed its own earlier blocks (dropped a thinking block, edited
history) is a client bust, not ours.

Sessions are kept per worker process and per owner, the newest 2,048 of each owner (an LRU)
and 4,096 in all, each with its previous request's first 1,024 block digests and its last 8
memory blocks: a session whose requests go to different workers of one server is compared
within each worker. The ids kept beyond a process — the session's `prefix:` hash, and the
conversation pruning's decisions are filed under (`ClientPrefix.conversation`) — come from
`shared_digest`, the same in every worker and every instance; the block digests compared within
a worker are seeded per process (`proxy/cache/blocks.py` `_digest`).

The blocks (`Block`, and the `Digested` stand-ins of a large body parsed in the offload
process) and their digests are `proxy/cache/blocks.py`'s; the request's prefix as the client
sent it, serialised and hashed once, is `proxy/cache/prefix.py`'s `ClientPrefix`.
"""

from __future__ import annotations

import hashlib
import re
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Container, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from itertools import compress, count, islice
from operator import is_not
from typing import Any

import orjson
from cachetools import LRUCache

from ctxbudget.proxy.cache.blocks import (
    DIGEST,
    Block,
    Digested,
    _data,
    _hash,
    _stable_text,
    shared_digest,
    size_of,
)
from ctxbudget.proxy.cache.prefix import ClientPrefix, Observed
from ctxbudget.proxy.cache.resent import RESENT, ChangedInPlace

HEADER = "x-context-budget-session"
CLIENT_HEADERS = ("x-claude-code-session-id", "session-id")
"""Session headers real clients send: Claude Code, Codex CLI."""
MAX_ID = 128
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,128}$")
KEEP_SESSIONS = 2048
"""Sessions kept per owner (each key holder's own LRU)."""
KEEP_TOTAL = 4096
"""Sessions kept in all, over every owner (the owner with the most gives way first)."""
KEEP_BLOCKS = 1024
"""Blocks of a request compared with the next one (later blocks count as new). With the
sessions kept, this bounds the digests at 128 MB in the worst case (~26 MB for 200-block
agent sessions)."""
KEEP_MEMORY_BLOCKS = 8
"""Memory blocks remembered per session, to be placed again where they were."""
LATE_SECONDS = 60.0
"""How long the report's writer waits for a large block's late token count."""


def _safe(value: str) -> str:
    """An id fit for a header and a log line: as given when plain, else its hash."""
    if _SAFE_ID.match(value):
        return value
    return "h:" + hashlib.sha256(value.encode(errors="surrogatepass")).hexdigest()[:16]


def session_key(
    headers: Mapping[str, str], field_of: Any, model: str | None, prefix: ClientPrefix
) -> str:
    """The session a request belongs to (the rule in this module's docstring).

    `field_of(name)` reads a top-level body field; `prefix` is the request's as sent.
    """
    explicit = headers.get(HEADER)
    if explicit and explicit.strip():
        return _safe(explicit.strip())
    for name in CLIENT_HEADERS:
        value = headers.get(name)
        if value and value.strip():
            return _safe(value.strip())
    key = field_of("prompt_cache_key")
    if isinstance(key, str) and key.strip():
        return _safe(key.strip())
    metadata = field_of("metadata")
    if isinstance(metadata, dict):
        session = _metadata_session(metadata.get("user_id"))
        if session:
            return _safe(session)
    return "prefix:" + _stable_hash(model, prefix)


def _metadata_session(user_id: Any) -> str | None:
    """Claude Code's `metadata.user_id`: JSON with `session_id` (2.x), or
    `user_…_account_…_session_<uuid>` (1.x)."""
    if not isinstance(user_id, str):
        return None
    if user_id.startswith("{"):
        try:  # orjson: no Python recursion, and a 1,024-level limit it reports as an error
            found = orjson.loads(user_id)
        except (ValueError, RecursionError):  # malformed, too deep, a lone surrogate
            return None
        session = found.get("session_id") if isinstance(found, dict) else None
        return session if isinstance(session, str) and session else None
    _, sep, tail = user_id.rpartition("_session_")
    return tail if sep and tail else None


_STABLE_KNOWN: LRUCache[tuple[str, bytes], str] = LRUCache(maxsize=1024)
"""Stable-prefix hashes by owner and the digests they came from: an agent resends the same
system prompt every turn, and reading its text up to the boundary is the costly part."""


def _stable_hash(model: str | None, prefix: ClientPrefix) -> str:
    head = (model or "").encode(errors="surrogatepass") + b"\0"
    key = head + b"".join(prefix.digests[:2])
    known = _STABLE_KNOWN.get((prefix.owner, key))
    if known is not None:
        return known
    digest = hashlib.sha256(head)
    for block, data, found in zip(prefix.blocks, prefix.data, prefix.digests, strict=True):
        if block.label == "tools":
            digest.update(shared_digest(data) or found)
            continue
        digest.update(_stable_text(block.client).encode(errors="surrogatepass"))
        break  # the first block after the tools: the system prompt (or the first message)
    known = _STABLE_KNOWN[prefix.owner, key] = digest.hexdigest()[:16]
    return known


@dataclass(frozen=True, kw_only=True)
class Moved:
    """A block whose bytes or cache tier differ between the request as sent and as the client
    sent it: what the report needs to price the request without ctxbudget."""

    label: str
    client: bytes | Digested
    """The block as the client sent it (a large body's: its digest and size, `Digested`)."""
    forwarded: bytes | Digested
    """As ctxbudget forwarded it (the same bytes when only its cache tier moved)."""
    client_cached: bool
    """Whether the client's block was inside the prefix the client shared with the session's
    previous request (a cache read without ctxbudget)."""
    forwarded_cached: bool
    """Whether the forwarded block was inside the prefix forwarded last time (a read now)."""
    index: int = -1
    """Where it is among the request's blocks."""


@dataclass(frozen=True, kw_only=True)
class PrefixChange:
    """What one request did to its session's cached prefix (`SessionTracker.observe`)."""

    session: str
    first: bool
    """The session's first request seen (by this worker): nothing to compare with."""
    blocks: int
    shared_client: int
    """Leading blocks the client sent exactly as in the session's previous request."""
    shared_forwarded: int
    """Leading blocks forwarded exactly as in the previous request."""
    client_cache_bust: bool
    """The client changed a block of its previous request before that request's last block
    (not only appended, or moved its last block)."""
    bust: str | None
    """The first block the client kept but ctxbudget forwarded differently, and why
    (`messages[3] memory`, `system clamp`); None when ctxbudget kept the cache."""
    moved: tuple[Moved, ...] = ()
    sizes: tuple[int, ...] = ()
    """Each forwarded block's size in bytes, in order: where the provider's cache read ended
    (its `cache_read` tokens) is placed among the blocks by them (`proxy/report/record.py`)."""
    late: Future[dict[str, int]] | None = field(default=None, compare=False, repr=False)
    """The tokens of moved large blocks by label, counted in the offload process while the
    request goes on (`OffloadedRequest.defer_count`); the report's writer waits for them."""

    def late_tokens(self) -> dict[str, int]:
        """What `late` counted; {} when nothing is late or the count failed."""
        if self.late is None:
            return {}
        try:
            return self.late.result(timeout=LATE_SECONDS)
        except Exception:  # the worker exited, the app stopped: the report estimates
            return {}


@dataclass
class _Session:
    client: bytes
    """The previous request's block digests, as sent, joined (16 bytes a block)."""
    forwarded: bytes
    """The same, as forwarded."""
    memory: OrderedDict[bytes, str] = field(default_factory=OrderedDict)
    """Memory block text by the digest of the client block it was placed in."""
    last: float = 0.0
    """When the previous request came (the pipeline's clock)."""
    run: int = 1
    """Requests of the session's current warm run: since its cache last expired."""


class SessionTracker:
    """The previous request of each recent session, to compare the next one with.

    Kept per owner (each key holder its own LRU of `keep` sessions), and `keep_total` in
    all: past that, the owner holding the most sessions loses its least recent one. So one
    tenant's flood of new sessions pushes out its own, never another's (one shared LRU let
    any key holder evict everyone's: issue 24). An owner with no session left is dropped,
    so owners are bounded too.
    """

    def __init__(self, *, keep: int = KEEP_SESSIONS, keep_total: int = KEEP_TOTAL) -> None:
        self._owners: dict[str, OrderedDict[str, _Session]] = {}
        self._keep = keep
        self._keep_total = keep_total
        self._total = 0

    def _get(self, owner: str, session: str) -> _Session | None:
        sessions = self._owners.get(owner)
        return sessions.get(session) if sessions is not None else None

    def _put(self, owner: str, session: str, state: _Session) -> None:
        """Keep `state` as `owner`'s newest session, evicting as the class docstring says."""
        sessions = self._owners.setdefault(owner, OrderedDict())
        self._total += sessions.pop(session, None) is None
        sessions[session] = state
        if len(sessions) > self._keep:
            self._evict(owner)
        while self._total > self._keep_total:
            most = max(self._owners, key=lambda o: len(self._owners[o]))
            # on a tie, the owner whose new session went over gives way
            self._evict(owner if len(sessions) >= len(self._owners[most]) else most)

    def _evict(self, owner: str) -> None:
        sessions = self._owners[owner]
        sessions.popitem(last=False)
        self._total -= 1
        if not sessions:
            del self._owners[owner]

    def timing(self, owner: str, session: str) -> tuple[float, int] | None:
        """When the session's previous request came, and how many requests its warm run has
        had (pruning's clock); None for a session this worker has not seen."""
        state = self._get(owner, session)
        return None if state is None else (state.last, state.run)

    def placed_memory(self, owner: str, session: str, prefix: ClientPrefix) -> dict[int, str]:
        """Memory blocks this session placed before, in blocks of the prefix the client
        resent unchanged (the part the provider has cached), by block index: placing them
        again keeps that prefix. A block that moved (OpenClaw re-appends its internal-context
        message every turn) is not in the cached prefix: it gets a fresh recall instead."""
        state = self._get(owner, session)
        if state is None or not state.memory:
            return {}
        shared = _common(state.client, prefix.joined(KEEP_BLOCKS))
        found: dict[int, str] = {}
        digests = prefix.digests
        for digest, text in state.memory.items():  # a few: each found by a C scan
            at = -1
            while True:
                try:
                    at = digests.index(digest, at + 1, shared)
                except ValueError:
                    break
                found[at] = text
        return dict(sorted(found.items()))

    def observe(
        self,
        owner: str,
        session: str,
        prefix: ClientPrefix,
        forwarded_blocks: Sequence[Block],
        *,
        memory: Mapping[int, str] | None = None,
        now: float = 0.0,
        warm: bool = True,
        pruned: Container[int] = frozenset(),
    ) -> PrefixChange:
        """Compare the request (`prefix` as sent, `forwarded_blocks` clamped and injected)
        with the session's previous request, and keep it as the new previous one.

        `memory`: the memory block text placed in each block, by index; `now`: when the
        request came; `warm`: whether the session's cache was still warm (the warm run goes
        on) or had expired (a new run starts); `pruned`: the blocks holding a pruned result
        (a bust there is the prune's).
        """
        client = prefix.digests
        if len(forwarded_blocks) != len(client):  # no stage adds blocks; be safe if one does
            forwarded_blocks = prefix.blocks
        seen, before = _observed(prefix, forwarded_blocks)
        memory = memory or {}
        previous = self._get(owner, session)
        state = _Session(
            prefix.joined(KEEP_BLOCKS),
            seen.joined,
            previous.memory if previous else OrderedDict(),
            last=now,
            run=previous.run + 1 if previous is not None and warm else 1,
        )
        for i, text in memory.items():
            state.memory[client[i]] = text
            state.memory.move_to_end(client[i])
        while len(state.memory) > KEEP_MEMORY_BLOCKS:
            state.memory.popitem(last=False)
        self._put(owner, session, state)

        shared_client = shared_forwarded = 0
        bust = None
        if previous is not None and warm:  # an expired cache holds nothing to bust
            shared_client = _common(previous.client, state.client)
            shared_forwarded = _common(previous.forwarded, state.forwarded)
            if shared_forwarded < shared_client:
                i = shared_forwarded
                # only the memory block and the clamps change a block the client kept
                had_memory = i in memory or client[i] in state.memory
                why = "prune" if i in pruned else "memory" if had_memory else "clamp"
                bust = f"{prefix.blocks[i].label} {why}"
        moved = _moved(prefix, seen, shared_client, shared_forwarded, before)
        if RESENT.check and before is not None:
            if moved != _moved(prefix, seen, shared_client, shared_forwarded, None):
                raise ChangedInPlace("a session's moved blocks differ from a whole comparison")
        prefix.observed = seen._replace(moved=moved, cached=min(shared_client, shared_forwarded))
        return PrefixChange(
            session=session,
            first=previous is None,
            blocks=len(client),
            shared_client=shared_client,
            shared_forwarded=shared_forwarded,
            # the client's own last block may move (OpenClaw re-appends its internal-context
            # message every turn): only a change before it is a bust
            client_cache_bust=previous is not None
            and warm
            and shared_client < len(previous.client) // DIGEST - 1,
            bust=bust,
            moved=moved,
            sizes=tuple(seen.sizes),
        )


def _moved(
    prefix: ClientPrefix,
    seen: Observed,
    shared_client: int,
    shared_forwarded: int,
    before: tuple[Observed, int, int] | None,
) -> tuple[Moved, ...]:
    """The blocks forwarded other than sent, and those cached on one side only: found from
    `seen.changed` and the two shared counts, not by comparing every block's digests. Those
    of the leading blocks taken from the conversation's previous request (`before`: its
    `Observed`, where the list's blocks start, how many blocks were taken) that were cached
    on both sides then and are now are its very `Moved`s (the same bytes, the same flags):
    taken as they are, so only the new blocks are looked at."""
    low, high = sorted((shared_client, shared_forwarded))
    n = len(prefix.digests)
    changed = seen.changed
    start = stop = 0
    reused: tuple[Moved, ...] = ()
    if before is not None:
        old, head, kept = before
        stop = min(kept, low, old.cached)
        if stop > head:
            start = head
            a = bisect_left(old.moved, head, key=_index)
            reused = old.moved[a : bisect_left(old.moved, stop, key=_index)]
        else:
            stop = 0
    indices = sorted(
        {
            *changed[: bisect_left(changed, start)],
            *changed[bisect_left(changed, stop) :],
            *range(max(low, stop), min(high, n)),
        }
    )
    made = [
        Moved(
            label=prefix.blocks[i].label,
            client=prefix.data[i],
            forwarded=seen.forwarded_data[i],
            client_cached=i < shared_client,
            forwarded_cached=i < shared_forwarded,
            index=i,
        )
        for i in indices
    ]
    cut = bisect_left(indices, start)
    return (*made[:cut], *reused, *made[cut:])


def _index(moved: Moved) -> int:
    return moved.index


def _observed(
    prefix: ClientPrefix, blocks: Sequence[Block]
) -> tuple[Observed, tuple[Observed, int, int] | None]:
    """`prefix`'s blocks as forwarded (`blocks`): their bytes, digests, sizes and which differ
    from the client's, taken from the conversation's previous request (`prefix.before`) for
    the list's leading blocks that are the very same ones, made for the rest (the few
    blocks before the list, tools and system, are made again: cheap, and not always the same
    objects). Kept on `prefix` for the next request; with what was taken (the previous
    request's `Observed`, where the list starts, how many leading blocks were taken)."""
    before, prefix.before = prefix.before, None
    taken = prefix.taken
    head = len(blocks) - len(taken[0]) if taken is not None else -1
    if taken is not None and (head < 0 or (taken[0] and blocks[head] is not taken[0][0])):
        taken = None  # not the blocks the wire made last (`observe`'s fallback)
    seen, kept = _made(prefix.data, prefix.digests, blocks, before, taken)
    if RESENT.check and before is not None:
        whole = _made(prefix.data, prefix.digests, blocks, None)[0]
        if whole[1:5] != seen[1:5] or whole.joined != seen.joined:
            raise ChangedInPlace("a session's forwarded blocks differ from last time")
        start = min(before[1], len(blocks))
        if kept > start and kept != start + _same(list(blocks), before[0].blocks, start):
            raise ChangedInPlace("the wire took other blocks than it says")
    prefix.observed = seen
    return seen, None if before is None else (before[0], before[1], kept)


def _made(
    client_data: list[bytes | Digested],
    digests: list[bytes],
    blocks: Sequence[Block],
    before: tuple[Observed, int] | None,
    taken: tuple[list[Block], list[Block] | None, int] | None = None,
) -> tuple[Observed, int]:
    """`_observed` of blocks with these client bytes and digests, after `before`; and how
    many leading blocks were taken from it. `taken` (`ClientPrefix.taken`, of these very
    blocks): how many of the list's the wire took from the blocks `before` was made of,
    when it says (else they are compared)."""
    objects = blocks if isinstance(blocks, list) else list(blocks)  # the caller's own copy
    data: list[bytes | Digested] = []
    forwarded: list[bytes] = []
    changed: list[int] = []
    sizes: list[int] = []

    def make(start: int, stop: int) -> None:
        for i in range(start, stop):
            b, client = blocks[i], client_data[i]
            if b.forwarded is b.client:
                data.append(client)
                forwarded.append(digests[i])
            else:
                found = _data(b.forwarded)
                data.append(found)
                forwarded.append(_hash(found))
                if forwarded[i] != digests[i]:
                    changed.append(i)
            sizes.append(size_of(data[i]))

    head = kept = 0
    joined: bytes | None = None
    if before is not None:
        old, head = before
        head = min(head, len(blocks))
        make(0, head)
        # the very same block: the same client and forwarded objects, so the same bytes
        # (nothing changes one in place)
        if (
            taken is not None
            and taken[1] is not None
            and taken[1] is old.source
            and len(blocks) - len(taken[0]) == head
        ):
            kept = head + taken[2]
        else:
            kept = head + _same(objects, old.blocks, head)
        takeable = old.takeable
        if not (takeable and takeable[0]):
            kept = head  # its lists taken by another request: these made again
        if kept > head and takeable:  # its lists, cut and extended in place (the first `head`
            takeable[0] = False  # made again): it is the next request's only
            made = data, forwarded, sizes
            data, forwarded, sizes = old.forwarded_data, old.forwarded, old.sizes
            del data[kept:], forwarded[kept:], sizes[kept:]
            data[:head], forwarded[:head], sizes[:head] = made
            changed += old.changed[bisect_left(old.changed, head) : bisect_left(old.changed, kept)]
            if len(old.joined) >= min(kept, KEEP_BLOCKS) * DIGEST:
                joined = old.joined
    make(kept, len(blocks))
    source = taken[0] if taken is not None else None
    joined = _joined(forwarded, joined, head, kept)
    seen = Observed(
        objects, data, forwarded, changed, sizes, source=source, joined=joined, takeable=[True]
    )
    return seen, kept


def _joined(digests: list[bytes], old: bytes | None, head: int, kept: int) -> bytes:
    """`digests` joined, up to `KEEP_BLOCKS`: those from `head` to `kept` taken from `old`
    (the same digests, joined already: the previous request's), the others joined."""
    if old is None or kept <= head:
        return b"".join(digests[:KEEP_BLOCKS])
    kept = min(kept, KEEP_BLOCKS)
    head = min(head, kept)
    return b"".join(
        (*digests[:head], old[head * DIGEST : kept * DIGEST], *digests[kept:KEEP_BLOCKS])
    )


def _same(new: list[Any], old: list[Any], start: int) -> int:
    """How many items of `new` from `start` on are the very objects of `old` (a C scan)."""
    limit = max(min(len(new), len(old)) - start, 0)
    return next(compress(count(), islice(map(is_not, new[start:], old[start:]), limit)), limit)


def _common(a: bytes, b: bytes) -> int:
    """How many leading blocks two joined digest lists share: a binary search whose compares
    (memcmp, no copies) start where the bytes are known to be the same, so the two are read
    about once, not once a step."""
    view = memoryview(a)
    same, differs = 0, len(a) + 1  # equal up to `same`; unequal somewhere before `differs`

    def has(n: int) -> bool:
        nonlocal same, differs
        end = n * DIGEST
        if end >= differs:
            return False
        if end > same:
            if not b.startswith(view[same:end], same):
                differs = end
                return False
            same = end
        return True

    low, high = 0, min(len(a), len(b)) // DIGEST
    for n in range(high, max(high - 3, -1), -1):  # the usual: all, or all but the newest
        if has(n):
            return n
    high -= 3
    while low < high:
        mid = (low + high + 1) // 2
        if has(mid):
            low = mid
        else:
            high = mid - 1
    return low


def memory_added(before: Sequence[Block], after: Sequence[Block]) -> dict[int, str]:
    """The block a new memory block went into, and its text (what the wire appended)."""
    for i, (old, new) in enumerate(zip(before, after, strict=False)):
        if new.forwarded is not old.forwarded:
            return {i: _appended(old.forwarded, new.forwarded)}
    return {}


def _appended(old: Any, new: Any) -> str:
    """The text `place_memory`-style appending added to a block: a string's tail after the
    blank line, or the new last part's text."""
    content_old = old.get("content") if isinstance(old, dict) else old
    content_new = new.get("content") if isinstance(new, dict) else new
    if isinstance(content_new, str) and isinstance(content_old, str):
        return content_new[len(content_old) + 2 :]
    if isinstance(content_new, list) and content_new and isinstance(content_new[-1], dict):
        text = content_new[-1].get("text")
        return text if isinstance(text, str) else ""
    return ""
