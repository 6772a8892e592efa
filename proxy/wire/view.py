"""Clamp a request of another format through `caps`, by showing it a chat-shaped view.

`caps` reads chat completions: system messages, the first user message (where Claude Code and
Codex put their instruction files), assistant `tool_calls`, `tool` messages. The Messages and
Responses adapters build a view of their own request in that shape — one view message per
system text and per tool result, the first user message's texts, one assistant message per
batch of tool calls — remembering where each text came from. The one `Clamp` runs on the
view, and the adapter writes back only the texts that changed, into copies of the blocks that
held them: every other key of a block (`cache_control`, `is_error`, ids) stays where it was.

>>> view = ChatView()
>>> view.calls([("c1", "web_fetch", '{"url": "https://example.com"}')])
>>> view.result("c1", "short page", place=("result", 3, 0))
>>> view.messages[1]
{'role': 'tool', 'tool_call_id': 'c1', 'content': 'short page'}
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from ctxbudget.caps import Caps, Clamp, ClampResult, Segment, ToolNames
from ctxbudget.caps._kept import ChangedInPlace, OfObjects
from ctxbudget.caps.types import evolve
from ctxbudget.proxy.cache.blocks import Block
from ctxbudget.proxy.cache.resent import RESENT
from ctxbudget.proxy.wire.conversations import same_prefix

Place = tuple[Any, ...]
"""Where a view message's text lives in the real request: `(kind, real index, ...)`; the
real index (`-1` for a top-level field) becomes the segment's `message_index`."""


