"""An agent's growing list read once (issue 25, `proxy/wire/history.py`): a body that extends
what its owner sent is read as a full scan reads it, byte for byte, and anything else is
scanned whole."""

from __future__ import annotations

import doctest
import itertools
import json
from typing import Any

import pytest

import ctxbudget.proxy.wire.history
import ctxbudget.proxy.wire.scan
from ctxbudget.proxy.errors import BadRequest
from ctxbudget.proxy.wire.body import parse_object
from ctxbudget.proxy.wire.conversations import Conversations
from tests.held import SLACK, bound_of, held
from tests.openclaw import openclaw_request, tool_call

_FRESH = itertools.count()
CONVERSATIONS = Conversations()
"""As an app keeps them (`ProxyState.conversations`)."""


def test_doctests() -> None:
    assert doctest.testmod(ctxbudget.proxy.wire.history).failed == 0
    assert doctest.testmod(ctxbudget.proxy.wire.scan).failed == 0


def _read(raw: bytes, owner: str) -> dict[str, Any]:
    """What the proxy takes from `raw`: each field's bytes, the items' bytes and objects, the
    `{` and `[` count, and the body written back with the messages changed."""
    structure = CONVERSATIONS.structure(raw, owner)
    body = parse_object(raw, example="{}", owner=owner, conversations=CONVERSATIONS)
    messages = body.get("messages")
    items = body.raw_items("messages")
    return {
        "fields": {k: bytes(v) for k, v in body._fields.items()},
        "items": [bytes(i) for i in items] if items is not None else None,
        "messages": messages,
        "structure": structure,
        "encoded": body.encode({"messages": [*messages[:-1], {"role": "user", "content": "x"}]}),
    }


def _fresh(raw: bytes) -> dict[str, Any]:
    return _read(raw, f"fresh-{next(_FRESH)}")  # an owner with no history: a full scan


def _session(size: int = 60_000) -> list[bytes]:
    """An OpenClaw session: each request drops the last one's context message, adds a tool
    turn and a new context message (`size` 120,000: its tools are resent as a tail too)."""
    first = openclaw_request(version="9.x", size_bytes=size, stream=False)
    context = {"role": "user", "content": [{"type": "text", "text": "[context] turn 0"}]}
    turns = [{**first, "messages": [*first["messages"], context]}]
    for n in range(1, 6):
        history = turns[-1]["messages"][:-1]
        call = tool_call(f"c{n}", "read", {"path": f"f{n}.py"})
        result = {"role": "tool", "tool_call_id": f"c{n}", "content": f"{n}" * 3000}
        context = {"role": "user", "content": [{"type": "text", "text": f"[context] turn {n}"}]}
        turns.append({**first, "messages": [*history, call, result, context]})
    return [json.dumps(t, separators=(",", ":")).encode() for t in turns]


@pytest.mark.parametrize("size", [60_000, 120_000])  # with 120,000, its tools are a tail too
def test_a_growing_session_is_read_as_a_full_scan_reads_it(size: int) -> None:
    owner = f"grows-{size}"
    found = []
    for raw in _session(size):
        found.append(CONVERSATIONS.find(raw, owner) is not None)
        assert _read(raw, owner) == _fresh(raw)
    assert found == [False, True, True, True, True, True]  # each extends the one before


@pytest.mark.parametrize(
    "change",
    [
        "model",  # the bytes before the items differ
        "spacing",  # the same messages written with spaces
        "twice",  # a second "messages" key after the tools: the last one counts
        "elsewhere",  # the old items' bytes inside another field
        "edited",  # an early message changed
    ],
)
def test_a_body_that_does_not_extend_the_history_is_read_whole(change: str) -> None:
    owner = f"other-{change}"
    first, second = _session()[:2]
    _read(first, owner)
    body = json.loads(second)
    if change == "model":
        raw = json.dumps({**body, "model": "other"}, separators=(",", ":")).encode()
    elif change == "spacing":
        raw = json.dumps(body).encode()
    elif change == "twice":
        raw = second[:-1] + b',"messages":[{"role":"user","content":"last"}]}'
    elif change == "elsewhere":
        old = json.loads(first)["messages"]
        raw = json.dumps({"model": "m", "x": old, "messages": [1]}, separators=(",", ":")).encode()
    else:
        body["messages"][1] = {"role": "user", "content": "edited"}
        raw = json.dumps(body, separators=(",", ":")).encode()
    assert _read(raw, owner) == _fresh(raw)


def test_a_bad_body_that_starts_like_the_history_gets_the_full_scans_error() -> None:
    owner = "bad"
    first, second = _session()[:2]
    _read(first, owner)
    cut = second[: len(second) - 200]  # the new items cut off: not JSON
    with pytest.raises(BadRequest) as ours:
        parse_object(cut, example="{}", owner=owner, conversations=CONVERSATIONS)
    with pytest.raises(BadRequest) as fresh:
        parse_object(cut, example="{}", owner="never-seen", conversations=CONVERSATIONS)
    assert str(ours.value) == str(fresh.value)


def test_one_owners_history_is_never_read_for_another() -> None:
    first, second = _session()[:2]
    _read(first, "alice")
    assert CONVERSATIONS.find(second, "alice") is not None
    assert CONVERSATIONS.find(second, "mallory") is None


def test_an_item_sent_again_in_the_new_part_is_an_object_of_its_own() -> None:
    # the last message resent as a new one: equal objects, never the same one twice
    owner = "again"
    first = _session()[0]
    body = json.loads(first)
    _read(first, owner)
    again = {**body, "messages": [*body["messages"], body["messages"][-2]]}
    raw = json.dumps(again, separators=(",", ":")).encode()
    messages = parse_object(raw, example="{}", owner=owner, conversations=CONVERSATIONS).get(
        "messages"
    )
    assert messages == again["messages"]
    assert len({id(m) for m in messages}) == len(messages)


