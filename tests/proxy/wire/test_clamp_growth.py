"""The clamp and the client's blocks of request N+1 work only its new items (issue 34): what
was decided for the items request N had is taken as it was, not copied item by item, and the
system prompt a Messages request repeats is neither serialised nor hashed again."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxbudget.caps import ClampState
from ctxbudget.caps import clamp as clamp_module
from ctxbudget.proxy.cache import blocks
from ctxbudget.proxy.cache.resent import RESENT
from tests.fakes import answer_in
from tests.inproc import InProcess, cutting_config, proxy_app, state_of

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench._growing import BUILDERS  # noqa: E402

PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages"}


def _send(client: InProcess, fake: Any, wire: str, raw: bytes) -> None:
    answer_in(fake, wire)
    r = client.post(PATHS[wire], content=raw)
    assert r.status_code == 200, r.text


def _lists(state: ClampState) -> dict[str, Any]:
    """The state's per-message and per-segment lists, by slot."""
    return {
        name: value
        for name in ClampState.__slots__
        if isinstance(value := getattr(state, name), list | array)
    }


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ClampState]]:
    """The clamp states the resumed clamp makes, in order."""
    found: list[ClampState] = []
    real = clamp_module._resume.extend

    def extend(*args: Any, **kwargs: Any) -> ClampState | None:
        state = real(*args, **kwargs)
        if state is not None and kwargs.get("resume", args[4] if len(args) > 4 else None):
            found.append(state)
        return state

    # as in production: the suite's re-check runs the whole clamp too (a state of its own)
    monkeypatch.setattr(RESENT, "check", False)
    monkeypatch.setattr(clamp_module._resume, "extend", extend)
    yield found


@pytest.mark.parametrize("wire", ["chat", "messages"])
def test_turn_n_extends_the_clamp_state_of_turn_n_minus_1_in_place(
    tmp_path: Path, wire: str, made: list[ClampState]
) -> None:
    """The clamp's decisions for a 100-message history are request N's very lists, extended
    by the new turn's few: no list as long as the conversation is copied (~10 of them, each
    request, where OpenClaw drops its context message from the next request)."""
    bodies = BUILDERS[wire][1](58)
    with proxy_app(tmp_path, cutting_config(tmp_path)) as (client, fake):
        for raw in bodies[:-1]:
            _send(client, fake, wire, raw)
        found = state_of(client).conversations.find(bodies[-1], "default")
        assert found is not None and found.history.clamp is not None
        before = found.history.clamp
        lists, n = _lists(before), len(before)
        assert n > 100
        made.clear()
        _send(client, fake, wire, bodies[-1])
    assert len(made) == 1
    after = made[0]
    # the items request N had, but OpenClaw's context message (Messages: and the results
    # from the one its marker moved off), taken as they were
    assert len(after) > after.kept >= n - 4
    same = {name for name, value in _lists(after).items() if value is lists[name]}
    assert same == set(lists), set(lists) - same


def test_a_spent_clamp_state_resumed_again_is_clamped_from_the_start() -> None:
    """Two requests that extend the same conversation (a retry, two in flight at once): the
    first takes the state's lists, the second works its messages from the first one and gets
    the same result as a whole clamp."""
    from ctxbudget.caps import Caps, Memo, ToolNames, clamp_request

    caps, tools = Caps(tool_output_max_chars=200), ToolNames()
    result = {"role": "tool", "tool_call_id": "c1", "content": "line\n" * 600}
    call = {
        "role": "assistant",
        "tool_calls": [{"id": "c1", "function": {"name": "exec", "arguments": "{}"}}],
    }
    base = [{"role": "user", "content": "make it build"}, call, result]
    first = clamp_request({"messages": base}, caps, tools=tools, memo=Memo())
    assert first.state is not None
    grown = [*base, {"role": "assistant", "content": "ok"}]
    other = [*base, {"role": "user", "content": "and test"}]
    whole = clamp_request({"messages": other}, caps, tools=tools)
    one = clamp_request({"messages": grown}, caps, tools=tools, resume=first.state.upto(3))
    assert one.state is not None and not one.state.odd
    resumed = first.state.upto(3)
    two = clamp_request({"messages": other}, caps, tools=tools, resume=resumed)
    assert (two.segments, two.request, two.changed) == (whole.segments, whole.request, True)
    assert two.state is not None and not two.state.odd
    again = clamp_request({"messages": grown}, caps, tools=tools)
    assert (one.segments, one.request) == (again.segments, again.request)


