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
a worker are seeded per process (`_digest`).

A large body (`proxy/pipeline/offload.py`) is parsed in another process, and its blocks reach
this one as `Digested` stand-ins: the digest, and the bytes of a small block or the token count
of a large one. Everything here takes either.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson
import xxhash
from cachetools import LRUCache

from ctxbudget.caps._kept import ByIdentity, bytes_weight

HEADER = "x-context-budget-session"
CLIENT_HEADERS = ("x-claude-code-session-id", "session-id")
"""Session headers real clients send: Claude Code, Codex CLI."""
MAX_ID = 128
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,128}$")
_BOUNDARIES = ("<!-- OPENCLAW_CACHE_BOUNDARY -->", "<!-- /openclaw:attempt:STABLE -->")
_STABLE_CHARS = 65_536
"""At most this much of the system text goes into a prefix hash."""
_MARKER = b'"cache_control"'
_MARKER_VALUE = re.compile(rb"\s*:\s*\{[^{}]*\}\s*")
KEEP_SESSIONS = 2048
"""Sessions kept per owner (each key holder's own LRU)."""
KEEP_TOTAL = 4096
"""Sessions kept in all, over every owner (the owner with the most gives way first)."""
KEEP_BLOCKS = 1024
"""Blocks of a request compared with the next one (later blocks count as new). With the
sessions kept, this bounds the digests at 128 MB in the worst case (~26 MB for 200-block
agent sessions)."""
DIGEST = 16
"""Bytes of a block digest (`_digest`)."""
SEED_ENV = "CTXBUDGET_DIGEST_SEED"
SEED = int(os.environ.get(SEED_ENV) or secrets.randbits(64))
"""The block digests' seed: random per process; the offload worker gets its parent's
(`SEED_ENV`), so the digests of one session compare across the two."""
KEEP_MEMORY_BLOCKS = 8
"""Memory blocks remembered per session, to be placed again where they were."""
LATE_SECONDS = 60.0
"""How long the report's writer waits for a large block's late token count."""
SMALL_BLOCK = 1 << 16
"""A `Digested` block up to this many bytes keeps them; a larger one keeps its token count."""


class Block(NamedTuple):
    """One block of a request's cached prefix, as the client sent it and as forwarded.

    Values are Python JSON values, or the raw JSON bytes of a field the proxy never parses
    (`tools`). `forwarded is client` when ctxbudget left the block alone. (A named tuple: a
    request makes three lists of them, ~0.5 µs a block where a frozen dataclass took 1.3.)
    """

    label: str
    """Where it is: `tools`, `system`, `messages[3]`, `input[5]`."""
    client: Any
    forwarded: Any
    sent: Any = None
    """The client's own bytes of `client` (a slice of its body), when the wire kept them: the
    session stage finds a block it has serialised before by them (`ClientPrefix`)."""


@dataclass(frozen=True, kw_only=True)
class Digested:
    """A block's value as hashed in the offload process (`digested`): what sessions and the
    report read of it, without the value itself."""

    digest: bytes
    """`serial(value)`'s digest."""
    size: int
    """`len(serial(value))`."""
    data: bytes | None
    """`serial(value)` when it is at most `SMALL_BLOCK` bytes, else None."""
    tokens: int | None = None
    """The tokens of `serial(value)` when `data` is None and they were counted (the report
    prices the blocks a request moved; counting 30 MB takes ~1.5 s, so the client's large
    blocks are counted only when moved, while the request goes on: `PrefixChange.late`)."""
    stable: str = ""
    """`_stable_text(value)`, for the block a stable-prefix session hash reads."""
    role: str | None = None
    """A message's role (the conversation key skips system messages)."""
    shared: bytes | None = None
    """`shared_digest` of a large block (`data` None) that a session or conversation id may
    read (`read_by_ids`); None otherwise."""

    @property
    def counted(self) -> bool:
        """Whether the report can price the block: its bytes or its token count are here."""
        return self.data is not None or self.tokens is not None


def digested(
    value: Any,
    count: Callable[[str], int] | None = None,
    *,
    stable: bool = False,
    shared: bool = False,
) -> Digested:
    """`value` as a `Digested`; `count`, when given, counts a large one's tokens; `shared`,
    whether a large one gets its `shared_digest` (the first blocks: ids read them).

    >>> d = digested({"role": "user", "content": "hi"})
    >>> d.data, d.size, d.digest == _digest(d.data)
    (b'{"role":"user","content":"hi"}', 30, True)
    >>> big = digested("x" * SMALL_BLOCK, len)
    >>> big.data, big.size, big.tokens, digested("x" * SMALL_BLOCK).counted
    (None, 65538, 65538, False)
    """
    data = serial(value)
    small = len(data) <= SMALL_BLOCK
    return Digested(
        digest=_digest(data),
        size=len(data),
        data=data if small else None,
        tokens=None if small or count is None else count(data.decode(errors="replace")),
        stable=_stable_text(value) if stable else "",
        role=value.get("role")
        if isinstance(value, dict) and isinstance(value.get("role"), str)
        else None,
        shared=_shared(data) if shared and not small else None,
    )


