"""OpenAI Responses (`POST /v1/responses`): a wire adapter.

What OpenClaw, Codex and the `openai` SDK send (`shared/OPENCLAW_WIRE_FORMATS.md` §4):

- System prompt: `instructions`, and `message` items of role `system`/`developer` in `input`
  (OpenClaw: `input[0]`, one `input_text` part holding the whole prompt and its bootstrap
  files).
- Codex's AGENTS.md: the first part of its first user `message` item (`# AGENTS.md
  instructions for <dir>` … `<INSTRUCTIONS>`): the first user item's text parts are shown to
  `caps`, which clamps only that wrapper, never the user's own text.
- Tool results: `function_call_output` items; the tool name is on the `function_call` item
  with the same `call_id`.
- Continuation (`previous_response_id`): a later request carries only the new input — often
  just a `function_call_output` whose `function_call` is stored upstream, not sent. The names
  of the calls a reply made are remembered from the replies this proxy relayed (`CallNames`:
  bounded, per owner, in memory), so such a result is still recognised; the earlier turns are
  not ours to clamp, and the report says so.
- Never touched: `reasoning` items (`encrypted_content`), `previous_response_id`, `store`,
  `include`, and every item type this adapter does not know.

Only `input` and `instructions` are ever re-serialised, and only when they changed.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, overload

import orjson
from cachetools import LRUCache

from ctxbudget.caps import Caps, Clamp, Segment, ToolNames
from ctxbudget.caps._kept import ChangedInPlace
from ctxbudget.memory.inject import Placement, block
from ctxbudget.memory.query import UserTurn, user_turn
from ctxbudget.proxy.cache.blocks import Block
from ctxbudget.proxy.cache.resent import RESENT
from ctxbudget.proxy.config.settings import Settings
from ctxbudget.proxy.errors import BadRequest, CtxBudgetError
from ctxbudget.proxy.upstream.http import Body
from ctxbudget.proxy.wire.body import (
    JsonBody,
    check_model,
    check_text_part,
    parse_object,
    type_name,
)
from ctxbudget.proxy.wire.chat import openai_headers
from ctxbudget.proxy.wire.conversations import Checked, Conversations, Seen
from ctxbudget.proxy.wire.pruned import second_pass
from ctxbudget.proxy.wire.types import (
    Asker,
    InProcessRequest,
    Reply,
    WireFormat,
    WireRequest,
    resumed,
)
from ctxbudget.proxy.wire.view import (
    ChatView,
    Placed,
    Viewed,
    placed,
    set_item,
    set_part,
    set_texts,
    with_text,
)

_EXAMPLE = '{"model": ..., "input": ...}'
_SYSTEM_ROLES = ("system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "text")


_CALL_WEIGHT = 300
"""What a kept call holds beside its strings' characters: the tuples, the strings' headers,
the LRU's links."""


class CallNames:
    """`call_id` → (tool name, arguments) of the function calls relayed replies made, per
    owner, the `limit` most recently used kept: what a continuation's
    `function_call_output` answers."""

    def __init__(self, limit: int = 10_000, max_bytes: int = 8 << 20) -> None:
        # weighed by what each call holds: the upstream's arguments are any size, so a count
        # of entries alone bounded nothing (10,000 calls of 1 MB arguments: 10 GB)
        self._calls: LRUCache[tuple[str, str], tuple[str, str, int]] = LRUCache(
            maxsize=max_bytes, getsizeof=lambda found: found[2]
        )
        self._limit = limit
        self._lock = threading.Lock()

    def remember(self, owner: str, call_id: str, name: str, arguments: str) -> None:
        weight = _CALL_WEIGHT + len(owner) + len(call_id) + len(name) + len(arguments)
        if weight > self._calls.maxsize:
            return  # larger than all of it: a continuation of it goes without its name
        with self._lock:
            self._calls[(owner, call_id)] = (name, arguments, weight)
            while len(self._calls) > self._limit:
                self._calls.popitem()

    def get(self, owner: str, call_id: str) -> tuple[str, str] | None:
        with self._lock:
            found = self._calls.get((owner, call_id))
        return None if found is None else (found[0], found[1])

    def __len__(self) -> int:
        return len(self._calls)


