"""The blocks of a request's cached prefix, their bytes and their digests.

**The prefix of a request** is its blocks in the provider's cache order (`Block`): tools, the
system prompt, then each message or input item, each as the client sent it and as forwarded.
A block's bytes for hashing and counting are its `serial` form (compact JSON without
`cache_control` markers); its digest (`_digest`) is seeded XXH3, the same only within one
process and its offload worker; `shared_digest` is the digest every process and instance
computes alike, for the ids kept beyond a process.

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
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
import xxhash

from ctxbudget.caps._kept import ByIdentity, bytes_weight

_BOUNDARIES = ("<!-- OPENCLAW_CACHE_BOUNDARY -->", "<!-- /openclaw:attempt:STABLE -->")
_STABLE_CHARS = 65_536
"""At most this much of the system text goes into a prefix hash."""
_MARKER = b'"cache_control"'
_MARKER_VALUE = re.compile(rb"\s*:\s*\{[^{}]*\}\s*")
DIGEST = 16
"""Bytes of a block digest (`_digest`)."""
SEED_ENV = "CTXBUDGET_DIGEST_SEED"
SEED = int(os.environ.get(SEED_ENV) or secrets.randbits(64))
"""The block digests' seed: random per process; the offload worker gets its parent's
(`SEED_ENV`), so the digests of one session compare across the two."""
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


def _digested(data: bytes) -> tuple[bytes, bytes]:
    return data, _digest(data)


_BYTES_KEPT_MIN = 4096
_BYTES_KEPT = ByIdentity(16 << 20, lambda data, _: len(data) + 200)
"""Large raw blocks' digests by the bytes object itself (kept in the entry): at most 16 MB."""


def size_of(data: bytes | Digested) -> int:
    """A block's serial size, whether its bytes or its digest (`Digested`) are here."""
    return data.size if isinstance(data, Digested) else len(data)


def held(data: bytes | Digested) -> bytes | None:
    """A block's serial bytes when they are here: all a block parsed in this process, a small
    one's of a `Digested`; None for a large one parsed in the offload process."""
    return data.data if isinstance(data, Digested) else data


def counted(data: bytes | Digested) -> bool:
    """Whether the report can price the block where it is: its bytes or its token count are
    here (`Digested.counted`)."""
    return data.counted if isinstance(data, Digested) else True


def marked(value: Any) -> bool:
    """Whether a block's value still shows its `cache_control` breakpoints (where a provider
    keeps a prefix): a value parsed in this process does; a `Digested` one holds its `serial`
    bytes, without them.

    >>> marked({"role": "user", "content": "hi"}), marked(digested({"role": "user"}))
    (True, False)
    """
    return not isinstance(value, Digested)


def readable(value: Any, roles: Container[str | None]) -> Any:
    """A block's value as parsed (`Block.client`, `Block.forwarded`); for a `Digested`, its
    small bytes parsed again when it is a message whose role is in `roles` (None: not a
    message), else None: nothing large, nor what the caller skips, is parsed on the event
    loop."""
    if not isinstance(value, Digested):
        return value
    if value.data is None or value.role not in roles:
        return None
    return orjson.loads(value.data)


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
    if isinstance(value, dict | list):  # a clamped message, or system: the same object
        return _SERIAL_KEPT.get(_serial, value)  # every turn
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


def _is_system(value: Any) -> bool:
    """Whether a message block is a system (or developer) message."""
    if isinstance(value, Digested):
        return value.role in ("system", "developer")
    return isinstance(value, dict) and value.get("role") in ("system", "developer")
