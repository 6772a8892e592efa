"""Anthropic Messages (`POST /v1/messages`, `/v1/messages/count_tokens`): a wire adapter.

What OpenClaw, Claude Code and the `anthropic` SDK send (`shared/OPENCLAW_WIRE_FORMATS.md`):

- System prompt: top-level `system`, a string or text blocks (OpenClaw: `system[0]` the
  stable prefix with the bootstrap files and a `cache_control` marker); Claude Code also puts a
  `role: "system"` message inside `messages`. Both are read for bootstrap files.
- Claude Code's instruction files (CLAUDE.md, …) are a `<system-reminder>` text block of the
  first user message, and its WebFetch summariser's page the one text block of its own
  request's only message: the first user message's text blocks are shown to `caps` too, which
  clamps only those agent wrappers (the user's own blocks stay as they came).
- Tool results: `tool_result` blocks in user messages, `content` a string or blocks; the tool
  name is on the `tool_use` block with the same id (OpenClaw's tool-search bridge included).
- Never touched: `thinking`/`redacted_thinking` (signed upstream), `server_tool_use`, images,
  documents, `tools`, and every key of a block except the text a cap shortens. A clamp never
  adds, removes or moves a block, so `cache_control` markers keep their number and places.

Only `system` and `messages` are ever re-serialised, and only when they changed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

import orjson

from ctxbudget.caps import Caps, Clamp, Segment, ToolNames
from ctxbudget.caps._kept import ChangedInPlace
from ctxbudget.memory.inject import Placement, block, inject
from ctxbudget.memory.query import UserTurn, user_turn
from ctxbudget.proxy.cache.blocks import Block
from ctxbudget.proxy.cache.resent import RESENT
from ctxbudget.proxy.cache.tools import InlineTools, inline_mcp_tools
from ctxbudget.proxy.config.settings import Settings
from ctxbudget.proxy.errors import BadRequest, CtxBudgetError, UpstreamError
from ctxbudget.proxy.upstream.http import Body, forward_request_headers
from ctxbudget.proxy.urls import join
from ctxbudget.proxy.wire.body import (
    JsonBody,
    check_model,
    check_text_part,
    parse_object,
    type_name,
)
from ctxbudget.proxy.wire.conversations import Checked, Conversations, Seen
from ctxbudget.proxy.wire.pruned import messages_ids, second_pass
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
    arguments_json,
    placed,
    set_item,
    set_part,
    set_texts,
    with_text,
)

_EXAMPLE = '{"model": ..., "max_tokens": ..., "messages": [...]}'
_TEXT_KINDS = ("text",)
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
}


class MessagesRequest(InProcessRequest):
    """A parsed Messages request (`WireRequest`)."""

    def __init__(self, body: JsonBody, messages: list[Any], system: Any, *, counting: bool):
        self.raw = body.raw
        self.note: str | None = None
        self._body = body
        self.messages = self._messages = messages
        self.system = self._system = system
        model = body.get("model")
        self.model: str | None = model
        self.stream: bool = not counting and body.get("stream") is True
        self._turn: tuple[UserTurn | None] | None = None

    @property
    def changed(self) -> bool:
        return self.messages is not self._messages or self.system is not self._system

    def user_turn(self) -> UserTurn | None:
        if self._turn is None:  # found once, before anything changes the messages
            self._turn = (user_turn(self.messages),)
        return self._turn[0]

    def system_text(self) -> str:
        texts = [_text_of(self.system)]
        texts.extend(
            _text_of(m.get("content"))
            for m in self.messages
            if isinstance(m, dict) and m.get("role") == "system"
        )
        return "".join(texts)

    def clamp(self, clamp: Clamp, caps: Caps, tools: ToolNames, *, apply: bool) -> list[Segment]:
        if caps.pruned:  # the second pass: pruning's decisions applied
            return self._prune(clamp, caps, tools, apply=apply)
        if self.messages is not self._messages or self.system is not self._system:
            return self._clamp_changed(clamp, caps, tools, apply=apply)
        body = self._body
        system_raw = body.raw_field("system")
        found = body.extended("messages")
        known: _Viewed | None = None
        if found is not None and isinstance(found[0].view, _Viewed):
            known = found[0].view
            if (
                known.system_raw != system_raw
                or found[1] > len(known.ends)
                or known.caps != (caps, tools)
                or known.spent
            ):
                known = None
        kept = found[1] if found is not None and known is not None else 0
        if known is not None:
            end = known.ends[kept - 1] if kept else known.head
            view_messages, places, ends = known.take(kept, end)
            view = ChatView(view_messages, places, owner=body.owner)
            head = known.head
            first = known.first_index if known.first_index < kept else -1
            state = found[0].clamp if found is not None else None
            resume = (state, end) if state is not None else None
        else:
            view = self._system_view()
            head, ends, first, resume = len(view.messages), [], -1, None
        first = self._view_items(view, kept, first, ends)
        if RESENT.check and known is not None:  # what was taken must be what reading gives
            whole, whole_ends = self._system_view(), list[int]()
            whole_first = self._view_items(whole, 0, -1, whole_ends)
            if (whole_first, whole.messages, whole.places, whole_ends) != (
                first,
                view.messages,
                view.places,
                ends,
            ):
                raise ChangedInPlace("a conversation's view differs from its items read again")
        result = resumed(clamp, body, view.messages, caps, tools, resume=resume)
        # what the clamp changed: of the system texts, and of the items after those kept
        new_at = ends[kept - 1] if kept else head
        messages = known.written[:kept] + self._messages[kept:] if known else self._messages
        system = self._system
        out = result.request["messages"] if result.changed else view.messages
        changes: Iterable[int] = (*range(head), *range(new_at, len(out)))
        if known is not None:
            # the same system texts, clamped the same (the very view messages resumed): the
            # system as written then, the same object every turn (its serial kept by it)
            changes = range(new_at, len(out))
            if known.system is not None:
                system = known.system
        for i in changes:
            place = view.places[i]
            if out[i] is not view.messages[i] and place is not None:
                messages, system = _written(place, out[i].get("content"), messages, system)
        if apply:
            self.messages, self.system = messages, system
            if messages is not self._messages:
                self._clamped = (messages, kept if known is not None else 0)
                if body.conversation is not None:
                    body.conversation.clamped = messages
        real = placed(result, view.places, known.real if known is not None else None)
        segments = real[1]
        if body.conversation is not None:
            body.conversation.view = _Viewed(
                system_raw,
                view.messages,
                view.places,
                ends,
                first,
                head,
                messages,
                real[0],
                (caps, tools),
                system if system is not self._system else None,
            )
        return segments

    def _system_view(self) -> ChatView:
        view = ChatView(owner=self._body.owner)
        if isinstance(self.system, str):
            view.system(self.system, ("system", -1))
        elif isinstance(self.system, list):
            for i, part in _text_blocks(self.system):
                view.system(part, ("system", -1, i))
        return view

    def _clamp_changed(
        self, clamp: Clamp, caps: Caps, tools: ToolNames, *, apply: bool
    ) -> list[Segment]:
        """A second pass (pruning) over what the first changed: the whole view, its own."""
        view = self._system_view()
        self._view_items(view, 0, -1, [])
        segments, changes = view.clamp(clamp, caps, tools)
        if apply:
            for place, new in changes:
                self.messages, self.system = _written(place, new, self.messages, self.system)
        return segments

    def _prune(self, clamp: Clamp, caps: Caps, tools: ToolNames, *, apply: bool) -> list[Segment]:
        """Pruning's pass, carried from the conversation's last request (`second_pass`): a
        decision changes only a result's content, never the system texts."""
        messages, system = self.messages, self.system

        def whole() -> tuple[list[Any], list[Segment]]:
            view = self._system_view()
            self._view_items(view, 0, -1, [])
            segments, changes = view.clamp(clamp, caps, tools)
            out = messages
            for place, new in changes:
                out, kept = _written(place, new, out, system)
                if kept is not system:
                    raise ChangedInPlace("pruning changed a system text")
            return out, segments

        out, segments = second_pass(self._body, "messages", messages, caps, whole, messages_ids)
        if apply and out is not messages:
            self.messages = out
        return segments

    def _view_items(self, view: ChatView, start: int, first: int, ends: list[int]) -> int:
        """`view` with the messages from `start` on (`first`: the first user message's index,
        -1 while none came), each one's view messages ending where `ends` says; the first
        user message's index, -1 for none."""
        first_user = first < 0
        first_index = first if first >= 0 else len(self.messages)
        for index in range(start, len(self.messages)):
            message = self.messages[index]
            content = message["content"]
            role = message["role"]
            if role == "user" and first_user:
                first_user = False
                first_index = index
                if isinstance(content, str):
                    view.first_user([(-1, content)], ("user", index))
                else:
                    view.first_user(_text_blocks(content), ("user", index))
            if role == "system":  # Claude Code's environment block
                if isinstance(content, str):
                    view.system(content, ("message", index))
                else:
                    for i, part in _text_blocks(content):
                        view.system(part, ("message", index, i))
            elif role == "assistant" and isinstance(content, list):
                view.calls(
                    [
                        (b["id"], b["name"], arguments_json(b.get("input")))
                        for b in content
                        if isinstance(b, dict)
                        and b.get("type") == "tool_use"
                        and isinstance(b.get("id"), str)
                        and isinstance(b.get("name"), str)
                    ]
                )
            elif role == "user" and isinstance(content, list):
                for i, part in enumerate(content):
                    if isinstance(part, dict) and part.get("type") == "tool_result":
                        view.result(part["tool_use_id"], part.get("content"), ("result", index, i))
            if role == "user" and index > first_index:  # what later calls are asked for
                view.user([content] if isinstance(content, str) else _user_texts(content))
            ends.append(len(view.messages))
        return -1 if first_user else first_index

    def inject(self, lines: Sequence[str], placement: Placement) -> None:
        if placement == "user":
            self.messages = inject(self.messages, list(lines), "user")
        elif lines:  # after the system prompt: the cached prefix up to it stays
            text = block(list(lines))
            if isinstance(self.system, list):
                self.system = [*self.system, {"type": "text", "text": text}]
            else:
                self.system = f"{self.system}\n\n{text}" if self.system else text

    def get(self, key: str) -> Any:
        """A top-level field as a Python value."""
        return self._body.get(key)

    def inline_tools(self) -> InlineTools | None:
        return inline_mcp_tools(self._body.raw_field("tools"), self._body.owner)

    def blocks(self) -> list[Block]:
        return self._blocks_of((self.messages, self.system), self._make_blocks)

    def _make_blocks(self) -> list[Block]:
        tools = self._body.raw_field("tools")
        head = [Block("tools", tools, tools)] if tools is not None else []
        if self._system is not None:
            # with its bytes as sent: found by them (`ClientPrefix`), not serialised again
            # (OpenClaw's 26 KB of text blocks, and their cache markers taken out, each turn)
            sent = self._body.raw_field("system")
            sent = sent if isinstance(sent, bytes) else None
            head.append(Block("system", self._system, self.system, sent))
        return head + self._paired(self._messages, self.messages)

    def place_memory(self, index: int, text: str) -> None:
        blocks = self.blocks()
        label = blocks[index].label if 0 <= index < len(blocks) else ""
        if label == "system":
            if isinstance(self.system, list):
                self.system = [*self.system, {"type": "text", "text": text}]
            elif isinstance(self.system, str):
                self.system = f"{self.system}\n\n{text}"
        elif label.startswith("messages["):
            self.messages = with_text(self.messages, int(label[9:-1]), text, "text")

    def encode(self) -> Body:
        if not self.changed:
            return self.raw
        changes: dict[str, Any] = {}
        if self.messages is not self._messages:
            changes["messages"] = self.messages
        if self.system is not self._system:
            changes["system"] = self.system
        # what the clamp kept of the last request's list: written back as it was then
        return self._body.encode(changes, clamped=self.__dict__.get("_clamped"))

    def ask_usage(self) -> bool:
        return False  # every reply of this format carries its usage

    def forget_usage(self) -> None:
        pass

    def litellm_body(self) -> None:
        return None


