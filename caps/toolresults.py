"""Tool results in a chat request: clamp the memory and web_fetch ones, and any other tool's.

A `role: "tool"` message has no tool name (OpenClaw sends none): the name comes from the
assistant `tool_calls` entry its `tool_call_id` points to. With OpenClaw's tool-search bridge
the call is `tool_call` with `{"id": "web_fetch", "args": {...}}`, and the result is an
envelope `{"tool": {...}, "result": {"content": [{"type": "text", "text": "<tool JSON>"}]}}`,
which for network tools is itself inside an untrusted-content wrapper (`Source: API`).

Results that no longer parse as JSON (OpenClaw cut them with `[... N more characters
truncated]`, or the bridge with `[truncated]`) are clamped as text when an intact wrapper
allows a safe cut, and otherwise left exactly as they are. Results under their cap are never
re-serialised: they stay byte-identical.

The result of a tool no other kind claims is a `tool_output` segment (`caps.tooloutput`) when
it is over `Caps.tool_output_max_chars` — and only then, so the many small results of a long
session do not fill the report — unless the tool is one agents edit from
(`ToolNames.keep_whole`). A result whose call is not in the request is never cut as tool
output: its tool could be one of those.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ctxbudget.caps import _json, passages, question, snippets, tooloutput, webfetch
from ctxbudget.caps._text import utf16_len
from ctxbudget.caps.types import Caps, Message, Segment, SegmentKind, Strategy, ToolNames, evolve

if TYPE_CHECKING:
    from ctxbudget.caps.memo import Memo

_BRIDGE = "tool_call"


def clamp_tool_results(
    messages: list[Message], caps: Caps, tools: ToolNames, memo: Memo | None = None
) -> tuple[list[Message], list[Segment]]:
    """Clamp every recognised tool result in `messages`; return the same list if none changed.
    `memo`: where what was made is remembered (`caps.Memo`; None: nowhere)."""
    query = caps.strategy == "query"
    calls = _calls(messages, memo, asked=query)
    # each text by value (`Memo.tool_texts`)
    out: list[Message] | None = None
    segments: list[Segment] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") != "tool":
            continue
        key = message_key(message, calls)
        new_message, found = _clamp_message_at(memo, message, key, caps, tools, index)
        segments.extend(found)
        if new_message is not message:
            out = out if out is not None else list(messages)
            out[index] = new_message
    return (messages if out is None else out), segments


def _clamp_message(
    message: Message, key: _Key, caps: Caps, tools: ToolNames, memo: Memo | None
) -> tuple[Message, tuple[Segment, ...]]:
    """One tool result message clamped (itself when unchanged), and its segments (no index)."""
    content = message.get("content")
    found: list[Segment] = []
    new_content: Any = content
    if isinstance(content, str):
        new_content = _clamp_one(content, key, caps, tools, found, memo)
    elif isinstance(content, list):
        parts = list(content)
        for i, part in enumerate(content):
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                text = _clamp_one(part["text"], key, caps, tools, found, memo)
                if text is not part["text"]:
                    parts[i] = {**part, "text": text}
        if any(p is not q for p, q in zip(parts, content, strict=True)):
            new_content = parts
    if new_content is content:
        return message, tuple(found)
    return {**message, "content": new_content}, tuple(found)


def _clamp_message_at(
    memo: Memo | None, message: Message, key: _Key, caps: Caps, tools: ToolNames, index: int
) -> tuple[Message, tuple[Segment, ...]]:
    """A tool message clamped, its segments at `index`."""
    new, found = _clamp_message(message, key, caps, tools, memo)
    return new, tuple(evolve(s, message_index=index) for s in found)


_Key = tuple[str | None, str | None, str | None, tuple[str, ...] | None, str | None]
"""(tool name, tool_call_id, URL argument, the user's texts before the call, the call's
arguments as sent): what a result's clamp depends on besides its text. The last two make the
question of the `query` strategy (`caps.question`): bytes that precede the result, so the
same every turn."""


def message_key(message: Message, calls: dict[str, _Call]) -> _Key:
    """A tool message's `_Key`, from the calls seen before it (`_calls`)."""
    call_id = message.get("tool_call_id")
    call = calls.get(call_id) if isinstance(call_id, str) else None
    name, args, asked, arguments = call if call is not None else (None, {}, None, None)
    url = args.get("url") if isinstance(args, dict) else None
    return (
        name,
        call_id if isinstance(call_id, str) else None,
        url if isinstance(url, str) else None,
        asked,
        arguments,
    )


