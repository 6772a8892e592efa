"""A conversation's state is one object with one owner (issue 34 item 1,
`proxy/wire/conversations.py`): request N+1 of a conversation has only its new items worked,
forwards the same bytes as with nothing kept, and one owner's state serves no other."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxbudget.caps import question
from ctxbudget.proxy.cache import prefix, sessions
from ctxbudget.proxy.cache.resent import RESENT
from ctxbudget.proxy.wire import body, chat, history, messages, responses, view
from ctxbudget.proxy.wire.body import parse_object
from ctxbudget.proxy.wire.conversations import Checked, Conversations
from tests.fakes import FakeUpstream, answer_in
from tests.held import SLACK, bound_of, held
from tests.inproc import Counted, InProcess, cutting_config, proxy_app, state_of

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench._growing import BUILDERS  # noqa: E402

PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}


def _config(tmp_path: Path) -> dict[str, Any]:
    """Clamps that cut (small caps), no memory placed: what is forwarded depends on the
    request alone."""
    return cutting_config(tmp_path)


def _answer(fake: FakeUpstream, wire: str) -> None:
    answer_in(fake, wire)


def _send(client: InProcess, fake: FakeUpstream, wire: str, raw: bytes, **kw: Any) -> str:
    _answer(fake, wire)
    r = client.post(PATHS[wire], content=raw, **kw)
    assert r.status_code == 200, r.text
    return r.headers["x-context-budget-request-id"]


def _segments(client: InProcess, request_id: str) -> Any:
    state_of(client).reports.flush()
    found = state_of(client).reports.request(request_id)
    assert found is not None
    return found["segments"]


@pytest.mark.parametrize("wire", ["chat", "messages", "responses"])
def test_a_grown_conversation_forwards_the_same_bytes_with_its_state_as_without(
    tmp_path: Path, wire: str
) -> None:
    """One app, which keeps the conversation's state, against a fresh app for each request,
    which keeps nothing: every body forwarded and every report segment is the same (24 turns:
    the user asks twice, and the Messages marker moves each request)."""
    bodies = BUILDERS[wire][1](24)
    kept_bodies, kept_segments = [], []
    (tmp_path / "kept").mkdir()
    with proxy_app(tmp_path / "kept", _config(tmp_path / "kept")) as (client, fake):
        for raw in bodies:
            request_id = _send(client, fake, wire, raw)
            kept_bodies.append(fake.last.body)
            kept_segments.append(_segments(client, request_id))
        assert state_of(client).conversations.weight > 0  # it was kept, and used
    for n, raw in enumerate(bodies):
        folder = tmp_path / f"fresh-{n}"
        folder.mkdir()
        with proxy_app(folder, _config(folder)) as (client, fake):
            request_id = _send(client, fake, wire, raw)
            assert fake.last.body == kept_bodies[n], f"request {n}"
            assert _segments(client, request_id) == kept_segments[n], f"request {n}"
    assert any(b"skipped chars" in b or b"truncated" in b for b in kept_bodies)  # it clamped


class _Counted(Counted):
    """Calls of the functions that read one message (or block) each, by name, and the
    messages a wire's check visits."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__(monkeypatch)
        self.checked = 0
        self.compared = 0
        self.copied = 0

    def check(self, owner: Any, name: str) -> None:
        """The messages a wire's check visits (those from its `start`)."""
        real = getattr(owner, name)

        def counted(items: list[Any], start: int = 0, *rest: Any) -> Any:
            self.checked += len(items) - start
            return real(items, start, *rest) if start else real(items)

        self._patch.setattr(owner, name, counted)

    def compare(self, owner: Any, name: str) -> None:
        """The items a scan for the very objects of another list (`same_prefix`) went over."""
        real = getattr(owner, name)

        def counted(new: Any, old: Any, limit: int) -> int:
            same = real(new, old, limit)
            self.compared += same
            return same

        self._patch.setattr(owner, name, counted)

    def copies(self, owner: Any, name: str) -> None:
        """The call ids a resumed check was handed in lists of its own (copied), not in its
        conversation's (`Checked.at`)."""
        real = getattr(owner, name)

        def counted(checked: Any, *args: Any, **kwargs: Any) -> Any:
            start, seen = real(checked, *args, **kwargs)
            if seen is not None and seen[0] is not checked.firsts:
                self.copied += len(seen[0]) + len(seen[1])
            return start, seen

        self._patch.setattr(owner, name, counted)

    def reset(self) -> None:
        self.calls.clear()
        self.checked = 0
        self.compared = 0
        self.copied = 0


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Counted]:
    found = _Counted(monkeypatch)
    # as in production: the test suite's re-check of every reuse works the whole list again
    monkeypatch.setattr(RESENT, "check", False)
    found.count(prefix, "_client_serial")  # a client block serialised and hashed
    found.count(question, "user_texts")  # a user message read for the clamps' question
    found.count(body, "_dumps")  # a changed item written as JSON (the list written back)
    found.count(sessions, "size_of")  # a block compared with the session's last request
    found.count(history.Items, "__getitem__")  # an item's bytes (or a slice of them) taken
    found.check(chat, "_check_texts")
    found.check(messages, "_check_messages")
    found.compare(body, "same_prefix")  # the list written back, against the last one's
    found.count(body, "index_of")  # an item written back looked up among the client's
    found.copies(Checked, "at")  # the call ids a check resumes with
    yield found


