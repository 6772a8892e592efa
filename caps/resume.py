"""The clamp of a growing conversation, item by item, resumable where the last request ended.

An agent's request N+1 is request N plus a turn or two: the same message objects, in the same
order (the caller knows it from the bytes: `proxy/wire/history.py`), then new ones. What
`clamp_request` decides for a message depends only on the message and on what comes *before*
it — the first user message, the tool calls read so far, the user's latest turn (the `query`
strategy's question) — so the decisions for the first k messages of request N hold for
request N+1, and only the new messages need working. `ClampState` is what was decided, per
message, plus the running state after the last one; `ClampState.upto(k)` is the same for the
first k (OpenClaw drops its trailing context message from the next request). The state resumed
from hands its lists to the new one, which cuts and extends them in place: a request copies
nothing of the history (a conversation's clamp is resumed from by its next request only; a
second one resumed from the same state works its messages from the first).

Two things the one-pass reading cannot know, which the whole-list clamp reads from the whole
list: a result whose call comes *after* it, and a call id used twice (the later call names the
earlier results too). A conversation with either is clamped whole (`odd`), as before, every
request: the same bytes either way.

Pruning's `prunable` results depend on the whole list through the cutoff (results before the
`keep_last_assistants`-th assistant message from the end): each result's verdict is decided
once, when it is read, and a request takes those before its cutoff (a slice).

The state is the caller's, as `caps.Memo` is: `caps` keeps nothing itself.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ctxbudget.caps import prune, question
from ctxbudget.caps._text import utf16_len
from ctxbudget.caps.toolresults import _Call, _clamp_message_at, _message_calls, message_key
from ctxbudget.caps.types import Caps, PrunePolicy, Segment, ToolNames, evolve

if TYPE_CHECKING:
    from ctxbudget.caps.memo import Memo

_SYSTEM_ROLES = frozenset({"system", "developer"})


class ClampState:
    """What `clamp_request` decided for each message of a request, and the running state after
    the last (the first user message's place, the calls read, the latest user turn), for the
    same `caps` and `tools`. Changed only by the one state that resumes from it, which takes
    its lists (it is then `spent`)."""

    __slots__ = (
        "caps",
        "tools",
        "odd",
        "out",
        "changed",
        "text_segments",
        "text_ends",
        "tool_segments",
        "tool_ends",
        "turns",
        "first_user",
        "calls",
        "called_at",
        "unanswered",
        "candidates",
        "prunable",
        "prunable_ends",
        "kept",
        "spent",
        "source",
        "at",
    )

    def __init__(self, caps: Caps, tools: ToolNames, *, odd: bool = False) -> None:
        self.caps = caps
        self.tools = tools
        self.odd = odd
        """The conversation is clamped whole (a call after its result, or an id used twice)."""
        self.out: list[Any] = []
        """Each message as forwarded (the message itself when unchanged)."""
        self.changed: array[int] = _ints()
        """Messages changed up to and including each one."""
        self.text_segments: list[Segment] = []
        """The system and first-user clamps' segments, in message order."""
        self.text_ends: array[int] = _ints()
        """How many of them up to and including each message."""
        self.tool_segments: list[Segment] = []
        self.tool_ends: array[int] = _ints()
        self.turns: list[tuple[str, ...] | None] = []
        """The user's latest turn after each message (the `query` question)."""
        self.first_user = -1
        """The first user message's index; -1 while there is none."""
        self.calls: dict[str, _Call] = {}
        """Every tool call read, by id (never changed in place: copied to extend)."""
        self.called_at: list[tuple[int, str]] = []
        """(message index, call id) of each call, in order."""
        self.unanswered: frozenset[str] = frozenset()
        """Call ids of results read before any call named them."""
        self.candidates: array[int] = _ints()
        """The message index of each result pruning could take (`prune.prunable`, before the
        cutoff)."""
        self.prunable: list[Segment] = []
        """Their `prunable` segments (the ones the policy takes), in order."""
        self.prunable_ends: array[int] = _ints()
        """How many of them up to and including each candidate.

        The per-message counts and indexes are arrays, not lists: a list of ints is a
        container the garbage collector walks item by item (the newest state's, copied a
        request, at each young collection); an array holds no objects (it visits only its
        type)."""
        self.kept = 0
        """How many leading messages were taken from the state resumed from (`out`'s first
        ones are its very objects); 0 when none was."""
        self.spent = False
        """Its lists were taken by the state that resumed from it, and extended in place (a
        long conversation's ~10 lists of ~600 items were copied twice a request): resumed
        from again (a retry, or a second request in flight on the same conversation), its
        messages are clamped from the first (`upto` gives None)."""
        self.source: ClampState | None = None
        """Made by `upto`: the state whose first `at` messages' decisions these are, its
        lists not copied (`extend` takes and cuts them)."""
        self.at = 0

    def __len__(self) -> int:
        return self.at if self.source is not None else len(self.out)

    def upto(self, k: int) -> ClampState | None:
        """The state after the first `k` messages, for the one resume that follows (its
        lists are then the new state's); None when it cannot be had (k past the end, or the
        state spent already)."""
        n = len(self)
        if self.spent or self.source is not None:
            return None
        if k == n or self.odd:
            return self
        if not 0 < k < n:
            return None
        state = ClampState(self.caps, self.tools)
        state.source, state.at = self, k
        state.first_user = self.first_user if self.first_user < k else -1
        state.unanswered = self.unanswered  # more than needed: at worst a whole clamp later
        return state

    def _take(self, k: int) -> ClampState:
        """Its lists cut to the first `k` messages' (in place: they are the caller's now), as
        a state; it is spent."""
        self.spent = True
        state = ClampState(self.caps, self.tools)
        state.first_user = self.first_user if self.first_user < k else -1
        state.unanswered = self.unanswered
        state.out, state.changed, state.turns = self.out, self.changed, self.turns
        state.text_ends, state.tool_ends = self.text_ends, self.tool_ends
        state.text_segments, state.tool_segments = self.text_segments, self.tool_segments
        state.called_at, state.calls = self.called_at, self.calls
        state.candidates, state.prunable_ends = self.candidates, self.prunable_ends
        state.prunable = self.prunable
        if k == len(self.out):
            return state
        del state.out[k:], state.changed[k:], state.turns[k:]
        del state.text_ends[k:], state.tool_ends[k:]
        del state.text_segments[state.text_ends[-1] :]
        del state.tool_segments[state.tool_ends[-1] :]
        cut = bisect_left(state.called_at, (k, ""))
        for _, call_id in state.called_at[cut:]:  # ids used once (not odd)
            del state.calls[call_id]
        del state.called_at[cut:]
        j = bisect_left(state.candidates, k)
        del state.candidates[j:], state.prunable_ends[j:]
        del state.prunable[state.prunable_ends[-1] if j else 0 :]
        return state


def _ints() -> array[int]:
    """An empty array of counts or indexes (signed 64-bit)."""
    return array("q")


class _Odd(Exception):
    """The conversation cannot be read in one pass (`ClampState.odd`)."""


_ClampText = Callable[[str, Caps, "Memo | None"], tuple[str, list[Segment]]]


def extend(
    messages: list[Any],
    caps: Caps,
    tools: ToolNames,
    memo: Memo | None,
    resume: ClampState | None,
    *,
    texts: Callable[..., tuple[Any, tuple[Segment, ...]]],
    system_text: _ClampText,
    first_user_text: _ClampText,
    prunable_segment: Callable[..., Segment | None],
) -> ClampState | None:
    """The state after every message of `messages`, from `resume` (the state after its first
    `len(resume)` messages, the very objects: the caller's word) or from nothing; None when
    the conversation must be clamped whole (`ClampState.odd`). The clamps themselves are
    `caps.clamp`'s, passed in."""
    if resume is not None:
        source = resume.source if resume.source is not None else resume
        if resume.odd or resume.caps != caps or resume.tools != tools or source.spent:
            if resume.odd and resume.caps == caps and resume.tools == tools:
                return None
            resume = None
        elif len(resume) > len(messages):
            resume = None
    state = ClampState(caps, tools)
    start = 0
    calls: dict[str, _Call] = {}
    turn: tuple[str, ...] | None = None
    unanswered: set[str] = set()
    copied = False  # `calls` is the resumed state's until a call is added
    if resume is not None:
        start = len(resume)
        # the lists of the state resumed from, cut to its first `start` messages and
        # extended in place: it is spent (`ClampState.spent`)
        state = (resume.source or resume)._take(start)
        state.kept = start
        calls, copied = state.calls, True
        turn = state.turns[-1] if state.turns else None
        unanswered = set(resume.unanswered)
    query = caps.strategy == "query"
    policy = caps.prune
    changed = state.changed[-1] if state.changed else 0
    try:
        for index in range(start, len(messages)):
            message = messages[index]
            new = message
            role = message.get("role") if isinstance(message, dict) else None
            clamp_text = None
            if role == "user" and state.first_user < 0:
                state.first_user = index
                clamp_text = first_user_text
            elif isinstance(role, str) and role in _SYSTEM_ROLES:
                clamp_text = system_text
            if clamp_text is not None:
                new, found = texts(memo, message, clamp_text, caps, index)
                state.text_segments.extend(found)
            state.text_ends.append(len(state.text_segments))
            # what `toolresults._calls` reads of the messages the text clamp gave
            if role == "user" and query:
                turn = question.user_texts(new) or turn
            elif role == "assistant" and isinstance(new.get("tool_calls"), list):
                for call_id, name, args, sent in _message_calls(new):
                    if call_id in calls or call_id in unanswered:
                        raise _Odd
                    if not copied:
                        calls, copied = dict(calls), True
                    calls[call_id] = (name, args, turn, sent if query else None)
                    state.called_at.append((index, call_id))
            elif role == "tool":
                new = _tool(new, index, calls, unanswered, caps, tools, memo, state)
                if policy is not None:
                    _candidate(new, index, calls, policy, caps.owner, memo, state, prunable_segment)
            state.tool_ends.append(len(state.tool_segments))
            state.turns.append(turn)
            state.out.append(new)
            changed += new is not message
            state.changed.append(changed)
    except _Odd:
        return None
    state.calls = calls
    state.unanswered = frozenset(unanswered)
    return state


def _tool(
    message: dict[str, Any],
    index: int,
    calls: dict[str, _Call],
    unanswered: set[str],
    caps: Caps,
    tools: ToolNames,
    memo: Memo | None,
    state: ClampState,
) -> Any:
    """One tool message through `toolresults`' clamp, as `clamp_tool_results` does it."""
    call_id = message.get("tool_call_id")
    if isinstance(call_id, str) and call_id not in calls:
        unanswered.add(call_id)
    key = message_key(message, calls)
    new, found = _clamp_message_at(memo, message, key, caps, tools, index)
    state.tool_segments.extend(found)
    return new


def _candidate(
    message: Any,
    index: int,
    calls: dict[str, _Call],
    policy: PrunePolicy,
    owner: str,
    memo: Memo | None,
    state: ClampState,
    prunable_segment: Callable[..., Segment | None],
) -> None:
    """A result pruning could take once it is before the cutoff (`prune.prunable`), its
    verdict decided now: it depends on nothing after it."""
    call_id = message.get("tool_call_id")
    text = prune._text(message.get("content"))
    if not isinstance(call_id, str) or text is None:
        return
    chars = utf16_len(text)
    call = calls.get(call_id)
    tool = call[0] if call is not None else None
    segment = None
    if chars >= policy.min_chars and policy.allows(tool):
        segment = prunable_segment(text, tool, call_id, chars, policy, owner, memo)
    state.candidates.append(index)
    if segment is not None:
        state.prunable.append(evolve(segment, message_index=index))
    state.prunable_ends.append(len(state.prunable))


def decisions(state: ClampState) -> tuple[Any, ...]:
    """What `state` decided, per message and per segment: the same for a state resumed (its
    lists cut and extended in place) as for one made from the first message (the debug
    mode's check, `CTXBUDGET_CHECK_RESENT`)."""
    return (
        state.odd,
        state.out,
        state.changed,
        state.text_segments,
        state.text_ends,
        state.tool_segments,
        state.tool_ends,
        state.turns,
        state.first_user,
        state.calls,
        state.called_at,
        state.candidates,
        state.prunable,
        state.prunable_ends,
    )


def segments(state: ClampState) -> tuple[Segment, ...]:
    """The request's segments in `clamp_request`'s order: the texts', the results', then the
    prunable results before the cutoff."""
    found = (*state.text_segments, *state.tool_segments)
    policy = state.caps.prune
    if policy is None or not state.candidates:
        return found
    cutoff = prune._cutoff(state.out, policy.keep_last_assistants)
    if cutoff <= 0:
        return found
    j = bisect_left(state.candidates, cutoff)
    return found + tuple(state.prunable[: state.prunable_ends[j - 1]]) if j else found