def _clamp_one(
    text: str,
    key: _Key,
    caps: Caps,
    tools: ToolNames,
    segments: list[Segment],
    memo: Memo | None,
) -> str:
    if memo is None:
        new, found = _clamp_result(text, key, caps, tools)
    else:  # every turn of a tool loop resends the earlier tool results unchanged
        new, found = memo.tool_texts.get(_clamp_result, text, key, caps, tools)
    segments.extend(found)
    return text if new is text or new == text else new


def _clamp_result(
    text: str, key: _Key, caps: Caps, tools: ToolNames
) -> tuple[str, tuple[Segment, ...]]:
    found: list[Segment] = []
    new = _clamp_text(text, _Where(*key), caps, tools, found)
    return new, tuple(found)


class _Where:
    """What called a tool result."""

    def __init__(
        self,
        name: str | None,
        call_id: str | None,
        url: str | None,
        asked: tuple[str, ...] | None = None,
        arguments: str | None = None,
    ) -> None:
        self.name = name
        self.call_id = call_id
        self.url = url
        self.asked = asked
        self.arguments = arguments

    def question(self, caps: Caps) -> str | None:
        """What the result was asked for (`caps.question`), with the `query` strategy; None
        with `head`."""
        if caps.strategy != "query":
            return None
        return question.question(self.asked, self.arguments)


_Call = tuple[str, Any, tuple[str, ...] | None, str | None]
"""(real tool name, arguments, the user's texts before the call, arguments as sent)."""


def _calls(messages: list[Message], memo: Memo | None, *, asked: bool = False) -> dict[str, _Call]:
    """tool_call_id → `_Call`, unwrapping the tool-search bridge; with `asked`, the texts of
    the latest user turn before each call (`caps.question`), else None. Each assistant
    message's calls are read once and kept by the message in `memo` (`Memo.calls`)."""
    calls: dict[str, _Call] = {}
    turn: tuple[str, ...] | None = None
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "user" and asked:
            turn = question.user_texts(message) or turn
        elif role == "assistant" and isinstance(message.get("tool_calls"), list):
            if memo is None:
                found = _message_calls(message)
            else:
                found = memo.calls.get(_message_calls, message)
            for call_id, name, args, sent in found:
                calls[call_id] = (name, args, turn, sent if asked else None)
    return calls


def _message_calls(message: Message) -> tuple[tuple[str, str, Any, str | None], ...]:
    """One assistant message's calls: (id, real tool name, arguments, arguments as sent)."""
    found = []
    for call in message["tool_calls"]:
        if not isinstance(call, dict) or not isinstance(call.get("id"), str):
            continue
        function = call.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        name: str = function["name"]
        sent = function.get("arguments")
        args = _json.loads(sent or "") or {}
        if name == _BRIDGE and isinstance(args.get("id"), str):
            name = args["id"].rsplit(":", 1)[-1]
            args = args.get("args") if isinstance(args.get("args"), dict) else {}
        found.append((call["id"], name, args, sent if isinstance(sent, str) else None))
    return tuple(found)


def _kind(name: str | None, tools: ToolNames) -> str | None:
    if name is None:
        return None
    if name in tools.web_fetch:
        return "web_fetch"
    if name in tools.memory_search:
        return "memory_search"
    if name in tools.memory_get:
        return "memory_get"
    return None


def _guess(payload: dict[str, Any]) -> str | None:
    """The kind of a result whose call is not in the request (e.g. trimmed history)."""
    external = payload.get("externalContent")
    if isinstance(external, dict) and external.get("source") == "web_fetch":
        return "web_fetch"
    if snippets.search_size(payload) is not None and payload.get("results"):
        return "memory_search"
    return None


def _clamp_text(
    text: str, where: _Where, caps: Caps, tools: ToolNames, segments: list[Segment]
) -> str:
    kind = _kind(where.name, tools)
    if where.name is not None and kind is None and where.name != _BRIDGE:
        return _clamp_output(text, where.name, where, caps, tools, segments)
    payload = _json.loads(text)
    if payload is not None:
        mark = len(segments)
        try:
            envelope = _envelope_inner(payload)
            if envelope is not None:
                return _clamp_envelope(text, payload, envelope, where, caps, tools, segments)
            kind = kind or _guess(payload)
            if kind is None:
                return text
            new = _clamp_payload(payload, kind, where, caps, segments)
            return text if new is payload else _json.dumps_like(new, text)
        except RecursionError:  # JSON nested past what can be written back: left as it came
            segments[mark:] = [_left(s, "nested too deeply to rewrite") for s in segments[mark:]]
            return text
    wrapped = _unwrap_api(text)
    if wrapped is not None:
        return _clamp_bridge_text(text, wrapped, where, caps, tools, segments)
    if kind is not None:
        _unparseable(text, kind, where, caps, segments)
    return text