def test_what_the_history_keeps_is_its_bodies_and_nothing_they_were_cut_from() -> None:
    # tools before the messages: `Tails` does not skip them, each stand-in is a whole copy of
    # the body; kept items must not hold one each (they held ~100 KB a turn, never freed)
    import gc
    import tracemalloc

    owner = "pinned"
    messages: list[dict[str, str]] = [{"role": "user", "content": "x" * 9000}]
    tracemalloc.start()
    try:
        for turn in range(1, 101):
            messages.append({"role": "assistant", "content": f"turn {turn}"})
            raw = json.dumps({"tools": "h" * 100_000, "messages": messages}).encode()
            parse_object(raw, example="{}", owner=owner, conversations=CONVERSATIONS).get(
                "messages"
            )
        gc.collect()
        alive = sum(
            stat.size
            for stat in tracemalloc.take_snapshot().statistics("filename")
            if stat.traceback[0].filename.endswith("history.py")
        )
    finally:
        tracemalloc.stop()
    assert CONVERSATIONS.find(raw, owner) is not None
    assert alive < 1_000_000  # the last stand-in at most (it was ~10 MB after 100 turns)


def test_what_is_kept_weighs_at_least_what_it_keeps_alive() -> None:
    # a client must not hold more of the process than the bounds say by sending items that
    # parse large (`{}` is 2 bytes and a 64-byte dict) or messages whose text is small
    from ctxbudget.caps._kept import footprint, message_weight
    from ctxbudget.proxy.cache.resent import _weight

    item = json.dumps({"x": [{} for _ in range(10_000)]}).encode()
    assert _weight(item) >= (footprint(json.loads(item)) or 0)
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100_000}}
    message = {"role": "system", "content": [{"type": "text", "text": "t" * 1500}, image]}
    assert (message_weight(message, message) or 0) >= 100_000
    assert footprint([{}] * 30_000) is None  # past the walk's limit: not kept at all


def test_the_view_caches_weigh_what_they_keep_and_keep_calls_per_owner() -> None:
    # the second review: a call's arguments (Claude Code's Write carries whole files), a
    # large key, many tiny parts were kept while weighing a few hundred bytes each
    from ctxbudget.caps._kept import footprint
    from ctxbudget.proxy.wire import view

    assert (footprint({"k" * 2**20: 1}) or 0) >= 2**20
    big = json.dumps({"file_path": "a.py", "content": "x" * 100_000})
    mine, theirs = view.ChatView(owner="a"), view.ChatView(owner="b")
    mine.calls([("c1", "Write", big)])
    theirs.calls([("c1", "Write", big)])
    assert mine.messages[0] == theirs.messages[0]
    assert mine.messages[0] is not theirs.messages[0]  # nothing one owner sent serves another
    bound = bound_of("proxy/wire/view.py:_VIEWS")
    with held() as kept:
        for i in range(200):  # 20 MB of Write calls, each view gone after its request
            write = json.dumps({"file_path": f"{i}.py", "content": "x" * 100_000})
            view.ChatView(owner="a").calls([(f"c{i}", "Write", write)])
        del write
    assert kept.bytes <= bound + SLACK
    with held() as kept:
        for i in range(4):  # 15,000 tiny parts a request: ~3.4 MB of dicts each
            view.ChatView(owner="a").first_user([(n, "t") for n in range(15_000)], ("user", i))
    assert kept.bytes <= bound + SLACK


def test_a_requests_blocks_do_not_outlive_it() -> None:
    # a module-level cache of the last request's blocks held its lists (in the offload
    # worker: a 30 MB body's) until the next request came; now only the owner's conversation
    # holds them (`Conversation.blocks`, within its bound), and without one nothing does
    import gc

    from ctxbudget.proxy.wire.chat import ChatCompletions

    raw = _session()[0]
    request = ChatCompletions().parse(raw, owner="outlive")
    messages = request._body.messages
    assert request.blocks() == request.blocks()
    del request
    gc.collect()
    assert [r for r in gc.get_referrers(messages) if isinstance(r, tuple)] == []


@pytest.mark.parametrize(
    "where", ["new item", "field before", "field between", "field after", "tools"]
)
def test_invalid_utf8_in_a_body_that_extends_the_history_gets_the_full_scans_error(
    where: str,
) -> None:
    """The history's read checks UTF-8 once, not again: a bad byte anywhere is still a 400."""
    owner = f"utf8-{where}"
    first, second = (r.replace(b"turn", "tür".encode()) for r in _session(120_000)[:2])
    _read(first, owner)
    found = CONVERSATIONS.find(second, owner)
    assert found is not None and found.tail  # the tools, 50 KB, are the tail it knows
    if where == "new item":
        raw = second.replace(b'"[context] t\xc3\xbcr 1"', b'"[context] \xff 1"')
    elif where == "field before":
        raw = b'{"user":"\xff",' + second[1:]
    elif where == "field between":  # after the list, before the tail the owner resends
        end = second.index(b',"stream":')
        raw = second[:end] + b',"user":"\xff"' + second[end:]
    elif where == "field after":
        raw = second[:-1] + b',"user":"\xff"}'
    else:
        raw = second.replace(b'"name":"read"', b'"name":"r\xffad"', 1)
    assert raw != second
    with pytest.raises(BadRequest) as ours:
        _read(raw, owner)
    with pytest.raises(BadRequest) as fresh:
        _fresh(raw)
    assert str(ours.value) == str(fresh.value)