class AskedNames(CallNames):
    """Call names asked of another process's `CallNames` (the offload worker's: `ask` sends
    the call id to its parent, which answers for the request's owner)."""

    def __init__(self, ask: Asker) -> None:  # nothing kept here: no cache, no lock
        self._ask = ask

    def get(self, owner: str, call_id: str) -> tuple[str, str] | None:
        found = self._ask(call_id)
        return None if found is None else (found[0], found[1])


class ResponseOwners:
    """Response id → the owner it was returned to, for the `limit` responses relayed or asked
    about most recently: a continuation (`previous_response_id`) of another owner's response
    is refused.

    With proxy keys every owner reaches the upstream with the one upstream key, so the
    upstream would continue any owner's stored conversation for anyone who names its id.
    An id this process has not relayed (another worker's or instance's, one from before a
    restart, or older than the newest `limit`) is not known here and goes upstream as sent.
    """

    def __init__(self, limit: int = 50_000) -> None:
        self._owners: LRUCache[str, str] = LRUCache(maxsize=limit)
        self._lock = threading.Lock()

    def remember(self, response_id: str, owner: str) -> None:
        with self._lock:
            self._owners[response_id] = owner

    def check(self, response_id: Any, owner: str) -> None:
        """`BadRequest` when `response_id` was returned to another owner: worded as the
        upstream words an id it does not know, so the refusal tells nothing of the other."""
        if not isinstance(response_id, str):
            return
        with self._lock:
            known = self._owners.get(response_id)
        if known is not None and known != owner:
            error = BadRequest(
                f"Previous response with id {response_id!r} not found.",
                param="previous_response_id",
            )
            error.code = "previous_response_not_found"
            raise error

    def __len__(self) -> int:
        return len(self._owners)


