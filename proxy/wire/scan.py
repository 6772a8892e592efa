"""The first look at a request body: its top level scanned, a large value's UTF-8 checked,
and what an agent resends turn after turn remembered so it is not scanned again.

`Tails` remembers the fields after an agent's growing list (OpenClaw's 110 KB of tools);
`proxy/wire/history.py` remembers the growing list itself. `proxy/wire/body.py` builds the
request from what these find.
"""

from __future__ import annotations

import json
import math
import secrets
from typing import Any

import msgspec
import orjson
import xxhash
from cachetools import LRUCache

from proxy.errors import BadRequest

TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
"""A JSON object's top level: each value a slice of the document (checked, not decoded)."""
ITEMS = msgspec.json.Decoder(list[msgspec.Raw])
"""A JSON list's items, each a slice of the list."""
TOO_DEEP = (
    "request body nests JSON too deeply (the parsers stop at about 1,000 levels): send flatter JSON"
)


class Tails:
    """The top-level fields an agent sends after its growing list, unchanged turn after turn.

    An agent's body is `{…, "messages": [growing…], "tools": [110 KB, the same every turn],
    …}` (Claude Code's and Codex's too: `system`/`tools` after `messages`, `tools` after
    `input`). Scanning the whole body for its top level took ~0.12 ms of which ~0.09 ms went
    to the tools, the same bytes as last turn. So the part after the last field the adapter
    parses (`parsed`) is remembered once checked — its bytes, and its fields scanned from
    them — and a body that ends with the same bytes has only the part before scanned (a
    `memcmp` of the tail: ~5 µs). The part before is scanned as an object of its own: only a
    cut at a top-level comma decodes, so a body that happens to end with those bytes but is
    cut elsewhere is read the long way. What is remembered is per owner, so one owner's parse
    time tells nothing of what another sent.

    >>> tails = Tails(min_size=8)
    >>> first = b'{"messages": [1], "tools": [{"name": "exec", "description": "run"}], "n": 1}'
    >>> tails.fields(first) is None
    True
    >>> tails.remember(first, TOP.decode(first), ("messages",))
    >>> later = b'{"messages": [1, 2], "tools": [{"name": "exec", "description": "run"}], "n": 1}'
    >>> {k: bytes(v) for k, v in tails.fields(later).items()}
    {'messages': b'[1, 2]', 'tools': b'[{"name": "exec", "description": "run"}]', 'n': b'1'}
    >>> nested = b'{"x": {"y": 1, "tools": [{"name": "exec", "description": "run"}], "n": 1}'
    >>> tails.fields(nested) is None  # ends alike, but the cut is not at the top level
    True
    """

    def __init__(self, *, keep: int = 32, min_size: int = 16_384) -> None:
        self._by_end: LRUCache[tuple[str, bytes], tuple[bytes, dict[str, Any], int]] = LRUCache(
            maxsize=keep
        )
        """(tail, its fields, its `structure`) by owner and the tail's last `_END` bytes."""
        self._min = min_size
        """Shorter tails are not worth remembering: scanning them costs little."""

    def structure(self, raw: bytes, owner: str = "", *, start: int = 0) -> int:
        """`structure(raw[start:])`, that of a remembered tail it ends with counted once (an
        agent's 110 KB of tools: the count of the rest costs ~30 µs where the whole took ~70)."""
        found = self._by_end.get((owner, raw[-_END:]))
        if found is None or len(found[0]) > len(raw) - start or not raw.endswith(found[0]):
            return structure(raw, start)
        tail, _, counted = found
        return structure(raw, start, len(raw) - len(tail)) + counted

    def fields(
        self, raw: bytes, owner: str = "", *, stand_in: tuple[int, int, bytes] | None = None
    ) -> dict[str, Any] | None:
        """`raw`'s top-level fields (raw values) when it ends with a remembered tail and the
        part before is an object's members; else None. `stand_in` (start, end, bytes): read
        `raw` with `raw[start:end]` replaced by those bytes (`history`: the old items)."""
        found = self.read(raw, owner, stand_in=stand_in)
        return found[0] if found is not None else None

    def read(
        self, raw: bytes, owner: str = "", *, stand_in: tuple[int, int, bytes] | None = None
    ) -> tuple[dict[str, Any], int, int] | None:
        """`fields`, and the length and the `structure` of the tail `raw` ends with (its bytes
        compared once: `structure` needs no second look)."""
        found = self._by_end.get((owner, raw[-_END:]))
        if found is None:
            return None
        tail, tail_fields, tail_structure = found
        cut = len(raw) - len(tail)
        if cut <= 1 or not raw.endswith(tail):
            return None
        view = memoryview(raw)
        if stand_in is None:
            pieces: tuple[Any, ...] = (view[:cut], b"}")
        elif stand_in[1] <= cut:
            start, end, replacement = stand_in
            pieces = (view[:start], replacement, view[end:cut], b"}")
        else:
            return None
        # one copy of the head (a slice, then `+`, made two: each new buffer of a large
        # body costs page faults, ~3 µs a 4 KB page here)
        document = b"".join(pieces)
        try:
            head: dict[str, Any] = TOP.decode(document)
        except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError):
            return None  # not a member boundary, or a bad body: the long way says which
        if not document.isascii():  # the tail was checked when it was remembered
            try:
                check_utf8(head, (), owner)
            except BadRequest:
                return None
        for key in tail_fields:
            head.pop(key, None)  # a key given twice: the last one counts, as in a full scan
        return {**head, **tail_fields}, len(tail), tail_structure

    def remember(
        self, raw: bytes, fields: dict[str, Any], parsed: tuple[str, ...], owner: str = ""
    ) -> None:
        """Remember what follows the last of `parsed` in `raw` (already checked whole)."""
        keys = list(fields)
        last = max((keys.index(k) for k in parsed if k in fields), default=-1)
        if last < 0 or last == len(keys) - 1:
            return
        after = keys[last + 1 :]
        if sum(len(fields[k]) for k in after) < self._min:
            return
        value = fields[keys[last]]
        at = raw.find(value)  # the growing field's bytes: where the tail starts after them
        if at < 0:
            return
        cut = raw.find(b",", at + len(value))
        if cut < 0 or raw[at + len(value) : cut].strip():
            return
        tail = raw[cut:]
        if not _END <= len(tail) <= _MAX_TAIL:
            return
        try:
            tail_fields: dict[str, Any] = TOP.decode(b"{" + tail[1:])
        except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError):
            return
        if list(tail_fields) != after:  # the cut was not where the fields say: never mind
            return
        # kept as bytes: `raw_field` hands out the same object every turn instead of copying
        # 110 KB of tools a request
        kept = {k: bytes(v) for k, v in tail_fields.items()}
        self._by_end[(owner, tail[-_END:])] = (tail, kept, structure(tail))