# -- parsed payloads -----------------------------------------------------------------------


def _clamp_payload(
    payload: dict[str, Any], kind: str, where: _Where, caps: Caps, segments: list[Segment]
) -> dict[str, Any]:
    tool = where.name or kind
    if kind == "web_fetch":
        return _clamp_web_fetch(payload, tool, where, caps, segments)
    cap = caps.memory_max_chars
    label = f"{tool} {where.call_id}" if where.call_id else tool
    if kind == "memory_search":
        if snippets.search_size(payload) is None:
            return payload
        new, before, after, dropped = snippets.clamp_search(
            payload, cap if cap is not None else 1 << 62
        )
        note = f"{dropped} of {len(payload['results'])} results dropped" if dropped else None
        original = "\n".join(r["snippet"] for r in payload["results"])
        clamped = "\n".join(r["snippet"] for r in new["results"])
    else:
        if not isinstance(payload.get("text"), str):
            return payload
        new, before, after = snippets.clamp_get(payload, cap if cap is not None else 1 << 62)
        note = None
        original, clamped = payload["text"], new["text"]
    if new is not payload and kind == "memory_search":
        new = {**new, "truncated": True}
    segments.append(
        _segment(
            "memory",
            label,
            before,
            after,
            new is not payload,
            cap,
            where,
            tool,
            None,
            note,
            original,
            clamped,
        )
    )
    return new


def _clamp_web_fetch(
    payload: dict[str, Any], tool: str, where: _Where, caps: Caps, segments: list[Segment]
) -> dict[str, Any]:
    cap = caps.web_fetch_max_chars
    text = payload.get("text")
    if not isinstance(text, str):
        return payload
    url = payload.get("finalUrl") or payload.get("url") or where.url
    url = url if isinstance(url, str) else None
    label = " ".join(x for x in (tool, where.call_id, url) if x)
    before = utf16_len(text)
    note = "already truncated by OpenClaw" if payload.get("truncated") is True else None
    clamped = (
        text
        if cap is None or before <= cap  # the question is made only for a result over its cap
        else webfetch.clamp_wrapped(
            text, cap, question=where.question(caps), how=f"ask {tool} for the rest"
        )
    )
    if clamped is None:
        note = (
            "cap smaller than the untrusted-content markers: left whole"
            if webfetch.wrapped(text)
            else "no untrusted-content wrapper to cut inside: left whole"
        )
        clamped = text
    changed = clamped is not text and clamped != text
    segments.append(
        _segment(
            "web_fetch",
            label,
            before,
            utf16_len(clamped),
            changed,
            cap,
            where,
            tool,
            url,
            note,
            text,
            clamped,
        )
    )
    if not changed:
        return payload
    return {**payload, "truncated": True, "length": utf16_len(clamped), "text": clamped}


def _clamp_output(
    text: str, tool: str, where: _Where, caps: Caps, tools: ToolNames, segments: list[Segment]
) -> str:
    """Another tool's result: cut to the tool-output cap, reported only when over it."""
    cap = caps.tool_output_max_chars
    if cap is None or tool in tools.keep_whole:
        return text
    before = utf16_len(text)
    if before <= cap:
        return text
    clamped, note = tooloutput.clamp_output(text, cap, question=where.question(caps))
    label = f"{tool} {where.call_id}" if where.call_id else tool
    changed = clamped != text
    segments.append(
        _segment(
            "tool_output",
            label,
            before,
            utf16_len(clamped),
            changed,
            cap,
            where,
            tool,
            None,
            note,
            text,
            clamped,
        )
    )
    return clamped if changed else text


# -- the tool-search bridge ----------------------------------------------------------------


def _envelope_inner(payload: dict[str, Any]) -> tuple[str, str] | None:
    """(tool name, inner text) of a bridge envelope, else None."""
    tool = payload.get("tool")
    result = payload.get("result")
    if not isinstance(tool, dict) or not isinstance(result, dict):
        return None
    content = result.get("content")
    name = tool.get("name")
    if not isinstance(name, str) or not isinstance(content, list) or len(content) != 1:
        return None
    part = content[0]
    if not isinstance(part, dict) or not isinstance(part.get("text"), str):
        return None
    return name, part["text"]