class ResponsesRequest(InProcessRequest):
    """A parsed Responses request (`WireRequest`)."""

    _list_key = "input"

    def __init__(self, body: JsonBody, owner: str, names: CallNames) -> None:
        self.raw = body.raw
        self._body = body
        self.owner = owner
        self._names = names
        self.input = self._input = body.get("input")
        self.instructions = self._instructions = body.get("instructions")
        self.model: str | None = body.get("model")
        self.stream: bool = body.get("stream") is True
        self.continues: str | None = body.get("previous_response_id")
        self._turn: tuple[UserTurn | None] | None = None
        self.note: str | None = None

    @property
    def changed(self) -> bool:
        return self.input is not self._input or self.instructions is not self._instructions

    def _items(self) -> list[Any]:
        return self.input if isinstance(self.input, list) else []

    def user_turn(self) -> UserTurn | None:
        if self._turn is None:
            if isinstance(self.input, str):
                turn = (
                    UserTurn(index=0, text=self.input, last=True, typed=self.input)
                    if self.input
                    else None
                )
            else:  # items as chat messages, each made as it is read (from the newest back)
                turn = user_turn(_AsChat(self._items()))
            self._turn = (turn,)
        return self._turn[0]

    def system_text(self) -> str:
        texts = [self.instructions] if isinstance(self.instructions, str) else []
        texts.extend(
            _message_text(item) or "" for item in self._items() if item.get("role") in _SYSTEM_ROLES
        )
        return "".join(texts)

    def clamp(self, clamp: Clamp, caps: Caps, tools: ToolNames, *, apply: bool) -> list[Segment]:
        if self.continues:
            self.note = (
                f"continues {self.continues}: the earlier turns are stored upstream, so only "
                "this request's new input could be clamped"
            )
        if caps.pruned and isinstance(self.input, list):  # pruning's decisions applied
            return self._prune(clamp, caps, tools, apply=apply)
        if self.input is not self._input or self.instructions is not self._instructions:
            # a second pass (pruning) over what the first changed: the whole view, its own
            view, remembered = self._view_whole()
            return self._clamp_whole(clamp, caps, tools, view, remembered, apply=apply)
        body = self._body
        items = self._items()
        found = body.extended("input")
        known: _Viewed | None = None
        if found is not None and isinstance(found[0].view, _Viewed):
            known = found[0].view
            if (
                known.instructions != self._instructions
                or found[1] > len(known.ends)
                or known.caps != (caps, tools)
                or known.spent
            ):
                known = None
        kept = found[1] if found is not None and known is not None else 0
        if known is not None:
            # the items the conversation's last request had are viewed as then: only the new
            # ones are read (a 300-turn history read item by item was ~1 ms a request)
            called = _called(items, kept, known.called)
            if next(_uncalled(items, kept, called), None) is not None:
                known, kept = None, 0  # a result whose call is stored upstream: made whole
        if known is not None:
            end = known.ends[kept - 1] if kept else known.head
            written_then = known.written[:kept]
            view_messages, places, ends = known.take(kept, end)
            view = ChatView(view_messages, places, owner=body.owner)
            head = known.head
            first = known.first_index if known.first_index < kept else -1
        else:
            view, remembered = self._view_head(items)
            if remembered:  # a continuation: its results named by the reply that called them
                _view_items(view, items, 0, -1, [])
                return self._clamp_whole(clamp, caps, tools, view, remembered, apply=apply)
            head, ends, first, end = len(view.messages), [], -1, len(view.messages)
            called = _called(items, 0, frozenset())
        first = _view_items(view, items, kept, first, ends)
        if RESENT.check and known is not None:  # what was taken must be what reading gives
            whole, _ = self._view_head(items)
            whole_ends: list[int] = []
            whole_first = _view_items(whole, items, 0, -1, whole_ends)
            if (whole_first, whole.messages, whole.places, whole_ends) != (
                first,
                view.messages,
                view.places,
                ends,
            ):
                raise ChangedInPlace("a conversation's view differs from its items read again")
        state = found[0].clamp if found is not None and known is not None else None
        resume = (state, end) if state is not None else None
        result = resumed(clamp, body, view.messages, caps, tools, resume=resume)
        # what the clamp changed: of the instructions, and of the items after those kept
        new_at = ends[kept - 1] if kept else head
        written: Any = written_then + self._input[kept:] if known else self._input
        instructions = self._instructions
        out = result.request["messages"] if result.changed else view.messages
        for i in (*range(head), *range(new_at, len(out))):
            place = view.places[i]
            if out[i] is not view.messages[i] and place is not None:
                written, instructions = _written(
                    place, out[i].get("content"), written, instructions
                )
        if apply:
            self.input, self.instructions = written, instructions
            if written is not self._input:
                # what the write-back and the blocks resume from (`Conversation.clamped`)
                self._clamped = (written, kept)
                if body.conversation is not None:
                    body.conversation.clamped = written
        real = placed(result, view.places, known.real if known is not None else None)
        if body.conversation is not None and isinstance(self._input, list):
            body.conversation.view = _Viewed(
                self._instructions,
                view.messages,
                view.places,
                ends,
                first,
                head,
                written,
                real[0],
                (caps, tools),
                called,
            )
        return real[1]

    def _clamp_whole(
        self,
        clamp: Clamp,
        caps: Caps,
        tools: ToolNames,
        view: ChatView,
        remembered: list[tuple[str, str, str]],
        *,
        apply: bool,
    ) -> list[Segment]:
        """`view` (of every item) clamped, what it changed written back when `apply`."""
        segments, changes = view.clamp(clamp, caps, tools)
        if apply:
            for place, new in changes:
                self.input, self.instructions = _written(place, new, self.input, self.instructions)
        return _named(segments, remembered)

    def _prune(self, clamp: Clamp, caps: Caps, tools: ToolNames, *, apply: bool) -> list[Segment]:
        """Pruning's pass, carried from the conversation's last request (`second_pass`): a
        decision changes only a result's output, never the instructions."""
        items, instructions = self.input, self.instructions

        def whole() -> tuple[list[Any], list[Segment]]:
            view, remembered = self._view_whole()
            segments, changes = view.clamp(clamp, caps, tools)
            out = items
            for place, new in changes:
                out, kept = _written(place, new, out, instructions)
                if kept is not instructions:
                    raise ChangedInPlace("pruning changed the instructions")
            return out, _named(segments, remembered)

        out, segments = second_pass(self._body, "input", items, caps, whole, _call_ids)
        if apply and out is not items:
            self.input = out
        return segments

    def _view_head(self, items: list[Any]) -> tuple[ChatView, list[tuple[str, str, str]]]:
        """The view of `instructions`, and the calls of the results whose `function_call` is
        not in `input` (stored upstream: a continuation), named by the replies relayed."""
        view = ChatView(owner=self.owner)
        if isinstance(self.instructions, str):
            view.system(self.instructions, ("instructions", -1))
        remembered: list[tuple[str, str, str]] = []
        for call_id in _uncalled(items, 0, _called(items, 0, frozenset())):
            found = self._names.get(self.owner, call_id)
            if found is not None:
                remembered.append((call_id, *found))
        view.calls(remembered)
        return view, remembered

    def _view_whole(self) -> tuple[ChatView, list[tuple[str, str, str]]]:
        items = self._items()
        view, remembered = self._view_head(items)
        _view_items(view, items, 0, -1, [])
        return view, remembered

    def inject(self, lines: Sequence[str], placement: Placement) -> None:
        if not lines:
            return
        text = block(list(lines))
        if placement == "system":
            if isinstance(self.instructions, str) or not self._items():
                self.instructions = f"{self.instructions}\n\n{text}" if self.instructions else text
                return
            roles: tuple[str, ...] = _SYSTEM_ROLES
        else:
            roles = ("user",)
        if isinstance(self.input, str):
            self.input = f"{self.input}\n\n{text}"
            return
        indices = [
            i
            for i, item in enumerate(self._items())
            if item.get("role") in roles and item.get("type") in (None, "message")
        ]
        if not indices:
            return
        index = indices[0] if placement == "system" else indices[-1]
        content = self.input[index].get("content")
        if isinstance(content, str):
            self.input = set_item(self.input, index, "content", f"{content}\n\n{text}")
        elif isinstance(content, list):
            part = {"type": "input_text", "text": text}
            self.input = set_item(self.input, index, "content", [*content, part])

    def get(self, key: str) -> Any:
        """A top-level field as a Python value."""
        return self._body.get(key)

    def blocks(self) -> list[Block]:
        return self._blocks_of((self.input, self.instructions), self._make_blocks)

    def _make_blocks(self) -> list[Block]:
        tools = self._body.raw_field("tools")
        head = [Block("tools", tools, tools)] if tools is not None else []
        if self._instructions is not None:
            head.append(Block("instructions", self._instructions, self.instructions))
        if isinstance(self._input, list) and isinstance(self.input, list):
            return head + self._paired(self._input, self.input)
        return [*head, Block("input", self._input, self.input)]

    def place_memory(self, index: int, text: str) -> None:
        blocks = self.blocks()
        label = blocks[index].label if 0 <= index < len(blocks) else ""
        if label == "instructions" and isinstance(self.instructions, str):
            self.instructions = f"{self.instructions}\n\n{text}"
        elif label == "input" and isinstance(self.input, str):
            self.input = f"{self.input}\n\n{text}"
        elif label.startswith("input[") and isinstance(self.input, list):
            self.input = with_text(self.input, int(label[6:-1]), text, "input_text")

    def encode(self) -> Body:
        if not self.changed:
            return self.raw
        changes: dict[str, Any] = {}
        if self.input is not self._input:
            changes["input"] = self.input
        if self.instructions is not self._instructions:
            changes["instructions"] = self.instructions
        return self._body.encode(changes, clamped=self.__dict__.get("_clamped"))

    def ask_usage(self) -> bool:
        return False  # every reply of this format carries its usage

    def forget_usage(self) -> None:
        pass

    def litellm_body(self) -> None:
        return None


