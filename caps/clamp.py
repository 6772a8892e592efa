"""Clamp a whole chat request: the entry point of `caps`.

`clamp_request` finds every capped segment in a request, clamps the ones over their cap and
returns a new request plus one `Segment` per piece it recognised. It never mutates its input
and is deterministic: the same request and caps always give the same bytes out, so provider
prompt caches stay warm. Clamping a clamped request changes nothing (idempotent).

Where each kind is looked for: bootstrap files in system (and developer) messages; Claude
Code's and Codex's instruction files, and the page of Claude Code's WebFetch summariser
request, in the texts of the first user message that are the agent's own wrappers (never the
user's words: `caps.instructions`, `caps.summariser`); memory, web_fetch and any other tool's
results in `tool` messages (`caps.toolresults`).

What was made for an earlier request is remembered in the caller's `memo` (`caps.Memo`), never
here: the same bytes out with it or without. What was decided for each message comes back with
the result (`ClampResult.state`): the caller hands it to the clamp of the conversation's next
request (`resume`), which then works only the messages after those it repeats
(`caps.resume`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ctxbudget.caps import prune
from ctxbudget.caps import resume as _resume
from ctxbudget.caps.bootstrap import clamp_system_text
from ctxbudget.caps.instructions import clamp_instructions
from ctxbudget.caps.memo import Memo
from ctxbudget.caps.summariser import clamp_page
from ctxbudget.caps.toolresults import clamp_tool_results
from ctxbudget.caps.types import (
    Caps,
    ChatRequest,
    ClampResult,
    Message,
    PrunePolicy,
    Segment,
    ToolNames,
    evolve,
)

_SYSTEM_ROLES = frozenset({"system", "developer"})


def clamp_request(
    request: ChatRequest,
    caps: Caps,
    *,
    tools: ToolNames | None = None,
    memo: Memo | None = None,
    resume: _resume.ClampState | None = None,
) -> ClampResult:
    """Clamp bootstrap and instruction files, memory, web_fetch and other tool results, and
    the WebFetch summariser's page in `request`.

    A request without a `messages` list is returned as it came, with no segments. `memo`:
    where what is made is remembered for the next request (`caps.Memo`, the caller's: one per
    app); None remembers nothing. `resume`: the `state` of an earlier result whose messages
    are the first `len(resume)` of these, the very objects (`ClampState.upto` for fewer):
    only the rest are worked, and the result is the same as without it.
    """
    messages = request.get("messages")
    if not isinstance(messages, list):
        return ClampResult(request=request, segments=(), changed=False)
    tools = tools or ToolNames()
    state = _resume.extend(
        messages,
        caps,
        tools,
        memo,
        resume,
        texts=_clamp_texts_at,
        system_text=_system_text,
        first_user_text=_first_user_text,
        prunable_segment=_prunable_kept,
    )
    if state is None:  # read whole, as the conversation needs (`ClampState.odd`)
        whole = _clamp_whole(messages, request, caps, tools, memo)
        return replace(whole, state=_resume.ClampState(caps, tools, odd=True))
    segments = _resume.segments(state)
    if not state.changed or not state.changed[-1]:
        return ClampResult(request=request, segments=segments, changed=False, state=state)
    return ClampResult(
        request={**request, "messages": list(state.out)},
        segments=segments,
        changed=True,
        state=state,
    )


def _clamp_whole(
    messages: list[Any], request: ChatRequest, caps: Caps, tools: ToolNames, memo: Memo | None
) -> ClampResult:
    """`clamp_request` reading the whole list at each step: the calls of every assistant
    message first, so a result whose call comes after it is named too."""
    segments: list[Segment] = []
    new_messages: list[Any] = list(messages)
    changed = False
    first_user = True
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "user" and first_user:
            first_user = False
            clamp_text = _first_user_text
        elif isinstance(role, str) and role in _SYSTEM_ROLES:  # a list role: not ours
            clamp_text = _system_text
        else:
            continue
        new_message, found = _clamp_texts_at(memo, message, clamp_text, caps, index)
        segments.extend(found)
        if new_message is not message:
            new_messages[index] = new_message
            changed = True

    tool_messages, tool_segments = clamp_tool_results(new_messages, caps, tools, memo)
    segments.extend(tool_segments)
    if tool_messages is not new_messages:
        new_messages = tool_messages
        changed = True
    if caps.prune is not None:
        segments.extend(_prunable(new_messages, caps.prune, caps.owner, memo))

    if not changed:
        return ClampResult(request=request, segments=tuple(segments), changed=False)
    return ClampResult(
        request={**request, "messages": new_messages}, segments=tuple(segments), changed=True
    )


_ClampText = Callable[[str, Caps, Memo | None], tuple[str, list[Segment]]]


def _clamp_texts_at(
    memo: Memo | None, message: Message, clamp_text: _ClampText, caps: Caps, index: int
) -> tuple[Message, tuple[Segment, ...]]:
    """A message's texts clamped, its segments at `index`."""
    new, found = _clamp_texts(message, clamp_text, caps, memo)
    return new, tuple(evolve(s, message_index=index) for s in found)


