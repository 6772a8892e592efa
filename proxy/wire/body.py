"""A chat request body: parse what the proxy reads, keep the rest as the client's bytes.

A 180 KB OpenClaw request is mostly `tools` (~105 KB of JSON schemas) that the proxy never
changes. Parsing it all into Python objects took 0.40 ms of the 1 ms budget. Instead the top
level is scanned once (msgspec, `dict[str, Raw]`: every value stays a slice of the original
bytes, and the whole document is still checked to be well-formed JSON), only `messages` is
parsed, and a changed request is written back by splicing the new `messages` between the
untouched raw values: 0.25 ms for the same request, and every other field reaches the
upstream byte for byte.

Within a changed list (`messages`, `input`, `system` blocks) the same holds one level down:
each message or item the proxy did not change is written as the client's bytes, and only the
changed ones are serialised (`_splice`). So in them `1E2` stays `1E2` (not `100.0`), and a
number no float can hold (`1e999`) stays as sent instead of becoming `null`, or `Infinity`
(not JSON).

>>> body = parse_chat_body(b'{"model": "m", "tools": [1.50], "messages": [{"role": "user"}]}')
>>> body.get("model"), body.messages
('m', [{'role': 'user'}])
>>> body.encode([{"role": "user", "content": "x"}])
b'{"model":"m","tools":[1.50],"messages":[{"role":"user","content":"x"}]}'
>>> body = parse_chat_body(b'{"model": "m", "messages": [{"n": 1E2, "x": 1e999}, {"c": "a"}]}')
>>> first, second = body.messages
>>> body.encode([first, {**second, "c": "b"}])
b'{"model":"m","messages":[{"n": 1E2, "x": 1e999},{"c":"b"}]}'
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Mapping
from typing import Any

import msgspec
import orjson
import xxhash
from cachetools import LRUCache
from starlette.requests import Request

from caps._kept import ByIdentity, bytes_weight
from proxy.cache.resent import RESENT
from proxy.errors import BadRequest, PayloadTooLarge

_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ITEMS = msgspec.json.Decoder(list[msgspec.Raw])
_TOO_DEEP = (
    "request body nests JSON too deeply (the parsers stop at about 1,000 levels): send flatter JSON"
)
_OUT_OF_RANGE = (
    "request body holds a number beyond a 64-bit float (like 1e999) where the proxy cannot "
    "keep the client's bytes: send numbers within ±1.7e308, or such a value as a string"
)
_MISSING = object()
_ITEMWISE = frozenset({"messages", "input", "system"})
"""List fields an agent grows turn by turn, resending the rest: parsed through `RESENT`."""


class JsonBody:
    """One parsed request: top-level fields decoded on demand, the rest kept as raw bytes."""

    def __init__(
        self, raw: bytes, fields: dict[str, Any], *, decoded: bool, owner: str = ""
    ) -> None:
        self.raw = raw
        self.owner = owner
        """Whom the request acts for: what `RESENT` keeps of its items is theirs alone."""
        self._fields = fields
        self._decoded = decoded  # True when `fields` hold Python values (the fallback path)
        self._cache: dict[str, Any] = {}
        self._raw: dict[str, bytes] = {}
        self._items: dict[str, list[msgspec.Raw] | None] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._fields

    def get(self, key: str, default: Any = None) -> Any:
        """A top-level field as a Python value (decoded once)."""
        value = self._cache.get(key, _MISSING)
        if value is _MISSING:
            if key not in self._fields:
                return default
            if self._decoded:
                value = self._fields[key]
            elif key in _ITEMWISE and len(self._fields[key]) >= RESENT.min_list:
                value = self._items_parsed(key)
            else:
                value = _loads(memoryview(self._fields[key]))
            self._cache[key] = value
        return value

    def _items_parsed(self, key: str) -> Any:
        """A large list field parsed item by item, each item the client sent before (an
        agent's whole history, every turn) taken from `RESENT` instead of parsed again."""
        items = self.raw_items(key)
        if items is None or len(items) > RESENT.max_items:
            return _loads(memoryview(self._fields[key]))
        return RESENT.parse(items, self.owner, _loads)

    def raw_field(self, key: str) -> Any:
        """A top-level field as sent: its JSON bytes (its value on the fallback path), or
        None when absent. For fields the proxy passes on without reading (`tools`)."""
        if key not in self._fields:
            return None
        if self._decoded:
            return self._fields[key]
        found = self._raw.get(key)
        if found is None:  # one copy per request: the blocks of a request compare by identity
            found = self._raw[key] = bytes(self._fields[key])
        return found

    def raw_items(self, key: str) -> list[msgspec.Raw] | None:
        """The items of a top-level list field as the client sent them (each a slice of its
        body), scanned once for every reader (the session stage hashes them, `encode` keeps
        the unchanged ones); None when absent, not a list, or on the fallback path."""
        if self._decoded or key not in self._fields:
            return None
        if key not in self._items:
            try:
                self._items[key] = _ITEMS.decode(self._fields[key])
            except msgspec.MsgspecError:  # checked whole already: not a list
                self._items[key] = None
        return self._items[key]

    def to_dict(self, changes: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The whole request as Python values, with `changes` applied."""
        out = {k: self.get(k) for k in self._fields}
        out.update(changes or {})
        return out

    def encode(self, changes: Mapping[str, Any]) -> bytes:
        """The request with the fields in `changes` replaced (new ones appended); every
        other field exactly as the client sent it."""
        # One join over the pieces, the client's raw values as views of its body: a 186 KB
        # request is copied once, not once per concatenation.
        parts: list[bytes | memoryview] = [b"{"]
        for key, value in self._fields.items():
            if key in changes:
                old = self._cache.get(key, _MISSING)
                new = changes[key]
                encoded = (
                    _splice(new, old, value, self.raw_items(key))
                    if not self._decoded and old is not _MISSING
                    else _dumps(new)
                )
            elif self._decoded:
                encoded = _dumps(value)
            else:
                encoded = value
            parts += (_dumps(key), b":", encoded, b",")
        for key, value in changes.items():
            if key not in self:
                parts += (_dumps(key), b":", _dumps(value), b",")
        if len(parts) > 1:
            parts.pop()  # the last comma
        parts.append(b"}")
        return b"".join(parts)


class ChatBody(JsonBody):
    """A chat completions request: `messages` parsed up front."""

    def __init__(
        self, raw: bytes, fields: dict[str, Any], *, decoded: bool, owner: str = ""
    ) -> None:
        super().__init__(raw, fields, decoded=decoded, owner=owner)
        self.messages: list[Any] = self.get("messages")

    def encode(self, changes: Mapping[str, Any] | list[Any]) -> bytes:
        """The request with `messages` (a list) or the fields in `changes` replaced."""
        return super().encode({"messages": changes} if isinstance(changes, list) else changes)


def parse_object(
    raw: bytes, *, example: str, parsed: tuple[str, ...] = ("messages",), owner: str = ""
) -> JsonBody:
    """Check that `raw` is one JSON object and scan its top level; `BadRequest` otherwise.

    `example` is what a request of this format looks like, for the error message; `parsed`
    names the fields the caller parses at once (their UTF-8 is checked then, not twice);
    `owner`, whom the request acts for (what `Tails` remembers is per owner).
    """
    if not raw.strip():
        raise BadRequest(f"request body is empty: send {example}")
    known = TAILS.fields(raw, owner)
    if known is not None:
        return JsonBody(raw, known, decoded=False, owner=owner)
    try:
        fields: dict[str, Any] = _TOP.decode(raw)
        decoded = False
    except RecursionError:
        raise BadRequest(_TOO_DEEP) from None
    except msgspec.ValidationError:
        raise BadRequest(
            f"request body must be a JSON object, got {_kind(raw)}: send {example}"
        ) from None
    except msgspec.DecodeError:
        # Lone surrogate escapes ("\\ud800") are valid JSON that msgspec refuses; the stdlib
        # parser takes them. Anything neither accepts is malformed.
        try:  # NaN and Infinity are not JSON; 1e999 is, but nothing without the raw keeps it
            whole = json.loads(raw, parse_constant=_not_json, parse_float=_finite)
        except RecursionError:
            raise BadRequest(_TOO_DEEP) from None
        except ValueError as exc:
            raise BadRequest(f"request body is not valid JSON: {exc}") from exc
        if not isinstance(whole, dict):
            raise BadRequest(
                f"request body must be a JSON object, got {type(whole).__name__}"
            ) from None
        fields, decoded = whole, True
    if not decoded and not raw.isascii():  # ASCII is valid UTF-8: one fast scan
        _check_utf8(fields, parsed)
    if not decoded:
        TAILS.remember(raw, fields, parsed, owner)
    return JsonBody(raw, fields, decoded=decoded, owner=owner)


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
    >>> tails.remember(first, _TOP.decode(first), ("messages",))
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
        """(tail, its fields, its `{` count) by owner and the tail's last `_END` bytes."""
        self._min = min_size
        """Shorter tails are not worth remembering: scanning them costs little."""

    def braces(self, raw: bytes, owner: str = "") -> int:
        """The `{` in `raw`, counting those of a remembered tail it ends with once (an agent's
        110 KB of tools: the count of the rest costs ~30 µs where the whole took ~70)."""
        found = self._by_end.get((owner, raw[-_END:]))
        if found is None or len(found[0]) >= len(raw) or not raw.endswith(found[0]):
            return raw.count(b"{")
        tail, _, braces = found
        return raw.count(b"{", 0, len(raw) - len(tail)) + braces

    def fields(self, raw: bytes, owner: str = "") -> dict[str, Any] | None:
        """`raw`'s top-level fields (raw values) when it ends with a remembered tail and the
        part before is an object's members; else None."""
        found = self._by_end.get((owner, raw[-_END:]))
        if found is None:
            return None
        tail, tail_fields, _ = found
        cut = len(raw) - len(tail)
        if cut <= 1 or not raw.endswith(tail):
            return None
        try:
            # one copy of the head (a slice, then `+`, made two: each new buffer of a large
            # body costs page faults, ~3 µs a 4 KB page here)
            head: dict[str, Any] = _TOP.decode(b"".join((memoryview(raw)[:cut], b"}")))
        except (msgspec.MsgspecError, RecursionError):
            return None  # not a member boundary, or a bad body: the long way says which
        if not raw.isascii():
            try:
                _check_utf8(head, ())
            except BadRequest:
                return None
        for key in tail_fields:
            head.pop(key, None)  # a key given twice: the last one counts, as in a full scan
        return {**head, **tail_fields}

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
            tail_fields: dict[str, Any] = _TOP.decode(b"{" + tail[1:])
        except (msgspec.MsgspecError, RecursionError):
            return
        if list(tail_fields) != after:  # the cut was not where the fields say: never mind
            return
        # kept as bytes: `raw_field` hands out the same object every turn instead of copying
        # 110 KB of tools a request
        kept = {k: bytes(v) for k, v in tail_fields.items()}
        self._by_end[(owner, tail[-_END:])] = (tail, kept, tail.count(b"{"))


_END = 32
"""Bytes of a body's end that look up its tail."""
_MAX_TAIL = 512 * 1024
"""Longer tails are not remembered (32 of them, with their fields as bytes, at most 32 MB)."""
TAILS = Tails()


def parse_chat_body(raw: bytes, owner: str = "") -> ChatBody:
    """Check and parse a chat request; `BadRequest` naming what is wrong."""
    top = parse_object(raw, example='{"model": ..., "messages": [...]}', owner=owner)
    if "messages" not in top:
        raise BadRequest("'messages' is required: a list of chat messages", param="messages")
    body = ChatBody(raw, top._fields, decoded=top._decoded, owner=owner)
    if not isinstance(body.messages, list):
        raise BadRequest(
            f"'messages' must be a list of chat messages, got {type_name(body.messages)}",
            param="messages",
        )
    check_model(body)
    return body


def check_model(body: JsonBody) -> None:
    """400 unless `model` is a non-empty string: every format's upstream needs one."""
    model = body.get("model")
    if model is None:
        raise BadRequest("'model' is required: the model to send the request to", param="model")
    if not isinstance(model, str):
        raise BadRequest(f"'model' must be a string, got {type_name(model)}", param="model")
    if not model.strip():
        raise BadRequest("'model' must not be empty", param="model")


def _check_utf8(fields: dict[str, Any], parsed: tuple[str, ...]) -> None:
    # msgspec checks the strings it decodes, not the raw values it only skips; `messages` is
    # checked by orjson when it parses it. Usually ASCII: a fast check, no decode. An agent
    # sends the same large values every turn (OpenClaw's 110 KB of tools): one checked before
    # is known by its digest (6 µs, where decoding it again took ~90 µs).
    for key, value in fields.items():
        if key in parsed:
            continue  # orjson checks it as it parses; copying it here cost 30 ms at 30 MB
        large = len(value) > _REMEMBER_VALID
        if large:
            digest = xxhash.xxh3_128_digest(value, _SEED)
            if digest in _VALID:
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
            _VALID[digest] = True


_REMEMBER_VALID = 4096
"""Raw values over this many bytes are remembered once checked (`_VALID`)."""
_VALID: LRUCache[bytes, bool] = LRUCache(maxsize=256)
_SEED = secrets.randbits(64)
"""Unknown outside this process: no one can make invalid bytes digest as valid ones did."""


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise BadRequest(_OUT_OF_RANGE)
    return value


class _Overflow(float):
    """A number too large for a float (`1e999`), read as infinity. orjson refuses to write it
    (where plain infinity became `null`), so `_dumps` answers the 400 rather than change it;
    the client's bytes carry it wherever the proxy changed nothing (`_splice`)."""


def _float(text: str) -> float:
    value = float(text)
    return _Overflow(value) if math.isinf(value) else value


def _loads(data: memoryview) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        try:  # valid JSON orjson refuses (huge integers, 1e999)
            return json.loads(bytes(data), parse_float=_float)
        except RecursionError:
            raise BadRequest(_TOO_DEEP) from None
        except ValueError:
            raise BadRequest(f"request body is not valid JSON: {exc}") from exc


def _splice(
    new: Any, old: Any, raw: bytes | msgspec.Raw, items: list[msgspec.Raw] | None = None
) -> bytes:
    """`new` as JSON, where `old` is the value parsed from the client's bytes `raw`: when both
    are lists, each item of `new` that is an item of `old` (the same object: the wires and
    the clamp copy what they change and share the rest) is written as its bytes in `raw`, and
    only the others are serialised.

    One level: a changed message is serialised whole, as before. Going down into it too
    would scan its bytes again (a 30 MB tool result, for one clamp) and cost ~10 µs a
    changed message on every request, for numbers written unusually inside it.
    """
    if not (isinstance(new, list) and isinstance(old, list)):
        return _dumps(new)
    if items is None:
        items = _ITEMS.decode(raw)
    if len(items) != len(old):  # cannot happen: `old` was parsed from `raw`
        return _dumps(new)
    where = {id(item): i for i, item in enumerate(old)}
    parts: list[bytes | msgspec.Raw] = []
    for item in new:
        i = where.get(id(item))
        if i is not None and old[i] is item:
            parts.append(items[i])
        else:  # a clamped message: the same object every turn (`caps._kept`), written once
            parts.append(_DUMPED.get(_dumps, item))
    return b"[" + b",".join(parts) + b"]"


_DUMPED = ByIdentity(8 << 20, bytes_weight)
"""Changed items' JSON by the item's identity: at most 8 MB."""


def _dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # integers past 64 bits, lone surrogates: the stdlib escapes them
        try:
            return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
        except ValueError:  # never `Infinity`, which is not JSON
            raise BadRequest(_OUT_OF_RANGE) from None


def type_name(value: Any) -> str:
    """The JSON name of a value's type, for error messages."""
    return {
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean",
        dict: "object",
        list: "list",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _kind(raw: bytes) -> str:
    first = raw.lstrip()[:1]
    return {b"[": "list", b'"': "string", b"t": "boolean", b"f": "boolean", b"n": "null"}.get(
        first, "number"
    )


_CONTEXT_LIMIT = "over proxy.maxBodyBytes ({limit:,} bytes): raise it or send less context"


async def read_body(request: Request, limit: int, *, over: str = _CONTEXT_LIMIT) -> bytes:
    """The request body, refused (413) as soon as it is known to be over `limit` bytes; `over`
    says which limit and what to do (`{limit}` is filled in)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(
            f"request body is {int(declared):,} bytes, {over.format(limit=limit)}"
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is {over.format(limit=limit)}")
        chunks.append(chunk)
    return b"".join(chunks)