def _clamp_envelope(
    text: str,
    payload: dict[str, Any],
    inner: tuple[str, str],
    where: _Where,
    caps: Caps,
    tools: ToolNames,
    segments: list[Segment],
) -> str:
    name, inner_text = inner
    bridged = _Where(
        where.name if where.name != _BRIDGE else name,
        where.call_id,
        where.url,
        where.asked,
        where.arguments,
    )
    new_inner = _clamp_text(inner_text, bridged, caps, tools, segments)
    if new_inner is inner_text:
        return text
    part = {**payload["result"]["content"][0], "text": new_inner}
    new = {**payload, "result": {**payload["result"], "content": [part]}}
    return _json.dumps_like(new, text)


def _left(segment: Segment, why: str) -> Segment:
    """`segment` as left untouched (`kept`), saying why."""
    return replace(
        segment,
        action="kept",
        after=segment.before,
        clamped=segment.original,
        note=f"{why}: left as is",
    )


def _unwrap_api(text: str) -> str | None:
    """The envelope inside a `Source: API` untrusted-content wrapper, if `text` is one."""
    if "<<<EXTERNAL_UNTRUSTED_CONTENT" not in text or "\nSource: API\n---\n" not in text:
        return None
    start = text.find("\nSource: API\n---\n") + len("\nSource: API\n---\n")
    end = text.rfind("\n<<<END_EXTERNAL_UNTRUSTED_CONTENT")
    return text[start:end] if end > start else None


def _clamp_bridge_text(
    text: str,
    envelope_text: str,
    where: _Where,
    caps: Caps,
    tools: ToolNames,
    segments: list[Segment],
) -> str:
    payload = _json.loads(envelope_text)
    if payload is not None and _envelope_inner(payload) is not None:
        new_envelope = _clamp_text(envelope_text, where, caps, tools, segments)
        return (
            text if new_envelope is envelope_text else text.replace(envelope_text, new_envelope, 1)
        )
    # The bridge cut the envelope (`[truncated]`): only a text cut inside the wrapper is safe.
    kind = _kind(where.name, tools) or ("web_fetch" if '"source": "web_fetch"' in text else None)
    if kind is None:
        return text
    return _unparseable(text, kind, where, caps, segments)


def _unparseable(text: str, kind: str, where: _Where, caps: Caps, segments: list[Segment]) -> str:
    """A result that no longer parses: cut inside its outer wrapper if it has one, else keep."""
    seg_kind: SegmentKind = "web_fetch" if kind == "web_fetch" else "memory"
    cap = caps.web_fetch_max_chars if seg_kind == "web_fetch" else caps.memory_max_chars
    tool = where.name or kind
    label = f"{tool} {where.call_id}" if where.call_id else tool
    before = utf16_len(text)
    clamped = text
    note = "unparseable JSON (cut upstream): left as is"
    if cap is not None and before > cap and seg_kind == "web_fetch":
        cut = webfetch.clamp_wrapped(
            text, cap, question=where.question(caps), how=f"ask {tool} for the rest"
        )
        if cut is not None:
            clamped, note = cut, "unparseable JSON (cut upstream): clamped as text"
    changed = clamped is not text
    segments.append(
        _segment(
            seg_kind,
            label,
            before,
            utf16_len(clamped),
            changed,
            cap,
            where,
            tool,
            where.url,
            note,
            text,
            clamped,
        )
    )
    return clamped


def _segment(
    kind: SegmentKind,
    label: str,
    before: int,
    after: int,
    changed: bool,
    cap: int | None,
    where: _Where,
    tool: str,
    url: str | None,
    note: str | None,
    original: str,
    clamped: str,
) -> Segment:
    return Segment(
        kind=kind,
        label=label,
        before=before,
        after=after,
        action="clamped" if changed else "kept",
        cap=cap,
        tool=tool,
        call_id=where.call_id,
        url=url,
        note=note,
        strategy=_strategy(kind, changed, original, clamped),
        original=original,
        clamped=clamped,
    )


def _strategy(kind: SegmentKind, changed: bool, original: str, clamped: str) -> Strategy | None:
    """How a clamped web page or tool output was cut: `query` when passages were picked."""
    if not changed or kind not in ("web_fetch", "tool_output"):
        return None
    return "query" if passages.picked(original, clamped) else "head"


def tool_calls(messages: list[Message], memo: Memo | None = None) -> dict[str, tuple[str, Any]]:
    """tool_call_id → (real tool name, arguments) of the assistant calls in `messages`, the
    tool-search bridge unwrapped (what names a result: `caps/prune.py` reads it too)."""
    calls = _calls(messages, memo)
    return {call_id: (name, args) for call_id, (name, args, _, _) in calls.items()}
