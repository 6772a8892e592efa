"""An agent's resent history, parsed and clamped once (issue 25): the next request holds the
very objects the last one did, what the proxy forwards is what it forwarded without the reuse,
and whatever changes a shared object in place is caught."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from ctxbudget.caps import Caps, ToolNames
from ctxbudget.caps._kept import ByIdentity, Generations
from ctxbudget.proxy.cache.resent import RESENT, ChangedInPlace, Resent
from ctxbudget.proxy.wire.body import parse_chat_body
from ctxbudget.proxy.wire.scan import ITEMS as _ITEMS
from tests.fakes import REPLIES, chat_completion
from tests.held import SLACK, held
from tests.inproc import config_for, proxy_app
from tests.openclaw import openclaw_request, tool_call

ROUTE = "/v1/chat/completions"


def _items(messages: list[Any]) -> list[Any]:
    return _ITEMS.decode(json.dumps(messages).encode())


def _history() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "S" * 5000},
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "c1", "content": "T" * 3000},
    ]


def test_an_item_sent_again_is_the_object_parsed_before() -> None:
    resent = Resent()
    history = _history()
    first = resent.parse(_items(history), "a", orjson.loads)
    later = resent.parse(_items([*history, {"role": "user", "content": "more"}]), "a", orjson.loads)
    assert first == history and later == [*history, {"role": "user", "content": "more"}]
    assert later[0] is first[0] and later[2] is first[2]  # large: kept
    assert later[1] is not first[1]  # small: parsed again, as cheap as a lookup


def test_what_one_owner_sent_is_never_handed_to_another() -> None:
    resent = Resent()
    mine = resent.parse(_items(_history()), "a", orjson.loads)
    theirs = resent.parse(_items(_history()), "b", orjson.loads)
    assert theirs == mine and all(t is not m for t, m in zip(theirs, mine, strict=True))


def test_the_same_bytes_twice_in_one_request_are_two_objects() -> None:
    # as a whole parse gives them: code that finds an item by identity must not see one twice
    resent = Resent()
    big = {"role": "tool", "tool_call_id": "c1", "content": "T" * 3000}
    resent.parse(_items([big]), "a", orjson.loads)
    twice = resent.parse(_items([big, big, big]), "a", orjson.loads)
    assert twice == [big, big, big]
    assert len({id(m) for m in twice}) == 3


def test_what_is_kept_stays_within_its_bound() -> None:
    resent = Resent(max_bytes=1 << 20)
    parsed: list[int] = []

    def loads(view: memoryview) -> Any:  # the work a kept item saves
        parsed.append(len(view))
        return orjson.loads(view)

    items = [_items([{"role": "tool", "content": f"{n}" + "x" * 40_000}]) for n in range(200)]
    with held() as kept:
        for item in items:  # 8 MB of items, each result dropped
            resent.parse(item, "a", loads)
    assert len(parsed) == 200 and kept.bytes <= (1 << 20) + SLACK
    del parsed[:]
    resent.parse(items[-1], "a", loads)
    assert parsed == []  # the newest is kept
    resent.parse(items[0], "a", loads)
    assert len(parsed) == 1  # the oldest went: parsed again


def test_a_kept_item_changed_in_place_fails_the_request_that_would_reuse_it() -> None:
    resent = Resent(check=True)
    history = _history()
    first = resent.parse(_items(history), "a", orjson.loads)
    assert resent.parse(_items(history), "a", orjson.loads)[0] is first[0]
    first[0]["content"] = "changed by a careless stage"
    with pytest.raises(ChangedInPlace, match="changed in place"):
        resent.parse(_items(history), "a", orjson.loads)


def test_a_result_kept_by_identity_is_made_once_per_object() -> None:
    made: list[Any] = []

    def clamp(message: dict[str, Any], cap: int) -> dict[str, Any]:
        made.append(message)
        return {**message, "content": message["content"][:cap]}

    memo = ByIdentity(1 << 20, lambda obj, result: 1, check=False)
    message = {"role": "system", "content": "abcdef"}
    first = memo.get(clamp, message, 3)
    assert memo.get(clamp, message, 3) is first and len(made) == 1
    assert memo.get(clamp, message, 4) == {"role": "system", "content": "abcd"}  # other args
    assert memo.get(clamp, dict(message), 3) == first and len(made) == 3  # an equal copy: made
    checked = ByIdentity(1 << 20, lambda obj, result: 1, check=True)
    checked.get(clamp, message, 3)
    message["content"] = "changed in place"
    with pytest.raises(ChangedInPlace):
        checked.get(clamp, message, 3)


def test_the_large_items_of_a_body_are_reused_on_the_next_turn() -> None:
    body = openclaw_request(version="9.x", size_bytes=60_000)
    raw = json.dumps(body).encode()
    grown = {**body, "messages": [*body["messages"], {"role": "user", "content": "next"}]}
    first = parse_chat_body(raw, "owner-a").messages
    second = parse_chat_body(json.dumps(grown).encode(), "owner-a").messages
    other = parse_chat_body(raw, "owner-b").messages
    assert first == body["messages"] and second == grown["messages"]
    large = [i for i, m in enumerate(body["messages"]) if len(json.dumps(m)) >= RESENT.min_item]
    assert large and all(second[i] is first[i] for i in large)
    assert all(other[i] is not first[i] for i in large)


def test_a_session_forwards_the_same_bytes_with_and_without_the_reuse(tmp_path: Path) -> None:
    """A growing session with clamped bootstrap files and tool output: every request is
    forwarded byte for byte as a proxy that parses and clamps everything afresh sends it."""
    first = openclaw_request(version="9.x", size_bytes=120_000, stream=False, model="gpt-4o")
    turns = [first]
    for n in range(4):
        previous = turns[-1]["messages"]
        call = tool_call(f"c{n}", "exec", {"command": f"cat big{n}.log"})
        result = {"role": "tool", "tool_call_id": f"c{n}", "content": f"{n} " + "log " * 6000}
        turns.append({**first, "messages": [*previous, call, result]})

    def forwarded(clear: bool) -> list[bytes]:
        home = tmp_path / f"clear-{clear}"
        home.mkdir()
        budget = {"contextBudget": {"enabled": True, "bootstrapMaxChars": 2000}}
        config = config_for(home, agents={"defaults": budget})
        with proxy_app(home, config) as (client, fake):
            fake.answer_json(chat_completion(model="gpt-4o"))
            for body in turns:
                if clear:
                    RESENT.clear()
                assert client.post(ROUTE, json=body).status_code == 200
            return [s.body for s in fake.sent]

    reused, afresh = forwarded(False), forwarded(True)
    assert reused == afresh
    sent = [json.loads(b)["messages"] for b in reused]
    assert len(sent[0][0]["content"]) < len(first["messages"][0]["content"])  # clamped
    assert all(len(m["content"]) < 24_000 for m in sent[-1] if m["role"] == "tool")


def test_doctests() -> None:
    import doctest

    import ctxbudget.caps._kept

    assert doctest.testmod(ctxbudget.caps._kept).failed == 0


def test_the_generations_keep_what_is_used_within_their_bound() -> None:
    kept: Generations[int, str] = Generations(max_weight=1000)
    for i in range(500):
        kept.put(i, f"v{i}", weight=10)
        assert kept.get(0) == "v0"  # used every turn: never dropped
        assert kept.weight <= 1000
    assert kept.get(1) is None  # not used since: gone
    kept.put(-1, "too large", weight=600)  # over half the bound: never kept
    assert kept.get(-1) is None


@pytest.mark.parametrize(
    "name", ["openclaw-chat", "openclaw-messages", "openclaw-responses", "claude-code", "codex"]
)
def test_a_recorded_session_is_forwarded_as_without_the_reuse(tmp_path: Path, name: str) -> None:
    """Each agent's recorded session (`bench/sessions/`), through the app with the budget on:
    every request forwarded byte for byte as when nothing of the earlier requests is reused
    (each request from an owner of its own: nothing kept is theirs)."""
    from tests.replay import SESSIONS, load

    session = load(SESSIONS / f"{name}.jsonl.xz")
    requests = session.requests[:14]
    keys = ",".join(f"o{i}=key-{i}" for i in range(len(requests) + 1))
    budget = {"contextBudget": {"enabled": True, "toolOutputMaxChars": 4000}}
    config = config_for(tmp_path, agents={"defaults": budget}, proxy={"keysEnv": "KEYS"})

    def forwarded(key_of: Any) -> list[bytes]:
        with proxy_app(tmp_path, config, env={"KEYS": keys}) as (client, fake):
            for i, recorded in enumerate(requests):
                body = {**recorded.json, "stream": False}
                body.pop("stream_options", None)
                fake.answer_json(REPLIES[recorded.path])
                headers = {"authorization": f"Bearer {key_of(i)}", "x-api-key": key_of(i)}
                r = client.post(recorded.target, json=body, headers=headers)
                assert r.status_code == 200, r.text
            return [s.body for s in fake.sent]

    reused = forwarded(lambda i: "key-0")
    afresh = forwarded(lambda i: f"key-{i + 1}")
    assert reused == afresh
    assert any(len(a) < len(r.body) for a, r in zip(reused, requests, strict=True))  # clamped


def test_the_offload_worker_past_its_memory_bound_lets_everything_kept_go() -> None:
    """What the parse and the clamps kept is handed out again (the very objects) until the
    worker lets it go; then the same request is parsed and clamped afresh, to equal values."""
    from ctxbudget.caps import clamp_request
    from ctxbudget.proxy.pipeline.jobs import conversations
    from ctxbudget.proxy.pipeline.worker import _clear_caps_caches, memo

    raw = json.dumps(openclaw_request(version="9.x", size_bytes=60_000)).encode()
    caps = Caps(tool_output_max_chars=500, web_fetch_max_chars=500, owner="worker-owner")

    def clamped(messages: list[Any]) -> tuple[tuple[Any, ...], list[Any]]:
        """The segments, and the new texts of the messages the clamp changed."""
        done = clamp_request({"messages": messages}, caps, tools=ToolNames(), memo=memo())
        changed = done.request["messages"]
        texts = [c["content"] for c, m in zip(changed, messages, strict=True) if c is not m]
        return done.segments, texts

    first = parse_chat_body(raw, "worker-owner", conversations()).messages
    segments, texts = clamped(first)
    assert texts and "clamped" in [s.action for s in segments]
    # kept by the objects: the same messages parsed again (what the clamp decided for them
    # is the conversation's, `Conversation.clamp`, not the memo's)
    again = parse_chat_body(raw, "worker-owner", conversations()).messages
    assert any(a is f for a, f in zip(again, first, strict=True))
    assert clamped(first)[0] == segments
    # kept by value: other objects with the same texts get the very clamped texts
    assert all(c is t for c, t in zip(clamped(copy.deepcopy(first))[1], texts, strict=True))
    assert conversations().find(raw, "worker-owner") is not None

    assert memo().weight > 0
    _clear_caps_caches()
    assert memo().weight == 0
    assert conversations().find(raw, "worker-owner") is None
    after = parse_chat_body(raw, "worker-owner", conversations()).messages
    assert after == first and not any(a is f for a, f in zip(after, first, strict=True))
    remade, _ = clamped(first)
    assert remade == segments and not any(r is s for r, s in zip(remade, segments, strict=True))
    _, copied = clamped(copy.deepcopy(first))
    assert copied == texts and not any(c is t for c, t in zip(copied, texts, strict=True))