class _AsChat(Sequence[dict[str, Any]]):
    """`input`'s items as chat messages (the text of each message, the type of the others),
    each made when read: `user_turn` reads back from the newest item to the latest user's,
    not every item of a 300-turn history."""

    def __init__(self, items: list[Any]) -> None:
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [_as_chat(item) for item in self._items[index]]
        return _as_chat(self._items[index])


def _as_chat(item: Any) -> dict[str, Any]:
    text = _message_text(item)
    if text is None:
        return {"role": item.get("type")}
    return {"role": item.get("role"), "content": text}


def _call_ids(item: Any) -> Sequence[str]:
    """The call id a `function_call` or `function_call_output` item names."""
    found = item.get("call_id") if isinstance(item, dict) else None
    return (found,) if isinstance(found, str) else ()


def _called(items: list[Any], start: int, before: frozenset[str]) -> frozenset[str]:
    """The call ids of `items`' `function_call`s: `before` (those of the first `start`) and
    the others'."""
    new = {
        item["call_id"]
        for item in items[start:]
        if item.get("type") == "function_call" and isinstance(item.get("call_id"), str)
    }
    return before | new if new else before


def _uncalled(items: list[Any], start: int, called: frozenset[str]) -> Iterator[str]:
    """The call ids of the results from `start` on whose call is not in `called`."""
    for item in items[start:]:
        if item.get("type") == "function_call_output" and item["call_id"] not in called:
            yield item["call_id"]