def read_by_ids(blocks: Sequence[Block]) -> set[int]:
    """The blocks the ids kept beyond a process read (`shared_digest`): the tools (a `prefix:`
    session) and the conversation's first message (`ClientPrefix.conversation`). The offload
    process digests a large body's with BLAKE2b only for these."""
    found = {i for i, b in enumerate(blocks) if b.label == "tools"}
    first = _first_message(blocks)
    if first is not None:
        found.add(first)
    return found


def _first_message(blocks: Sequence[Block]) -> int | None:
    """The conversation's first message: the first message or item that is not a system or
    developer message."""
    for i, block in enumerate(blocks):
        if block.label.startswith(("messages[", "input[")) and not _is_system(block.client):
            return i
    return None


def shared_digest(data: bytes | Digested) -> bytes | None:
    """A block's digest as every process and every instance computes it, for the ids kept in
    the report's database (a session, a conversation's pruning decisions): BLAKE2b, with no
    seed to share and no way for a client to make two blocks digest alike. None for a large
    block the offload process did not digest so (`read_by_ids`).

    >>> shared_digest(b'{"role":"user"}') == shared_digest(digested({"role": "user"}))
    True
    """
    if isinstance(data, Digested):
        return _shared(data.data) if data.data is not None else data.shared
    return _shared(data)


_SHARED_KNOWN: LRUCache[tuple[str, bytes], bytes] = LRUCache(maxsize=1024)
"""`shared_digest`s by owner and this process's digest of the same block."""


def _shared(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=DIGEST).digest()


def block_tokens(
    data: bytes | Digested, count: Callable[[bytes], int], late: int | None = None
) -> int:
    """The tokens of a block's serial bytes (`Moved.client`, `Moved.forwarded`), `count`ed;
    `late`, a large block's count from `PrefixChange.late_tokens`. One never counted (the
    offload process failed) is estimated at 4 bytes a token."""
    if isinstance(data, Digested):
        if data.data is None:
            found = data.tokens if data.tokens is not None else late
            return found if found is not None else data.size // 4
        data = data.data
    return count(data)


def _client_serial(block: Block, owner: str) -> tuple[bytes | Digested, bytes]:
    """A client block's `serial` bytes and their digest, found by the digest of the bytes the
    client (`owner`) sent when it sent them before: an agent resends its whole history every
    turn, and serialising it again took most of this stage (~0.1 ms of a 186 KB request)."""
    if isinstance(block.client, bytes) and len(block.client) >= _BYTES_KEPT_MIN:
        # a field passed on unread (OpenClaw's 110 KB of tools): the same object every turn
        # (`Tails`), its digest (~20 µs in the request path) made once
        return _BYTES_KEPT.get(_digested, block.client)
    if block.sent is None or isinstance(block.client, Digested):
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


def _digested(data: bytes) -> tuple[bytes, bytes]:
    return data, _digest(data)


_BYTES_KEPT_MIN = 4096
_BYTES_KEPT = ByIdentity(16 << 20, lambda data, _: len(data) + 200)
"""Large raw blocks' digests by the bytes object itself (kept in the entry): at most 16 MB."""


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


def _data(value: Any) -> bytes | Digested:
    return value if isinstance(value, Digested) else serial(value)


def _hash(data: bytes | Digested) -> bytes:
    if isinstance(data, Digested):
        return data.digest
    if len(data) >= _BYTES_KEPT_MIN:  # a clamped block's bytes: the same object every turn
        return _BYTES_KEPT.get(_digested, data)[1]
    return _digest(data)


def serial(value: Any) -> bytes:
    """A block's bytes for hashing and counting: compact JSON, or the raw bytes as sent,
    without `cache_control` markers (a marker is not part of the cached prefix: OpenClaw
    moves its marker to the newest tool result every turn, and the older prefix still hits)."""
    if isinstance(value, bytes):  # a field passed on unread (`tools`): its marker never moves
        return value
    if isinstance(value, dict):  # a clamped message: the same object every turn
        return _SERIAL_KEPT.get(_serial, value)
    return _serial(value)


_SERIAL_KEPT = ByIdentity(8 << 20, bytes_weight)
"""`serial` of the objects a clamp made, by their identity (`caps._kept`): at most 8 MB."""


def _serial(value: Any) -> bytes:
    if isinstance(value, bytearray | memoryview):
        data = bytes(value)
    else:
        try:
            data = orjson.dumps(value)
        except TypeError:  # 64-bit overflow, a lone surrogate, nesting past orjson's 254
            data = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode(
                errors="surrogatepass"
            )
    if _MARKER in data:  # a key, never string content: a quote inside a string is escaped
        data = _unmarked(data)
    return data