def _written(
    place: tuple[Any, ...], new: Any, messages: list[Any], system: Any
) -> tuple[list[Any], Any]:
    """`messages` and `system` with the text at `place` (a view message's) now `new`."""
    match place:
        case ("system", _):
            system = new
        case ("system", _, int(i)):
            system = set_item(system, i, "text", new)
        case ("message", int(index)):
            messages = set_item(messages, index, "content", new)
        case ("message", int(index), int(i)):
            messages = set_part(messages, index, i, "text", new)
        case ("result", int(index), int(i)):
            messages = set_part(messages, index, i, "content", new)
        case ("user", int(index), tuple(parts)):
            messages = set_texts(messages, index, parts, new)
    return messages, system


class _Viewed(Viewed):
    """A Messages request's chat-shaped view, per item, as `Conversation.view` keeps it."""

    __slots__ = ("system_raw", "system")

    def __init__(
        self,
        system_raw: Any,
        messages: list[Any],
        places: list[Any],
        ends: list[int],
        first_index: int,
        head: int,
        written: list[Any],
        real: Placed | None,
        caps: tuple[Caps, ToolNames],
        system: Any = None,
    ) -> None:
        super().__init__(messages, places, ends, first_index, head, written, real, caps)
        self.system_raw = system_raw
        """The `system` field as sent: the view's first messages are made of it."""
        self.system = system
        """`system` as the clamp's changes left it (whether or not applied); None when they
        left it as sent."""


