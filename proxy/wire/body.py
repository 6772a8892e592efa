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
from array import array
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import msgspec
import orjson
from starlette.requests import Request

from ctxbudget.caps._kept import ChangedInPlace
from ctxbudget.proxy.cache.resent import RESENT
from ctxbudget.proxy.errors import BadRequest, PayloadTooLarge
from ctxbudget.proxy.upstream.http import Body, Parts
from ctxbudget.proxy.wire.conversations import (
    Checked,
    Conversation,
    Conversations,
    Seen,
    index_of,
    same_prefix,
)
from ctxbudget.proxy.wire.history import Found
from ctxbudget.proxy.wire.scan import ITEMS, TAILS, TOO_DEEP, TOP, check_utf8, loads

_OUT_OF_RANGE = (
    "request body holds a number beyond a 64-bit float (like 1e999) where the proxy cannot "
    "keep the client's bytes: send numbers within ±1.7e308, or such a value as a string"
)
_MISSING = object()
_ITEMWISE = frozenset({"messages", "input", "system"})
"""List fields an agent resends turn by turn: parsed through `RESENT`."""
_GROWING = frozenset({"messages", "input"})
"""Of those, the ones it grows: remembered as the owner's conversation (`Conversations`)."""


class JsonBody:
    """One parsed request: top-level fields decoded on demand, the rest kept as raw bytes."""

    def __init__(
        self,
        raw: bytes,
        fields: dict[str, Any],
        *,
        decoded: bool,
        owner: str = "",
        history: Found | None = None,
        conversations: Conversations | None = None,
    ) -> None:
        self.raw = raw
        self.owner = owner
        """Whom the request acts for: what `RESENT` keeps of its items is theirs alone."""
        self._history = history
        """The list this body extends, when it does (`proxy/wire/history.py`)."""
        self.conversations = conversations
        """Where the owner's conversations are kept (the app's); None: nowhere."""
        self.conversation: Conversation | None = None
        """This request's state, once its growing list is read (what the stages decide for
        its items goes there, for the next request); None when it is not kept."""
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
                value = loads(memoryview(self._fields[key]))
            self._cache[key] = value
        return value

    def _items_parsed(self, key: str) -> Any:
        """A large list field parsed item by item, each item the client sent before (an
        agent's whole history, every turn) taken from `RESENT` instead of parsed again."""
        items = self.raw_items(key)
        if items is None or len(items) > RESENT.max_items:
            return loads(memoryview(self._fields[key]))
        history = self._history
        if history is not None and history.key == key:
            kept, last = history.kept, history.history
            if RESENT.check:
                if len(last.parsed) != len(last.ends):
                    raise ChangedInPlace("a conversation's list was changed in place")
                RESENT.verify(items[:kept], last.parsed[:kept], loads)
            # the request's list: the one copy of the old items' objects (it is its state's)
            parsed = last.parsed[:kept]
            parsed += RESENT.parse(
                items[kept:],
                self.owner,
                loads,
                taken=parsed,
                index=partial(index_of, last.where, parsed),
            )
        else:
            parsed = RESENT.parse(items, self.owner, loads)
        if key in _GROWING and self.conversations is not None:
            self.conversation = self.conversations.remember(
                self.raw, self.owner, key, self._fields[key], items, parsed
            )
        return parsed

    def extended(self, key: str) -> tuple[Conversation, int] | None:
        """The conversation this body's list `key` extends, and how many of its first items
        are the very objects that conversation's request had; None when it extends none."""
        history = self._history
        if history is None or history.key != key:
            return None
        return history.history, history.kept

    def checked_from(self, key: str, *, lenient: bool = False) -> tuple[int, Seen | None]:
        """Where the format's check of list `key` starts, and the call ids seen before it:
        after the items the extended conversation's request passed (`Checked.at`), else at 0."""
        found = self.extended(key)
        if found is None or not isinstance(found[0].checked, Checked):
            return 0, None
        start, seen = found[0].checked.at(found[1], lenient=lenient)
        if RESENT.check and seen is not None:  # the ids of the items before `start`, no other
            firsts, calls = seen
            if any(i >= start for i, _ in firsts) or calls != {c: i for i, c in firsts}:
                raise ChangedInPlace("a conversation's check resumed with other call ids")
        return start, seen

    def keep_checked(self, checked: Checked) -> None:
        """What this body's check passed, for the next request of its conversation."""
        if self.conversation is not None:
            self.conversation.checked = checked

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

    def raw_items(self, key: str) -> Sequence[Any] | None:
        """The items of a top-level list field as the client sent them (each a slice of its
        body), scanned once for every reader (the session stage hashes them, `encode` keeps
        the unchanged ones); None when absent, not a list, or on the fallback path."""
        if self._decoded or key not in self._fields:
            return None
        if self._history is not None and key == self._history.key:
            return self._history.items
        if key not in self._items:
            try:
                self._items[key] = ITEMS.decode(self._fields[key])
            except msgspec.MsgspecError:  # checked whole already: not a list
                self._items[key] = None
        return self._items[key]

    def to_dict(self, changes: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The whole request as Python values, with `changes` applied."""
        out = {k: self.get(k) for k in self._fields}
        out.update(changes or {})
        return out

    def encode(
        self, changes: Mapping[str, Any], *, clamped: tuple[list[Any], int] | None = None
    ) -> Body:
        """The request with the fields in `changes` replaced (new ones appended); every
        other field exactly as the client sent it. Whole, or in `Parts` when the growing list
        was written from what the conversation's last request sent (`_spliced`).

        `clamped`: the list the request's clamp wrote, and how many of its first items are
        the very objects of the list the conversation's last request's clamp wrote
        (`Conversation.clamped`): what the growing list's write-back resumes from without
        comparing the two lists item by item."""
        # One join over the pieces, the client's raw values as views of its body: a 186 KB
        # request is copied once, not once per concatenation.
        parts: list[Any] = [b"{"]
        split = False
        for key, value in self._fields.items():
            if key in changes:
                old = self._cache.get(key, _MISSING)
                new = changes[key]
                if not self._decoded and old is not _MISSING:
                    parts += (_dumps(key), b":")
                    pieces, kept = self._spliced(key, new, old, value, clamped)
                    split = split or kept
                    parts += pieces
                    parts.append(b",")
                    continue
                encoded = _dumps(new)
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
        return Parts(parts) if split else b"".join(parts)

    def _spliced(
        self, key: str, new: Any, old: Any, value: Any, clamped: tuple[list[Any], int] | None
    ) -> tuple[list[Any], bool]:
        """`_splice`, for the body's growing list resumed where the conversation's last
        request's left it: the items it wrote the same, the very objects, are the pieces it
        wrote them in (`Conversation.spliced`), and only the others are looked at. True
        with the pieces when they are those the conversation keeps for its next request.

        How many are the same is known when both lists are their clamps' (`clamped`: the
        clamp resumed from the last one's list), else compared (a C scan of the whole list,
        ~20 ns an item: ~15 µs at turn 300)."""
        items = self.raw_items(key)
        conversation = self.conversation
        if (
            conversation is None
            or conversation.key != key  # `system`: short, and not the conversation's list
            or self.conversations is None
            or not (isinstance(new, list) and isinstance(old, list))
            or items is None
            or len(items) != len(old)
        ):
            return _splice(new, old, value, items), False
        found = self.extended(key)
        known = found[0].spliced if found is not None else None
        start, ends = 0, array("q")  # an array: copied as one memcpy, not a ref an item
        chunks: list[Any] = []
        sizes: list[int] = []
        at, pieces = 1, [b"["]
        if known is not None and found is not None:
            last, last_chunks, last_sizes, last_ends = known
            limit = min(found[1], len(last), len(new))
            if clamped is not None and new is clamped[0] and last is found[0].clamped:
                start = min(limit, clamped[1])
                if RESENT.check and same_prefix(new, last, start) != start:
                    raise ChangedInPlace("a clamp's kept items are not the last list's")
            else:  # memory placed, pruned: another list than the clamp's
                start = same_prefix(new, last, limit)
            if start:
                at = last_ends[start - 1]
                chunks, sizes = _prefix(last_chunks, last_sizes, at)
                ends, pieces = last_ends[:start], []
        where = conversation.where  # `old` is the conversation's `parsed`: its index
        for i in range(start, len(new)):
            item = new[i]
            j = index_of(where, old, item)
            piece = _dumps(item) if j is None else items[j]
            if i:
                pieces.append(b",")
                at += 1
            pieces.append(piece)
            at += len(piece)
            ends.append(at)
        if pieces:  # the new items' bytes: one chunk, the last ones merged as they grow
            _append(chunks, sizes, b"".join(pieces))
        if RESENT.check and b"".join((*chunks, b"]")) != b"".join(_splice(new, old, value, items)):
            raise ChangedInPlace("a conversation's list was written back otherwise than whole")
        conversation.spliced = (new, chunks, sizes, ends)
        self.conversations.grew(self.owner, conversation, at + 16 * len(ends))
        return [*chunks, b"]"], True


def _prefix(chunks: list[Any], sizes: list[int], size: int) -> tuple[list[Any], list[int]]:
    """The first `size` bytes of the list written in `chunks` (`sizes`: where each ends): the
    chunks before, and a view of the one it ends in."""
    k = bisect_left(sizes, size)
    if sizes[k] == size:
        return chunks[: k + 1], sizes[: k + 1]
    begin = sizes[k - 1] if k else 0
    return [*chunks[:k], memoryview(chunks[k])[: size - begin]], [*sizes[:k], size]


def _append(chunks: list[Any], sizes: list[int], chunk: bytes) -> None:
    """Add `chunk` after `chunks`, then join the last two while the one before is at most
    twice the last (a binary counter's carries): the list stays in few chunks (one a
    doubling of the turns' bytes), and a turn's bytes are copied again about once a
    doubling, not the whole list every turn."""
    chunks.append(chunk)
    sizes.append((sizes[-1] if sizes else 0) + len(chunk))
    while len(chunks) > 1 and len(chunks[-2]) <= 2 * len(chunks[-1]):
        last = chunks.pop()
        sizes.pop()
        chunks[-1] = b"".join((chunks[-1], last))
        sizes[-1] += len(last)


class ChatBody(JsonBody):
    """A chat completions request: `messages` parsed up front."""

    @property
    def messages(self) -> Any:
        return self.get("messages")

    def encode(
        self,
        changes: Mapping[str, Any] | list[Any],
        *,
        clamped: tuple[list[Any], int] | None = None,
    ) -> Body:
        """The request with `messages` (a list) or the fields in `changes` replaced."""
        if isinstance(changes, list):
            changes = {"messages": changes}
        return super().encode(changes, clamped=clamped)


def parse_object(
    raw: bytes,
    *,
    example: str,
    parsed: tuple[str, ...] = ("messages",),
    owner: str = "",
    conversations: Conversations | None = None,
) -> JsonBody:
    """Check that `raw` is one JSON object and scan its top level; `BadRequest` otherwise.

    `example` is what a request of this format looks like, for the error message; `parsed`
    names the fields the caller parses at once (their UTF-8 is checked then, not twice);
    `owner`, whom the request acts for (what `Tails` remembers is per owner); `conversations`,
    the app's: a body that extends one of the owner's is read as its extension.
    """
    if not raw.strip():
        raise BadRequest(f"request body is empty: send {example}")
    kept = conversations
    history = None if kept is None else kept.find(raw, owner)
    if history is not None:
        if not history.valid:
            check_utf8(history.fields, parsed, owner)
        return JsonBody(
            raw, history.fields, decoded=False, owner=owner, history=history, conversations=kept
        )
    known = TAILS.fields(raw, owner)
    if known is not None:
        return JsonBody(raw, known, decoded=False, owner=owner, conversations=kept)
    try:
        fields: dict[str, Any] = TOP.decode(raw)
        decoded = False
    except RecursionError:
        raise BadRequest(TOO_DEEP) from None
    except UnicodeDecodeError as exc:  # msgspec checks keys as it reads them
        raise BadRequest(
            f"request body is not valid UTF-8 (byte {exc.start} of a key): send JSON"
        ) from None
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
            raise BadRequest(TOO_DEEP) from None
        except ValueError as exc:
            raise BadRequest(f"request body is not valid JSON: {exc}") from exc
        if not isinstance(whole, dict):
            raise BadRequest(
                f"request body must be a JSON object, got {type(whole).__name__}"
            ) from None
        fields, decoded = whole, True
    if not decoded and not raw.isascii():  # ASCII is valid UTF-8: one fast scan
        check_utf8(fields, parsed, owner)
    if not decoded:
        TAILS.remember(raw, fields, parsed, owner)
    return JsonBody(raw, fields, decoded=decoded, owner=owner, conversations=kept)


def parse_chat_body(
    raw: bytes, owner: str = "", conversations: Conversations | None = None
) -> ChatBody:
    """Check and parse a chat request; `BadRequest` naming what is wrong."""
    top = parse_object(
        raw, example='{"model": ..., "messages": [...]}', owner=owner, conversations=conversations
    )
    if "messages" not in top:
        raise BadRequest("'messages' is required: a list of chat messages", param="messages")
    body = ChatBody(
        raw,
        top._fields,
        decoded=top._decoded,
        owner=owner,
        history=top._history,
        conversations=conversations,
    )
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


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise BadRequest(_OUT_OF_RANGE)
    return value


def _splice(
    new: Any, old: Any, raw: bytes | msgspec.Raw, items: Sequence[Any] | None = None
) -> list[Any]:
    """`new` as JSON, in pieces to join (the body is joined once: a 186 KB body's messages
    were copied four times), where `old` is the value parsed from the client's bytes `raw`:
    when both are lists, each item of `new` that is an item of `old` (the same object: the
    wires and the clamp copy what they change and share the rest) is written as its bytes in
    `raw`, and only the others are serialised.

    One level: a changed message is serialised whole, as before. Going down into it too
    would scan its bytes again (a 30 MB tool result, for one clamp) and cost ~10 µs a
    changed message on every request, for numbers written unusually inside it.
    """
    if not (isinstance(new, list) and isinstance(old, list)):
        return [_dumps(new)]
    if items is None:
        items = ITEMS.decode(raw)
    if len(items) != len(old):  # cannot happen: `old` was parsed from `raw`
        return [_dumps(new)]
    where = {id(item): i for i, item in enumerate(old)}
    parts: list[Any] = [b"["]
    for item in new:
        i = where.get(id(item))
        if i is not None and old[i] is item:
            parts.append(items[i])
        else:  # a clamped message
            parts.append(_dumps(item))
        parts.append(b",")
    if len(parts) == 1:
        return [b"[]"]
    parts[-1] = b"]"
    return parts


def _dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # integers past 64 bits, lone surrogates: the stdlib escapes them
        try:
            return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
        except ValueError:  # never `Infinity`, which is not JSON
            raise BadRequest(_OUT_OF_RANGE) from None


def check_text_part(part: dict[str, Any], where: str, kinds: tuple[str, ...]) -> None:
    """400 unless the `text` of content part `part` (at `where`) is a string: a part of one of
    `kinds` must have one, any other part's `text` must be a string when it is there. Every
    provider refuses other values with a 400, and the clamps measure the text (a number made
    the chat clamp raise, so the request went on unclamped, or was a 500 with `failClosed`)."""
    text = part.get("text")
    if isinstance(text, str) or (text is None and part.get("type") not in kinds):
        return
    got = "nothing" if "text" not in part else type_name(text)
    raise BadRequest(f"'{where}.text' must be a string, got {got}", param=f"{where}.text")


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
        if not chunk:
            continue  # the ASGI stream's closing message: joined with it, a body is copied
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is {over.format(limit=limit)}")
        chunks.append(chunk)
    # a body that came in one piece is that piece (`join` returns a lone bytes as it is):
    # a copy of a 1 MB conversation cost ~50 µs a request, ~2 µs a turn of history
    return b"".join(chunks)
