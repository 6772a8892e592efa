"""`clamp_request(..., resume=)` (`caps/resume.py`): a conversation's clamp resumed where its
last request's ended gives what a clamp of the whole request gives, byte for byte, working
only the new messages."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from ctxbudget.caps import Caps, ClampState, Memo, PrunePolicy, ToolNames, clamp_request
from ctxbudget.caps import question as question_module

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench._growing import chat_bodies  # noqa: E402

_POLICY = PrunePolicy(
    keep_last_assistants=3, min_chars=500, soft_max_chars=2000, head_chars=100, tail_chars=100
)


def _caps(strategy: str, prune: PrunePolicy | None) -> Caps:
    return Caps(
        bootstrap_max_chars=2000,
        web_fetch_max_chars=1500,
        tool_output_max_chars=1200,
        memory_max_chars=800,
        strategy=strategy,  # type: ignore[arg-type]
        prune=prune,
        owner="o",
    )


def _grown(turns: int) -> list[list[Any]]:
    """Each request's messages, those it repeats the very objects of the one before (as the
    proxy reads them: `proxy/wire/history.py`)."""
    out: list[list[Any]] = []
    for raw in chat_bodies(turns):
        messages = json.loads(raw)["messages"]
        if out:
            last, k = out[-1], 0
            while k < min(len(last), len(messages)) and last[k] == messages[k]:
                k += 1
            messages = last[:k] + messages[k:]
        out.append(messages)
    return out


def _same_objects(new: list[Any], old: list[Any]) -> int:
    k = 0
    while k < min(len(new), len(old)) and new[k] is old[k]:
        k += 1
    return k


@pytest.mark.parametrize("strategy", ["query", "head"])
@pytest.mark.parametrize("prune", [None, _POLICY])
def test_a_resumed_clamp_is_the_whole_clamp(strategy: str, prune: PrunePolicy | None) -> None:
    caps, tools, memo = _caps(strategy, prune), ToolNames(), Memo()
    state: ClampState | None = None
    last: list[Any] = []
    for messages in _grown(40):
        resume = state.upto(_same_objects(messages, last)) if state is not None else None
        got = clamp_request({"messages": messages}, caps, tools=tools, memo=memo, resume=resume)
        whole = clamp_request({"messages": messages}, caps, tools=tools)
        assert (got.segments, got.request, got.changed) == (
            whole.segments,
            whole.request,
            whole.changed,
        )
        assert got.state is not None and not got.state.odd
        state, last = got.state, messages
    assert any(s.action == "clamped" for s in got.segments)
    assert prune is None or any(s.action == "prunable" for s in got.segments)


def test_a_resumed_clamp_reads_only_the_new_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    caps, tools = _caps("query", _POLICY), ToolNames()
    grown = _grown(40)
    state = clamp_request({"messages": grown[-2]}, caps, tools=tools).state
    assert state is not None
    read = []
    real = question_module.user_texts
    monkeypatch.setattr(question_module, "user_texts", lambda m: read.append(m) or real(m))
    kept = _same_objects(grown[-1], grown[-2])
    clamp_request({"messages": grown[-1]}, caps, tools=tools, resume=state.upto(kept))
    assert len(read) <= len(grown[-1]) - kept < 6
    read.clear()
    clamp_request({"messages": grown[-1]}, caps, tools=tools)
    assert len(read) == sum(m["role"] == "user" for m in grown[-1]) > 2  # all of them


def _call(call_id: str) -> dict[str, Any]:
    function = {"name": "exec", "arguments": '{"command": "make"}'}
    return {"role": "assistant", "tool_calls": [{"id": call_id, "function": function}]}


@pytest.mark.parametrize("odd", ["result before its call", "an id used twice"])
def test_a_conversation_one_pass_cannot_read_is_clamped_whole(odd: str) -> None:
    """A call that comes after its result, or an id called twice (the later call names the
    earlier results too): clamped whole, every request, to the same bytes."""
    caps, tools = _caps("query", _POLICY), ToolNames()
    result = {"role": "tool", "tool_call_id": "c1", "content": "line\n" * 600}
    user = {"role": "user", "content": "make it build"}
    if odd == "result before its call":
        messages = [user, result, _call("c1"), {"role": "assistant", "content": "ok"}]
    else:
        messages = [user, _call("c1"), result, _call("c1"), {"role": "assistant", "content": "ok"}]
    first = clamp_request({"messages": messages}, caps, tools=tools)
    assert first.state is not None and first.state.odd
    grown = [*messages, {"role": "user", "content": "again"}]
    again = clamp_request({"messages": grown}, caps, tools=tools, resume=first.state)
    whole = clamp_request({"messages": grown}, caps, tools=tools)
    assert (again.segments, again.request) == (whole.segments, whole.request)
    assert any(s.tool == "exec" for s in whole.segments)  # the result was named by its call


def test_a_state_of_other_caps_is_not_resumed() -> None:
    grown = _grown(12)
    tools = ToolNames()
    state = clamp_request({"messages": grown[-2]}, _caps("head", None), tools=tools).state
    kept = _same_objects(grown[-1], grown[-2])
    assert state is not None
    other = _caps("query", _POLICY)
    got = clamp_request({"messages": grown[-1]}, other, tools=tools, resume=state.upto(kept))
    whole = clamp_request({"messages": grown[-1]}, other, tools=tools)
    assert (got.segments, got.request) == (whole.segments, whole.request)


_COUNTS = ("changed", "text_ends", "tool_ends", "candidates", "prunable_ends")


def test_what_the_collector_walks_of_a_clamp_state_is_its_messages() -> None:
    """A 120-turn conversation's clamp state holds, for the garbage collector to walk, each
    message as forwarded, its latest user turn, and the segments: the per-message counts and
    indexes are 8 bytes each in an array, not an int object in a list (five lists as long as
    the conversation, walked by every young collection that found the newest state). What is
    walked grows by the message, so 120 turns tell a list from an array as 300 would."""
    import gc

    caps, tools = _caps("query", _POLICY), ToolNames()
    messages = json.loads(chat_bodies(120)[-1])["messages"]  # the last request alone
    state = clamp_request({"messages": messages}, caps, tools=tools).state
    assert state is not None and len(state) == len(messages) > 250
    walked = {
        name: len(gc.get_referents(value))
        for name in ClampState.__slots__
        if gc.is_tracked(value := getattr(state, name))
    }
    # `out` and `turns`: one a message; `calls` and `called_at`: one a call; one a segment
    segments = len(state.text_segments) + len(state.tool_segments) + len(state.prunable)
    assert sum(walked.values()) <= 2 * len(messages) + 2 * len(state.called_at) + segments + 20
    assert {walked[name] for name in _COUNTS} == {1}  # an array: its type, no items