class AnthropicMessages:
    """The Anthropic Messages format (`WireFormat`); `counting` for `/count_tokens`."""

    name = "messages"
    provider = "anthropic"

    def __init__(self, *, counting: bool = False) -> None:
        self.generates = not counting
        self._endpoint = "/messages/count_tokens" if counting else "/messages"

    def parse(
        self, raw: bytes, *, owner: str = "default", conversations: Conversations | None = None
    ) -> MessagesRequest:
        body = parse_object(
            raw,
            example=_EXAMPLE,
            parsed=("messages", "system"),
            owner=owner,
            conversations=conversations,
        )
        messages = body.get("messages")
        if messages is None:
            raise BadRequest("'messages' is required: a list of messages", param="messages")
        if not isinstance(messages, list):
            raise BadRequest(
                f"'messages' must be a list of messages, got {type_name(messages)}",
                param="messages",
            )
        # the items the conversation's last request had passed: only the new ones are checked
        body.keep_checked(_check_messages(messages, *body.checked_from("messages")))
        system = body.get("system")
        if system is not None and not (
            isinstance(system, str)
            or (isinstance(system, list) and all(isinstance(b, dict) for b in system))
        ):
            raise BadRequest(
                f"'system' must be a string or a list of text blocks, got {type_name(system)}",
                param="system",
            )
        for i, part in enumerate(system if isinstance(system, list) else ()):
            check_text_part(part, f"system[{i}]", _TEXT_KINDS)
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise BadRequest(
                f"'stream' must be true or false, got {type_name(stream)}", param="stream"
            )
        check_model(body)
        return MessagesRequest(body, messages, system, counting=not self.generates)

    def upstream_url(self, settings: Settings, path: str, query: str) -> str:
        base = settings.anthropic_base
        prefix = base if base.endswith("/v1") else base + "/v1"  # as OpenClaw resolves it
        return join(prefix, self._endpoint, settings.anthropic_query, query)

    def upstream_headers(self, headers: Mapping[str, str], settings: Settings) -> dict[str, str]:
        out = forward_request_headers(headers, None)
        if settings.anthropic_api_key:
            out = {k: v for k, v in out.items() if k.lower() != "x-api-key"}
            out["x-api-key"] = settings.anthropic_api_key
        elif settings.proxy_keys:  # the client's credential is a proxy key: never upstream
            out = {k: v for k, v in out.items() if k.lower() != "x-api-key"}
        elif headers.get("authorization"):  # OAuth tokens (`sk-ant-oat…`) come as Bearer
            out["authorization"] = headers["authorization"]
        return out

    def admit(self, request: WireRequest, owner: str) -> None:
        return None

    def in_worker(self, owner: str, ask: Asker) -> tuple[WireFormat, Asker | None]:
        return self, None

    def watch_reply(self, request: WireRequest, owner: str) -> None:
        return None

    def error_body(self, error: CtxBudgetError) -> dict[str, Any]:
        if isinstance(error, UpstreamError) and error.body is not None:
            return error.body  # the upstream's own error, as it said it
        kind = _ERROR_TYPES.get(error.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": error.message}}

    def stream_error(self, error: CtxBudgetError) -> bytes:
        kind = "overloaded_error" if error.status == 529 else "api_error"
        body = {"type": "error", "error": {"type": kind, "message": error.message}}
        return b"event: error\ndata: " + orjson.dumps(body) + b"\n\n"

    def command_reply(self, text: str, request: WireRequest, *, request_id: str) -> Reply:
        message = {
            "id": f"msg_{request_id}",
            "type": "message",
            "role": "assistant",
            "model": request.model or "ctxbudget",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        if not request.stream:
            return Reply(orjson.dumps(message), "application/json")
        return Reply(_message_stream(message, text), "text/event-stream")


async def _message_stream(message: dict[str, Any], text: str) -> AsyncIterator[bytes]:
    """The same answer as the full Messages event sequence."""

    def event(name: str, body: dict[str, Any]) -> bytes:
        return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(body) + b"\n\n"

    start = {**message, "content": [], "stop_reason": None}
    yield event("message_start", {"type": "message_start", "message": start})
    yield event(
        "content_block_start",
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    )
    for i in range(0, len(text), 400):
        delta = {"type": "text_delta", "text": text[i : i + 400]}
        yield event(
            "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
        )
    yield event("content_block_stop", {"type": "content_block_stop", "index": 0})
    yield event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 0},
        },
    )
    yield event("message_stop", {"type": "message_stop"})