@pytest.mark.parametrize("wire", ["chat", "messages"])
def test_turn_n_works_only_its_new_items(tmp_path: Path, wire: str, counted: _Counted) -> None:
    """Request N+1 is request N plus a turn: the clamp, the checks and the client blocks'
    serials touch only the items after those request N had, however long the history."""
    # a tool turn (every tenth, the user asks again); what a whole pass works grows by the
    # item, so turn 38's ~85 items show it as turn 300's would
    bodies = BUILDERS[wire][1](38)
    with proxy_app(tmp_path, _config(tmp_path)) as (client, fake):
        for raw in bodies[:-1]:
            _send(client, fake, wire, raw)
        found = state_of(client).conversations.find(bodies[-1], "default")
        assert found is not None
        counted.reset()
        _send(client, fake, wire, bodies[-1])
    items = len(json.loads(bodies[-1])["messages"])
    # Messages: OpenClaw moves its marker off the last request's newest result, so the items
    # from that one on are other bytes; chat: the context message alone
    assert items > 80 and len(found.parsed) >= items - 4
    # the new turn: a call, its result (every tenth turn, the answer and the user's next
    # question too) and OpenClaw's context message (dropped from the next request)
    assert counted.checked <= 6, counted.checked
    assert counted.calls.get("_client_serial", 0) <= 6, counted.calls
    assert counted.calls.get("user_texts", 0) <= 4, counted.calls
    # and the changed fields' names, Messages' `system` (written whole: two blocks)
    assert counted.calls.get("_dumps", 0) <= 12, counted.calls
    # the session's comparison: the new items and the blocks before the list (tools, system)
    assert counted.calls.get("size_of", 0) <= 8, counted.calls
    # the list's items as sent: the new ones read, the old ones not sliced from the body
    assert counted.calls.get("__getitem__", 0) <= 12, counted.calls
    # the list written back: the last request's pieces taken for the items its clamp kept
    # (a count handed along, not the lists compared item by item), the new ones looked up
    # (and, in the parse, those of them found kept: `RESENT`)
    assert counted.compared == 0, counted.compared
    assert counted.calls.get("index_of", 0) <= 12, counted.calls
    # Messages' check: it appends the new items' tool_use ids to the last one's, not copied
    assert counted.copied == 0, counted.copied


def test_a_responses_turn_views_only_its_new_items(tmp_path: Path, counted: _Counted) -> None:
    """OpenClaw's Responses conversation (the system prompt as `input[0]`, a reasoning item,
    a call and its output a turn): request N+1 reads, views, clamps, writes back and places
    only what its turn added. Each request made a chat view of every item, wrote every
    clamped output back into a new copy of the whole list, placed every segment again and
    read every item for the user's turn: ~5 ms a request at turn 300."""
    counted.count(view.ChatView, "result")  # a tool result viewed
    counted.count(view.ChatView, "calls")  # a call viewed
    counted.count(responses, "set_item")  # an item written back (a copy of the list)
    counted.count(view, "real_segment")  # a segment placed at its item
    counted.count(responses, "_as_chat")  # an item read for the user's turn
    bodies = BUILDERS["responses"][1](58)
    with proxy_app(tmp_path, _config(tmp_path)) as (client, fake):
        for raw in bodies[:-1]:
            _send(client, fake, "responses", raw)
        counted.reset()
        _send(client, fake, "responses", bodies[-1])
        forwarded = json.loads(fake.last.body)
    items = json.loads(bodies[-1])["input"]
    assert len(items) > 150
    # it clamped: the history's long outputs are forwarded cut
    sent = sum(len(i.get("output", "")) for i in forwarded["input"])
    assert sent < 0.8 * sum(len(i.get("output", "")) for i in items)
    # the new turn: a reasoning item, a call and its output (every tenth turn, the answer
    # and the user's next question too)
    assert counted.calls.get("result", 0) <= 2, counted.calls
    assert counted.calls.get("calls", 0) <= 2, counted.calls
    assert counted.calls.get("set_item", 0) <= 2, counted.calls
    assert counted.calls.get("real_segment", 0) <= 4, counted.calls
    # back from the newest item to the latest user's (asked 8 turns ago, 3 items a turn),
    # and the items after it again: not the history's 170
    assert counted.calls.get("_as_chat", 0) <= 60, counted.calls
    # the list written back from the clamp's count, not compared with the last one's
    assert counted.compared == 0, counted.compared