def structure(raw: bytes, start: int = 0, end: int | None = None) -> int:
    """The objects and arrays parsing `raw[start:end]` can make: its `{` and `[` (those inside
    strings too: an overestimate, where the clamps parse the JSON a tool result holds as
    text). Both kinds: 1 MB of `[[[…]]]` is ~520,000 lists and not one `{` (issue 35).

    >>> structure(b'{"a": [[1], {"b": "[{"}]}')
    6
    """
    return raw.count(b"{", start, end) + raw.count(b"[", start, end)


_END = 32
"""Bytes of a body's end that look up its tail."""
_MAX_TAIL = 512 * 1024
"""Longer tails are not remembered (32 of them, with their fields as bytes, at most 32 MB)."""
TAILS = Tails()


def check_utf8(fields: dict[str, Any], parsed: tuple[str, ...], owner: str) -> None:
    # msgspec checks the strings it decodes, not the raw values it only skips; `messages` is
    # checked by orjson when it parses it. Usually ASCII: a fast check, no decode. An agent
    # sends the same large values every turn (OpenClaw's 110 KB of tools): one checked before
    # is known by its digest (6 µs, where decoding it again took ~90 µs), and by its owner:
    # another owner's value is checked again, so no one times what another sent.
    for key, value in fields.items():
        if key in parsed:
            continue  # orjson checks it as it parses; copying it here cost 30 ms at 30 MB
        large = len(value) > _REMEMBER_VALID
        if large:
            digest = xxhash.xxh3_128_digest(value, _SEED)
            if (owner, digest) in _VALID:
                continue
        data = bytes(value)
        if not data.isascii():
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise BadRequest(
                    f"'{key}' is not valid UTF-8 (byte {exc.start} of its value): send JSON",
                    param=key,
                ) from exc
        if large:
            _VALID[owner, digest] = True


_REMEMBER_VALID = 4096
"""Raw values over this many bytes are remembered once checked (`_VALID`)."""
_VALID: LRUCache[tuple[str, bytes], bool] = LRUCache(maxsize=256)
_SEED = secrets.randbits(64)
"""Unknown outside this process: no one can make invalid bytes digest as valid ones did."""


class _Overflow(float):
    """A number too large for a float (`1e999`), read as infinity. orjson refuses to write it
    (where plain infinity became `null`), so `_dumps` answers the 400 rather than change it;
    the client's bytes carry it wherever the proxy changed nothing (`_splice`)."""


def _float(text: str) -> float:
    value = float(text)
    return _Overflow(value) if math.isinf(value) else value


def loads(data: memoryview) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        try:  # valid JSON orjson refuses (huge integers, 1e999)
            return json.loads(bytes(data), parse_float=_float)
        except RecursionError:
            raise BadRequest(TOO_DEEP) from None
        except ValueError:
            raise BadRequest(f"request body is not valid JSON: {exc}") from exc