def _check_messages(messages: list[Any], start: int = 0, seen: Seen | None = None) -> Checked:
    """400 for what would make the clamp misread the request: shapes, and results that
    answer no earlier `tool_use`. `start`: the messages before it passed already, with the
    `tool_use` ids `seen` in them (`Checked.at`: taken, not copied)."""
    firsts, calls = seen if seen is not None else ([], {})
    for index in range(start, len(messages)):
        message = messages[index]
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise BadRequest(f"'{where}' must be an object, got {type_name(message)}", param=where)
        if not isinstance(message.get("role"), str):
            raise BadRequest(f"'{where}.role' must be a string", param=f"{where}.role")
        content = message.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise BadRequest(
                f"'{where}.content' must be a string or a list of blocks, got {type_name(content)}",
                param=f"{where}.content",
            )
        for i, part in enumerate(content):
            if not isinstance(part, dict):
                raise BadRequest(
                    f"'{where}.content[{i}]' must be an object, got {type_name(part)}",
                    param=f"{where}.content[{i}]",
                )
            if not isinstance(part.get("text"), str):  # the usual block: one lookup, no call
                check_text_part(part, f"{where}.content[{i}]", _TEXT_KINDS)
            kind = part.get("type")
            if kind == "tool_use" and isinstance(part.get("id"), str):
                if part["id"] not in calls:
                    calls[part["id"]] = index
                    firsts.append((index, part["id"]))
            elif kind == "tool_result" and not isinstance(part.get("tool_use_id"), str):
                raise BadRequest(
                    f"'{where}.content[{i}].tool_use_id' must be a string (the id of the "
                    f"tool_use block it answers), got {type_name(part.get('tool_use_id'))}",
                    param=f"{where}.content[{i}].tool_use_id",
                )
            elif kind == "tool_result" and part["tool_use_id"] not in calls:
                raise BadRequest(
                    f"'{where}.content[{i}]' is a tool_result for tool_use_id "
                    f"{part['tool_use_id']!r}, which no earlier tool_use block has: "
                    "send the assistant turn that called the tool",
                    param=f"{where}.content[{i}].tool_use_id",
                )
            if kind == "tool_result" and isinstance(result := part.get("content"), list):
                for j, inner in enumerate(result):
                    if isinstance(inner, dict) and not isinstance(inner.get("text"), str):
                        check_text_part(inner, f"{where}.content[{i}].content[{j}]", _TEXT_KINDS)
    return Checked(len(messages), firsts, calls)


def _text_blocks(blocks: list[Any]) -> list[tuple[int, str]]:
    return [
        (i, b["text"])
        for i, b in enumerate(blocks)
        if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
    ]


def _user_texts(content: Any) -> list[str]:
    """The text blocks of a user message's content list (none for any other content)."""
    return [text for _, text in _text_blocks(content)] if isinstance(content, list) else []


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(text for _, text in _text_blocks(content))
    return ""