def _system_text(text: str, caps: Caps, memo: Memo | None) -> tuple[str, list[Segment]]:
    return clamp_system_text(text, caps.bootstrap_max_chars, caps.owner, memo)


def _first_user_text(text: str, caps: Caps, memo: Memo | None) -> tuple[str, list[Segment]]:
    new, found = clamp_instructions(text, caps.bootstrap_max_chars, caps.owner, memo)
    if found:
        return new, found
    return clamp_page(text, caps.web_fetch_max_chars, query=caps.strategy == "query")


def _clamp_texts(
    message: Message, clamp_text: _ClampText, caps: Caps, memo: Memo | None
) -> tuple[Message, tuple[Segment, ...]]:
    """`message` with each text (a string content, or each text part) through `clamp_text`."""
    content = message.get("content")
    if isinstance(content, str):
        text, found = clamp_text(content, caps, memo)
        if text == content:
            return message, tuple(found)
        return {**message, "content": text}, tuple(found)
    if not isinstance(content, list):
        return message, ()

    found_all: list[Segment] = []
    parts: list[Any] = list(content)
    touched = False
    for i, part in enumerate(content):
        if not (isinstance(part, dict) and part.get("type") == "text"):
            continue
        part_text = part.get("text")
        if not isinstance(part_text, str):
            continue
        new_text, found = clamp_text(part_text, caps, memo)
        found_all.extend(found)
        if new_text != part_text:
            parts[i] = {**part, "text": new_text}
            touched = True
    if not touched:
        return message, tuple(found_all)
    return {**message, "content": parts}, tuple(found_all)


def prune_request(
    request: ChatRequest,
    caps: Caps,
    *,
    tools: ToolNames | None = None,
    memo: Memo | None = None,
    resume: _resume.ClampState | None = None,
) -> ClampResult:
    """`request` with the pruning decisions of `caps.pruned` applied, and nothing else: the
    second pass over a request the clamps went through already (`caps/prune.py`)."""
    messages = request.get("messages")
    if not isinstance(messages, list) or not caps.pruned:
        return ClampResult(request=request, segments=(), changed=False)

    def digest_of(text: str, tool: str | None, call_id: str) -> str:
        # a result the first pass found prunable has its digest on its segment, kept by the
        # same key: not hashed again (~10 µs an 8 KB result, on every request)
        policy = caps.prune
        key = (caps.owner, text, tool, call_id, policy)
        kept = None if policy is None or memo is None else memo.prunable.get(key)
        found = None if kept is None or kept[0] is None else kept[0].digest
        return found if found is not None else prune.digest(text)

    decisions = {(call_id, digest): text for call_id, digest, text in caps.pruned}
    new, segments = prune.apply(
        messages,
        decisions,
        fresh=caps.pruned_now,
        policy=caps.prune,
        digest_of=digest_of,
        memo=memo,
    )
    if new is messages:
        return ClampResult(request=request, segments=tuple(segments), changed=False)
    return ClampResult(request={**request, "messages": new}, segments=tuple(segments), changed=True)


def _prunable(
    messages: list[Any], policy: PrunePolicy, owner: str, memo: Memo | None
) -> list[Segment]:
    """A `prunable` segment for each result pruning could take, `after` what would stand for
    it (the caller decides whether it does). Every request of a long session finds the same
    old results prunable (the text's hash is kept on the string, which the next request holds
    again): their segments are remembered in `Memo.prunable`, by what they depend on."""
    out = []
    for found in prune.prunable(messages, policy, memo):
        segment = _prunable_kept(
            found.text, found.tool, found.call_id, found.chars, policy, owner, memo
        )
        if segment is not None:
            out.append(evolve(segment, message_index=found.message_index))
    return out


def _prunable_kept(
    text: str, tool: str | None, call_id: str, chars: int, policy: PrunePolicy, owner: str,
    memo: Memo | None,
) -> Segment | None:  # fmt: skip
    """`_prunable_segment`, remembered in `Memo.prunable` by what it depends on."""
    key = (owner, text, tool, call_id, policy)
    kept = None if memo is None else memo.prunable.get(key)
    if kept is None:
        kept = (_prunable_segment(text, tool, call_id, chars, policy),)
        if memo is not None:
            # what it keeps alive: the text (the key), the segment's own two texts
            memo.prunable.put(key, kept, weight=3 * sys.getsizeof(text) + 400)
    return kept[0]


def _prunable_segment(
    text: str, tool: str | None, call_id: str, chars: int, policy: PrunePolicy
) -> Segment | None:
    pruned = prune.pruned_text(text, tool, call_id, policy)
    if pruned is None:
        return None
    return prune.segment(
        text, pruned, tool, call_id, action="prunable", chars=chars, digest=prune.digest(text)
    )