def _view_items(view: ChatView, items: list[Any], start: int, first: int, ends: list[int]) -> int:
    """`view` with the items from `start` on (`first`: the first user message's index, -1
    while none came), each one's view messages ending where `ends` says; the first user
    message's index, -1 for none."""
    first_user = first < 0
    for index in range(start, len(items)):
        item = items[index]
        kind = item.get("type")
        role = item.get("role")
        if role == "user" and kind in (None, "message") and first_user:
            first_user = False
            first = index
            content = item.get("content")
            if isinstance(content, str):
                view.first_user([(-1, content)], ("user", index))
            elif isinstance(content, list):
                texts = [(i, p["text"]) for i, p in enumerate(content) if _is_text(p)]
                view.first_user(texts, ("user", index))
        elif role == "user" and kind in (None, "message"):
            content = item.get("content")  # what later calls are asked for
            if isinstance(content, str):
                view.user([content])
            elif isinstance(content, list):
                view.user([p["text"] for p in content if _is_text(p)])
        elif role in _SYSTEM_ROLES and kind in (None, "message"):
            content = item.get("content")
            if isinstance(content, str):
                view.system(content, ("item", index))
            elif isinstance(content, list):
                for i, part in enumerate(content):
                    if _is_text(part):
                        view.system(part["text"], ("item", index, i))
        elif kind == "function_call" and isinstance(item.get("call_id"), str):
            arguments = item.get("arguments")
            name = item.get("name")
            if isinstance(name, str):
                args = arguments if isinstance(arguments, str) else ""
                view.calls([(item["call_id"], name, args)])
        elif kind == "function_call_output":
            view.result(item["call_id"], item.get("output"), ("output", index))
        ends.append(len(view.messages))
    return first


def _written(place: tuple[Any, ...], new: Any, items: Any, instructions: Any) -> tuple[Any, Any]:
    """`items` and `instructions` with the text at `place` (a view message's) now `new`."""
    match place:
        case ("instructions", _):
            instructions = new
        case ("item", int(index)):
            items = set_item(items, index, "content", new)
        case ("item", int(index), int(i)):
            items = set_part(items, index, i, "text", new)
        case ("output", int(index)):
            items = set_item(items, index, "output", new)
        case ("user", int(index), tuple(parts)):
            items = set_texts(items, index, parts, new)
    return items, instructions


def _named(segments: list[Segment], remembered: list[tuple[str, str, str]]) -> list[Segment]:
    """`segments`, those of the results `remembered` names noted so."""
    if not remembered:
        return segments
    ids = {call_id for call_id, _, _ in remembered}
    named = "tool named by the earlier reply that called it"
    return [
        replace(s, note=f"{s.note}; {named}" if s.note else named) if s.call_id in ids else s
        for s in segments
    ]


class _Viewed(Viewed):
    """A Responses request's chat-shaped view, per item, as `Conversation.view` keeps it."""

    __slots__ = ("instructions", "called")

    def __init__(
        self,
        instructions: Any,
        messages: list[Any],
        places: list[Any],
        ends: list[int],
        first_index: int,
        head: int,
        written: list[Any],
        real: Placed | None,
        caps: tuple[Caps, ToolNames],
        called: frozenset[str],
    ) -> None:
        super().__init__(messages, places, ends, first_index, head, written, real, caps)
        self.instructions = instructions
        """The `instructions` field: the view's first message is made of it."""
        self.called = called
        """The call ids of the items' `function_call`s (a result whose call is not among them
        is a continuation's: its view is made whole)."""