def _unmarked(data: bytes) -> bytes:
    """`data` without its `"cache_control": {…}` members (split in C, then each removal's
    comma mended; a regex scan took ~1 ms over a 100 KB tools list)."""
    pieces = data.split(_MARKER)
    out = [pieces[0]]
    for piece in pieces[1:]:
        value = _MARKER_VALUE.match(piece)
        if value is None:  # not a member after all: keep it as it was
            out[-1] += _MARKER + piece
            continue
        rest = piece[value.end() :]
        before = out[-1].rstrip()
        if before.endswith(b","):  # …,"cache_control":{…}
            out[-1] = before[:-1]
        elif rest.startswith(b","):  # {"cache_control":{…},…
            rest = rest[1:]
        out.append(rest)
    return b"".join(out)


def _digest(data: bytes) -> bytes:
    # XXH3 (128 bits), seeded: ~70x SHA-256's speed here (11 µs for a 186 KB request, where
    # SHA-256 took ~0.3 ms of the ~0.5 ms a request may cost). A digest only ever meets
    # digests of the same process (sessions are per worker; the offload process shares its
    # parent's seed) and is never shown: with the seed unknown, no client can make two blocks
    # digest alike; the caches keyed by it (`_SERIALS`, `_SHARED_KNOWN`) are per owner too.
    return xxhash.xxh3_128_digest(data, SEED)


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


def _stable_text(value: Any) -> str:
    """A system prompt's text up to OpenClaw's cache boundary (what stays put every turn)."""
    text = _first_text(value)[:_STABLE_CHARS]
    for marker in _BOUNDARIES:
        at = text.find(marker)
        if at >= 0:
            text = text[:at]
    return text


def _first_text(value: Any) -> str:
    if isinstance(value, Digested):
        return value.stable
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        for key in ("content", "text"):
            if key in value:
                return _first_text(value[key])
        return ""
    if isinstance(value, list):
        return "".join(_first_text(v) for v in value[:4])
    return ""


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


class ClientPrefix:
    """A request's blocks as the client sent them, serialised and hashed once."""

    def __init__(
        self,
        blocks: Sequence[Block],
        owner: str = "",
        *,
        reuse: tuple[ClientPrefix, int, int] | None = None,
    ) -> None:
        """`reuse`: (an earlier request's prefix, start, stop) whose blocks `start:stop` hold
        the very client objects these do (a conversation's items: `Conversation.client`),
        taken as serialised and hashed then."""
        self.blocks = list(blocks)
        self.owner = owner
        start = stop = len(self.blocks)
        if reuse is not None:
            start, stop = reuse[1], reuse[2]
        found = [_client_serial(b, owner) for b in self.blocks[:start]]
        self.data = [data for data, _ in found]
        self.digests = [digest for _, digest in found]
        if reuse is not None:
            self.data += reuse[0].data[start:stop]
            self.digests += reuse[0].digests[start:stop]
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

    def index_of(self, label: str) -> int | None:
        for i, block in enumerate(self.blocks):
            if block.label == label:
                return i
        return None


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
        shared = _common(state.client, b"".join(prefix.digests[:KEEP_BLOCKS]))
        found: dict[int, str] = {}
        for i, digest in enumerate(prefix.digests[:shared]):
            text = state.memory.get(digest)
            if text is not None:
                found[i] = text
        return found

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
        pruned: frozenset[int] = frozenset(),
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
        forwarded_bytes = [
            data if b.forwarded is b.client else _data(b.forwarded)
            for b, data in zip(forwarded_blocks, prefix.data, strict=True)
        ]
        forwarded = [
            digest if b.forwarded is b.client else _hash(data)
            for b, digest, data in zip(forwarded_blocks, client, forwarded_bytes, strict=True)
        ]
        memory = memory or {}
        previous = self._get(owner, session)
        state = _Session(
            b"".join(client[:KEEP_BLOCKS]),
            b"".join(forwarded[:KEEP_BLOCKS]),
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
        moved = tuple(
            Moved(
                label=prefix.blocks[i].label,
                client=prefix.data[i],
                forwarded=forwarded_bytes[i],
                client_cached=i < shared_client,
                forwarded_cached=i < shared_forwarded,
                index=i,
            )
            for i in range(len(client))
            if client[i] != forwarded[i] or (i < shared_client) != (i < shared_forwarded)
        )
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
            sizes=tuple(d.size if isinstance(d, Digested) else len(d) for d in forwarded_bytes),
        )


def _is_system(value: Any) -> bool:
    """Whether a message block is a system (or developer) message."""
    if isinstance(value, Digested):
        return value.role in ("system", "developer")
    return isinstance(value, dict) and value.get("role") in ("system", "developer")


def _common(a: bytes, b: bytes) -> int:
    """How many leading blocks two joined digest lists share (a binary search of slice
    comparisons, which run in C)."""
    low, high = 0, min(len(a), len(b)) // DIGEST
    while low < high:
        mid = (low + high + 1) // 2
        if a[: mid * DIGEST] == b[: mid * DIGEST]:
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