@dataclass
class ChatView:
    """Chat-shaped messages standing for a request of another format."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    places: list[Place | None] = field(default_factory=list)
    owner: str = ""
    """Whose request it is: what is kept by value (tool calls) is kept per owner, so one
    owner's timing tells nothing of another's."""

    def system(self, text: str, place: Place) -> None:
        """A system text (bootstrap files are looked for in it)."""
        self.messages.append(_VIEWS.get((text,), ("system",), _system, text))
        self.places.append(place)

    def first_user(self, texts: Sequence[tuple[int, str]], place: Place) -> None:
        """The texts of the request's first user message, `(part index, text)` each (index
        -1: the content is one string); `place` is completed with the part indexes. Only the
        agents' own wrappers in it are ever clamped (`caps.clamp`), never the user's words."""
        if not texts:  # still the first: a later user turn must not be taken for it
            self.messages.append(_NO_TEXT)
            self.places.append(None)
            return
        held = tuple(text for _, text in texts)
        key = ("user", tuple(i for i, _ in texts))
        self.messages.append(_VIEWS.get(held, key, _first_user, texts))
        self.places.append((*place, tuple(i for i, _ in texts)))

    def user(self, texts: Sequence[str]) -> None:
        """The texts of a later user message: never clamped, they are what the tool calls
        after them were asked for (the `query` strategy's question: `caps.question`)."""
        if texts:
            held = tuple(texts)
            self.messages.append(_VIEWS.get(held, ("asked",), _asked, held))
            self.places.append(None)

    def calls(self, calls: Sequence[tuple[str, str, str]]) -> None:
        """Tool calls as `(call id, tool name, arguments as JSON text)`: names the results."""
        if calls:
            self.messages.append(_VIEWS.get((), ("calls", self.owner, tuple(calls)), _calls, calls))
            self.places.append(None)

    def result(self, call_id: str, content: Any, place: Place) -> None:
        """A tool result: a string, or a list of parts whose `text` is what may be clamped."""
        self.messages.append(_VIEWS.get((content,), ("tool", call_id), _result, call_id, content))
        self.places.append(place)

    def clamp(
        self, clamp: Clamp, caps: Caps, tools: ToolNames
    ) -> tuple[list[Segment], list[tuple[Place, Any]]]:
        """The segments found (indexed by real message), and `(place, new content)` for every
        text the clamp changed."""
        return self.outcome(clamp({"messages": self.messages}, caps, tools=tools))

    def outcome(self, result: ClampResult) -> tuple[list[Segment], list[tuple[Place, Any]]]:
        """`clamp`'s answer from the clamp's `result` of `messages` (a resumed one)."""
        segments = [
            evolve(s, message_index=self._real_index(s.message_index)) for s in result.segments
        ]
        changes: list[tuple[Place, Any]] = []
        if result.changed:
            for old, new, place in zip(
                self.messages, result.request["messages"], self.places, strict=True
            ):
                if new is not old and place is not None:
                    changes.append((place, new.get("content")))
        return segments, changes

    def _real_index(self, index: int) -> int:
        place = self.places[index] if 0 <= index < len(self.places) else None
        return int(place[1]) if place is not None else -1


def real_segment(segment: Segment, places: list[Any]) -> Segment:
    """`segment` (of a view message) at its real message's index."""
    index = segment.message_index
    place = places[index] if 0 <= index < len(places) else None
    return evolve(segment, message_index=int(place[1]) if place else -1)


Placed = tuple[Sequence[Segment], Sequence[Segment], list[Segment], list[Segment]]
"""A request's view segments, as (the texts' and results', the prunable ones), and each
placed at its real message (`real_segment`), in the same two parts."""


def real_segments(
    segments: Sequence[Segment], places: list[Any], split: int | None, known: Placed | None
) -> tuple[Placed | None, list[Segment]]:
    """`segments` placed at their real messages, and what the next request takes of it.

    The clamp's segments are the texts' and the results' (the first `split`), then the
    prunable results (`caps.resume.segments`); a request resumed from the conversation's last
    has, in each part, the very segments of last time first, then the new ones. Those are
    placed as last time (`known`: the same view messages, so the same real ones): only the
    new ones are placed, and each segment stays the same object every turn. `split` None
    (a conversation clamped whole): every one is placed, nothing kept."""
    if split is None:
        return None, [real_segment(s, places) for s in segments]
    main, tail = segments[:split], segments[split:]
    a = b = 0
    if known is not None:
        a = same_prefix(main, known[0], len(main))
        b = same_prefix(tail, known[1], len(tail))
    placed_main = (known[2][:a] if known else []) + [real_segment(s, places) for s in main[a:]]
    placed_tail = (known[3][:b] if known else []) + [real_segment(s, places) for s in tail[b:]]
    return (main, tail, placed_main, placed_tail), placed_main + placed_tail


def placed(
    result: ClampResult, places: list[Any], known: Placed | None
) -> tuple[Placed | None, list[Segment]]:
    """`real_segments` of a resumed clamp's `result`: the texts' and results' segments, then
    the prunable ones (its state says where they split; none for a conversation clamped
    whole); `known`, the conversation's last request's. The debug mode places each one again."""
    state = result.state
    split = (
        len(state.text_segments) + len(state.tool_segments)
        if state is not None and not state.odd
        else None
    )
    real = real_segments(result.segments, places, split, known)
    if RESENT.check and known is not None:  # what was taken must be what placing each gives
        if real[1] != [real_segment(s, places) for s in result.segments]:
            raise ChangedInPlace("a conversation's segments were placed otherwise")
    return real


class Viewed:
    """A request's chat-shaped view, per item, as `Conversation.view` keeps it (Messages' and
    Responses' adapters; each adds what its head is made of)."""

    __slots__ = ("messages", "places", "ends", "first_index", "head", "written", "real", "caps",
                 "spent")  # fmt: skip

    def __init__(
        self,
        messages: list[Any],
        places: list[Any],
        ends: list[int],
        first_index: int,
        head: int,
        written: list[Any],
        real: Placed | None,
        caps: tuple[Caps, ToolNames],
    ) -> None:
        self.messages = messages
        self.places = places
        self.ends = ends
        """How many view messages up to and including each item's."""
        self.first_index = first_index
        """The first user message's index; -1 for none."""
        self.head = head
        """The view messages of the fields before the items (`system`, `instructions`)."""
        self.written = written
        """The items as the clamp's changes left them (whether or not applied)."""
        self.real = real
        """The view's segments and each at its real index (`real_segments`); None when the
        conversation is clamped whole."""
        self.caps = caps
        """The caps and tool names `written` and `real` were clamped with: under others (the
        config reloaded) the old items are clamped again."""
        self.spent = False
        """Its lists were taken by the next request's view (`take`): that request's clamp
        is the only reader of a conversation's view, so nothing reads them here again."""

    def take(self, kept: int, end: int) -> tuple[list[Any], list[Any], list[int]]:
        """The view messages, places and item ends of the first `kept` items (`end` view
        messages): its own lists, cut in place and the caller's to extend (a long
        conversation's three lists were copied every request); it is then spent, and a
        second request extending the same conversation reads its items from the first."""
        self.spent = True
        del self.messages[end:], self.places[end:], self.ends[kept:]
        return self.messages, self.places, self.ends


_VIEWS = OfObjects(8 << 20)
"""View messages by what they were made of (the texts an agent resends are the same objects
every turn, `resent`), so the clamps find them again (`caps._kept`): at most 8 MB."""


def _system(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


def _first_user(texts: Sequence[tuple[int, str]]) -> dict[str, Any]:
    if len(texts) == 1 and texts[0][0] < 0:
        return {"role": "user", "content": texts[0][1]}
    return {"role": "user", "content": [{"type": "text", "text": text} for _, text in texts]}


_NO_TEXT: Final[dict[str, Any]] = {"role": "user", "content": ""}
"""A first user message without text: nothing to clamp, never changed (shared)."""


def _asked(texts: tuple[str, ...]) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text} for text in texts]}


