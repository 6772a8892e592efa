"""Token counts with tiktoken, offline, cached, off the request path.

tiktoken downloads its BPE files on first use, which fails offline. litellm's wheel ships
them, so `TIKTOKEN_CACHE_DIR` points there before the first `get_encoding` — found through
the import system without importing litellm itself (that costs ~5 s and ~165 MB).
"""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import os
import sys
import threading
from pathlib import Path
from typing import Any

import xxhash
from cachetools import LRUCache

from caps import Segment

_lock = threading.Lock()
_encodings: dict[str, Any] = {}


def _point_tiktoken_at_bundled_files() -> None:
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return
    package = Path(next(iter(spec.submodule_search_locations)))
    bundled = package / "litellm_core_utils" / "tokenizers"
    if bundled.is_dir():
        os.environ["TIKTOKEN_CACHE_DIR"] = str(bundled)


def encoding_name(model: str | None, default: str) -> str:
    """The tiktoken encoding for `model`, or `default` when tiktoken does not know it."""
    if not model:
        return default
    import tiktoken.model

    name = model.rsplit("/", 1)[-1]
    try:
        return str(tiktoken.model.encoding_name_for_model(name))
    except KeyError:
        return default


def _encoding(name: str) -> Any:
    with _lock:
        enc = _encodings.get(name)
        if enc is None:
            _point_tiktoken_at_bundled_files()
            import tiktoken

            enc = tiktoken.get_encoding(name)
            # tiktoken keeps a Python dict of all 200k ranks beside its Rust tables; encoding
            # never uses it, and it is ~30 MB of the proxy's memory. Drop it, and hand the
            # loader's garbage back to the OS.
            enc._mergeable_ranks = {}
            gc.collect()
            trim_memory()
            _encodings[name] = enc
        return enc


def trim_memory() -> None:
    """Return freed heap memory to the OS (glibc `malloc_trim`; elsewhere nothing)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


PIECE_CHARS = 100_000
"""Texts longer than this are counted in pieces: tiktoken holds the GIL for a whole call
(~10 ms per 1 MB), and a 30 MB text in one call stalls every other thread for ~0.3 s."""


def _count(enc: Any, text: str) -> int:
    if len(text) <= PIECE_CHARS:
        return len(enc.encode_ordinary(text))
    # Cut just before a space or newline, where tiktoken's pre-tokenizer starts a new piece
    # anyway, so the sum is the count of the whole text (to within a token per cut at
    # runs of whitespace).
    total, start = 0, 0
    while start < len(text):
        end = start + PIECE_CHARS
        if end < len(text):
            cut = max(
                text.rfind(" ", start + PIECE_CHARS // 2, end),
                text.rfind("\n", start + PIECE_CHARS // 2, end),
            )
            end = cut if cut > start else end
        total += len(enc.encode_ordinary(text[start:end]))
        start = end
    return total


OBJECT_BYTES = 4096
OBJECTS_WEIGHT = 16 << 20
"""`TokenCounter` keeps blocks of `OBJECT_BYTES` or more and segments by identity, at most
this many bytes of them (most are kept anyway by the caches that hand them out)."""


class TokenCounter:
    """Counts tokens of texts, remembering recent ones.

    Agents resend the same bootstrap files and tool results on every turn of a tool loop, so
    most texts have been counted before; the cache turns those into a hash lookup. Each count
    is kept for the owner whose request asked for it (`owner`): another owner's request for
    the same text counts it again, as it would a text no one sent, so it cannot time whether
    the text was sent (issue 35).
    """

    def __init__(self, *, max_entries: int = 4096) -> None:
        self._cache: LRUCache[tuple[str, str, int, int], int] = LRUCache(maxsize=max_entries)
        self._lock = threading.Lock()  # the event loop and recall's worker threads share it
        self._objects: dict[tuple[int, str, str], tuple[object, int]] = {}
        self._objects_weight = 0
        """`count_bytes` of large blocks and `saved` of segments by the object (kept in the
        entry, so its id names no other): found without hashing its bytes again (~3 µs per
        50 KB) or looking up two texts (~3 µs)."""

    def count(self, text: str, encoding: str, *, owner: str = "") -> int:
        """Tokens in `text` under `encoding` (e.g. `o200k_base`), for `owner`'s request."""
        if not text:
            return 0
        # str hashes are cached on the object, and clamped texts are shared objects from the
        # caps caches: this key costs nothing for them and one pass for a new original. A
        # collision (64-bit hash and length equal) would misreport one count; never a clamp.
        key = (owner, encoding, hash(text), len(text))
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                return hit
        n = _count(_encoding(encoding), text)
        with self._lock:
            self._cache[key] = n
        return n

    def count_bytes(self, data: bytes, encoding: str, *, owner: str = "") -> int:
        """Tokens in UTF-8 `data` (undecodable bytes as U+FFFD) under `encoding`. Known by its
        digest: a block the report prices every turn (a clamped 50 KB system prompt) is not
        decoded and hashed again to be found (~40 µs a turn)."""
        if not data:
            return 0
        same = self._of_object(data, encoding, owner)  # a moved block's, every turn
        if same is not None:
            return same
        key = (owner, encoding, xxhash.xxh3_64_intdigest(data), -len(data))  # never a str's
        with self._lock:
            hit = self._cache.get(key)
        if hit is None:
            hit = _count(_encoding(encoding), data.decode(errors="replace"))
            with self._lock:
                self._cache[key] = hit
        if len(data) >= OBJECT_BYTES:
            self._keep_object(data, encoding, owner, hit, len(data))
        return hit

    def _of_object(self, obj: object, encoding: str, owner: str) -> int | None:
        """What was counted for this very object before (`_keep_object`), or None."""
        with self._lock:
            same = self._objects.get((id(obj), encoding, owner))
        return same[1] if same is not None and same[0] is obj else None

    def _keep_object(self, obj: object, encoding: str, owner: str, count: int, weight: int) -> None:
        if weight > OBJECTS_WEIGHT // 8:
            return
        with self._lock:
            if self._objects_weight + weight > OBJECTS_WEIGHT:
                self._objects.clear()
                self._objects_weight = 0
            self._objects[(id(obj), encoding, owner)] = (obj, count)
            self._objects_weight += weight

    def knows_bytes(self, data: bytes, encoding: str, *, owner: str = "") -> bool:
        """Whether `count_bytes(data, encoding, owner=owner)` is a cache hit."""
        key = (owner, encoding, xxhash.xxh3_64_intdigest(data), -len(data))
        with self._lock:
            return key in self._cache

    def saved(self, segment: Segment, encoding: str, *, owner: str = "") -> int:
        """Tokens a clamp saved (or would save) on `segment`: before minus after."""
        if segment.action == "kept" or segment.saved <= 0:
            return 0
        same = self._of_object(segment, encoding, owner)  # a session resends the same ones
        if same is not None:
            return same
        saved = max(
            0,
            self.count(segment.original, encoding, owner=owner)
            - self.count(segment.clamped, encoding, owner=owner),
        )
        self._keep_object(segment, encoding, owner, saved, segment_size(segment))
        return saved


def segment_size(segment: Segment) -> int:
    """About the bytes a segment kept by identity keeps alive: all its strings as Python
    holds them (a client's call id or URL may be long; a 4-byte character takes 4)."""
    held = (segment.original, segment.clamped, segment.label, segment.tool, segment.call_id)
    return sum(sys.getsizeof(v) for v in (*held, segment.url, segment.note) if v is not None)