def test_a_messages_system_prompt_resent_is_not_serialised_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenClaw's 26 KB `system` (a list of text blocks, clamped) comes back every turn: its
    bytes as sent and as forwarded are serialised once, not on every request (~0.15 ms a
    request, at turn 30 as at turn 300)."""
    # as in production: the suite's re-check of every object kept serialises it again
    monkeypatch.setattr(RESENT, "check", False)
    monkeypatch.setattr(blocks._SERIAL_KEPT, "check", False)
    bodies = BUILDERS["messages"][1](12)
    serialised: list[type] = []
    real = blocks._serial

    def counted(value: Any) -> bytes:
        serialised.append(type(value))
        return real(value)

    monkeypatch.setattr(blocks, "_serial", counted)
    with proxy_app(tmp_path, cutting_config(tmp_path)) as (client, fake):
        for raw in bodies[:-1]:
            _send(client, fake, "messages", raw)
        serialised.clear()
        _send(client, fake, "messages", bodies[-1])
    assert list not in serialised, serialised


@pytest.mark.parametrize("wire", ["chat", "messages"])
def test_a_request_makes_its_blocks_once_for_every_stage(
    tmp_path: Path, wire: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client prefix, recall, the session, the mirror and pruning each ask for the
    request's blocks (a list as long as the conversation): one list as sent and one as
    changed, each made once and shared (nothing changes one in place), not a copy for each
    asker (five copies of ~600 blocks a request at turn 300)."""
    from ctxbudget.proxy.wire import types

    bodies = BUILDERS[wire][1](30)
    lists: list[list[Any]] = []
    real = types.InProcessRequest._blocks_of

    def blocks_of(self: Any, sources: Any, make: Any) -> list[Any]:
        found: list[Any] = real(self, sources, make)
        lists.append(found)
        return found

    monkeypatch.setattr(types.InProcessRequest, "_blocks_of", blocks_of)
    prefixes: list[Any] = []
    real_prefix = types.InProcessRequest.client_prefix

    def client_prefix(self: Any, owner: str) -> Any:
        prefixes.append(real_prefix(self, owner))
        return prefixes[-1]

    monkeypatch.setattr(types.InProcessRequest, "client_prefix", client_prefix)
    with proxy_app(tmp_path, cutting_config(tmp_path)) as (client, fake):
        for raw in bodies[:-1]:
            _send(client, fake, wire, raw)
        lists.clear()
        prefixes.clear()
        _send(client, fake, wire, bodies[-1])
    assert len(lists) >= 4
    assert len({id(found) for found in lists}) <= 2
    assert prefixes[0].blocks is lists[0]


def test_a_messages_turn_extends_the_view_of_the_last_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Messages request is clamped through a chat-shaped view of its items: request N+1's
    view is request N's very lists (view messages, their places, where each item's end), cut
    to the items it repeats and extended by its new ones, not copied (three lists as long as
    the conversation, each request)."""
    monkeypatch.setattr(RESENT, "check", False)
    bodies = BUILDERS["messages"][1](58)
    with proxy_app(tmp_path, cutting_config(tmp_path)) as (client, fake):
        for raw in bodies[:-1]:
            _send(client, fake, "messages", raw)
        found = state_of(client).conversations.find(bodies[-1], "default")
        assert found is not None and found.history.view is not None
        before = found.history.view
        lists = (before.messages, before.places, before.ends)
        assert len(before.ends) > 100
        _send(client, fake, "messages", bodies[-1])
        after = state_of(client).conversations.find(bodies[-1] + b" ", "default")
    assert after is not None and after.history.view is not before
    view = after.history.view
    assert all(a is b for a, b in zip((view.messages, view.places, view.ends), lists, strict=True))


@pytest.mark.parametrize("wire", ["chat", "messages"])
def test_the_session_of_turn_n_extends_what_turn_n_minus_1_forwarded_in_place(
    tmp_path: Path, wire: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session stage keeps each forwarded block's bytes, digest and size for the next
    request: request N+1 takes request N's very lists, cut to the blocks it repeats and
    extended by its new ones, not copies (three lists as long as the conversation)."""
    monkeypatch.setattr(RESENT, "check", False)
    bodies = BUILDERS[wire][1](58)
    with proxy_app(tmp_path, cutting_config(tmp_path)) as (client, fake):
        for raw in bodies[:-1]:
            _send(client, fake, wire, raw)
        found = state_of(client).conversations.find(bodies[-1], "default")
        assert found is not None and found.history.client is not None
        before = found.history.client[0].observed
        assert before is not None and len(before.forwarded) > 100
        lists = (before.forwarded_data, before.forwarded, before.sizes)
        _send(client, fake, wire, bodies[-1])
        after = state_of(client).conversations.find(bodies[-1] + b" ", "default")
    assert after is not None and after.history.client is not None
    seen = after.history.client[0].observed
    assert seen is not None and seen is not before
    taken = (seen.forwarded_data, seen.forwarded, seen.sizes)
    assert all(a is b for a, b in zip(taken, lists, strict=True))


@pytest.mark.parametrize("wire", ["chat", "messages"])
def test_the_client_blocks_of_turn_n_extend_those_of_turn_n_minus_1_in_place(
    tmp_path: Path, wire: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Request N+1's client blocks take request N's serials and digests as made (its very
    lists, cut to the blocks it repeats and extended by its new ones), once request N's
    session stage is done with them; request N sent again (a retry) finds its state taken,
    and works its blocks again (the same digests)."""
    monkeypatch.setattr(RESENT, "check", False)
    bodies = BUILDERS[wire][1](58)
    with proxy_app(tmp_path, cutting_config(tmp_path)) as (client, fake):
        for raw in bodies[:-1]:
            _send(client, fake, wire, raw)
        found = state_of(client).conversations.find(bodies[-1], "default")
        assert found is not None and found.history.client is not None
        before = found.history.client[0]
        lists, digests = (before.data, before.digests), list(before.digests)
        assert len(digests) > 100
        _send(client, fake, wire, bodies[-1])
        after = state_of(client).conversations.find(bodies[-1] + b" ", "default")
        assert after is not None and after.history.client is not None
        prefix = after.history.client[0]
        assert prefix is not before and before.spent
        assert all(a is b for a, b in zip((prefix.data, prefix.digests), lists, strict=True))
        _send(client, fake, wire, bodies[-2])
        again = state_of(client).conversations.find(bodies[-2] + b" ", "default")
        assert again is not None and again.history.client is not None
        assert again.history.client[0].digests == digests