def _calls(calls: Sequence[tuple[str, str, str]]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ],
    }


def _result(call_id: str, content: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def arguments_json(value: Any) -> str:
    """A tool call's input as the JSON text a chat `tool_calls` entry carries (what names a
    bridged tool and gives a fetch its URL); "" when it cannot be written (orjson stops at
    254 levels, the stdlib at the interpreter's recursion limit)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        try:
            return json.dumps(value)
        except (RecursionError, TypeError, ValueError):
            return ""


def set_item(items: list[Any], index: int, key: str, value: Any) -> list[Any]:
    """A copy of `items` whose `items[index]` is a copy with `key` set to `value` (the same
    copy as last turn for the same item and value: `_copy`)."""
    out = list(items)
    out[index] = _copy(items[index], key, value)
    return out


def _copy(item: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """`{**item, key: value}`, kept by the identity of both: an agent resends the same item
    and the clamps give the same value every turn, so the copy is the same object too, and
    its JSON is written once (`Conversation.spliced`, `sessions._SERIAL_KEPT`)."""
    return _COPIES.get((item, value), (key,), _with, item, key, value)


def _with(item: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    return {**item, key: value}


_COPIES = OfObjects(8 << 20)
"""`_copy`'s copies, and `set_part`'s lists of parts: at most 8 MB."""


def set_texts(
    items: list[Any], index: int, parts: tuple[int, ...], new: Any, key: str = "text"
) -> list[Any]:
    """`items` with the first-user texts the clamp changed written back (`ChatView.first_user`:
    `parts` are the real part indexes, -1 for a string content; `new` the view's content)."""
    if parts == (-1,):
        return set_item(items, index, "content", new)
    for part, view_part in zip(parts, new, strict=True):
        if view_part["text"] != items[index]["content"][part].get(key):
            items = set_part(items, index, part, key, view_part["text"])
    return items


def set_part(items: list[Any], index: int, part: int, key: str, value: Any) -> list[Any]:
    """A copy of `items` where `items[index]["content"][part][key]` is `value` (copies on the
    way down; everything else shared)."""
    parts = items[index]["content"]
    new_part = _copy(parts[part], key, value)
    # the parts list kept like the copies: the same list for the same parts and new part
    new_parts = _COPIES.get((parts, new_part), ("parts", part), _replaced, parts, part, new_part)
    return set_item(items, index, "content", new_parts)


def _replaced(items: list[Any], index: int, item: Any) -> list[Any]:
    out = list(items)
    out[index] = item
    return out


def with_text(items: list[Any], index: int, text: str, part_type: str) -> list[Any]:
    """A copy of `items` whose `items[index]` has `text` appended to its content: after a
    blank line to a string, as a new `part_type` part to a list (the memory block)."""
    item = items[index]
    content = item.get("content") if isinstance(item, dict) else None
    if isinstance(content, str):
        return set_item(items, index, "content", f"{content}\n\n{text}")
    if isinstance(content, list):
        return set_item(items, index, "content", [*content, {"type": part_type, "text": text}])
    return items


def paired(
    label: str,
    client: list[Any],
    forwarded: list[Any],
    sent: Sequence[Any] | None = None,
    *,
    known: tuple[list[Block], int] | None = None,
) -> list[Block]:
    """One block per item, as sent and as forwarded (`label[i]`); `sent`, each client item's
    bytes as the client sent them (`JsonBody.raw_items`), when known; `known`, blocks made
    for an earlier request and how many of their first ones show the very client and
    forwarded objects these do (a conversation's: `Conversation.blocks`), taken as they are."""
    if sent is None or len(sent) != len(client):
        sent = [None] * len(client)
    labels = _labels(label, len(client))
    if len(client) != len(forwarded):  # nothing adds or removes items; be safe if it does
        items = zip(labels, client, sent, strict=False)
        return [Block(name, c, c, s) for name, c, s in items]
    start = 0
    out: list[Block] = []
    if known is not None:
        start = known[1]
        out = known[0][:start]
    items4 = zip(labels[start:], client[start:], forwarded[start:], sent[start:], strict=False)
    out += [Block(name, c, f, s) for name, c, f, s in items4]
    return out


def _labels(label: str, n: int) -> list[str]:
    """`label[0]` … `label[n-1]`, made once (a long session's 100 labels every request)."""
    known = _LABELS.setdefault(label, [])
    while len(known) < min(n, _MAX_LABELS):
        known.append(f"{label}[{len(known)}]")
    if n <= len(known):
        return known
    return known + [f"{label}[{i}]" for i in range(len(known), n)]


_MAX_LABELS = 4096
"""Labels kept per list name: a longer list's others are made each time."""


_LABELS: dict[str, list[str]] = {}
"""Labels by list name (`_labels`): as many as the longest list seen."""