def test_two_owners_with_the_same_conversation_share_no_state(
    tmp_path: Path, counted: _Counted
) -> None:
    """Byte-identical conversations of two keys: each has its own state, and the second
    owner's first request is read whole, as if the first owner had sent nothing."""
    config = _config(tmp_path)
    config["proxy"]["keysEnv"] = "KEYS"
    env = {"KEYS": "alice=ka-1,bob=kb-2"}
    bodies = BUILDERS["chat"][1](30)
    items = len(json.loads(bodies[-2])["messages"])
    with proxy_app(tmp_path, config, env=env) as (client, fake):
        alice = {"authorization": "Bearer ka-1"}
        bob = {"authorization": "Bearer kb-2"}
        for raw in bodies[:-1]:
            _send(client, fake, "chat", raw, headers=alice)
        kept = state_of(client).conversations
        assert kept.find(bodies[-1], "alice") is not None
        assert kept.find(bodies[-1], "bob") is None
        counted.reset()
        _send(client, fake, "chat", bodies[-2], headers=bob)
        assert counted.checked == items  # nothing of alice's served bob
        counted.reset()
        _send(client, fake, "chat", bodies[-1], headers=bob)
        assert counted.checked <= 6  # bob's own, from here on
        assert kept.owners() == 2
        mine, theirs = kept.find(bodies[-1], "alice"), kept.find(bodies[-1], "bob")
        assert mine is not None and theirs is not None
        assert mine.history is not theirs.history
        assert mine.history.clamp is not theirs.history.clamp
        assert not set(map(id, mine.parsed)) & set(map(id, theirs.parsed))


def _body(n: int, size: int) -> bytes:
    text = f"{n} " + "x" * size
    return json.dumps(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": text},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "go on"},
            ],
        }
    ).encode()  # a body the size of its bytes, as one read from a socket


def _read(kept: Conversations, raw: bytes, owner: str) -> None:
    parse_object(raw, example="{}", owner=owner, conversations=kept).get("messages")


def test_what_the_conversations_hold_stays_within_their_bound() -> None:
    """70 MB of conversations from 70 owners: what stays alive is the documented bound."""
    kept = Conversations()
    bound = bound_of("proxy/state.py:conversations")
    assert kept.keep_bytes == bound
    with held() as found:
        for n in range(70):
            _read(kept, _body(n, 1 << 20), f"owner-{n}")
        RESENT.clear()  # its items have a bound of their own: what stays is the conversations'
    assert kept.weight <= bound
    assert found.bytes <= bound + SLACK


def test_the_owner_holding_the_most_gives_way_first() -> None:
    kept = Conversations(keep_bytes=8 << 20)
    _read(kept, _body(0, 100_000), "small")
    flood: Callable[[int], bytes] = lambda n: _body(n, 1 << 20)  # noqa: E731
    for n in range(12):  # past the bound: the flooding owner's oldest go, not the other's
        _read(kept, flood(n), f"big-{n % 2}")
    assert kept.find(_body(0, 100_000), "small") is not None
    assert kept.weight <= 8 << 20


def test_a_turn_resumes_its_own_conversation_beside_a_subagent_sharing_its_start(
    tmp_path: Path, counted: _Counted
) -> None:
    """A subagent's request on the same key starts with its parent's system message, and is
    newer: the parent's next turn still resumes from the parent's own state (the one it
    extends furthest), not from the subagent's one shared item with everything after it
    read again (the whole history on the event loop, each turn the subagent ran)."""
    bodies = BUILDERS["chat"][1](40)
    parent = json.loads(bodies[-2])
    task = {"role": "user", "content": "a subtask"}
    subagent = {**parent, "messages": [parent["messages"][0], task]}
    sub = json.dumps(subagent, ensure_ascii=False, separators=(",", ":")).encode()
    with proxy_app(tmp_path, _config(tmp_path)) as (client, fake):
        for raw in bodies[:-1]:
            _send(client, fake, "chat", raw)
        _send(client, fake, "chat", sub)
        kept = state_of(client).conversations
        found = kept.find(bodies[-1], "default")
        assert found is not None and len(found.parsed) > 20, "resumed from the subagent's"
        counted.reset()
        _send(client, fake, "chat", bodies[-1])
        assert counted.checked <= 6, counted.checked