class OpenAIResponses:
    """The OpenAI Responses format (`WireFormat`), with the call names its replies made."""

    name = "responses"
    provider = "openai"
    generates = True

    def __init__(self, names: CallNames | None = None) -> None:
        self.names = names if names is not None else CallNames()
        self.owners = ResponseOwners()

    def parse(
        self, raw: bytes, *, owner: str = "default", conversations: Conversations | None = None
    ) -> ResponsesRequest:
        body = parse_object(
            raw,
            example=_EXAMPLE,
            parsed=("input", "instructions"),
            owner=owner,
            conversations=conversations,
        )
        value = body.get("input")
        if value is None and "input" in body:
            raise BadRequest("'input' must be a string or a list of items, got null", param="input")
        if value is not None and not isinstance(value, str | list):
            raise BadRequest(
                f"'input' must be a string or a list of items, got {type_name(value)}",
                param="input",
            )
        for key, kind, name in (
            ("stream", bool, "true or false"),
            ("instructions", str, "a string"),
            ("previous_response_id", str, "a string"),
        ):
            field = body.get(key)
            if field is not None and not isinstance(field, kind):
                raise BadRequest(f"'{key}' must be {name}, got {type_name(field)}", param=key)
        if isinstance(value, list):
            # the items the conversation's last request had passed: only the new ones checked
            continues = body.get("previous_response_id") is not None
            start, calls = body.checked_from("input", lenient=continues)
            body.keep_checked(_check_items(value, start, calls, continues=continues))
        check_model(body)
        return ResponsesRequest(body, owner, self.names)

    def upstream_url(self, settings: Settings, path: str, query: str) -> str:
        return settings.upstream_url("/responses", query)

    def upstream_headers(self, headers: Mapping[str, str], settings: Settings) -> dict[str, str]:
        out = openai_headers(headers, settings)
        # The reply is read as it passes (call names): it must come uncompressed.
        out = {k: v for k, v in out.items() if k.lower() != "accept-encoding"}
        out["accept-encoding"] = "identity"
        return out

    def admit(self, request: WireRequest, owner: str) -> None:
        self.owners.check(request.get("previous_response_id"), owner)

    def in_worker(self, owner: str, ask: Asker) -> tuple[WireFormat, Asker | None]:
        """A copy whose call names are asked of this process's (`ask`): a continuation's
        `function_call_output` is named by what this process relayed, and only for `owner`."""
        return OpenAIResponses(AskedNames(ask)), functools.partial(self.names.get, owner)

    def __reduce__(self) -> tuple[Any, ...]:
        # the copy `in_worker` makes goes by its names alone; the response owners (and their
        # lock) are this process's and stay here
        return (OpenAIResponses, (self.names,))

    def watch_reply(self, request: WireRequest, owner: str) -> CallWatcher:
        return CallWatcher(self.names, owner, stream=request.stream, owners=self.owners)

    def error_body(self, error: CtxBudgetError) -> dict[str, Any]:
        return error.to_dict()

    def stream_error(self, error: CtxBudgetError) -> bytes:
        body = {
            "type": "error",
            "code": error.code,
            "message": error.message,
            "param": error.param,
            "sequence_number": 0,
        }
        return b"event: error\ndata: " + orjson.dumps(body) + b"\n\n"

    def command_reply(self, text: str, request: WireRequest, *, request_id: str) -> Reply:
        response = _response(text, model=request.model or "ctxbudget", request_id=request_id)
        if not request.stream:
            return Reply(orjson.dumps(response), "application/json")
        return Reply(_response_stream(response, text), "text/event-stream")


class CallWatcher:
    """Remembers the function calls a relayed reply makes, and whom its response id was
    returned to (`ReplyWatcher`)."""

    def __init__(
        self,
        names: CallNames,
        owner: str,
        *,
        stream: bool,
        owners: ResponseOwners | None = None,
    ) -> None:
        self._names = names
        self._owner = owner
        self._stream = stream
        self._owners = owners
        self._buffer = b""

    def feed(self, chunk: bytes) -> None:
        if not self._stream:
            self._buffer += chunk
            return
        data = self._buffer + chunk
        lines = data.split(b"\n")
        self._buffer = lines.pop()  # an unfinished line waits for the next chunk
        for line in lines:
            if line.startswith(b"data:") and (
                b'"function_call"' in line or b'"response.created"' in line
            ):
                try:
                    event = orjson.loads(line[5:])
                except orjson.JSONDecodeError:
                    continue
                if isinstance(event, dict):
                    self._event(event)

    def _event(self, event: dict[str, Any]) -> None:
        if event.get("type") == "response.output_item.done":
            self._item(event.get("item"))
        elif isinstance(event.get("response"), dict):
            self._response(event["response"])

    def _response(self, response: dict[str, Any]) -> None:
        """A response object: whose it is, and the calls in its output."""
        if self._owners is not None and isinstance(response.get("id"), str):
            self._owners.remember(response["id"], self._owner)
        output = response.get("output")
        for item in output if isinstance(output, list) else ():  # an odd reply is relayed as is
            self._item(item)

    def _item(self, item: Any) -> None:
        if (
            isinstance(item, dict)
            and item.get("type") == "function_call"
            and isinstance(item.get("call_id"), str)
            and isinstance(item.get("name"), str)
        ):
            arguments = item.get("arguments")
            self._names.remember(
                self._owner,
                item["call_id"],
                item["name"],
                arguments if isinstance(arguments, str) else "",
            )

    def close(self) -> None:
        if not self._stream and self._buffer:
            try:
                reply = orjson.loads(self._buffer)
            except orjson.JSONDecodeError:
                reply = None
            if isinstance(reply, dict):
                self._response(reply)
        self._buffer = b""