@pytest.mark.parametrize("wire", ["chat", "messages"])
def test_a_config_reload_between_turns_forwards_what_a_fresh_app_would(
    tmp_path: Path, wire: str
) -> None:
    """The caps change between two turns of a conversation (the config file edited): the next
    turn's old items are clamped by the new caps, as a fresh app with that config clamps
    them, not forwarded as the old caps had written them."""
    bodies = BUILDERS[wire][1](24)
    looser = _config(tmp_path / "b")
    looser["agents"]["defaults"]["contextBudget"]["toolOutputMaxChars"] = 4000
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with proxy_app(tmp_path / "a", _config(tmp_path / "a")) as (client, fake):
        for raw in bodies[:-1]:
            _send(client, fake, wire, raw)
        edited = _config(tmp_path / "a")
        edited["agents"]["defaults"]["contextBudget"]["toolOutputMaxChars"] = 4000
        (tmp_path / "a" / "ctxbudget.json").write_text(json.dumps(edited, indent=1))
        _send(client, fake, wire, bodies[-1])
        sent = fake.last.body
    with proxy_app(tmp_path / "b", looser) as (client, fake):
        _send(client, fake, wire, bodies[-1])
        assert sent == fake.last.body


class _Compared(bytes):
    """A body that counts the bytes compared with it (`startswith`)."""

    compared = 0

    def startswith(self, prefix: Any, *rest: Any) -> bool:  # type: ignore[override]
        if not isinstance(prefix, tuple):
            _Compared.compared += len(prefix)
        return super().startswith(prefix, *rest)


def test_a_body_is_compared_with_its_conversation_a_few_times_not_once_a_try() -> None:
    """OpenClaw's Messages body moves its marker off the last request's newest result, so
    its last items differ: finding how many of the old items it kept compares at most three
    body lengths of bytes (the whole try, all but the last, then the halving from where the
    bytes are known the same), once a request (it compared ~18 lengths: from the start on
    every try, and again in the parse after the offload's check)."""
    kept = Conversations()
    bodies = BUILDERS["messages"][1](119)  # a tool turn: the user asks again on the next
    _read(kept, bodies[-2], "default")
    raw = _Compared(bodies[-1])
    _Compared.compared = 0
    kept.new_bytes(raw, "default")  # the offload's check, then the parse: the same body
    found = kept.find(raw, "default")
    assert found is not None and len(found.parsed) >= len(json.loads(raw)["messages"]) - 4
    assert _Compared.compared <= 3 * len(raw), _Compared.compared / len(raw)


class _Looked(list[Any]):
    """A list that counts the items read from it, one by one or by iterating."""

    def __init__(self, items: list[Any]) -> None:
        super().__init__(items)
        self.looked = 0

    def __iter__(self) -> Iterator[Any]:
        for item in super().__iter__():
            self.looked += 1
            yield item

    def __getitem__(self, index: Any) -> Any:
        found = super().__getitem__(index)
        self.looked += len(found) if isinstance(index, slice) else 1
        return found


def _made_in_wire(snapshot: Any, smallest: int) -> int:
    """The bytes of the blocks of `smallest` bytes or more that `proxy/wire/` allocated and
    still holds (a body read, a list or a body written)."""
    wire = str(Path(body.__file__).parent)
    return sum(
        t.size
        for t in snapshot.traces
        if t.size >= smallest and t.traceback[0].filename.startswith(wire)
    )


@pytest.mark.parametrize("wire", ["chat", "messages"])
def test_turn_n_reads_and_writes_only_its_new_bytes(
    tmp_path: Path, wire: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Request N+1 of a long conversation: the old items' objects are not gone over to parse
    the new ones, and the body is not copied (not on reading it, not once for the list and
    again for the body: it is forwarded in pieces)."""
    import tracemalloc

    bodies = BUILDERS[wire][1](120)
    looked: list[_Looked] = []
    real = RESENT.parse

    def parse(items: Any, owner: str, loads: Any, *, taken: Any = (), **more: Any) -> Any:
        looked.append(_Looked(list(taken)))
        return real(items, owner, loads, taken=looked[-1], **more)

    monkeypatch.setattr(RESENT, "check", False)  # as in production: it re-reads every item
    monkeypatch.setattr(RESENT, "parse", parse)
    with proxy_app(tmp_path, _config(tmp_path)) as (client, fake):
        for raw in bodies[:-1]:
            _send(client, fake, wire, raw)
        looked.clear()
        tracemalloc.start()
        try:
            _send(client, fake, wire, bodies[-1])
            made = _made_in_wire(tracemalloc.take_snapshot(), 32 << 10)
        finally:
            tracemalloc.stop()
        forwarded = fake.last.body
    assert forwarded is not None and len(bodies[-1]) > 400_000
    assert max(map(len, looked)) > 200  # the old items, taken (Messages: `system` too)
    # OpenClaw's context message, the same bytes every request, is found as kept: it is not
    # one of the old items, known by their index, not by a set of all their ids
    assert sum(t.looked for t in looked) <= 8, [t.looked for t in looked]
    # the body read is the one the client sent, and the one forwarded is in pieces (`Parts`:
    # the last one's, and the new items' bytes): what is made is the new part (Messages: the
    # part of the body read again, its `system` and the new items, ~70 KB; `system` written
    # again, 65 KB) and, now and then, the list's newest chunks joined (`_append`), never
    # a copy of the body (it was three: the body read, the list written, the body written)
    assert made < len(forwarded) * 3 // 4, (made, len(forwarded))


def test_what_the_collector_walks_of_a_kept_conversation_is_its_items_objects() -> None:
    """A 600-item conversation's state holds, for the garbage collector to walk, its items'
    objects and a few fields: where each item starts and ends in the body, its `structure`
    and its weight are 8 bytes each, not an int object in a list (four lists of 600 walked
    by every young collection that found the newest state, every full one for each kept
    state)."""
    import gc

    messages = [{"role": "user", "content": f"{n}: " + "x" * 100} for n in range(600)]
    kept = Conversations()
    raw = json.dumps({"model": "m", "messages": messages}).encode()
    _read(kept, raw, "alice")
    more = json.dumps({"model": "m", "messages": [*messages, {"role": "user", "content": "and"}]})
    found = kept.find(more.encode(), "alice")
    assert found is not None and len(found.parsed) == 600
    walked = sum(
        len(gc.get_referents(o)) for o in gc.get_referents(found.history) if gc.is_tracked(o)
    )
    assert walked <= 600 + 20


def test_a_check_resumed_twice_from_one_state_sees_only_its_own_call_ids() -> None:
    """The next request's check appends its calls' ids to the lists of the check it resumes
    (`Checked.at`): a second request resuming from that same check (a retry, a subagent's)
    sees the ids of the items it repeats, not those the first one appended."""
    last = Checked(2, [(0, "a")], {"a": 0})
    start, seen = last.at(2)
    assert start == 2 and seen is not None and seen[0] is last.firsts  # the very lists
    seen[0].append((2, "x"))  # the first request's new call
    seen[1]["x"] = 2
    first = Checked(3, *seen)
    start, other = last.at(2)
    assert other == ([(0, "a")], {"a": 0})
    assert other[0] is not last.firsts  # its own: what it appends is not the first one's
    assert first.at(3)[1] == ([(0, "a"), (2, "x")], {"a": 0, "x": 2})
    assert first.at(2)[1] == ([(0, "a")], {"a": 0})  # fewer items repeated: copied, less x


@pytest.mark.parametrize("wire", ["chat", "messages"])
def test_reading_turn_n_makes_one_list_of_the_old_items(wire: str) -> None:
    """Request N+1's parse makes one list of the conversation's items, the request's, which
    its state keeps too: not one for what it extends, one for the request and a third for
    its state (three copies of ~700 references at turn 300, each touching every item)."""
    import gc

    kept = Conversations()
    bodies = BUILDERS[wire][1](60)
    owner = f"one-list-{wire}"  # what `RESENT` keeps of these items is this test's alone
    for raw in bodies[:-1]:
        _read(kept, raw, owner)
    found = kept.find(bodies[-1], owner)
    assert found is not None
    old = len(found.parsed)
    assert old > 100
    last = found.history.parsed
    first = last[0]
    body = parse_object(bodies[-1], example="{}", owner=owner, conversations=kept)
    items = body.get("messages")
    gc.collect()  # what earlier requests left for the collector
    lists = [o for o in gc.get_referrers(first) if type(o) is list and len(o) >= old]
    assert sorted(map(id, lists)) == sorted((id(last), id(items))), len(lists)
    assert body.conversation is not None and body.conversation.parsed is items