def _response(text: str, *, model: str, request_id: str) -> dict[str, Any]:
    return {
        "id": f"resp_{request_id}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "model": model,
        "output": [
            {
                "type": "message",
                "id": f"msg_{request_id}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 0,
        },
    }


async def _response_stream(response: dict[str, Any], text: str) -> AsyncIterator[bytes]:
    """The same answer as Responses SSE events, numbered."""
    sequence = 0

    def event(body: dict[str, Any]) -> bytes:
        nonlocal sequence
        kind: str = body["type"]
        body = {**body, "sequence_number": sequence}
        sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(body) + b"\n\n"

    message = response["output"][0]
    pending = {**response, "status": "in_progress", "output": [], "usage": None}
    yield event({"type": "response.created", "response": pending})
    yield event({"type": "response.in_progress", "response": pending})
    item = {"output_index": 0, "item_id": message["id"]}
    yield event(
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**message, "status": "in_progress", "content": []},
        }
    )
    empty = {"type": "output_text", "text": "", "annotations": []}
    yield event({"type": "response.content_part.added", **item, "content_index": 0, "part": empty})
    for i in range(0, len(text), 400):
        yield event(
            {
                "type": "response.output_text.delta",
                **item,
                "content_index": 0,
                "delta": text[i : i + 400],
                "logprobs": [],
            }
        )
    yield event(
        {
            "type": "response.output_text.done",
            **item,
            "content_index": 0,
            "text": text,
            "logprobs": [],
        }
    )
    part = message["content"][0]
    yield event({"type": "response.content_part.done", **item, "content_index": 0, "part": part})
    yield event({"type": "response.output_item.done", "output_index": 0, "item": message})
    yield event({"type": "response.completed", "response": response})


def _check_items(
    items: list[Any], start: int = 0, seen: Seen | None = None, *, continues: bool
) -> Checked:
    """400 for items the clamp would misread: shapes, and (unless the request `continues` a
    response) outputs that answer no earlier `function_call`. `start`: the items before it
    passed already, with the call ids `seen` in them (`Checked.at`: taken, not copied)."""
    firsts, calls = seen if seen is not None else ([], {})
    for index in range(start, len(items)):
        item = items[index]
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise BadRequest(f"'{where}' must be an object, got {type_name(item)}", param=where)
        kind = item.get("type")
        if kind is not None and not isinstance(kind, str):
            raise BadRequest(f"'{where}.type' must be a string", param=f"{where}.type")
        if kind in (None, "message"):
            content = item.get("content")
            if not isinstance(content, str | list):
                raise BadRequest(
                    f"'{where}.content' must be a string or a list of parts, "
                    f"got {type_name(content)}",
                    param=f"{where}.content",
                )
            for i, part in enumerate(content if isinstance(content, list) else ()):
                if isinstance(part, dict) and not isinstance(part.get("text"), str):
                    check_text_part(part, f"{where}.content[{i}]", _TEXT_PARTS)
        elif kind in ("function_call", "function_call_output"):
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise BadRequest(
                    f"'{where}.call_id' must be a string, got {type_name(call_id)}",
                    param=f"{where}.call_id",
                )
            if kind == "function_call":
                if call_id not in calls:
                    calls[call_id] = index
                    firsts.append((index, call_id))
            elif call_id not in calls and not continues:
                raise BadRequest(
                    f"'{where}' is a function_call_output for call_id {call_id!r}, which no "
                    "earlier function_call item has (and there is no previous_response_id): "
                    "send the function_call it answers",
                    param=f"{where}.call_id",
                )
    return Checked(len(items), firsts, calls, lenient=continues)


def _is_text(part: Any) -> bool:
    return (
        isinstance(part, dict)
        and part.get("type") in _TEXT_PARTS
        and isinstance(part.get("text"), str)
    )


def _message_text(item: dict[str, Any]) -> str | None:
    """The text of a message item (string content or its text parts); None otherwise."""
    if item.get("type") not in (None, "message"):
        return None
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p["text"] for p in content if _is_text(p)]
        return "\n".join(texts) if texts else None
    return None
